"""Slider-to-redrawn-figure latency of each widget: ``python -m dpnotebook.benchmarks.widget_latency [--json]``.

Each control is moved programmatically (``control.value = v``, what a slider move runs in the kernel).
``agg``: the widget built with ``backend="static"``, then one full Agg draw (what ipympl pays);
``image``: ``backend="image"``, whose callback draws and PNG-encodes itself. Medians, 90th percentile,
fastest move and median CPU time, against a goal of 50 ms; a ``reference`` row times a bare matplotlib
figure, and the privacy-budget explorer is also timed on new settings (accountant calls).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import matplotlib

matplotlib.use("Agg")

GOAL_MS = 50.0


def _digits(n: int) -> tuple[Any, Any]:
    import torch

    try:
        from dpnotebook.datasets import load_digits_tensors

        train, _ = load_digits_tensors()
        return train.tensors[0][:n], train.tensors[1][:n]
    except ImportError:  # no scikit-learn: random images of the same shape
        g = torch.Generator().manual_seed(0)
        return torch.rand(n, 1, 8, 8, generator=g), torch.randint(0, 10, (n,), generator=g)


def _cnn() -> Any:
    import torch

    from dpnotebook.models import SmallCNN

    torch.manual_seed(0)
    return SmallCNN(channels=(8, 16))


Move = Callable[[Any, Any], None]


def _cases() -> list[tuple[str, str, Callable[..., Any], list[Any], str | Move]]:
    """``(widget, control, build(backend=...), values, the slider's name or move(explorer, value))``."""
    from functools import partial

    from torch import nn

    from dpnotebook import widgets as w

    x, y = _digits(64)
    ce = nn.functional.cross_entropy

    def on_cnn(cls: Any) -> Callable[..., Any]:
        return lambda backend: cls(_cnn(), (x, y), ce, backend=backend)

    def monitor_move(ex: Any, v: Any) -> None:
        ex.update(loss=1.0 / (1 + v), accuracy=0.5, epsilon=0.01 * ex.state.step, clip_fraction=0.3)

    def monitor(backend: str) -> Any:
        m = w.TrainingMonitor(redraw_every=0, progress=False, backend=backend, target_epsilon=8.0)
        for i in range(200):
            m.update(loss=1.0 / (1 + i), accuracy=0.5, epsilon=0.01 * i, clip_fraction=0.3, force=False)
        return m

    def augmult(backend: str) -> Any:
        shift = partial(w.augment_copies, kind="shift", strength=1)
        return w.AugmultExplorer(_cnn(), x[:32], y[:32], ce, augment=shift, k_max=8, backend=backend)

    cs, sigmas = [0.05, 0.1, 0.2, 0.5, 1.0, 2.0], [0.5, 1.0, 2.0, 4.0]
    budget = partial(w.PrivacyBudgetExplorer, accountant="rdp", debounce=0)
    attack = "PrivacyAttackExplorer (3 simulated attacks)"
    return [
        ("GradientExplorer (SmallCNN, 64 digits)", "sample", on_cnn(w.GradientExplorer), [*range(0, 64, 5)], "sample"),
        ("ClippingExplorer (2-D toy, arrows)", "C", w.ClippingExplorer, cs, "max_grad_norm"),
        ("ClippingExplorer (SmallCNN, 64 digits)", "C", on_cnn(w.ClippingExplorer), cs, "max_grad_norm"),
        ("NoiseExplorer (SmallCNN, 64 digits)", "sigma", on_cnn(w.NoiseExplorer), sigmas, "noise_multiplier"),
        ("NoiseExplorer (2-D toy)", "batch size", w.NoiseExplorer, [4, 8, 16, 32, 64], "batch_size"),
        ("PrivacyBudgetExplorer, seen settings", "sigma", budget, [0.8, 1.0, 1.2], "noise_multiplier"),
        ("AugmultExplorer (toy MLP)", "K", w.AugmultExplorer, [*range(1, 17, 3)], "K"),
        ("AugmultExplorer (SmallCNN, 32 digits, shifts)", "K", augmult, [*range(1, 9)], "K"),
        ("TrainingMonitor (200 steps so far)", "update()", monitor, [*range(1000)], monitor_move),
        (attack, "threshold", w.PrivacyAttackExplorer, [0.2, 0.5, 0.8, 1.1], "threshold"),
        (attack, "sigma", w.PrivacyAttackExplorer, [0.5, 0.8, 1.3, 2.0], "noise_multiplier"),
    ]


def _slider(name: str) -> Move:
    return lambda ex, v: setattr(ex.controls[name], "value", v)


def _time(explorer: Any, values: list[Any], move: Move, repeats: int, draw: bool) -> tuple[list[float], list[float]]:
    """Wall and CPU milliseconds of ``repeats`` moves (each followed by a draw if ``draw``)."""
    cycle = itertools.cycle(values)
    for _ in range(3):  # warm up: first layout, caches
        move(explorer, next(cycle))
        explorer.figure.canvas.draw()
    wall, cpu = [], []
    for _ in range(repeats):
        value = next(cycle)
        start, start_cpu = time.perf_counter(), time.process_time()
        move(explorer, value)
        if draw:
            explorer.figure.canvas.draw()
        wall.append((time.perf_counter() - start) * 1000)
        cpu.append((time.process_time() - start_cpu) * 1000)
        if explorer.error.message:
            raise RuntimeError(f"the widget showed an error: {explorer.error.message}")
    return wall, cpu


def _reference(repeats: int) -> tuple[list[float], list[float]]:
    """A bare matplotlib figure, for scale: move a line, draw."""
    import numpy as np
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 3.2), dpi=80)
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 3)
    xy = np.random.default_rng(0).standard_normal((200, 2))
    axes[0].quiver(np.zeros(200), np.zeros(200), xy[:, 0], xy[:, 1], angles="xy", scale_units="xy", scale=1)
    counts, edges = np.histogram(np.abs(xy[:, 0]), 30)
    axes[1].stairs(counts, edges, fill=True)
    line = axes[1].axvline(1.0)
    axes[2].plot(np.arange(1, 31), np.linspace(0, 1, 30))
    axes[2].set_xscale("log")

    class _Fake:
        figure = fig
        error = type("E", (), {"message": ""})()

    return _time(_Fake(), [0.5, 1.0, 1.5], lambda _, v: line.set_xdata([v, v]), repeats, True)


