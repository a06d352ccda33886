"""Ghost mode against the float64 oracle: per-sample norms and clipped sums, layer by layer and whole models.

The oracle is ``reference_grad_samples`` (one backward per row), then the
norms, clip factors and clipped sums of ``clip_and_sum``. Ghost mode never
forms most per-sample gradients, so it is judged by those two results.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import dpnotebook
from dpnotebook import GradSampleError
from dpnotebook.benchmarks.models import SampleConvNet, SmallResNetGN, TextTransformer
from dpnotebook.grad_sample.ghost._wrapper import GhostGradSampleModule
from dpnotebook.grad_sample.samplers.linear_norm import linear_sq_norms, linear_strategy, settle_pays
from dpnotebook.layers import DPGRU, DPLSTM, DPMultiheadAttention
from dpnotebook.privacy import clip_and_sum, clip_factors, layer_thresholds
from dpnotebook.privacy._optimizer import GhostDPOptimizer
from dpnotebook.testing import dot_loss, random_target, reference_grad_samples

TOL = 1e-10


def ghost_results(model, inputs, target, *, K, reduction, C, clipping="flat", batch_first=True):
    """``(norms, clipped sums by parameter name, wrapper)`` from ghost mode (on a copy of ``model``)."""
    model = copy.deepcopy(model)
    wrapped = dpnotebook.wrap_model(model, "ghost", K=K, loss_reduction=reduction, batch_first=batch_first)
    out = wrapped(*inputs)
    loss = dot_loss(out, target)
    if reduction == "mean":
        loss = loss / target.shape[0 if batch_first else 1]
    loss.backward()
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    sq = wrapped.sq_norms()
    B = wrapped.per_sample_norms().shape[0]
    layer_sq = torch.stack([sq[p] if p in sq else p.new_zeros(B) for _, p in named])
    norms = layer_sq.sum(0).sqrt()
    if clipping == "flat":
        weights = clip_factors(norms, C)
    else:
        factors = clip_factors(layer_sq.sqrt(), layer_thresholds(C, len(named)))
        weights = {p: f for (_, p), f in zip(named, factors, strict=True)}
    sums = wrapped.weighted_sums(weights)
    return norms, {n: sums.get(p, torch.zeros_like(p)) for n, p in named}, wrapped


def check(model, *inputs, K=1, reduction="mean", C=None, clipping="flat", batch_first=True):
    """Ghost norms and clipped sums equal the oracle's (to float64 roundoff); returns the wrapper."""
    model = model.to(torch.float64)
    inputs = tuple(x.double() if x.is_floating_point() else x for x in inputs)
    target = random_target(model, inputs)
    ref = reference_grad_samples(model, inputs, target=target, K=K, batch_first=batch_first)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    oracle_norms = clip_and_sum([ref[n] for n in names], max_grad_norm=1e9).norms
    C = C if C is not None else float(oracle_norms.median()) if oracle_norms.numel() else 1.0  # some clipped, some not
    oracle = clip_and_sum([ref[n] for n in names], max_grad_norm=C, clipping=clipping)
    norms, sums, wrapped = ghost_results(
        model, inputs, target, K=K, reduction=reduction, C=C, clipping=clipping, batch_first=batch_first
    )
    scale = max(1.0, float(oracle.norms.max()) if oracle.norms.numel() else 1.0)
    torch.testing.assert_close(norms, oracle.norms, rtol=TOL, atol=TOL * scale)
    for n, s in zip(names, oracle.summed, strict=True):
        torch.testing.assert_close(sums[n], s, rtol=TOL, atol=TOL * scale, msg=lambda m, n=n: f"{n}: {m}")
    return wrapped


# -- the math -------------------------------------------------------------------------
@pytest.mark.parametrize("strategy", ["gram", "direct"])
def test_linear_norm_strategies_agree(strategy: str) -> None:
    A, G = torch.randn(5, 7, 4, dtype=torch.float64), torch.randn(5, 7, 3, dtype=torch.float64)
    direct = torch.einsum("bno,bni->boi", G, A).flatten(1).pow(2).sum(1)
    torch.testing.assert_close(linear_sq_norms(A, G, strategy=strategy), direct)


