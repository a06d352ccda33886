"""One training step of each benchmarked configuration, as a closure ``step()``; dpnotebook's and Opacus 1.6's.

Every step has the same DP-SGD settings (:data:`SIGMA`, :data:`CLIP`, :data:`LR`). A configuration's name:

=========================  ===================================================================
``nonprivate``             plain SGD step with ``torch.nn`` layers (the reference)
``nonprivate_dplayers``    the same with dpnotebook's DP layers (``DPLSTM``, ``DPMultiheadAttention``)
``gsm_<mode>``             forward + backward with per-sample gradients (ghost: with the norms)
``dpsgd_<mode>``           full DP-SGD step: clip, sum, noise, SGD update
``graphed_<mode>``         the same step run by :class:`~dpnotebook.privacy.GraphedStep` (a CUDA graph on a GPU)
``naive_microbatch``       DP-SGD by one forward/backward per sample, clipping each
``opacus_gsm_<mode>``      Opacus 1.6's per-sample gradients (``--compare-opacus``)
``opacus_dpsgd_<mode>``    Opacus 1.6's DP-SGD step via ``PrivacyEngine.make_private``
``compiled_<name>``        ``<name>`` with the model compiled first (``--compile``, :func:`compile_mode`)
=========================  ===================================================================

>>> step = make_step("MLP", "dpsgd_ghost", batch=4, K=2)
>>> step()
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

import dpnotebook
from dpnotebook.benchmarks.models import build
from dpnotebook.privacy._graphed import GraphedStep, row_cross_entropy
from dpnotebook.privacy._optimizer import optimizer_class

#: Noise multiplier, clipping bound and learning rate of every timed step.
SIGMA, CLIP, LR = 1.0, 1.0, 0.05
#: dpnotebook's modes (the mode registry's), and Opacus 1.6's.
MODES = tuple(dpnotebook.available_modes())
OPACUS_MODES = ("hooks", "functorch", "ew", "ghost")

Step = Callable[[], None]
Loss = Callable[[Tensor, Tensor], Tensor]
Inputs = Tensor | tuple[Tensor, ...]


def timer(device: str) -> Callable[[Callable[[], None]], float]:
    """A function that runs a step on ``device`` and returns its milliseconds (CUDA synchronised)."""
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)

    def timed(step: Callable[[], None]) -> float:
        sync()
        start = time.perf_counter()
        step()
        sync()
        return (time.perf_counter() - start) * 1e3

    return timed


def interleaved(
    runs: dict[str, Callable[[], None]], rounds: int, device: str, warmup: int = 0
) -> dict[str, list[float]]:
    """Milliseconds of each run over ``rounds`` rounds taking the runs in turn (after ``warmup`` untimed runs
    each), so that whatever slows one run slows the others alike."""
    timed, times = timer(device), {name: list[float]() for name in runs}
    for run in [run for run in runs.values() for _ in range(warmup)]:
        run()
    for _ in range(rounds):
        for name, run in runs.items():
            times[name].append(timed(run))
    return times


def compile_mode(device: str) -> str:
    """The ``torch.compile`` mode of ``compiled_`` configurations: CUDA graphs on a GPU, else the default.

    >>> compile_mode("cuda:0"), compile_mode("cpu")
    ('reduce-overhead', 'default')
    """
    return "reduce-overhead" if device.startswith("cuda") else "default"


def _tuple(inputs: Inputs) -> tuple[Tensor, ...]:
    return (inputs,) if isinstance(inputs, Tensor) else tuple(inputs)


def flavour_of(what: str) -> str:
    """Which layer implementations (:class:`~dpnotebook.benchmarks.models.BenchModel`) a configuration uses.

    >>> flavour_of("nonprivate"), flavour_of("dpsgd_hooks"), flavour_of("gsm_ew"), flavour_of("opacus_dpsgd_hooks")
    ('native', 'dp', 'native', 'opacus')
    """
    if what.startswith("opacus_"):
        return "opacus"
    if what in ("nonprivate", "naive_microbatch") or what.endswith("_ew"):
        return "native"  # ExpandedWeights computes nn.LSTM itself and cannot use dpnotebook's DP layers
    return "dp"


def _training(model: nn.Module, opt: Any, inputs: tuple[Tensor, ...], targets: Tensor, loss: Loss) -> Step:
    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss(model(*inputs), targets).backward()
        opt.step()

    return step


def plain_step(model: nn.Module, inputs: Inputs, targets: Tensor, loss: Loss = F.cross_entropy) -> Step:
    """A plain SGD step of ``model`` (the non-private reference)."""
    return _training(model, torch.optim.SGD(model.parameters(), lr=LR), _tuple(inputs), targets, loss)


def gsm_step(model: nn.Module, mode: str, inputs: Inputs, targets: Tensor, loss: Loss, K: int = 1) -> Step:
    """Forward and backward with per-sample gradients in ``mode`` (ghost mode: with the per-sample norms)."""
    wrapped, inputs = dpnotebook.wrap_model(model, mode, K=K), _tuple(inputs)
    norms = getattr(wrapped, "per_sample_norms", None) if mode == "ghost" else None

    def step() -> None:
        wrapped.zero_grad(set_to_none=True)
        loss(wrapped(*inputs), targets).backward()
        if norms is not None:
            norms()

    return step


def dpsgd_step(model: nn.Module, mode: str, x: Inputs, y: Tensor, K: int = 1, *, loss: Loss = F.cross_entropy) -> Step:
    """A full DP-SGD step of ``model`` on ``x, y`` (``B*K`` rows) in ``mode`` with the mode's optimizer.

    >>> from torch import nn
    >>> step = dpsgd_step(nn.Linear(3, 2), "ghost", torch.randn(8, 3), torch.randint(0, 2, (8,)), K=2)
    >>> step()
    """
    inputs = _tuple(x)
    wrapped, opt = _private(model, mode, inputs, K)
    return _training(wrapped, opt, inputs, y, loss)


def _private(model: nn.Module, mode: str, inputs: tuple[Tensor, ...], K: int) -> tuple[nn.Module, Any]:
    """``model`` wrapped in ``mode`` and its DP optimizer, with the benchmarks' settings."""
    wrapped = dpnotebook.wrap_model(model, mode, K=K)
    opt = optimizer_class(mode)(
        torch.optim.SGD(wrapped.parameters(), lr=LR),
        noise_multiplier=SIGMA,
        max_grad_norm=CLIP,
        expected_batch_size=inputs[0].shape[0] // K,
        secure_mode=False,  # a benchmark: PyTorch's generator, said so (no warning)
    )
    return wrapped, opt


