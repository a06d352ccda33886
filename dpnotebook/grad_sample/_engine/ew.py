"""The ``"ew"`` mode: per-sample gradients from PyTorch's ExpandedWeights (``call_for_per_sample_grads``).

PyTorch's rules write one gradient per *row* into ``p.grad_sample``; this module, the only one that
touches that private API, makes them mean what the other modes' do: averaged over each sample's
``K`` rows, ``p.grad`` filled, an ``Embedding``'s ``padding_idx`` row zero, a later batch appended
(or refused), and what ExpandedWeights cannot do refused with an error naming the mode to use.
"""

from __future__ import annotations

import contextlib
import functools
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
from dpnotebook.grad_sample._engine.hooks import ModelWrapper
from dpnotebook.grad_sample._engine.precision import rounded_matmuls
from dpnotebook.grad_sample._engine.provenance import layers_with_parameters, prove_rows
from dpnotebook.modes import register_mode


@contextlib.contextmanager
def _plain_rnn_kernels(needed: bool) -> Iterator[None]:
    """Turn oneDNN off while an RNN runs: ExpandedWeights has rules for the plain RNN kernels only."""
    before = torch._C._get_mkldnn_enabled()
    torch._C._set_mkldnn_enabled(before and not needed)
    try:
        yield
    finally:
        torch._C._set_mkldnn_enabled(before)


