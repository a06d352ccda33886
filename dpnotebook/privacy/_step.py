"""What a DP-SGD step must satisfy, each invariant enforced here in one function, and what the step did.

The update a step applies must be the clipped, noised sum of one logical batch, computed once, with the
constants the noise is calibrated to (``docs/guarantees.md``, "Invariants of the DP step"):
:func:`check_no_raw_gradients`, :func:`claim_parameters` (one DP optimizer per model), :class:`StepConstants`
and :class:`PrivacyKnobs` (sigma and ``C`` fixed within a logical batch, valid when set), and
:func:`check_not_consumed` (each per-sample gradient clipped once). :class:`StepStats` records the last
step; its per-sample norms are not private: show them to a student, never publish them.

>>> import torch
>>> t = torch.zeros(2)
>>> _mark_as_processed(t)
>>> _check_processed_flag([t])
Traceback (most recent call last):
...
ValueError: Gradients haven't been cleared since the last optimizer step...
>>> knobs = PrivacyKnobs()
>>> knobs.max_grad_norm = [1.0, 2.0]                 # per-layer bounds: their total is C
>>> round(knobs.max_grad_norm, 4), knobs.max_grad_norms
(2.2361, [1.0, 2.0])
"""

from __future__ import annotations

import functools
import gc
import math
import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from dpnotebook.grad_sample._engine.accumulation import grad_sample_parts
from dpnotebook.privacy._arguments import check_max_grad_norm, check_noise_multiplier
from dpnotebook.privacy._mechanisms import total_bound

_NOISED = "_dpn_noised_version"  # on a p.grad a DP step wrote: its version counter then

MISSING_ZERO_GRAD = (
    "Gradients haven't been cleared since the last optimizer step: {what}. A second step on them "
    "would clip the same samples again (or step on a gradient that is not clipped), so the step is "
    "refused. Fix: call optimizer.zero_grad() (or model.zero_grad()) after every "
    "optimizer.step(), before the next forward/backward pass."
)


class PrivacyKnobs:
    """``noise_multiplier`` (sigma) and ``max_grad_norm`` (C, or per-layer bounds), validated whenever set."""

    max_grad_norms: list[float] | None

    @property
    def noise_multiplier(self) -> float:
        return self._noise_multiplier

    @noise_multiplier.setter
    def noise_multiplier(self, value: float) -> None:
        self._noise_multiplier = check_noise_multiplier(value)

    @property
    def max_grad_norm(self) -> float:
        return self._max_grad_norm

    @max_grad_norm.setter
    def max_grad_norm(self, value: float | list[float]) -> None:
        """A number C, or (per-layer clipping) a list of bounds: then ``max_grad_norm`` is their total."""
        if isinstance(value, (list, tuple)):
            self.max_grad_norms = [check_max_grad_norm(c) for c in value]
            self._max_grad_norm = total_bound(self.max_grad_norms)
        else:
            self.max_grad_norms = None
            self._max_grad_norm = check_max_grad_norm(value)


@dataclass(frozen=True)
class StepConstants:
    """The constants a logical batch's clipping and noise must share, read from a DP optimizer."""

    noise_multiplier: float
    max_grad_norm: float
    max_grad_norms: tuple[float, ...] | None
    expected_batch_size: float
    clipping: str
    K: int | None

    @classmethod
    def of(cls, optimizer: Any) -> StepConstants:
        """The optimizer's constants now (``K``: its model's, if known)."""
        norms = optimizer.max_grad_norms
        module = optimizer._dp_model
        return cls(
            optimizer.noise_multiplier,
            optimizer.max_grad_norm,
            tuple(norms) if norms is not None else None,
            optimizer.expected_batch_size,
            optimizer.clipping,
            getattr(module, "K", None) if module is not None else None,
        )

    def check(self, optimizer: Any) -> None:
        """Raise if any constant of ``optimizer`` differs from these."""
        now = StepConstants.of(optimizer)
        for name in self.__dataclass_fields__:
            before, after = getattr(self, name), getattr(now, name)
            if before != after:
                raise RuntimeError(
                    f"{name} changed while a logical batch is accumulated: {before} when its first piece was "
                    f"clipped, {after} now: noise calibrated to another value breaks the privacy bound. Fix: "
                    "change it (or step a scheduler) only between logical batches, after the optimizer.step() "
                    "that adds the noise; under BatchMemoryManager, after the loop over the physical batches."
                )


def _mark_as_processed(obj: Tensor | list[Tensor]) -> None:
    """Mark a tensor (or each tensor of a list) as clipped by a DP step."""
    for x in obj if isinstance(obj, list) else [obj]:
        setattr(x, "_processed", True)  # an attribute torch's Tensor does not declare


