"""One digits model, attacked two ways: membership inference and a one-run epsilon audit.

:func:`audited_digits_run` trains a small MLP on part of scikit-learn's digits together with
``canaries`` random black-and-white images with random labels, each put in the training set on a fair
coin. Then it runs the loss-threshold membership attack (training digits against held-out
digits) and turns the canaries' scores into an empirical lower bound on epsilon
(:func:`~dpnotebook.audit.one_run.audit_one_run`), next to the accountant's epsilon. The
same call trains without privacy (plain Adam), with DP-SGD at a given sigma (``0`` included),
or with the sigma that meets a target epsilon.

That audit is *black-box*: it sees only the final model's losses. With ``gradient_canaries=m`` a DP-SGD
run also carries ``m`` white-box gradient canaries (:mod:`~dpnotebook.audit.gradient_canaries`): Dirac
gradients on first-layer weights of the pixels that are blank in every digit (and in every input canary),
so no other record reaches their coordinates. They are rows of the training data, sampled and clipped
like the others, each in on its own fair coin; :attr:`AuditedRun.gradient_audit` is the one-run bound from
their scores.

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
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from dpnotebook.audit.canaries import draw_inclusion, random_image_canaries
from dpnotebook.audit.gradient_canaries import GradientCanaries, unreached_coordinates
from dpnotebook.audit.membership import example_losses, loss_threshold_attack
from dpnotebook.audit.one_run import OneRunAudit, audit_one_run
from dpnotebook.audit.roc import AttackROC
from dpnotebook.device import check_device

__all__ = ["AuditedRun", "audited_digits_run", "random_image_canaries"]


@dataclass
class AuditedRun:
    """What one audited training run shows.

    Attributes:
        model: the trained model (unwrapped).
        epsilon: the accountant's epsilon at ``delta`` (``inf`` without noise).
        noise_multiplier: sigma used (``nan`` without privacy).
        delta: the delta of the accountant and of the audit.
        train_accuracy, test_accuracy: on the training digits and the held-out digits.
        attack: the loss-threshold membership attack, training digits against held-out ones.
        one_run: the canary audit's lower bound on epsilon.
        included: the canaries' coins.
        canary_scores: ``-loss`` of each canary.
        sample_rate, steps: the DP-SGD run's q and number of steps (``nan`` and 0 without privacy), e.g. for
            :func:`~dpnotebook.audit.tradeoff.pld_tpr`.
        canaries: ``(inputs, labels)`` of all the canaries, in the order of ``included``.
        digits: ``((member inputs, labels), (non-member inputs, labels))``, e.g. to slice the attack by class.
        gradient_canaries: the white-box canaries (``None`` unless asked for, and without privacy).
        gradient_audit: the one-run bound from their ``"sum"`` score, the final update's projection.
    """

    model: nn.Module
    epsilon: float
    noise_multiplier: float
    delta: float
    train_accuracy: float
    test_accuracy: float
    attack: AttackROC
    one_run: OneRunAudit
    included: np.ndarray
    canary_scores: np.ndarray
    sample_rate: float = math.nan
    steps: int = 0
    canaries: tuple[Tensor, Tensor] | None = None
    digits: tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]] | None = None
    gradient_canaries: GradientCanaries | None = None
    gradient_audit: OneRunAudit | None = None

    def gradient_audit_of(self, kind: str = "sum") -> OneRunAudit:
        """The one-run bound from the gradient canaries' ``kind`` score (see
        :meth:`~dpnotebook.audit.gradient_canaries.GradientCanaries.scores`), at this run's delta and significance.

        Each call is a separate audit at the run's significance: report the one chosen in advance, or
        split the significance between those reported.
        """
        if self.gradient_canaries is None or self.gradient_audit is None:
            raise ValueError("this run has no gradient canaries: make it with audited_digits_run(gradient_canaries=m).")
        c = self.gradient_canaries
        return audit_one_run(
            c.scores(kind), c.included, delta=self.delta, significance=self.gradient_audit.significance
        )

    @property
    def canary_attack(self) -> AttackROC:
        """The same loss attack on the canaries: those trained on against those left out."""
        from dpnotebook.audit.roc import attack_roc

        return attack_roc(self.canary_scores[self.included], self.canary_scores[~self.included])

    def calibrated_canary_attack(self, reference_models: list[nn.Module]) -> AttackROC:
        """The calibrated attack (:func:`~dpnotebook.audit.membership.calibrated_attack`) on the canaries.

        ``reference_models`` must not have trained on these canaries: e.g. the models of runs with
        other seeds, which drew other canaries.
        """
        if self.canaries is None:
            raise ValueError("this run kept no canaries: make it with audited_digits_run.")
        from dpnotebook.audit.membership import calibrated_attack

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
        noise_multiplier: train with DP-SGD at this sigma instead (0: clipped, no noise).
            With neither, plain Adam (not private).
        delta: the accountant's and the audit's delta.
        members: training digits; as many other digits are held out as the non-members.
        canaries: m, random-pixel canaries, each trained on with probability 1/2.
        gradient_canaries: white-box Dirac gradient canaries, each in the data with probability 1/2
            (DP-SGD runs only; at most the first-layer weights of the pixels blank in every digit).
        epochs: passes over the training set.
        batch_size: the (expected) batch size.
        max_grad_norm: C for DP-SGD.
        lr: learning rate: of Adam without privacy (default 3e-3, fits the training set), of SGD
            with DP-SGD (default 2.0).
        hidden: the MLP's hidden width.
        significance: the audit's chance of being wrong.
        seed: seeds the model, the coins, the batches and the noise.
        device: where the model trains (e.g. :func:`dpnotebook.default_device`); the data, the
            coins and the batches are drawn on the CPU either way, and the attacks and audits
            run on the CPU after training. The noise comes from a generator on ``device``, so a
            GPU run repeats itself but does not repeat the CPU run's numbers.

    Raises:
        ValueError: an invalid argument (both ``target_epsilon`` and ``noise_multiplier``,
            too many ``members`` or ``gradient_canaries``, a ``device`` this machine lacks).
    """
    from dpnotebook.datasets import load_digits_tensors
    from dpnotebook.models import MLP
    from dpnotebook.privacy import PrivacyEngine, unwrap_model

    if target_epsilon is not None and noise_multiplier is not None:
        raise ValueError("both target_epsilon and noise_multiplier given: pass one (or neither for plain SGD).")
    device = check_device(device)
    train, _ = load_digits_tensors()
    x_all, y_all = train.tensors
    if 2 * members > len(x_all):
        raise ValueError(f"members={members} is invalid: at most {len(x_all) // 2} (as many digits are held out).")
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(x_all), generator=g)
    x_in, y_in = x_all[order[:members]], y_all[order[:members]]
    x_out, y_out = x_all[order[members : 2 * members]], y_all[order[members : 2 * members]]
    blank = (x_all != 0).sum(0) == 0  # pixels no digit uses: the canaries leave them blank too
    x_can, y_can = random_image_canaries(canaries, seed=seed + 1, blank=blank)
    included = draw_inclusion(canaries, seed=seed + 2)
    keep = torch.from_numpy(included)
    x_train, y_train = torch.cat([x_in, x_can[keep]]), torch.cat([y_in, y_can[keep]])

    torch.manual_seed(seed)
    mlp = MLP(hidden=hidden)
    model: nn.Module = mlp
    private = target_epsilon is not None or noise_multiplier is not None
    grad_canaries = None
    if gradient_canaries:
        if not private:
            raise ValueError(
                f"gradient_canaries={gradient_canaries} without DP-SGD: gradient canaries audit the DP step. "
                "Fix: pass target_epsilon or noise_multiplier (0 for clipping without noise)."
            )
        first = mlp.net[1]  # the MLP's first Linear layer
        assert isinstance(first, nn.Linear)
        weight = first.weight
        free = unreached_coordinates(weight, x_train)
        if gradient_canaries > free.numel():
            raise ValueError(
                f"gradient_canaries={gradient_canaries} is invalid: only {free.numel()} first-layer weights are "
                "reached by no training record. Fix: pass at most that many."
            )
        pick = torch.randperm(free.numel(), generator=torch.Generator().manual_seed(seed + 5))[:gradient_canaries]
        coins = draw_inclusion(gradient_canaries, seed=seed + 6)
        grad_canaries = GradientCanaries.dirac(weight, free[pick], coins, gradient_norm=10 * max_grad_norm)
        ids = torch.from_numpy(np.flatnonzero(grad_canaries.included)).long()
        ids = torch.cat([torch.full((len(y_train),), -1, dtype=torch.long), ids])
        x_train = torch.cat([x_train, torch.zeros(len(ids) - len(y_train), *x_train.shape[1:])])
        y_train = torch.cat([y_train, torch.zeros(len(ids) - len(y_train), dtype=torch.long)])
    else:
        ids = torch.full((len(y_train),), -1, dtype=torch.long)
    data = TensorDataset(x_train, y_train, ids)
    mlp.to(device)
    optimizer: torch.optim.Optimizer
    if private:
        optimizer = torch.optim.SGD(model.parameters(), lr=2.0 if lr is None else lr)
    else:
        optimizer = torch.optim.Adam(model.parameters(), lr=3e-3 if lr is None else lr)
    # private: make_private replaces the shuffle by Poisson sampling, drawn with this generator
    loader = DataLoader(
        data, batch_size=batch_size, shuffle=not private, generator=torch.Generator().manual_seed(seed + 3)
    )
    epsilon, sigma, sample_rate, steps = math.inf, math.nan, math.nan, 0
    if private:
        engine = PrivacyEngine(accountant="pld", secure_mode=False)
        common: dict[str, Any] = dict(
            module=model,
            optimizer=optimizer,
            data_loader=loader,
            max_grad_norm=max_grad_norm,
            noise_generator=torch.Generator(device=device).manual_seed(seed + 4),
        )
        if target_epsilon is not None:
            made = engine.make_private_with_epsilon(
                target_epsilon=target_epsilon, target_delta=delta, epochs=epochs, **common
            )
        else:
            assert noise_multiplier is not None  # private without a target epsilon
            made = engine.make_private(noise_multiplier=noise_multiplier, **common)
        assert len(made) == 3  # no criterion given: (module, optimizer, data_loader)
        model, dp_optimizer, loader = made
        optimizer, sigma = dp_optimizer, dp_optimizer.noise_multiplier
        if grad_canaries is not None:
            assert engine.sample_rate is not None  # make_private set it
            grad_canaries.attach(dp_optimizer, sample_rate=float(engine.sample_rate))
    for _ in range(epochs):
        for xb, yb, ib in loader:
            optimizer.zero_grad()
            if len(yb):
                nn.functional.cross_entropy(model(xb.to(device)), yb.to(device)).backward()
                if grad_canaries is not None:
                    grad_canaries.inject(ib)
            optimizer.step()
    if private:
        assert engine.sample_rate is not None  # make_private set it
        sample_rate, steps = float(engine.sample_rate), sum(n for _, _, n in engine.accountant.history)
    if private and sigma > 0:
        epsilon = engine.get_epsilon(delta)
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
