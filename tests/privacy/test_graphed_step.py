"""GraphedStep: the padded step equals the plain DP step, rows past the batch add nothing, every step is counted.

The ``graphs`` fixture makes steps that capture: under ``pytest --device cuda`` (the GPU test path) in a
real CUDA graph after ``warmup`` eager steps, so each comparison with the plain eager step is a replay's;
on the CPU through :class:`FakeGraph`, which keeps a graph's semantics for what GraphedStep reads around
it (a capture runs the step's Python and none of its tensor work; a replay the tensor work, into the
capture's tensors, and none of the Python) but not a graph's fixed memory: memory freed under a replay,
or state made inside a capture, shows only on a GPU (``docs/guarantees.md``, "On a GPU", has the rules
that prevent both and what the H200 runs found). The ``eager`` path (``capture=False``) is tested too.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.overrides import TorchFunctionMode

import dpnotebook
from dpnotebook.audit._sensitivity import reference_clipped_sum
from dpnotebook.benchmarks.models import MODELS, build
from dpnotebook.benchmarks.steps import flavour_of
from dpnotebook.errors import GradSampleError, PrivacyWarning
from dpnotebook.modes import available_modes
from dpnotebook.privacy import DPDataLoader, GraphedStep, PrivacyEngine
from dpnotebook.privacy._distributed import DistributedDPOptimizer
from dpnotebook.privacy._optimizer import optimizer_class

SIGMA, C, LR = 0.7, 0.5, 0.3


class FakeGraph:
    """A CUDA graph's semantics on the CPU, for the bookkeeping around it: a capture runs the step's Python
    but none of its tensor work (undone here), a replay does the tensor work into the tensors the capture
    made and none of the Python (the objects GraphedStep reads are put back, holding the new values).
    Unlike a graph, its replay allocates afresh and makes missing state again: fixed memory is not modelled."""

    def __init__(self, step: GraphedStep) -> None:
        self.step, self.captured = step, False

    def _effects(self) -> list[torch.Tensor]:
        """What a step's kernels write: parameters, the optimizer's state."""
        opt = self.step.optimizer
        state = [t for s in opt.original_optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
        return [*opt.params, *state]

    def capture(self):
        graph = self

        class Capturing:
            def __enter__(self):
                self.before = [t.detach().clone() for t in graph._effects()]

            def __exit__(self, kind, error, trace):
                if kind is None:
                    with torch.no_grad():
                        for t, b in zip(graph._effects(), self.before, strict=True):
                            t.copy_(b)  # nothing ran
                    opt = graph.step.optimizer
                    graph.grads = [p.grad for p in opt.params]
                    graph.stats, graph.loss, graph.captured = opt.last_step_stats, graph.step._loss_sum, True
                return False

        return Capturing()

    def replay(self) -> None:
        step, opt = self.step, self.step.optimizer
        before = [p.grad for p in opt.params], opt.last_step_stats, step._loss_sum, opt.finished_batches
        with step._owned():
            step._padded_step()
        new = opt.last_step_stats
        for old, made in [
            *zip(self.grads, [p.grad for p in opt.params], strict=True),
            (self.stats.per_sample_norms, new.per_sample_norms),
            (self.stats.num_clipped, new.num_clipped),
            (self.stats.norms._norms, new.norms._norms),
            (self.loss, step._loss_sum),
        ]:
            old.copy_(made)  # into the capture's tensors, as the graph's kernels write
        for p, grad in zip(opt.params, before[0], strict=True):  # and no Python ran
            p.grad = grad
        opt.last_step_stats, step._loss_sum, opt.finished_batches = before[1], before[2], before[3]


@pytest.fixture
def graphs(monkeypatch):
    """``make(model, opt, **kw)``: a GraphedStep that captures: on CUDA for real, on the CPU with FakeGraph."""

    def make(model, opt, **kw):
        step = GraphedStep(model, opt, **kw)
        if step.capture:  # the GPU test path: real graphs
            return step
        made = []

        def new_graph():
            made.append(FakeGraph(step))
            return made[-1]

        monkeypatch.setattr(torch.cuda, "CUDAGraph", new_graph)
        monkeypatch.setattr(torch.cuda, "graph", lambda g: g.capture())
        monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
        step.capture = True
        return step

    return make


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3))


def convnet() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(2, 4, 3), nn.GroupNorm(2, 4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 3 * 3, 3))


def setup(make, mode, *, K=1, reduction="mean", sigma=SIGMA, expected=4.0, momentum=0.0, lr=LR, clipping="flat"):
    model = dpnotebook.wrap_model(make(), mode, K=K, loss_reduction=reduction)
    opt = optimizer_class(mode)(
        torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum),
        noise_multiplier=sigma,
        max_grad_norm=C,
        expected_batch_size=expected,
        loss_reduction=reduction,
        clipping=clipping,
        generator=torch.Generator().manual_seed(7),
        secure_mode=False,
    )
    return model, opt


def plain_step(model, opt, x, y, reduction):
    opt.zero_grad(set_to_none=True)
    if x.shape[0]:
        loss = F.cross_entropy(model(x), y, reduction=reduction)
        loss.backward()
    opt.step()


def batches(shape, sizes, K, seed=1):
    g = torch.Generator().manual_seed(seed)
    for b in sizes:
        x = torch.randn(b * K, *shape, generator=g) * 2
        y = torch.randint(0, 3, (b * K,), generator=g)
        yield x, y


def params_of(model):
    return [p.detach().clone() for p in model.parameters()]


def assert_close(a, b, what):
    for i, (u, v) in enumerate(zip(a, b, strict=True)):
        assert torch.allclose(u, v, rtol=1e-5, atol=1e-6), f"{what}: parameter {i} differs by {(u - v).abs().max()}"


@pytest.mark.parametrize("path", ["eager", "graph"])
@pytest.mark.parametrize("mode", available_modes())
@pytest.mark.parametrize(("K", "reduction"), [(1, "mean"), (2, "sum")])
def test_the_padded_step_is_the_plain_step(mode, K, reduction, path, graphs):
    """Batches of 3, 0, 5, 2 and 4 samples in a step of 6: the same parameters as the plain step after each,
    eager and captured (a real graph under ``--device cuda``, :class:`FakeGraph` on the CPU)."""
    plain, plain_opt = setup(mlp, mode, K=K, reduction=reduction)
    padded, padded_opt = setup(mlp, mode, K=K, reduction=reduction)
    if path == "graph":
        step = graphs(padded, padded_opt, max_batch_size=6, warmup=1)
    else:
        step = GraphedStep(padded, padded_opt, max_batch_size=6, warmup=1, capture=False)
    for i, (x, y) in enumerate(batches((6,), [3, 0, 5, 2, 4], K)):
        plain_step(plain, plain_opt, x, y, reduction)
        loss = step(x, y)
        assert_close(params_of(plain), params_of(padded), f"{mode} K={K} step {i}")
        if x.shape[0]:
            expected = F.cross_entropy(plain(x), y).detach()  # after the step: recompute on both
            assert torch.allclose(F.cross_entropy(padded(x), y), expected, rtol=1e-5, atol=1e-6)
            assert loss.dim() == 0 and torch.isfinite(loss)
        stats = padded_opt.last_step_stats
        assert stats.batch_size == x.shape[0] // K
        assert stats.per_sample_norms.shape == (x.shape[0] // K,)
        assert stats.fraction_clipped == plain_opt.last_step_stats.fraction_clipped
    assert step.replays + step.eager_steps == 5
    # step 0 probes the rows (not in functorch mode), then an eager step proves the step capturable (no
    # sync), then it is captured
    eager = 1 if mode == "functorch" else 2
    assert (step.captures, step.replays) == ((1, 5 - eager) if path == "graph" else (0, 0))


@pytest.mark.parametrize("mode", ["hooks", "ghost"])
def test_a_conv_model_with_momentum(mode, graphs):
    plain, plain_opt = setup(convnet, mode, momentum=0.9)
    padded, padded_opt = setup(convnet, mode, momentum=0.9)
    step = graphs(padded, padded_opt, max_batch_size=5, warmup=2)
    for i, (x, y) in enumerate(batches((2, 5, 5), [4, 5, 1, 3, 2, 5], 1)):
        plain_step(plain, plain_opt, x, y, "mean")
        step(x, y)
        assert_close(params_of(plain), params_of(padded), f"{mode} step {i}")


def textnet() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Embedding(20, 8), nn.LayerNorm(8), nn.Flatten(), nn.Linear(5 * 8, 3))


def adversarial(kind: str, K: int):
    """Five samples (``K`` rows each): sample 0, which the rows past the batch copy, has a gradient far larger
    than the others'; for the MLP, sample 2 has a NaN input (its norm is not finite: it must add nothing)."""
    g = torch.Generator().manual_seed(3)
    if kind == "mlp":
        data = torch.randn(5 * K, 6, generator=g)
        data[:K] *= 1e4
        data[2 * K, 1] = float("nan")
        return data, [0, 1, 3, 4]
    data = torch.randint(0, 20, (5 * K, 5), generator=g)
    data[:K] = 7  # one token five times: its embedding row gets the whole gradient
    return data, [0, 1, 2, 3, 4]