# -- layer by layer -------------------------------------------------------------------
@pytest.mark.parametrize("K", [1, 3])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("extra", [(), (6,), (2, 3)])
def test_linear_with_sequence_dims(K: int, reduction: str, extra: tuple) -> None:
    check(nn.Linear(4, 3), torch.randn(2 * K, *extra, 4), K=K, reduction=reduction)


def test_linear_long_sequence_uses_gram_and_batch_first_false() -> None:
    wrapped = check(nn.Linear(3, 40), torch.randn(12, 4, 3), K=2, batch_first=False)  # [T, B*K, d]
    assert wrapped.units == [("model", "ghost")]


@pytest.mark.parametrize("frozen", ["weight", "bias"])
@pytest.mark.parametrize("shape", [(6, 3, 5), (6, 5)])  # one position per sample: the bias's norm reused
def test_linear_frozen_parameter_and_per_layer_clipping(frozen: str, shape: tuple) -> None:
    layer = nn.Linear(5, 4)
    getattr(layer, frozen).requires_grad_(False)
    check(layer, torch.randn(*shape), K=2, clipping="per_layer")
    check(layer, torch.randn(*shape), K=1)


def test_a_linear_layer_of_one_position_spends_no_kernel_on_a_zero_or_a_repeat() -> None:
    """Its norms are ``‖a‖² ‖δ‖²`` with ``‖δ‖²`` shared by the bias; its sums, plain products (``--profile-ops``)."""
    from dpnotebook.benchmarks.profile_ops import count_ops

    model = dpnotebook.wrap_model(nn.Linear(5, 3), "ghost")
    model(torch.randn(4, 5)).pow(2).sum().backward()
    assert dict(count_ops(model.sq_norms, warmup=0).ops) == {"aten::pow": 2, "aten::sum": 2, "aten::mul": 2}
    factors = torch.rand(4)  # flat clipping: the weight and the bias share them, and their scaling
    sums = count_ops(lambda: model.weighted_sums({p: factors for p in model.parameters()}, None), warmup=0)
    assert dict(sums.ops) == {"aten::mul": 2, "aten::mm": 2}  # factors * scale, the rows weighted; two products
    apart = count_ops(lambda: model.weighted_sums({p: torch.ones(4) for p in model.parameters()}, None), warmup=0)
    assert apart.ops["aten::mul"] == 3  # per-layer factors: each parameter's own scaling


@pytest.mark.parametrize("K", [1, 3])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_embedding_repeated_indices_and_padding(K: int, reduction: str) -> None:
    emb = nn.Embedding(6, 4, padding_idx=0)
    tokens = torch.tensor([[1, 1, 0, 2], [3, 0, 3, 3], [5, 5, 5, 1]]).repeat_interleave(K, 0)
    tokens[::2, -1] = 4  # copies of a sample differ
    check(emb, tokens, K=K, reduction=reduction)


@pytest.mark.parametrize(
    "layer,shape",
    [
        (nn.LayerNorm(4), (3, 4)),
        (nn.GroupNorm(2, 4), (4, 3, 3)),
        (nn.RMSNorm(4), (2, 4)),
        (nn.InstanceNorm1d(3, affine=True), (3, 5)),  # no ghost handler: its hooks sampler
    ],
)
@pytest.mark.parametrize("K", [1, 3])
def test_norm_layers(layer: nn.Module, shape: tuple, K: int) -> None:
    check(layer, torch.randn(2 * K, *shape), K=K)


@pytest.mark.parametrize("K", [1, 2])
def test_dp_attention_self_and_cross(K: int) -> None:
    class Attend(nn.Module):
        def __init__(self, kdim: int = 4, **kw: object) -> None:
            super().__init__()
            self.kdim = kdim
            self.att = DPMultiheadAttention(4, 2, batch_first=True, kdim=kdim, **kw)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            k = x[..., : self.kdim]
            self_att = self.att(x, k, x)[0].sum(1) if self.kdim != 4 else self.att(x, x, x)[0].sum(1)
            return self_att + self.att(x[:, :2], k, x)[0].sum(1)  # and again, with other queries

    check(Attend(), torch.randn(2 * K, 5, 4), K=K)  # packed q/k/v weight: row windows
    wrapped = check(Attend(kdim=3, add_bias_kv=True), torch.randn(2 * K, 5, 4), K=K)  # shared bias: materialised
    assert dict(wrapped.units)["model.att.q_in_proj"] == "in_projection_grad_sampler"


