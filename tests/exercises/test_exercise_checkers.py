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
    from dpnotebook.grad_sample import register_grad_sampler, unregister_grad_sampler

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
    C = float(norms.sort().values[3:5].mean())  # between the 4th and 5th norm: 4 are clipped
    factors = (C / norms).clamp(max=1.0)
    context = {"oracle": oracle, "C": C}
    verdict = judge("01.per_sample_norms", norms, factors=factors, **context)
    assert verdict.solved and "shrinks 4 of 8" in verdict.hint, verdict.hint
    added = sum(g.flatten(1).norm(dim=1) for g in oracle.values())
    assert "adds the parameters' norms" in judge("01.per_sample_norms", added, factors=factors, **context).hint
    assert "squared norms" in judge("01.per_sample_norms", norms**2, factors=factors, **context).hint
    per_parameter = torch.stack([g.flatten(1).norm(dim=1) for g in oracle.values()])
    assert "WHOLE gradient" in judge("01.per_sample_norms", per_parameter, factors=factors, **context).hint
    assert "above 1" in judge("01.per_sample_norms", norms, factors=C / norms, **context).hint
    assert "upside down" in judge("01.per_sample_norms", norms, factors=norms / C, **context).hint
    assert "min(its norm, C)" in judge("01.per_sample_norms", norms, factors=factors * 0.5, **context).hint
    assert judge("01.per_sample_norms", ..., factors=..., **context).status is Status.NOT_YET
    for hint in (judge("01.per_sample_norms", added, factors=factors, **context).hint,):
        assert "cat(" not in hint and "norm(dim" not in hint  # the hints name the idea, never the code


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

    def eps(q: float, steps: int) -> float:
        return compute_epsilon(noise_multiplier=1.2, sample_rate=q, steps=steps, delta=1e-5)

    right, q = eps(128 / 1438, 550), 128 / 1438
    verdict = judge("05.epsilon_any_K", right, steps=550)
    assert verdict.solved and "K appears nowhere" in verdict.hint
    # the shortcut of issue #29: the ε the runs above spent (engine.get_epsilon) is not the answer
    assert "spent in 25 epochs" in judge("05.epsilon_any_K", eps(q, 275), steps=550).hint
    assert "what the runs above took" in judge("05.epsilon_any_K", right, steps=275).hint
    assert "add no step" in judge("05.epsilon_any_K", right, steps=16 * 550).hint
    assert "len(loader) = 11" in judge("05.epsilon_any_K", right, steps=50 * 1438 // 128).hint
    assert "only at twice the δ" in judge("05.epsilon_any_K", 2 * eps(q, 275), steps=550).hint
    assert "counts samples, not rows" in judge("05.epsilon_any_K", eps(4 * q, 550), steps=550).hint
    assert judge("05.epsilon_any_K", ..., steps=...).status is Status.NOT_YET
    assert judge("05.epsilon_any_K", ..., steps=550).status is Status.NOT_YET


def test_embedding_bag_modes_hints() -> None:
    from dpnotebook.compare import compare_modes

    bag = nn.Sequential(nn.EmbeddingBag(20, 4, mode="mean"), nn.Linear(4, 3))
    context = {"model": bag, "inputs": torch.randint(0, 20, (4, 5)), "targets": torch.randint(0, 3, (4,))}
    rows = {r.mode: r for r in compare_modes(bag, context["inputs"], context["targets"], repeats=1)}
    works = {m for m, r in rows.items() if r.agrees and m != "oracle"}
    refusals = {m: r.error for m, r in rows.items() if not r.agrees}
    assert judge("06.embedding_bag_modes", works, refusals=refusals, **context).solved
    # guessing mode by mode learns only how many are misplaced, never which (issue #29's shortcut)
    for guess in (works | {"ew"}, works - {"ghost"}, {"hooks"}):
        hint = judge("06.embedding_bag_modes", guess, refusals={}, **context).hint
        assert "on the wrong side" in hint and not any(repr(m) in hint for m in rows), hint
    assert judge("06.embedding_bag_modes", works, refusals=None, **context).status is Status.NOT_YET
    made_up = {m: "it cannot do bags" for m in refusals}
    assert "not the start of the error" in judge("06.embedding_bag_modes", works, refusals=made_up, **context).hint
    assert "one entry per mode" in judge("06.embedding_bag_modes", works, refusals={}, **context).hint


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
    from dpnotebook.grad_sample import register_grad_sampler, unregister_grad_sampler

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
