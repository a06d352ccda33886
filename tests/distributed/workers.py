"""What each rank runs in the distributed tests (module level, so that spawned processes can import it).

Every function takes ``(rank, world_size, ...)`` and runs inside a process group
set up by :func:`dpnotebook.privacy.run_on_ranks`; with
``world_size=None`` the training runs in this process alone (the reference).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Subset, TensorDataset

from dpnotebook.privacy import DPDDP, BatchMemoryManager, PrivacyEngine, RanksFailedError
from dpnotebook.privacy._data import AugmultCollate

N, FEATURES, CLASSES = 24, 6, 3


class CopyScale:
    """A deterministic augmentation: copy ``k`` of a sample is scaled by ``1 + 0.1 k``."""

    def __init__(self, K: int) -> None:
        self.K, self.calls = K, 0

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        k, self.calls = self.calls % self.K, self.calls + 1
        return x * (1 + 0.1 * k)


def dataset(seed: int = 0) -> TensorDataset:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(N, FEATURES, generator=gen, dtype=torch.float64)
    return TensorDataset(x, torch.randint(0, CLASSES, (N,), generator=gen))


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(FEATURES, 8), nn.Tanh(), nn.Linear(8, CLASSES)).double()


def train(
    world_size: int | None,
    *,
    mode: str,
    K: int,
    wrapper: str = "dpddp",
    batch_size: int = 6,
    steps: int = 4,
    physical: int | None = None,
    sigma: float = 0.0,
    seed: int = 0,
    clipping: str = "flat",
) -> dict[str, Any]:
    """A few DP-SGD steps; the final parameters and each step's local batch sizes."""
    model = mlp()
    if world_size is not None:
        model = DPDDP(model) if wrapper == "dpddp" else DistributedDataParallel(model)
    collate = AugmultCollate(CopyScale(K), K=K) if K > 1 else None
    loader = DataLoader(dataset(), batch_size=batch_size, collate_fn=collate)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    engine = PrivacyEngine(accountant="rdp", secure_mode=False)
    model, optimizer, loader = engine.make_private(
        module=model,
        optimizer=optimizer,
        data_loader=loader,
        noise_multiplier=sigma,
        max_grad_norm=0.3,
        grad_sample_mode=mode,
        K=K,
        clipping=clipping,
        sampling_generator=torch.Generator().manual_seed(seed),
        noise_generator=torch.Generator().manual_seed(seed + 1),
    )
    sizes: list[int] = []
    loader.batch_listeners.append(sizes.append)  # each logical batch's examples, on this rank
    batches = (
        BatchMemoryManager(data_loader=loader, max_physical_batch_size=physical, optimizer=optimizer)
        if physical
        else None
    )
    for x, y in batches.__enter__() if batches else loader:
        optimizer.zero_grad()
        if len(y) or mode != "ew":  # ExpandedWeights cannot run an empty batch: a noise-only step without it
            F.cross_entropy(model(x), y).backward()
        optimizer.step()
        if len(engine.accountant) == steps:
            break
    return {
        "params": [p.detach().clone() for p in model.parameters()],
        "sizes": sizes,
        "steps": len(engine.accountant),
        "global": getattr(optimizer, "global_batch_size", None),
    }


def train_cases(rank: int, world_size: int, cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [train(world_size, **case) for case in cases]


def ddp_leaves_gradients_alone(rank: int, world_size: int) -> dict[str, Any]:
    """p.grad after backward through make_private's model (from a DDP) against this rank's own gradient."""
    ddp = DistributedDataParallel(mlp())
    engine = PrivacyEngine(accountant="rdp", secure_mode=False)
    model, _, _ = engine.make_private(
        module=ddp,
        optimizer=torch.optim.SGD(ddp.parameters(), lr=0.1),
        data_loader=DataLoader(dataset(), batch_size=6),
        noise_multiplier=0.0,
        max_grad_norm=1.0,
    )
    x, y = dataset()[rank * 5 : rank * 5 + 5]
    plain = mlp()
    F.cross_entropy(plain(x), y).backward()
    F.cross_entropy(model(x), y).backward()
    gap = max(float((p.grad - q.grad).abs().max()) for p, q in zip(model.parameters(), plain.parameters(), strict=True))
    try:
        ddp(x)
        refused = ""
    except Exception as error:  # noqa: BLE001 - recorded for the test
        refused = f"{type(error).__name__}: {error}"
    return {"gap": gap, "refused": refused}


def zero_gradient_noise(rank: int, world_size: int, steps: int, sigma: float, C: float) -> dict[str, Any]:
    """``steps`` steps of a model whose every per-sample gradient is 0: each step's p.grad is the noise alone."""
    torch.manual_seed(0)
    model = DPDDP(nn.Linear(50, 20, bias=False))
    data = TensorDataset(torch.zeros(64, 50), torch.zeros(64, 20))
    engine = PrivacyEngine(accountant="rdp", secure_mode=False)
    model, optimizer, loader = engine.make_private(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.0),
        data_loader=DataLoader(data, batch_size=16),
        noise_multiplier=sigma,
        max_grad_norm=C,
        noise_generator=torch.Generator().manual_seed(rank + 10),
    )
    grads = []
    while len(grads) < steps:
        for x, y in loader:
            optimizer.zero_grad()
            F.mse_loss(model(x), y).backward()
            optimizer.step()
            grads.append(model.weight.grad.detach().clone().flatten())
    return {
        "grads": torch.stack(grads[:steps]),
        "expected_batch_size": optimizer.expected_batch_size,
        "sample_rate": engine.sample_rate,
        "steps": len(engine.accountant),
        "epsilon": engine.get_epsilon(1e-5),
    }


