"""DP-SGD on scikit-learn's digits with several processes (``torch.distributed``), or with one.

Two processes on this machine (gloo on CPU; NCCL with ``--device cuda``, one GPU per process)::

    torchrun --nproc_per_node 2 examples/train_digits_distributed.py

Several machines: the same command on every machine, with the number of machines and
one address that all of them reach (machine 0's, any free port)::

    torchrun --nnodes 2 --nproc_per_node 2 --rdzv-backend c10d \\
             --rdzv-endpoint 10.0.0.1:29500 --rdzv-id digits examples/train_digits_distributed.py

One process, the same training for comparison::

    python examples/train_digits_distributed.py

Every rank samples its share of each global Poisson batch (rate ``q``, expected
size ``--batch-size`` over all ranks), clips its own samples; the clipped sums are
all-reduced with rank 0's noise, once per step (see ``docs/distributed.md``). The
seeds are the same on every rank, so the batches and the noise are those of the
one-process run: the accuracy and epsilon match it, up to float rounding.
"""

from __future__ import annotations

import argparse
import datetime
import os
import time
from contextlib import nullcontext

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from dpnotebook.datasets import load_digits_tensors
from dpnotebook.models import SmallCNN
from dpnotebook.privacy import DPDDP, PrivacyEngine, evaluate, fit


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epsilon", type=float, default=8.0, help="target epsilon (default 8)")
    parser.add_argument("--delta", type=float, default=1e-5, help="target delta (default 1e-5)")
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=128, help="expected batch size over all ranks")
    parser.add_argument("--lr", type=float, default=1e-2, help="Adam learning rate")
    parser.add_argument("--max-grad-norm", type=float, default=1.0, help="clipping bound C")
    parser.add_argument("--accountant", default="pld", help="pld, prv or rdp")
    parser.add_argument("--grad-sample-mode", default="hooks", help="hooks, ghost, functorch or ew")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--secure", action="store_true", help="OS CSPRNG for sampling and noise (not reproducible)")
    parser.add_argument("--device", default="cpu", help="cpu (gloo) or cuda (nccl, one GPU per process)")
    parser.add_argument("--timeout", type=float, default=120, help="seconds a collective may wait for a rank")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Train with DP-SGD on this process's rank (or alone); rank 0 prints and returns the figures."""
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    started_here = "WORLD_SIZE" in os.environ and not dist.is_initialized()  # torchrun set the environment
    distributed = started_here or dist.is_initialized()  # (a test may have started the group already)
    device = torch.device(args.device)
    if distributed and device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    if started_here:
        dist.init_process_group(
            "nccl" if device.type == "cuda" else "gloo", timeout=datetime.timedelta(seconds=args.timeout)
        )
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)

    train, test = load_digits_tensors(seed=args.seed)
    torch.manual_seed(args.seed)
    model = SmallCNN().to(device)
    if distributed:
        model = DPDDP(model)  # rank 0's weights on every rank; the optimizer all-reduces the clipped sums
    engine = PrivacyEngine(accountant=args.accountant, secure_mode=args.secure)
    generators = (
        {}
        if args.secure
        else {
            "noise_generator": torch.Generator(device).manual_seed(args.seed),  # used by rank 0 only
            "sampling_generator": torch.Generator().manual_seed(args.seed + 1),  # the same on every rank
        }
    )
    model, optimizer, train_loader = engine.make_private_with_epsilon(
        module=model,
        optimizer=torch.optim.Adam(model.parameters(), lr=args.lr),
        data_loader=DataLoader(train, batch_size=args.batch_size),  # the whole dataset, on every rank
        target_epsilon=args.epsilon,
        target_delta=args.delta,
        epochs=args.epochs,
        max_grad_norm=args.max_grad_norm,
        grad_sample_mode=args.grad_sample_mode,
        **generators,
    )
    sigma = optimizer.noise_multiplier
    with optimizer.fail_together() if distributed else nullcontext():  # an error on one rank stops all
        fit(
            model,
            optimizer,
            train_loader,
            epochs=args.epochs,
            progress=not args.no_progress and rank == 0,
            description=f"DP-SGD rank {rank}/{world} sigma={sigma:.2f}",
        )
    accuracy = evaluate(model, DataLoader(test, batch_size=512))
    epsilon = engine.get_epsilon(args.delta)
    seconds = time.perf_counter() - start
    if rank == 0:
        print(
            f"digits: {len(train)} training and {len(test)} test images, {args.epochs} epochs, "
            f"expected batch size {args.batch_size} over {world} process(es)"
        )
        print(
            f"  DP-SGD test accuracy {accuracy:.1%}   epsilon = {epsilon:.2f} at delta = {args.delta:g} "
            f"({args.accountant}), sigma = {sigma:.3f}, C = {args.max_grad_norm:g}, {len(engine.accountant)} steps"
        )
        print(f"  total time {seconds:.1f} s")
    if started_here:
        dist.destroy_process_group()
    return {
        "accuracy": accuracy,
        "epsilon": epsilon,
        "noise_multiplier": sigma,
        "steps": len(engine.accountant),
        "seconds": seconds,
        "world_size": world,
    }


if __name__ == "__main__":
    main()
