"""``python -m dpnotebook.benchmarks.zoo_table``: every zoo model in every mode, next to Opacus 1.6.

Per model and mode: the float32 error against the float64 oracle (or the refusal), the ``torch.func``
units (``whole`` when one is the whole model), and a DP-SGD step over a plain SGD step, timed
alternately (the median of the ratios of neighbouring steps). With ``--opacus``, Opacus' best mode
among those whose per-sample gradients match the oracle, or why none runs (``docs/real-models.md``).

Examples::

    python -m dpnotebook.benchmarks.zoo_table                          # every model and mode, B=16
    python -m dpnotebook.benchmarks.zoo_table --opacus --steps 20
    python -m dpnotebook.benchmarks.zoo_table --models vit bert --modes hooks ghost --batch 4
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import warnings
from typing import Any

import torch
from torch import nn

import dpnotebook
from dpnotebook.benchmarks.steps import OPACUS_MODES, Step, dpsgd_step, opacus_step, plain_step, timer
from dpnotebook.benchmarks.zoo import ZOO, build, check_zoo_model, oracle, prepared
from dpnotebook.compare import error_against
from dpnotebook.testing import clean_copy, dot_loss

#: The relative error above which Opacus' per-sample gradients count as wrong.
OPACUS_TOL = 1e-6


def first_line(e: BaseException, width: int = 90) -> str:
    """``Type: message`` cut to its first sentence and ``width`` characters."""
    text = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}".split(". ")[0]
    return text if len(text) <= width else text[: width - 3] + "..."


def time_side_by_side(dp: Step, plain: Step, *, steps: int, warmup: int) -> tuple[float, float, float]:
    """``(median ms of dp, median ms of plain, median of the ratios dp/plain of each pair)``, run alternately."""
    for _ in range(warmup):
        dp()
        plain()
    timed = timer("cpu")
    pairs = [(timed(dp), timed(plain)) for _ in range(steps)]
    dp_ms, plain_ms = zip(*pairs, strict=True)
    return statistics.median(dp_ms), statistics.median(plain_ms), statistics.median([d / p for d, p in pairs])


def _opacus_model(name: str, dtype: torch.dtype) -> nn.Module:
    from opacus.validators import ModuleValidator

    # BatchNorm becomes dpnotebook's GroupNorm (Opacus' own, one channel per group, fails on 1x1 maps),
    # then Opacus' fix makes its DPMultiheadAttention (in float32)
    return ModuleValidator.fix(dpnotebook.fix(build(name).model, mode="functorch")).to(dtype)


def opacus_error(name: str, mode: str, rows: int = 3) -> float:
    """Opacus' per-sample gradients of ``name`` in ``mode`` (float64) against the oracle, relative."""
    from opacus.grad_sample.utils import wrap_model

    model = _opacus_model(name, torch.float64)
    inputs, target, ref = oracle(model, name, rows)
    copy_ = clean_copy(model)
    wrapped = wrap_model(copy_, grad_sample_mode=mode, batch_first=True, loss_reduction="sum")
    dot_loss(wrapped(*inputs), target).backward()
    return error_against({n: getattr(p, "grad_sample", None) for n, p in copy_.named_parameters()}, ref)


def _steps(name: str, mode: str, batch: int, *, opacus: bool = False) -> tuple[Step, Step]:
    """A DP-SGD step of zoo model ``name`` in ``mode`` (dpnotebook's, or Opacus'), and a plain SGD step."""
    model, make_batch, loss = build(name)
    inputs, targets = make_batch(batch)
    plain = plain_step(model, inputs, targets, loss)
    if opacus:
        return opacus_step(_opacus_model(name, torch.float32), "dpsgd", mode, inputs, targets, loss, batch), plain
    return dpsgd_step(prepared(name, mode, dtype=torch.float32), mode, inputs, targets, loss=loss), plain


def opacus_figure(name: str, batch: int, *, steps: int, warmup: int) -> str:
    """Opacus' best DP step over the plain step (``"x3.10 (hooks)"``, or ``"none runs"``), then what went
    wrong in each mode that did not run or did not match the oracle (its ghost mode forms none: not checked)."""
    warnings.filterwarnings("ignore", module="opacus")
    best: tuple[float, str] | None = None
    failures = []
    for mode in OPACUS_MODES:
        try:
            err = opacus_error(name, mode) if mode != "ghost" else 0.0
            if not err <= OPACUS_TOL:
                failures.append(f"{mode}: wrong (error {err:.1e})")
                continue
            step, plain = _steps(name, mode, batch, opacus=True)
            step()
            ratio = time_side_by_side(step, plain, steps=steps, warmup=warmup)[2]
        except Exception as e:  # noqa: BLE001 - every failure is the figure
            failures.append(f"{mode}: {first_line(e, 60)}")
            continue
        if best is None or ratio < best[0]:
            best = (ratio, mode)
    return "; ".join([f"x{best[0]:.2f} ({best[1]})" if best is not None else "none runs", *failures])


