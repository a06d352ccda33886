"""The DP step's invariants, each enforced here, in one function, for every DP optimizer.

A DP-SGD step is private only if the update it applies is the clipped, noised
sum of one logical batch, computed once, with the constants the noise is
calibrated to. :class:`~dpnotebook.privacy.DPOptimizer` calls these
checks at the points where that could break (``docs/guarantees.md``,
"Invariants", lists them with their tests):

* :func:`check_no_raw_gradients`: **a step moves exactly what it clipped and noised.**
  A parameter of the optimizer's ``param_groups`` that is not in the clipped sum
  (``requires_grad=False`` at ``step()``, e.g. frozen after ``backward()``) but
  holds a non-zero ``.grad`` would be moved by its raw gradient: the step is refused.
* :func:`claim_parameters`: **one DP optimizer per model.** A DP optimizer claims its
  parameters (and, from ``make_private``, every parameter of the model); a second
  one over a claimed parameter while the first is alive is refused.
* :class:`~dpnotebook.privacy.step_constants.StepConstants`: **a logical step's constants are
  fixed.** ``noise_multiplier``, ``max_grad_norm`` (flat or per layer), ``expected_batch_size``,
  the clipping and the model's ``K`` are read when a logical batch's first piece is clipped; a
  piece or the noise with other values is refused, so clipping and noise always use the same ``C``
  (its own module, with the knobs it reads).
* :func:`check_not_consumed`: **each per-sample gradient is clipped once.** What a step
  clipped is marked (Opacus' ``_mark_as_processed``); clipping it again, or a step
  with no ``zero_grad()`` since the last one, is refused.

>>> import torch
>>> t = torch.zeros(2)
>>> _mark_as_processed(t)
>>> _check_processed_flag([t])
Traceback (most recent call last):
...
ValueError: Gradients haven't been cleared since the last optimizer step...
"""

from __future__ import annotations

import functools
import gc
import weakref
from collections.abc import Iterable
from typing import Any

from torch import Tensor, nn

__all__ = [
    "check_no_raw_gradients",
    "check_unowned",
    "claim_parameters",
    "check_not_consumed",
    "mark_noised",
    "parameter_names",
    "models_holding",
    "mark_clipped",
    "_mark_as_processed",
    "_check_processed_flag",
]

_NOISED = "_dpn_noised_version"  # on a p.grad a DP step wrote: its version counter then

MISSING_ZERO_GRAD = (
    "Gradients haven't been cleared since the last optimizer step: {what}. A second step on them "
    "would clip the same samples again (or step on a gradient that is not clipped), so the step is "
    "refused, as in Opacus. Fix: call optimizer.zero_grad() (or model.zero_grad()) after every "
    "optimizer.step(), before the next forward/backward pass."
)


def _mark_as_processed(obj: Tensor | list[Tensor]) -> None:
    """Mark a tensor (or each tensor of a list) as used by a DP step (Opacus' helper, same name).

    DP-SGD may clip a per-sample gradient only once: the optimizer marks each
    ``p.grad_sample`` it clipped; :func:`_check_processed_flag` refuses a marked one.
    """
    for x in obj if isinstance(obj, list) else [obj]:
        setattr(x, "_processed", True)  # an attribute torch's Tensor does not declare


def _check_processed_flag(obj: Tensor | list[Tensor]) -> None:
    """Raise ``ValueError`` if the tensor (or a tensor of the list) was marked by :func:`_mark_as_processed`."""
    for x in obj if isinstance(obj, list) else [obj]:
        if hasattr(x, "_processed"):
            raise ValueError(MISSING_ZERO_GRAD.format(what="p.grad_sample was already clipped by a step"))


def mark_clipped(params: Iterable[nn.Parameter]) -> None:
    """Mark every tensor of each ``p.grad_sample`` (one per backward pass) as clipped by a step."""
    for p in params:
        sample = getattr(p, "grad_sample", None)  # the wrapper's attribute: a tensor or a list of them
        if sample is not None:
            _mark_as_processed(sample)