def graphed_step(
    model: nn.Module, mode: str, x: Inputs, y: Tensor, K: int = 1, *, loss: Loss = F.cross_entropy
) -> Step:
    """:func:`dpsgd_step` run by :class:`~dpnotebook.privacy.GraphedStep`, with its default ``max_batch_size``
    for an expected batch of ``B`` (so ``B`` samples sit in a step of ``B + 4 sqrt(B) + 1``, as under Poisson
    sampling); on a GPU it is captured after :data:`~dpnotebook.privacy._graphed.WARMUP` eager steps.

    Raises:
        ValueError: the model's loss is not cross-entropy (the graphed step needs it per row).

    >>> from torch import nn
    >>> step = graphed_step(nn.Linear(3, 2), "hooks", torch.randn(8, 3), torch.randint(0, 2, (8,)))
    >>> step()
    """
    if loss is not F.cross_entropy:
        raise ValueError(f"graphed_{mode} needs a cross-entropy model (a loss per row); this one's is {loss!r}.")
    inputs = _tuple(x)
    graphed = GraphedStep(*_private(model, mode, inputs, K), row_cross_entropy)

    def step() -> None:
        graphed(*inputs, y)

    return step


def naive_step(model: nn.Module, inputs: Inputs, targets: Tensor, loss: Loss, batch: int, K: int = 1) -> Step:
    """DP-SGD by microbatching: per sample, forward/backward on its K rows and clip; then noise and step."""
    params = [p for p in model.parameters() if p.requires_grad]
    opt, inputs = torch.optim.SGD(params, lr=LR), _tuple(inputs)

    def step() -> None:
        total = [torch.zeros_like(p) for p in params]
        for i in range(batch):
            for p in params:
                p.grad = None
            rows = slice(i * K, (i + 1) * K)
            loss(model(*(x[rows] for x in inputs)), targets[rows]).backward()
            grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
            norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
            factor = (CLIP / (norm + 1e-6)).clamp(max=1.0)
            for t, g in zip(total, grads, strict=True):
                t.add_(g * factor)
        for p, t in zip(params, total, strict=True):
            p.grad = (t + torch.randn_like(t) * (SIGMA * CLIP)) / batch
        opt.step()

    return step


def opacus_available() -> str | None:
    """Opacus' version, or ``None`` when it is not installed."""
    try:
        import opacus
    except ImportError:
        return None
    return opacus.__version__