def zoo_rows(
    models: list[str], modes: list[str], *, batch: int, steps: int, warmup: int, opacus: bool, log: Any = None
) -> list[dict[str, Any]]:
    """One row per model and mode (with the model's Opacus figure when ``opacus``), as plain dicts."""
    rows = []
    for name in models:
        figure = opacus_figure(name, batch, steps=steps, warmup=warmup) if opacus else ""
        for mode in modes:
            row: dict[str, Any] = {"model": name, "mode": mode, "opacus": figure}
            try:
                check = check_zoo_model(name, mode, dtype=torch.float32)
                row.update(err=check.max_rel_err, fallback=len(check.fallback), whole=check.whole_model)
                dp, plain, ratio = time_side_by_side(*_steps(name, mode, batch), steps=steps, warmup=warmup)
                row.update(dp_ms=dp, plain_ms=plain, ratio=ratio)
            except Exception as e:  # noqa: BLE001 - a refusal is a result of the table
                row["refused"] = first_line(e)
            rows.append(row)
            if log is not None:
                shown = row.get("refused") or f"x{row['ratio']:.2f}"
                print(f"{name} {mode}: {shown}", file=log, flush=True)
    return rows


def zoo_table(rows: list[dict[str, Any]]) -> str:
    """The rows as a fixed-width table, then each model's Opacus figure when the rows hold one."""
    head = f"{'model':<11}{'mode':<10}{'error':>9}  {'fallback':<10}{'DP ms':>8}{'plain ms':>9}{'DP/plain':>9}"
    lines = [head, "-" * len(head)]
    for r in rows:
        if "refused" in r:
            lines.append(f"{r['model']:<11}{r['mode']:<10}refused: {r['refused']}")
            continue
        fallback = f"{r['fallback']}{' whole' if r['whole'] else ''}"
        lines.append(
            f"{r['model']:<11}{r['mode']:<10}{r['err']:>9.1e}  {fallback:<10}{r['dp_ms']:>8.1f}"
            f"{r['plain_ms']:>9.1f}{r['ratio']:>9.2f}"
        )
    figures = {r["model"]: r["opacus"] for r in rows if r.get("opacus")}
    if figures:
        lines += ["", "Opacus 1.6: DP/plain of its best mode that matches the oracle; the modes that fail, and why:"]
        lines += [f"{model:<11}{figure}" for model, figure in figures.items()]
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The options (see the module docstring); bad sizes are refused with the fix."""
    p = argparse.ArgumentParser(prog="python -m dpnotebook.benchmarks.zoo_table", description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", choices=list(ZOO), default=list(ZOO))
    p.add_argument("--modes", nargs="+", choices=dpnotebook.available_modes(), default=dpnotebook.available_modes())
    p.add_argument("--batch", type=int, default=16, help="rows per timed step (default 16)")
    p.add_argument("--steps", type=int, default=20, help="timed pairs of steps (default 20)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    p.add_argument("--opacus", action="store_true", help="add Opacus 1.6's best mode (needs the opacus extra)")
    args = p.parse_args(argv)
    if args.batch < 1 or args.steps < 1 or args.warmup < 0:
        p.error(
            f"--batch={args.batch} --steps={args.steps} --warmup={args.warmup}: use batch, steps >= 1, warmup >= 0."
        )
    return args


def main(argv: list[str] | None = None) -> int:
    """Print the zoo table."""
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    settings = {k: getattr(args, k) for k in ("batch", "steps", "warmup", "opacus")}
    rows = zoo_rows(args.models, args.modes, **settings, log=sys.stderr)
    print(
        f"zoo table: B={args.batch}, median of {args.steps} timed pairs after {args.warmup} warm-up, "
        f"{args.threads} thread(s), torch {torch.__version__}, {platform.machine()}, "
        f"error of float32 against the float64 oracle at B=3"
    )
    print(zoo_table(rows))
    return 0


__all__ = ["zoo_rows", "zoo_table", "main", "opacus_figure", "time_side_by_side"]

if __name__ == "__main__":
    sys.exit(main())
