"""Item 7: the names Opacus code imports, at the same paths (``sed s/opacus/dpnotebook/`` on the import block),
and what they do compared with Opacus: ``make_functional``/``prepare_layer``, ``GRAD_SAMPLERS``,
``check_per_sample_gradients_are_correct``, the ``no_op`` mode with per-sample gradients computed by hand."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.func import grad, vmap

from tests.compat.conftest import LIBRARIES
from tests.compat.scripts import dataset, flat_params, lib, loader, mlp

IMPORTS = [
    ("", "PrivacyEngine"),
    ("privacy_engine", "PrivacyEngine"),
    ("accountants", "RDPAccountant"),
    ("accountants", "PRVAccountant"),
    ("accountants", "create_accountant"),
    ("accountants.utils", "get_noise_multiplier"),
    ("optimizers", "DPOptimizer"),
    ("optimizers", "DPPerLayerOptimizer"),
    ("optimizers", "DPOptimizerFastGradientClipping"),
    ("optimizers", "get_optimizer_class"),
    ("optimizers.optimizer", "DPOptimizer"),
    ("validators", "ModuleValidator"),
    ("validators", "register_module_validator"),
    ("validators", "register_module_fixer"),
    ("validators.errors", "UnsupportedModuleError"),
    ("validators.errors", "ShouldReplaceModuleError"),
    ("validators.module_validator", "ModuleValidator"),
    ("data_loader", "DPDataLoader"),
    ("layers", "DPLSTM"),
    ("layers", "DPGRU"),
    ("layers", "DPRNN"),
    ("layers", "DPMultiheadAttention"),
    ("grad_sample", "GradSampleModule"),
    ("grad_sample", "GradSampleModuleNoOp"),
    ("grad_sample", "register_grad_sampler"),
    ("grad_sample.utils", "wrap_model"),
    ("grad_sample.utils", "get_gsm_class"),
    ("grad_sample.utils", "register_grad_sampler"),
    ("accountants.analysis.rdp", "compute_rdp"),
    ("accountants.analysis.rdp", "get_privacy_spent"),
    ("grad_sample.functorch", "make_functional"),
    ("grad_sample.functorch", "prepare_layer"),
    ("grad_sample.functorch", "ft_compute_per_sample_gradient"),
    ("utils.batch_memory_manager", "BatchMemoryManager"),
    ("utils.per_sample_gradients_utils", "check_per_sample_gradients_are_correct"),
    ("utils.fast_gradient_clipping_utils", "DPLossFastGradientClipping"),
    ("utils.fast_gradient_clipping_utils", "DPTensorFastGradientClipping"),
    ("schedulers", "ExponentialNoise"),
    ("schedulers", "StepNoise"),
    ("schedulers", "LambdaNoise"),
    ("schedulers", "ExponentialGradClip"),
    ("schedulers", "StepGradClip"),
    ("schedulers", "LambdaGradClip"),
]


@pytest.mark.parametrize("path, name", IMPORTS, ids=[f"{p}.{n}".lstrip(".") for p, n in IMPORTS])
def test_the_import_resolves_in_both(path: str, name: str) -> None:
    for library in LIBRARIES:
        assert callable(getattr(lib(library, path), name)), library


def test_make_functional_and_prepare_layer_match_opacus() -> None:
    torch.manual_seed(0)
    layer, x, backprops = nn.Linear(4, 3), torch.randn(5, 4), torch.randn(5, 3)
    results = {}
    for library in LIBRARIES:
        functorch = lib(library, "grad_sample.functorch")
        fmodel, params = functorch.make_functional(layer)
        fresh = nn.Linear(4, 3)
        functorch.prepare_layer(fresh)
        results[library] = (fmodel(params, x), fresh.ft_compute_sample_grad(params, x, backprops))
    torch.testing.assert_close(results["dpnotebook"][0], results["opacus"][0])
    for ours, theirs in zip(results["dpnotebook"][1], results["opacus"][1], strict=True):
        assert ours.shape == theirs.shape
        torch.testing.assert_close(ours, theirs)


def test_grad_samplers_dict() -> None:
    for library in LIBRARIES:
        samplers = lib(library, "grad_sample").GradSampleModule.GRAD_SAMPLERS
        assert {nn.Linear, nn.Conv2d, nn.Embedding, nn.LayerNorm, nn.GroupNorm} <= set(samplers), library


@pytest.mark.parametrize("mode", ["hooks", "functorch", "ew"])
def test_check_per_sample_gradients_are_correct(mode: str) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv1d(3, 4, 2), nn.Tanh(), nn.Flatten(), nn.Linear(4 * 5, 2))
    x = torch.randn(6, 3, 6)
    for library in LIBRARIES:
        check = lib(library, "utils.per_sample_gradients_utils").check_per_sample_gradients_are_correct
        assert check(x, model, grad_sample_mode=mode), library


def no_op_script(library: str) -> tuple[nn.Module, list[torch.Size]]:
    """Opacus' cifar10 example in no_op mode: per-sample gradients by vmap, set on the parameters by hand."""
    torch.manual_seed(0)
    model = mlp()
    functorch = lib(library, "grad_sample.functorch")
    engine = lib(library).PrivacyEngine()
    model, optimizer, train_loader = engine.make_private(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.5),
        data_loader=loader(dataset()),
        noise_multiplier=0.0,
        max_grad_norm=0.2,
        grad_sample_mode="no_op",
        poisson_sampling=False,
    )
    fmodel, _ = functorch.make_functional(model._module)

    def loss_of(params, x, y):
        return nn.functional.cross_entropy(fmodel(params, x.unsqueeze(0)), y.unsqueeze(0))

    per_sample = vmap(grad(loss_of), in_dims=(None, 0, 0))
    shapes = []
    for x, y in train_loader:
        optimizer.zero_grad()
        params = tuple(model._module.parameters())
        for p, g in zip(params, per_sample(params, x, y), strict=True):
            p.grad_sample = g.detach()
        shapes.append(params[0].grad_sample.shape)
        optimizer.step()
    return model._module, shapes