@pytest.mark.parametrize("kind", ["mlp", "text"])
@pytest.mark.parametrize("mode", available_modes())
@pytest.mark.parametrize(("K", "clipping"), [(1, "flat"), (2, "per_layer")])
def test_rows_past_the_batch_add_nothing_even_for_an_adversarial_first_sample(kind, mode, K, clipping, graphs):
    """The sensitivity property of the captured step: sigma = 0, lr = 1, sum, divisor 1, so the update is -S(D).

    For each sample s, ||S(D) - S(D without s)|| <= C (D without s has one more row copying sample 0), and
    S(D) is the float64 definition's clipped sum over the finite samples.
    """
    make = mlp if kind == "mlp" else textnet
    data, finite = adversarial(kind, K)
    target = torch.arange(5 * K) % 3

    def rows(samples):
        return [r for i in samples for r in range(i * K, (i + 1) * K)]

    def update(samples):
        model, opt = setup(make, mode, K=K, reduction="sum", sigma=0.0, expected=1.0, lr=1.0, clipping=clipping)
        before = params_of(model)
        step = graphs(model, opt, max_batch_size=8, warmup=1)
        for _ in range(2):  # the probe's step and the eager step before the capture, on finite samples
            step(data[rows([1, 3])], target[rows([1, 3])])
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(2):  # the capture's replay, then a replay, each from the same weights
                for p, b in zip(model.parameters(), before, strict=True):
                    p.data.copy_(b)
                step(data[rows(samples)], target[rows(samples)])
            step.flush()
        nonfinite = any(issubclass(w.category, PrivacyWarning) and "NaN" in str(w.message) for w in caught)
        assert nonfinite == (kind == "mlp" and 2 in samples)
        assert step.replays == (3 if mode == "functorch" else 2)  # functorch runs no probe: one more
        return [b.double() - p.detach().double() for b, p in zip(before, model.parameters(), strict=True)]

    whole = update(range(5))
    for s in range(5):
        rest = update([i for i in range(5) if i != s])
        moved = math.sqrt(sum(float((u - v).pow(2).sum()) for u, v in zip(whole, rest, strict=True)))
        assert moved <= C * (1 + 1e-4), f"sample {s} moved the step by {moved / C:.6f} C"
    ref = reference_clipped_sum(
        make(),
        batch=lambda idx: (data[rows([finite[i] for i in idx])], target[rows([finite[i] for i in idx])]),
        loss=lambda m, b: F.cross_entropy(m(b[0]), b[1], reduction="sum"),
        num_samples=len(finite),
        K=K,
        loss_reduction="sum",
        clipping=clipping,
        max_grad_norm=C,
    )
    gap = math.sqrt(sum(float((u.cpu() - r.cpu()).pow(2).sum()) for u, r in zip(whole, ref, strict=True)))
    assert gap <= 1e-4 * C, f"the captured step is {gap / C:.2e} C from the float64 clipped sum"