@pytest.mark.parametrize(
    "rnn", [DPLSTM(3, 4, num_layers=2, bidirectional=True, batch_first=True), DPGRU(3, 4, batch_first=True)]
)
@pytest.mark.parametrize("K", [1, 3])
def test_dp_recurrent_layers(rnn: nn.Module, K: int) -> None:
    class Last(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rnn = copy.deepcopy(rnn)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.rnn(x)[0][:, -1]

    wrapped = check(Last(), torch.randn(2 * K, 5, 3), K=K)
    assert all(how == "ghost" for _, how in wrapped.units)


# -- whole models, fallbacks, shared weights --------------------------------------------
class TiedLM(nn.Module):
    """The output layer reuses the embedding matrix: shared weights are materialised."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(9, 5)
        self.mix = nn.Linear(5, 5)
        self.out = nn.Linear(5, 9, bias=False)
        self.out.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.mix(self.embed(tokens)))).mean(1)


class Scale(nn.Module):
    """A layer with no grad sampler at all: torch.func computes it."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.linspace(0.5, 2.0, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.w


class Temperature(nn.Module):
    """A 0-d parameter (a learned temperature): its per-sample gradients have shape [B]."""

    def __init__(self) -> None:
        super().__init__()
        self.t = nn.Parameter(torch.tensor(1.5))
        self.fc = nn.Linear(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) / self.t


@pytest.mark.parametrize("K", [1, 2])
def test_zero_dim_parameter(K: int) -> None:
    """A scalar parameter left to torch.func joins the norms and the clipped sum (also with no samples)."""
    wrapped = check(Temperature(), torch.randn(3 * K, 3), K=K)
    assert dict(wrapped.units)["model.t"] == "broadcast"  # met the batch in fc(x) / t (issue #30)
    check(Temperature(), torch.randn(0, 3), K=K)


class WithFallbacks(nn.Module):
    """Layers ghost mode leaves to the hooks engine: torch.func ones, an EmbeddingBag (its own sampler)."""

    def __init__(self) -> None:
        super().__init__()
        self.bag = nn.EmbeddingBag(7, 4, mode="mean")
        self.fc = nn.Linear(4, 4)
        self.act = nn.PReLU()
        self.scale = Scale()

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.scale(self.act(self.fc(self.bag(tokens))))


@pytest.mark.parametrize("K", [1, 3])
@pytest.mark.parametrize(
    "make,data",
    [
        (SampleConvNet, lambda n: torch.randn(n, 1, 28, 28)),
        (lambda: SmallResNetGN((8, 8, 16)), lambda n: torch.randn(n, 3, 8, 8)),
        (lambda: TextTransformer(d=8), lambda n: torch.randint(0, 50, (n, 6))),
        (TiedLM, lambda n: torch.randint(0, 9, (n, 4))),
        (WithFallbacks, lambda n: torch.randint(0, 7, (n, 3))),
    ],
)
def test_composite_models(make, data, K: int) -> None:
    wrapped = check(make(), data(2 * K), K=K, reduction="sum" if K == 1 else "mean")
    if make is TiedLM:
        assert dict(wrapped.units)["model.embed"] != "ghost"  # shared with model.out: materialised
    if make is WithFallbacks:
        assert dict(wrapped.units) == {
            "model.bag": "embedding_bag_grad_sampler",
            "model.fc": "ghost",
            "model.act": "torch.func",
            "model.scale": "torch.func",
        }


def test_layer_called_twice_joins_its_calls() -> None:
    class Twice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(3, 3)
            self.emb = nn.Embedding(5, 3)

        def forward(self, t: torch.Tensor) -> torch.Tensor:
            h = self.emb(t) + self.emb(t.flip(1))
            return self.lin(torch.tanh(self.lin(h))).sum(1)

    check(Twice(), torch.randint(0, 5, (4, 3)), K=2)


class SharedConvBlock(nn.Module):
    """One convolution and one GroupNorm, each called twice in a forward pass."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 2, 3, padding=1)
        self.norm = nn.GroupNorm(1, 2)
        self.fc = nn.Linear(2 * 4 * 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(self.conv(x))
        return self.fc(self.norm(self.conv(torch.tanh(h))).flatten(1))


@pytest.mark.parametrize("K", [1, 2])
def test_settled_layers_called_twice_add_up(K: int) -> None:
    wrapped = check(SharedConvBlock(), torch.randn(3 * K, 2, 4, 4), K=K)
    calls = [c for layers in wrapped._ledger.pending.values() for m, cs in layers.items() for c in cs]
    assert sorted(c.released for c in calls) == [False] + [True] * 4  # conv and norm twice each; fc kept


def test_settled_layers_over_two_forward_passes_equal_each_pass_alone() -> None:
    torch.manual_seed(0)
    model = SharedConvBlock().double()
    xs = [torch.randn(3, 2, 4, 4, dtype=torch.float64), torch.randn(2, 2, 4, 4, dtype=torch.float64)]
    alone = []
    for x in xs:
        one = dpnotebook.wrap_model(copy.deepcopy(model), "ghost")
        one(x).sum().backward()
        alone.append(one.per_sample_norms())
    both = dpnotebook.wrap_model(model, "ghost")
    both.allow_grad_accumulation()
    for x in xs:
        both(x).sum().backward()
    torch.testing.assert_close(both.per_sample_norms(), torch.cat(alone), rtol=1e-12, atol=1e-12)


def test_settled_groups_of_one_forward_pass_must_share_their_scale() -> None:
    from dpnotebook.grad_sample.samplers._contracts import MaterialisedGroup

    w = nn.Parameter(torch.zeros(2))
    group = MaterialisedGroup({w: torch.ones(3, 2)}, 0.5)
    with pytest.raises(GradSampleError, match=r"scaled differently \(0.5 and 1.0\)"):
        group.absorb(MaterialisedGroup({w: torch.ones(3, 2)}, 1.0))


def test_settled_layers_let_go_of_their_inputs_during_backward() -> None:
    """A convolution's input and backprops must not be kept until the optimizer step (they grow with B*K)."""
    import gc
    import weakref

    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.Tanh(), nn.Conv2d(2, 2, 3), nn.Flatten(), nn.Linear(8, 2))
    seen: list[weakref.ref] = []
    model[2].register_forward_hook(lambda m, args, out: seen.append(weakref.ref(args[0])))
    wrapped = dpnotebook.wrap_model(model, "ghost")
    loss = wrapped(torch.randn(4, 1, 6, 6)).sum()
    loss.backward(retain_graph=True)  # the graph stays alive: only the ledger could still hold the input
    del loss
    gc.collect()
    # the first forward pass also runs the discovery and the provenance probe's passes (two in eval mode, two in
    # training mode): none is kept
    assert len(seen) == 6 and all(ref() is None for ref in seen)
    assert wrapped.per_sample_norms().shape == (4,)
    wrapped.zero_grad()
    loss = wrapped(torch.randn(4, 1, 6, 6)).sum()
    loss.backward(retain_graph=True)
    with pytest.raises(GradSampleError, match=r"model.2 \(Conv2d\).*retain_graph=True.*ghost mode"):
        loss.backward()


