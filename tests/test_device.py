"""``dpnotebook.default_device``: the GPU when present, the CPU otherwise, and one line saying which."""

import torch

import dpnotebook


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