def secure_steps(rank: int, world_size: int) -> list[torch.Tensor]:
    """Three steps in secure mode (OS CSPRNG for the sampling on every rank and the noise on rank 0)."""
    model = DPDDP(mlp())
    engine = PrivacyEngine(accountant="rdp", secure_mode=True)
    model, optimizer, loader = engine.make_private(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.5),
        data_loader=DataLoader(dataset(), batch_size=6),
        noise_multiplier=1.0,
        max_grad_norm=1.0,
    )
    for _, (x, y) in zip(range(3), loader, strict=False):  # the first three batches
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
    return [p.detach().clone() for p in model.parameters()]


def audit_cases(rank: int, world_size: int, cases: list[tuple[str, str, str, int]]) -> list[dict[str, Any]]:
    """The cross-rank sensitivity audit of adversarial records: ``(family, record, mode, K)`` each."""
    from dpnotebook.audit import audit_case, audit_sensitivity_across_ranks

    reports = []
    for family, record, mode, K in cases:
        case = audit_case(family, record, num_samples=5)
        report = audit_sensitivity_across_ranks(
            case.model(True),
            batch=lambda idx, case=case, K=K: case.batch(idx, K=K, batch_first=True),
            loss=case.loss(loss_reduction="mean", batch_first=True, K=K),
            num_samples=case.num_samples,
            mode=mode,
            K=K,
            max_grad_norm=0.5,
        )
        reports.append(
            {
                "case": (family, record, mode, K),
                "ok": report.ok(),
                "max_ratio": report.max_ratio,
                "reference_gap": report.reference_gap,
                "table": report.table(),
            }
        )
    return reports


def _engine_and_loop(mode: str = "hooks") -> tuple[nn.Module, Any, Any]:
    model = DPDDP(mlp())
    engine = PrivacyEngine(accountant="rdp", secure_mode=False)
    return engine.make_private(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        data_loader=DataLoader(dataset(), batch_size=6),
        noise_multiplier=1.0,
        max_grad_norm=1.0,
        sampling_generator=torch.Generator().manual_seed(1),  # apart from the noise's global seed 0 (mlp())
        grad_sample_mode=mode,
    )


def failures(rank: int, world_size: int) -> dict[str, str]:
    """Three ways for rank 1 to fail; what each rank saw. The last one ends rank 1's process."""
    seen: dict[str, str] = {}
    # 1. bad input in rank 1's forward pass, inside fail_together: rank 0 is waiting in the step's all-reduce
    model, optimizer, loader = _engine_and_loop()
    try:
        with optimizer.fail_together():
            for step, (x, y) in enumerate(loader):
                if rank == 1 and step == 1:
                    x = x[:, :4]  # 4 features for a layer of 6: the forward raises
                optimizer.zero_grad()
                F.cross_entropy(model(x), y).backward()
                optimizer.step()
    except Exception as error:  # noqa: BLE001 - recorded for the test
        seen["forward"] = f"{type(error).__name__}: {error}"
    # 2. rank 1 raises inside the step: it trains on two Poisson batches before one step (epsilon under-counted)
    model, optimizer, loader = _engine_and_loop()
    try:
        batches = iter(loader)
        for step, (x, y) in enumerate(batches):
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            if rank == 1 and step == 1:
                optimizer.virtual_step()
                x, y = next(batches)
                F.cross_entropy(model(x), y).backward()
            optimizer.step()
    except RuntimeError as error:
        seen["step"] = f"{type(error).__name__}: {error}"
    # 3. rank 1 raises and its process ends, no fail_together: rank 0's all-reduce sees the closed connection
    model, optimizer, loader = _engine_and_loop()
    if rank == 1:
        raise ValueError(f"rank 1 stops on bad input (it saw before: {seen})")
    try:
        for x, y in loader:
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            optimizer.step()
    except RanksFailedError as error:
        seen["death"] = f"{type(error).__name__}: {error}"
    return seen


def several(rank: int, world_size: int, calls: list[tuple[str, tuple]]) -> dict[str, Any]:
    """Run several of this module's rank functions in one launch: ``{name: result}``."""
    return {name: globals()[name](rank, world_size, *args) for name, args in calls}


