"""Canaries for a one-run audit, black-box and white-box, and a digits model audited with both.

A canary is a record put in the training set on a fair coin (:func:`draw_inclusion`). Input
canaries: :func:`random_image_canaries`, :func:`mislabeled_canaries`; mechanisms whose true epsilon
is known: :func:`gaussian_mechanism_scores`, :func:`dp_sgd_canary_scores`; white-box
:class:`GradientCanaries`, whose per-sample gradients the auditor writes into ``grad_sample``
(docs/concepts/accounting.md, "What epsilon means to an attacker"). :func:`audited_digits_run`
trains a small MLP on scikit-learn's digits with canaries, then attacks and audits it.

>>> included = draw_inclusion(8, seed=0)
>>> scores = gaussian_mechanism_scores(included, noise_multiplier=0.0)   # no noise: the scores are the coins
>>> bool((scores == included).all())
True
>>> import dpnotebook
>>> from dpnotebook.privacy import DPOptimizer
>>> model = dpnotebook.wrap_model(nn.Linear(4, 1), "hooks")
>>> canaries = GradientCanaries.dirac(model._module.weight, [0, 1, 2], np.array([True, False, True]))
>>> opt = DPOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), noise_multiplier=0.0,
...                   max_grad_norm=1.0, expected_batch_size=3)
>>> canaries.attach(opt)
>>> model(torch.zeros(3, 4)).sum().backward()  # one ordinary row, the two canaries in the data (ids 0 and 2)
>>> canaries.inject(torch.tensor([-1, 0, 2]))
>>> opt.step()
>>> canaries.scores("sum").round(4).tolist()   # clipped to C = 1, no noise: 1 for each canary sampled
[1.0, 0.0, 1.0]
>>> run = audited_digits_run(noise_multiplier=1.0, members=64, canaries=64, epochs=1, seed=0)
>>> run.one_run.epsilon <= run.epsilon
True
>>> clear = audited_digits_run(noise_multiplier=0.0, members=64, canaries=64, gradient_canaries=200,
...                            epochs=4, seed=0)
>>> clear.gradient_audit.epsilon > 2          # no noise: the white-box audit sees it at once
True
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from dpnotebook.audit._attacks import (
    AttackROC,
    OneRunAudit,
    attack_roc,
    audit_one_run,
    calibrated_attack,
    example_losses,
    loss_threshold_attack,
)
from dpnotebook.device import check_device
from dpnotebook.grad_sample._engine.accumulation import grad_sample_parts
from dpnotebook.privacy._arguments import (
    check_noise_multiplier,
    check_positive_int,
    check_positive_number,
    check_sample_rate,
)

Array = npt.NDArray[Any]


def draw_inclusion(canaries: int, *, seed: int) -> Array:
    """``canaries`` independent fair coins (``True``: put the canary in the training set), seeded.

    >>> bool((draw_inclusion(10, seed=1) == draw_inclusion(10, seed=1)).all())
    True
    """
    return np.random.default_rng(seed).random(check_positive_int("canaries", canaries)) < 0.5


def _coins(included: Array) -> Array:
    inc = np.asarray(included)
    if inc.dtype != bool or inc.ndim != 1:
        raise ValueError(f"included has dtype {inc.dtype} and shape {inc.shape}: pass one boolean coin a canary.")
    return inc


def random_image_canaries(
    canaries: int,
    *,
    shape: tuple[int, ...] = (1, 8, 8),
    num_classes: int = 10,
    seed: int = 0,
    blank: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """``canaries`` images of ``shape`` whose pixels are 0 or 1 on a fair coin, each with a uniform label.

    A model gets one right only by memorising it. ``blank`` is a boolean mask of pixels kept at 0.

    >>> x, y = random_image_canaries(3)
    >>> x.shape, y.shape
    (torch.Size([3, 1, 8, 8]), torch.Size([3]))
    """
    g = torch.Generator().manual_seed(seed)
    x = (torch.rand(canaries, *shape, generator=g) < 0.5).float()
    if blank is not None:
        x[:, blank] = 0.0
    return x, torch.randint(0, num_classes, (canaries,), generator=g)


def mislabeled_canaries(inputs: Tensor, targets: Tensor, *, num_classes: int, seed: int) -> tuple[Tensor, Tensor]:
    """The same inputs, each with a label drawn uniformly among the *other* classes.

    >>> x, y = mislabeled_canaries(torch.zeros(5, 2), torch.tensor([0, 1, 2, 0, 1]), num_classes=3, seed=0)
    >>> bool((y != torch.tensor([0, 1, 2, 0, 1])).all())
    True
    """
    if num_classes < 2:
        raise ValueError(f"num_classes={num_classes!r} is invalid: a wrong label needs at least 2 classes.")
    if (
        targets.dtype not in (torch.int64, torch.int32)
        or targets.numel()
        and not 0 <= targets.min() <= targets.max() < num_classes
    ):
        raise ValueError(f"targets must be integer labels in [0, {num_classes}); got dtype {targets.dtype}.")
    g = torch.Generator().manual_seed(seed)
    shift = torch.randint(1, num_classes, targets.shape, generator=g)
    return inputs.clone(), (targets.long() + shift) % num_classes


def gaussian_mechanism_scores(
    included: Array, *, noise_multiplier: float, sensitivity: float = 1.0, seed: int = 0
) -> Array:
    """One run of the Gaussian mechanism on the canaries: ``sensitivity * (included + N(0, noise_multiplier^2))``."""
    inc, sigma = _coins(included), check_noise_multiplier(noise_multiplier)
    return (
        sensitivity * inc.astype(float) + np.random.default_rng(seed).standard_normal(inc.shape) * sigma * sensitivity
    )


def dp_sgd_canary_scores(
    included: Array, *, noise_multiplier: float, sample_rate: float, steps: int, seed: int = 0
) -> Array:
    """The canaries' coordinates after ``steps`` DP-SGD steps with C = 1 and gradient canaries.

    Canary ``i``'s clipped gradient is the unit vector of coordinate ``i``, sampled at ``sample_rate``
    in each step if it is in the data: a binomial count of the steps plus ``N(0, steps * sigma^2)``.

    >>> included = draw_inclusion(4, seed=0)
    >>> bool((dp_sgd_canary_scores(included, noise_multiplier=0.0, sample_rate=1.0, steps=3) == 3 * included).all())
    True
    """
    inc, steps = _coins(included), check_positive_int("steps", steps)
    sigma, q = check_noise_multiplier(noise_multiplier), check_sample_rate(sample_rate)
    rng = np.random.default_rng(seed)
    return rng.binomial(steps, q, inc.shape) * inc + rng.standard_normal(inc.shape) * sigma * math.sqrt(steps)


def unreached_coordinates(weight: Tensor, inputs: Tensor) -> Tensor:
    """The flat indices of a first ``nn.Linear`` layer's ``weight`` (``[out, in]``) that no input record reaches.

    ``inputs``: every training input, ``[records, in]`` or any shape that flattens to it. A record's
    gradient of ``weight[j, i]`` is ``backprop_j * input_i``: a Dirac canary there shares it with no record.

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
    return (flat == 0).all(0).expand(weight.shape[0], -1).reshape(-1).nonzero().reshape(-1)


