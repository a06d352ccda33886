"""Poisson sampling, empty batches, augmentation multiplicity and physical batches."""

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler, TensorDataset

from dpnotebook.privacy import (
    AugmultCollate,
    DPDataLoader,
    PoissonBatchSampler,
    augmult_data_loader,
    split_batch,
)


def test_empirical_inclusion_rate_is_q():
    n, q, steps = 1000, 0.05, 400
    sampler = PoissonBatchSampler(n, sample_rate=q, steps=steps, generator=torch.Generator().manual_seed(0))
    counts = torch.zeros(n)
    sizes = []
    for indices in sampler:
        assert len(set(indices)) == len(indices)  # no sample twice in a batch
        counts[indices] += 1
        sizes.append(len(indices))
    rate = counts.sum().item() / (n * steps)
    assert abs(rate - q) < 2e-3  # ~6 standard deviations
    per_sample = counts / steps  # every sample is drawn, independently
    assert per_sample.min() > 0 and abs(per_sample.std().item() - (q * (1 - q) / steps) ** 0.5) < 3e-3
    assert len(set(sizes)) > 5  # batch sizes vary


def test_seeded_sampling_is_reproducible_and_secure_mode_runs():
    data = TensorDataset(torch.arange(50))
    a = [b[0].tolist() for b in DPDataLoader(data, sample_rate=0.2, generator=torch.Generator().manual_seed(4))]
    b = [b[0].tolist() for b in DPDataLoader(data, sample_rate=0.2, generator=torch.Generator().manual_seed(4))]
    assert a == b and len(a) == 5
    secure = DPDataLoader(data, sample_rate=0.2, secure_mode=True)
    assert len(list(secure)) == 5


class Records(Dataset):
    """Samples of mixed types, to check empty batches field by field."""

    def __len__(self) -> int:
        return 10

    def __getitem__(self, i: int) -> dict:
        return {"image": torch.full((3, 4), float(i)), "label": i % 2, "weight": torch.tensor(0.5, dtype=torch.float64)}


def test_empty_batches_have_the_right_shapes_and_dtypes():
    loader = DPDataLoader(Records(), sample_rate=1e-6, steps=3, generator=torch.Generator().manual_seed(0))
    batches = list(loader)
    assert len(batches) == 3
    for b in batches:
        assert b["image"].shape == (0, 3, 4) and b["image"].dtype == torch.float32
        assert b["label"].shape == (0,) and b["label"].dtype == torch.int64
        assert b["weight"].shape == (0,) and b["weight"].dtype == torch.float64
    x, y = next(iter(DPDataLoader(TensorDataset(torch.randn(5, 2, 2), torch.arange(5)), sample_rate=1e-6)))
    assert x.shape == (0, 2, 2) and y.dtype == torch.int64


def test_augmult_collate_is_sample_major_with_repeated_labels():
    calls = []

    def augment(x):
        calls.append(int(x.item()))
        return x * 10 + len(calls) % 4  # the copy number is visible in the row

    x, y = AugmultCollate(augment, K=4)([(torch.tensor([1.0]), 1), (torch.tensor([2.0]), 2)])
    assert x.flatten().tolist() == [11, 12, 13, 10, 21, 22, 23, 20]
    assert y.tolist() == [1, 1, 1, 1, 2, 2, 2, 2]
    assert calls == [1, 1, 1, 1, 2, 2, 2, 2]


def test_augmult_loader_rows_samples_and_empty_batch():
    data = TensorDataset(torch.arange(30.0).view(30, 1), torch.arange(30))
    loader = augmult_data_loader(
        data, augment=lambda x: x + 0.25, K=3, sample_rate=0.2, generator=torch.Generator().manual_seed(1)
    )
    assert loader.expected_batch_size == pytest.approx(6.0)  # samples, not rows
    for x, y in loader:
        assert x.shape[0] == 3 * len(y.unique()) == len(y)
        assert torch.equal(x.view(-1, 3), (y.view(-1, 3).float() + 0.25))
    empty = augmult_data_loader(data, augment=lambda x: x.repeat(2), K=3, sample_rate=1e-6)
    x, y = next(iter(empty))
    assert x.shape == (0, 2) and y.shape == (0,)


