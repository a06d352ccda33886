"""Hooks mode: ``GradSampleModule`` wraps a model so that ``loss.backward()`` also fills ``p.grad_sample``.

Also here: the base every wrapper shares (:class:`ModelWrapper`, with the checks of ``K`` and
``loss_reduction``), which layers become *units* (:func:`plan_units`), and the refusal of a second
wrapper on a model another live wrapper still hooks (both would add to ``p.grad_sample``).

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
from dpnotebook.grad_sample._engine.provenance import ProbeLayer, probing, prove_rows
from dpnotebook.grad_sample._registry import GradSamplerView, SamplerEntry, find_grad_sampler
from dpnotebook.modes import register_mode
from dpnotebook.validation import Problem, raise_if_problems, validate

LOSS_REDUCTIONS = ("mean", "sum")


def check_k(K: Any) -> int:
    """Validate the augmentation multiplicity ``K``.

    >>> check_k(0)
    Traceback (most recent call last):
    ...
    ValueError: K=0 is invalid: K is the number of augmented copies of each sample and must be an int >= 1 ...
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
    ValueError: loss_reduction='avg' is invalid; use one of ('mean', 'sum'): 'mean' if your loss averages ...
    """
    if loss_reduction not in LOSS_REDUCTIONS:
        raise ValueError(
            f"loss_reduction={loss_reduction!r} is invalid; use one of {LOSS_REDUCTIONS}: "
            "'mean' if your loss averages over the batch's rows, 'sum' if it adds them up."
        )
    return loss_reduction


class ModelWrapper(nn.Module):
    """The base of every mode's wrapper: holds ``module`` as ``_module`` and checks the arguments they share.

    ``zero_grad`` clears ``p.grad_sample`` too; unknown attributes pass through to the model.

    Raises:
        TypeError: ``module`` is not an ``nn.Module``.
        ValueError: a bad ``K``, ``loss_reduction`` or ``batch_first``.
        UnsupportedModuleError: ``strict`` and the model holds layers that mix samples.
    """

    grad_sample_mode: str  # which checks of dpnotebook.validate apply

    def __init__(
        self, module: nn.Module, *, batch_first: bool = True, loss_reduction: str = "mean", strict: bool, K: int = 1
    ) -> None:
        if not isinstance(module, nn.Module):
            raise TypeError(f"module must be an nn.Module, got {type(module).__name__}.")
        check_loss_reduction(loss_reduction)
        if not isinstance(batch_first, bool):
            raise ValueError(f"batch_first={batch_first!r} is invalid; use True or False.")
        K = check_k(K)
        if strict:
            raise_if_problems(self.validate(module))
        super().__init__()
        self._module = module
        self.batch_first = batch_first
        self.loss_reduction = loss_reduction
        self.K = K
        self.hooks_enabled = True
        self.allow_accumulation = True

    @classmethod
    def validate(cls, module: nn.Module, *, strict: bool = False) -> list[Problem]:
        """Problems that stop per-sample gradients in this mode; raise them all at once if ``strict``."""
        problems = validate(module, mode=cls.grad_sample_mode)
        if strict:
            raise_if_problems(problems)
        return problems

    @classmethod
    def is_supported(cls, module: nn.Module) -> bool:
        """``True`` when :meth:`validate` finds no problem."""
        return not cls.validate(module, strict=False)

    def disable_hooks(self) -> None:
        """Keep the hooks but record nothing (plain PyTorch behaviour) until :meth:`enable_hooks`."""
        self.hooks_enabled = False

    def enable_hooks(self) -> None:
        """Record per-sample gradients again."""
        self.hooks_enabled = True

    def allow_grad_accumulation(self) -> None:
        """A second forward/backward before ``zero_grad`` adds its samples: ``grad_sample`` becomes a list."""
        self.allow_accumulation = True

    def forbid_grad_accumulation(self) -> None:
        """A second forward/backward before ``zero_grad`` raises instead."""
        self.allow_accumulation = False

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear ``p.grad`` (as ``nn.Module.zero_grad``) and ``p.grad_sample``."""
        super().zero_grad(set_to_none=set_to_none)
        for p in self._module.parameters():
            setattr(p, "grad_sample", None)  # noqa: B010 - torch's Parameter does not declare grad_sample

    def to_standard_module(self) -> nn.Module:
        """The model, with every ``grad_sample`` removed."""
        for p in self._module.parameters():
            if hasattr(p, "grad_sample"):
                del p.grad_sample
        return self._module

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(super().__getattr__("_module"), name)


