"""Each tutorial checker names the common mistakes: wrong answers get "not right yet" with the hint for that
mistake, stubs get "not yet solved", and a right answer passes (the solved notebooks run the rest)."""

import pytest
import torch
from torch import nn

import dpnotebook
from dpnotebook.exercises import Status, judge


def _stub(*args, **kwargs):
    raise NotImplementedError("your code here")


def _grouped(activations, backprops, K):
    a = activations[0]
    B = a.shape[0] // K
    return a.reshape(B, -1, a.shape[-1]), backprops.reshape(B, -1, backprops.shape[-1])


def _linear(scale_k=True, pattern="bto,bti->boi"):
    def sampler(layer, activations, backprops, K):
        a, g = _grouped(activations, backprops, K)
        weight = torch.einsum(pattern, g, a)
        return {layer.weight: weight / K if scale_k else weight, layer.bias: g.sum(1) / K}

    return sampler


@pytest.mark.parametrize(
    "answer, hint",
    [
        (_linear(), None),
        (_linear(scale_k=False), "K times too large"),
        (_linear(pattern="bto,bti->bio"), "transposed"),
        (lambda layer, activations, backprops, K: {layer.weight: None}, "no entry for layer.bias"),
        (lambda layer, activations, backprops, K: [], "return a dict"),
    ],
)
def test_linear_einsum(answer, hint) -> None:
    verdict = judge("02.linear_einsum", answer)
    assert verdict.solved if hint is None else (verdict.status is Status.WRONG and hint in verdict.hint), verdict


class Gate(nn.Module):
    def __init__(self, features: int) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(features))

    def forward(self, x):
        return x * torch.sigmoid(self.w)


def test_gate_sampler_hints() -> None:
    from dpnotebook.grad_sample.engine.registry import register_grad_sampler, unregister_grad_sampler

    def without_chain_rule(layer, activations, backprops, K):
        x, g = _grouped(activations, backprops, K)
        return {layer.w: (g * x).sum(1) / K}

    def right(layer, activations, backprops, K):
        s = torch.sigmoid(layer.w)
        return {layer.w: without_chain_rule(layer, activations, backprops, K)[layer.w] * s * (1 - s)}

    try:
        assert "not the sampler registered" in judge("02.gate_sampler", right, layer_type=Gate).hint
        register_grad_sampler(Gate)(without_chain_rule)
        assert "chain rule" in judge("02.gate_sampler", without_chain_rule, layer_type=Gate).hint
        register_grad_sampler(Gate)(_stub)
        assert judge("02.gate_sampler", _stub, layer_type=Gate).status is Status.NOT_YET
        register_grad_sampler(Gate)(right)
        assert judge("02.gate_sampler", right, layer_type=Gate).solved
    finally:
        unregister_grad_sampler(Gate)


def test_norm_without_materialising_hints() -> None:
    def gram(a, g):
        if a.dim() == 2:
            return g.norm(dim=1) * a.norm(dim=1)
        return (torch.einsum("bti,bsi->bts", a, a) * torch.einsum("bto,bso->bts", g, g)).sum((1, 2)).sqrt()

    def sum_of_norms(a, g):
        return gram(a, g) if a.dim() == 2 else (g.norm(dim=2) * a.norm(dim=2)).sum(1)

    assert judge("01.norm_without_materialising", gram).solved
    assert "sum of the positions' norms" in judge("01.norm_without_materialising", sum_of_norms).hint
    assert "square root" in judge("01.norm_without_materialising", lambda a, g: gram(a, g) ** 2).hint
    assert judge("01.norm_without_materialising", _stub).status is Status.NOT_YET


def test_per_sample_norms_hints() -> None:
    oracle = {"w": torch.randn(8, 3, 2, dtype=torch.float64), "b": torch.randn(8, 3, dtype=torch.float64)}
    norms = torch.cat([g.flatten(1) for g in oracle.values()], dim=1).norm(dim=1)
    assert judge("01.per_sample_norms", norms, largest=int(norms.argmax()), oracle=oracle).solved
    added = sum(g.flatten(1).norm(dim=1) for g in oracle.values())
    assert "adds the parameters' norms" in judge("01.per_sample_norms", added, largest=0, oracle=oracle).hint
    assert judge("01.per_sample_norms", ..., largest=..., oracle=oracle).status is Status.NOT_YET