def _released(wrapped: GhostGradSampleModule) -> dict[str, list[bool]]:
    """``{path: [released, ...]}``: which recorded calls of each layer were settled."""
    return {
        cs[0].call.path: [c.released for c in cs]
        for layers in wrapped._ledger.pending.values()
        for cs in layers.values()
    }


@pytest.mark.parametrize("K", [1, 4])
def test_linear_over_long_sequences_is_settled_during_backward(K: int) -> None:
    """n = K*T positions against in*out/(in+out) = 4: at K=4 the per-sample gradients are the smaller record."""
    model = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8))
    wrapped = check(model, torch.randn(2 * K, 3, 8), K=K)
    settled = K == 4
    assert _released(wrapped) == {"model.0": [settled], "model.2": [settled]}
    assert set(wrapped.strategies().values()) == ({"materialised (direct)"} if settled else {"ghost gram"})


def test_transformer_shaped_linear_is_settled_where_its_norms_alone_would_pick_gram() -> None:
    """T=64 positions through 128 -> 256 (a transformer's feed-forward): the Gram norms cost less than the
    direct norms, but the Gram path then owes the weighted sum, a product as large as the per-sample
    gradients (settle_pays)."""
    assert linear_strategy(64, 128, 256) == "gram" and settle_pays(64, 128, 256)
    model = nn.Sequential(nn.Linear(128, 256), nn.Tanh(), nn.Linear(256, 2))
    wrapped = check(model, torch.randn(3, 64, 128))
    assert wrapped.strategies()["model.0"] == "materialised (direct)"
    assert _released(wrapped)["model.0"] == [True]


