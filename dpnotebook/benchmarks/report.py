"""Tables from the suite's rows: times and ratios, dpnotebook against Opacus, and the cost of K.

Each row's ratio divides by the non-private step timed **in that row's own process**, interleaved
with it (:func:`~dpnotebook.benchmarks.suite.measure`), not by the ``nonprivate`` row's time: the
load on a shared machine differs between processes. The results table prints that reference next
to each ratio, so that ``169.6 ms`` at ``×2.32`` reads as 2.32 times its own 73.1 ms reference
even when the ``nonprivate`` row, measured in another process, says 143.6 ms.

>>> rows = [{"model": "MLP", "batch": 8, "K": 1, "what": "dpsgd_ghost", "median_ms": 169.6, "min_ms": 160.0,
...          "ref_median_ms": 73.1, "ratio": 2.32, "ratio_min": 2.3, "peak_mb": 300.0, "rss0_mb": 290.0, "n": 10}]
>>> print(results_table(rows).splitlines()[2])
| MLP | 8 | 1 | dpsgd_ghost | 169.6 | 160.0 | 73.1 | ×2.32 | ×2.30 | 300 | 10 | 10 |  |
"""

from __future__ import annotations

from collections.abc import Iterable

Row = dict


def _f(x: float | None, digits: int = 1) -> str:
    return "" if x is None else f"{x:.{digits}f}"


def results_table(rows: Iterable[Row]) -> str:
    """Markdown table: one line per configuration; ratio = time / the non-private step timed in the same process.

    The reference each ratio uses is printed beside it (``non-private ref. median ms``), and a
    line under the table says so (see the module docstring).
    """
    lines = [
        "| model | B | K | config | median ms | min ms | non-private ref. median ms (same process) | "
        "ratio to the ref. (medians) | ratio (minima) | peak RSS MB | Δ RSS MB | n | note |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(
                f"| {r['model']} | {r['batch']} | {r['K']} | {r['what']} | ERROR | | | | | | | | {r['error'][:120]} |"
            )
            continue
        delta = r["peak_mb"] - r["rss0_mb"]
        lines.append(
            f"| {r['model']} | {r['batch']} | {r['K']} | {r['what']} | {_f(r['median_ms'])} | {_f(r['min_ms'])} | "
            f"{_f(r.get('ref_median_ms'))} | ×{_f(r['ratio'], 2)} | ×{_f(r.get('ratio_min'), 2)} | "
            f"{r['peak_mb']:.0f} | {delta:.0f} | {r['n']} | {r.get('note', '')} |"
        )
    lines.append(
        "\nEach ratio divides by the non-private step timed in the same process, interleaved with the row's "
        "own steps (the reference column), not by the `nonprivate` row, which ran in another process."
    )
    return "\n".join(lines)


def _own(r: Row) -> float:
    """The memory the step itself needs: its peak minus the resident memory before it."""
    return r["peak_mb"] - r["rss0_mb"]


def _index(rows: Iterable[Row]) -> dict[tuple, Row]:
    return {(r["model"], r["batch"], r["K"], r["what"]): r for r in rows if "error" not in r}


def _best(index: dict[tuple, Row], key: tuple, prefix: str) -> tuple[str, float] | None:
    found = [(w, r["ratio"]) for (m, b, k, w), r in index.items() if (m, b, k) == key and w.startswith(prefix)]
    return min(found, key=lambda t: t[1]) if found else None


def opacus_table(rows: Iterable[Row]) -> str:
    """dpnotebook against Opacus for each model and B: ratios to the same non-private step, and their quotient."""
    index = _index(rows)
    keys = sorted({(m, b, k) for (m, b, k, w) in index if w.startswith("opacus_")})
    lines = [
        "| model | B | what | dpnotebook (ratio) | Opacus (ratio) | dpnotebook / Opacus |",
        "|---|---|---|---|---|---|",
    ]
    for key in keys:
        pairs = [
            ("DP-SGD step, best mode each", _best(index, key, "dpsgd_"), _best(index, key, "opacus_dpsgd_")),
            ("per-sample grads, hooks", _best(index, key, "gsm_hooks"), _best(index, key, "opacus_gsm_hooks")),
            ("DP-SGD step, hooks", _best(index, key, "dpsgd_hooks"), _best(index, key, "opacus_dpsgd_hooks")),
        ]
        for label, ours, theirs in pairs:
            if ours and theirs:
                lines.append(
                    f"| {key[0]} | {key[1]} | {label} | {ours[0]} ({ours[1]:.2f}) | "
                    f"{theirs[0].removeprefix('opacus_')} ({theirs[1]:.2f}) | {ours[1] / theirs[1]:.2f} |"
                )
    return "\n".join(lines)


