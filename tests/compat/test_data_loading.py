"""Item 6: ``DPDataLoader.from_data_loader(loader, distributed=False)``, the loader's seeded generator,
``BatchMemoryManager``'s loader with ``len()``, the empty Poisson batch, run with both libraries."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader

from tests.compat.conftest import LIBRARIES
from tests.compat.scripts import dataset, lib, loader, mlp


def batch_sizes(dp_loader) -> list[int]:
    return [len(y) for _, y in dp_loader]


def test_from_data_loader_keeps_q_and_length() -> None:
    for name in LIBRARIES:
        DPDataLoader = lib(name, "data_loader").DPDataLoader
        dp = DPDataLoader.from_data_loader(loader(dataset()), distributed=False)
        assert (len(dp), dp.sample_rate) == (4, 0.25), name


def test_the_loaders_seeded_generator_is_honoured() -> None:
    for name in LIBRARIES:
        DPDataLoader = lib(name, "data_loader").DPDataLoader

        def seeded(seed: int, DPDataLoader: type = DPDataLoader) -> list[int]:  # this library's, bound now
            plain = DataLoader(dataset(), batch_size=16, generator=torch.Generator().manual_seed(seed))
            return batch_sizes(DPDataLoader.from_data_loader(plain))

        assert seeded(3) == seeded(3), name
        assert any(seeded(3) != seeded(s) for s in (4, 5, 6)), name


def test_make_private_samples_with_the_loaders_generator() -> None:
    def run(seed: int) -> list[int]:
        model = mlp()
        plain = DataLoader(dataset(), batch_size=16, generator=torch.Generator().manual_seed(seed))
        _, _, dp = (
            lib("dpnotebook")
            .PrivacyEngine(secure_mode=False)
            .make_private(
                module=model,
                optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                data_loader=plain,
                noise_multiplier=1.0,
                max_grad_norm=1.0,
            )
        )
        return batch_sizes(dp)

    assert run(7) == run(7)


def memory_manager_script(name: str) -> tuple[int, list[int], int]:
    model = mlp()
    engine = lib(name).PrivacyEngine()
    model, optimizer, dp = engine.make_private(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        data_loader=loader(dataset()),
        noise_multiplier=1.0,
        max_grad_norm=1.0,
    )
    BatchMemoryManager = lib(name, "utils.batch_memory_manager").BatchMemoryManager
    sizes = []
    with BatchMemoryManager(data_loader=dp, max_physical_batch_size=5, optimizer=optimizer) as physical:
        length = len(physical)
        for x, y in physical:
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
            sizes.append(len(y))
    return length, sizes, sum(n for _, _, n in engine.accountant.history)  # Opacus merges steps in history


def test_batch_memory_manager_has_a_length_and_steps_once_per_logical_batch() -> None:
    runs = {name: memory_manager_script(name) for name in LIBRARIES}
    assert runs["dpnotebook"][0] == runs["opacus"][0] == 13  # ceil(4 * 16 / 5)
    for name, (_, sizes, steps) in runs.items():
        assert max(sizes) <= 5 and steps == 4, name


def test_an_empty_poisson_batch_warns_once() -> None:
    DPDataLoader = lib("dpnotebook", "data_loader").DPDataLoader
    dp = DPDataLoader(dataset(n=10), sample_rate=0.05, generator=torch.Generator().manual_seed(0))
    with pytest.warns(UserWarning, match="empty batch") as caught:
        sizes = batch_sizes(dp)
    assert 0 in sizes and len([w for w in caught if "empty batch" in str(w.message)]) == 1