class TwoLengths(nn.Module):
    """One Linear on a short and on a long sequence in one forward: one call ghosted, one settled."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x[:, :2]).sum(1) + torch.tanh(self.proj(x)).sum(1)


def test_settled_and_ghosted_calls_of_one_layer_are_joined() -> None:
    wrapped = check(TwoLengths(), torch.randn(3, 10, 8))
    assert sorted(_released(wrapped)["model.proj"]) == [False, True]
    assert wrapped.strategies() == {"model.proj": "materialised (direct)"}


def test_settled_linear_lets_go_of_its_input_during_backward() -> None:
    """The ledger's record of a settled call must not keep the input alive until the optimizer step."""
    import gc
    import weakref

    model = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8))
    wrapped = dpnotebook.wrap_model(model, "ghost", K=4)
    loss = wrapped(torch.randn(8, 3, 8)).sum()
    (record,) = [
        c for layers in wrapped._ledger.pending.values() for m, cs in layers.items() if m is model[2] for c in cs
    ]
    held = weakref.ref(record.call.args[0])  # the (detached) input the ledger recorded
    loss.backward(retain_graph=True)  # the graph stays alive: only the ledger could still hold the input
    del loss
    gc.collect()
    assert held() is None and record.backprops is None
    assert wrapped.per_sample_norms().shape == (2,)


class LastHidden(nn.Module):
    """A DPLSTM's last hidden state."""

    def __init__(self) -> None:
        super().__init__()
        self.rnn = DPLSTM(8, 16, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.rnn(x)[0][:, -1]


@pytest.mark.parametrize("K", [1, 16])
def test_recurrent_layer_is_settled_when_its_per_sample_gradients_are_smaller(K: int) -> None:
    wrapped = check(LastHidden(), torch.randn(2 * K, 2, 8), K=K)  # n = 2K positions; shared Gram pays up to n = 16
    how = wrapped.strategies()["model.rnn.gate_projections.0"]
    assert how == ("materialised (direct)" if K == 16 else "ghost shared-gram")


def test_empty_batch_through_settled_layers() -> None:
    """No samples: settled linear and recurrent calls give no norms and zero clipped sums."""
    cases = [
        (nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8)), 4, (0, 3, 8), "model.2"),
        (nn.Sequential(LastHidden(), nn.Linear(16, 2)), 16, (0, 2, 8), "model.0.rnn.gate_projections.0"),
    ]
    for model, K, shape, settled in cases:
        wrapped = dpnotebook.wrap_model(model, "ghost", K=K)
        wrapped(torch.randn(shape)).sum().backward()
        assert _released(wrapped)[settled] == [True]
        assert wrapped.strategies()[settled] == "materialised (direct)"
        assert wrapped.per_sample_norms().shape == (0,)
        sums = wrapped.weighted_sums(torch.ones(0))
        assert {id(p) for p in sums} == {id(p) for p in model.parameters()}
        assert all(s.shape == p.shape and not s.any() for p, s in sums.items())


@pytest.mark.parametrize("K", [1, 2])
def test_materialised_layer_with_batch_first_false(K: int) -> None:
    """The layer's registered sampler gets the backprops in the layer's own layout ([T, B*K, d])."""
    check(nn.Sequential(nn.Linear(3, 5), nn.LayerNorm(5)), torch.randn(4, 2 * K, 3), K=K, batch_first=False)


def test_inplace_relu_after_a_layer_and_empty_batch() -> None:
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(inplace=True), nn.Linear(4, 2))
    check(model, torch.randn(6, 3), K=2)
    wrapped = dpnotebook.wrap_model(nn.Linear(3, 2), "ghost")
    wrapped(torch.randn(0, 3)).sum().backward()
    assert wrapped.per_sample_norms().shape == (0,)