def parameter_names(params: Iterable[nn.Parameter], models: Iterable[nn.Module] = ()) -> dict[int, str]:
    """``id(p) -> name`` for error messages: the path in one of ``models``, else its place in ``params`` and shape."""
    params = list(params)
    names: dict[int, str] = {}
    for model in models:
        for name, p in model.named_parameters():
            names.setdefault(id(p), name)
    for i, p in enumerate(params):
        names.setdefault(id(p), f"#{i} in param_groups (shape {tuple(p.shape)})")
    return names


def models_holding(params: Iterable[nn.Parameter], model: nn.Module | None = None) -> list[nn.Module]:
    """The models whose parameter paths name ``params`` in errors: ``model`` (the plain one) and their wrappers'."""
    models = [model] if model is not None else []
    for p in params:
        for hook in (getattr(p, "_post_accumulate_grad_hooks", None) or {}).values():
            owner = getattr(getattr(hook, "__self__", None), "owner", None)  # a GradSampleStore's wrapper
            if owner is not None and isinstance(getattr(owner, "_module", None), nn.Module):
                models.append(owner._module)
    return models


def check_no_raw_gradients(
    param_groups: list[dict[str, Any]], stepped: list[nn.Parameter], models: Iterable[nn.Module] = ()
) -> None:
    """Raise if a parameter of ``param_groups`` outside ``stepped`` (the clipped, noised ones) holds a gradient.

    A ``.grad`` of zeros (``zero_grad(set_to_none=False)``) carries no data and is allowed.

    Args:
        param_groups: the wrapped optimizer's parameter groups.
        stepped: the parameters whose ``.grad`` the DP step writes.
        models: models whose parameter paths name the offender in the error.

    Raises:
        RuntimeError: naming the parameter, why and the fix.

    >>> import torch
    >>> w = torch.nn.Parameter(torch.ones(2))
    >>> w.grad = torch.ones(2); w.requires_grad_(False)     # frozen after backward()
    Parameter containing:
    tensor([1., 1.])
    >>> check_no_raw_gradients([{"params": [w]}], stepped=[])
    Traceback (most recent call last):
    ...
    RuntimeError: DP step refused: parameter '#0 in param_groups (shape (2,))' has requires_grad=False but holds a .grad ...
    """
    inside = {id(p) for p in stepped}
    raw = [
        p
        for group in param_groups
        for p in group["params"]
        if id(p) not in inside and p.grad is not None and bool(p.grad.ne(0).any())
    ]
    if raw:
        all_params = [p for group in param_groups for p in group["params"]]
        names = parameter_names(all_params, models)
        listed = ", ".join(repr(names[id(p)]) for p in raw)
        raise RuntimeError(
            f"DP step refused: parameter {listed} has requires_grad=False but holds a .grad from the "
            "backward pass. The DP optimizer clips and noises only trainable parameters, and the wrapped "
            "optimizer would apply this raw gradient (one sample could move the step far beyond C). "
            "Fix: freeze parameters before the forward/backward pass, or call optimizer.zero_grad() "
            "after freezing (or set the parameter's .grad to None)."
        )


#: ``id(p) -> (weak reference to p, weak reference to the DP optimizer owning it)``. Kept here, not on the
#: parameter, so that a deep copy or a pickle of the model carries no claim.
_CLAIMS: dict[int, tuple[weakref.ref, weakref.ref]] = {}


def _owner_of(p: nn.Parameter) -> Any:
    """The live DP optimizer that claimed ``p``, or ``None``."""
    entry = _CLAIMS.get(id(p))
    if entry is None or entry[0]() is not p:
        return None
    return entry[1]()


def _forget(key: int, ref: weakref.ref) -> None:
    """A claimed parameter was freed: drop its entry (unless a new parameter reusing its id claimed since)."""
    entry = _CLAIMS.get(key)
    if entry is not None and entry[0] is ref:
        del _CLAIMS[key]


