"""prepare_fine_tuning: what is trained, what is frozen, what is kept from the pretrained model."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dpnotebook.datasets import split_by_classes
from dpnotebook.fine_tuning import FINE_TUNING, prepare_fine_tuning, trained_parameters
from dpnotebook.layers.lora import LoRALinear
from dpnotebook.models import MLP


@pytest.fixture
def pretrained() -> nn.Module:
    torch.manual_seed(0)
    model = MLP(in_features=8, hidden=6, num_classes=4)
    with torch.no_grad():  # "pretrained": away from any fresh initialisation
        for p in model.parameters():
            p.add_(0.5)
    return model


def trainable(model: nn.Module) -> list[str]:
    return [n for n, p in model.named_parameters() if p.requires_grad]


def test_each_way(pretrained: nn.Module) -> None:
    state = {k: v.clone() for k, v in pretrained.state_dict().items()}
    models = {how: prepare_fine_tuning(pretrained, how, num_classes=3, rank=2) for how in FINE_TUNING}
    assert all(torch.equal(v, pretrained.state_dict()[k]) for k, v in state.items()), "pretrained changed"
    assert all(p.requires_grad for p in pretrained.parameters())
    assert trainable(models["last"]) == ["net.3.weight", "net.3.bias"]
    assert trainable(models["lora"]) == ["net.1.lora_A", "net.1.lora_B", "net.3.weight", "net.3.bias"]
    assert (
        trainable(models["all"])
        == trainable(models["scratch"])
        == [n for n, _ in pretrained.named_parameters()][:2] + ["net.3.weight", "net.3.bias"]
    )
    assert isinstance(models["lora"].net[1], LoRALinear)
    assert torch.equal(models["all"].net[1].weight, pretrained.net[1].weight)
    assert not torch.equal(models["scratch"].net[1].weight, pretrained.net[1].weight)
    x = torch.randn(5, 8)
    body = pretrained.net[:3]
    assert torch.allclose(models["lora"].net[:3](x), body(x))  # B = 0: the adapter starts as the identity change
    assert torch.equal(models["last"].net[3].weight, models["all"].net[3].weight)  # same seed, same new head
    assert models["last"](x).shape == (5, 3)
    assert trained_parameters(models["last"]) == 6 * 3 + 3


def test_bad_input(pretrained: nn.Module) -> None:
    with pytest.raises(ValueError, match="how='head'"):
        prepare_fine_tuning(pretrained, "head", num_classes=2)
    with pytest.raises(ValueError, match="no nn.Linear"):
        prepare_fine_tuning(nn.Sequential(nn.Tanh()), "last", num_classes=2)


def test_split_by_classes() -> None:
    from torch.utils.data import TensorDataset

    data = TensorDataset(torch.arange(8.0), torch.tensor([5, 0, 7, 2, 5, 9, 0, 2]))
    public, private = split_by_classes(data, [0, 2])
    assert public.tensors[1].tolist() == [0, 1, 0, 1] and public.tensors[0].tolist() == [1.0, 3.0, 6.0, 7.0]
    assert private.tensors[1].tolist() == [0, 1, 0, 2]
    with pytest.raises(ValueError, match="classes=\\[3\\]"):
        split_by_classes(data, [3])