class GradientCanaries:
    """``m`` canaries whose per-sample gradients the auditor writes into one parameter.

    Build them with :meth:`dirac` or :meth:`random`; put one row per *included* canary in the
    training data, with an id column (``-1`` for ordinary rows, ``i`` for canary ``i``); call
    :meth:`attach` once, and :meth:`inject` after each ``backward()``.

    Attributes:
        parameter, included, gradient_norm: where the gradients live, the coins, their norm before clipping.
        projections: one row per step: the released gradient's projection on each canary, in units of C.
        sample_rate, noise_multiplier: of the optimizer attached (``q`` is given to :meth:`attach`).
    """

    def __init__(
        self,
        parameter: Tensor,
        directions: Tensor | None,
        coordinates: Tensor | None,
        included: Array,
        gradient_norm: float,
    ) -> None:
        inc = _coins(included)
        count = directions.shape[0] if directions is not None else int(coordinates.numel())  # type: ignore[union-attr]
        if count != inc.size:
            raise ValueError(f"{count} canary directions but {inc.size} coins: pass one coin per canary.")
        self.parameter, self.directions, self.coordinates = parameter, directions, coordinates
        self.included, self.gradient_norm = inc, check_positive_number("gradient_norm", gradient_norm)
        self.projections: list[Array] = []
        self.sample_rate = self.noise_multiplier = math.nan
        self._others: list[Tensor] = []

    @classmethod
    def dirac(
        cls,
        parameter: Tensor,
        coordinates: Sequence[int] | Tensor,
        included: Array,
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
    def random(cls, parameter: Tensor, included: Array, *, seed: int, gradient_norm: float = 10.0) -> GradientCanaries:
        """Canary ``i``'s gradient is ``gradient_norm`` times a random unit direction in ``parameter``'s space.

        They overlap with every record's gradient: a weaker audit than Dirac canaries no record reaches.

        >>> c = GradientCanaries.random(torch.zeros(8, 8), np.ones(3, dtype=bool), seed=0)
        >>> torch.linalg.vector_norm(c.directions, dim=1).round(decimals=5).tolist()
        [1.0, 1.0, 1.0]
        """
        g = torch.Generator().manual_seed(seed)
        d = torch.randn(np.asarray(included).size, parameter.numel(), generator=g, dtype=torch.float64)
        d /= torch.linalg.vector_norm(d, dim=1, keepdim=True)
        return cls(parameter, d, None, included, gradient_norm)

    def attach(self, optimizer: object, *, sample_rate: float = math.nan) -> None:
        """Read each step's released gradient from this :class:`~dpnotebook.privacy.DPOptimizer` (a step hook).

        ``sample_rate``: q of the loader (needed for the ``"steps"`` score only).
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

    def _record(self, optimizer: Any) -> None:
        grad = self.parameter.grad
        if grad is None:
            raise RuntimeError("the DP step left no gradient on the canaries' parameter: was it in the optimizer?")
        scale = 1.0 / optimizer.max_grad_norm
        if optimizer.loss_reduction == "mean":  # the step divided by the expected batch times the backward passes
            scale *= optimizer.expected_batch_size * optimizer.accumulated_iterations
        flat = grad.detach().reshape(-1).cpu().double()
        projected = flat[self.coordinates] if self.coordinates is not None else self.directions @ flat  # type: ignore[operator]
        self.projections.append(projected.numpy() * scale)

    def inject(self, canary_ids: Tensor) -> None:
        """Write the crafted gradients into the rows of ``canary_ids`` (one id per row) that hold a canary.

        Call it after ``backward()`` and before ``optimizer.step()``. The canaries' rows of every other
        parameter the optimizer updates are zeroed, so a canary's whole gradient is the crafted one.
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
        if which.max() >= self.included.size:
            raise ValueError(f"canary id {int(which.max())} in the batch, but there are {self.included.size} canaries.")
        if not bool(torch.from_numpy(self.included)[which].all()):
            raise ValueError("a canary left out by its coin is in the batch: put only included canaries in the data.")
        for p in {self.parameter, *self._others}:
            for g, at, _ in _row_slices(grad_sample_parts(p), rows):
                g[at] = 0
        for gs, at, here in _row_slices(parts, rows):  # written in place into each backward pass's tensor
            flat = gs.reshape(gs.shape[0], -1)
            if self.coordinates is not None:
                flat[at, self.coordinates[which[here]].to(flat.device)] = self.gradient_norm
            else:
                flat[at] = (self.gradient_norm * self.directions[which[here]]).to(flat)  # type: ignore[index]

    def scores(self, kind: str = "sum") -> Array:
        """One score per canary, higher when it looks trained on.

        ``kind``: ``"sum"`` (the final update's projection) or ``"steps"`` (every step's likelihood ratio;
        needs noise and the sample rate given to :meth:`attach`).
        """
        if kind not in ("sum", "steps"):
            raise ValueError(f"kind={kind!r} is invalid: pass 'sum' or 'steps'.")
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
        # log(1 - q + q exp((z - 1/2) / sigma^2)), stable for large z
        return np.logaddexp(math.log1p(-q) if q < 1 else -np.inf, math.log(q) + (z - 0.5) / sigma**2).sum(0)


def _row_slices(parts: list[Tensor], rows: Tensor) -> list[tuple[Tensor, Tensor, Tensor]]:
    """``(tensor, its rows among rows, their places in rows)`` for each tensor of a list ``grad_sample``."""
    out, start = [], 0
    for g in parts:
        here = ((rows >= start) & (rows < start + g.shape[0])).nonzero().reshape(-1)
        if here.numel():
            out.append((g, (rows[here] - start).to(g.device), here))
        start += g.shape[0]
    return out


@dataclass
class AuditedRun:
    """What one audited training run shows.

    Attributes:
        model: the trained model (unwrapped).
        epsilon, noise_multiplier, delta: the accountant's (``inf`` and ``nan`` without privacy).
        train_accuracy, test_accuracy: on the training digits and the held-out digits.
        attack: the loss-threshold membership attack, training digits against held-out ones.
        one_run: the canary audit's lower bound on epsilon; included: the coins; canary_scores: ``-loss``.
        sample_rate, steps: the DP-SGD run's q and number of steps (``nan`` and 0 without privacy).
        canaries, digits: ``(inputs, labels)`` of all the canaries; ``(members, non-members)`` digits.
        gradient_canaries: the white-box canaries, if asked for; gradient_audit: their ``"sum"`` bound.
    """

    model: nn.Module
    epsilon: float
    noise_multiplier: float
    delta: float
    train_accuracy: float
    test_accuracy: float
    attack: AttackROC
    one_run: OneRunAudit
    included: Array
    canary_scores: Array
    sample_rate: float = math.nan
    steps: int = 0
    canaries: tuple[Tensor, Tensor] | None = None
    digits: tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]] | None = None
    gradient_canaries: GradientCanaries | None = None
    gradient_audit: OneRunAudit | None = None

    def gradient_audit_of(self, kind: str = "sum") -> OneRunAudit:
        """The one-run bound from the gradient canaries' ``kind`` score, at this run's delta and significance.

        Each call is a separate audit: report the one chosen in advance, or split the significance.
        """
        if self.gradient_canaries is None or self.gradient_audit is None:
            raise ValueError("this run has no gradient canaries: make it with audited_digits_run(gradient_canaries=m).")
        c, significance = self.gradient_canaries, self.gradient_audit.significance
        return audit_one_run(c.scores(kind), c.included, delta=self.delta, significance=significance)

    @property
    def canary_attack(self) -> AttackROC:
        """The same loss attack on the canaries: those trained on against those left out."""
        return attack_roc(self.canary_scores[self.included], self.canary_scores[~self.included])

    def calibrated_canary_attack(self, reference_models: list[nn.Module]) -> AttackROC:
        """:func:`~dpnotebook.audit.calibrated_attack` on the canaries (e.g. with the models of other seeds' runs)."""
        if self.canaries is None:
            raise ValueError("this run kept no canaries: make it with audited_digits_run.")
        x, y = self.canaries
        keep = torch.from_numpy(self.included)
        return calibrated_attack(self.model, reference_models, (x[keep], y[keep]), (x[~keep], y[~keep]))


