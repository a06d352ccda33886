"""Privacy accounting: the epsilon a run has spent, computed by Google's ``dp_accounting``.

Each DP-SGD step is a *Poisson-subsampled Gaussian mechanism*: every sample
is in the batch with probability ``q`` (``sample_rate``) and the clipped sum
gets Gaussian noise of std ``sigma * C`` (``sigma`` = ``noise_multiplier``).
An accountant records the steps and composes them into ``(epsilon, delta)``.
No formula is written here: every number comes from ``dp_accounting``.

Two accountants, in one registry (:func:`create_accountant`):

* ``"rdp"``: Renyi DP (Mironov 2017), fast, a little pessimistic.
* ``"pld"``: privacy loss distributions (Koskela et al. 2020, Doroshenko et
  al. 2022), tighter, slower for many steps or small ``sigma``. ``"prv"``
  (Opacus' default, Gopi et al. 2021) computes the same privacy loss
  distribution numerically, so it is accepted as an alias of ``"pld"``.

The history is a list of ``(noise_multiplier, sample_rate, num_steps)``, so
``sigma`` and ``q`` may change during training; epsilon is recomputed from
it (and cached) on request.

>>> acc = create_accountant("rdp")
>>> acc.step(noise_multiplier=1.1, sample_rate=256 / 60000, num_steps=14062)
>>> round(acc.get_epsilon(1e-5), 2)
2.6
>>> acc.history
[(1.1, 0.004266666666666667, 14062)]
"""

from __future__ import annotations

import contextlib
import functools
import logging
import warnings
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import dp_accounting

from dpnotebook.privacy._arguments import (
    check_choice,
    check_delta,
    check_noise_multiplier,
    check_positive_int,
    check_positive_number,
    check_sample_rate,
)
from dpnotebook.privacy.pld_grid import composition_widening, pld_grid_points

__all__ = [
    "Accountant",
    "RDPAccountant",
    "PLDAccountant",
    "ACCOUNTANTS",
    "available_accountants",
    "create_accountant",
    "compute_epsilon",
]

History = tuple[tuple[float, float, int], ...]


