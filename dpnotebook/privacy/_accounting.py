"""Privacy accounting: the epsilon a run spends, the noise multiplier a budget allows, and the steps a run takes.

Each DP-SGD step is a Poisson-subsampled Gaussian mechanism (rate ``q``, noise std ``sigma * C``). An
accountant records the steps as ``(noise_multiplier, sample_rate, num_steps)`` and composes them into
``(epsilon, delta)`` with Google's ``dp_accounting``: ``"rdp"`` (Renyi DP, fast, a little pessimistic) or
``"pld"`` (privacy loss distributions, tighter; ``"prv"`` is an alias). :func:`get_noise_multiplier`
inverts :func:`compute_epsilon` for exactly the steps the loader runs.

>>> acc = create_accountant("rdp")
>>> acc.step(noise_multiplier=1.1, sample_rate=256 / 60000, num_steps=14062)
>>> round(acc.get_epsilon(1e-5), 2), acc.history
(2.6, [(1.1, 0.004266666666666667, 14062)])
"""

from __future__ import annotations

import functools
import logging
import math
import warnings
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, ClassVar

from dpnotebook.errors import PrivacyWarning
from dpnotebook.privacy._arguments import (
    check_choice,
    check_delta,
    check_epsilon,
    check_noise_multiplier,
    check_positive_int,
    check_positive_number,
    check_sample_rate,
)

if TYPE_CHECKING:
    import dp_accounting

History = tuple[tuple[float, float, int], ...]


def _dp() -> Any:
    """Google's ``dp_accounting``, imported when first used (with SciPy's parts it takes about a second)."""
    import dp_accounting.pld
    import dp_accounting.rdp

    return dp_accounting