@register_mode("ew")
class GradSampleModuleExpandedWeights(ModelWrapper):
    """Per-sample gradients through PyTorch's ExpandedWeights.

    Args:
        module: the model (not copied; :meth:`to_standard_module` returns it).
        batch_first: must be ``True``; ExpandedWeights has no other layout.
        loss_reduction: ``"mean"`` or ``"sum"``, as in :class:`~dpnotebook.grad_sample.GradSampleModule`.
        strict: refuse models with layers that mix samples.
        K: augmentation multiplicity.

    Raises:
        ValueError: ``batch_first=False``, ``force_functorch=True``, or a module with parameters
            reached by two paths (ExpandedWeights swaps parameters by path).

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
        if force_functorch:
            raise ValueError("force_functorch=True has no meaning in grad_sample_mode='ew'; use 'functorch'.")
        seen: dict[int, str] = {}
        for name, m in module.named_modules(remove_duplicate=False):
            if next(m.parameters(recurse=False), None) is not None and seen.setdefault(id(m), name) != name:
                raise ValueError(
                    f"grad_sample_mode='ew': model.{seen[id(m)]} and model.{name} are one {type(m).__name__} "
                    "reached by two paths; ExpandedWeights swaps its parameters by path and has no rule for the "
                    "second. Fix: use grad_sample_mode='functorch'."
                )
        super().__init__(module, loss_reduction=loss_reduction, strict=strict, K=K)
        self._earlier: dict[int, GradSample] = {}
        self._passes: list[int] = []  # rows of each forward pass the running backward pass has reached
        self._has_rnn = any(isinstance(m, nn.RNNBase) for m in module.modules())
        self._rows_proof: str | None = None  # what the provenance probe has shown so far
        self._inside = False  # in this wrapper's forward: the layers may run with gradients
        compiled = any(type(m).__name__ == "OptimizedModule" or m._compiled_call_impl for m in module.modules())
        checked = [] if compiled else layers_with_parameters(module)  # compiled: Dynamo traced the hooks, lost grads
        hook = self._refuse_outside_call
        self._outside_checks = [m.register_forward_pre_hook(functools.partial(hook, path)) for path, m, _ in checked]

    def _refuse_outside_call(self, path: str, layer: nn.Module, args: Any) -> None:
        """A layer run with gradients outside this wrapper's forward (the inner model, a DDP around it) is refused."""
        if self._inside or not self.hooks_enabled or not torch.is_grad_enabled():
            return
        raise GradSampleError(
            f"{path} ({type(layer).__name__}) ran with gradients enabled outside the {type(self).__name__}'s "
            "forward (e.g. wrapped._module(x), or the DistributedDataParallel make_private took): its gradient "
            "would reach p.grad but no per-sample gradient, and the DP step would drop it. Call the wrapper, "
            "model(x); or run it under torch.no_grad(), or use .to_standard_module()."
        )

    def to_standard_module(self) -> nn.Module:
        """The model, with every ``grad_sample`` and this wrapper's checks removed."""
        for handle in self._outside_checks:
            handle.remove()
        self._outside_checks = []
        return super().to_standard_module()

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if not self.hooks_enabled or not torch.is_grad_enabled():
            return self._module(*args, **kwargs)
        refuse_packed(args, kwargs, "ew", self._module)
        on = [device for device in ("cpu", "cuda") if torch.is_autocast_enabled(device)]
        if on:
            raise GradSampleError(
                f"grad_sample_mode='ew' cannot run inside torch.autocast (on for {on}): ExpandedWeights' rules "
                "bypass autocast's casts, so a layer gets a reduced-precision input with a float32 weight. "
                "Fix: use grad_sample_mode='hooks', 'ghost' or 'functorch', which train under autocast with "
                "float32 per-sample gradients."
            )
        rounded = rounded_matmuls(p.device.type for p in self._module.parameters() if p.dtype == torch.float32)
        if rounded:
            raise GradSampleError(
                f"grad_sample_mode='ew' cannot run while float32 matrix products may round ({rounded}): "
                "ExpandedWeights forms per-sample gradients inside PyTorch's backward pass, where they are "
                "rounded too, and a sample's rounded gradient moves with the batch around it (the auditor "
                "measured 1.76 C with bfloat16 products). Fix: torch.set_float32_matmul_precision('highest'), "
                "or grad_sample_mode='hooks', 'ghost' or 'functorch', whose per-sample work is IEEE float32."
            )
        rows = self._rows(args)
        self._inside = True
        try:
            return self._forward_inside(rows, args, kwargs)
        finally:
            self._inside = False

    def _forward_inside(self, rows: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        from torch.nn.utils._per_sample_grad import call_for_per_sample_grads  # private API, lazily

        with _plain_rnn_kernels(self._has_rnn):
            if self._rows_proof != "proven":
                found = prove_rows(
                    self._module,
                    layers_with_parameters(self._module),
                    args,
                    kwargs,
                    K=self.K,
                    batch_dim=0,
                    backward_proven=self._rows_proof == "backward only",
                )
                self._rows_proof = self._rows_proof if found == "nothing to prove" else found
            self._passes = []  # left over only by a backward pass that failed
            held = {p: g for p in self._module.parameters() if (g := getattr(p, "grad_sample", None)) is not None}
            for p in held:  # ExpandedWeights refuses a forward pass while grad_sample is set
                setattr(p, "grad_sample", None)
            try:
                out = call_for_per_sample_grads(self._module, batch_size=rows, loss_reduction=self.loss_reduction)(
                    *args, **kwargs
                )
            except RuntimeError as err:
                explained = _explained(err)
                if explained is None:
                    raise
                raise explained from err
            finally:  # kept until a backward pass reaches this forward pass (a metric gets none)
                for p, earlier in held.items():
                    setattr(p, "grad_sample", earlier)
        leaves = [x for x in tree_flatten(out)[0] if isinstance(x, Tensor) and x.requires_grad]
        if leaves:
            reached: list[int] = []  # the backward passes that reached this forward pass
            register_multi_grad_hook(leaves, lambda grads: self._queue_finish(rows, reached), mode="any")
        return out

    def _rows(self, args: tuple[Any, ...]) -> int:
        first = next((a for a in args if isinstance(a, Tensor)), None)
        if first is None or first.dim() == 0:
            raise ValueError("grad_sample_mode='ew' needs a tensor input with the batch in dim 0.")
        rows = first.shape[0]
        if rows == 0:
            raise ValueError(
                "grad_sample_mode='ew' cannot run an empty batch (ExpandedWeights needs a positive batch size). "
                "Use grad_sample_mode='hooks' or 'functorch', which return [0, ...] grad samples."
            )
        if rows % self.K:
            raise ValueError(f"the input has {rows} rows in dim 0, which K={self.K} does not divide.")
        return rows

    def _queue_finish(self, rows: int, reached: list[int]) -> None:
        """Called once per forward pass that the backward pass reaches; the first one queues the finish.

        Before ExpandedWeights writes this backward pass's rows, earlier samples are set aside (a
        forward pass with no backward, e.g. a metric, leaves them as they are).

        Raises:
            GradSampleError: a second backward pass through the same forward pass (``retain_graph=True``).
        """
        if reached:
            raise GradSampleError(
                "grad_sample_mode='ew': a second backward pass through the same forward pass (retain_graph=True); "
                "ExpandedWeights would add its per-row gradients to the first one's per-sample gradients. Fix: add "
                "the losses and call backward once, or run the forward pass again before each backward pass."
            )
        reached.append(rows)
        self._passes.append(rows)
        if len(self._passes) > 1:
            return
        for p in self._module.parameters():
            if getattr(p, "grad_sample", None) is not None and id(p) not in self._earlier:
                self._earlier[id(p)] = getattr(p, "grad_sample")
                setattr(p, "grad_sample", None)
        torch.autograd.Variable._execution_engine.queue_callback(self._finish_backward)

    def _finish_backward(self) -> None:
        """Per-row gradients -> per-sample means; fill ``p.grad``; append to earlier samples."""
        passes, self._passes = self._passes, []
        if len(passes) > 1:
            for p in self._module.parameters():  # the mixed per-row gradients must not be used
                setattr(p, "grad_sample", None)
            raise GradSampleError(
                f"grad_sample_mode='ew': one backward pass went through {len(passes)} forward passes (rows "
                f"{passes}); ExpandedWeights adds their per-row gradients row by row, mixing their samples. "
                f"Fix: call backward after each forward pass, or use grad_sample_mode='hooks', 'functorch' or 'ghost'."
            )
        rows = passes[0]
        for m in self._module.modules():  # ExpandedWeights' embedding rule ignores padding_idx; p.grad does not
            if isinstance(m, nn.Embedding) and m.padding_idx is not None:
                per_row = getattr(m.weight, "grad_sample", None)
                if per_row is not None and per_row.shape[0] == rows:
                    per_row[:, m.padding_idx] = 0
        sampled = [p for p in self._module.parameters() if getattr(p, "grad_sample", None) is not None]
        sampled = [p for p in sampled if grad_sample_rows(p).shape[0] == rows]  # type: ignore[union-attr]
        grads = [getattr(p, "grad_sample").sum(0) for p in sampled]
        if grads and self.loss_reduction == "mean":
            torch._foreach_div_(grads, float(rows))  # one kernel on a GPU
        for p, grad in zip(sampled, grads, strict=True):
            per_row = getattr(p, "grad_sample")
            p.grad = grad if p.grad is None else p.grad + grad
            samples = per_row.reshape(rows // self.K, self.K, *p.shape).mean(1) if self.K > 1 else per_row
            earlier = self._earlier.pop(id(p), None)
            if earlier is not None and not self.allow_accumulation:
                raise GradSampleError(
                    "grad_sample from an earlier batch is still there and accumulation is "
                    "forbidden: call zero_grad() first, or allow_grad_accumulation()."
                )
            # one tensor per backward pass, as the hooks engine's store keeps them
            merged = samples if earlier is None else [*(earlier if isinstance(earlier, list) else [earlier]), samples]
            setattr(p, "grad_sample", merged)

    def zero_grad(self, set_to_none: bool = True) -> None:
        super().zero_grad(set_to_none=set_to_none)
        self._earlier.clear()


def _explained(err: RuntimeError) -> GradSampleError | None:
    """ExpandedWeights' error for a layer that sees other rows or a function without a rule, with its fix."""
    seen = re.search(r"input batch size of (\d+) with ExpandedWeight of batch size (\d+)", str(err))
    if seen:
        return GradSampleError(
            f"grad_sample_mode='ew': a layer saw {seen.group(1)} rows in dim 0 where the input has {seen.group(2)} "
            "(B*K): ExpandedWeights needs every layer to see the batch in dim 0 (a time-major model, a position "
            "table looked up once for the whole batch). Fix: use grad_sample_mode='hooks' or 'ghost', which take "
            "a table broadcast over the batch, or 'functorch', which replays the whole model per sample."
        )
    found = re.search(r"cannot handle function (\S+)", str(err))
    if not found:
        return None
    return GradSampleError(
        f"grad_sample_mode='ew': ExpandedWeights has no per-sample rule for {found.group(1)!r}. Use "
        "grad_sample_mode='functorch', or 'hooks' (after dpnotebook.fix(model) if it holds torch.nn recurrent "
        "or attention layers)."
    )
