"""Train a small CNN with DP-SGD on scikit-learn's handwritten digits, beside a non-private baseline.

Run it::

    python examples/train_digits.py            # epsilon <= 8 at delta = 1e-5
    python examples/train_digits.py --epsilon 2

Everything reusable (the data, the model, the loops) lives in the library:
``dpnotebook.datasets``, ``dpnotebook.models`` and ``dpnotebook.privacy``.
The script only wires them together. About 10-20 s on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.utils.data import DataLoader

from dpnotebook.datasets import load_digits_tensors
from dpnotebook.models import SmallCNN
from dpnotebook.privacy import PrivacyEngine, evaluate, fit


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epsilon", type=float, default=8.0, help="target epsilon (default 8)")
    parser.add_argument("--delta", type=float, default=1e-5, help="target delta (default 1e-5)")
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=128, help="expected batch size")
    parser.add_argument("--lr", type=float, default=1e-2, help="Adam learning rate")
    parser.add_argument("--max-grad-norm", type=float, default=1.0, help="clipping bound C")
    parser.add_argument("--accountant", default="pld", help="pld, prv or rdp")
    parser.add_argument("--grad-sample-mode", default="hooks", help="hooks or functorch")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads; 1 is fastest for this tiny model, above all on a busy machine",
    )
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bars")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Train both models, print a comparison, and return the figures."""
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    train, test = load_digits_tensors(seed=args.seed)
    test_loader = DataLoader(test, batch_size=512)
    progress = not args.no_progress

    # The non-private baseline: the same model, optimizer, batch size and epochs.
    torch.manual_seed(args.seed)
    model = SmallCNN()
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    train_loader = DataLoader(train, batch_size=args.batch_size, shuffle=True)
    fit(model, optimizer, train_loader, epochs=args.epochs, progress=progress, description="non-private")
    baseline_accuracy = evaluate(model, test_loader)

    # DP-SGD: the smallest noise that spends at most the target epsilon in these epochs.
    torch.manual_seed(args.seed)
    model = SmallCNN()
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    engine = PrivacyEngine(accountant=args.accountant)
    model, optimizer, train_loader = engine.make_private_with_epsilon(
        module=model,
        optimizer=optimizer,
        data_loader=DataLoader(train, batch_size=args.batch_size),
        target_epsilon=args.epsilon,
        target_delta=args.delta,
        epochs=args.epochs,
        max_grad_norm=args.max_grad_norm,
        grad_sample_mode=args.grad_sample_mode,
        noise_generator=torch.Generator().manual_seed(args.seed),
        sampling_generator=torch.Generator().manual_seed(args.seed + 1),
    )
    sigma = optimizer.noise_multiplier
    fit(model, optimizer, train_loader, epochs=args.epochs, progress=progress, description=f"DP-SGD sigma={sigma:.2f}")
    accuracy = evaluate(model, test_loader)
    epsilon = engine.get_epsilon(args.delta)
    seconds = time.perf_counter() - start

    print(
        f"digits: {len(train)} training and {len(test)} test images, {args.epochs} epochs, "
        f"expected batch size {args.batch_size}"
    )
    print(f"  non-private     test accuracy {baseline_accuracy:.1%}")
    print(
        f"  DP-SGD          test accuracy {accuracy:.1%}   epsilon = {epsilon:.2f} at delta = {args.delta:g} "
        f"({args.accountant}), sigma = {sigma:.3f}, C = {args.max_grad_norm:g}, {len(engine.accountant)} steps"
    )
    print(f"  total time {seconds:.1f} s")
    return {
        "accuracy": accuracy,
        "baseline_accuracy": baseline_accuracy,
        "epsilon": epsilon,
        "noise_multiplier": sigma,
        "steps": len(engine.accountant),
        "seconds": seconds,
    }


if __name__ == "__main__":
    main()