def test_clipping_bound_hints() -> None:
    from dpnotebook.widgets import clipping_stats

    def first_under(grads, grid, max_fraction):
        return next(C for C in grid if clipping_stats(grads, C).fraction_clipped <= max_fraction)

    def first_strictly_over(grads, grid, max_fraction):
        return next(C for C in grid if clipping_stats(grads, C).fraction_clipped < max_fraction + 0.2)

    assert judge("03.clipping_bound", first_under, grads=None).solved
    assert "more than" in judge("03.clipping_bound", first_strictly_over, grads=None).hint


def test_sigma_for_budget_hints() -> None:
    from dpnotebook.privacy import compute_epsilon, get_noise_multiplier

    sigma = get_noise_multiplier(target_epsilon=1.0, target_delta=1e-5, sample_rate=64 / 1438, epochs=20)
    right = compute_epsilon(noise_multiplier=sigma, sample_rate=64 / 1438, steps=440, delta=1e-5)
    assert judge("04.sigma_for_budget", sigma, epsilon=right).solved
    assert judge("04.sigma_for_budget", sigma, epsilon=...).status is Status.NOT_YET
    too_few = compute_epsilon(noise_multiplier=sigma, sample_rate=64 / 1438, steps=20, delta=1e-5)
    assert "steps" in judge("04.sigma_for_budget", sigma, epsilon=too_few).hint
    assert "ε = " in judge("04.sigma_for_budget", 0.5 * sigma, epsilon=right).hint


def test_epsilon_any_k_hints() -> None:
    from dpnotebook.privacy import compute_epsilon

    right = compute_epsilon(noise_multiplier=1.2, sample_rate=128 / 1438, steps=275, delta=1e-5)
    context = {"expected_epsilon": right, "expected_steps": 275}
    assert judge("05.epsilon_any_K", right, steps=275, **context).solved
    assert "runs took 275" in judge("05.epsilon_any_K", right, steps=25 * 1438 // 128, **context).hint
    assert judge("05.epsilon_any_K", ..., steps=..., **context).status is Status.NOT_YET


def test_embedding_bag_modes_hints() -> None:
    bag = nn.Sequential(nn.EmbeddingBag(20, 4, mode="mean"), nn.Linear(4, 3))
    context = {"model": bag, "inputs": torch.randint(0, 20, (4, 5)), "targets": torch.randint(0, 3, (4,))}
    assert judge("06.embedding_bag_modes", {"hooks", "functorch", "ghost"}, **context).solved
    assert "'ew' does not" in judge("06.embedding_bag_modes", {"hooks", "functorch", "ghost", "ew"}, **context).hint
    assert "norms" in judge("06.embedding_bag_modes", {"hooks", "functorch"}, **context).hint


def test_fix_gru_and_smaller_budget_hints() -> None:
    gru = nn.GRU(3, 4, batch_first=True)
    seq = torch.randn(2, 5, 3)
    assert judge("07.fix_gru", dpnotebook.fix(gru), original=gru, inputs=seq).solved
    assert "original GRU object" in judge("07.fix_gru", gru, original=gru, inputs=seq).hint
    assert judge("07.fix_gru", None, original=None, inputs=seq).status is Status.NOT_YET

    engine = dpnotebook.PrivacyEngine(accountant="pld")
    assert "no step" in judge("00.smaller_budget", engine).hint
    engine.accountant.step(noise_multiplier=1.0, sample_rate=1 / 12, num_steps=360)
    assert "> 2" in judge("00.smaller_budget", engine).hint


class LoRALinear(nn.Module):
    def __init__(self, in_features: int, out_features: int, rank: int) -> None:
        super().__init__()
        self.register_buffer("weight", torch.randn(out_features, in_features))
        self.A = nn.Parameter(torch.randn(rank, in_features))
        self.B = nn.Parameter(torch.randn(out_features, rank))

    def forward(self, x):
        return x @ self.weight.T + (x @ self.A.T) @ self.B.T


def test_lora_sampler_hints() -> None:
    from dpnotebook.grad_sample.engine.registry import register_grad_sampler, unregister_grad_sampler

    def lora(through_b=True):
        def sampler(layer, activations, backprops, K):
            a, g = _grouped(activations, backprops, K)
            back = g @ layer.B if through_b else g[..., : layer.A.shape[0]]
            return {
                layer.B: torch.einsum("bno,bnr->bor", g, a @ layer.A.T) / K,
                layer.A: torch.einsum("bnr,bni->bri", back, a) / K,
            }

        return sampler

    try:
        for answer, hint in ((lora(), None), (lora(through_b=False), "through B")):
            register_grad_sampler(LoRALinear)(answer)
            verdict = judge("02.lora_sampler", answer, layer_type=LoRALinear)
            assert verdict.solved if hint is None else hint in verdict.hint, verdict
    finally:
        unregister_grad_sampler(LoRALinear)