def test_a_batch_over_the_size_runs_eagerly(graphs):
    plain, plain_opt = setup(mlp, "ghost")
    padded, padded_opt = setup(mlp, "ghost")
    step = graphs(padded, padded_opt, max_batch_size=3, warmup=1)
    for x, y in batches((6,), [2, 3, 3, 7, 3, 2, 1], 1):
        plain_step(plain, plain_opt, x, y, "mean")
        step(x, y)
        assert_close(params_of(plain), params_of(padded), "over the size")
    # probe, eager, capture; the batch of 7 eager, and the graph dropped (its shapes may have replaced
    # buffers the graph writes into); eager, capture again, replay
    assert (step.eager_steps, step.captures, step.replays) == (4, 2, 3)


def test_a_change_of_C_lr_or_sigma_is_used_at_the_next_step(graphs):
    """C (step 3) and the learning rate (step 5) are held by the graph: each change runs one eager step,
    then captures again; sigma (step 7) is drawn on the host at every call: no new capture."""
    plain, plain_opt = setup(mlp, "hooks")
    padded, padded_opt = setup(mlp, "hooks")
    step = graphs(padded, padded_opt, max_batch_size=6, warmup=1)
    captured = []
    for i, (x, y) in enumerate(batches((6,), [4] * 8, 1)):
        if i == 3:
            for opt in (plain_opt, padded_opt):
                opt.max_grad_norm = 0.05
        if i == 5:
            for opt in (plain_opt, padded_opt):
                opt.param_groups[0]["lr"] = 0.01
        if i == 7:
            for opt in (plain_opt, padded_opt):
                opt.noise_multiplier = 2.0
        captures = step.captures
        plain_step(plain, plain_opt, x, y, "mean")
        step(x, y)
        assert_close(params_of(plain), params_of(padded), f"step {i}")
        captured += [i] if step.captures > captures else []
    assert captured == [2, 4, 6] and step.replays == 4
    stats = padded_opt.last_step_stats
    assert (stats.noise_multiplier, stats.noise_std) == (2.0, 2.0 * 0.05)