# -- refusals and guards ----------------------------------------------------------------
def test_parameter_used_outside_its_layer_is_an_error() -> None:
    class Outside(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(3, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x) + F.linear(x, self.fc.weight)

    wrapped = dpnotebook.wrap_model(Outside(), "ghost")
    with pytest.raises(GradSampleError, match=r"received \.grad but no grad_sample: \['fc.weight'\]"):
        wrapped(torch.randn(2, 3)).sum().backward()


def test_input_modified_in_place_after_use_is_an_error() -> None:
    class Clobber(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(3, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = torch.tanh(x)
            out = self.fc(h)
            h.mul_(2)
            return out

    wrapped = dpnotebook.wrap_model(Clobber(), "ghost")
    with pytest.raises(GradSampleError, match="modified in place"):
        wrapped(torch.randn(2, 3)).sum().backward()


def test_stepping_a_plain_optimizer_without_the_clipped_sums_is_caught() -> None:
    wrapped = dpnotebook.wrap_model(nn.Linear(3, 2), "ghost")
    opt = torch.optim.SGD(wrapped.parameters(), lr=0.1)
    wrapped(torch.randn(4, 3)).sum().backward()
    assert wrapped.weight.grad is None  # ghost mode leaves p.grad alone
    with torch.no_grad():
        wrapped.weight.add_(1.0)  # what any optimizer step would do
    opt.zero_grad()
    with pytest.raises(GradSampleError, match="GhostDPOptimizer"):
        wrapped(torch.randn(4, 3))


def test_force_functorch_and_unwrap() -> None:
    with pytest.raises(ValueError, match="force_functorch"):
        GhostGradSampleModule(nn.Linear(2, 2), force_functorch=True)
    layer = nn.Linear(2, 2)
    wrapped = dpnotebook.wrap_model(layer, "ghost")
    assert wrapped.to_standard_module() is layer
    assert not hasattr(layer.weight, "_dpn_ghost_owner")
    layer(torch.randn(3, 2)).sum().backward()
    assert layer.weight.grad is not None  # plain PyTorch again


# -- the optimizer --------------------------------------------------------------------
@pytest.mark.parametrize("clipping", ["flat", "per_layer"])
def test_ghost_optimizer_matches_oracle_with_virtual_steps(clipping: str) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(8, 4), nn.Linear(4, 3)).double()
    batches = [torch.randint(0, 8, (3, 5)), torch.randint(0, 8, (2, 5))]
    targets = [torch.randn(3, 5, 3, dtype=torch.float64), torch.randn(2, 5, 3, dtype=torch.float64)]
    C = 0.5
    names = [n for n, _ in model.named_parameters()]
    expected = None
    for x, t in zip(batches, targets, strict=True):
        ref = reference_grad_samples(model, [x], target=t)
        summed = clip_and_sum([ref[n] for n in names], max_grad_norm=C, clipping=clipping).summed
        expected = summed if expected is None else [a + b for a, b in zip(expected, summed, strict=True)]
    ghost = copy.deepcopy(model)
    wrapped = dpnotebook.wrap_model(ghost, "ghost", loss_reduction="sum")
    opt = GhostDPOptimizer(
        torch.optim.SGD(wrapped.parameters(), lr=1.0),
        noise_multiplier=0.0,
        max_grad_norm=C,
        expected_batch_size=5,
        loss_reduction="sum",
        clipping=clipping,
    )
    before = [p.detach().clone() for p in ghost.parameters()]
    for x, t in zip(batches, targets, strict=True):
        dot_loss(wrapped(x), t).backward()
        opt.virtual_step() if x is batches[0] else opt.step()
    for b, p, e in zip(before, ghost.parameters(), expected, strict=True):
        torch.testing.assert_close(b - p.detach(), e, rtol=1e-10, atol=1e-12)
    assert opt.last_step_stats.batch_size == 5 and opt.last_step_stats.virtual_steps == 2


def test_make_private_ghost_trains() -> None:
    from torch.utils.data import DataLoader, TensorDataset

    from dpnotebook.privacy import PrivacyEngine

    data = TensorDataset(torch.randn(32, 4), torch.randint(0, 2, (32,)))
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    engine = PrivacyEngine(accountant="rdp")
    model, opt, loader = engine.make_private(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        data_loader=DataLoader(data, batch_size=8),
        noise_multiplier=1.0,
        max_grad_norm=1.0,
        grad_sample_mode="ghost",
    )
    assert isinstance(opt, GhostDPOptimizer)
    for x, y in loader:
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    assert len(engine.accountant) == len(loader)
    assert all(torch.isfinite(p).all() for p in model.parameters())
