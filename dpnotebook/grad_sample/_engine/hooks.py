"""Hooks mode: ``GradSampleModule`` wraps a model so that ``loss.backward()`` also fills ``p.grad_sample``.

Also here: the arguments every wrapper checks alike (``K``, ``loss_reduction``), which layers become
*units* (one registered sampler each, or the ``torch.func`` fallback: :func:`plan_units`), and which
wrapper's hooks sit on a model. Two wrappers on one model would both add to ``p.grad_sample``,
silently doubling it, so wrapping a model that another live wrapper still hooks is refused;
``copy.deepcopy`` of a wrapped model copies its hooks too, so the oracle and the checker strip them
from their copies (:func:`strip_dpnotebook_hooks`).

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

import functools
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils._pytree import tree_flatten, tree_map

from dpnotebook.errors import GradSampleError
from dpnotebook.grad_sample._engine.accumulation import GradSampleStore
from dpnotebook.grad_sample._engine.broadcast import BroadcastTracker, smallest_holder
from dpnotebook.grad_sample._engine.calls import capture_is_paused, check_replay_chunk, count_rows
from dpnotebook.grad_sample._engine.layer_hooks import LayerHooks, outside_use
from dpnotebook.grad_sample._engine.provenance import ProbeLayer, probe_rows, probing
from dpnotebook.grad_sample._registry import GradSamplerView, SamplerEntry, find_grad_sampler
from dpnotebook.modes import register_mode
from dpnotebook.validation import Problem, raise_if_problems, validate


@register_mode("hooks")
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
    #: run the provenance probe (:mod:`~dpnotebook.grad_sample._engine.provenance`) until it has proven the rows
    probes_rows = True
    #: find where batch-free tensors meet the batch (:mod:`~dpnotebook.grad_sample._engine.broadcast`)
    tracks_broadcasts = True
    #: Opacus' name for the sampler registry, as a dict view (:class:`~dpnotebook.grad_sample._registry.GradSamplerView`)
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

        One tensor per backward pass, as in Opacus (:mod:`~dpnotebook.grad_sample._engine.accumulation`).
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

    def _discover(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
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

    def _prove_rows(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
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
        (:func:`~dpnotebook.grad_sample._engine.calls.count_rows` over the input tensors of
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


LOSS_REDUCTIONS = ("mean", "sum")


def check_k(K: Any) -> int:
    """Validate the augmentation multiplicity ``K``.

    >>> check_k(0)
    Traceback (most recent call last):
    ...
    ValueError: K=0 is invalid: K is the number of augmented copies of each sample and must be an int >= 1 (K=1 means no augmentation multiplicity).
    """
    if isinstance(K, bool) or not isinstance(K, int) or K < 1:
        raise ValueError(
            f"K={K!r} is invalid: K is the number of augmented copies of each sample and must be "
            "an int >= 1 (K=1 means no augmentation multiplicity)."
        )
    return K


def check_loss_reduction(loss_reduction: Any) -> str:
    """Validate ``loss_reduction``: how the user's loss combines the batch's rows.

    >>> check_loss_reduction("avg")
    Traceback (most recent call last):
    ...
    ValueError: loss_reduction='avg' is invalid; use one of ('mean', 'sum'): 'mean' if your loss averages over the batch's rows, 'sum' if it adds them up.
    """
    if loss_reduction not in LOSS_REDUCTIONS:
        raise ValueError(
            f"loss_reduction={loss_reduction!r} is invalid; use one of {LOSS_REDUCTIONS}: "
            "'mean' if your loss averages over the batch's rows, 'sum' if it adds them up."
        )
    return loss_reduction


def plan_units(
    module: nn.Module,
    *,
    force_functorch: bool = False,
    whole_model: bool = False,
    root: str = "model",
    containers: str = "torch.func",
    fallback_at: frozenset[int] = frozenset(),
) -> list[tuple[str, nn.Module, SamplerEntry | None]]:
    """Split ``module`` into units, each computed by one sampler or by the torch.func fallback.

    Walking from the root: a module with a registered sampler is a unit for its
    own parameters (its children are visited too); a module with parameters of
    its own but no sampler is a fallback unit for its whole subtree. A module
    with ``_dpn_grad_samples_from_children = True`` (``dpnotebook.layers.DPLSTM``)
    is skipped and its children are visited: they hold the same Parameter objects
    and their samplers compute the per-sample gradients (unless ``force_functorch``).
    A *container* (parameters of its own, no sampler, and child modules: a ViT
    holding a class token, a ConvNeXt block holding a layer scale) is a
    ``torch.func`` unit with ``containers="torch.func"``; with
    ``containers="broadcast"`` its children are visited and its own parameters
    are left to the meeting points of :mod:`~dpnotebook.grad_sample._engine.broadcast`,
    except for the modules in ``fallback_at`` (ids), which are ``torch.func``
    units whatever they hold (an unrecognised use found by the discovery).
    A module reachable by several paths (``self.a = nn.Sequential(shared, ...)``,
    ``self.b = nn.Sequential(shared, ...)``) is one unit, under its first path: its
    hook records every call, and the calls' gradients add up.

    Raises:
        GradSampleError: a module inside a ``torch.func`` unit's subtree is also
            reachable outside it (its gradients would be counted twice, or lost).

    >>> from torch import nn
    >>> [(p, e.name if e else "torch.func") for p, _, e in plan_units(nn.Sequential(nn.Linear(2, 2), nn.PReLU()))]
    [('model.0', 'linear_grad_sampler'), ('model.1', 'torch.func')]
    >>> import torch
    >>> holder = nn.Sequential(nn.Linear(2, 2))
    >>> holder.scale = nn.Parameter(torch.ones(2))
    >>> [(p, e.name if e else "torch.func") for p, _, e in plan_units(holder)]
    [('model', 'torch.func')]
    >>> [(p, e.name if e else "torch.func") for p, _, e in plan_units(holder, containers="broadcast")]
    [('model.0', 'linear_grad_sampler')]
    """
    if whole_model:
        return [(root, module, None)]
    units: list[tuple[str, nn.Module, SamplerEntry | None]] = []
    seen: dict[int, str] = {}

    def visit(path: str, m: nn.Module) -> None:
        if id(m) in seen:
            return
        seen[id(m)] = path
        entry = None if force_functorch else find_grad_sampler(m)
        has_own = any(True for _ in m.parameters(recurse=False))
        if entry is None and not force_functorch and getattr(m, "_dpn_grad_samples_from_children", False):
            has_own = False  # e.g. DPLSTM: submodules that share its parameters compute their grad_sample
        container = has_own and containers == "broadcast" and any(True for _ in m.children())
        if id(m) in fallback_at:
            entry, has_own, container = None, True, False
        if entry is not None and has_own:
            units.append((path, m, entry))
        elif has_own and not container:
            units.append((path, m, None))
            for name, sub in m.named_modules(prefix=path):
                if sub is not m and seen.setdefault(id(sub), name) != name:
                    _refuse_shared_into_fallback(path, name, seen[id(sub)])
            return
        for name, child in m.named_children():
            visit(f"{path}.{name}", child)

    visit(root, module)
    for path, m, entry in units:
        if entry is None:
            for name, sub in m.named_modules(prefix=path):
                if sub is not m and seen[id(sub)] != name:
                    _refuse_shared_into_fallback(path, name, seen[id(sub)])
    return units


def _refuse_shared_into_fallback(unit: str, inside: str, outside: str) -> None:
    raise GradSampleError(
        f"{inside} is also reachable as {outside}, outside {unit}, whose per-sample gradients come from "
        "the torch.func fallback (it has parameters of its own and no grad sampler): its gradients would be "
        f"counted twice or lost. Register a grad sampler for {unit} (dpnotebook.register_grad_sampler), "
        "do not share the module, or use grad_sample_mode='functorch'."
    )


def _owner_of(hook: Any) -> Any:
    """The GradSampleModule behind a forward hook installed by dpnotebook, else None."""
    fn = hook.func if isinstance(hook, functools.partial) else hook
    hooks = getattr(fn, "__self__", None)
    return getattr(hooks, "owner", None) if type(hooks).__name__ == "LayerHooks" else None


def wrapper_hooking(module: nn.Module) -> tuple[str, Any] | None:
    """``(submodule path, wrapper)`` of the first dpnotebook hook found in ``module``, or None."""
    for name, sub in module.named_modules():
        for hook in sub._forward_hooks.values():
            owner = _owner_of(hook)
            if owner is not None:
                return name, owner
    return None


def check_not_wrapped(module: nn.Module, root: str = "model") -> None:
    """Raise if another dpnotebook wrapper still has hooks on ``module``."""
    found = wrapper_hooking(module)
    if found is not None:
        path = f"{root}.{found[0]}" if found[0] else root
        raise ValueError(
            f"{path} already has hooks of another {type(found[1]).__name__} (K={found[1].K}); a second "
            "wrapper would count every gradient twice. Call .to_standard_module() on the first wrapper, "
            "or, to see how a model would be split without wrapping it, use "
            "dpnotebook.grad_sample.plan_units(model)."
        )


def strip_dpnotebook_hooks(module: nn.Module) -> nn.Module:
    """Remove every dpnotebook hook from ``module`` (a copy, typically) and return it."""
    for sub in module.modules():
        for key in [k for k, h in sub._forward_hooks.items() if _owner_of(h) is not None]:
            del sub._forward_hooks[key]
            sub._forward_hooks_with_kwargs.pop(key, None)
    for p in module.parameters():
        hooks = getattr(p, "_post_accumulate_grad_hooks", None) or {}
        for key in [k for k, h in hooks.items() if type(getattr(h, "__self__", None)).__name__ == "GradSampleStore"]:
            del hooks[key]
        if hasattr(p, "grad_sample"):
            del p.grad_sample
    return module
