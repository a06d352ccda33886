"""Time DPLSTM against nn.LSTM, side by side: ``python -m dpnotebook.benchmarks.rnn_speed [--device cuda]``.

Both recurrences of the DP layer (``loop`` in Python, ``fused``: PyTorch's RNN operator, cuDNN on a GPU)
in two tables: the layer's forward and backward pass against ``nn.LSTM`` with the same weights, and the
suite's ``LSTMClassifier`` steps (non-private with ``DPLSTM``, DP-SGD in hooks and ghost mode) as ratios
to the non-private ``nn.LSTM`` step. The runs alternate; the fastest of ``--repeats`` counts.

>>> times = compare(batch=4, steps=3, input_size=2, hidden=3, repeats=2)
>>> sorted(times)
['DPLSTM fused', 'DPLSTM loop', 'nn.LSTM']
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import nn

from dpnotebook.benchmarks.steps import interleaved
from dpnotebook.layers import DPLSTM, DPRNNBase

RUNS = ("loop", "fused")


@contextmanager
def recurrence(setting: str) -> Iterator[None]:
    """Every DP recurrent layer runs its recurrence as ``setting`` says (``"auto"``, ``"fused"``, ``"loop"``)."""
    before = DPRNNBase.recurrence
    DPRNNBase.recurrence = setting
    try:
        yield
    finally:
        DPRNNBase.recurrence = before


def _fwd_bwd(model: nn.Module, x: torch.Tensor) -> Callable[[], None]:
    def run() -> None:
        out, (h, c) = model(x)
        (out.sum() + h.sum() + c.sum()).backward()
        model.zero_grad(set_to_none=True)

    return run


def _best(runs: dict[str, Callable[[], None]], repeats: int, device: str) -> dict[str, float]:
    """Fastest time in seconds of each run, the runs alternating (after one warm-up run each)."""
    return {name: min(ms) / 1e3 for name, ms in interleaved(runs, repeats, device, warmup=1).items()}


def compare(
    batch: int = 128,
    steps: int = 64,
    input_size: int = 64,
    hidden: int = 128,
    num_layers: int = 1,
    repeats: int = 10,
    device: str = "cpu",
) -> dict[str, float]:
    """Fastest forward+backward time in seconds of ``nn.LSTM`` and of ``DPLSTM`` with each recurrence,
    over ``repeats`` timed runs after a warm-up one, on ``device``."""
    torch.manual_seed(0)
    native = nn.LSTM(input_size, hidden, num_layers, batch_first=True).to(device)
    x = torch.randn(batch, steps, input_size, device=device)
    runs = {"nn.LSTM": _fwd_bwd(native, x)}
    for setting in RUNS:
        dp = DPLSTM(input_size, hidden, num_layers, batch_first=True).to(device)
        dp.load_state_dict(native.state_dict())
        dp.recurrence = setting
        runs[f"DPLSTM {setting}"] = _fwd_bwd(dp, x)
    return _best(runs, repeats, device)


def compare_steps(batch: int = 128, repeats: int = 10, device: str = "cpu") -> dict[str, float]:
    """Fastest time in seconds of the suite's ``LSTMClassifier`` steps: ``nonprivate`` (``nn.LSTM``), and
    ``<what> <recurrence>`` for ``nonprivate_dplayers``, ``dpsgd_hooks`` and ``dpsgd_ghost``."""
    from dpnotebook.benchmarks.steps import make_step

    runs = {"nonprivate": make_step("LSTMClassifier", "nonprivate", batch, device=device)}
    for setting in RUNS:
        for what in ("nonprivate_dplayers", "dpsgd_hooks", "dpsgd_ghost"):
            step = make_step("LSTMClassifier", what, batch, device=device)

            def run(step: Callable[[], None] = step, setting: str = setting) -> None:
                with recurrence(setting):
                    step()

            runs[f"{what} {setting}"] = run
    return _best(runs, repeats, device)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--input-size", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--num-layers", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    parser.add_argument("--no-steps", action="store_true", help="time the layer only, not the LSTMClassifier steps")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    where = f"{args.device}" + (f", {torch.get_num_threads()} threads" if args.device == "cpu" else "")
    x = torch.zeros(1, device=args.device)
    auto = "fused" if x.is_cuda and torch.backends.cudnn.enabled else "loop"
    print(f"device: {where}" + (f" ({torch.cuda.get_device_name()})" if x.is_cuda else "") + f"; auto = {auto}")
    times = compare(args.batch, args.steps, args.input_size, args.hidden, args.num_layers, args.repeats, args.device)
    print(
        f"layer forward+backward, B={args.batch} T={args.steps} input={args.input_size} hidden={args.hidden} "
        f"layers={args.num_layers}, best of {args.repeats}:"
    )
    base = times["nn.LSTM"]
    for name, t in times.items():
        print(f"  {name:<34} {t * 1e3:8.2f} ms   {t / base:5.2f} x nn.LSTM")
    if args.no_steps:
        return
    steps = compare_steps(args.batch, args.repeats, args.device)
    base = steps["nonprivate"]
    print(f"LSTMClassifier step (T=64, hidden 128), B={args.batch}, best of {args.repeats}; ratio to nn.LSTM's step:")
    print(f"  {'':<22}" + "".join(f"{s:>22}" for s in RUNS))
    print(f"  {'nonprivate nn.LSTM':<22}{base * 1e3:14.2f} ms  1.00 x")
    for what in ("nonprivate_dplayers", "dpsgd_hooks", "dpsgd_ghost"):
        cells = "".join(f"{steps[f'{what} {s}'] * 1e3:14.2f} ms {steps[f'{what} {s}'] / base:5.2f} x" for s in RUNS)
        print(f"  {what:<22}{cells}")


if __name__ == "__main__":
    main()