class Accountant:
    """Records DP-SGD steps in ``history`` (equal consecutive entries merged) and turns them into epsilon."""

    mechanism: ClassVar[str] = ""

    def __init__(self) -> None:
        self.history: list[tuple[float, float, int]] = []

    def new_dp_accountant(self) -> dp_accounting.PrivacyAccountant:
        """A fresh, empty ``dp_accounting`` accountant of this kind."""
        raise NotImplementedError

    def dp_accountant_for(self, history: History) -> dp_accounting.PrivacyAccountant:
        """A fresh ``dp_accounting`` accountant fit to compose ``history``."""
        return self.new_dp_accountant()

    def options(self) -> tuple[tuple[str, Any], ...]:
        """The constructor options, hashable (part of the cache key)."""
        return ()

    def step(self, *, noise_multiplier: float, sample_rate: float, num_steps: int = 1) -> None:
        """Record ``num_steps`` DP-SGD steps with noise ``noise_multiplier`` and sample rate ``sample_rate``."""
        sigma = check_noise_multiplier(noise_multiplier)
        q = check_sample_rate(sample_rate)
        n = check_positive_int("num_steps", num_steps)
        if self.history and self.history[-1][:2] == (sigma, q):
            self.history[-1] = (sigma, q, self.history[-1][2] + n)
        else:
            self.history.append((sigma, q, n))

    def __len__(self) -> int:
        """The total number of steps recorded."""
        return sum(n for _, _, n in self.history)

    def get_epsilon(self, delta: float) -> float:
        """The epsilon spent so far at this ``delta`` (0.0 before the first step)."""
        delta = check_delta(delta)
        # mypy rejects type[Self] as Hashable (it checks the instances' __hash__); a class is hashable
        return _epsilon(type(self), self.options(), tuple(self.history), delta)  # type: ignore[arg-type]

    def get_optimizer_hook_fn(self, sample_rate: float) -> Callable[[Any], None]:
        """A step hook recording one step at the optimizer's noise multiplier per optimizer step."""
        sample_rate = check_sample_rate(sample_rate)

        def hook(optimizer: Any) -> None:
            self.step(noise_multiplier=optimizer.noise_multiplier, sample_rate=sample_rate)

        return hook

    def state_dict(self) -> dict[str, Any]:
        """Plain Python data for ``torch.save`` (safe with ``weights_only=True``)."""
        return {"mechanism": self.mechanism, "history": [list(h) for h in self.history]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Replace the history by the one in ``state`` (from :meth:`state_dict`)."""
        self.history = [
            (check_noise_multiplier(s), check_sample_rate(q), check_positive_int("num_steps", n))
            for s, q, n in state["history"]
        ]

    def __repr__(self) -> str:
        return f"{type(self).__name__}(steps={len(self)}, history={self.history})"


class RDPAccountant(Accountant):
    """Renyi-DP accounting (``dp_accounting.rdp.RdpAccountant``) over ``orders`` (``None``: its defaults)."""

    mechanism = "rdp"

    def __init__(self, *, orders: tuple[float, ...] | None = None) -> None:
        super().__init__()
        self.orders = None if orders is None else tuple(float(a) for a in orders)

    def new_dp_accountant(self) -> dp_accounting.PrivacyAccountant:
        return _dp().rdp.RdpAccountant(orders=self.orders)

    def options(self) -> tuple[tuple[str, Any], ...]:
        return (("orders", self.orders),)


class PLDAccountant(Accountant):
    """Privacy-loss-distribution accounting (``dp_accounting.pld.PLDAccountant``).

    A tiny ``sigma`` makes the loss grid huge (gigabytes, minutes): past ``MAX_POINTS`` for one step or
    ``MAX_COMPOSED_POINTS`` composed, the interval is widened to fit, with a ``UserWarning``; epsilon stays an
    upper bound, a looser one.

    Args:
        value_discretization_interval: the grid step of the privacy loss (smaller: tighter, slower).

    >>> import warnings
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     eps = compute_epsilon(noise_multiplier=1e-3, sample_rate=0.5, steps=10, delta=1e-5)
    >>> print(str(caught[0].message).split(" (still")[0])
    PLD accounting of ... needs 5.1e+08 grid points per step (5.1e+09 composed) at ...=0.001; using 2.55 instead
    >>> f"{eps:.3g}", f"{compute_epsilon(noise_multiplier=1e-3, sample_rate=0.5, steps=10, delta=1e-5, accountant='rdp'):.3g}"
    ('5.01e+06', '5.5e+06')
    """

    mechanism = "pld"
    MAX_POINTS: ClassVar[int] = 200_000
    MAX_COMPOSED_POINTS: ClassVar[int] = 10_000_000

    def __init__(self, *, value_discretization_interval: float = 1e-3) -> None:
        super().__init__()
        self.value_discretization_interval = check_positive_number(
            "value_discretization_interval", value_discretization_interval
        )

    def new_dp_accountant(self, interval: float | None = None) -> dp_accounting.PrivacyAccountant:
        interval = self.value_discretization_interval if interval is None else interval
        return _dp().pld.PLDAccountant(value_discretization_interval=interval)

    def dp_accountant_for(self, history: History) -> dp_accounting.PrivacyAccountant:
        interval = self.value_discretization_interval
        points = [pld_grid_points(sigma, q, interval) for sigma, q, _ in history]
        single = max(points)
        composed = sum(p * composition_widening(q, n) for p, (_, q, n) in zip(points, history, strict=True))
        scale = max(1.0, single / self.MAX_POINTS, composed / self.MAX_COMPOSED_POINTS)
        if scale == 1.0:
            return self.new_dp_accountant()
        described = "; ".join(f"noise_multiplier={s}, sample_rate={q} ({n} steps)" for s, q, n in history)
        warnings.warn(
            f"PLD accounting of {described} needs {single:.3g} grid points per step "
            f"({composed:.3g} composed) at value_discretization_interval={interval}; using {interval * scale:.3g} "
            "instead (still an upper bound on epsilon, a looser one), to keep within "
            f"{self.MAX_POINTS:.3g} and {self.MAX_COMPOSED_POINTS:.3g} points. Such a small noise_multiplier "
            "gives no meaningful privacy; raise it, or use accountant='rdp'.",
            stacklevel=4,
        )
        return self.new_dp_accountant(interval * scale)

    def options(self) -> tuple[tuple[str, Any], ...]:
        return (("value_discretization_interval", self.value_discretization_interval),)


def pld_grid_points(noise_multiplier: float, sample_rate: float, interval: float) -> float:
    """How many grid points ``dp_accounting`` uses for one step's privacy loss distribution (none built)."""
    from dp_accounting.pld.privacy_loss_mechanism import AdjacencyType, GaussianPrivacyLoss

    widest = 0.0
    if noise_multiplier == 0 or sample_rate == 0:
        return widest
    for adjacency in (AdjacencyType.REMOVE, AdjacencyType.ADD):
        loss = GaussianPrivacyLoss(noise_multiplier, sampling_prob=sample_rate, adjacency_type=adjacency)
        tail = loss.privacy_loss_tail()
        low, high = loss.privacy_loss(tail.upper_x_truncation), loss.privacy_loss(tail.lower_x_truncation)
        widest = max(widest, float(high - low))
    return widest / interval


def composition_widening(q: float, n: int) -> float:
    """About how many times wider than one step's grid the composition of ``n`` steps is (measured)."""
    return min(n, 1 + 2 * math.sqrt(n) + 16 * math.sqrt(n * q * (1 - q)))


#: The registry: name -> accountant class. ``"prv"`` is an alias of ``"pld"``.
ACCOUNTANTS: dict[str, type[Accountant]] = {"rdp": RDPAccountant, "pld": PLDAccountant, "prv": PLDAccountant}


def available_accountants() -> list[str]:
    """The registered accountant names, sorted.

    >>> available_accountants()
    ['pld', 'prv', 'rdp']
    """
    return sorted(ACCOUNTANTS)


def create_accountant(name: str = "pld", **options: Any) -> Accountant:
    """A new, empty accountant from the registry.

    >>> create_accountant("moments")
    Traceback (most recent call last):
    ...
    ValueError: accountant='moments' is unknown; choose one of ['pld', 'prv', 'rdp'].
    """
    return ACCOUNTANTS[check_choice("accountant", name, ACCOUNTANTS)](**options)


@functools.lru_cache(maxsize=4096)
def _epsilon(kind: type[Accountant], options: tuple[tuple[str, Any], ...], history: History, delta: float) -> float:
    if not history:
        return 0.0
    accountant = kind(**dict(options)).dp_accountant_for(history)
    log = logging.getLogger("absl")  # dp_accounting logs a warning per non-converging RDP order: held back
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        dp = _dp()
        for sigma, q, n in history:
            accountant.compose(dp.PoissonSampledDpEvent(q, dp.GaussianDpEvent(sigma)), n)
        return float(accountant.get_epsilon(delta))
    finally:
        log.setLevel(level)


def compute_epsilon(
    *, noise_multiplier: float, sample_rate: float, steps: int, delta: float, accountant: str = "pld"
) -> float:
    """Epsilon of ``steps`` DP-SGD steps with a fixed ``sigma`` and ``q`` (cached).

    >>> round(compute_epsilon(noise_multiplier=1.1, sample_rate=0.01, steps=100, delta=1e-5), 3)
    0.55
    """
    acc = create_accountant(accountant)
    acc.step(noise_multiplier=noise_multiplier, sample_rate=sample_rate, num_steps=steps)
    return acc.get_epsilon(delta)


def steps_per_epoch(sample_rate: float) -> int:
    """Batches per epoch of a Poisson loader with rate ``q``: ``max(1, round(1 / q))``.

    >>> steps_per_epoch(0.6), steps_per_epoch(1 / 93), steps_for_epochs(2.5, 10)
    (2, 93, 25)
    """
    return max(1, round(1 / check_sample_rate(sample_rate)))


_poisson_steps_per_epoch = steps_per_epoch  # get_noise_multiplier's argument of that name hides it


def steps_for_epochs(epochs: float, steps_per_epoch: int) -> int:
    """The steps ``epochs`` epochs of ``steps_per_epoch`` batches take: ``ceil(epochs * steps_per_epoch)``.

    >>> steps_for_epochs(0, 10)
    Traceback (most recent call last):
    ...
    ValueError: epochs=0 is invalid: it must be a finite number > 0.
    """
    epochs = check_positive_number("epochs", epochs)
    per_epoch = check_positive_int("steps_per_epoch", steps_per_epoch)
    return max(1, math.ceil(epochs * per_epoch))


FIX_BUDGET = (
    "Fix: use more data (a smaller sample rate q = B/N for the same batch), fewer epochs (fewer steps), "
    "or a larger target_epsilon."
)


def get_noise_multiplier(
    *,
    target_epsilon: float,
    target_delta: float,
    sample_rate: float,
    steps: int | None = None,
    epochs: float | None = None,
    steps_per_epoch: int | None = None,
    accountant: str = "pld",
    epsilon_tolerance: float = 0.01,
) -> float:
    """The smallest noise multiplier (within tolerance) whose epsilon is at most ``target_epsilon``.

    The answer is always a sigma whose epsilon was computed and found ``<= target_epsilon`` (sigma
    never overspends). Results are cached.

    Args:
        target_epsilon: the privacy budget epsilon (> 0).
        target_delta: the delta in (0, 1).
        sample_rate: q, the probability that a sample is in a batch.
        steps: the number of steps; or give ``epochs``.
        epochs: instead of ``steps``: ``steps = ceil(epochs * steps_per_epoch)``.
        steps_per_epoch: batches per epoch (default ``round(1 / q)``; pass ``len(data_loader)``).
        accountant: a registry name (``"pld"``, ``"prv"``, ``"rdp"``).
        epsilon_tolerance: how far below the target epsilon may end (> 0).

    >>> sigma = get_noise_multiplier(target_epsilon=1.0, target_delta=1e-5, sample_rate=0.01, steps=100)
    >>> round(sigma, 2), compute_epsilon(noise_multiplier=sigma, sample_rate=0.01, steps=100, delta=1e-5) <= 1.0
    (0.9, True)
    """
    target_epsilon = check_epsilon(target_epsilon)
    target_delta = check_delta(target_delta, name="target_delta")
    sample_rate = check_sample_rate(sample_rate)
    tolerance = check_positive_number("epsilon_tolerance", epsilon_tolerance)
    check_choice("accountant", accountant, ACCOUNTANTS)
    if (steps is None) == (epochs is None):
        raise ValueError(f"steps={steps!r}, epochs={epochs!r}: give exactly one of them.")
    if epochs is not None:
        per_epoch = _poisson_steps_per_epoch(sample_rate) if steps_per_epoch is None else steps_per_epoch
        steps = steps_for_epochs(epochs, per_epoch)
    elif steps_per_epoch is not None:
        raise ValueError(f"steps_per_epoch={steps_per_epoch!r} goes with epochs=, not with steps={steps!r}.")
    steps = check_positive_int("steps", steps)
    return _search_noise_multiplier(target_epsilon, target_delta, sample_rate, steps, accountant, tolerance)


@functools.lru_cache(maxsize=1024)
def _search_noise_multiplier(
    target: float, delta: float, q: float, steps: int, accountant: str, tolerance: float
) -> float:
    def epsilon(sigma: float) -> float:
        return compute_epsilon(noise_multiplier=sigma, sample_rate=q, steps=steps, delta=delta, accountant=accountant)

    low, high = 1.0, 1.0  # invariant: eps(low) > target >= eps(high)
    eps_high = epsilon(high)
    while eps_high > target:
        low, high = high, 2 * high
        if high > 1e6:
            raise ValueError(
                f"target_epsilon={target!r} (delta={delta:g}) cannot be reached with q={q:.4g} and {steps} "
                f"steps: even noise_multiplier=1e6 spends more. {FIX_BUDGET}"
            )
        eps_high = epsilon(high)
    if low == high:
        low = high / 2
        while epsilon(low) <= target:
            high, low = low, low / 2
            if low < 1e-3:
                raise ValueError(f"target_epsilon={target!r} is reached without noise; pick a smaller target.")
        eps_high = epsilon(high)
    while target - eps_high > tolerance and high - low > 1e-9 * high:
        mid = (low + high) / 2
        eps_mid = epsilon(mid)
        if eps_mid > target:
            low = mid
        else:
            high, eps_high = mid, eps_mid
    assert eps_high <= target and math.isfinite(high)
    return high


def warn_if_noise_drowns_signal(noise_multiplier: float, expected_batch_size: float) -> None:
    """Warn (:class:`~dpnotebook.errors.PrivacyWarning`) when ``sigma > B``: every update is then mostly noise."""
    if noise_multiplier > expected_batch_size > 0:
        warnings.warn(
            f"noise_multiplier={noise_multiplier:.6g} with an expected batch of {expected_batch_size:.6g} "
            f"samples: the noise on the averaged gradient has std sigma*C/B = "
            f"{noise_multiplier / expected_batch_size:.3g}*C on every coordinate, more than the whole clipped signal "
            f"can reach (norm <= C): every update is mostly noise, and training learns little if anything (the "
            f"guarantee holds). {FIX_BUDGET}",
            PrivacyWarning,
            stacklevel=3,
        )


def subsampled_gaussian_rdp(noise_multiplier: float, sample_rate: float, alpha: int) -> float:
    """RDP at integer order ``alpha >= 2`` of one step: Gaussian noise σ on a Poisson sample at rate q.

    The binomial expansion of Mironov, Talwar and Zhang (2019), summed in log space.

    >>> subsampled_gaussian_rdp(1.0, 1.0, 2)   # no subsampling: the Gaussian mechanism's α / (2σ²)
    1.0
    """
    if not (isinstance(alpha, int) and alpha >= 2):
        raise ValueError(f"alpha={alpha!r}: the binomial expansion needs an integer order >= 2.")
    if check_sample_rate(sample_rate) == 1:
        return alpha / (2 * noise_multiplier**2)
    terms = [
        math.lgamma(alpha + 1)
        - math.lgamma(k + 1)
        - math.lgamma(alpha - k + 1)
        + (alpha - k) * math.log1p(-sample_rate)
        + k * math.log(sample_rate)
        + (k * k - k) / (2 * noise_multiplier**2)
        for k in range(alpha + 1)
    ]
    top = max(terms)
    return (top + math.log(sum(math.exp(t - top) for t in terms))) / (alpha - 1)


def classic_rdp_epsilon(
    *, noise_multiplier: float, sample_rate: float, steps: int, delta: float, orders: Iterable[int] = range(2, 65)
) -> float:
    """ε by the original RDP conversion (Mironov 2017), for comparison with papers.

    ``ε = min over α of steps · RDP(α) + log(1/δ) / (α - 1)``; the ``"rdp"`` accountant's rule is tighter.

    >>> round(classic_rdp_epsilon(noise_multiplier=1.1, sample_rate=256 / 60000, steps=14062, delta=1e-5), 2)
    3.01
    """
    log_1_delta = math.log(1 / check_delta(delta))
    return min(
        steps * subsampled_gaussian_rdp(noise_multiplier, sample_rate, a) + log_1_delta / (a - 1) for a in orders
    )
