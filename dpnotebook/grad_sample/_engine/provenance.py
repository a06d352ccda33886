"""The provenance probe: row ``i`` of every hooked layer depends on sample ``i`` alone, proven, not counted.

Counting rows cannot tell whether they are the samples (a T5-style position bias has ``T`` rows,
and ``B*K == T`` matches). So, once per wrapped model, the wrapper runs this probe on a real batch
(eval mode, RNG restored, inputs cloned): (a) with sample ``j``'s rows replaced by sample ``k``'s,
every layer's rows of other samples must not move and sample ``j``'s must equal ``k``'s; (b) a
cotangent on sample ``j``'s output rows must reach no other sample's rows of any layer's output.
A batch of one sample proves nothing and postpones it; identical samples run (b) only.
The whole contract: docs/guarantees.md.

>>> import torch
>>> from torch import nn
>>> model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
>>> layers = [(path, m, 0) for path, m in zip(["model.0", "model.1"], model)]
>>> probe_rows(model, layers, (torch.randn(6, 3),), {}, K=2, batch_dim=0)
'proven'
>>> class Centred(nn.Module):          # mixes samples: x - x.mean(0)
...     def __init__(self):
...         super().__init__()
...         self.fc = nn.Linear(3, 2)
...     def forward(self, x):
...         return self.fc(x - x.mean(0))
>>> m = Centred()
>>> probe_rows(m, [("model.fc", m.fc, 0)], (torch.randn(4, 3),), {}, K=1, batch_dim=0)
Traceback (most recent call last):
...
dpnotebook.errors.GradSampleError: model.fc (Linear): its rows are not the samples. ... (rows [0, 2, 3] moved ...
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import PackedSequence
from torch.utils._pytree import tree_flatten, tree_map

from dpnotebook.errors import GradSampleError
from dpnotebook.grad_sample._engine.calls import capture_paused, count_rows, output_batch_dims

__all__ = ["probe_rows", "prove_rows", "probing", "layers_with_parameters", "ProbeLayer", "FIX"]

#: ``(path, module, batch dim of its input and output)`` for each hooked layer.
ProbeLayer = tuple[str, nn.Module, int]

#: What to do about a layer whose rows are not the samples (every refusal of the probe ends with it).
FIX = (
    "Fix: look position tables up per row (position_ids = arange(T).expand(B, T); a relative-position "
    "bias computed per sample, [B, H, T, T]) so that every layer sees one row per sample in its batch dim, "
    "or use grad_sample_mode='functorch', which replays each sample alone."
)


def layers_with_parameters(module: nn.Module, batch_dim: int = 0, root: str = "model") -> list[ProbeLayer]:
    """Every module holding trainable parameters of its own, as ``(path, module, batch_dim)``: ew mode's layers.

    >>> from torch import nn
    >>> [(p, type(m).__name__, bd) for p, m, bd in layers_with_parameters(nn.Sequential(nn.Linear(2, 2), nn.ReLU()))]
    [('model.0', 'Linear', 0)]
    """
    return [
        (f"{root}.{name}" if name else root, m, batch_dim)
        for name, m in module.named_modules()
        if any(p.requires_grad for p in m.parameters(recurse=False))
    ]


@contextlib.contextmanager
def _cudnn_off(off: bool) -> Iterator[None]:
    """cuDNN disabled inside the block when ``off`` (no other cuDNN setting touched), as it was afterwards."""
    was = torch.backends.cudnn.enabled
    torch.backends.cudnn.enabled = was and not off
    try:
        yield
    finally:
        torch.backends.cudnn.enabled = was


@contextlib.contextmanager
def probing(model: nn.Module, training: bool = False) -> Iterator[Callable[[], None]]:
    """Every module in eval mode (``training``: in its own mode, buffers put back), the RNG state saved and
    restored, the wrapper's recording paused. Yields a function that rewinds the RNG to where the block began,
    so that two passes in training mode draw the same dropout masks.

    A model holding a ``torch.nn`` RNN (a frozen one too) runs without cuDNN here. In eval mode the probe
    differentiates its passes, and cuDNN's RNN backward refuses a module in eval mode on a GPU ("cudnn RNN
    backward can only be called in training mode"); in training mode cuDNN draws the dropout between
    stacked layers from a state of its own, which rewinding the RNG cannot repeat. PyTorch's own kernels
    do neither. On the CPU the switch changes nothing."""
    modes = [(m, m.training) for m in model.modules()]
    buffers = [(b, b.detach().clone()) for b in model.buffers()] if training else []
    devices = sorted({p.device.index or 0 for p in model.parameters() if p.device.type == "cuda"})
    rnn = any(isinstance(m, nn.RNNBase) for m in model.modules())
    try:
        with torch.random.fork_rng(devices=devices), capture_paused(), _cudnn_off(rnn):
            cpu = torch.get_rng_state()
            cuda = [torch.cuda.get_rng_state(d) for d in devices]

            def rewind() -> None:
                torch.set_rng_state(cpu)
                for d, state in zip(devices, cuda, strict=True):
                    torch.cuda.set_rng_state(state, d)

            if not training:
                model.eval()
            yield rewind
    finally:
        for m, was in modes:
            m.training = was
        with torch.no_grad():
            for b, saved in buffers:  # running statistics a training-mode pass updated
                b.copy_(saved)


def _leaves(obj: Any) -> list[Any]:
    return [obj] if isinstance(obj, Tensor) else tree_flatten(obj)[0]


def _rows_of(x: Any, rows: int, bd: int) -> bool:
    return isinstance(x, Tensor) and x.dim() > bd and x.shape[bd] == rows


def _substitute(tree: Any, rows: int, bd: int, j: int, k: int, K: int) -> Any:
    """``tree`` with every tensor of ``rows`` rows in ``bd`` cloned, and sample ``j``'s rows replaced by ``k``'s."""
    index = torch.arange(rows)
    index[j * K : (j + 1) * K] = torch.arange(k * K, (k + 1) * K)

    def swap(x: Any) -> Any:
        if not _rows_of(x, rows, bd):
            return x.clone() if isinstance(x, Tensor) else x
        return x.index_select(bd, index.to(x.device))

    return tree_map(swap, tree)


def _sample_rows(x: Tensor, bd: int, i: int, K: int) -> Tensor:
    return x.narrow(bd, i * K, K)


def _first_different(args: tuple[Any, ...], kwargs: dict[str, Any], rows: int, bd: int, B: int, K: int) -> int | None:
    """The first sample ``j >= 1`` whose input rows differ from sample 0's, or ``None``."""
    inputs = [x for x in _leaves((args, kwargs)) if _rows_of(x, rows, bd)]
    for j in range(1, B):
        if any(not torch.equal(_sample_rows(x, bd, j, K), _sample_rows(x, bd, 0, K)) for x in inputs):
            return j
    return None


