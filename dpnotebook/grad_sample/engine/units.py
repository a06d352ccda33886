"""Which layers of a model become *units*: one registered sampler each, or the ``torch.func`` fallback."""

from __future__ import annotations

from torch import nn

from dpnotebook.errors import GradSampleError
from dpnotebook.grad_sample.engine.registry import SamplerEntry, find_grad_sampler


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
    are left to the meeting points of :mod:`~dpnotebook.grad_sample.engine.broadcast`,
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


__all__ = ["plan_units"]
