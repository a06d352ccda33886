"""Time DPLSTM against nn.LSTM, side by side: ``python -m dpnotebook.benchmarks.rnn_speed``.

Both layers get the same weights and the same input; each measurement is one
forward and backward pass (no per-sample gradients: the DP layer's cost as a
plain layer). The runs alternate so that a busy machine slows both alike, and
the fastest of several runs is reported (on a machine busy with other work,
fewer ``--threads`` give steadier figures). With ``--hooks`` it also times DPLSTM
wrapped in hooks mode (per-sample gradients included).

>>> from dpnotebook.benchmarks.rnn_speed import compare
>>> times = compare(batch=4, steps=3, input_size=2, hidden=3, repeats=2)
>>> sorted(times)
['DPLSTM', 'nn.LSTM']
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
from torch import nn

from dpnotebook.layers import DPLSTM


def _fwd_bwd(model: nn.Module, x: torch.Tensor) -> Callable[[], None]:
    def run() -> None:
        out, (h, c) = model(x)
        (out.sum() + h.sum() + c.sum()).backward()
        model.zero_grad(set_to_none=True)

    return run


def compare(
    batch: int = 128,
    steps: int = 64,
    input_size: int = 64,
    hidden: int = 128,
    num_layers: int = 1,
    repeats: int = 10,
    hooks: bool = False,
) -> dict[str, float]:
    """Fastest forward+backward time in seconds of each contender.

    Args:
        batch, steps, input_size, hidden, num_layers: the problem size.
        repeats: timed runs per contender (after one warm-up run each).
        hooks: also time DPLSTM in hooks mode (per-sample gradients).
    """
    torch.manual_seed(0)
    native = nn.LSTM(input_size, hidden, num_layers, batch_first=True)
    dp = DPLSTM(input_size, hidden, num_layers, batch_first=True)
    dp.load_state_dict(native.state_dict())
    x = torch.randn(batch, steps, input_size)
    runs = {"nn.LSTM": _fwd_bwd(native, x), "DPLSTM": _fwd_bwd(dp, x)}
    if hooks:
        from dpnotebook import GradSampleModule

        wrapped = GradSampleModule(DPLSTM(input_size, hidden, num_layers, batch_first=True))
        runs["DPLSTM (hooks, per-sample grads)"] = _fwd_bwd(wrapped, x)
    best = {name: float("inf") for name in runs}
    for run in runs.values():
        run()  # warm-up
    for _ in range(repeats):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            best[name] = min(best[name], time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--input-size", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--num-layers", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--hooks", action="store_true", help="also time hooks mode (per-sample gradients)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    times = compare(args.batch, args.steps, args.input_size, args.hidden, args.num_layers, args.repeats, args.hooks)
    print(
        f"forward+backward, B={args.batch} T={args.steps} input={args.input_size} hidden={args.hidden} "
        f"layers={args.num_layers}, {torch.get_num_threads()} threads, best of {args.repeats}:"
    )
    base = times["nn.LSTM"]
    for name, t in times.items():
        print(f"  {name:<34} {t * 1e3:8.1f} ms   {t / base:5.2f} x nn.LSTM")


if __name__ == "__main__":
    main()
