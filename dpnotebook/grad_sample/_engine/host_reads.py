"""Whether a step's per-sample work may read the device on the host: not while a CUDA graph captures it.

A few places branch on the data for a rare case: the DP step's check for non-finite norms
(:func:`~dpnotebook.privacy._mechanisms.nonfinite_mask`) and ghost mode's float64 guard of a Gram norm
(:func:`~dpnotebook.grad_sample.samplers.linear_norm.guard_gram`). Each reads one number from the device
to decide, which a GPU waits for and a CUDA graph's capture refuses. Inside :func:`without_host_reads`
(:class:`~dpnotebook.privacy.GraphedStep` runs its step there) each computes its rare case for every
sample and selects with ``torch.where``, reading nothing: the same result, or one at least as large
where a norm is concerned, at the cost of the extra work.

>>> host_reads_allowed()
True
>>> with without_host_reads():
...     host_reads_allowed()
False
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

_OFF = [0]  # > 0 inside without_host_reads()


def host_reads_allowed() -> bool:
    """``False`` inside :func:`without_host_reads`: decide on the device, never by reading it."""
    return not _OFF[0]


@contextlib.contextmanager
def without_host_reads() -> Iterator[None]:
    """Inside it, the per-sample work and the DP step read nothing from the device (they can be captured)."""
    _OFF[0] += 1
    try:
        yield
    finally:
        _OFF[0] -= 1
