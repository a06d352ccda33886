"""``opacus.accountants.utils`` under dpnotebook: ``get_noise_multiplier`` with Opacus' defaults.

>>> sigma = get_noise_multiplier(target_epsilon=2.0, target_delta=1e-5, sample_rate=0.01, epochs=1)
>>> 0.5 < sigma < 2.0
True
"""

from __future__ import annotations

from typing import Any

from dpnotebook.privacy import get_noise_multiplier as _calibrate

__all__ = ["get_noise_multiplier"]


def get_noise_multiplier(
    *,
    target_epsilon: float,
    target_delta: float,
    sample_rate: float,
    epochs: int | None = None,
    steps: int | None = None,
    accountant: str = "rdp",
    epsilon_tolerance: float = 0.01,
    **kwargs: Any,
) -> float:
    """Opacus' signature (default ``accountant="rdp"``) over :func:`dpnotebook.privacy.get_noise_multiplier`.

    ``epochs`` means ``epochs / sample_rate`` steps, as in Opacus. Extra keyword
    arguments (Opacus passes its accountant's options) are refused by name.
    """
    if kwargs:
        raise TypeError(f"get_noise_multiplier() got unexpected keyword argument(s) {sorted(kwargs)}.")
    return _calibrate(
        target_epsilon=target_epsilon,
        target_delta=target_delta,
        sample_rate=sample_rate,
        epochs=epochs,
        steps=steps,
        accountant=accountant,
        epsilon_tolerance=epsilon_tolerance,
    )