@register_mode("hooks")
class GradSampleModule(ModelWrapper):
    """Wraps ``module``; after ``loss.backward()`` every trainable ``p`` has ``p.grad_sample``.

    The input holds ``B*K`` rows, sample-major (rows ``i*K .. i*K+K-1`` are the ``K`` augmented
    copies of sample ``i``). Then ``p.grad_sample`` has shape ``[B, *p.shape]`` and
    ``p.grad_sample[i]`` is the mean over the ``K`` copies of the gradient of each copy's own loss.
    ``p.grad`` is left exactly as PyTorch computes it.

    Args:
        module: the model to wrap (not copied; :meth:`to_standard_module` gives it back unchanged).
        batch_first: rows are in dim 0 (``True``) or dim 1 (``False``: ``[T, B*K, ...]``).
        loss_reduction: how the loss over all ``B*K`` rows was reduced, ``"mean"`` or ``"sum"``.
        strict: refuse models with layers that mix samples (see :func:`dpnotebook.validate`).
        force_functorch: use the ``torch.func`` fallback for every layer.
        K: augmentation multiplicity, an int >= 1.
        replay_chunk: samples a ``torch.func`` replay takes at once: ``"auto"`` (at most ``B`` rows
            whatever ``K``), ``None`` (all at once: faster, memory grows with ``K``) or an int.

    Raises:
        UnsupportedModuleError: ``strict`` and the model holds layers that mix samples.
        ValueError: a bad ``K``, ``loss_reduction``, ``batch_first`` or ``replay_chunk``.
    """

    grad_sample_mode = "hooks"
    probes_rows = True  # run the provenance probe until it has proven the rows
    tracks_broadcasts = True  # find where batch-free tensors meet the batch (broadcast.py)
    #: the sampler registry as a dict view (:class:`~dpnotebook.grad_sample._registry.GradSamplerView`)
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
        replay_chunk = check_replay_chunk(replay_chunk)
        super().__init__(module, batch_first=batch_first, loss_reduction=loss_reduction, strict=strict, K=K)
        self.force_functorch = force_functorch
        self.replay_chunk = replay_chunk
        self._forward_id = 0
        self._rows_seen: tuple[str, int] | None = None
        self._rows_input: int | None = None
        self._in_forward = False
        self._rows_proof: str | None = None  # what the provenance probe has shown so far
        self._store = GradSampleStore(self)
        self._hooks: LayerHooks | None = None
        self._broadcast = BroadcastTracker(self)
        self.add_hooks()

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

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear ``p.grad`` (as ``nn.Module.zero_grad``) and ``p.grad_sample``."""
        super().zero_grad(set_to_none=set_to_none)
        self._store.clear()

    def to_standard_module(self) -> nn.Module:
        """Remove hooks and ``grad_sample`` attributes and return the original module."""
        self.remove_hooks()
        self._store.clear()
        return super().to_standard_module()

    @property
    def units(self) -> list[tuple[str, str]]:
        """``(path, how)`` for each unit: the sampler's name, ``"torch.func"`` or ``"broadcast"``."""
        plan = self._hooks.units if self._hooks is not None else self._plan()
        captured = self._broadcast.captured
        broadcast = [(n, "broadcast") for n, p in self._module.named_parameters(prefix="model") if id(p) in captured]
        return [(p, e.name if e is not None else "torch.func") for p, _, e in plan] + broadcast

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
        if self._rows_proof != "proven" and self.probes_rows and recording:
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
        """Run the model once with the tracker: find where batch-free parameters meet the batch, and make
        the smallest module holding an unrecognised meeting a ``torch.func`` unit."""
        tracker = self._broadcast
        tracker.discovered = True
        if self._rows_input is None:  # nothing holds the batch where the tracker can see it
            tracker.containers_fallback = any(
                any(p.requires_grad for p in m.parameters(recurse=False)) and any(True for _ in m.children())
                for m in self._module.modules()
            )
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
        if self._rows_input is not None:  # on where something meets the batch, or may (a container's parameter)
            in_units = {id(p) for m in self._unit_modules() for p in m.parameters()}
            free = any(p.requires_grad and id(p) not in in_units for p in self._module.parameters())
            tracker.enabled = bool(tracker.sites or tracker.batch_free_units or free)

    def _prove_rows(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        found = prove_rows(
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
        p = outside_use([output] if isinstance(output, Tensor) else tree_flatten(output)[0], watched)
        if p is not None:
            name = next((n for n, q in self._module.named_parameters() if q is p), "a parameter")
            raise GradSampleError(
                f"parameter {name!r} is used in the forward pass outside the layer that holds it (e.g. "
                "F.linear(x, self.fc.weight) in a parent): its layer's grad sampler would miss that part of each "
                "sample's gradient. Call the layer itself (self.fc(x)) wherever it is used, register a grad sampler "
                "for the parent, freeze the parameter, or use grad_sample_mode='functorch'."
            )

    def _forward(self, *args: Any, **kwargs: Any) -> Any:
        if self._hooks is not None:
            self._store.watch()
        return self._module(*args, **kwargs)

    def _check_rows(self, path: str, module: nn.Module, rows: int, bd: int) -> None:
        """Check the ``rows`` a layer sees in its batch dim ``bd`` during the wrapper's forward.

        They must be a multiple of ``K`` and equal to the rows of the forward's input (when it has
        none, those of the first layer); a layer called outside the wrapper's forward is refused.
        """
        where = f"{path} ({type(module).__name__})"
        if not self._in_forward:
            raise GradSampleError(
                f"{where} ran with gradients enabled outside the {type(self).__name__}'s forward (e.g. "
                "wrapped._module(x)): its per-sample gradients would be added to another pass's rows. Call the "
                "wrapper, model(x); or run it under torch.no_grad(), or use .to_standard_module()."
            )
        if rows % self.K:
            raise ValueError(
                f"{path} has {rows} rows in dim {bd}, which K={self.K} does not divide. A batch holds B*K "
                "rows, K augmented copies of each sample, sample-major: pass B*K rows, or the right K."
            )
        expected, seen = self._rows_input, self._rows_seen
        if expected is not None and rows != expected:
            other = (
                f"the model's input carries {expected} rows in dim {int(not self.batch_first)} "
                f"(batch_first={self.batch_first}, K={self.K})"
            )
        elif seen is not None and seen[1] != rows:
            other = f"{seen[0]} saw {seen[1]}"
        else:
            self._rows_seen = seen or (path, rows)
            return
        bf = self.batch_first
        raise GradSampleError(
            f"{where} sees {rows} rows in dim {bd} but {other}: its per-sample gradients would not be per "
            f"sample. Either the batch dimension is not where batch_first={bf} says (use batch_first={not bf}, "
            "set _dpn_batch_first = True on a layer that takes its input batch-first, or permute inside the "
            "model), or this layer runs on something shared by all samples, such as a position table looked "
            "up with arange(T): look it up per row (arange(T).expand(B, T)) or use grad_sample_mode='functorch'."
        )

    def __repr__(self) -> str:
        return (
            f"GradSampleModule(K={self.K}, loss_reduction={self.loss_reduction!r}, batch_first={self.batch_first},"
            f"\n  {self._module!r})"
        )


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

    A module with a registered sampler is a unit for its own parameters (its children are visited
    too); one with parameters of its own but no sampler is a fallback unit for its whole subtree,
    except a *container* (it also has children) with ``containers="broadcast"``: its children are
    visited and its own parameters left to :mod:`~dpnotebook.grad_sample._engine.broadcast`. The
    modules in ``fallback_at`` (ids) are fallback units whatever they hold. A module with
    ``_dpn_grad_samples_from_children = True`` (``DPLSTM``) leaves its parameters to its children.
    A module reachable by several paths is one unit, under its first path.

    Raises:
        GradSampleError: a module inside a fallback unit is also reachable outside it.

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
            has_own = False
        container = has_own and containers == "broadcast" and any(True for _ in m.children())
        if id(m) in fallback_at:
            entry, has_own, container = None, True, False
        if entry is not None and has_own:
            units.append((path, m, entry))
        elif has_own and not container:
            units.append((path, m, None))
            for name, sub in m.named_modules(prefix=path):
                if sub is not m:
                    seen.setdefault(id(sub), name)
            return
        for name, child in m.named_children():
            visit(f"{path}.{name}", child)

    visit(root, module)
    for path, m, entry in units:
        for name, sub in m.named_modules(prefix=path) if entry is None else ():
            if sub is not m and seen[id(sub)] != name:
                raise GradSampleError(
                    f"{name} is also reachable as {seen[id(sub)]}, outside {path}, whose per-sample gradients come "
                    "from the torch.func fallback: its gradients would be counted twice or lost. Register a grad "
                    f"sampler for {path} (dpnotebook.register_grad_sampler), do not share the module, or use "
                    "grad_sample_mode='functorch'."
                )
    return units


def _owner_of(hook: Any) -> Any:
    """The wrapper behind a forward hook installed by dpnotebook (its ``LayerHooks``, ghost taps), else None."""
    owner: Any = getattr(hook.func if isinstance(hook, functools.partial) else hook, "__self__", None)
    owner = getattr(owner, "owner", None) if type(owner).__name__ == "LayerHooks" else owner
    return owner if isinstance(owner, ModelWrapper) else None


def wrapper_hooking(module: nn.Module) -> tuple[str, Any] | None:
    """``(submodule path, wrapper)`` of the first dpnotebook hook found in ``module``, or None."""
    for name, sub in module.named_modules():
        for hook in sub._forward_hooks.values():
            if _owner_of(hook) is not None:
                return name, _owner_of(hook)
    return None


def check_not_wrapped(module: nn.Module, root: str = "model") -> None:
    """Raise if another dpnotebook wrapper still has hooks on ``module``."""
    found = wrapper_hooking(module)
    if found is not None:
        path = f"{root}.{found[0]}" if found[0] else root
        raise ValueError(
            f"{path} already has hooks of another {type(found[1]).__name__} "
            f"(K={found[1].K}); a second wrapper would count every gradient twice. Call .to_standard_module() on "
            "the first wrapper, or use dpnotebook.grad_sample.plan_units(model) to see the split without wrapping."
        )


def strip_dpnotebook_hooks(module: nn.Module) -> nn.Module:
    """Remove every dpnotebook hook (forward, pre-forward) from ``module`` (a ``copy.deepcopy`` of a wrapped model)."""
    for sub in module.modules():
        pre = (sub._forward_pre_hooks, sub._forward_pre_hooks_with_kwargs)
        for hooks, with_kwargs in ((sub._forward_hooks, sub._forward_hooks_with_kwargs), pre):
            for key in [k for k, h in hooks.items() if _owner_of(h) is not None]:
                del hooks[key]
                with_kwargs.pop(key, None)
    for p in module.parameters():
        hooks = getattr(p, "_post_accumulate_grad_hooks", None) or {}
        for key in [k for k, h in hooks.items() if type(getattr(h, "__self__", None)).__name__ == "GradSampleStore"]:
            del hooks[key]
        if hasattr(p, "grad_sample"):
            del p.grad_sample
    return module
