"""Ghost mode: per-sample gradient norms and the clipped sum, without per-sample gradients.

For each layer with a norm sampler, :class:`GhostGradSampleModule` runs the forward with
*detached* parameters (autograd never computes the weight gradient DP-SGD would throw away)
and records what the layer saw and, through a hook or a :class:`Tap` on its output, what came
back; a ``GhostLedger`` turns the records into norms and clipped sums. Other layers are left
to the hooks engine and join through ``p.grad_sample``. Stale records are refused.

>>> model = GhostGradSampleModule(nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 2)))
>>> model(torch.randn(5, 4)).sum().backward()
>>> model.per_sample_norms().shape
torch.Size([5])
>>> model.units
[('model.0', 'ghost'), ('model.2', 'ghost')]
"""

from __future__ import annotations

import weakref
from collections import Counter
from functools import partial
from typing import Any, Literal, cast

import torch
from torch import Tensor, nn

from dpnotebook.errors import GradSampleError
from dpnotebook.grad_sample._engine.accumulation import GradSampleStore, grad_sample_rows
from dpnotebook.grad_sample._engine.calls import LayerCall, capture_is_paused, detach_tree, loss_scale
from dpnotebook.grad_sample._engine.hooks import GradSampleModule
from dpnotebook.grad_sample._engine.layer_hooks import second_backward_error, to_batch_first
from dpnotebook.grad_sample._engine.provenance import ProbeLayer
from dpnotebook.grad_sample._registry import SamplerEntry
from dpnotebook.grad_sample.ghost._ledger import GhostLedger
from dpnotebook.grad_sample.samplers import linear_norm, materialised_norm, rnn_norm  # noqa: F401  (register them)
from dpnotebook.grad_sample.samplers._contracts import GhostCall, GhostHandler, Grads, MaterialisedGroup, ghost_handler
from dpnotebook.modes import register_mode

#: A layer the hooks engine handles: ``(path, layer, its grad sampler or None for torch.func)``.
Unit = tuple[str, nn.Module, SamplerEntry | None]


class Tap(torch.autograd.Function):
    """Identity on a layer's output that hands the output's gradient to ``sink``.

    Used where nothing before the layer requires grad: its inputs include the layer's
    parameters, so the output requires grad all the same. ``mark_dirty`` returns the very
    tensor (no view), so in-place operations after the layer work.

    >>> got, w = [], torch.nn.Parameter(torch.ones(2))
    >>> out = Tap.apply(torch.zeros(2), got.append, w)      # nothing before requires grad
    >>> (3 * out).sum().backward()
    >>> got[0], w.grad
    (tensor([3., 3.]), None)
    """

    @staticmethod
    def forward(ctx: Any, out: Tensor, sink: Any, *params: Tensor) -> Tensor:
        ctx.sink, ctx.n_params = sink, len(params)
        ctx.mark_dirty(out)
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        ctx.sink(grad)
        return (grad, None) + (None,) * ctx.n_params


def grad_mark(p: nn.Parameter) -> tuple[int, int] | None:
    return None if p.grad is None else (id(p.grad), p.grad._version)


class GhostStore(GradSampleStore):
    """The hooks engine's store, told that a ghosted parameter fed to a tap whose ``.grad`` did not change got none."""

    def __init__(self, owner: Any) -> None:
        super().__init__(owner)
        self.marks: dict[int, tuple[int, int] | None] = {}

    def _on_grad(self, p: nn.Parameter) -> None:
        if id(p) not in self.marks or grad_mark(p) != self.marks[id(p)]:
            super()._on_grad(p)


