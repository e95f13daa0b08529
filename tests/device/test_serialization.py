"""torch.save / torch.load of neuron tensors and modules, with map_location both ways."""

from __future__ import annotations

from pathlib import Path

import torch


def test_save_neuron_load_cpu_and_back(tmp_path: Path) -> None:
    model = torch.nn.Linear(4, 3).neuron()
    path = tmp_path / "ckpt.pt"
    torch.save({"model": model.state_dict(), "t": torch.arange(5, device="neuron:1")}, path)
    on_cpu = torch.load(path, map_location="cpu")
    assert on_cpu["model"]["weight"].device.type == "cpu"
    assert torch.equal(on_cpu["model"]["weight"], model.weight.detach().cpu())
    native = torch.load(path)
    assert native["t"].device == torch.device("neuron:1")
    assert torch.equal(native["t"].cpu(), torch.arange(5))
    moved = torch.load(path, map_location="neuron:2")
    assert moved["model"]["bias"].device == torch.device("neuron:2")


def test_save_cpu_load_to_neuron(tmp_path: Path) -> None:
    ref = torch.nn.Linear(4, 3)
    path = tmp_path / "cpu.pt"
    torch.save(ref.state_dict(), path)
    sd = torch.load(path, map_location="neuron")
    assert sd["weight"].device.type == "neuron"
    m = torch.nn.Linear(4, 3).neuron()
    m.load_state_dict(sd)
    x = torch.randn(2, 4)
    torch.testing.assert_close(m(x.neuron()).cpu(), ref(x))


def test_views_keep_sharing_after_round_trip(tmp_path: Path) -> None:
    base = torch.arange(6.0, device="neuron")
    path = tmp_path / "views.pt"
    torch.save([base, base[2:]], path)
    a, b = torch.load(path)
    a[2] = 100
    assert b[0].item() == 100