def test_a_step_taken_outside_drops_the_graph(graphs):
    """The user's own eager step between calls (it may replace state the graph writes into): the next call
    runs eagerly, then the step is captured again."""
    plain, plain_opt = setup(mlp, "ghost")
    padded, padded_opt = setup(mlp, "ghost")
    step = graphs(padded, padded_opt, max_batch_size=6, warmup=1)
    for i, (x, y) in enumerate(batches((6,), [4, 4, 4, 3, 4, 4, 4], 1)):
        plain_step(plain, plain_opt, x, y, "mean")
        if i == 3:
            plain_step(padded, padded_opt, x, y, "mean")
        else:
            step(x, y)
        assert_close(params_of(plain), params_of(padded), f"step {i}")
    assert (step.eager_steps, step.captures, step.replays) == (3, 2, 3)


def test_the_accountant_counts_every_step_and_the_loader_check_holds(graphs):
    """make_private with Poisson sampling: one accountant step per call, and a batch not drawn last is refused."""
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(64, 6), torch.randint(0, 3, (64,)))
    engine = PrivacyEngine(accountant="rdp", secure_mode=False)
    net = mlp()
    model, opt, loader = engine.make_private(
        module=net,
        optimizer=torch.optim.SGD(net.parameters(), lr=LR),
        data_loader=torch.utils.data.DataLoader(data, batch_size=8),
        noise_multiplier=SIGMA,
        max_grad_norm=C,
        grad_sample_mode="ghost",
        sampling_generator=torch.Generator().manual_seed(1),
    )
    assert isinstance(loader, DPDataLoader)
    step = graphs(model, opt, warmup=1)
    assert step.max_batch_size == math.ceil(8 + 4 * math.sqrt(8)) + 1
    for x, y in loader:
        step(x, y)
    assert len(engine.accountant) == len(loader) == step.replays + step.eager_steps and step.replays > 0
    first, second = iter(loader), None
    x1, y1 = next(first)
    second = next(first)
    with pytest.raises(RuntimeError, match="handed out"):
        step(x1, y1)
    assert second is not None


def test_a_sample_with_a_nan_norm_warns_at_the_next_call(graphs):
    model, opt = setup(mlp, "ghost")
    step = graphs(model, opt, max_batch_size=4, warmup=1)
    x, y = next(batches((6,), [3], 1))
    step(x, y)  # the probe's step, on finite samples
    step(x, y)  # the eager step before the capture
    x[1, 0] = float("inf")
    step(x, y)  # captured and replayed
    with pytest.warns(PrivacyWarning, match="1 sample"):
        step(x[[0, 2]], y[[0, 2]])
    assert all(bool(torch.isfinite(p).all()) for p in model.parameters())
    assert step.replays == 2 and opt.last_step_stats.batch_size == 2