def run_example(rank: int, world_size: int, argv: list[str]) -> dict[str, Any]:
    """``examples/train_digits_distributed.py``'s ``main(argv)`` on this rank (``world_size=None``: alone)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "examples" / "train_digits_distributed.py"
    spec = importlib.util.spec_from_file_location("train_digits_distributed", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    threads = torch.get_num_threads()
    try:
        result = module.main(argv)
    finally:
        torch.set_num_threads(threads)  # main sets it for its process; the test process keeps its own
    return {k: v for k, v in result.items() if k != "seconds"}


def cuda_zero_gradient_noise(rank: int, world_size: int, steps: int, sigma: float, C: float) -> dict[str, Any]:
    """:func:`zero_gradient_noise` with the model on this rank's GPU (NCCL): the noise is still added once."""
    device = torch.device("cuda", rank)
    model = DPDDP(nn.Linear(50, 20, bias=False).to(device))
    data = TensorDataset(torch.zeros(64, 50), torch.zeros(64, 20))
    engine = PrivacyEngine(accountant="rdp", secure_mode=False)
    model, optimizer, loader = engine.make_private(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.0),
        data_loader=DataLoader(data, batch_size=16),
        noise_multiplier=sigma,
        max_grad_norm=C,
        noise_generator=torch.Generator(device=device).manual_seed(rank + 10),
    )
    grads = []
    while len(grads) < steps:
        for x, y in loader:
            optimizer.zero_grad()
            F.mse_loss(model(x.to(device)), y.to(device)).backward()
            optimizer.step()
            grads.append(model.weight.grad.detach().flatten().cpu())
    return {"grads": torch.stack(grads[:steps]), "expected_batch_size": optimizer.expected_batch_size}


def uneven_ranks(rank: int, world_size: int, settings: list[dict[str, Any]], steps: int = 6) -> dict[str, Any]:
    """Issue #28.5: each rank calls make_private with ``settings[rank]`` (a per-rank loader's batch size, ...).

    Returns the refusal (if any), else this rank's epsilon, q and final parameters after ``steps`` steps.
    """
    mine = dict(settings[rank])
    batch_size = mine.pop("batch_size", 6)
    accountant = mine.pop("accountant", "rdp")
    data = dataset()
    if "subset" in mine:  # this rank's own part: a Subset of every other example, from the offset given
        data = Subset(data, list(range(mine.pop("subset"), N, 2)))
    if "slice" in mine:  # the same as a slice of the tensors
        start = mine.pop("slice")
        data = TensorDataset(*(t[start::2] for t in data.tensors))
    model = DPDDP(mlp())
    engine = PrivacyEngine(accountant=accountant, secure_mode=False)
    kwargs: dict[str, Any] = {"noise_multiplier": 1.0, "max_grad_norm": 0.3, **mine}
    try:
        model, optimizer, loader = engine.make_private(
            module=model,
            optimizer=torch.optim.SGD(model.parameters(), lr=0.5),
            data_loader=DataLoader(data, batch_size=batch_size),
            sampling_generator=torch.Generator().manual_seed(0),
            noise_generator=torch.Generator().manual_seed(1),
            **kwargs,
        )
    except ValueError as error:
        return {"refused": str(error)}
    while len(engine.accountant) < steps:
        for x, y in loader:
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            optimizer.step()
            if len(engine.accountant) == steps:
                break
    return {
        "refused": "",
        "epsilon": engine.get_epsilon(1e-5),
        "sample_rate": engine.sample_rate,
        "params": [p.detach().clone() for p in model.parameters()],
    }


def uneven_scenarios(rank: int, world_size: int, scenarios: list[tuple[list[dict[str, Any]], int]]) -> list[Any]:
    """:func:`uneven_ranks` for each ``(settings by rank, steps)``, one after the other in one process group."""
    return [uneven_ranks(rank, world_size, settings, steps) for settings, steps in scenarios]


def knob_changed_on_one_rank(rank: int, world_size: int, changes: list[tuple[str, Any]]) -> list[str]:
    """For each ``(knob, value)``: after one step, rank 1 alone sets ``optimizer.<knob> = value`` (a scheduler
    stepped, or a checkpoint loaded, on one rank only), or for ``("weights", value)`` adds ``value`` to the
    model's first parameter (weights loaded on one rank after wrapping); what the next step raised on this
    rank ("" if nothing)."""
    seen = []
    for knob, value in changes:
        model, optimizer, loader = _engine_and_loop()
        try:
            for step, (x, y) in enumerate(loader):
                if step == 1 and rank == 1 and knob == "weights":
                    with torch.no_grad():
                        next(model.parameters()).add_(value)
                elif step == 1 and rank == 1:
                    setattr(optimizer, knob, value)
                optimizer.zero_grad()
                F.cross_entropy(model(x), y).backward()
                optimizer.step()
            seen.append("")
        except RuntimeError as error:
            seen.append(f"{type(error).__name__}: {error}")
    return seen