def multiplicity_table(rows: Iterable[Row]) -> str:
    """For each K: per-sample-gradient memory (the step's own peak minus the non-private step's, same rows) and the step ratio."""
    index = _index(rows)
    lines = [
        "| model | B | K | config | step / non-private on B*K rows | per-sample-grad MB | vs K=1 |",
        "|---|---|---|---|---|---|---|",
    ]
    ks = sorted({(m, b, k) for (m, b, k, w) in index})
    for m, b, k in ks:
        if not any(kk > 1 for (mm, bb, kk) in ks if (mm, bb) == (m, b)):
            continue
        base = index.get((m, b, k, "nonprivate"))
        for (mm, bb, kk, w), r in index.items():
            if (mm, bb, kk) != (m, b, k) or w == "nonprivate" or w.startswith(("opacus", "naive", "nonprivate")):
                continue
            psg = _own(r) - _own(base) if base else None
            one, base1 = index.get((m, b, 1, w)), index.get((m, b, 1, "nonprivate"))
            psg1 = _own(one) - _own(base1) if one and base1 else None
            rel = psg / psg1 if psg is not None and psg1 and psg1 > 0 else None
            lines.append(f"| {m} | {b} | {k} | {w} | {r['ratio']:.2f} | {_f(psg)} | {_f(rel, 2)} |")
    return "\n".join(lines)


def ghost_hooks_table(rows: Iterable[Row], kind: str = "dpsgd") -> str:
    """Ghost and hooks mode side by side for each model, B and K: each step's time, its ratio to the
    non-private step timed in its own process, and ghost's ratio over hooks' (by medians, and by minima);
    with ``--rival``, also ghost's median over that of hooks mode timed in the ghost row's own process.

    >>> rows = [{"model": "M", "batch": 8, "K": 1, "what": w, "median_ms": t, "min_ms": t, "ratio": r,
    ...          "ratio_min": r, "ref_median_ms": 10.0} for w, t, r in [("dpsgd_hooks", 20.0, 2.0),
    ...                                                             ("dpsgd_ghost", 15.0, 1.5)]]
    >>> print(ghost_hooks_table(rows).splitlines()[2])
    | M | 8 | 1 | 20.0 (×2.00) | 15.0 (×1.50) | 0.75 | 0.75 |  |
    """
    index = _index(rows)
    lines = [
        "| model | B | K | hooks ms (× non-private) | ghost ms (× non-private) | ghost / hooks (medians) | "
        "ghost / hooks (minima) | ghost / hooks (same process, medians) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for m, b, k in sorted({(m, b, k) for (m, b, k, w) in index}):
        hooks, ghost = index.get((m, b, k, f"{kind}_hooks")), index.get((m, b, k, f"{kind}_ghost"))
        if hooks is None or ghost is None:
            continue
        mins = [g.get("ratio_min") for g in (ghost, hooks)]
        by_min = _f(mins[0] / mins[1], 2) if mins[0] is not None and mins[1] else ""
        same = _f(ghost["median_ms"] / ghost["rival_median_ms"], 2) if ghost.get("rival_median_ms") else ""
        lines.append(
            f"| {m} | {b} | {k} | {_f(hooks['median_ms'])} (×{_f(hooks['ratio'], 2)}) | "
            f"{_f(ghost['median_ms'])} (×{_f(ghost['ratio'], 2)}) | {ghost['ratio'] / hooks['ratio']:.2f} | {by_min} | "
            f"{same} |"
        )
    return "\n".join(lines)


__all__ = ["results_table", "opacus_table", "multiplicity_table", "ghost_hooks_table"]