def _check_processed_flag(obj: Tensor | list[Tensor]) -> None:
    """Raise ``ValueError`` if a tensor was marked by :func:`_mark_as_processed`."""
    for x in obj if isinstance(obj, list) else [obj]:
        if hasattr(x, "_processed"):
            raise ValueError(MISSING_ZERO_GRAD.format(what="p.grad_sample was already clipped by a step"))


def mark_clipped(params: Iterable[nn.Parameter]) -> None:
    """Mark every tensor of each ``p.grad_sample`` as clipped."""
    for p in params:
        sample = getattr(p, "grad_sample", None)  # the wrapper's attribute: a tensor or a list of them
        if sample is not None:
            _mark_as_processed(sample)


def parameter_names(params: Iterable[nn.Parameter], models: Iterable[nn.Module] = ()) -> dict[int, str]:
    """``id(p) -> name`` for errors: the path in one of ``models``, else its place in ``params`` and shape."""
    names: dict[int, str] = {}
    for model in models:
        for name, p in model.named_parameters():
            names.setdefault(id(p), name)
    for i, p in enumerate(params):
        names.setdefault(id(p), f"#{i} in param_groups (shape {tuple(p.shape)})")
    return names


def models_holding(params: Iterable[nn.Parameter], model: nn.Module | None = None) -> list[nn.Module]:
    """The models whose parameter paths name ``params`` in errors: ``model`` and their wrappers'."""
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
    """Raise ``RuntimeError`` if a parameter of ``param_groups`` outside ``stepped`` holds a non-zero gradient."""
    inside = {id(p) for p in stepped}
    raw = [
        p
        for group in param_groups
        for p in group["params"]
        if id(p) not in inside and p.grad is not None and bool(p.grad.ne(0).any())
    ]
    if raw:
        names = parameter_names([p for group in param_groups for p in group["params"]], models)
        listed = ", ".join(repr(names[id(p)]) for p in raw)
        raise RuntimeError(
            f"DP step refused: parameter {listed} has requires_grad=False but holds a .grad from the "
            "backward pass, which the wrapped optimizer would apply without clipping or noise. Fix: freeze "
            "parameters before the forward/backward pass, or call optimizer.zero_grad() after freezing (or set "
            "the parameter's .grad to None)."
        )


#: ``id(p) -> (weak reference to p, to its DP optimizer)``: not on the parameter, so a copy carries no claim.
_CLAIMS: dict[int, tuple[weakref.ref[nn.Parameter], weakref.ref[Any]]] = {}


def _owner_of(p: nn.Parameter) -> Any:
    entry = _CLAIMS.get(id(p))
    if entry is None or entry[0]() is not p:
        return None
    return entry[1]()


def _forget(key: int, ref: weakref.ref[nn.Parameter]) -> None:
    entry = _CLAIMS.get(key)
    if entry is not None and entry[0] is ref:
        del _CLAIMS[key]


def check_unowned(params: Iterable[nn.Parameter], optimizer: Any = None) -> None:
    """Raise ``RuntimeError`` if a live DP optimizer other than ``optimizer`` owns one of ``params``."""
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
            "parameters, is refused: together they move the step by up to sqrt(2)*C and count two steps. "
            "Fix: one DP optimizer over all the parameters, with "
            "parameter groups for different settings, e.g. torch.optim.SGD([{'params': a}, {'params': b, "
            "'lr': 0.01}]); to replace the old DP optimizer, drop every reference to it (del optimizer), "
            "or start from a fresh model."
        )


def claim_parameters(optimizer: Any, params: Iterable[nn.Parameter]) -> None:
    """Make ``optimizer`` the DP optimizer of ``params``; ``RuntimeError`` if another live one has one."""
    params = list(params)
    check_unowned(params, optimizer)
    mine = weakref.ref(optimizer)
    for p in params:
        key = id(p)
        ref: weakref.ref[nn.Parameter] = weakref.ref(p, functools.partial(_forget, key))
        _CLAIMS[key] = (ref, mine)


def mark_noised(grads: list[Tensor]) -> None:
    """Remember the ``p.grad`` tensors a DP step wrote (and their version)."""
    for g in grads:
        setattr(g, _NOISED, g._version)  # an attribute torch's Tensor does not declare


def all_clipped(params: Iterable[nn.Parameter]) -> bool:
    """Whether some ``p.grad_sample`` is present and every tensor of every one is marked clipped."""
    parts = [x for p in params for x in grad_sample_parts(p)]
    return bool(parts) and all(hasattr(x, "_processed") for x in parts)