def _budget_cold(repeats: int) -> tuple[list[float], list[float]]:
    """New sigma values each time: accountant calls (what the debounce postpones)."""
    from dpnotebook.widgets import PrivacyBudgetExplorer

    ex = PrivacyBudgetExplorer(accountant="rdp", backend="static", debounce=0)
    values = [0.9 + 0.0137 * i for i in range(1, repeats + 10)]  # never seen before: no cache
    return _time(ex, values, _slider("noise_multiplier"), repeats, True)


def _summary(times: tuple[list[float], list[float]], prefix: str) -> dict[str, float]:
    wall, cpu = times
    ordered = sorted(wall)
    return {
        f"{prefix}_median_ms": statistics.median(wall),
        f"{prefix}_p90_ms": ordered[int(0.9 * (len(ordered) - 1))],
        f"{prefix}_min_ms": ordered[0],
        f"{prefix}_cpu_median_ms": statistics.median(cpu),
    }


def run(repeats: int = 15) -> list[dict[str, Any]]:
    """Time every case; one row per widget and control."""
    import matplotlib.pyplot as plt

    rows: list[dict[str, Any]] = [{"widget": "reference: bare 3-axes matplotlib figure", "control": "line"}]
    rows[0].update(_summary(_reference(repeats), "agg"))
    for name, control, build, values, move in _cases():
        row: dict[str, Any] = {"widget": name, "control": control}
        for backend, draw in (("static", True), ("image", False)):
            figures = len(plt.get_fignums())
            explorer = build(backend=backend)
            times = _time(explorer, values, _slider(move) if isinstance(move, str) else move, repeats, draw)
            row.update(_summary(times, "agg" if draw else "image"))
            assert len(plt.get_fignums()) == figures, "a slider move opened a figure"
        rows.append(row)
    cold = _summary(_budget_cold(max(3, repeats // 3)), "agg")
    return [*rows, {"widget": "PrivacyBudgetExplorer, new settings (rdp)", "control": "sigma", **cold}]


def _table(rows: list[dict[str, Any]]) -> str:
    head = (
        f"{'widget':48} {'control':10} {'agg ms':>7} {'p90':>6} {'min':>6} {'cpu':>6} {'image ms':>9} "
        f"{'p90':>6} {'cpu':>6}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        image = (
            f"{r['image_median_ms']:9.1f} {r['image_p90_ms']:6.1f} {r['image_cpu_median_ms']:6.1f}"
            if "image_median_ms" in r
            else f"{'-':>9} {'-':>6} {'-':>6}"
        )
        flag = "" if r["agg_median_ms"] <= GOAL_MS else "  > 50 ms"
        lines.append(
            f"{r['widget']:48} {r['control']:10} {r['agg_median_ms']:7.1f} {r['agg_p90_ms']:6.1f} "
            f"{r['agg_min_ms']:6.1f} {r['agg_cpu_median_ms']:6.1f} {image}{flag}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15, help="slider moves timed per widget")
    parser.add_argument("--json", action="store_true", help="print JSON rows instead of a table")
    args = parser.parse_args()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    rows = run(args.repeats)
    if args.json:
        print(json.dumps({"load_average_1min": load, "cpus": os.cpu_count(), "rows": rows}, indent=1))
    else:
        print(f"load average {load:.2f} on {os.cpu_count()} CPUs; times in ms (median, 90th percentile, min, CPU)")
        print(_table(rows))


if __name__ == "__main__":
    main()