def check_unowned(params: Iterable[nn.Parameter], optimizer: Any = None) -> None:
    """Raise if a live DP optimizer other than ``optimizer`` owns one of ``params`` (:func:`claim_parameters`' check).

    ``make_private`` calls it before it wraps the model, so that a refused call leaves no hooks behind.

    Raises:
        RuntimeError: naming the owner, why two DP optimizers break the bound, and the fix.
    """
    params = list(params)
    owners = {id(o): o for o in map(_owner_of, params) if o is not None and o is not optimizer}
    if owners:
        gc.collect()  # an optimizer dropped by the caller but kept alive by a reference cycle is not an owner
        owners = {id(o): o for o in map(_owner_of, params) if o is not None and o is not optimizer}
    if owners:
        owner = next(iter(owners.values()))
        raise RuntimeError(
            f"this model already has a DP optimizer ({type(owner).__name__} over {len(owner.params)} "
            "parameter(s)): a second make_private on the same model, or a second DP optimizer over its "
            "parameters, is refused. Two DP optimizers on one model each add a sample's clipped gradient "
            "(together it moves the step by up to sqrt(2)*C) and each counts a step in the accountant, so "
            "the epsilon reported is not what was spent. Fix: one DP optimizer over all the parameters, with "
            "parameter groups for different settings, e.g. torch.optim.SGD([{'params': a}, {'params': b, "
            "'lr': 0.01}]); to replace the old DP optimizer, drop every reference to it (del optimizer), "
            "or start from a fresh model."
        )


def claim_parameters(optimizer: Any, params: Iterable[nn.Parameter]) -> None:
    """Make ``optimizer`` the DP optimizer of ``params``; refuse if another live DP optimizer owns one.

    Args:
        optimizer: the new DP optimizer.
        params: the parameters it steps (from ``make_private``: every parameter of the model).

    Raises:
        RuntimeError: a parameter already has a DP optimizer that is still referenced somewhere.

    >>> import torch
    >>> from dpnotebook.privacy._optimizer import DPOptimizer
    >>> layer = torch.nn.Linear(2, 1)
    >>> first = DPOptimizer(torch.optim.SGD(layer.parameters(), lr=0.1), noise_multiplier=1.0,
    ...                     max_grad_norm=1.0, expected_batch_size=4, secure_mode=False)
    >>> second = DPOptimizer(torch.optim.SGD([layer.bias], lr=0.1), noise_multiplier=1.0,
    ...                      max_grad_norm=1.0, expected_batch_size=4, secure_mode=False)
    Traceback (most recent call last):
    ...
    RuntimeError: this model already has a DP optimizer (DPOptimizer over 2 parameter(s)): ...
    """
    params = list(params)
    check_unowned(params, optimizer)
    mine = weakref.ref(optimizer)
    for p in params:
        key = id(p)
        ref: weakref.ref = weakref.ref(p, functools.partial(_forget, key))
        _CLAIMS[key] = (ref, mine)


def mark_noised(grads: list[Tensor]) -> None:
    """Remember the ``p.grad`` tensors a DP step wrote (and their version), for :func:`check_not_consumed`."""
    for g in grads:
        setattr(g, _NOISED, g._version)  # an attribute torch's Tensor does not declare


def check_not_consumed(params: list[nn.Parameter]) -> None:
    """Refuse to clip what a step already used: a marked ``grad_sample``, or a ``p.grad`` a step wrote, untouched.

    Raises:
        ValueError: the message of :data:`MISSING_ZERO_GRAD` (Opacus raises ``ValueError`` too).
    """
    for p in params:
        sample = getattr(p, "grad_sample", None)  # the wrapper's attribute, not torch's
        if sample is not None:
            _check_processed_flag(sample)
        grad = p.grad
        if grad is not None and getattr(grad, _NOISED, None) == grad._version:
            raise ValueError(
                MISSING_ZERO_GRAD.format(what="step() was called again while p.grad still holds the last step's")
            )
