"""Item 4: ``ModuleValidator`` (validate, is_valid, fix with num_groups / replace_bn_with_in, registration),
and item 2's ``PrivacyEngine.get_compatible_module``, run with both libraries."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.compat.conftest import LIBRARIES
from tests.compat.scripts import lib


def cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 48, 3),
        nn.BatchNorm2d(48),
        nn.ReLU(),
        nn.Conv2d(48, 8, 3),
        nn.BatchNorm2d(8),
        nn.Flatten(),
        nn.Linear(8 * 4 * 4, 3),
    )


def structure(model: nn.Module) -> list[tuple[str, int | None]]:
    return [(type(m).__name__, getattr(m, "num_groups", None)) for m in model.modules()]


@pytest.mark.parametrize("options", [{}, {"num_groups": 4}, {"replace_bn_with_in": True}])
def test_fix_gives_the_same_model(options: dict) -> None:
    x = torch.randn(2, 1, 8, 8)
    fixed = {name: lib(name, "validators").ModuleValidator.fix(cnn(), **options) for name in LIBRARIES}
    assert structure(fixed["dpnotebook"]) == structure(fixed["opacus"])
    torch.testing.assert_close(fixed["dpnotebook"](x), fixed["opacus"](x))
    for name in LIBRARIES:
        assert lib(name, "validators").ModuleValidator.is_valid(fixed[name]), name


def test_validate_finds_the_same_problems() -> None:
    for name in LIBRARIES:
        MV = lib(name, "validators").ModuleValidator
        errors = MV.validate(cnn(), strict=False)
        assert len(errors) == 2 and all(isinstance(e, ValueError) for e in errors), name
        assert len(MV.validate(cnn().eval())) == 3, name  # eval mode is flagged too
        errors_module = lib(name, "validators.errors")
        with pytest.raises(errors_module.UnsupportedModuleError):
            MV.validate(cnn(), strict=True)
        assert MV.is_valid(nn.Linear(2, 2)) and not MV.is_valid(cnn()), name


def test_grad_sample_module_refusal_is_a_not_implemented_error() -> None:
    for name in LIBRARIES:
        with pytest.raises(NotImplementedError):
            lib(name, "grad_sample").GradSampleModule(cnn())


class Doubler(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.full((1,), 2.0))

    def forward(self, x):
        return self.scale * x


def test_registered_validator_and_fixer() -> None:
    for name in LIBRARIES:
        validators = lib(name, "validators")

        @validators.register_module_validator(Doubler)
        def no_doubler(module: nn.Module, name: str = name) -> list:  # this library's errors, bound now
            return [lib(name, "validators.errors").ShouldReplaceModuleError("no Doubler")]

        @validators.register_module_fixer([Doubler])
        def halve(module: nn.Module, **kwargs) -> nn.Module:
            return nn.Identity()

        model = nn.Sequential(nn.Linear(2, 2), Doubler())
        assert not validators.ModuleValidator.is_valid(model), name
        fixed = validators.ModuleValidator.fix(model)
        assert isinstance(fixed[1], nn.Identity) and validators.ModuleValidator.is_valid(fixed), name


def test_get_compatible_module() -> None:
    x = torch.randn(2, 1, 8, 8)
    fixed = {name: lib(name).PrivacyEngine.get_compatible_module(cnn()) for name in LIBRARIES}
    assert structure(fixed["dpnotebook"]) == structure(fixed["opacus"])
    torch.testing.assert_close(fixed["dpnotebook"](x), fixed["opacus"](x))
    engine = lib("dpnotebook").PrivacyEngine()
    assert engine.is_compatible(module=fixed["dpnotebook"], optimizer=None, data_loader=None)
    with pytest.raises(NotImplementedError):
        engine.validate(module=cnn(), optimizer=None, data_loader=None)
