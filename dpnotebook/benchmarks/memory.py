"""Peak memory of per-sample gradients with augmentation multiplicity K.

``python -m dpnotebook.benchmarks.memory [--batch 32] [--ks 1 16] [--modes hooks ghost] [--repeats 3]``

Every configuration runs in its own subprocess, and we read that process's peak
resident memory over its second and third steps (``VmHWM`` on Linux, which a new program starts afresh; ``ru_maxrss``
elsewhere, which on Linux would carry over the high-water mark of the process
that launched it, such as a 400 MB Jupyter kernel). For each K we run the same B*K rows twice: a
plain forward+backward, and the same with per-sample gradients. Their
difference is what per-sample gradients cost, and it is what should grow with
B, not with B*K: the forward activations of B*K rows are needed either way.
In ghost mode the per-sample norms are computed too (that is where its
convolutions form their per-sample gradients).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from typing import TYPE_CHECKING, cast

from dpnotebook.benchmarks.rss import peak_mb, reset_peak

if TYPE_CHECKING:  # for the annotations only: torch is imported inside the measured child (_measure)
    from torch import nn

    from dpnotebook.grad_sample import GhostGradSampleModule


def _measure(mode: str, batch: int, K: int, private: bool) -> dict:
    import torch
    import torch.nn.functional as F

    import dpnotebook
    from dpnotebook.benchmarks.models import SampleConvNet

    torch.set_num_threads(2)
    torch.manual_seed(0)
    model: nn.Module = SampleConvNet()
    x = torch.randn(batch * K, 1, 28, 28)
    y = torch.randint(0, 10, (batch * K,))
    if private:
        model = dpnotebook.wrap_model(model, mode, K=K)
    before = peak_mb()
    for step in range(3):
        if step == 1:  # the first step's one-off work (lazy imports, choosing conv methods) is not counted
            reset_peak()
        model.zero_grad()
        F.cross_entropy(model(x), y).backward()
        if private and mode == "ghost":
            cast("GhostGradSampleModule", model).per_sample_norms()
    return {"mode": mode, "B": batch, "K": K, "private": private, "rss0_mb": before, "peak_mb": peak_mb()}


def _peak(mode: str, batch: int, K: int, private: bool) -> float:
    args = [
        sys.executable,
        "-m",
        "dpnotebook.benchmarks.memory",
        "--child",
        mode,
        str(batch),
        str(K),
        str(int(private)),
    ]
    out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])["peak_mb"]


def run(mode: str, batch: int, ks: list[int], repeats: int = 3) -> list[dict]:
    """For each K: the median peak of ``repeats`` processes, plain and private (alternately)."""
    rows = []
    for K in ks:
        peaks: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(repeats):
            for private in (False, True):
                peaks[private].append(_peak(mode, batch, K, private))
        plain_mb, private_mb = statistics.median(peaks[False]), statistics.median(peaks[True])
        rows.append(
            {"K": K, "plain_peak_mb": plain_mb, "private_peak_mb": private_mb, "grad_sample_mb": private_mb - plain_mb}
        )
    return rows


#: Below this many MB the difference between two peaks is measurement noise (page granularity, allocator).
NOISE_MB = 2.0


def summary(rows: list[dict]) -> str:
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
    from dpnotebook.modes import available_modes

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


if __name__ == "__main__":
    main()
