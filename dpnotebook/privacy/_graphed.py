"""A DP-SGD step on batches padded to one size, so that a CUDA graph can capture it once and replay it.

On a GPU a small model's DP step is bound by the host: Python and one launch per kernel take longer
than the kernels (``docs/performance.md``, "Where SampleConvNet's time goes"). A CUDA graph replays
the step's kernels with neither, but it needs the same shapes and memory at every replay and no read of
the device while it is captured, and it runs none of the step's Python. :class:`GraphedStep` provides
them:

- **one shape.** Every batch is copied into buffers of ``max_batch_size`` samples (``K`` rows each).
  The rows past the batch copy its first sample (an empty batch leaves the last batch's rows) and get
  loss weight 0: their per-sample gradients are exactly 0 (a layer's parameter gradient is linear in
  the gradient of its output), so they add nothing, and the real samples' gradients are those of the
  batch alone. A batch larger than ``max_batch_size`` runs as an ordinary eager step, never truncated.
- **no read, no kept buffer.** The step runs inside
  :func:`~dpnotebook.grad_sample._engine.capturable.capturable_step`: samples with a non-finite norm are
  masked on the device at every step (the warning is given at the next call), ghost mode's float64 Gram
  guard and embedding norms take forms that read nothing, and no buffer is kept from step to step.
  Before the first capture (and again after anything the graph holds changed) one eager padded step
  runs with ``torch.cuda.set_sync_debug_mode("warn")``, after the provenance probe has proven the rows:
  a synchronising call there means no capture (a failed capture would leave PyTorch's CUDA random
  numbers unusable), and the state that step makes (momentum and the like) is made outside the graph.
- **the Python outside.** What a step must do on the host is done here, at every call, around the
  replay: the noise is drawn by the optimizer's own draw into buffers the graph adds (PyTorch's
  generator, a seeded one, or ``secure_mode``'s OS randomness alike), the tied Poisson loader's check
  that this batch is the last one drawn, and the step hooks (the accountant counts every step). What
  the graph holds (``C``, clipping, the divisor, the optimizer's hyperparameters, the addresses of the
  model's parameters and buffers and of the optimizer's state, grad, training and autocast mode) is
  compared at every call, and a step taken outside the graph (an eager step of the user's, or of a batch
  over the size) is seen by the optimizer's count: either drops the graph.

Without CUDA (or with ``capture=False``) every call runs the same padded step eagerly: the CPU tests
check that path against the plain step, and the GPU test path checks the replay against both.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from dpnotebook.errors import GradSampleError, PrivacyWarning
from dpnotebook.grad_sample._engine.capturable import capturable_step
from dpnotebook.privacy._arguments import check_positive_int
from dpnotebook.privacy._batches import SampledBatches
from dpnotebook.privacy._distributed import DistributedDPOptimizer, DistributedGhostDPOptimizer
from dpnotebook.privacy._mechanisms import draw_noise
from dpnotebook.privacy._optimizer import DPOptimizer, is_wrapped
from dpnotebook.privacy._step import StepStats

#: ``per_row_loss(output, target)``: one loss per row, shape ``[rows]``.
RowLoss = Callable[[Tensor, Tensor], Tensor]

#: Eager padded steps before the capture: lazy state (the provenance probe, cuBLAS workspaces) is made then.
WARMUP = 3
#: What ``torch.cuda.set_sync_debug_mode("warn")`` says at a synchronising call (c10/cuda, ``warn_or_error_on_sync``).
SYNC_WARNING = "called a synchronizing CUDA operation"
#: What it says, once per process, when the mode is switched on: no call of the step's. Taking it for a
#: synchronising call made the first GraphedStep of each process run eagerly (H200, 2026-11-28).
PROTOTYPE_NOTICE = "Synchronization debug mode is a prototype feature"


def sync_calls(caught: list[warnings.WarningMessage]) -> tuple[list[str], list[warnings.WarningMessage]]:
    """The synchronising calls among warnings recorded under ``set_sync_debug_mode("warn")``, and the others
    (torch's notice that the mode is a prototype is neither: it says nothing of the step).

    >>> made = [warnings.WarningMessage(UserWarning(m), UserWarning, "f", 1) for m in (
    ...     SYNC_WARNING + " (function item)", PROTOTYPE_NOTICE + " and ...", "a warning of the step's")]
    >>> syncs, others = sync_calls(made)
    >>> syncs, [str(w.message) for w in others]
    (['called a synchronizing CUDA operation (function item)'], ["a warning of the step's"])
    """
    syncs = [str(w.message).split("\n")[0][:200] for w in caught if str(w.message).startswith(SYNC_WARNING)]
    others = [w for w in caught if not str(w.message).startswith((SYNC_WARNING, PROTOTYPE_NOTICE))]
    return syncs, others


def row_cross_entropy(output: Tensor, target: Tensor) -> Tensor:
    """Cross-entropy per row (``reduction="none"``), the default loss of :class:`GraphedStep`.

    >>> row_cross_entropy(torch.zeros(2, 3), torch.tensor([0, 2])).shape
    torch.Size([2])
    """
    return F.cross_entropy(output, target, reduction="none")


class GraphedStep:
    """One DP-SGD step per call, on the batch padded to ``max_batch_size`` samples; on CUDA, a replayed graph.

    Args:
        model: the wrapped model (``make_private`` or :func:`dpnotebook.wrap_model`), any mode, ``batch_first``.
        optimizer: its :class:`~dpnotebook.privacy.DPOptimizer` (or ghost mode's), not a distributed one.
        per_row_loss: ``(output, target) -> [rows]``, one loss per row (default: cross-entropy); the step
            combines the rows as the optimizer's ``loss_reduction`` says.
        max_batch_size: the samples a captured step holds (``K`` rows each). Default: the optimizer's
            ``expected_batch_size`` plus 4 standard deviations of a Poisson batch (a batch larger than that
            comes about 3 times in 100,000 steps; it runs eagerly, correct and slower).
        warmup: eager padded steps before the capture, at least 1 (each a real step, counted); a capture
            also waits for the provenance probe's proof and for an eager step without a synchronising call.
        capture: ``None``: capture where the model's parameters are on CUDA; ``True``: require it; ``False``:
            never (every step eager and padded, as on the CPU).

    Attributes:
        captures: how many times the step was captured (again after a change of ``C``, ``lr``, ...).
        replays: the steps taken by replaying the graph.
        eager_steps: the steps that ran eagerly (the warm-up, one after each change, steps without CUDA,
            batches over the size).

    Raises:
        TypeError: ``model`` is not wrapped, or ``optimizer`` is not a single-process DP optimizer.
        ValueError: a bad ``max_batch_size``, ``warmup`` or ``capture``; a time-major (``batch_first=False``)
            model; ``capture=True`` without CUDA.

    >>> import torch
    >>> from torch import nn
    >>> import dpnotebook
    >>> _ = torch.manual_seed(0)
    >>> model = dpnotebook.wrap_model(nn.Linear(4, 3), "ghost")
    >>> opt = dpnotebook.privacy.GhostDPOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
    ...     noise_multiplier=1.0, max_grad_norm=1.0, expected_batch_size=8, secure_mode=False)
    >>> step = GraphedStep(model, opt, max_batch_size=16)
    >>> loss = step(torch.randn(5, 4), torch.randint(0, 3, (5,)))    # 5 samples in a step of 16
    >>> loss.shape, opt.last_step_stats.batch_size, step.eager_steps
    (torch.Size([]), 5, 1)
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: DPOptimizer,
        per_row_loss: RowLoss = row_cross_entropy,
        *,
        max_batch_size: int | None = None,
        warmup: int = WARMUP,
        capture: bool | None = None,
    ) -> None:
        if not is_wrapped(model):
            raise TypeError(
                f"GraphedStep needs the wrapped model, got a plain {type(model).__name__}. Fix: pass the model "
                "that make_private (or dpnotebook.wrap_model) returned."
            )
        if not isinstance(optimizer, DPOptimizer):
            raise TypeError(
                f"optimizer must be a DPOptimizer (make_private's), got {type(optimizer).__name__}: the step "
                "clips and noises through it."
            )
        if isinstance(optimizer, (DistributedDPOptimizer, DistributedGhostDPOptimizer)):
            raise TypeError(
                "GraphedStep runs one process's steps; a distributed optimizer's step reads the ranks' status "
                "on the host, which a CUDA graph cannot. Fix: train across processes with the eager step."
            )
        if not getattr(model, "batch_first", True):
            raise ValueError(
                "GraphedStep pads the batch along dim 0, but the model was wrapped with batch_first=False. "
                "Fix: wrap it with batch_first=True and pass batch-first inputs."
            )
        if capture not in (None, True, False):
            raise ValueError(f"capture={capture!r} is invalid; use None (where CUDA is), True or False.")
        self.model, self.optimizer, self.per_row_loss = model, optimizer, per_row_loss
        self.K = int(getattr(model, "K", 1))
        if max_batch_size is None:
            expected = float(optimizer.expected_batch_size)
            max_batch_size = math.ceil(expected + 4 * math.sqrt(expected)) + 1
        self.max_batch_size = check_positive_int("max_batch_size", max_batch_size)
        if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 1:
            raise ValueError(
                f"warmup={warmup!r} is invalid; use an int >= 1: the eager steps before the capture make the "
                "state a step keeps (the optimizer's momentum, the provenance probe's proof) outside the graph."
            )
        self.warmup = warmup
        params = [p for p in model.parameters() if p.requires_grad]
        on_cuda = bool(params) and all(p.device.type == "cuda" for p in params)
        if capture and not on_cuda:
            raise ValueError(
                "capture=True needs the model's parameters on a CUDA device; they are on "
                f"{sorted({str(p.device) for p in params})}. Fix: model.to('cuda') before wrapping, or capture=None."
            )
        self.capture = on_cuda if capture is None else bool(capture)
        self._required = capture is True
        self.captures = self.replays = self.eager_steps = 0
        self._warmed = 0  # padded eager steps taken before capturing
        self._graph: torch.cuda.CUDAGraph | None = None
        self._held: tuple[Any, ...] | None = None  # the constants the graph holds
        self._ready: tuple[Any, ...] | None = None  # the constants after the last eager padded step, if clean
        self._steps_seen = optimizer.finished_batches  # the optimizer's count after this object's last step
        self._inputs: list[Tensor] | None = None
        self._target: Tensor | None = None
        self._weights: Tensor | None = None  # per row: the loss weight (0 past the batch)
        self._keep: Tensor | None = None  # per row: 1 in the batch, 0 past it
        self._noise: list[Tensor] = [torch.zeros_like(p) for p in optimizer.params]
        self._loss_sum: Tensor | None = None
        self._stats: StepStats | None = None  # the statistics the padded step (or the captured one) made
        self._count_host: Tensor | None = None  # the last step's non-finite count, copied to the host
        self._count_done: Any = None  # its copy's event (CUDA)
        self._count_pending = False  # a count not read yet
        self._samples = 0  # the samples of the call running

    # ---- the call -------------------------------------------------------------------------------------

    def __call__(self, *batch: Tensor) -> Tensor:
        """One DP-SGD step on ``batch`` (its inputs, then the target; ``K`` rows per sample, sample-major).

        Returns the mean loss over the batch's rows, a 0-dim tensor on the device (not read).
        """
        self._warn_nonfinite()
        inputs, target = self._split(batch)
        rows = int(target.shape[0])
        if self.optimizer._skip_next_step:
            raise RuntimeError(
                "GraphedStep takes whole logical batches, but signal_skip_step() (BatchMemoryManager) asked for "
                "a virtual step. Fix: give the whole Poisson batch to the step; its size is max_batch_size."
            )
        samples = rows // self.K
        opt = self.optimizer
        if opt.finished_batches != self._steps_seen:  # a step ran outside this object: it may have replaced
            self._forget_graph()  # buffers or state the graph writes into
        if samples > self.max_batch_size:
            return self._eager(inputs, target)
        self._check_drawn(batch, samples)
        self._fill(inputs, target, rows)
        self._samples = samples
        if [n.shape for n in self._noise] != [p.shape for p in opt.params]:  # parameters frozen or thawed
            self._noise = [torch.zeros_like(p) for p in opt.params]
            self._forget_graph()
        torch._foreach_copy_(
            self._noise,
            draw_noise(opt.params, opt.noise_multiplier * opt.max_grad_norm, opt.generator, opt.secure_mode),
        )
        now = self._constants() if self.capture else None
        if self._graph is not None and now != self._held:
            self._forget_graph()
        if self._graph is None and self.capture and self._warmed >= self.warmup and now == self._ready:
            self._capture()
        if self._graph is not None:
            self._graph.replay()
            self.replays += 1
        else:
            self._run_owned()
            self._warmed += 1
            self.eager_steps += 1
        self._steps_seen = opt.finished_batches
        self._finish(samples)
        assert self._loss_sum is not None
        return self._loss_sum / max(rows, 1)

    # ---- its parts --------------------------------------------------------------------------------------

    def _split(self, batch: tuple[Tensor, ...]) -> tuple[list[Tensor], Tensor]:
        if len(batch) < 2 or not all(isinstance(t, Tensor) for t in batch):
            raise TypeError(
                f"GraphedStep takes the batch's input tensors then its target, got {len(batch)} argument(s) of "
                f"types {[type(t).__name__ for t in batch]}. Fix: step(x, y), or step(x1, x2, y)."
            )
        *inputs, target = batch
        rows = {int(t.shape[0]) if t.dim() else -1 for t in batch}
        if len(rows) != 1 or -1 in rows:
            raise ValueError(
                f"the batch's tensors have {[tuple(t.shape) for t in batch]} rows along dim 0; GraphedStep needs "
                "one row count for every input and the target. Fix: batch-first tensors of one batch."
            )
        if rows.pop() % self.K:
            raise ValueError(
                f"the batch has {target.shape[0]} rows, not a multiple of K={self.K} (K rows per sample). "
                "Fix: give each sample's K augmented copies, sample-major."
            )
        if self._inputs is not None:
            shapes = [t.shape[1:] for t in self._inputs] + [self._target.shape[1:]]  # type: ignore[union-attr]
            if [t.shape[1:] for t in batch] != shapes:
                raise ValueError(
                    f"the batch's rows have shapes {[tuple(t.shape[1:]) for t in batch]}, but this GraphedStep "
                    f"was built for {[tuple(s) for s in shapes]}: a graph holds one shape. Fix: pad or crop the "
                    "inputs to one shape, or make a GraphedStep per shape."
                )
        return list(inputs), target

    def _check_drawn(self, batch: tuple[Tensor, ...], samples: int) -> None:
        """The tied Poisson loader's check, as the eager step makes it (the batch's marks are its tensors')."""
        tied = self.optimizer.sampled_batches
        if not tied.tied:
            return
        tied.trained_on(batch)
        tied.rows_clipped()
        tied.check(samples)

    def _fill(self, inputs: list[Tensor], target: Tensor, rows: int) -> None:
        """Copy the batch into the step's buffers; the rows past it copy its first sample, with weight 0."""
        if self._inputs is None:
            device = self.optimizer.params[0].device if self.optimizer.params else torch.device("cpu")
            capacity = self.max_batch_size * self.K
            self._inputs = [t.new_zeros((capacity, *t.shape[1:]), device=device) for t in inputs]
            self._target = target.new_zeros((capacity, *target.shape[1:]), device=device)
            self._weights = torch.zeros(capacity, device=device)
            self._keep = torch.zeros(capacity, device=device)
        assert self._target is not None and self._weights is not None and self._keep is not None
        for static, given in zip([*self._inputs, self._target], [*inputs, target], strict=True):
            static[:rows].copy_(given, non_blocking=True)
            if rows and rows < static.shape[0]:
                first = static[: self.K]
                past = static[rows:].view(-1, self.K, *static.shape[1:])
                past.copy_(first.unsqueeze(0).expand_as(past))
        scale = 1.0 / self._weights.shape[0] if self.optimizer.loss_reduction == "mean" else 1.0
        self._keep.zero_()[:rows] = 1.0
        torch.mul(self._keep, scale, out=self._weights)

    def _padded_step(self) -> None:
        """The step the graph holds: zero_grad, forward, weighted loss, backward, the DP optimizer's step."""
        assert self._inputs is not None and self._target is not None
        assert self._weights is not None and self._keep is not None
        opt = self.optimizer
        opt.zero_grad(set_to_none=True)
        per_row = self.per_row_loss(self.model(*self._inputs), self._target)
        if per_row.shape != self._weights.shape:
            raise ValueError(
                f"per_row_loss returned shape {tuple(per_row.shape)}; GraphedStep needs one loss per row, "
                f"[{self._weights.shape[0]}]. Fix: reduction='none' "
                "(e.g. partial(F.cross_entropy, reduction='none')), or sum a row's terms yourself."
            )
        (per_row * self._weights).sum().backward()
        self._loss_sum = (per_row.detach() * self._keep).sum()
        opt.step()

    @contextlib.contextmanager
    def _owned(self) -> Iterator[None]:
        """The optimizer's host bookkeeping is this object's while the padded step runs (or is captured)."""
        opt = self.optimizer
        tied, hooks = opt.sampled_batches, opt.step_hooks
        opt.sampled_batches, opt.step_hooks, opt._noise_drawn = SampledBatches(), [], self._noise
        try:
            with capturable_step():
                yield
        finally:
            opt.sampled_batches, opt.step_hooks, opt._noise_drawn = tied, hooks, None

    def _run_owned(self) -> None:
        """The padded step, eager. Where a capture is to follow, it also proves the step capturable: the
        model's rows proven by the provenance probe (which reads the device), and no synchronising CUDA
        call (``torch.cuda.set_sync_debug_mode``), after which its constants are the ones a capture may hold
        (the state the step made, momentum and the like, is then made outside the graph)."""
        check = self.capture and self._rows_proven()
        watch = check and torch.cuda.is_available()  # the sync check is CUDA's (a CPU build has none)
        syncs: list[str] = []
        if watch:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                mode = torch.cuda.get_sync_debug_mode()
                torch.cuda.set_sync_debug_mode("warn")
                try:
                    self._step_naming_padding()
                finally:
                    torch.cuda.set_sync_debug_mode(mode)
            syncs, others = sync_calls(caught)
            for w in others:  # the step's own warnings, given as they came
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        else:
            self._step_naming_padding()
        self._stats = self.optimizer.last_step_stats
        self._ready = self._constants() if check and not syncs else None
        if syncs:
            message = (
                f"the DP step reads the device on the host ({syncs[0]}; {len(syncs)} such call(s)), which a CUDA "
                "graph's capture refuses."
            )
            if self._required:
                raise RuntimeError(message + " Fix: capture=None (steps eager where a capture would fail).")
            warnings.warn(message + " GraphedStep runs every step eagerly.", RuntimeWarning, stacklevel=4)
            self.capture = False

    def _step_naming_padding(self) -> None:
        try:
            with self._owned():
                self._padded_step()
        except GradSampleError as error:  # the probe names samples: some may be the padding's
            raise GradSampleError(
                f"{error} (In a GraphedStep, the samples from {self._samples} on are copies of sample 0 that pad "
                "the batch.)"
            ) from error

    def _rows_proven(self) -> bool:
        """Whether the provenance probe (hooks, ghost, ew) is done: it reads the device while it runs."""
        proof = getattr(self.model, "_rows_proof", "proven")
        return proof == "proven" or not getattr(self.model, "probes_rows", True)

    def _forget_graph(self) -> None:
        """Drop the graph: the next padded step runs eagerly, and a capture may follow it."""
        self._graph = self._held = self._ready = None

    def _capture(self) -> None:
        """Capture the padded step (nothing runs: the replay that follows is the step).

        Only after an eager padded step with the same constants that made no synchronising call
        (:meth:`_run_owned`). A capture that fails anyway raises: PyTorch's CUDA random numbers cannot be
        used in this process after a failed capture (seen on an H200, torch 2.11).
        """
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        # autocast's cache of cast weights would hand the graph casts made before it, never redone: off
        uncached: Any = contextlib.nullcontext()
        if torch.is_autocast_enabled("cuda"):
            uncached = torch.autocast("cuda", torch.get_autocast_dtype("cuda"), cache_enabled=False)
        try:
            with self._owned(), torch.cuda.graph(graph), uncached:
                self._padded_step()
        except Exception as error:
            raise RuntimeError(
                f"capturing the DP step in a CUDA graph failed: {type(error).__name__}: {str(error)[:300]}. An "
                "eager step with the same constants made no synchronising call, so the cause is one that check "
                "does not see (a random-number generator other than the device's default, a host copy). After a "
                "failed capture PyTorch's CUDA random numbers cannot be drawn in this process: restart it, and "
                "pass capture=False for this model (the same padded step, eager)."
            ) from error
        self._graph = graph
        self._stats = self.optimizer.last_step_stats  # its tensors are the graph's: each replay writes them
        self._held = self._constants()
        self.captures += 1

    def _constants(self) -> tuple[Any, ...]:
        """What the captured step holds as numbers or addresses; a change means capturing again."""
        opt = self.optimizer
        groups = tuple(  # a tensor (a learning rate on the device) by its address: the graph reads its value
            tuple(
                sorted((k, v.data_ptr() if isinstance(v, Tensor) else repr(v)) for k, v in g.items() if k != "params")
            )
            for g in opt.param_groups
        )
        state = tuple(
            t.data_ptr() for s in opt.original_optimizer.state.values() for t in s.values() if isinstance(t, Tensor)
        )
        return (
            opt.max_grad_norm,
            tuple(opt.max_grad_norms or ()),
            opt.clipping,
            opt.loss_reduction,
            opt.expected_batch_size,
            groups,
            tuple(p.data_ptr() for p in self.model.parameters()),
            tuple(b.data_ptr() for b in self.model.buffers()),
            state,
            torch.is_grad_enabled(),
            self.model.training,
            torch.is_autocast_enabled("cuda"),
            torch.get_autocast_dtype("cuda"),
        )

    def _finish(self, samples: int) -> None:
        """The step's statistics over the batch's samples, its non-finite count (read later), its hooks."""
        opt = self.optimizer
        stats = self._stats  # the padded step's own (last_step_stats holds the last call's copy)
        if stats is not None:
            norms = stats.per_sample_norms
            past = norms[samples:]
            clipped = torch.as_tensor(stats.num_clipped, device=norms.device)
            if past.numel():  # a row past the batch is clipped only if its norm is not finite (factor 0)
                clipped = clipped - (~torch.isfinite(past)).sum()
            # copies: a replay overwrites the captured step's tensors at the next step
            opt.last_step_stats = dataclasses.replace(
                stats,
                noise_multiplier=opt.noise_multiplier,  # the captured step's numbers are its capture's
                noise_std=opt.noise_multiplier * opt.max_grad_norm,
                batch_size=samples,
                per_sample_norms=norms[:samples].clone(),
                num_clipped=clipped.clone(),
                norms=stats.norms.snapshot(),
            )
            count = (~torch.isfinite(norms[:samples])).sum()
            if self._count_host is None:  # one pinned number and one event, reused: read before each refill
                self._count_host = torch.empty((), dtype=count.dtype, device="cpu", pin_memory=count.is_cuda)
                self._count_done = torch.cuda.Event() if count.is_cuda else None
            self._count_host.copy_(count, non_blocking=True)
            if self._count_done is not None:
                self._count_done.record()
            self._count_pending = True
        for hook in opt.step_hooks:  # the accountant counts every step, replayed or not
            hook(opt)

    def _warn_nonfinite(self) -> None:
        """The last step's warning for samples with a non-finite norm (its count is read now, not then)."""
        if not self._count_pending or self._count_host is None:
            return
        self._count_pending = False
        if self._count_done is not None:
            self._count_done.synchronize()
        if count := int(self._count_host):
            warnings.warn(
                f"{count} sample(s) of the last GraphedStep step had a NaN or infinite gradient norm; they got "
                "clip factor 0 and added nothing to the step. Check the loss and the inputs of those samples "
                "(an overflow, a log of 0).",
                PrivacyWarning,
                stacklevel=3,
            )

    def flush(self) -> None:
        """Give the last step's non-finite warning now (the next call would give it)."""
        self._warn_nonfinite()

    def _eager(self, inputs: list[Tensor], target: Tensor) -> Tensor:
        """A batch over ``max_batch_size``: the plain eager step, with the optimizer's own checks and hooks.

        Its other shapes may replace buffers the graph writes into: the graph is dropped (the next padded
        step runs eagerly, then a capture may follow)."""
        self._forget_graph()
        opt = self.optimizer
        opt.zero_grad(set_to_none=True)
        per_row = self.per_row_loss(self.model(*inputs), target)
        reduce = torch.mean if opt.loss_reduction == "mean" else torch.sum
        reduce(per_row).backward()
        opt.step()
        self.eager_steps += 1
        self._steps_seen = opt.finished_batches
        return per_row.detach().mean()

    def __repr__(self) -> str:
        return (
            f"GraphedStep(max_batch_size={self.max_batch_size}, K={self.K}, capture={self.capture}, "
            f"captures={self.captures}, replays={self.replays}, eager_steps={self.eager_steps})"
        )


__all__ = ["GraphedStep", "RowLoss", "row_cross_entropy"]