def _tolerance(x: Tensor) -> float:
    """What float kernels may round differently between two batches: ``sqrt(eps)`` of the tensor's scale."""
    if not x.is_floating_point() or not x.numel():
        return 0.0
    scale = float(x.detach().abs().amax())
    if not math.isfinite(scale):  # rare (masked scores): the scale of the finite entries
        scale = float(x.detach().abs().nan_to_num(0.0, posinf=0.0, neginf=0.0).amax())
    return math.sqrt(torch.finfo(x.dtype).eps) * scale


def _row_max(d: Tensor, bd: int) -> Tensor:
    """The largest entry of ``d`` in each row of ``bd``, as float64 ``[rows]``."""
    others = [i for i in range(d.dim()) if i != bd]
    if not others:
        return d.to(torch.float64)
    if not d.numel():
        return torch.zeros(d.shape[bd], dtype=torch.float64)
    return d.amax(dim=others).to(torch.float64)


def _row_gaps(a: Tensor, b: Tensor, bd: int) -> Tensor:
    """``|a - b|``'s largest entry in each row of ``bd`` (equal infinities and NaNs count as equal; others: inf)."""
    a, b = a.detach(), b.detach()
    if not a.is_floating_point():
        return _row_max((a != b).to(torch.float32), bd) * math.inf
    gaps = _row_max((a - b).abs(), bd)
    bad = ~torch.isfinite(gaps)
    if bool(bad.any()):  # inf - inf or a NaN somewhere in those rows: compare them entry by entry
        rows = torch.nonzero(bad).flatten().to(a.device)
        ra, rb = a.index_select(bd, rows), b.index_select(bd, rows)
        same = (ra == rb) | (ra.isnan() & rb.isnan())
        d = torch.where(same, torch.zeros((), dtype=a.dtype, device=a.device), (ra - rb).abs()).nan_to_num(
            math.inf, posinf=math.inf
        )
        gaps[rows] = _row_max(d, bd)  # on the tensors' device (the CPU copies this had raised on a GPU)
    return gaps


