"""``dpnotebook.default_device``: the GPU when present, the CPU otherwise, and one line saying which."""

import pytest
import torch

import dpnotebook
from dpnotebook.device import check_device


def test_cpu_when_no_gpu(monkeypatch, capsys) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert dpnotebook.default_device() == torch.device("cpu")
    assert capsys.readouterr().out == "device: cpu (no CUDA GPU found)\n"


def test_cuda_when_present(monkeypatch, capsys) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Test GPU")
    assert dpnotebook.default_device() == torch.device("cuda")
    assert capsys.readouterr().out == "device: cuda (Test GPU)\n"


def test_announce_false_prints_nothing(monkeypatch, capsys) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert dpnotebook.default_device(announce=False).type == "cpu"
    assert capsys.readouterr().out == ""


def test_check_device_accepts_devices_and_names() -> None:
    assert check_device("cpu") == torch.device("cpu") == check_device(torch.device("cpu"))


@pytest.mark.parametrize(
    "bad, error, message",
    [
        ("gpu", ValueError, r"device='gpu' is not a device: pass a torch.device or its name.*default_device\(\)"),
        (
            "meta",
            ValueError,
            r"device='meta': dpnotebook trains on 'cpu' or 'cuda'. Fix: pass dpnotebook.default_device",
        ),
        (3, TypeError, r"device=3 is a int: pass a torch.device or its name"),
        (True, TypeError, r"device=True is a bool"),
    ],
)
def test_check_device_refuses_what_is_not_a_device(bad, error, message) -> None:
    with pytest.raises(error, match=message):
        check_device(bad)


def test_check_device_refuses_a_gpu_pytorch_does_not_see(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert check_device("cuda:0") == torch.device("cuda:0")
    with pytest.raises(
        ValueError, match=r"device='cuda:1', but PyTorch sees 1 CUDA GPU\(s\) here. Fix: pass dpnotebook"
    ):
        check_device("cuda:1", name="device")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match=r"target='cuda', but PyTorch sees 0 CUDA GPU"):
        check_device("cuda", name="target")