def test_no_op_mode_matches_opacus() -> None:
    (m_o, s_o), (m_d, s_d) = no_op_script("opacus"), no_op_script("dpnotebook")
    assert s_d == s_o == [torch.Size([16, 8, 5])] * 4
    torch.testing.assert_close(flat_params(m_d), flat_params(m_o))


ORDERS = [1.5, 2.0, 3.0, 4.0, 8.0, 16.0, 32.0, 64.0]


@pytest.mark.parametrize("q,sigma,steps", [(0.01, 1.1, 1000), (256 / 60000, 1.1, 14062), (1.0, 2.0, 10)])
def test_rdp_analysis_gives_opacus_epsilon(q: float, sigma: float, steps: int) -> None:
    spent = {}
    for name in LIBRARIES:
        rdp_module = lib(name, "accountants.analysis.rdp")
        rdp = rdp_module.compute_rdp(q=q, noise_multiplier=sigma, steps=steps, orders=ORDERS)
        spent[name] = rdp_module.get_privacy_spent(orders=ORDERS, rdp=rdp, delta=1e-5)
    assert spent["dpnotebook"][0] == pytest.approx(float(spent["opacus"][0]), rel=1e-6)
    assert spent["dpnotebook"][1] == float(spent["opacus"][1])


@pytest.mark.parametrize("mode", ["hooks", "functorch", "ew", "ghost"])
def test_wrap_model_by_opacus_name_gives_the_same_grad_sample_shapes(mode: str) -> None:
    shapes = {}
    for name in LIBRARIES:
        utils = lib(name, "grad_sample.utils")
        model = utils.wrap_model(mlp(), grad_sample_mode=mode, batch_first=True, loss_reduction="sum")
        assert isinstance(model, utils.get_gsm_class(mode))
        x, y = next(iter(loader(dataset())))
        nn.functional.cross_entropy(model(x), y, reduction="sum").backward()
        shapes[name] = [
            tuple(p.grad_sample.shape) for p in model.parameters() if getattr(p, "grad_sample", None) is not None
        ]
    if mode != "ghost":  # ghost mode forms norms, not p.grad_sample, in both libraries
        assert shapes["dpnotebook"] == shapes["opacus"] and shapes["dpnotebook"]


@pytest.mark.parametrize("clipping, mode", [("flat", "hooks"), ("per_layer", "hooks"), ("flat", "ghost")])
def test_get_optimizer_class_distributed_gives_the_all_reducing_optimizer(clipping: str, mode: str) -> None:
    """Opacus gives its distributed optimizers; before, dpnotebook raised TypeError for flat and per-layer."""
    from dpnotebook.optimizers import get_optimizer_class
    from dpnotebook.privacy import DistributedDPOptimizer, DistributedGhostDPOptimizer

    expected = DistributedGhostDPOptimizer if mode == "ghost" else DistributedDPOptimizer
    assert get_optimizer_class(clipping, True, mode) is expected
    assert callable(lib("opacus", "optimizers").get_optimizer_class(clipping, True, mode))


def test_get_optimizer_class_adaptive_is_refused_distributed_too() -> None:
    from dpnotebook.errors import UnsupportedOptionError
    from dpnotebook.optimizers import get_optimizer_class

    with pytest.raises(UnsupportedOptionError, match="clipping='adaptive'"):
        get_optimizer_class("adaptive", True, "hooks")(torch.optim.SGD(mlp().parameters(), lr=0.1))
