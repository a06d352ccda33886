"""Peak memory of per-sample gradients with augmentation multiplicity K.

``python -m dpnotebook.benchmarks.memory [--batch 32] [--ks 1 16] [--mode hooks]``

Every configuration runs in its own subprocess, and we read that process's peak
resident memory (``VmHWM`` on Linux, which a new program starts afresh; ``ru_maxrss``
elsewhere, which on Linux would carry over the high-water mark of the process
that launched it, such as a 400 MB Jupyter kernel). For each K we run the same B*K rows twice: a
plain forward+backward, and the same with per-sample gradients. Their
difference is what per-sample gradients cost, and it is what should grow with
B, not with B*K: the forward activations of B*K rows are needed either way.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys


def peak_rss_mb() -> float:
    """This process's peak resident memory in MB."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _measure(mode: str, batch: int, K: int, private: bool) -> dict:
    import torch
    import torch.nn.functional as F

    import dpnotebook
    from dpnotebook.benchmarks.models import SampleConvNet

    torch.set_num_threads(2)
    torch.manual_seed(0)
    model = SampleConvNet()
    x = torch.randn(batch * K, 1, 28, 28)
    y = torch.randint(0, 10, (batch * K,))
    if private:
        model = dpnotebook.wrap_model(model, mode, K=K)
    before = peak_rss_mb()
    for _ in range(3):
        model.zero_grad()
        F.cross_entropy(model(x), y).backward()
    return {"mode": mode, "B": batch, "K": K, "private": private, "rss0_mb": before, "peak_mb": peak_rss_mb()}


def run(mode: str, batch: int, ks: list[int]) -> list[dict]:
    rows = []
    for K in ks:
        result = {}
        for private in (False, True):
            args = [sys.executable, "-m", "dpnotebook.benchmarks.memory", "--child", mode, str(batch), str(K), str(int(private))]
            out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
            result[private] = json.loads(out.strip().splitlines()[-1])
        rows.append({
            "K": K,
            "plain_peak_mb": result[False]["peak_mb"],
            "private_peak_mb": result[True]["peak_mb"],
            "grad_sample_mb": result[True]["peak_mb"] - result[False]["peak_mb"],
        })
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--ks", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--mode", default="hooks")
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        mode, batch, K, private = args.child
        print(json.dumps(_measure(mode, int(batch), int(K), bool(int(private)))))
        return
    rows = run(args.mode, args.batch, args.ks)
    print(f"SampleConvNet, B={args.batch}, mode={args.mode}: peak RSS per configuration (own process)")
    print(f"{'K':>4} {'plain MB':>10} {'private MB':>11} {'per-sample grads MB':>20}")
    for r in rows:
        print(f"{r['K']:>4} {r['plain_peak_mb']:>10.1f} {r['private_peak_mb']:>11.1f} {r['grad_sample_mb']:>20.1f}")
    base = rows[0]["grad_sample_mb"]
    for r in rows[1:]:
        print(f"per-sample-gradient memory K={r['K']} / K={rows[0]['K']}: {r['grad_sample_mb'] / base:.2f}x")


if __name__ == "__main__":
    main()
