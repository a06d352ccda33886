"""Every bad privacy argument fails with a message naming the argument, its value and a fix."""

import re

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from dpnotebook.privacy import (
    AugmultCollate,
    DPDataLoader,
    DPOptimizer,
    PrivacyEngine,
    clip_and_sum,
    create_accountant,
    get_noise_multiplier,
    split_batch,
)

DATA = TensorDataset(torch.randn(40, 3), torch.randint(0, 2, (40,)))


def make_private(**overrides):
    model = nn.Linear(3, 2)
    kwargs = dict(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        data_loader=DataLoader(DATA, batch_size=8),
        noise_multiplier=1.0,
        max_grad_norm=1.0,
    )
    kwargs.update(overrides)
    return PrivacyEngine(accountant=kwargs.pop("accountant", "rdp")).make_private(**kwargs)


def dp_optimizer(**overrides):
    kwargs = dict(noise_multiplier=1.0, max_grad_norm=1.0, expected_batch_size=8)
    kwargs.update(overrides)
    return DPOptimizer(torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1), **kwargs)


def step(**overrides):
    kwargs = dict(noise_multiplier=1.0, sample_rate=0.1)
    kwargs.update(overrides)
    create_accountant("rdp").step(**kwargs)


def search(**overrides):
    kwargs = dict(target_epsilon=1.0, target_delta=1e-5, sample_rate=0.01, steps=10)
    kwargs.update(overrides)
    return get_noise_multiplier(**kwargs)


CASES = {
    "noise_multiplier=-1.0": [
        lambda: make_private(noise_multiplier=-1.0),
        lambda: dp_optimizer(noise_multiplier=-1.0),
        lambda: step(noise_multiplier=-1.0),
    ],
    "max_grad_norm=0": [
        lambda: make_private(max_grad_norm=0),
        lambda: dp_optimizer(max_grad_norm=0),
        lambda: clip_and_sum([torch.ones(2, 2)], max_grad_norm=0),
    ],
    "max_grad_norm=-2.0": [lambda: clip_and_sum([torch.ones(2, 2)], max_grad_norm=-2.0)],
    "sample_rate=0": [lambda: step(sample_rate=0), lambda: search(sample_rate=0)],
    "sample_rate=1.5": [lambda: step(sample_rate=1.5), lambda: DPDataLoader(DATA, sample_rate=1.5)],
    "target_delta=1.0": [lambda: search(target_delta=1.0)],
    "target_epsilon=-1": [lambda: search(target_epsilon=-1)],
    "accountant='gdp'": [
        lambda: PrivacyEngine(accountant="gdp"),
        lambda: create_accountant("gdp"),
        lambda: search(accountant="gdp"),
    ],
    "clipping='adaptive'": [
        lambda: make_private(clipping="adaptive"),
        lambda: dp_optimizer(clipping="adaptive"),
        lambda: clip_and_sum([torch.ones(2, 2)], max_grad_norm=1.0, clipping="adaptive"),
    ],
    "K=0": [lambda: make_private(K=0)],
    "K=3": [lambda: list(split_batch(torch.zeros(8, 2), max_physical_batch_size=2, K=3))],
    "loss_reduction='max'": [lambda: dp_optimizer(loss_reduction="max"), lambda: make_private(loss_reduction="max")],
    "expected_batch_size=0": [lambda: dp_optimizer(expected_batch_size=0)],
    "num_steps=0": [lambda: step(num_steps=0)],
}


@pytest.mark.parametrize(
    "named, call",
    [(named, call) for named, calls in CASES.items() for call in calls],
    ids=[f"{named}-{i}" for named, calls in CASES.items() for i in range(len(calls))],
)
def test_bad_argument_names_itself_and_its_value(named, call):
    with pytest.raises(ValueError) as info:
        call()
    assert named in str(info.value)


def test_unknown_accountant_lists_the_registry():
    with pytest.raises(ValueError, match=re.escape("choose one of ['pld', 'prv', 'rdp']")):
        PrivacyEngine(accountant="gdp")


def test_k_not_dividing_the_batch_rows_in_the_model():
    model, _, _ = make_private(K=3, poisson_sampling=False)
    with pytest.raises(ValueError, match="K=3 does not divide"):
        model(torch.zeros(8, 3))


def test_delta_at_least_one_over_n_warns():
    model = nn.Linear(3, 2)
    engine = PrivacyEngine(accountant="rdp")
    engine.make_private(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        data_loader=DataLoader(DATA, batch_size=8),
        noise_multiplier=1.0,
        max_grad_norm=1.0,
    )
    with pytest.warns(UserWarning, match=r"delta=0.05 is >= 1/N = 1/40"):
        engine.get_epsilon(0.05)
    model = nn.Linear(3, 2)
    with pytest.warns(UserWarning, match="target_delta=0.1 is >= 1/N"):
        PrivacyEngine(accountant="rdp").make_private_with_epsilon(
            module=model,
            optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
            data_loader=DataLoader(DATA, batch_size=8),
            target_epsilon=5.0,
            target_delta=0.1,
            epochs=1,
            max_grad_norm=1.0,
        )


def test_k_mismatch_with_the_augmult_loader():
    loader = DataLoader(DATA, batch_size=8, collate_fn=AugmultCollate(lambda x: x, K=2))
    with pytest.raises(ValueError, match="K=4 but the data loader's AugmultCollate makes K=2"):
        make_private(K=4, data_loader=loader)


def test_optimizer_over_other_parameters():
    model, other = nn.Linear(3, 2), nn.Linear(3, 2)
    with pytest.raises(
        ValueError,
        match=r"optimizer holds 2 parameter\(s\) that are not the model's: param_groups\[0\]\['params'\]\[0\] \(shape \(2, 3\)\)",
    ):
        make_private(module=model, optimizer=torch.optim.SGD(other.parameters(), lr=0.1))


def test_secure_mode_refuses_seeded_generators():
    with pytest.raises(ValueError, match="noise_generator=.*secure_mode=True"):
        model = nn.Linear(3, 2)
        PrivacyEngine(secure_mode=True).make_private(
            module=model,
            optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
            data_loader=DataLoader(DATA, batch_size=8),
            noise_multiplier=1.0,
            max_grad_norm=1.0,
            noise_generator=torch.Generator(),
        )
    with pytest.raises(ValueError, match="generator=.*secure_mode=True"):
        dp_optimizer(generator=torch.Generator(), secure_mode=True)


def test_steps_or_epochs_exactly_one():
    with pytest.raises(ValueError, match="give exactly one"):
        search(steps=None)