class Accountant:
    """Records DP-SGD steps and turns them into epsilon with a ``dp_accounting`` accountant.

    Subclasses set ``mechanism`` and build the ``dp_accounting`` accountant in
    :meth:`new_dp_accountant`.

    Attributes:
        history: ``[(noise_multiplier, sample_rate, num_steps), ...]``; consecutive
            steps with the same ``sigma`` and ``q`` are merged into one entry.
    """

    mechanism: ClassVar[str] = ""

    def __init__(self) -> None:
        self.history: list[tuple[float, float, int]] = []

    def new_dp_accountant(self) -> dp_accounting.PrivacyAccountant:
        """A fresh, empty ``dp_accounting`` accountant of this kind."""
        raise NotImplementedError

    def dp_accountant_for(self, history: History) -> dp_accounting.PrivacyAccountant:
        """A fresh ``dp_accounting`` accountant fit to compose ``history`` (by default :meth:`new_dp_accountant`)."""
        return self.new_dp_accountant()

    def options(self) -> tuple[tuple[str, Any], ...]:
        """The constructor options, as a hashable tuple (they are part of the cache key)."""
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
        """Opacus' step hook: ``optimizer.attach_step_hook(acc.get_optimizer_hook_fn(sample_rate=q))``.

        Each optimizer step then records one step at the optimizer's current noise multiplier.
        """
        sample_rate = check_sample_rate(sample_rate)

        def hook(optimizer: Any) -> None:
            self.step(noise_multiplier=optimizer.noise_multiplier, sample_rate=sample_rate)

        return hook

    def state_dict(self) -> dict[str, Any]:
        """Plain Python data for ``torch.save`` (safe with ``weights_only=True``)."""
        return {"mechanism": self.mechanism, "history": [list(h) for h in self.history]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Replace the history by the one in ``state`` (from :meth:`state_dict`)."""
        history = []
        for sigma, q, n in state["history"]:
            history.append((check_noise_multiplier(sigma), check_sample_rate(q), check_positive_int("num_steps", n)))
        self.history = history

    def __repr__(self) -> str:
        return f"{type(self).__name__}(steps={len(self)}, history={self.history})"


class RDPAccountant(Accountant):
    """Renyi-DP accounting (``dp_accounting.rdp.RdpAccountant``).

    At small sigma with a large sampling rate, ``dp_accounting``'s series for some
    low orders does not converge; it leaves those orders out of the minimum (the
    epsilon stays a valid upper bound, possibly a looser one) and logs a warning
    per order. Those log lines are silenced here: in a notebook or a widget they
    would bury the result.

    Args:
        orders: the Renyi orders to optimise over (``None``: dp_accounting's defaults).
    """

    mechanism = "rdp"

    def __init__(self, *, orders: tuple[float, ...] | None = None) -> None:
        super().__init__()
        self.orders = None if orders is None else tuple(float(a) for a in orders)

    def new_dp_accountant(self) -> dp_accounting.PrivacyAccountant:
        return dp_accounting.rdp.RdpAccountant(orders=self.orders)

    def options(self) -> tuple[tuple[str, Any], ...]:
        return (("orders", self.orders),)


class PLDAccountant(Accountant):
    """Privacy-loss-distribution accounting (``dp_accounting.pld.PLDAccountant``).

    The privacy loss lives on a grid of step ``value_discretization_interval``
    spanning every loss the mechanism reaches; ``n`` steps are composed by an
    FFT over a wider grid (:func:`~dpnotebook.privacy.pld_grid.composition_widening`). A tiny
    ``sigma`` makes the loss range huge (about ``1 / sigma**2``: 5e5 at
    ``sigma=1e-3``), and the grid with it (gigabytes, minutes). So before
    calling ``dp_accounting`` the grid size is estimated (:func:`~dpnotebook.privacy.pld_grid.pld_grid_points`)
    and, when it passes ``MAX_POINTS`` for one step or ``MAX_COMPOSED_POINTS``
    composed, the interval is widened to fit, with a ``UserWarning``. The answer
    stays a valid upper bound on epsilon (``dp_accounting`` rounds pessimistically
    at any interval), only a looser one; at such a sigma epsilon is in the
    thousands anyway.

    Args:
        value_discretization_interval: the grid step of the privacy loss. The
            result is a pessimistic (upper) bound at any step; a smaller one is
            tighter but slower. The default 1e-3 is within about 0.01 of 1e-4
            for typical DP-SGD settings and 10 times faster.

    >>> import warnings
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     eps = compute_epsilon(noise_multiplier=1e-3, sample_rate=0.5, steps=10, delta=1e-5)
    >>> print(str(caught[0].message).split(" (still")[0])
    PLD accounting of noise_multiplier=0.001, sample_rate=0.5 (10 steps) needs 5.1e+08 grid points per step (5.1e+09 composed) at value_discretization_interval=0.001; using 2.55 instead
    >>> f"{eps:.3g}", f"{compute_epsilon(noise_multiplier=1e-3, sample_rate=0.5, steps=10, delta=1e-5, accountant='rdp'):.3g}"
    ('5.01e+06', '5.5e+06')
    """

    mechanism = "pld"
    #: the most grid points of one step's privacy loss distribution (about 1 s, 50 MB)
    MAX_POINTS: ClassVar[int] = 200_000
    #: the most grid points estimated for the composition of all steps (about 3 s, 1 GB)
    MAX_COMPOSED_POINTS: ClassVar[int] = 10_000_000

    def __init__(self, *, value_discretization_interval: float = 1e-3) -> None:
        super().__init__()
        self.value_discretization_interval = check_positive_number(
            "value_discretization_interval", value_discretization_interval
        )

    def new_dp_accountant(self, interval: float | None = None) -> dp_accounting.PrivacyAccountant:
        interval = self.value_discretization_interval if interval is None else interval
        return dp_accounting.pld.PLDAccountant(value_discretization_interval=interval)

    def dp_accountant_for(self, history: History) -> dp_accounting.PrivacyAccountant:
        interval = self.value_discretization_interval
        points = [pld_grid_points(sigma, q, interval) for sigma, q, _ in history]  # about 1 ms each
        single = max(points)
        composed = sum(p * composition_widening(q, n) for p, (_, q, n) in zip(points, history, strict=True))
        scale = max(1.0, single / self.MAX_POINTS, composed / self.MAX_COMPOSED_POINTS)
        if scale > 1.0:
            wider = interval * scale
            warnings.warn(
                f"PLD accounting of {_describe(history)} needs {single:.3g} grid points per step "
                f"({composed:.3g} composed) at value_discretization_interval={interval}; using {wider:.3g} "
                "instead (still an upper bound on epsilon, a looser one), to keep within "
                f"{self.MAX_POINTS:.3g} and {self.MAX_COMPOSED_POINTS:.3g} points. Such a small noise_multiplier "
                "gives no meaningful privacy; raise it, or use accountant='rdp'.",
                stacklevel=4,
            )
            return self.new_dp_accountant(wider)
        return self.new_dp_accountant()

    def options(self) -> tuple[tuple[str, Any], ...]:
        return (("value_discretization_interval", self.value_discretization_interval),)


def _describe(history: History) -> str:
    parts = [f"noise_multiplier={s}, sample_rate={q} ({n} steps)" for s, q, n in history]
    return "; ".join(parts)


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


@contextlib.contextmanager
def _quiet_absl() -> Iterator[None]:
    """Hold back ``dp_accounting``'s absl log warnings (see :class:`RDPAccountant`)."""
    log = logging.getLogger("absl")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


@functools.lru_cache(maxsize=4096)
def _epsilon(kind: type[Accountant], options: tuple, history: History, delta: float) -> float:
    """Epsilon of ``history`` at ``delta``: compose every entry in a fresh ``dp_accounting`` accountant."""
    if not history:
        return 0.0
    accountant = kind(**dict(options)).dp_accountant_for(history)
    with _quiet_absl():
        for sigma, q, n in history:
            event = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma))
            accountant.compose(event, n)
        return float(accountant.get_epsilon(delta))


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
