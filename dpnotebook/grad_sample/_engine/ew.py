"""The "ew" mode: PyTorch's ExpandedWeights (``call_for_per_sample_grads``).

ExpandedWeights swaps each parameter for a wrapper that knows the batch size;
PyTorch's own per-function rules then write one gradient per *row* into
``p.grad_sample`` during the backward pass. This module is the only place that
touches that private API, and imports it lazily.

What we add on top, so that "ew" means the same as the other modes:

- ``K``: the per-row gradients are averaged over each sample's ``K`` rows at the
  end of the backward pass (so this mode does hold ``B*K`` per-row gradients
  for a moment; hooks and functorch do not);
- ``p.grad`` is filled as plain PyTorch would (ExpandedWeights leaves it empty);
- an ``Embedding``'s ``padding_idx`` row gets zero per-sample gradients, as in
  ``weight.grad`` (ExpandedWeights' own rule gives it non-zero ones);
- a second batch before ``zero_grad`` appends samples (or raises), instead of
  silently adding two batches' gradients sample by sample;
- two forward passes reaching one backward pass raise: ExpandedWeights would add
  their per-row gradients row by row (row ``i`` of one pass to row ``i`` of the other);
- what ExpandedWeights cannot do (``batch_first=False``, empty batches, a
  function it has no rule for, a layer that sees other rows than the input, a
  module reached by two paths, a ``PackedSequence``, a forward pass inside
  ``torch.autocast``) raises an error naming the mode to use instead.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor, nn
from torch.autograd.graph import register_multi_grad_hook
from torch.utils._pytree import tree_flatten

from dpnotebook.errors import GradSampleError
from dpnotebook.grad_sample._engine.accumulation import GradSample, grad_sample_rows
from dpnotebook.grad_sample._engine.calls import refuse_packed
from dpnotebook.grad_sample._engine.hooks import check_k, check_loss_reduction
from dpnotebook.grad_sample._engine.no_op import OuterWrapper
from dpnotebook.grad_sample._engine.provenance import layers_with_parameters, probe_rows
from dpnotebook.modes import register_mode


@contextlib.contextmanager
def _plain_rnn_kernels(needed: bool) -> Iterator[None]:
    """Turn oneDNN off while an RNN runs: ExpandedWeights has rules for the plain RNN kernels only."""
    if not needed:
        yield
        return
    before = torch._C._get_mkldnn_enabled()
    torch._C._set_mkldnn_enabled(False)
    try:
        yield
    finally:
        torch._C._set_mkldnn_enabled(before)


def _refuse_shared_modules(module: nn.Module) -> None:
    """Raise if a module holding parameters is reached by two paths (``a = Sequential(lin)``, ``b = Sequential(lin)``)."""
    seen: dict[int, str] = {}
    for name, m in module.named_modules(remove_duplicate=False):
        if next(m.parameters(recurse=False), None) is None:
            continue
        if id(m) in seen:
            raise ValueError(
                f"grad_sample_mode='ew': model.{seen[id(m)]} and model.{name} are one {type(m).__name__} reached "
                "by two paths; ExpandedWeights swaps its parameters by path and then has no per-sample rule for "
                "the second one. Fix: use grad_sample_mode='functorch' (it replays the whole model per sample)."
            )
        seen[id(m)] = name


def _refuse_autocast() -> None:
    """Raise inside ``torch.autocast``: ExpandedWeights' rules call the layer functions past autocast's casts.

    Its ``F.linear`` then receives a bfloat16 input and a float32 weight and fails with a dtype
    error that does not say why; this says why and which modes work.
    """
    on = [device for device in ("cpu", "cuda") if torch.is_autocast_enabled(device)]
    if on:
        raise GradSampleError(
            f"grad_sample_mode='ew' cannot run inside torch.autocast (on for {on}): PyTorch's ExpandedWeights "
            "rules call the layer functions outside autocast's casts, so a layer receives a bfloat16/float16 "
            "input with a float32 weight. Fix: use grad_sample_mode='hooks', 'ghost' or 'functorch', which "
            "train under autocast with per-sample gradients in float32, or run the forward pass outside autocast."
        )


@register_mode("ew")
class GradSampleModuleExpandedWeights(OuterWrapper):
    """Per-sample gradients through PyTorch's ExpandedWeights.

    Args:
        module: the model (not copied; :meth:`to_standard_module` returns it).
        batch_first: must be ``True``; ExpandedWeights has no other layout.
        loss_reduction: ``"mean"`` or ``"sum"``, as in :class:`GradSampleModule`.
        strict: refuse models with layers that mix samples.
        K: augmentation multiplicity.

    >>> import torch
    >>> from torch import nn
    >>> m = GradSampleModuleExpandedWeights(nn.Linear(3, 2), K=2)
    >>> m(torch.randn(4, 3)).sum().backward()
    >>> m.weight.grad_sample.shape
    torch.Size([2, 2, 3])
    """

    grad_sample_mode = "ew"

    def __init__(
        self,
        module: nn.Module,
        *,
        batch_first: bool = True,
        loss_reduction: str = "mean",
        strict: bool = True,
        K: int = 1,
        force_functorch: bool = False,
    ) -> None:
        if batch_first is not True:
            raise ValueError(
                f"grad_sample_mode='ew' cannot handle batch_first={batch_first!r}: ExpandedWeights "
                "needs the batch in dim 0. Use grad_sample_mode='hooks' or 'functorch'."
            )
        check_loss_reduction(loss_reduction)
        if force_functorch:
            raise ValueError("force_functorch=True has no meaning in grad_sample_mode='ew'; use 'functorch'.")
        K = check_k(K)
        _refuse_shared_modules(module)
        if strict:
            self.validate(module, strict=True)
        super().__init__(module)
        self.batch_first = True
        self.loss_reduction = loss_reduction
        self.K = K
        self.hooks_enabled = True
        self.allow_accumulation = True
        self._earlier: dict[int, GradSample] = {}
        self._passes: list[int] = []  # rows of each forward pass the running backward pass has reached
        self._has_rnn = any(isinstance(m, nn.RNNBase) for m in module.modules())
        self._rows_proof: str | None = None  # what the provenance probe has shown so far

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if not self.hooks_enabled or not torch.is_grad_enabled():
            return self._module(*args, **kwargs)
        from torch.nn.utils._per_sample_grad import call_for_per_sample_grads  # private API, lazily

        refuse_packed(args, kwargs, "ew", self._module)
        _refuse_autocast()
        rows = self._rows(args)
        if self._rows_proof != "proven":
            self._prove_rows(args, kwargs)
        self._passes = []  # left over only by a backward pass that failed
        self._set_aside_earlier_samples()
        try:
            with _plain_rnn_kernels(self._has_rnn):
                out = call_for_per_sample_grads(self._module, batch_size=rows, loss_reduction=self.loss_reduction)(
                    *args, **kwargs
                )
        except RuntimeError as err:
            seen = re.search(r"input batch size of (\d+) with ExpandedWeight of batch size (\d+)", str(err))
            if seen:
                raise GradSampleError(
                    f"grad_sample_mode='ew': a layer saw {seen.group(1)} rows in dim 0 where the input has "
                    f"{seen.group(2)} (B*K): ExpandedWeights needs every layer to see the batch in dim 0 (does the "
                    "model run time-major inside, or look a position table up once for the whole batch?). Fix: use "
                    "grad_sample_mode='hooks' or 'ghost', which take a table broadcast over the batch where it "
                    "meets the batch, or 'functorch', which replays the whole model per sample; or keep the batch "
                    "in dim 0 of every layer's input."
                ) from err
            found = re.search(r"cannot handle function (\S+)", str(err))
            if not found:
                raise
            raise GradSampleError(
                f"grad_sample_mode='ew': ExpandedWeights has no per-sample rule for "
                f"{found.group(1)!r}. Use grad_sample_mode='functorch', or 'hooks' (after "
                "dpnotebook.fix(model) if it holds torch.nn recurrent or attention layers)."
            ) from err
        leaves = [x for x in tree_flatten(out)[0] if isinstance(x, Tensor) and x.requires_grad]
        if leaves:
            register_multi_grad_hook(leaves, lambda grads: self._queue_finish(rows), mode="any")
        return out

    def _prove_rows(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """The provenance probe (:mod:`~dpnotebook.grad_sample._engine.provenance`) on every layer with parameters."""
        with _plain_rnn_kernels(self._has_rnn):
            found = probe_rows(
                self._module,
                layers_with_parameters(self._module),
                args,
                kwargs,
                K=self.K,
                batch_dim=0,
                backward_proven=self._rows_proof == "backward only",
            )
        if found != "nothing to prove":
            self._rows_proof = found

    def _rows(self, args: tuple[Any, ...]) -> int:
        first = next((a for a in args if isinstance(a, Tensor)), None)
        if first is None or first.dim() == 0:
            raise ValueError("grad_sample_mode='ew' needs a tensor input with the batch in dim 0.")
        rows = first.shape[0]
        if rows == 0:
            raise ValueError(
                "grad_sample_mode='ew' cannot run an empty batch (ExpandedWeights needs a positive "
                "batch size). Use grad_sample_mode='hooks' or 'functorch', which return [0, ...] "
                "grad samples."
            )
        if rows % self.K:
            raise ValueError(f"the input has {rows} rows in dim 0, which K={self.K} does not divide.")
        return rows

    def _set_aside_earlier_samples(self) -> None:
        for p in self._module.parameters():
            if getattr(p, "grad_sample", None) is not None:
                if id(p) in self._earlier:  # forward twice without backward: keep the first
                    continue
                self._earlier[id(p)] = getattr(p, "grad_sample")  # the wrapper's attribute, not torch's
                setattr(p, "grad_sample", None)

    def _queue_finish(self, rows: int) -> None:
        """Called once per forward pass that the backward pass reaches; the first one queues the finish."""
        self._passes.append(rows)
        if len(self._passes) == 1:
            self._refuse_second_backward()
            torch.autograd.Variable._execution_engine.queue_callback(self._finish_backward)

    def _refuse_second_backward(self) -> None:
        """A backward pass through a forward pass that an earlier backward pass already finished.

        ExpandedWeights adds the new rows to ``p.grad_sample``, which is a list once several
        backward passes are held: refused with the fix rather than left to fail inside torch.
        """
        if any(isinstance(getattr(p, "grad_sample", None), list) for p in self._module.parameters()):
            raise GradSampleError(
                "grad_sample_mode='ew': a second backward pass through the same forward pass (retain_graph) "
                "while p.grad_sample holds several backward passes: ExpandedWeights cannot add the new rows "
                "to the right pass. Fix: run a forward pass before each backward pass, or use "
                "grad_sample_mode='hooks' or 'functorch', which add them to the forward pass's rows."
            )

    def _finish_backward(self) -> None:
        passes, self._passes = self._passes, []
        if len(passes) > 1:
            for p in self._module.parameters():  # the mixed per-row gradients must not be used
                setattr(p, "grad_sample", None)
            raise GradSampleError(
                f"grad_sample_mode='ew': one backward pass went through {len(passes)} forward passes (rows "
                f"{passes}); ExpandedWeights adds their per-row gradients row by row, mixing the samples of "
                "different passes. Fix: call backward after each forward pass (DPOptimizer accumulates the "
                "samples), or use grad_sample_mode='hooks', 'functorch' or 'ghost', which keep the passes apart."
            )
        self._finish(passes[0])

    def _finish(self, rows: int) -> None:
        """Per-row gradients -> per-sample means; fill ``p.grad``; append to earlier samples."""
        B = rows // self.K
        self._zero_padding_rows(rows)
        sampled = [p for p in self._module.parameters() if getattr(p, "grad_sample", None) is not None]
        sampled = [p for p in sampled if grad_sample_rows(p).shape[0] == rows]  # type: ignore[union-attr]
        grads = [getattr(p, "grad_sample").sum(0) for p in sampled]
        if grads and self.loss_reduction == "mean":
            torch._foreach_div_(grads, float(rows))  # one kernel on a GPU
        for p, grad in zip(sampled, grads, strict=True):
            per_row = getattr(p, "grad_sample")
            p.grad = grad if p.grad is None else p.grad + grad
            samples = per_row.reshape(B, self.K, *p.shape).mean(1) if self.K > 1 else per_row
            earlier = self._earlier.pop(id(p), None)
            if earlier is not None and not self.allow_accumulation:
                raise GradSampleError(
                    "grad_sample from an earlier batch is still there and accumulation is "
                    "forbidden: call zero_grad() first, or allow_grad_accumulation()."
                )
            # one tensor per backward pass, as the hooks engine's store keeps them (accumulation.py)
            merged = samples if earlier is None else [*(earlier if isinstance(earlier, list) else [earlier]), samples]
            setattr(p, "grad_sample", merged)

    def _zero_padding_rows(self, rows: int) -> None:
        """ExpandedWeights' embedding rule ignores ``padding_idx``; ``weight.grad`` has zeros there."""
        for m in self._module.modules():
            if isinstance(m, nn.Embedding) and m.padding_idx is not None:
                per_row = getattr(m.weight, "grad_sample", None)
                if per_row is not None and per_row.shape[0] == rows:
                    per_row[:, m.padding_idx] = 0

    def allow_grad_accumulation(self) -> None:
        self.allow_accumulation = True

    def forbid_grad_accumulation(self) -> None:
        self.allow_accumulation = False

    def disable_hooks(self) -> None:
        self.hooks_enabled = False

    def enable_hooks(self) -> None:
        self.hooks_enabled = True

    def zero_grad(self, set_to_none: bool = True) -> None:
        super().zero_grad(set_to_none=set_to_none)
        self._earlier.clear()
