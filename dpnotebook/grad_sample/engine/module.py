"""``GradSampleModule``: wrap a model so that ``loss.backward()`` also fills ``p.grad_sample``.

>>> import torch
>>> from torch import nn
>>> from dpnotebook import GradSampleModule
>>> model = GradSampleModule(nn.Linear(3, 2), K=2)
>>> x = torch.randn(4, 3)                    # B=2 samples, K=2 copies each, sample-major
>>> model(x).sum().backward()
>>> model.weight.grad_sample.shape           # one gradient per sample, not per row
torch.Size([2, 2, 3])
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from torch.utils._pytree import tree_flatten, tree_map

from dpnotebook.errors import GradSampleError
from dpnotebook.grad_sample.engine.accumulation import GradSampleStore
from dpnotebook.grad_sample.engine.batch_rows import count_rows
from dpnotebook.grad_sample.engine.broadcast import BroadcastTracker, smallest_holder
from dpnotebook.grad_sample.engine.functorch_fallback import capture_is_paused, check_replay_chunk
from dpnotebook.grad_sample.engine.hooks import LayerHooks
from dpnotebook.grad_sample.engine.outside_use import outside_use
from dpnotebook.grad_sample.engine.ownership import check_not_wrapped
from dpnotebook.grad_sample.engine.provenance import ProbeLayer, probe_rows, probing
from dpnotebook.grad_sample.engine.registry import GradSamplerView, SamplerEntry
from dpnotebook.grad_sample.engine.units import plan_units
from dpnotebook.grad_sample.engine.wrap_arguments import LOSS_REDUCTIONS, check_k, check_loss_reduction
from dpnotebook.validation import Problem, raise_if_problems, validate


class GradSampleModule(nn.Module):
    """Wraps ``module``; after ``loss.backward()`` every trainable ``p`` has ``p.grad_sample``.

    The input holds ``B*K`` rows, sample-major (rows ``i*K .. i*K+K-1`` are the
    ``K`` augmented copies of sample ``i``). Then ``p.grad_sample`` has shape
    ``[B, *p.shape]`` and ``p.grad_sample[i]`` is the mean over the ``K`` copies
    of the gradient of each copy's own loss. ``p.grad`` is left exactly as
    PyTorch computes it.

    Args:
        module: the model to wrap. It is not copied; :meth:`to_standard_module`
            gives it back unchanged.
        batch_first: rows are in dim 0 (``True``) or dim 1 (``False``: ``[T, B*K, ...]``).
        loss_reduction: how the loss over all ``B*K`` rows was reduced,
            ``"mean"`` or ``"sum"``; the module undoes it.
        strict: refuse models with layers that mix samples (see :func:`dpnotebook.validate`).
        force_functorch: use the ``torch.func`` fallback for every layer.
        K: augmentation multiplicity, an int >= 1.
        replay_chunk: for layers whose per-sample gradients come from replaying
            them under ``torch.func`` (every layer in ``"functorch"`` mode), how
            many samples are replayed at once: ``"auto"`` keeps the replay to at
            most ``B`` rows whatever ``K``; ``None`` replays all samples at once
            (faster on models of many small operations, but the replay's memory
            grows with ``K``); an int sets the number of samples.

    Raises:
        UnsupportedModuleError: ``strict`` and the model holds layers that mix samples.
        ValueError: a bad ``K``, ``loss_reduction``, ``batch_first`` or ``replay_chunk``.
    """

    grad_sample_mode = "hooks"  # which checks of dpnotebook.validate apply
    #: run the provenance probe (:mod:`~dpnotebook.grad_sample.engine.provenance`) until it has proven the rows
    probes_rows = True
    #: find where batch-free tensors meet the batch (:mod:`~dpnotebook.grad_sample.engine.broadcast`)
    tracks_broadcasts = True
    #: Opacus' name for the sampler registry, as a dict view (:class:`~dpnotebook.grad_sample.engine.registry.GradSamplerView`)
    GRAD_SAMPLERS = GradSamplerView()

    def __init__(
        self,
        module: nn.Module,
        *,
        batch_first: bool = True,
        loss_reduction: str = "mean",
        strict: bool = True,
        force_functorch: bool = False,
        K: int = 1,
        replay_chunk: int | str | None = "auto",
    ) -> None:
        if not isinstance(module, nn.Module):
            raise TypeError(f"module must be an nn.Module, got {type(module).__name__}.")
        check_loss_reduction(loss_reduction)
        if not isinstance(batch_first, bool):
            raise ValueError(f"batch_first={batch_first!r} is invalid; use True or False.")
        K = check_k(K)
        replay_chunk = check_replay_chunk(replay_chunk)
        if strict:
            raise_if_problems(self.validate(module, strict=False))
        super().__init__()
        self._module = module
        self.batch_first = batch_first
        self.loss_reduction = loss_reduction
        self.force_functorch = force_functorch
        self.K = K
        self.replay_chunk = replay_chunk
        self.hooks_enabled = True
        self._forward_id = 0
        self._rows_seen: tuple[str, int] | None = None
        self._rows_input: int | None = None
        self._in_forward = False
        self._rows_proof: str | None = None  # what the provenance probe has shown so far
        self._store = GradSampleStore(self)
        self._hooks: LayerHooks | None = None
        self._broadcast = BroadcastTracker(self)
        self.add_hooks()

    # -- what users of the Opacus API know ---------------------------------
    @classmethod
    def validate(cls, module: nn.Module, *, strict: bool = False) -> list[Problem]:
        """Problems that stop per-sample gradients; raise them all at once if ``strict``."""
        problems = validate(module, mode=cls.grad_sample_mode)
        if strict:
            raise_if_problems(problems)
        return problems

    @classmethod
    def is_supported(cls, module: nn.Module) -> bool:
        """``True`` when :meth:`validate` finds no problem."""
        return not cls.validate(module, strict=False)

    def _all_units(self) -> list[tuple[str, nn.Module, SamplerEntry | None]]:
        """Every unit: containers' own parameters left to the meeting points (see :mod:`.broadcast`)."""
        tracker = self._broadcast
        return plan_units(
            self._module,
            force_functorch=self.force_functorch,
            containers="torch.func" if self.force_functorch or tracker.containers_fallback else "broadcast",
            fallback_at=frozenset(tracker.fallback_at),
        )

    def _plan(self) -> list[tuple[str, nn.Module, SamplerEntry | None]]:
        return self._all_units()

    def _unit_modules(self) -> list[nn.Module]:
        """The modules whose ops are their own units' business (the tracker does not look inside them)."""
        return [m for _, m, _ in self._hooks.units] if self._hooks is not None else []

    def add_hooks(self) -> None:
        """Install the hooks (done by the constructor)."""
        if self._hooks is None:
            check_not_wrapped(self._module)
            self._hooks = LayerHooks(self._plan(), self)
            self._store.watch()

    def remove_hooks(self) -> None:
        """Remove every hook this wrapper installed."""
        if self._hooks is not None:
            self._hooks.remove()
            self._hooks = None
        self._broadcast.remove()
        self._store.unwatch()

    def disable_hooks(self) -> None:
        """Keep the hooks but record nothing (plain PyTorch behaviour) until :meth:`enable_hooks`."""
        self.hooks_enabled = False

    def enable_hooks(self) -> None:
        self.hooks_enabled = True

    def allow_grad_accumulation(self) -> None:
        """A second forward/backward before ``zero_grad`` adds its samples: ``grad_sample`` becomes a list.

        One tensor per backward pass, as in Opacus (:mod:`~dpnotebook.grad_sample.engine.accumulation`).
        """
        self._store.allow_accumulation = True

    def forbid_grad_accumulation(self) -> None:
        """A second forward/backward before ``zero_grad`` raises instead."""
        self._store.allow_accumulation = False

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear ``p.grad`` (as ``nn.Module.zero_grad``) and ``p.grad_sample``."""
        super().zero_grad(set_to_none=set_to_none)
        self._store.clear()

    def to_standard_module(self) -> nn.Module:
        """Remove hooks and ``grad_sample`` attributes and return the original module."""
        self.remove_hooks()
        self._store.clear(delete=True)
        return self._module

    @property
    def units(self) -> list[tuple[str, str]]:
        """``(path, how)`` for each unit: the sampler's name or ``"torch.func"``."""
        plan = self._hooks.units if self._hooks is not None else self._plan()
        captured = self._broadcast.captured
        broadcast = [(n, "broadcast") for n, p in self._module.named_parameters(prefix="model") if id(p) in captured]
        return [(p, e.name if e is not None else "torch.func") for p, _, e in plan] + broadcast

    # -- the forward pass ----------------------------------------------------
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        self._forward_id += 1
        self._rows_seen = None
        first = args[0] if args else None
        if isinstance(first, Tensor) and first.dim() > 1:  # the usual call, counted cheaply
            self._rows_input = first.shape[0 if self.batch_first else 1]
        else:  # a 1-d input may be an EmbeddingBag's flat indices: not counted
            self._rows_input = count_rows(args, kwargs, batch_first=self.batch_first, min_dim=2)
        tracker = self._broadcast
        recording = (
            self._hooks is not None and self.hooks_enabled and torch.is_grad_enabled() and not capture_is_paused()
        )
        if not tracker.discovered and recording and self.tracks_broadcasts:
            self._discover(args, kwargs)
        if self._rows_proof != "proven" and self.probes_rows:
            self._prove_rows(args, kwargs)
        self._in_forward = True
        try:
            if tracker.enabled and recording:
                with tracker.tracking(args, kwargs, self._unit_modules()):
                    output = self._forward(*args, **kwargs)
            else:
                output = self._forward(*args, **kwargs)
        finally:
            self._in_forward = False
        if self._hooks is not None and self._hooks.watched and self.hooks_enabled and torch.is_grad_enabled():
            self._refuse_outside_use(output, self._hooks.watched)
        return output

    def _discover(self, args: tuple, kwargs: dict) -> None:
        """Run the model once with the tracker (see :mod:`.broadcast`): find where batch-free parameters meet
        the batch, make the smallest module holding an unrecognised meeting a ``torch.func`` unit."""
        tracker = self._broadcast
        tracker.discovered = True
        containers = any(
            any(p.requires_grad for p in m.parameters(recurse=False)) and any(True for _ in m.children())
            for m in self._module.modules()
        )
        if self._rows_input is None:  # nothing holds the batch where the tracker can see it: as before
            tracker.containers_fallback = containers
        else:
            a, kw = tree_map(lambda x: x.clone() if isinstance(x, Tensor) else x, (args, kwargs))
            tracker.discovering = True
            try:
                with probing(self._module), torch.no_grad(), tracker.tracking(a, kw, self._unit_modules()):
                    self._module(*a, **kw)
            finally:
                tracker.discovering = False
            modules = dict(self._module.named_modules(prefix="model"))
            for where, _, params in tracker.bad:
                tracker.fallback_at.add(id(modules[smallest_holder(where, params)]))
        if tracker.fallback_at or tracker.containers_fallback or tracker.mixed_units:
            self.remove_hooks()
            self.add_hooks()
        if self._rows_input is not None:  # on from now on where something meets the batch, or may (a container's)
            in_units = {id(p) for m in self._unit_modules() for p in m.parameters()}
            free = any(p.requires_grad and id(p) not in in_units for p in self._module.parameters())
            tracker.enabled = bool(tracker.sites or tracker.batch_free_units or free)

    def _prove_rows(self, args: tuple, kwargs: dict) -> None:
        """Run the provenance probe on this batch, on a forward pass with gradients, until it has proven the rows."""
        if self._hooks is None or not self.hooks_enabled or not torch.is_grad_enabled() or capture_is_paused():
            return
        found = probe_rows(
            self._module,
            self._probe_layers(),
            args,
            kwargs,
            K=self.K,
            batch_dim=0 if self.batch_first else 1,
            backward_proven=self._rows_proof == "backward only",
            tracker=self._broadcast if self._broadcast.enabled else None,
            units=self._unit_modules(),
        )
        if found != "nothing to prove":
            self._rows_proof = found

    def _probe_layers(self) -> list[ProbeLayer]:
        """``(path, module, batch dim)`` of every unit whose rows the probe must prove to be samples."""
        assert self._hooks is not None  # only called with the hooks installed
        return [
            (path, m, self._hooks._batch_dim(m, entry))
            for path, m, entry in self._hooks.units
            if any(p.requires_grad for p in m.parameters(recurse=entry is None))
        ]

    def _refuse_outside_use(self, output: Any, watched: dict[int, nn.Parameter]) -> None:
        """Raise if a sampled layer's parameter is also used outside that layer (see :mod:`.outside_use`)."""
        leaves = [output] if isinstance(output, Tensor) else tree_flatten(output)[0]
        p = outside_use(leaves, watched)
        if p is not None:
            name = next((n for n, q in self._module.named_parameters() if q is p), "a parameter")
            raise GradSampleError(
                f"parameter {name!r} is used in the forward pass outside the layer that holds it (e.g. "
                "F.linear(x, self.fc.weight) in a parent, or self.fc.weight * s): the layer's grad sampler "
                "only sees its own forward, so that part of each sample's gradient would be lost. Call the "
                "layer itself (self.fc(x)) wherever the parameter is used, give the parent a grad sampler "
                "(dpnotebook.register_grad_sampler), freeze the parameter (requires_grad=False), or use "
                "grad_sample_mode='functorch'."
            )

    def _forward(self, *args: Any, **kwargs: Any) -> Any:
        if self._hooks is not None:
            self._store.watch()
        return self._module(*args, **kwargs)

    def _check_rows(self, path: str, module: nn.Module, rows: int, bd: int) -> None:
        """Check the ``rows`` a layer sees in its batch dim ``bd`` during the wrapper's forward.

        They must be a multiple of ``K`` and equal to the rows of the forward's input
        (:func:`~dpnotebook.grad_sample.engine.batch_rows.count_rows` over the input tensors of
        2 dims or more); when the input has none with a batch dim (a 1-d input, no tensor
        at all), every layer must see as many rows as the first one.
        A layer called outside the wrapper's forward (``wrapped._module(x)``, the original
        model kept by the user) is refused: its rows would be merged with another pass's.
        """
        if not self._in_forward:
            raise GradSampleError(
                f"{path} ({type(module).__name__}) ran with gradients enabled outside the "
                f"{type(self).__name__}'s forward (the wrapped model or one of its layers was called "
                "directly, e.g. wrapped._module(x) or a reference to the original model): its per-sample "
                "gradients would be added to another forward pass's rows. Call the wrapper, model(x); "
                "or run it under torch.no_grad(), or call .to_standard_module() to get the plain model back."
            )
        if rows % self.K:
            raise ValueError(
                f"{path} has {rows} rows in dim {bd}, which K={self.K} does not divide. A batch "
                f"holds B*K rows: K augmented copies of each of B samples, sample-major. Pass "
                f"B*K rows, or the right K."
            )
        expected, ibd = self._rows_input, 0 if self.batch_first else 1
        if expected is not None and rows != expected:
            raise GradSampleError(
                f"{path} ({type(module).__name__}) sees {rows} rows in dim {bd} but the model's input carries "
                f"{expected} rows in dim {ibd} (batch_first={self.batch_first}, K={self.K}): its per-sample "
                "gradients would not be per sample (a model that runs time-major inside, e.g. emb(idx.t()), "
                "gives its layers T rows). Either the batch dimension is not where "
                f"batch_first={self.batch_first} says (use batch_first={not self.batch_first} with inputs "
                f"{'[T, B*K, ...]' if self.batch_first else '[B*K, ...]'}, set _dpn_batch_first = True on a "
                f"layer that takes its input batch-first, or permute inside the model so that every layer "
                f"sees the batch in dim {ibd}), or this layer runs on something shared by all samples, such as "
                "a position table looked up with arange(T): look it up per row (arange(T).expand(B, T)) or "
                "use grad_sample_mode='functorch'."
            )
        if self._rows_seen is None:
            self._rows_seen = (path, rows)
        elif self._rows_seen[1] != rows:
            raise GradSampleError(
                f"{path} ({type(module).__name__}) sees {rows} rows in dim {bd} but "
                f"{self._rows_seen[0]} saw {self._rows_seen[1]}. Either the batch dimension is not "
                f"where batch_first={self.batch_first} says (use batch_first={not self.batch_first} or "
                "permute the input), or this layer runs on something shared by all samples, such "
                "as a position table looked up with arange(T): look it up per row "
                "(arange(T).expand(B, T)) or use grad_sample_mode='functorch'."
            )

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(super().__getattr__("_module"), name)

    def __repr__(self) -> str:
        return f"GradSampleModule(K={self.K}, loss_reduction={self.loss_reduction!r}, batch_first={self.batch_first},\n  {self._module!r})"


__all__ = ["GradSampleModule", "plan_units", "check_k", "check_loss_reduction", "LOSS_REDUCTIONS"]