class StaleRecordsGuard:
    """The ghosted layers' parameter versions when a batch's first record came, checked before a forward pass.

    A batch's clipped gradients exist only as records until a ``GhostDPOptimizer`` step uses
    them and ``zero_grad()`` clears them. While records are held, a forward pass is refused
    when accumulation is forbidden or the parameters changed (a step went without them).
    ``layers``' parameters are read at each use (a parameter may be replaced).

    >>> layer = nn.Linear(2, 1)
    >>> guard = StaleRecordsGuard([layer])
    >>> guard.new_batch()                                   # the batch's first record
    >>> guard.check(holds_records=True, allow_accumulation=True)
    >>> with torch.no_grad():
    ...     _ = layer.weight.add_(1.0)                      # a step that went without the records
    >>> guard.check(holds_records=True, allow_accumulation=True)
    Traceback (most recent call last):
    ...
    dpnotebook.errors.GradSampleError: ghost mode: the parameters changed after a backward pass ...
    """

    def __init__(self, layers: list[nn.Module]) -> None:
        self.layers = layers
        self.versions: dict[int, int] = {}

    def _params(self) -> list[nn.Parameter]:
        return [p for m in self.layers for p in m._parameters.values() if p is not None]

    def new_batch(self) -> None:
        self.versions = {id(p): p._version for p in self._params()}

    def forget(self) -> None:
        self.versions = {}

    def check(self, holds_records: bool, allow_accumulation: bool) -> None:
        """Raise ``GradSampleError`` if records are held and accumulation is forbidden or the parameters changed."""
        if not holds_records:
            return
        if not allow_accumulation:
            raise GradSampleError(
                "ghost mode holds the norms of an earlier batch and gradient accumulation is forbidden. "
                "Call zero_grad() (on the model or the DP optimizer) before the next forward/backward, "
                "or call allow_grad_accumulation()."
            )
        for p in self._params():
            if id(p) in self.versions and p._version != self.versions[id(p)]:
                raise GradSampleError(
                    "ghost mode: the parameters changed after a backward pass whose clipped gradients "
                    "were never used, so an optimizer stepped without them (in ghost mode p.grad is "
                    "not filled). Use dpnotebook.privacy._optimizer.GhostDPOptimizer, e.g. through "
                    "PrivacyEngine.make_private(grad_sample_mode='ghost'), or call zero_grad() between steps."
                )


