"""What a step a CUDA graph captures may not do: read the device on the host, or keep buffers between steps.

A few places branch on the data for a rare case: the DP step's check for non-finite norms
(:func:`~dpnotebook.privacy._mechanisms.nonfinite_mask`), ghost mode's float64 guard of a Gram norm
(:func:`~dpnotebook.grad_sample.samplers.linear_norm.guard_gram`) and its embedding norms (``unique``).
Each reads from the device to decide, which a GPU waits for and a capture refuses. Inside
:func:`capturable_step` (:class:`~dpnotebook.privacy.GraphedStep` runs its step there) each computes
its rare case for every sample and selects with ``torch.where``, reading nothing: the same result, or one
at least as large where a norm is concerned.

Buffers kept from one step to the next (ghost mode's scratch, the opt-in reused result buffers) would be
made outside the graph's memory and could be replaced by a step run outside it, leaving a replay
writing into freed memory. Inside :func:`capturable_step` every buffer is made fresh: in a capture,
it is the graph's own.

>>> host_reads_allowed(), buffers_kept()
(True, True)
>>> with capturable_step():
...     host_reads_allowed(), buffers_kept()
(False, False)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

_INSIDE = [0]  # > 0 inside capturable_step()


def host_reads_allowed() -> bool:
    """``False`` inside :func:`capturable_step`: decide on the device, never by reading it."""
    return not _INSIDE[0]


def buffers_kept() -> bool:
    """``False`` inside :func:`capturable_step`: make every buffer fresh, keep none for the next step."""
    return not _INSIDE[0]


@contextlib.contextmanager
def capturable_step() -> Iterator[None]:
    """Inside it, the per-sample work and the DP step read nothing from the device and keep no buffer."""
    _INSIDE[0] += 1
    try:
        yield
    finally:
        _INSIDE[0] -= 1
