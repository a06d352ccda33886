"""The noise never repeats the random numbers that chose the batches (``check_streams_apart``)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from dpnotebook.privacy import DPDataLoader, PrivacyEngine


def made(noise: torch.Generator | None, sampling: torch.Generator | None, **loader: Any) -> Any:
    model = nn.Linear(3, 2)
    data = TensorDataset(torch.randn(40, 3), torch.randint(0, 2, (40,)))
    return PrivacyEngine(secure_mode=False).make_private(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        data_loader=loader.pop("data_loader", None) or DataLoader(data, batch_size=8, **loader),
        noise_multiplier=1.0,
        max_grad_norm=1.0,
        noise_generator=noise,
        sampling_generator=sampling,
    )


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_two_generators_seeded_alike_share_their_numbers() -> None:
    """Why the check exists: same seed, same kind of generator, the same stream (noise made of batch draws)."""
    uniforms = torch.rand(1000, generator=seeded(7), dtype=torch.float64)
    again = torch.rand(1000, generator=seeded(7), dtype=torch.float64)
    assert torch.equal(uniforms, again)


@pytest.mark.parametrize(
    "where",
    ["sampling_generator", "the loader's generator", "a DPDataLoader's generator", "torch.manual_seed"],
)
def test_a_noise_generator_seeded_like_the_batches_is_refused(where: str) -> None:
    data = TensorDataset(torch.randn(40, 3), torch.randint(0, 2, (40,)))
    with pytest.raises(ValueError, match="seeded like the generator.*seed 5.*Fix: give noise_generator"):
        if where == "sampling_generator":
            made(seeded(5), seeded(5))
        elif where == "the loader's generator":
            made(seeded(5), None, generator=seeded(5))
        elif where == "a DPDataLoader's generator":
            made(seeded(5), None, data_loader=DPDataLoader(data, sample_rate=0.2, generator=seeded(5)))
        else:
            torch.manual_seed(5)  # the batches come from torch's global generator
            made(seeded(5), None)


def test_the_global_generator_seeded_like_the_sampling_one_is_refused(device: torch.device) -> None:
    torch.manual_seed(3)
    if device.type != "cpu":  # the noise of a GPU model comes from the GPU's own generator (Philox), not the CPU's
        made(None, seeded(3))
        return
    with pytest.raises(ValueError, match="seeded like the generator .seed 3."):
        made(None, seeded(3))


@pytest.mark.parametrize(
    "noise, sampling",
    [(0, 1), ("same", "same"), (None, None), (None, 1), (0, None)],
)
def test_generators_apart_or_one_stream_read_in_turn_are_accepted(noise: Any, sampling: Any) -> None:
    torch.manual_seed(2)
    shared = seeded(4)

    def pick(g: Any) -> torch.Generator | None:
        return shared if g == "same" else None if g is None else seeded(g)

    made(pick(noise), pick(sampling))  # no error


def test_a_dp_data_loaders_seed_survives_make_private() -> None:
    """make_private rebuilds a DPDataLoader; its batches still come from the generator it was given."""
    data = TensorDataset(torch.arange(40.0).unsqueeze(1).repeat(1, 3), torch.zeros(40, dtype=torch.long))

    def batches() -> list[list[float]]:
        loader = DPDataLoader(data, sample_rate=0.2, generator=seeded(9))
        torch.manual_seed(int(torch.randint(10**6, (1,))))  # the global generator must not matter
        *_, rebuilt = made(seeded(1), None, data_loader=loader)
        return [x[:, 0].tolist() for x, _ in rebuilt]

    assert batches() == batches()