def test_from_data_loader_keeps_dataset_and_collate():
    def collate(samples):
        return torch.stack([s[0] for s in samples]) * 2

    loader = DataLoader(TensorDataset(torch.ones(100, 2)), batch_size=25, collate_fn=collate)
    dp = DPDataLoader.from_data_loader(loader, generator=torch.Generator().manual_seed(0))
    assert dp.sample_rate == 0.25 and dp.expected_batch_size == 25 and len(dp) == 4 and dp.dataset is loader.dataset
    assert all((b == 2).all() for b in dp)


def test_split_batch_keeps_k_rows_together():
    x = torch.arange(12).view(12, 1)
    y = torch.arange(12) // 3
    pieces = list(split_batch((x, y), max_physical_batch_size=2, K=3))
    assert [len(p[0]) for p in pieces] == [6, 6]
    assert pieces[1][1].tolist() == [2, 2, 2, 3, 3, 3]
    assert list(split_batch((torch.zeros(0, 2),), max_physical_batch_size=4)) == []


def test_inclusion_is_drawn_in_float64() -> None:
    """Each sample is in with probability q itself: float32 uniforms (a grid of 2^-24) round q up to that grid."""
    q = 0.1 + 2**-30  # between two float32 uniforms: a float32 draw would include with another probability
    sampler = PoissonBatchSampler(1000, sample_rate=q, steps=3, generator=torch.Generator().manual_seed(7))
    reference = torch.Generator().manual_seed(7)
    for batch in sampler:
        expected = torch.nonzero(torch.rand(1000, generator=reference, dtype=torch.float64) < q).flatten().tolist()
        assert batch == expected


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"shuffle": True}, "shuffle=True"),
        ({"drop_last": True}, "drop_last=True"),
        ({"shuffle": True, "drop_last": True}, "shuffle=True and drop_last=True"),
        ({"sampler": list(range(10))}, "sampler=list"),
        ({"batch_sampler": BatchSampler(RandomSampler(range(10)), 3, False)}, "batch_sampler=BatchSampler"),
        ({"batch_sampler": BatchSampler(range(10), 3, True)}, "batch_sampler=BatchSampler"),
        ({"batch_sampler": [[0, 1, 2], [3, 4, 5], [6, 7, 8]]}, "batch_sampler=list"),
    ],
)
def test_make_private_warns_of_the_sampling_options_it_replaces(options, named):
    """Opacus warns of ``drop_last``; a shuffle, sampler or batch sampler replaced by Poisson sampling is said too."""
    from torch import nn

    from dpnotebook.privacy import PrivacyEngine

    model = nn.Linear(2, 2)
    size = {} if "batch_sampler" in options else {"batch_size": 3}
    loader = DataLoader(TensorDataset(torch.randn(10, 2), torch.arange(10) % 2), **size, **options)
    with pytest.warns(UserWarning, match=rf"data_loader has {named}: ignored\. Poisson sampling .* q = 1/len"):
        _, _, dp_loader = PrivacyEngine(secure_mode=False).make_private(
            module=model,
            optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
            data_loader=loader,
            noise_multiplier=1.0,
            max_grad_norm=1.0,
        )
    assert isinstance(dp_loader, DPDataLoader) and dp_loader.sample_rate == 1 / len(loader)


def test_a_plain_loader_or_a_poisson_one_gets_no_sampling_warning():
    import warnings

    from torch import nn

    from dpnotebook.privacy import PrivacyEngine

    data = TensorDataset(torch.randn(10, 2), torch.arange(10) % 2)
    for loader in (DataLoader(data, batch_size=5), DPDataLoader(data, sample_rate=0.5)):
        model = nn.Linear(2, 2)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            PrivacyEngine(secure_mode=False).make_private(
                module=model,
                optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                data_loader=loader,
                noise_multiplier=1.0,
                max_grad_norm=1.0,
            )