def _moved_rows(gaps: Tensor, keep: set[int], tol: float) -> list[int]:
    """The rows outside ``keep`` whose gap is over ``tol``."""
    return [r for r in torch.nonzero(gaps > tol).flatten().tolist() if r not in keep]


def _copies(leaves: list[Any]) -> list[Tensor | None]:
    """Detached copies: the model may change a tensor in place after the layer (``ReLU(inplace=True)``)."""
    return [x.detach().clone() if isinstance(x, Tensor) else None for x in leaves]


class _Recorder:
    """Forward hooks on the probed layers: copies of each call's tensors (or, with ``compare``, the comparison)."""

    def __init__(self, layers: list[ProbeLayer], tracker: Any = None) -> None:
        self.layers = layers
        self.tracker = tracker
        self.sites: dict[str, int] = {}  # meeting points of batch-free tensors with the batch: probed as layers
        self.calls: list[list[tuple[list[Any], list[Any]]]] = [[] for _ in layers]
        self.live: list[tuple[int, int, int, Tensor]] = []  # (layer, call, output leaf, the output itself)
        self.compare: Any = None
        self.paused = False  # while output_batch_dims runs the model on one row more
        self.handles = [m.register_forward_hook(self._hook(i), with_kwargs=True) for i, (_, m, _) in enumerate(layers)]

    def _hook(self, i: int) -> Any:
        def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
            if self.paused or (self.tracker is not None and self.tracker.batch_free_call(args, kwargs)):
                return  # a call on batch-free inputs has no rows of samples: its meeting points are probed
            self.seen(i, _leaves((args, kwargs)), _leaves(output))

        return hook

    def seen(self, i: int, ins: list[Any], outs: list[Any]) -> None:
        if self.compare is not None:
            self.compare(i, [x if isinstance(x, Tensor) else None for x in ins], outs)
            return
        n = len(self.calls[i])
        self.calls[i].append((_copies(ins), _copies(outs)))
        self.live += [(i, n, o, x) for o, x in enumerate(outs) if isinstance(x, Tensor) and x.requires_grad]

    def meeting(self, site: str, model: nn.Module, out: Tensor, bd: int) -> None:
        """The result of an op where a batch-free tensor met the batch: probed as a layer's output."""
        if self.paused:
            return
        if site not in self.sites:
            self.sites[site] = len(self.layers)
            self.layers.append((f"the meeting point {site}", model, bd))
            self.calls.append([])
        self.seen(self.sites[site], [], [out])

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def _refusal(path: str, module: nn.Module, what: str, rows: int, B: int, K: int) -> GradSampleError:
    return GradSampleError(
        f"{path} ({type(module).__name__}): its rows are not the samples. {what}. Its batch dim holds "
        f"{rows} rows, as many as the input's B*K = {B}*{K}, but they belong to something else (positions "
        f"of a table broadcast over the batch, such as a relative-position bias looked up with a [T, T] "
        f"matrix when T = B*K, or rows mixed across samples), so its per-sample gradients would not be per "
        f"sample and clipping them would not bound what one sample contributes. {FIX}"
    )


def _nonfinite_refusal(path: str, module: nn.Module, samples: list[int]) -> GradSampleError:
    """The probe met NaN where it looks for a leak: a non-finite sample, which the probe cannot see past."""
    return GradSampleError(
        f"{path} ({type(module).__name__}): the rows of sample(s) {samples[:8]} of the batch the provenance "
        "probe ran on turned a gradient sent back from another sample's output into NaN (0 * NaN or 0 * inf: "
        "a NaN or infinite value in the sample's forward pass, or an infinite derivative, such as sqrt's at 0), "
        "so the probe cannot prove that the layer's rows are the samples: NaN looks like a leak and could hide "
        "one. The probe runs once, on the first batch of two or more samples. "
        "Fix: find those samples (an input with NaN or inf, an overflow, a log of 0) and drop or repair them "
        "in the data; the DP step itself gives a sample with a non-finite gradient norm clip factor 0, but "
        "only after the probe has passed."
    )


