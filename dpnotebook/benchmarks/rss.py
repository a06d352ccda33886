"""Resident memory of this process, for benchmarks that run each configuration in its own process.

On Linux the figures come from ``/proc/self/status``: ``VmRSS`` (now) and
``VmHWM`` (the peak), and the peak can be restarted (``clear_refs``), so a
benchmark can leave its warm-up out. ``ru_maxrss`` is the fallback elsewhere;
on Linux it would carry over the peak of the process that launched this one
(a 400 MB Jupyter kernel, say).

>>> peak_mb() >= rss_mb() > 0
True
"""

from __future__ import annotations

import resource

__all__ = ["rss_mb", "peak_mb", "reset_peak"]


def _status_mb(field: str) -> float | None:
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def _maxrss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def rss_mb() -> float:
    """Resident memory now in MB (Linux), or the peak so far elsewhere.

    >>> rss_mb() > 0
    True
    """
    now = _status_mb("VmRSS")
    return now if now is not None else _maxrss_mb()


def peak_mb() -> float:
    """Peak resident memory in MB since the process started or :func:`reset_peak`.

    >>> peak_mb() > 0
    True
    """
    peak = _status_mb("VmHWM")
    return peak if peak is not None else _maxrss_mb()


def reset_peak() -> None:
    """Restart the peak at the current resident memory (Linux; elsewhere the peak keeps counting).

    >>> reset_peak()
    >>> peak_mb() >= rss_mb() - 1
    True
    """
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