@register_mode("ghost", validates_as="hooks")  # builds on hooks mode: its checks apply
class GhostGradSampleModule(GradSampleModule):
    """Wraps ``module`` for ghost clipping: every sample's gradient norm and the clipped sum, no per-sample gradients.

    ``p.grad`` is not filled for the ghosted layers (:attr:`ghost_paths`): train with
    :class:`~dpnotebook.privacy._optimizer.GhostDPOptimizer`, or read :meth:`per_sample_norms` and
    :meth:`weighted_sums`. Args: as :class:`~dpnotebook.grad_sample._engine.hooks.GradSampleModule`.
    """

    grad_sample_mode = "ghost"

    def __init__(self, module: nn.Module, *, force_functorch: bool = False, **kwargs: Any) -> None:
        if force_functorch:
            raise ValueError(
                "force_functorch=True has no meaning in grad_sample_mode='ghost'; use grad_sample_mode='functorch'."
            )
        super().__init__(module, **kwargs)

    def _split_plan(self) -> tuple[list[tuple[str, nn.Module, SamplerEntry | None, GhostHandler]], list[Unit]]:
        units = self._all_units()
        owners = Counter(id(p) for _, m, e in units for p in set(m.parameters(recurse=e is None)))
        ghost, hooks = [], []
        mixed = self._broadcast.mixed_units  # called on batch-free and on batched inputs: hooks engine
        for path, m, entry in units:
            handler = ghost_handler(m) if entry is not None and id(m) not in mixed else None
            exclusive = all(owners[id(p)] == 1 for p in m.parameters(recurse=False))
            if handler is not None and exclusive:
                ghost.append((path, m, entry, handler))
            else:
                hooks.append((path, m, entry))
        return ghost, hooks

    def _plan(self) -> list[Unit]:
        return self._split_plan()[1]

    def _unit_modules(self) -> list[nn.Module]:
        return super()._unit_modules() + [m for _, m, _, _ in getattr(self, "_ghost_units", [])]

    def add_hooks(self) -> None:
        """Install the hooks engine's hooks and the ghost taps (done by the constructor)."""
        if self._hooks is not None:
            return
        if not isinstance(self._store, GhostStore):
            self._store = GhostStore(self)
        super().add_hooks()
        self._ghost_units, _ = self._split_plan()
        self._stale = StaleRecordsGuard([m for _, m, _, _ in self._ghost_units])
        self._ledger = GhostLedger({m: handler for _, m, _, handler in self._ghost_units}, self.K)
        self._swapped: dict[int, list[dict[str, nn.Parameter]]] = {}
        self._held: list[tuple[nn.Module, str, nn.Parameter]] = []
        self._ghost_handles = []
        for p in self._module.parameters():  # lets GhostDPOptimizer find this wrapper from its parameters
            setattr(p, "_dpn_ghost_owner", weakref.ref(self))  # an attribute torch's Parameter does not declare
        for path, m, _, handler in self._ghost_units:
            self._ghost_handles.append(m.register_forward_pre_hook(self._detach_params, with_kwargs=True))
            hook = partial(self._tap_output, path, handler.outside)
            self._ghost_handles.append(m.register_forward_hook(hook, with_kwargs=True, always_call=True))

    def remove_hooks(self) -> None:
        for h in getattr(self, "_ghost_handles", []):
            h.remove()
        self._ghost_handles = []
        for p in self._module.parameters():
            if ghost_owner(p) is self:
                delattr(p, "_dpn_ghost_owner")
        super().remove_hooks()

    @property
    def ghost_paths(self) -> list[str]:
        """The paths of the layers handled by ghost norms."""
        return [path for path, *_ in getattr(self, "_ghost_units", [])]

    @property
    def units(self) -> list[tuple[str, str]]:
        """``(path, how)``: ``"ghost"``, a sampler's name (materialised) or ``"torch.func"``."""
        return sorted([(p, "ghost") for p in self.ghost_paths] + super().units)

    def _forward(self, *args: Any, **kwargs: Any) -> Any:
        self._stale.check(holds_records=bool(self._ledger.pending), allow_accumulation=self._store.allow_accumulation)
        try:
            return super()._forward(*args, **kwargs)
        finally:
            for m, name, p in self._held:
                m._parameters[name] = p
            self._held = []

    def _detach_params(self, m: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        saved = {n: p for n, p in m._parameters.items() if p is not None and p.requires_grad}
        recording = self.hooks_enabled and torch.is_grad_enabled() and not capture_is_paused()
        if not recording or (saved and self._broadcast.batch_free_call(args, kwargs)):  # batch-free: meeting points
            saved = {}
        self._swapped.setdefault(id(m), []).append(saved)
        for n, p in saved.items():
            m._parameters[n] = cast(nn.Parameter, p.detach())  # a stand-in until _tap_output puts p back

    def _tap_output(
        self,
        path: str,
        outside: tuple[str, ...],
        m: nn.Module,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        output: Any,
    ) -> Any:
        saved = self._swapped[id(m)].pop()
        for name, p in saved.items():
            if name in outside and self._in_forward and output is not None:
                # used again later in the model's forward (an RNN's recurrence): kept detached until it
                # ends, so that autograd does not compute its gradient (the ghost group accounts for it)
                self._held.append((m, name, p))
            else:
                m._parameters[name] = p
        if not saved or output is None:  # not recording, or the forward raised
            return None
        if not isinstance(output, Tensor):
            raise GradSampleError(
                f"{path} ({type(m).__name__}) returned {type(output).__name__}, not a tensor; ghost mode cannot tap it."
            )
        bd = self._batch_dim(m)
        rows = output.shape[bd]
        self._check_rows(path, m, rows, bd)
        call = LayerCall(m, path, detach_tree(args), detach_tree(kwargs), [0], bd, rows, self._forward_id)
        record = GhostCall(call)
        versions = input_versions(call)
        if not self._ledger.pending:  # a new batch: remember the parameters' versions
            self._stale.new_batch()
        self._ledger.record(self._forward_id, m, record)
        store = self._store
        assert isinstance(store, GhostStore)  # add_hooks put it in place before any tap
        for p in saved.values():
            store.marks[id(p)] = grad_mark(p)
        accounted = [saved[n] for n in outside if n in saved]
        sink = partial(self._on_backprops, record, versions, accounted)
        if output.requires_grad:  # the input carries the graph: a hook on the output is enough
            output.register_hook(sink)
            return None
        return Tap.apply(output, sink, *saved.values())

    def _probe_layers(self) -> list[ProbeLayer]:
        """The hooks engine's units and the ghosted layers: every layer whose rows must be samples."""
        ghosted = [(path, m, self._batch_dim(m)) for path, m, _, _ in self._ghost_units]
        return ghosted + super()._probe_layers()

    def _batch_dim(self, m: nn.Module) -> int:
        return 0 if getattr(m, "_dpn_batch_first", False) or self.batch_first else 1

    def _on_backprops(
        self, record: GhostCall, versions: list[int], accounted: list[nn.Parameter], grad: Tensor
    ) -> None:
        call = record.call
        if record.released:
            raise second_backward_error(call, "ghost")
        if input_versions(call) != versions:
            raise GradSampleError(
                f"{call.path} ({type(call.module).__name__}): its input was modified in place after the layer "
                "used it, so ghost mode cannot compute its gradient norms. Avoid in-place operations on "
                "layer inputs (e.g. use ReLU(inplace=False) before this layer)."
            )
        g = to_batch_first(grad, call.batch_dim).detach()
        record.backprops = g if record.backprops is None else record.backprops + g
        record.scale = loss_scale(self.loss_reduction, call.rows) / self.K
        self._ledger.received(record)
        for p in accounted:  # used outside the layer by design (an RNN's recurrence): accounted for here
            self._store._sampled.add(id(p))

    def _sampled(self) -> tuple[MaterialisedGroup, list[tuple[int, int]]]:
        """The hooks engine's ``p.grad_sample``, aligned with the ghost records, and the passes' layout."""
        if self._hooks is None:
            params = [p for p in self._module.parameters() if p.requires_grad]
        else:  # only the hooks engine's units can hold grad_sample: no walk over the whole model
            params = [
                p for _, m, entry in self._hooks.units for p in m.parameters(recurse=entry is None) if p.requires_grad
            ]
            listed = {id(p) for p in params}
            params += [p for p in self._broadcast.captured.values() if p.requires_grad and id(p) not in listed]
        sampled = MaterialisedGroup({p: g for p in params if (g := grad_sample_rows(p)) is not None})
        blocks = {p: self._store.blocks(p) for p in sampled.grads}
        layout = self._ledger.layout(blocks, self._store._name)
        return self._ledger.align(sampled, blocks, layout), layout

    def num_samples(self) -> int:
        """The number of samples B in the batches seen since the last :meth:`zero_grad`."""
        return self._ledger.num_samples(self._sampled()[1])

    def sq_norms(self) -> Grads:
        """Every sample's squared gradient norm for each trainable parameter: ``{p: [B]}``."""
        return self._ledger.sq_norms(*self._sampled())

    def per_sample_norms(self) -> Tensor:
        """Every sample's total gradient norm (all parameters): shape ``[B]``."""
        norms = list(self.sq_norms().values())
        return torch.stack(norms).sum(0).sqrt() if norms else torch.zeros(self.num_samples())

    def weighted_sums(self, weights: Tensor | Grads, dropped: Tensor | None | Literal["find"] = "find") -> Grads:
        """``sum_b w_b * (sample b's gradient)`` per trainable parameter, for ``weights`` ``[B]`` or ``{p: [B]}``.

        ``dropped``: the samples whose weights are 0 or not finite, where the caller knows them (``None``:
        none); by default they are found here, at one read on the host.
        """
        return self._ledger.weighted_sums(weights, *self._sampled(), dropped)

    def strategies(self) -> dict[str, str]:
        """How each ghosted layer's norms are computed for the batch seen (after backward): ``{path: how}``.

        >>> model = GhostGradSampleModule(nn.Sequential(nn.Embedding(9, 4), nn.Linear(4, 2)))
        >>> model(torch.randint(0, 9, (3, 5))).sum().backward()
        >>> model.strategies()
        {'model.0': 'ghost indices', 'model.1': 'materialised (direct)'}
        """
        return self._ledger.strategies({m: path for path, m, *_ in self._ghost_units})

    def clear_ghost(self) -> None:
        """Forget the recorded activations and backprops (after their sums were taken)."""
        self._ledger.clear()
        self._stale.forget()

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear ``p.grad``, ``p.grad_sample`` and the recorded activations and backprops."""
        super().zero_grad(set_to_none=set_to_none)
        self.clear_ghost()

    def __repr__(self) -> str:
        return "Ghost" + super().__repr__()


def input_versions(call: LayerCall) -> list[int]:
    return [a._version for a in call.args if isinstance(a, Tensor)]


def ghost_owner(p: nn.Parameter) -> GhostGradSampleModule | None:
    """The ghost wrapper whose model holds ``p`` (``None`` if there is none)."""
    ref = getattr(p, "_dpn_ghost_owner", None)
    return ref() if ref is not None else None