def _forward_check(
    layers: list[ProbeLayer], rec: _Recorder, rows: int, B: int, K: int, j: int, k: int, own_rows: bool = True
) -> Any:
    """Check (a) on each layer call of the substituted pass; an input that did not change at all is skipped.

    ``own_rows=False`` (training mode, where sample ``j``'s dropout masks are not sample ``k``'s): only the
    other samples' rows are checked."""
    seen = [0] * len(layers)
    j_rows = set(range(j * K, (j + 1) * K))

    def compare(i: int, ins: list[Any], outs: list[Any]) -> None:
        path, module, bd = layers[i]
        n = seen[i]
        seen[i] += 1
        if n >= len(rec.calls[i]):
            what = (
                f"It ran {n + 1} times with sample {j}'s inputs replaced by sample {k}'s and "
                f"{len(rec.calls[i])} times on the batch itself, so the probe cannot compare its rows"
            )
            raise _refusal(path, module, what, rows, B, K)
        before_ins, before_outs = rec.calls[i][n]
        for side, now, before in (("input", ins, before_ins), ("output", outs, before_outs)):
            for t, (a, b) in enumerate(zip(now, before, strict=True)):
                if not (_rows_of(a, rows, bd) and _rows_of(b, rows, bd)) or a.shape != b.shape:
                    continue
                if side == "input" and torch.equal(a, b):
                    continue
                tol = _tolerance(b)
                gaps = _row_gaps(a, b, bd)  # sample j's rows are compared with sample k's below
                moved = _moved_rows(gaps, j_rows, tol)
                if moved:
                    what = (
                        f"Replacing sample {j}'s input rows with sample {k}'s changed the rows of other samples "
                        f"in its {side} {t} (rows {moved[:8]} moved by up to {float(gaps[moved].max()):.3g})"
                    )
                    raise _refusal(path, module, what, rows, B, K)
                if not own_rows:
                    continue
                gap = float(_row_gaps(_sample_rows(a, bd, j, K), _sample_rows(b, bd, k, K), bd).max())
                if gap > tol:
                    what = (
                        f"Replacing sample {j}'s input rows with sample {k}'s did not make rows "
                        f"{sorted(j_rows)} of its {side} {t} equal sample {k}'s rows (they differ by {gap:.3g}: "
                        "they do not follow the sample)"
                    )
                    raise _refusal(path, module, what, rows, B, K)

    return compare


