"""Compare two revisions of dpnotebook on the same benchmark configurations, interleaved, in one run.

For maintainers checking a change for speed regressions::

    python -m dpnotebook.benchmarks.revisions bd22ad1 HEAD --quick --rounds 3 --json out.json
    python -m dpnotebook.benchmarks.revisions main HEAD --models MLP --batch 128 --modes ghost --kinds dpsgd
    python -m dpnotebook.benchmarks.revisions --report out.json      # the table again

Each revision's committed ``dpnotebook/`` is exported (``git archive``) into a temporary folder, and
each configuration (planned from this checkout's suite options) runs in a fresh process of that
revision's code (``python -m dpnotebook.benchmarks --child``), the two revisions alternating for
``--rounds`` rounds. The table gives each side's median, their ratio B/A and the spread of the
per-round ratios: a spread that contains 1.0 is within noise.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from dpnotebook.benchmarks.__main__ import Config, Row, configurations, environment, run_in_subprocess
from dpnotebook.benchmarks.__main__ import parse_args as suite_args

#: The suite's settings that every revision's child takes (``--rival`` is newer).
SETTINGS = ("steps", "warmup", "threads", "device", "min_seconds", "max_steps")


def compare(a_ms: list[float], b_ms: list[float]) -> dict[str, float | bool]:
    """Medians of both sides, their ratio B/A, and the min and max of the per-round ratios (round ``i`` pairs
    ``a_ms[i]`` with ``b_ms[i]``); ``within_noise``: whether 1.0 lies between them.

    >>> r = compare([10.0, 12.0, 11.0], [11.0, 12.0, 9.9])
    >>> r["median_a"], r["median_b"], round(r["ratio"], 3), r["ratio_min"], r["ratio_max"], r["within_noise"]
    (11.0, 11.0, 1.0, 0.9, 1.1, True)
    """
    if not a_ms or len(a_ms) != len(b_ms):
        raise ValueError(f"need one time per round on each side, got {len(a_ms)} and {len(b_ms)}")
    per_round = [b / a for a, b in zip(a_ms, b_ms, strict=True)]
    lo, hi = min(per_round), max(per_round)
    a, b = statistics.median(a_ms), statistics.median(b_ms)
    return dict(median_a=a, median_b=b, ratio=b / a, ratio_min=lo, ratio_max=hi, within_noise=lo <= 1 <= hi)


def label(row: Row) -> str:
    """A configuration's name in the table.

    >>> label({"model": "MLP", "batch": 128, "K": 1, "what": "dpsgd_ghost"})
    'MLP B=128 K=1 dpsgd_ghost'
    """
    return f"{row['model']} B={row['batch']} K={row['K']} {row['what']}"


def table(rows: list[Row], a: str, b: str) -> str:
    """The comparison as a Markdown table; the last two columns, steadier under load, compare each side's ratio
    to the non-private step timed in its own process, and the fastest single steps."""
    lines = [
        f"| configuration | {a} median ms | {b} median ms | ratio B/A | spread (min-max) | within noise "
        "| B/A of the ratio to non-private (spread) | B/A of the fastest steps |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {label(r)} | error: {r['error']} | | | | | | |")
            continue
        q = r.get("rel")
        rel = f"{q['ratio']:.2f} ({q['ratio_min']:.2f}-{q['ratio_max']:.2f})" if q else "—"
        lines.append(
            f"| {label(r)} | {r['median_a']:.1f} | {r['median_b']:.1f} | {r['ratio']:.2f} "
            f"| {r['ratio_min']:.2f}-{r['ratio_max']:.2f} | {'yes' if r['within_noise'] else 'no'} | {rel} "
            f"| {r['fastest_ratio']:.2f} |"
        )
    return "\n".join(lines)


def export(repo: Path, rev: str, into: Path) -> str:
    """Write ``rev``'s ``dpnotebook/`` into ``into`` (``git archive | tar -x``); return the full commit id."""
    git = ["git", "-C", str(repo)]
    found = subprocess.run([*git, "rev-parse", "--verify", f"{rev}^{{commit}}"], check=True, capture_output=True)
    commit = found.stdout.decode().strip()
    into.mkdir(parents=True)
    archive = subprocess.Popen([*git, "archive", commit, "dpnotebook"], stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", str(into)], stdin=archive.stdout, check=True)
    if archive.stdout is not None:
        archive.stdout.close()
    if archive.wait() != 0:
        raise RuntimeError(f"git archive {rev} failed")
    return commit


def imported_from(tree: Path) -> str:
    """Where ``import dpnotebook`` resolves in a child run in ``tree``; raise if that is not ``tree``."""
    cmd = [sys.executable, "-c", "import dpnotebook; print(dpnotebook.__file__)"]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    path = subprocess.run(cmd, cwd=tree, env=env, check=True, capture_output=True, text=True).stdout.strip()
    if not Path(path).resolve().is_relative_to(tree.resolve()):
        raise RuntimeError(f"a child in {tree} imports dpnotebook from {path}, not from the exported tree")
    return path


def summarize(row: Row) -> Row:
    """``row`` (a configuration with its children's rows, ``a_runs`` and ``b_runs``) with the comparison added."""
    runs = {side: row[f"{side}_runs"] for side in ("a", "b")}
    row = {k: v for k, v in row.items() if k in ("model", "batch", "K", "what", "a_runs", "b_runs")}
    errors = [x["error"] for side in ("a", "b") for x in runs[side] if "error" in x]
    if errors:
        return {**row, "error": errors[0]}
    row.update(compare([x["median_ms"] for x in runs["a"]], [x["median_ms"] for x in runs["b"]]))
    row["fastest_ratio"] = min(x["min_ms"] for x in runs["b"]) / min(x["min_ms"] for x in runs["a"])
    if row["what"] != "nonprivate":  # each side's time over its own non-private step, timed alternately
        row["rel"] = compare([x["ratio"] for x in runs["a"]], [x["ratio"] for x in runs["b"]])
    return row


def run(
    trees: dict[str, Path],
    configs: list[Config],
    rounds: int,
    settings: Row,
    timeout: float,
    done: Callable[[list[Row]], None] = lambda rows: None,
) -> list[Row]:
    """Every configuration on both trees (keys ``"a"``, ``"b"``), alternately, ``rounds`` times each;
    ``done`` gets the rows so far after each configuration."""
    out: list[Row] = []
    start = time.time()
    for i, cfg in enumerate(configs, 1):
        runs: dict[str, list[Row]] = {"a": [], "b": []}
        for r in range(rounds):
            for side in ("a", "b") if r % 2 == 0 else ("b", "a"):
                runs[side].append(run_in_subprocess(cfg, timeout=timeout, tree=trees[side], **settings))
        row = summarize({**asdict(cfg), "a_runs": runs["a"], "b_runs": runs["b"]})
        out.append(row)
        done(out)
        shown = row.get("error") or f"{row['median_a']:.1f} vs {row['median_b']:.1f} ms, B/A {row['ratio']:.2f}"
        print(f"[{i}/{len(configs)} {time.time() - start:.0f}s] {label(row)}: {shown}", file=sys.stderr)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m dpnotebook.benchmarks.revisions",
        description=__doc__.split("\n\n")[0],
        epilog="Name the two revisions first; any other option is python -m dpnotebook.benchmarks' "
        "(--quick, --models, --kinds, --steps ...).",
    )
    p.add_argument("rev_a", nargs="?", help="the baseline revision A (anything git rev-parse takes)")
    p.add_argument("rev_b", nargs="?", help="the revision B compared with it")
    p.add_argument("--rounds", type=int, default=3, help="runs of each configuration per revision (default 3)")
    p.add_argument("--json", metavar="PATH", help="write the rows, the revisions and the settings as JSON")
    p.add_argument("--repo", default=".", help="the git repository (default: the current directory)")
    p.add_argument("--report", metavar="PATH", help="print the table of an earlier --json file and exit")
    own, rest = p.parse_known_args(argv)
    if own.report:
        with open(own.report) as f:
            data = json.load(f)
        names = [f"{side.upper()} ({data['revisions'][side]['rev']})" for side in ("a", "b")]
        print(table([summarize(r) for r in data["rows"]], *names))
        return 0
    if own.rev_b is None:
        p.error("name two revisions (or --report PATH).")
    if own.rounds < 1:
        p.error(f"--rounds={own.rounds}: use --rounds >= 1.")
    args = suite_args(rest)
    settings = {k: getattr(args, k) for k in SETTINGS}
    configs = configurations(args)
    meta = {**environment(), "cpus": os.cpu_count(), "rounds": own.rounds, **settings}
    revisions: dict[str, dict[str, str]] = {}
    started = time.time()

    def save(rows: list[Row], complete: bool = False) -> None:
        if own.json:
            seconds = round(time.time() - started)
            with open(own.json, "w") as f:
                meta.update(seconds=seconds, complete=complete)
                json.dump({"revisions": revisions, "settings": meta, "rows": rows}, f, indent=1)

    tmp = Path(tempfile.mkdtemp(prefix="dpnotebook-revisions-"))
    try:
        trees = {"a": tmp / "a", "b": tmp / "b"}
        for side, rev in (("a", own.rev_a), ("b", own.rev_b)):
            commit = export(Path(own.repo), rev, trees[side])
            revisions[side] = {"rev": rev, "commit": commit, "dpnotebook": imported_from(trees[side])}
            print(f"{side.upper()} = {rev} ({commit[:10]}), dpnotebook from {trees[side]}", file=sys.stderr)
        print(f"{len(configs)} configurations x {own.rounds} rounds x 2 revisions ({settings})", file=sys.stderr)
        rows = run(trees, configs, own.rounds, settings, args.timeout, save)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    save(rows, complete=True)
    print(table(rows, f"A ({own.rev_a})", f"B ({own.rev_b})"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
