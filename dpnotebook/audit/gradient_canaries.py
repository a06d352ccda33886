"""White-box gradient canaries: audit the DP-SGD step itself, not what a model shows of it.

A *gradient canary* (Nasr et al. 2021, 2023, "Tight auditing of differentially private machine
learning"; Steinke, Nasr & Jagielski 2023, Section 6) is a record whose per-sample gradient the auditor
crafts: a large vector along a direction of its own, a *Dirac* (one coordinate of one parameter) or a
random unit direction. The canary is a row of the training data like any other: the Poisson loader
samples it with the same rate ``q``, and the DP optimizer clips its gradient to ``C`` and adds the
same noise. Only its gradient is not computed from the model: :meth:`GradientCanaries.inject` writes it
into ``grad_sample`` between ``backward()`` and ``optimizer.step()``.

After every step the auditor reads the released noisy gradient (``p.grad``, which DP-SGD's threat
model lets anyone see) and keeps its projection on each canary's direction, in units of ``C``: for a
canary in the data it is ``1{sampled} + N(0, sigma^2)`` plus whatever the other records put there,
for one left out only the noise and the others. Two scores come from these projections:

* ``"sum"``: their sum over the steps, the final update's projection on the canary (what the
  final model alone shows, since ``theta_T - theta_0 = -lr * sum of the steps`` for plain SGD);
* ``"steps"``: the log-likelihood ratio of every step, ``sum_t log(1 - q + q exp((z_t - 1/2) / sigma^2))``,
  the best test of "in" against "out" for an attacker who sees each step, as the accountant assumes.

:func:`~dpnotebook.audit.one_run.audit_one_run` turns either into a lower bound on epsilon. With
Dirac canaries on coordinates that no other record reaches (the weights of an input pixel that is 0 in
every record), the projections are exactly the idealised ones of
:func:`~dpnotebook.audit.canaries.dp_sgd_canary_scores`; a step that skipped its noise or clipped to
more than ``C`` shows at once.

>>> from torch import nn
>>> import dpnotebook
>>> from dpnotebook.privacy import DPOptimizer
>>> model = dpnotebook.wrap_model(nn.Linear(4, 1), "hooks")
>>> included = np.array([True, False, True])
>>> canaries = GradientCanaries.dirac(model._module.weight, [0, 1, 2], included)
>>> opt = DPOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), noise_multiplier=0.0,
...                   max_grad_norm=1.0, expected_batch_size=3)
>>> canaries.attach(opt)
>>> x = torch.zeros(3, 4)                 # one ordinary row, the two canaries in the data (ids 0 and 2)
>>> model(x).sum().backward()
>>> canaries.inject(torch.tensor([-1, 0, 2]))
>>> opt.step()
>>> canaries.scores("sum").round(4).tolist()   # clipped to C = 1, no noise: 1 for each canary sampled
[1.0, 0.0, 1.0]
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from dpnotebook.grad_sample.engine.accumulation import grad_sample_parts

__all__ = ["GradientCanaries", "unreached_coordinates", "SCORES"]

SCORES = ("sum", "steps")
"""The scores :meth:`GradientCanaries.scores` computes."""


def unreached_coordinates(weight: Tensor, inputs: Tensor) -> Tensor:
    """The flat indices of a first ``nn.Linear`` layer's ``weight`` that no input record reaches.

    The gradient of ``weight[j, i]`` is ``backprop_j * input_i``: zero for every record whose input
    ``i`` is 0. A Dirac canary there shares its coordinate with no record.

    Args:
        weight: the layer's weight, ``[out_features, in_features]``.
        inputs: every training input, ``[records, in_features]`` (or any shape that flattens to it).

    >>> unreached_coordinates(torch.zeros(2, 3), torch.tensor([[1.0, 0.0, 2.0], [0.5, 0.0, 0.0]])).tolist()
    [1, 4]
    """
    if weight.dim() != 2:
        raise ValueError(f"weight has shape {tuple(weight.shape)}: pass a Linear layer's [out, in] weight.")
    flat = inputs.reshape(inputs.shape[0], -1)
    if flat.shape[1] != weight.shape[1]:
        raise ValueError(
            f"inputs have {flat.shape[1]} values per record but weight takes {weight.shape[1]}: pass the "
            "inputs of the layer whose weight this is."
        )
    unused = (flat != 0).sum(0) == 0  # [in_features]
    return unused.expand(weight.shape[0], -1).reshape(-1).nonzero().reshape(-1)


class GradientCanaries:
    """``m`` canaries whose per-sample gradients the auditor writes into one parameter.

    Build them with :meth:`dirac` or :meth:`random`; put one row per *included* canary in the
    training data, with an id column (``-1`` for ordinary rows, ``i`` for canary ``i``); call
    :meth:`attach` once, and :meth:`inject` after each ``backward()``.

    Attributes:
        parameter: where the canaries' gradients live.
        included: the canaries' coins (:func:`~dpnotebook.audit.canaries.draw_inclusion`).
        gradient_norm: the norm of each crafted gradient before clipping (default 10: it is clipped).
        projections: one row per step: the released gradient's projection on each canary, in units of C.
        sample_rate, noise_multiplier: of the optimizer attached (``q`` is given to :meth:`attach`).
    """

    def __init__(
        self,
        parameter: Tensor,
        directions: Tensor | None,
        coordinates: Tensor | None,
        included: np.ndarray,
        gradient_norm: float,
    ) -> None:
        inc = np.asarray(included)
        if inc.dtype != bool or inc.ndim != 1:
            raise ValueError(f"included has dtype {inc.dtype} and shape {inc.shape}: pass one boolean coin a canary.")
        count = directions.shape[0] if directions is not None else int(coordinates.numel())  # type: ignore[union-attr]
        if count != inc.size:
            raise ValueError(f"{count} canary directions but {inc.size} coins: pass one coin per canary.")
        if not (gradient_norm > 0 and math.isfinite(gradient_norm)):
            raise ValueError(f"gradient_norm={gradient_norm!r} is invalid: it must be a finite number > 0, e.g. 10.")
        self.parameter = parameter
        self.directions = directions
        self.coordinates = coordinates
        self.included = inc
        self.gradient_norm = float(gradient_norm)
        self.projections: list[np.ndarray] = []
        self.sample_rate = math.nan
        self.noise_multiplier = math.nan
        self._others: list[Tensor] = []

    @classmethod
    def dirac(
        cls,
        parameter: Tensor,
        coordinates: Sequence[int] | Tensor,
        included: np.ndarray,
        *,
        gradient_norm: float = 10.0,
    ) -> GradientCanaries:
        """Canary ``i``'s gradient is ``gradient_norm`` at flat index ``coordinates[i]`` of ``parameter``, 0 elsewhere.

        >>> GradientCanaries.dirac(torch.zeros(2, 2), [0, 0], np.array([True, False]))
        Traceback (most recent call last):
        ...
        ValueError: coordinates repeat an index: two Dirac canaries on one coordinate add up and neither is alone. Fix: pass distinct flat indices.
        """
        idx = torch.as_tensor(coordinates, dtype=torch.long).reshape(-1)
        if idx.numel() and (idx.min() < 0 or idx.max() >= parameter.numel()):
            raise ValueError(
                f"coordinates must be flat indices in [0, {parameter.numel()}) of the parameter; "
                f"got {int(idx.min())}..{int(idx.max())}."
            )
        if idx.unique().numel() != idx.numel():
            raise ValueError(
                "coordinates repeat an index: two Dirac canaries on one coordinate add up and neither is "
                "alone. Fix: pass distinct flat indices."
            )
        return cls(parameter, None, idx, included, gradient_norm)

    @classmethod
    def random(
        cls, parameter: Tensor, included: np.ndarray, *, seed: int, gradient_norm: float = 10.0
    ) -> GradientCanaries:
        """Canary ``i``'s gradient is ``gradient_norm`` times a random unit direction in ``parameter``'s space.

        Random directions are nearly orthogonal only when the parameter has many more coordinates than
        there are canaries, and they overlap with every record's gradient: a weaker audit than Dirac
        canaries on coordinates no record reaches.

        >>> c = GradientCanaries.random(torch.zeros(8, 8), np.ones(3, dtype=bool), seed=0)
        >>> torch.linalg.vector_norm(c.directions, dim=1).round(decimals=5).tolist()
        [1.0, 1.0, 1.0]
        """
        g = torch.Generator().manual_seed(seed)
        d = torch.randn(np.asarray(included).size, parameter.numel(), generator=g, dtype=torch.float64)
        d /= torch.linalg.vector_norm(d, dim=1, keepdim=True)
        return cls(parameter, d, None, included, gradient_norm)

    @property
    def count(self) -> int:
        """m, the number of canaries."""
        return int(self.included.size)

    def attach(self, optimizer: object, *, sample_rate: float = math.nan) -> None:
        """Read each step's released gradient from this DP optimizer (a step hook).

        Args:
            optimizer: a :class:`~dpnotebook.privacy.DPOptimizer` over ``parameter``.
            sample_rate: q of the loader (needed for the ``"steps"`` score only).
        """
        from dpnotebook.privacy import DPOptimizer

        if not isinstance(optimizer, DPOptimizer):
            raise TypeError(
                f"optimizer is a {type(optimizer).__name__}: gradient canaries audit a DPOptimizer's step. "
                "Fix: pass the optimizer make_private returned."
            )
        if not any(p is self.parameter for p in optimizer.params):
            raise ValueError("the canaries' parameter is not one the optimizer updates: pass a parameter of its model.")
        self.sample_rate = float(sample_rate)
        self.noise_multiplier = float(optimizer.noise_multiplier)
        self._others = list(optimizer.params)
        optimizer.attach_step_hook(self._record)

    def _project(self, flat: Tensor) -> np.ndarray:
        if self.coordinates is not None:
            return flat[self.coordinates].double().numpy()
        assert self.directions is not None
        return (self.directions @ flat.double()).numpy()

    def _record(self, optimizer: object) -> None:
        grad = self.parameter.grad
        if grad is None:
            raise RuntimeError("the DP step left no gradient on the canaries' parameter: was it in the optimizer?")
        scale = 1.0 / optimizer.max_grad_norm  # type: ignore[attr-defined]
        if optimizer.loss_reduction == "mean":  # type: ignore[attr-defined]
            # what the step divided by: the expected batch times the backward passes held (1 under Poisson)
            scale *= optimizer.expected_batch_size * optimizer.accumulated_iterations  # type: ignore[attr-defined]
        self.projections.append(self._project(grad.detach().reshape(-1).cpu()) * scale)

    def inject(self, canary_ids: Tensor) -> None:
        """Write the crafted gradients into the rows of ``canary_ids`` that hold a canary (id ``>= 0``).

        Call it after ``backward()`` and before ``optimizer.step()``. The canaries' rows of every other
        parameter the optimizer updates are zeroed, so a canary's whole gradient is the crafted one.

        Args:
            canary_ids: one id per row of the batch: ``-1`` for an ordinary record, ``i`` for canary ``i``.
        """
        ids = canary_ids.reshape(-1).long().cpu()
        rows = (ids >= 0).nonzero().reshape(-1)
        parts = grad_sample_parts(self.parameter)  # one tensor per backward pass since zero_grad
        held = sum(g.shape[0] for g in parts)
        if not parts or held != ids.numel():
            raise RuntimeError(
                f"the canaries' parameter has grad_sample of {held if parts else None} rows for "
                f"{ids.numel()} rows: call inject after backward(), with a model wrapped in a mode that forms "
                "per-sample gradients (hooks, functorch or ew; ghost mode never forms them)."
            )
        if rows.numel() == 0:
            return
        which = ids[rows]
        if which.max() >= self.count:
            raise ValueError(f"canary id {int(which.max())} in the batch, but there are {self.count} canaries.")
        if not bool(torch.from_numpy(self.included)[which].all()):
            raise ValueError("a canary left out by its coin is in the batch: put only included canaries in the data.")
        for gs, at, here in _row_slices(parts, rows):  # written in place into each backward pass's tensor
            flat = gs.reshape(gs.shape[0], -1)
            flat[at] = 0
            if self.coordinates is not None:
                flat[at, self.coordinates[which[here]].to(flat.device)] = self.gradient_norm
            else:
                assert self.directions is not None
                flat[at] = (self.gradient_norm * self.directions[which[here]]).to(flat)
        for p in self._others:
            if p is not self.parameter:
                for other, at, _ in _row_slices(grad_sample_parts(p), rows):
                    other[at] = 0

    def scores(self, kind: str = "sum") -> np.ndarray:
        """One score per canary, higher when it looks trained on (see the module's docstring).

        Args:
            kind: ``"sum"`` (the final update's projection) or ``"steps"`` (every step's likelihood ratio;
                needs noise and the sample rate given to :meth:`attach`).
        """
        if kind not in SCORES:
            raise ValueError(f"kind={kind!r} is invalid: pass one of {SCORES}.")
        if not self.projections:
            raise RuntimeError("no step recorded: call attach(optimizer) before training.")
        z = np.stack(self.projections)  # [steps, m]
        if kind == "sum":
            return z.sum(0)
        q, sigma = self.sample_rate, self.noise_multiplier
        if not (0 < q <= 1) or not sigma > 0:
            raise ValueError(
                f"the 'steps' score needs noise and the sample rate: got noise_multiplier={sigma}, sample_rate={q}. "
                "Fix: attach(optimizer, sample_rate=q), or use kind='sum' without noise."
            )
        # log(1 - q + q exp(a)) computed stably for large a
        a = (z - 0.5) / sigma**2
        return np.logaddexp(math.log1p(-q) if q < 1 else -np.inf, math.log(q) + a).sum(0)


def _row_slices(parts: list[Tensor], rows: Tensor) -> list[tuple[Tensor, Tensor, Tensor]]:
    """``(tensor, its rows among rows, their places in rows)`` for each tensor of a list ``grad_sample``."""
    out, start = [], 0
    for g in parts:
        here = ((rows >= start) & (rows < start + g.shape[0])).nonzero().reshape(-1)
        if here.numel():
            out.append((g, (rows[here] - start).to(g.device), here))
        start += g.shape[0]
    return out