def _backward_check(
    layers: list[ProbeLayer], rec: _Recorder, grads: tuple[Any, ...], rows: int, B: int, K: int, j: int
) -> None:
    """Check (b): every layer's output gradient (``grads[n]`` of ``rec.live[n]``) is zero outside sample j's rows."""
    if not grads:
        return  # no output to differentiate (or no layer reached): nothing to check
    keep = set(range(j * K, (j + 1) * K))
    for (i, _, o, _), g in zip(rec.live, grads, strict=True):
        path, module, bd = layers[i]
        if g is None or not _rows_of(g, rows, bd):
            continue
        largest = _row_max(g.detach().abs(), bd)
        moved = _moved_rows(largest.nan_to_num(math.inf, posinf=math.inf), keep, _tolerance(g))
        if moved and bool(largest[moved].isnan().all()):  # 0 * NaN: the rows' own values, or mixing hidden by them
            raise _nonfinite_refusal(path, module, sorted({r // K for r in moved}))
        if moved:
            what = (
                f"A gradient on sample {j}'s rows of the model's output alone reached rows {moved[:8]} "
                f"of its output {o}, which belong to other samples"
            )
            raise _refusal(path, module, what, rows, B, K)


def _cotangents(
    model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any, rows: int, bd: int, j: int, K: int
) -> tuple[list[Tensor], list[Tensor]]:
    """The model's output tensors that carry a batch, and random cotangents on sample ``j``'s rows of each."""
    leaves = _leaves(output)
    out_index = [
        i for i, x in enumerate(leaves) if isinstance(x, Tensor) and x.requires_grad and rows in tuple(x.shape)
    ]
    if not out_index:
        return [], []
    try:
        dims = output_batch_dims(model, args, kwargs, output, out_index, rows=rows, batch_dim=bd)
    except GradSampleError:  # several dims of B*K rows that one more row does not tell apart: both get the cotangent
        dims = [
            bd if leaves[i].dim() > bd and leaves[i].shape[bd] == rows else list(leaves[i].shape).index(rows)
            for i in out_index
        ]
    gen = torch.Generator().manual_seed(0)
    outs, cots = [], []
    for i, d in zip(out_index, dims, strict=True):
        y = leaves[i]
        cot = torch.zeros_like(y)
        part = _sample_rows(cot, d, j, K)
        part.copy_(torch.randn(part.shape, generator=gen, dtype=torch.float64).to(part))
        outs.append(y)
        cots.append(cot)
    return outs, cots


def probe_rows(
    model: nn.Module,
    layers: list[ProbeLayer],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    K: int,
    batch_dim: int,
    backward_proven: bool = False,
    tracker: Any = None,
    units: list[nn.Module] | None = None,
    training: bool = False,
) -> str:
    """Prove, on one batch, that every layer in ``layers`` sees sample ``i`` alone in its rows of sample ``i``.

    Args:
        model: the plain model (its training modes and the RNG state are restored).
        layers: ``(path, module, batch dim)`` of each layer whose rows must be samples.
        args, kwargs: the forward pass's inputs (not modified).
        K: rows per sample.
        batch_dim: the inputs' batch dim.
        backward_proven: an earlier batch passed the backward check: nothing is run on identical samples.
        tracker: the wrapper's ``BroadcastTracker``, if batch-free tensors meet the batch: the passes run
            under it and every meeting point's result is checked as a layer's output.
        units: the modules the tracker treats as units.
        training: run the passes with every module in its own mode (dropout on, the same masks in both
            passes) and check only what dropout leaves comparable: the other samples' rows in (a), all of (b).
            It finds a layer that mixes samples only in training mode; :func:`prove_rows` runs both.

    Returns:
        ``"proven"``, ``"backward only"`` (all samples identical: only (b) ran) or ``"nothing to prove"``
        (one sample, or no input tensor of two dims or more holding the batch).

    Raises:
        GradSampleError: a layer whose rows do not follow the samples, naming it, what was seen and the fix.
    """
    leaves = _leaves((args, kwargs))
    if any(isinstance(x, PackedSequence) for x in leaves):
        return "nothing to prove"
    rows = count_rows(args, kwargs, batch_first=batch_dim == 0, min_dim=2)
    if not rows or rows % K or rows // K < 2:
        return "nothing to prove"
    B, k = rows // K, 0
    j = _first_different(args, kwargs, rows, batch_dim, B, K)
    if j is None and backward_proven:
        return "backward only"
    layers = list(layers)
    rec = _Recorder(layers, tracker)

    def run(a: tuple[Any, ...], kw: dict[str, Any]) -> Any:
        if tracker is None:
            return model(*a, **kw)
        with tracker.tracking(a, kw, units or []):
            return model(*a, **kw)

    if tracker is not None:
        tracker.probe = lambda site, m, out: rec.meeting(site, m, out, batch_dim)
    try:
        with probing(model, training) as rewind:
            jb = 1 if j is None else j
            same_args, same_kwargs = (
                _substitute(args, rows, batch_dim, 0, 0, K),
                _substitute(kwargs, rows, batch_dim, 0, 0, K),
            )
            with torch.enable_grad():
                output = run(same_args, same_kwargs)
                rec.paused = True
                outs, cots = _cotangents(model, same_args, same_kwargs, output, rows, batch_dim, jb, K)
                # <outputs, cotangents> as one scalar: its gradient is the same vector-Jacobian product, and
                # torch 2.13 imports sympy (42 MB resident) the first time a gradient is passed in explicitly
                inner = [(y * c).sum() for y, c in zip(outs, cots, strict=True)]
                rec.paused = False
                reached = [x for *_, x in rec.live]
                grads = (
                    torch.autograd.grad(sum(inner[1:], inner[0]), reached, allow_unused=True)
                    if inner and reached
                    else ()
                )
            del output, outs, cots
            _backward_check(layers, rec, grads, rows, B, K, jb)
            rec.live, grads = [], ()
            if j is None:
                return "backward only"
            rec.compare = _forward_check(layers, rec, rows, B, K, j, k, own_rows=not training)
            rewind()  # the first pass's dropout masks again
            with torch.no_grad():
                run(_substitute(args, rows, batch_dim, j, k, K), _substitute(kwargs, rows, batch_dim, j, k, K))
    finally:
        rec.remove()
        if tracker is not None:
            tracker.probe = None
    return "proven"


def prove_rows(
    model: nn.Module, layers: list[ProbeLayer], args: tuple[Any, ...], kwargs: dict[str, Any], **options: Any
) -> str:
    """:func:`probe_rows` in eval mode, then, while a module of ``model`` is in training mode, in training mode.

    The second run finds a layer that mixes samples only in training (``x - x.mean(0)`` while
    ``self.training``), which eval mode hides; it checks what dropout leaves comparable.
    """
    found = probe_rows(model, layers, args, kwargs, **options)
    if found != "nothing to prove" and any(m.training for m in model.modules()):
        probe_rows(model, layers, args, kwargs, training=True, **options)
    return found