class _RowLoss(nn.Module):
    """A loss as an Opacus criterion (its ghost mode sets ``reduction = "none"``: one loss per row)."""

    def __init__(self, loss: Loss) -> None:
        super().__init__()
        self.loss, self.reduction = loss, "mean"

    def forward(self, output: Tensor, targets: Tensor) -> Tensor:
        if self.reduction == "mean":
            return self.loss(output, targets)
        per_row = torch.stack([self.loss(output[i : i + 1], targets[i : i + 1]) for i in range(output.shape[0])])
        return per_row if self.reduction == "none" else per_row.sum()


def opacus_step(
    model: nn.Module, kind: str, mode: str, inputs: Inputs, targets: Tensor, loss: Loss, batch: int
) -> Step:
    """One Opacus 1.6 step in its ``mode``: per-sample gradients (``kind="gsm"``) or DP-SGD (``"dpsgd"``,
    ``PrivacyEngine.make_private`` on fixed-size batches).

    Raises:
        ImportError: Opacus is not installed (``pip install opacus==1.6.0``).
    """
    if opacus_available() is None:
        raise ImportError(
            "--compare-opacus needs Opacus: pip install -c constraints.txt -e '.[opacus]' (torch stays 2.13.0)."
        )
    from opacus import PrivacyEngine
    from opacus.grad_sample.utils import wrap_model

    warnings.filterwarnings("ignore", module="opacus")
    inputs = _tuple(inputs)
    if kind == "gsm":
        wrapped = wrap_model(model, grad_sample_mode=mode, batch_first=True, loss_reduction="mean")

        def gsm() -> None:
            wrapped.zero_grad(set_to_none=True)
            loss(wrapped(*inputs), targets).backward()

        return gsm
    # a row loop only where no per-row form exists: cross-entropy has one
    criterion = nn.CrossEntropyLoss() if loss is F.cross_entropy else _RowLoss(loss)
    made = PrivacyEngine().make_private(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=LR),
        data_loader=DataLoader(TensorDataset(*inputs, targets), batch_size=batch),
        noise_multiplier=SIGMA,
        max_grad_norm=CLIP,
        poisson_sampling=False,
        grad_sample_mode=mode,
        **({"criterion": criterion} if mode == "ghost" else {}),
    )
    return _training(made[0], made[1], inputs, targets, made[2] if mode == "ghost" else criterion)


def make_step(name: str, what: str, batch: int, K: int = 1, device: str = "cpu", seed: int = 0) -> Step:
    """The step of configuration ``what`` on benchmark model ``name`` with ``batch`` samples of ``K`` rows.

    Raises:
        ValueError: ``what`` is not a configuration name.
    """
    compiled, what = what.startswith("compiled_"), what.removeprefix("compiled_")
    model, inputs, targets, loss = build(name, batch, K=K, flavour=flavour_of(what), seed=seed)
    model, targets, inputs = model.to(device), targets.to(device), tuple(x.to(device) for x in inputs)
    if compiled:  # the user's route: compile the model, then wrap it (tests/grad_sample/_engine/test_torch_compile.py)
        model = cast(nn.Module, torch.compile(model, mode=compile_mode(device)))
    kind, _, mode = what.partition("_")
    if what in ("nonprivate", "nonprivate_dplayers"):
        return plain_step(model, inputs, targets, loss)
    if what == "naive_microbatch":
        return naive_step(model, inputs, targets, loss, batch, K)
    if kind == "opacus":
        kind, _, mode = mode.partition("_")
        return opacus_step(model, kind, mode, inputs, targets, loss, batch)
    if mode in MODES and kind == "gsm":
        return gsm_step(model, mode, inputs, targets, loss, K)
    if mode in MODES and kind == "dpsgd":
        return dpsgd_step(model, mode, inputs, targets, K, loss=loss)
    if mode in MODES and kind == "graphed":
        return graphed_step(model, mode, inputs, targets, K, loss=loss)
    raise ValueError(
        f"configuration {what!r} is unknown; use nonprivate, nonprivate_dplayers, naive_microbatch, "
        f"gsm_<mode>, dpsgd_<mode> or graphed_<mode> with mode in {MODES}, or opacus_gsm_<mode> / opacus_dpsgd_<mode>; "
        "any of them prefixed with compiled_."
    )


__all__ = [
    "SIGMA",
    "CLIP",
    "LR",
    "MODES",
    "OPACUS_MODES",
    "flavour_of",
    "compile_mode",
    "plain_step",
    "gsm_step",
    "dpsgd_step",
    "graphed_step",
    "naive_step",
    "opacus_available",
    "opacus_step",
    "make_step",
    "timer",
    "interleaved",
]
