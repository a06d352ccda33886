"""The model zoo in every grad-sample mode: ``fix``, ``validate``, the float64 oracle, one private step.

Every zoo model (:data:`dpnotebook.benchmarks.zoo.ZOO`) in every mode of the
registry, K in {1, 2}, on B = 3 samples of T = 6 tokens or 3x12x12 images. At
K = 2, B*K = 6 = T: T5's ``[T, T]`` relative bias then has as many rows as the
batch, the case a shape check alone would take for per-sample rows.

The target (issue #30): hooks, functorch and ghost mode handle every zoo model
with no change to its code, and the layer-wise modes never fall back to
``torch.func``, over the whole model or over a layer. ExpandedWeights (``ew``) is PyTorch's: it
runs where PyTorch has a per-sample rule for every operation and refuses
otherwise, naming the mode to use.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dpnotebook
from dpnotebook import GradSampleError
from dpnotebook.benchmarks.zoo import HF_MODELS, ZOO, build, check_zoo_model, prepared, units_after_a_step
from dpnotebook.layers import DPMultiheadAttention

MODES = dpnotebook.available_modes()
TOL = 1e-10
#: The zoo models ExpandedWeights runs; it refuses the others (PyTorch has no per-sample rule for
#: ``mul``/``expand``, or a layer sees a table shared by the batch), naming the mode to use.
EW_RUNS = {"resnet"}
EW_REFUSAL = (
    r"grad_sample_mode=.*'functorch'"  # grad_sample_mode='functorch', or 'hooks' or 'ghost', ... or 'functorch'
)


def layer_wise(mode: str) -> bool:
    """Whether ``mode`` computes per-sample gradients layer by layer (its wrapper lists units that are not the model)."""
    wrapped = dpnotebook.wrap_model(nn.Sequential(nn.Linear(2, 2)), mode)
    units = getattr(wrapped, "units", None)
    wrapped.to_standard_module()
    return units is not None and ("model", "torch.func") not in units


LAYER_WISE = [m for m in MODES if layer_wise(m)]


def test_the_registry_has_layer_wise_modes() -> None:
    assert {"hooks", "ghost"} <= set(LAYER_WISE)
    assert "functorch" not in LAYER_WISE


def refused_by_ew(name: str, mode: str) -> bool:
    return mode == "ew" and name not in EW_RUNS


@pytest.mark.parametrize("K", [1, 2])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", list(ZOO))
def test_matches_the_float64_oracle(name: str, mode: str, K: int) -> None:
    if refused_by_ew(name, mode):
        with pytest.raises(GradSampleError, match=EW_REFUSAL):
            check_zoo_model(name, mode, K=K)
        return
    result = check_zoo_model(name, mode, K=K)
    assert result.max_rel_err <= TOL, (name, mode, K, result)


@pytest.mark.parametrize("mode", LAYER_WISE)
@pytest.mark.parametrize("name", list(ZOO))
def test_layer_wise_modes_have_no_torch_func_unit(name: str, mode: str) -> None:
    """Not the whole model, nor a layer: every zoo layer has a sampler (T5's and Llama's RMS norms, ConvNeXt's
    LayerNorm2d included), so no unit is replayed with ``torch.func``."""
    result = units_after_a_step(name, mode)
    assert not result.whole_model, (name, mode, result.units)
    assert result.fallback == [], (name, mode, result.fallback)


@pytest.mark.parametrize("mode", MODES)
def test_fix_changes_only_what_the_mode_cannot_handle(mode: str) -> None:
    resnet = prepared("resnet", mode)
    assert not any(isinstance(m, nn.BatchNorm2d) for m in resnet.modules())
    assert isinstance(resnet.layer1[0].bn1, nn.GroupNorm)
    vit = prepared("vit", mode)
    attention = vit.encoder.layers.encoder_layer_0.self_attention
    if mode in LAYER_WISE:
        assert isinstance(attention, DPMultiheadAttention)
    for name in HF_MODELS:  # the Hugging Face models run as they are
        before = [type(m) for m in build(name).model.modules()]
        assert [type(m) for m in prepared(name, mode).modules()] == before, name


def one_private_step(name: str, mode: str) -> tuple[dict[str, torch.Tensor], nn.Module, float]:
    model = prepared(name, mode, dtype=torch.float32)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    _, batch, loss_fn = build(name)
    inputs, targets = batch(8, seed=1)
    loader = DataLoader(TensorDataset(*inputs, targets), batch_size=4)
    engine = dpnotebook.PrivacyEngine(secure_mode=False)
    wrapped, opt, loader = engine.make_private(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        data_loader=loader,
        noise_multiplier=1.0,
        max_grad_norm=1.0,
        grad_sample_mode=mode,
        noise_generator=torch.Generator().manual_seed(0),
        sampling_generator=torch.Generator().manual_seed(1),
    )
    *x, y = next(b for b in loader if len(b[-1]))
    opt.zero_grad()
    loss_fn(wrapped(*x), y).backward()
    opt.step()
    return before, model, engine.accountant.get_epsilon(delta=1e-5)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", list(ZOO))
def test_one_private_step(name: str, mode: str) -> None:
    if refused_by_ew(name, mode):
        with pytest.raises(GradSampleError, match=EW_REFUSAL):
            one_private_step(name, mode)
        return
    before, model, eps = one_private_step(name, mode)
    for n, p in model.named_parameters():  # every parameter got its noise, nothing is NaN
        assert torch.isfinite(p).all() and not torch.equal(p, before[n]), n
    assert 0 < eps < math.inf