def _accuracy(model: nn.Module, x: Tensor, y: Tensor) -> float:
    with torch.no_grad():
        return float((model(x).argmax(1) == y).float().mean())


def audited_digits_run(
    *,
    target_epsilon: float | None = None,
    noise_multiplier: float | None = None,
    delta: float = 1e-5,
    members: int = 500,
    canaries: int = 1000,
    gradient_canaries: int = 0,
    epochs: int = 30,
    batch_size: int = 128,
    max_grad_norm: float = 1.0,
    lr: float | None = None,
    hidden: int = 256,
    significance: float = 0.05,
    seed: int = 0,
    device: torch.device | str = "cpu",
) -> AuditedRun:
    """Train on ``members`` digits plus the included canaries, then attack and audit.

    Args:
        target_epsilon: train with DP-SGD at the sigma that spends this epsilon in ``epochs``.
        noise_multiplier: train with DP-SGD at this sigma instead (0: no noise). Neither: plain Adam.
        delta: the accountant's and the audit's delta.
        members: training digits; as many other digits are held out as the non-members.
        canaries: m, random-pixel canaries, each trained on with probability 1/2.
        gradient_canaries: white-box Dirac canaries on first-layer weights no digit reaches (DP-SGD only).
        epochs, batch_size, max_grad_norm, hidden: of the training and of the MLP.
        lr: of Adam without privacy (default 3e-3), of SGD with DP-SGD (default 2.0).
        significance: the audit's chance of being wrong.
        seed: seeds the model, the coins, the batches and the noise.
        device: where the model trains; data, coins, batches, attacks and audits stay on the CPU
            (the noise is drawn on ``device``: a GPU run does not repeat the CPU run's numbers).

    Raises:
        ValueError: an invalid argument (both ``target_epsilon`` and ``noise_multiplier``,
            too many ``members`` or ``gradient_canaries``, a ``device`` this machine lacks).
    """
    from dpnotebook.datasets import load_digits_tensors
    from dpnotebook.models import MLP
    from dpnotebook.privacy import PrivacyEngine, unwrap_model

    if target_epsilon is not None and noise_multiplier is not None:
        raise ValueError("both target_epsilon and noise_multiplier given: pass one (or neither for plain SGD).")
    private = target_epsilon is not None or noise_multiplier is not None
    if gradient_canaries and not private:
        raise ValueError(
            f"gradient_canaries={gradient_canaries} without DP-SGD: gradient canaries audit the DP step. "
            "Fix: pass target_epsilon or noise_multiplier (0 for clipping without noise)."
        )
    device = check_device(device)
    x_all, y_all = load_digits_tensors()[0].tensors
    if 2 * members > len(x_all):
        raise ValueError(f"members={members} is invalid: at most {len(x_all) // 2} (as many digits are held out).")
    order = torch.randperm(len(x_all), generator=torch.Generator().manual_seed(seed))
    x_in, y_in = x_all[order[:members]], y_all[order[:members]]
    x_out, y_out = x_all[order[members : 2 * members]], y_all[order[members : 2 * members]]
    x_can, y_can = random_image_canaries(canaries, seed=seed + 1, blank=(x_all == 0).all(0))  # pixels no digit uses
    included = draw_inclusion(canaries, seed=seed + 2)
    keep = torch.from_numpy(included)
    x_train, y_train = torch.cat([x_in, x_can[keep]]), torch.cat([y_in, y_can[keep]])
    ids = torch.full((len(y_train),), -1, dtype=torch.long)  # -1: an ordinary row; i: gradient canary i

    torch.manual_seed(seed)
    mlp = MLP(hidden=hidden)
    model: nn.Module = mlp
    grad_canaries = None
    if gradient_canaries:
        first = mlp.net[1]  # the MLP's first Linear layer
        assert isinstance(first, nn.Linear)
        free = unreached_coordinates(first.weight, x_train)
        if gradient_canaries > free.numel():
            raise ValueError(
                f"gradient_canaries={gradient_canaries} is invalid: only {free.numel()} first-layer weights are "
                "reached by no training record. Fix: pass at most that many."
            )
        pick = torch.randperm(free.numel(), generator=torch.Generator().manual_seed(seed + 5))[:gradient_canaries]
        coins = draw_inclusion(gradient_canaries, seed=seed + 6)
        grad_canaries = GradientCanaries.dirac(first.weight, free[pick], coins, gradient_norm=10 * max_grad_norm)
        ids = torch.cat([ids, torch.from_numpy(np.flatnonzero(coins))])  # their rows: zero inputs, label 0
        x_train = torch.cat([x_train, x_train.new_zeros(int(coins.sum()), *x_train.shape[1:])])
        y_train = torch.cat([y_train, y_train.new_zeros(int(coins.sum()))])
    mlp.to(device)
    optimizer: torch.optim.Optimizer
    if private:
        optimizer = torch.optim.SGD(model.parameters(), lr=2.0 if lr is None else lr)
    else:
        optimizer = torch.optim.Adam(model.parameters(), lr=3e-3 if lr is None else lr)
    # private: make_private replaces the shuffle by Poisson sampling, drawn with this generator
    loader = DataLoader(
        TensorDataset(x_train, y_train, ids),
        batch_size=batch_size,
        shuffle=not private,
        generator=torch.Generator().manual_seed(seed + 3),
    )
    epsilon, sigma, sample_rate, steps = math.inf, math.nan, math.nan, 0
    if private:
        engine = PrivacyEngine(accountant="pld", secure_mode=False)
        noise = torch.Generator(device=device).manual_seed(seed + 4)
        common: dict[str, Any] = dict(
            module=model, optimizer=optimizer, data_loader=loader, max_grad_norm=max_grad_norm, noise_generator=noise
        )
        if target_epsilon is not None:
            made = engine.make_private_with_epsilon(
                target_epsilon=target_epsilon, target_delta=delta, epochs=epochs, **common
            )
        else:
            assert noise_multiplier is not None  # private without a target epsilon
            made = engine.make_private(noise_multiplier=noise_multiplier, **common)
        model, optimizer, loader = made[:3]
        sample_rate, sigma = float(engine.sample_rate or math.nan), optimizer.noise_multiplier
        if grad_canaries is not None:
            grad_canaries.attach(optimizer, sample_rate=sample_rate)
    for _ in range(epochs):
        for xb, yb, ib in loader:
            optimizer.zero_grad()
            if len(yb):
                nn.functional.cross_entropy(model(xb.to(device)), yb.to(device)).backward()
                if grad_canaries is not None:
                    grad_canaries.inject(ib)
            optimizer.step()
    if private:
        steps = sum(n for _, _, n in engine.accountant.history)
        epsilon = engine.get_epsilon(delta) if sigma > 0 else epsilon
    plain = (unwrap_model(model) if private else model).cpu()  # the attacks and audits run on the CPU
    plain.eval()
    scores = -example_losses(plain, x_can, y_can).numpy()
    return AuditedRun(
        model=plain,
        epsilon=epsilon,
        noise_multiplier=sigma,
        delta=delta,
        train_accuracy=_accuracy(plain, x_in, y_in),
        test_accuracy=_accuracy(plain, x_out, y_out),
        attack=loss_threshold_attack(plain, (x_in, y_in), (x_out, y_out)),
        one_run=audit_one_run(scores, included, delta=delta, significance=significance),
        included=included,
        canary_scores=scores,
        sample_rate=sample_rate,
        steps=steps,
        canaries=(x_can, y_can),
        digits=((x_in, y_in), (x_out, y_out)),
        gradient_canaries=grad_canaries,
        gradient_audit=None
        if grad_canaries is None
        else audit_one_run(grad_canaries.scores("sum"), grad_canaries.included, delta=delta, significance=significance),
    )
