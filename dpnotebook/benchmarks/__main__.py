"""``python -m dpnotebook.benchmarks``: DP-SGD against the non-private step (and Opacus), every mode.

Examples::

    python -m dpnotebook.benchmarks --quick                      # a meaningful subset, a few minutes
    python -m dpnotebook.benchmarks --compare-opacus --json out.json
    python -m dpnotebook.benchmarks --models MLP --batch 128 --modes ghost hooks --kinds dpsgd
    python -m dpnotebook.benchmarks --report out.json            # the tables again
    python -m dpnotebook.benchmarks --profile-ops                # aten ops per DP step, dpnotebook and Opacus
    python -m dpnotebook.benchmarks --transformers               # ghost vs hooks on BERT, GPT-2, Llama, ... (1 thread)

Every configuration runs in its own process (peak RSS is its own); its steps are
timed alternately with the non-private step on the same rows, and the table
shows the median time and the ratio between the two.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time

import torch

from dpnotebook.benchmarks.models import MODELS, TRANSFORMER_MODELS
from dpnotebook.benchmarks.profile_ops import PROFILE_BATCH, profile_table
from dpnotebook.benchmarks.report import ghost_hooks_table, multiplicity_table, opacus_table, results_table
from dpnotebook.benchmarks.steps import MODES
from dpnotebook.benchmarks.suite import KINDS, child_main, plan, run_in_subprocess

QUICK = {
    "models": list(MODELS),
    "batch": [128],
    "modes": ["hooks", "ghost"],
    "kinds": ["gsm", "dpsgd", "naive"],
    "ks": [1, 16],
    "k_models": ["SampleConvNet"],
}
#: ``--transformers``: the Hugging Face transformers and the text transformer, ghost against hooks, one thread.
TRANSFORMERS = {
    "models": [*TRANSFORMER_MODELS, "TextTransformer"],
    "batch": [32],
    "modes": ["hooks", "ghost"],
    "kinds": ["dpsgd"],
    "ks": [1],
    "threads": 1,
    "rival": True,
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m dpnotebook.benchmarks", description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", choices=sorted({*MODELS, *TRANSFORMER_MODELS}), default=list(MODELS))
    p.add_argument("--batch", nargs="+", type=int, default=[32, 128], help="samples per batch B (default 32 128)")
    p.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    p.add_argument(
        "--kinds",
        nargs="+",
        choices=KINDS,
        default=list(KINDS),
        help="gsm: per-sample grads only; dpsgd; naive: microbatching",
    )
    p.add_argument(
        "--ks", nargs="+", type=int, default=[1, 4, 16], help="augmentation multiplicities K (default 1 4 16)"
    )
    p.add_argument("--k-batch", type=int, default=32, help="B of the K > 1 configurations (default 32)")
    p.add_argument(
        "--k-models", nargs="+", choices=sorted(MODELS), help="models of the K > 1 configurations (default: --models)"
    )
    p.add_argument("--k-modes", nargs="+", choices=MODES, default=["hooks", "ghost"])
    p.add_argument("--steps", type=int, default=10, help="timed steps per configuration, at least (default 10)")
    p.add_argument(
        "--min-seconds",
        type=float,
        default=2.0,
        help="then go on timing until the configuration's rounds took this long (default 2.0)",
    )
    p.add_argument("--max-steps", type=int, default=200, help="... but time at most this many steps (default 200)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads (default 2)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--timeout", type=float, default=600, help="seconds per configuration")
    p.add_argument("--compare-opacus", action="store_true", help="also run Opacus 1.6 on the same models (K=1)")
    p.add_argument(
        "--quick",
        action="store_true",
        help="preset: every model at B=128, hooks and ghost, K in {1,16} on SampleConvNet",
    )
    p.add_argument(
        "--transformers",
        action="store_true",
        help="preset: the Hugging Face transformers (BERT, DistilBERT, GPT-2, T5, Llama; T=64, hidden 128) and "
        "TextTransformer at B=32, DP-SGD in hooks and ghost mode, 1 thread, --rival",
    )
    p.add_argument(
        "--profile-ops",
        action="store_true",
        help="count the aten operations (GPU kernel launches) of one DP step, every mode, next to Opacus 1.6",
    )
    p.add_argument("--profile-batch", type=int, default=PROFILE_BATCH, help="B of --profile-ops (default 16)")
    p.add_argument(
        "--rival",
        action="store_true",
        help="each ghost configuration also times hooks mode in the same process, round by round",
    )
    p.add_argument("--json", metavar="PATH", help="write all rows and the settings as JSON")
    p.add_argument("--report", metavar="PATH", help="print the tables of an earlier --json file and exit")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    for preset, values in ((args.quick, QUICK), (args.transformers, TRANSFORMERS)):
        for key, value in values.items() if preset else ():
            setattr(args, key, value)
    if args.steps < 1 or args.warmup < 0:
        p.error(f"--steps={args.steps} and --warmup={args.warmup}: use --steps >= 1 and --warmup >= 0.")
    if args.min_seconds < 0 or args.max_steps < args.steps:
        p.error(
            f"--min-seconds={args.min_seconds} and --max-steps={args.max_steps}: use --min-seconds >= 0 "
            f"and --max-steps >= --steps ({args.steps})."
        )
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        p.error(f"--device={args.device} but CUDA is not available here; use --device cpu.")
    return args


def print_tables(rows: list[dict]) -> None:
    """The results table, then dpnotebook against Opacus and the cost of K when the rows hold them."""
    print(results_table(rows))
    if any(r["what"].startswith("opacus_") for r in rows):
        print("\n" + opacus_table(rows))
    if any(r["K"] > 1 for r in rows):
        print("\n" + multiplicity_table(rows))
    if any(r["what"] == "dpsgd_ghost" for r in rows) and any(r["what"] == "dpsgd_hooks" for r in rows):
        print("\n" + ghost_hooks_table(rows))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        child_main(args.child)
        return 0
    if args.report:
        with open(args.report) as f:
            print_tables(json.load(f)["rows"])
        return 0
    if args.profile_ops:
        torch.set_num_threads(args.threads)
        print(f"aten operations per DP step (B={args.profile_batch}, CPU profiler; dpnotebook / Opacus 1.6)")
        print(profile_table(args.models, args.modes, batch=args.profile_batch))
        return 0
    configs = plan(args.models, args.batch, modes=args.modes, kinds=args.kinds, ks=[], opacus=args.compare_opacus)
    configs += [
        c
        for c in plan(
            args.k_models or args.models,
            [],
            modes=args.modes,
            kinds=args.kinds,
            ks=args.ks,
            k_batch=args.k_batch,
            k_modes=args.k_modes,
        )
    ]
    keys = ("steps", "warmup", "threads", "device", "min_seconds", "max_steps", "rival")
    settings = {k: getattr(args, k) for k in keys}
    print(f"{len(configs)} configurations, each in its own process ({settings})", file=sys.stderr)
    rows, start = [], time.time()
    for i, cfg in enumerate(configs, 1):
        row = run_in_subprocess(cfg, timeout=args.timeout, **settings)
        rows.append(row)
        shown = row.get("error") or f"{row['median_ms']:.1f} ms, x{row['ratio']:.2f}, peak {row['peak_mb']:.0f} MB"
        print(
            f"[{i}/{len(configs)} {time.time() - start:.0f}s] {cfg.model} B={cfg.batch} K={cfg.K} {cfg.what}: {shown}",
            file=sys.stderr,
        )
    print_tables(rows)
    if args.json:
        meta = {
            "torch": torch.__version__,
            "python": platform.python_version(),
            "machine": platform.machine(),
            **settings,
        }
        with open(args.json, "w") as f:
            json.dump({"settings": meta, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
