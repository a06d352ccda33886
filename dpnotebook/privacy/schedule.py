"""How many DP-SGD steps a run takes: the one rule that sampling, calibration and the widgets share.

A Poisson loader with sampling rate ``q`` runs ``round(1 / q)`` steps per epoch
(one pass over the data in expectation), and ``epochs`` epochs run
``epochs * steps_per_epoch`` steps, rounded up. The noise multiplier is
calibrated for exactly that number: calibrating for fewer steps than the loader
runs would spend more than the target epsilon.

>>> steps_per_epoch(0.6), steps_per_epoch(1 / 93)
(2, 93)
>>> steps_for_epochs(1, steps_per_epoch(0.6)), steps_for_epochs(2.5, 10)
(2, 25)
"""

from __future__ import annotations

import math

from dpnotebook.privacy._arguments import check_positive_int, check_positive_number, check_sample_rate

__all__ = ["steps_per_epoch", "steps_for_epochs"]


def steps_per_epoch(sample_rate: float) -> int:
    """Batches per epoch of a Poisson loader with rate ``q``: ``max(1, round(1 / q))``."""
    return max(1, round(1 / check_sample_rate(sample_rate)))


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
