"""Item 2: the ``PrivacyEngine`` surface an Opacus script uses: make_private_with_epsilon (sigma, epsilon),
noise and clipping schedulers saved in checkpoints, poisson_sampling=False, and the options refused by design."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.compat.conftest import LIBRARIES
from tests.compat.scripts import dataset, lib, loader, mlp


def train(model, optimizer, data, epochs: int = 1, scheduler=None) -> None:
    for _ in range(epochs):
        for x, y in data:
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
        if scheduler is not None:
            scheduler.step()


@pytest.mark.parametrize("accountant", ["rdp", "prv"])
def test_make_private_with_epsilon_sigma_and_epsilon_match(accountant: str) -> None:
    sigma, eps = {}, {}
    for name in LIBRARIES:
        model = mlp()
        engine = lib(name).PrivacyEngine(accountant=accountant)
        model, optimizer, data = engine.make_private_with_epsilon(
            module=model,
            optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
            data_loader=loader(dataset(), 8),
            target_epsilon=3.0,
            target_delta=1e-3,
            epochs=3,
            max_grad_norm=1.0,
        )
        train(model, optimizer, data, epochs=3)
        sigma[name], eps[name] = optimizer.noise_multiplier, engine.get_epsilon(1e-3)
    assert sigma["dpnotebook"] == pytest.approx(sigma["opacus"], rel=0.01)
    assert eps["dpnotebook"] == pytest.approx(eps["opacus"], rel=0.01)
    assert eps["dpnotebook"] <= 3.0 * 1.01


def scheduled_run(name: str, path) -> tuple[list[float], float, dict, dict]:
    model = mlp()
    engine = lib(name).PrivacyEngine(accountant="rdp")
    model, optimizer, data = engine.make_private(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        data_loader=loader(dataset()),
        noise_multiplier=2.0,
        max_grad_norm=1.0,
    )
    schedulers = lib(name, "schedulers")
    noise = schedulers.StepNoise(optimizer, step_size=1, gamma=0.7)
    clip = schedulers.ExponentialGradClip(optimizer, gamma=0.9)
    sigmas = []
    for _ in range(3):
        sigmas.append(optimizer.noise_multiplier)
        train(model, optimizer, data)
        noise.step()
        clip.step()
    engine.save_checkpoint(
        path=path,
        module=model,
        optimizer=optimizer,
        noise_scheduler=noise,
        grad_clip_scheduler=clip,
        checkpoint_dict={"epoch": 3},
    )
    fresh_model = mlp(seed=1)
    fresh_engine = lib(name).PrivacyEngine(accountant="rdp")
    fresh_model, fresh_opt, _ = fresh_engine.make_private(
        module=fresh_model,
        optimizer=torch.optim.SGD(fresh_model.parameters(), lr=0.1),
        data_loader=loader(dataset()),
        noise_multiplier=2.0,
        max_grad_norm=1.0,
    )
    fresh_noise = schedulers.StepNoise(fresh_opt, step_size=1, gamma=0.5)
    fresh_clip = schedulers.ExponentialGradClip(fresh_opt, gamma=0.5)
    extra = fresh_engine.load_checkpoint(
        path=path, module=fresh_model, optimizer=fresh_opt, noise_scheduler=fresh_noise, grad_clip_scheduler=fresh_clip
    )
    assert fresh_engine.get_epsilon(1e-5) == engine.get_epsilon(1e-5), name
    assert (fresh_noise.gamma, fresh_noise.last_epoch, fresh_clip.gamma) == (0.7, 3, 0.9), name
    assert extra["epoch"] == 3, name
    if name == "dpnotebook":  # it also saves the value the schedule reached, and restores it
        assert (fresh_opt.noise_multiplier, fresh_opt.max_grad_norm) == (noise.optimizer.noise_multiplier, 0.9**3)
    states = [{k: v for k, v in s.state_dict().items() if k != "knob_value"} for s in (noise, clip)]
    return sigmas, engine.get_epsilon(1e-5), *states


def test_schedulers_and_checkpoints_match_opacus(tmp_path) -> None:
    runs = {name: scheduled_run(name, tmp_path / f"{name}.pt") for name in LIBRARIES}
    (s_o, e_o, n_o, c_o), (s_d, e_d, n_d, c_d) = runs["opacus"], runs["dpnotebook"]
    assert s_d == pytest.approx(s_o) and s_d == pytest.approx([2.0, 1.4, 0.98])
    assert e_d == pytest.approx(e_o, rel=0.01)
    assert n_d == n_o and c_d == c_o


def test_poisson_sampling_false_keeps_the_loader() -> None:
    for name in LIBRARIES:
        model = mlp()
        original = loader(dataset())
        _, _, data = (
            lib(name)
            .PrivacyEngine()
            .make_private(
                module=model,
                optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                data_loader=original,
                noise_multiplier=1.0,
                max_grad_norm=1.0,
                poisson_sampling=False,
            )
        )
        assert [len(y) for _, y in data] == [16] * 4, name


@pytest.mark.parametrize("option", [{"wrap_model": False}, {"clipping": "adaptive"}, {"rand_on_empty": True}])
def test_options_refused_by_design(option: dict) -> None:
    model = mlp()
    with pytest.raises(NotImplementedError, match=f"{next(iter(option))}="):
        lib("dpnotebook").PrivacyEngine().make_private(
            module=model,
            optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
            data_loader=loader(dataset()),
            noise_multiplier=1.0,
            max_grad_norm=1.0,
            **option,
        )


def test_gdp_is_refused_and_unknown_options_named() -> None:
    assert lib("opacus").PrivacyEngine(accountant="gdp").accountant.mechanism() == "gdp"
    with pytest.raises(NotImplementedError, match="accountant='gdp'"):
        lib("dpnotebook").PrivacyEngine(accountant="gdp")
    model = mlp()
    with pytest.raises(TypeError, match="grad_sample_modes"):
        lib("dpnotebook").PrivacyEngine().make_private(
            module=model,
            optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
            data_loader=loader(dataset()),
            noise_multiplier=1.0,
            max_grad_norm=1.0,
            grad_sample_modes="hooks",
        )