def check_not_consumed(params: list[nn.Parameter]) -> None:
    """Raise ``ValueError`` on a marked ``grad_sample``, or on a ``p.grad`` a step wrote, untouched."""
    for p in params:
        sample = getattr(p, "grad_sample", None)  # the wrapper's attribute, not torch's
        if sample is not None:
            _check_processed_flag(sample)
        grad = p.grad
        if grad is not None and getattr(grad, _NOISED, None) == grad._version:
            raise ValueError(
                MISSING_ZERO_GRAD.format(what="step() was called again while p.grad still holds the last step's")
            )


@dataclass
class StepStats:
    """What the last ``DPOptimizer.step`` did, for printing and plotting.

    The step computes these on the gradients' device and does not wait for them: the counts and norms
    are read back to the host (a GPU synchronisation) only when one of them is asked for.

    Attributes:
        batch_size: the number of samples in the logical batch (0 for an empty one).
        per_sample_norms: each sample's gradient norm before clipping, shape ``[batch_size]``.
        fraction_clipped: the fraction of samples whose gradient was scaled down.
        noise_multiplier: sigma.
        max_grad_norm: C.
        noise_std: ``sigma * C``, the std of the noise added to the clipped sum.
        expected_batch_size: what the noisy sum was divided by (for ``"mean"``).
        clipped_sum_norm: the norm of the clipped sum (the signal), over all parameters.
        noise_norm: the norm of the noise that was added to it.
        virtual_steps: how many physical pieces made up the logical batch.
        num_clipped, norms: what ``fraction_clipped`` and the two norms are read from.

    >>> norms = SumAndNoiseNorms([torch.tensor([2.0])], [torch.tensor([4.0])])
    >>> stats = StepStats.of_batch([torch.tensor([0.5, 2.0]), torch.tensor([3.0])], num_clipped=2,
    ...                            noise_multiplier=1.0, max_grad_norm=1.0, expected_batch_size=3.0,
    ...                            norms=norms, virtual_steps=2)
    >>> stats.batch_size, round(stats.fraction_clipped, 3), stats.noise_std, stats.noise_norm
    (3, 0.667, 1.0, 4.0)
    """

    batch_size: int
    per_sample_norms: Tensor
    noise_multiplier: float
    max_grad_norm: float
    noise_std: float
    expected_batch_size: float
    virtual_steps: int
    num_clipped: Tensor | int
    norms: SumAndNoiseNorms

    @property
    def fraction_clipped(self) -> float:
        return int(self.num_clipped) / self.batch_size if self.batch_size else 0.0

    @property
    def clipped_sum_norm(self) -> float:
        return self.norms.values()[0]

    @property
    def noise_norm(self) -> float:
        return self.norms.values()[1]

    @classmethod
    def of_batch(cls, pieces: list[Tensor], *, noise_multiplier: float, max_grad_norm: float, **rest: Any) -> StepStats:
        """The statistics of a logical batch from each physical piece's per-sample norms."""
        per_sample = pieces[0] if len(pieces) == 1 else torch.cat(pieces) if pieces else torch.empty(0)
        noise_std = noise_multiplier * max_grad_norm
        return cls(int(per_sample.numel()), per_sample, noise_multiplier, max_grad_norm, noise_std, **rest)


class SumAndNoiseNorms:
    """The L2 norms of two lists of tensors (the clipped sum and its noise), each taken together.

    One ``_foreach_norm`` runs now, on the tensors' device; :meth:`values` reads it to the host the first
    time it is called, so that a step whose statistics nobody reads never waits for them.

    >>> SumAndNoiseNorms([torch.tensor([3.0]), torch.tensor([[4.0]])], [torch.tensor([1.0])]).values()
    (5.0, 1.0)
    """

    def __init__(self, first: list[Tensor], second: list[Tensor]) -> None:
        tensors = [t.detach() for t in [*first, *second]]
        self._split = len(first)
        self._norms = torch.stack(torch._foreach_norm(tensors)) if tensors else None
        self._values: tuple[float, float] | None = None

    def snapshot(self) -> SumAndNoiseNorms:
        """A copy holding the norms as they are now (a replayed CUDA graph overwrites the tensor at its next step).

        >>> norms = SumAndNoiseNorms([torch.tensor([3.0])], [torch.tensor([4.0])])
        >>> copy = norms.snapshot(); _ = norms._norms.zero_(); copy.values()
        (3.0, 4.0)
        """
        copy = SumAndNoiseNorms([], [])
        copy._split = self._split
        copy._norms = None if self._norms is None else self._norms.clone()
        return copy

    def values(self) -> tuple[float, float]:
        """``(norm of the first list, norm of the second)``, as Python floats."""
        if self._values is None:
            squares = [n * n for n in self._norms.tolist()] if self._norms is not None else []
            first, second = squares[: self._split], squares[self._split :]
            self._values = (math.sqrt(math.fsum(first)), math.sqrt(math.fsum(second)))
        return self._values