def test_bad_arguments_are_refused_with_the_fix():
    model, opt = setup(mlp, "hooks")
    with pytest.raises(TypeError, match="wrapped model"):
        GraphedStep(mlp(), opt)
    with pytest.raises(TypeError, match="DPOptimizer"):
        GraphedStep(model, torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(TypeError, match="distributed"):
        GraphedStep(model, DistributedDPOptimizer.__new__(DistributedDPOptimizer))
    with pytest.raises(ValueError, match="max_batch_size"):
        GraphedStep(model, opt, max_batch_size=0)
    for bad in (0, None, True, -1):
        with pytest.raises(ValueError, match=f"warmup={bad!r} is invalid"):
            GraphedStep(model, opt, warmup=bad)
    cpu_model, cpu_opt = setup(mlp, "hooks")
    cpu_model.to("cpu")
    with pytest.raises(ValueError, match="capture=True needs"):
        GraphedStep(cpu_model, cpu_opt, capture=True)
    step = GraphedStep(model, opt, lambda out, y: F.cross_entropy(out, y), max_batch_size=4)
    x, y = next(batches((6,), [2], 1))
    with pytest.raises(ValueError, match="one loss per row"):
        step(x, y)
    step = GraphedStep(model, opt, max_batch_size=4)
    with pytest.raises(TypeError, match="input tensors then its target"):
        step(x)
    with pytest.raises(ValueError, match="one row count"):
        step(x, y[:1])
    step(x, y)
    with pytest.raises(ValueError, match="a graph holds one shape"):
        step(torch.randn(2, 7), y)
    model2, opt2 = setup(mlp, "hooks", K=2)
    with pytest.raises(ValueError, match="not a multiple of K=2"):
        GraphedStep(model2, opt2, max_batch_size=4)(torch.randn(3, 6), torch.zeros(3, dtype=torch.long))


class ReadsTheDevice(nn.Module):
    """A forward pass that reads the device on the host, which a CUDA graph's capture refuses."""

    def __init__(self) -> None:
        super().__init__()
        self.net = mlp()

    def forward(self, x):
        out = self.net(x)
        return out * 2 if bool(out.abs().sum() > 1e30) else out


def test_a_step_that_cannot_be_captured_runs_eagerly_with_a_warning():
    """On CUDA the capture fails (a host read): the default warns and steps eagerly, ``capture=True`` raises.

    On the CPU nothing is captured: no warning, and the same parameters as the plain step."""

    def make():
        return ReadsTheDevice()

    plain, plain_opt = setup(make, "hooks")
    padded, padded_opt = setup(make, "hooks")
    step = GraphedStep(padded, padded_opt, max_batch_size=6, warmup=1)
    on_cuda = step.capture
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for x, y in batches((6,), [3, 4, 5], 1):
            plain_step(plain, plain_opt, x, y, "mean")
            step(x, y)
            assert_close(params_of(plain), params_of(padded), "after a failed capture")
    failed = [w for w in caught if "reads the device on the host" in str(w.message)]
    assert len(failed) == (1 if on_cuda else 0)
    assert step.captures == 0 and step.eager_steps == 3 and not step.capture
    if on_cuda:
        strict, strict_opt = setup(make, "hooks")
        required = GraphedStep(strict, strict_opt, max_batch_size=6, warmup=1, capture=True)
        with pytest.raises(RuntimeError, match="reads the device on the host"):
            for x, y in batches((6,), [3, 4], 1):
                required(x, y)


class HostReads(TorchFunctionMode):
    """Records what a CUDA graph's capture would refuse: reads of the device on the host, results whose size
    is the data's, tensors made from host data, moves between devices (on the CPU all of them run, unseen).

    It sees calls that reach Python's torch functions; a synchronisation inside a C++ kernel it cannot
    see (on a GPU, :class:`GraphedStep` checks the step with ``torch.cuda.set_sync_debug_mode`` first).
    """

    READS = frozenset(
        {"__bool__", "item", "tolist", "__float__", "__int__", "__index__", "numpy", "cpu", "cuda", "equal"}
    )
    SIZED_BY_DATA = frozenset({"nonzero", "argwhere", "unique", "unique_consecutive", "masked_select", "bincount"})
    FROM_HOST = frozenset({"tensor", "as_tensor", "new_tensor", "from_numpy"})

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        rest = (*args[1:], *kwargs.values())
        moves = name == "to" and any(isinstance(a, (str, torch.device, torch.Tensor)) for a in rest)
        bool_index = name in ("__getitem__", "__setitem__", "index_put_") and any(
            isinstance(a, torch.Tensor) and a.dtype == torch.bool for a in _flat(args[1:2])
        )
        one_arg_where = name == "where" and len(args) + len(kwargs) == 1
        sized_repeats = name == "repeat_interleave" and any(isinstance(a, torch.Tensor) for a in rest)
        if (
            name in self.READS | self.SIZED_BY_DATA | self.FROM_HOST
            or moves
            or bool_index
            or one_arg_where
            or sized_repeats
        ):
            self.seen.add(name)
        return func(*args, **kwargs)


def _flat(items):
    for item in items:
        if isinstance(item, (tuple, list)):
            yield from _flat(item)
        else:
            yield item


def test_the_host_read_detector_sees_what_it_looks_for():
    x = torch.randn(4)
    for read, name in [
        (lambda: bool(x.sum() > 0), "__bool__"),
        (lambda: x[x > 0], "__getitem__"),
        (lambda: torch.where(x > 0), "where"),
        (lambda: x.repeat_interleave(torch.tensor([1, 2, 1, 0])), "repeat_interleave"),
        (lambda: torch.unique(x), "unique"),
        (lambda: torch.equal(x, x), "equal"),
        (lambda: x.to("cpu"), "to"),
        (lambda: torch.tensor([1.0]), "tensor"),
    ]:
        reads = HostReads()
        with reads:
            read()
        assert name in reads.seen, name
    reads = HostReads()
    with reads:
        torch.where(x > 0, x, 0.0), x.repeat_interleave(2), x[1:], x.to(torch.float64)
    assert not reads.seen


@pytest.mark.parametrize(
    ("name", "mode"),
    # ew has no rule for nn.MultiheadAttention and refuses the text transformer (docs/performance.md)
    [(n, m) for n in MODELS for m in available_modes() if (n, m) != ("TextTransformer", "ew")],
)
def test_the_padded_step_of_every_suite_model_reads_nothing_from_the_device(name, mode):
    """What a capture refuses, looked for on the CPU: the step of each benchmark model in every mode.

    The warm-up steps may read (the provenance probe does); the step a graph holds may not."""
    model, inputs, targets, _ = build(name, 4, K=1, flavour=flavour_of(f"dpsgd_{mode}"), seed=0)
    wrapped = dpnotebook.wrap_model(model, mode)
    opt = optimizer_class(mode)(
        torch.optim.SGD(wrapped.parameters(), lr=0.1),
        noise_multiplier=1.0,
        max_grad_norm=1.0,
        expected_batch_size=4,
        secure_mode=False,
    )
    step = GraphedStep(wrapped, opt, max_batch_size=6, warmup=1, capture=False)
    step(*inputs, targets)
    step._fill(list(inputs), targets, int(targets.shape[0]))
    reads = HostReads()
    with step._owned(), reads:
        step._padded_step()
    assert not reads.seen, f"{name} in {mode} mode: {sorted(reads.seen)} in the step a graph would hold"


@pytest.mark.parametrize("mode", ["hooks", "ghost"])
def test_under_autocast_the_padded_step_is_the_plain_step(mode, graphs):
    """bfloat16 autocast around both steps (the CPU's; CUDA's under ``--device cuda``): the same parameters up
    to bfloat16 rounding of the forward pass (at most 2e-4 on the CPU, 2026-11-27)."""
    device = "cuda" if next(mlp().parameters()).is_cuda else "cpu"
    plain, plain_opt = setup(mlp, mode)
    padded, padded_opt = setup(mlp, mode)
    step = graphs(padded, padded_opt, max_batch_size=6, warmup=1)
    for i, (x, y) in enumerate(batches((6,), [4, 5, 3, 6], 1)):
        with torch.autocast(device, dtype=torch.bfloat16):
            plain_step(plain, plain_opt, x, y, "mean")
            step(x, y)
        for a, b in zip(params_of(plain), params_of(padded), strict=True):
            assert torch.allclose(a, b, rtol=1e-2, atol=1e-3), f"{mode} step {i}: {(a - b).abs().max()}"
    assert step.replays == 2


def test_a_probe_refusal_says_which_samples_are_padding():
    """The provenance probe runs on the padded batch: a refusal naming samples past the batch says so."""
    model, opt = setup(mlp, "hooks")
    step = GraphedStep(model, opt, max_batch_size=5, warmup=1)
    x, y = next(batches((6,), [3], 1))
    x[0, 2] = float("nan")  # copied into the rows past the batch
    with pytest.raises(GradSampleError, match=r"turned a gradient .* the samples from 3 on are copies of sample 0"):
        step(x, y)


def test_a_virtual_step_and_a_time_major_model_are_refused_with_the_fix():
    model, opt = setup(mlp, "hooks")
    with pytest.raises(ValueError, match="batch_first=False. Fix: wrap it with batch_first=True"):
        GraphedStep(dpnotebook.wrap_model(mlp(), "hooks", batch_first=False), opt)
    step = GraphedStep(model, opt, max_batch_size=4)
    opt.signal_skip_step()  # as BatchMemoryManager does
    x, y = next(batches((6,), [2], 1))
    with pytest.raises(RuntimeError, match="asked for a virtual step. Fix: give the whole Poisson batch"):
        step(x, y)
