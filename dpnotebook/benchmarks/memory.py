"""Resident memory of a process, and the peak memory of per-sample gradients with augmentation multiplicity K.

``python -m dpnotebook.benchmarks.memory [--batch 32] [--ks 1 16] [--modes hooks ghost] [--repeats 3]``

On Linux the figures are ``VmRSS`` and ``VmHWM`` of ``/proc/self/status`` (:func:`reset_peak` restarts
the peak); ``ru_maxrss`` elsewhere. Each K runs the same B*K rows in their own processes twice: a plain
forward+backward, and the same with per-sample gradients (ghost mode: and the norms). The difference,
what per-sample gradients cost, should grow with B, not with B*K (``docs/performance.md``).

>>> peak_mb() >= rss_mb() > 0
True
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
from typing import Any


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
    return _status_mb("VmRSS") or _maxrss_mb()


def peak_mb() -> float:
    """Peak resident memory in MB since the process started or :func:`reset_peak`.

    >>> peak_mb() > 0
    True
    """
    return _status_mb("VmHWM") or _maxrss_mb()


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


def _measure(mode: str, batch: int, K: int, private: bool) -> dict[str, Any]:
    import torch

    from dpnotebook.benchmarks.models import build
    from dpnotebook.benchmarks.steps import gsm_step

    torch.set_num_threads(2)
    model, inputs, targets, loss = build("SampleConvNet", batch, K=K, flavour="native")

    def plain() -> None:
        model.zero_grad()
        loss(model(*inputs), targets).backward()

    step = gsm_step(model, mode, inputs, targets, loss, K) if private else plain
    before = peak_mb()
    for i in range(3):
        if i == 1:  # the first step's one-off peak is not counted; what it leaves resident (modules, pages) is
            reset_peak()
        step()
    return {"mode": mode, "B": batch, "K": K, "private": private, "rss0_mb": before, "peak_mb": peak_mb()}


def _peak(mode: str, batch: int, K: int, private: bool) -> float:
    args = [sys.executable, "-m", "dpnotebook.benchmarks.memory", "--child", mode, *map(str, (batch, K, int(private)))]
    out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])["peak_mb"]


def run(mode: str, batch: int, ks: list[int], repeats: int = 3) -> list[dict[str, Any]]:
    """For each K: the median peak of ``repeats`` processes, plain and private (alternately)."""
    rows = []
    for K in ks:
        peaks: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(repeats):
            for private in (False, True):
                peaks[private].append(_peak(mode, batch, K, private))
        plain_mb, private_mb = statistics.median(peaks[False]), statistics.median(peaks[True])
        row = {"K": K, "plain_peak_mb": plain_mb, "private_peak_mb": private_mb}
        rows.append({**row, "grad_sample_mb": private_mb - plain_mb})
    return rows


#: Below this many MB the difference between two peaks is measurement noise (page granularity, allocator).
NOISE_MB = 2.0


def summary(rows: list[dict[str, Any]]) -> str:
    """How per-sample-gradient memory grows from the first K to the others.

    >>> summary([{"K": 1, "grad_sample_mb": 10.0}, {"K": 16, "grad_sample_mb": 12.0}])
    'K=16 / K=1: 1.20x'
    >>> summary([{"K": 1, "grad_sample_mb": 0.2}, {"K": 16, "grad_sample_mb": -10.7}])
    'K=16: -10.7 MB (K=1: 0.2 MB): no more than the plain step (within 2 MB)'
    """
    base = rows[0]
    parts = []
    for r in rows[1:]:
        if base["grad_sample_mb"] > NOISE_MB:
            parts.append(f"K={r['K']} / K={base['K']}: {r['grad_sample_mb'] / base['grad_sample_mb']:.2f}x")
        else:
            verdict = "no more than the plain step" if r["grad_sample_mb"] <= NOISE_MB else "grows"
            parts.append(
                f"K={r['K']}: {r['grad_sample_mb']:.1f} MB (K={base['K']}: {base['grad_sample_mb']:.1f} MB): "
                f"{verdict} (within {NOISE_MB:.0f} MB)"
            )
    return "; ".join(parts)


def main() -> None:
    from dpnotebook import available_modes

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--ks", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--modes", nargs="+", default=list(available_modes()), choices=available_modes())
    parser.add_argument("--repeats", type=int, default=3, help="processes per configuration; the median peak counts")
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        mode, batch, K, private = args.child
        print(json.dumps(_measure(mode, int(batch), int(K), bool(int(private)))))
        return
    for mode in args.modes:
        rows = run(mode, args.batch, args.ks, args.repeats)
        print(f"SampleConvNet, B={args.batch}, mode={mode}: peak RSS per configuration (own process)")
        print(f"{'K':>4} {'plain MB':>10} {'private MB':>11} {'per-sample grads MB':>20}")
        for r in rows:
            print(f"{r['K']:>4} {r['plain_peak_mb']:>10.1f} {r['private_peak_mb']:>11.1f} {r['grad_sample_mb']:>20.1f}")
        print(f"per-sample-gradient memory, {mode}: {summary(rows)}\n")


__all__ = ["rss_mb", "peak_mb", "reset_peak", "run", "summary", "NOISE_MB"]

if __name__ == "__main__":
    main()
