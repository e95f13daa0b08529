"""TorchNeuron's NKI entry points launch for real: nki_op (a custom op: eager, torch.compile without a graph break,
register_autograd) and wrap_nki(kernel)[grid] (eager, and a custom op under torch.compile that writes into its
tensor arguments); launches show in the profiler and in get_executed_ops()."""

from __future__ import annotations

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

import torch_neuronx
import torch_neuronx.nki as nki

nl = nki.language
nisa = nki.isa


def add_into(a, b, out, scale):  # type: ignore[no-untyped-def]  # TorchNeuron style: the caller makes `out`
    rows = a.shape[0] // nl.num_programs(0)
    r = nl.program_id(0) * rows
    t = nl.add(nl.load(a[r:r + rows, :]), nl.load(b[r:r + rows, :]))
    nl.store(out[r:r + rows, :], nl.multiply(t, scale))


@nki.jit
def add_kernel(a, b):  # type: ignore[no-untyped-def]
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    nl.store(out, nl.add(nl.load(a), nl.load(b)))
    return out


add_caller = torch_neuronx.wrap_nki(add_into)


@torch_neuronx.nki_op("nki_tools_test::add", mutates_args={})
def nki_add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    add_caller[(2,)](x, y, out, 1.0)
    return out


nki_add.register_autograd(lambda ctx, g: (g, 2 * g))  # deliberately not d(x+y)/dy: shows the registered one runs


def test_nki_op_launches_eagerly_with_shapes_on_meta() -> None:
    x, y = torch.randn(256, 8, device="neuron"), torch.randn(256, 8, device="neuron")
    assert torch.equal(nki_add(x, y).cpu(), (x + y).cpu())
    assert torch.ops.nki_tools_test.add.default is not None
    m = torch.randn(256, 8, device="meta")
    assert nki_add(m, m).shape == (256, 8)  # the fake implementation: the kernel runs shapes-only


def test_nki_op_compiles_to_one_node_and_backpropagates() -> None:
    x = torch.randn(256, 8, device="neuron", requires_grad=True)
    y = torch.randn(256, 8, device="neuron", requires_grad=True)
    nki_add(x, y).sum().backward()
    assert torch.equal(x.grad.cpu(), torch.ones(256, 8)) and torch.equal(y.grad.cpu(), 2 * torch.ones(256, 8))
    graphs = []

    def backend(gm, inputs):  # type: ignore[no-untyped-def]
        graphs.append(gm)
        return gm

    torch._dynamo.reset()
    out = torch.compile(lambda a, b: nki_add(a, b) * 2, backend=backend, fullgraph=True)(x.detach(), y.detach())
    assert torch.equal(out.cpu(), 2 * (x + y).detach().cpu())
    assert sum("nki_tools_test.add" in str(n.target) for n in graphs[0].graph.nodes) == 1
    torch._dynamo.reset()
    out = torch.compile(lambda a, b: nki_add(a, b) + 1, backend="neuron", fullgraph=True)(x.detach(), y.detach())
    assert torch.equal(out.cpu(), (x + y).detach().cpu() + 1)


def test_wrap_nki_launches_a_grid_eagerly_and_under_compile() -> None:
    x, y = torch.randn(256, 8, device="neuron"), torch.randn(256, 8, device="neuron")
    out = torch.empty_like(x)
    assert add_caller[2](x, y, out, 3.0) is None
    assert torch.allclose(out.cpu(), 3 * (x + y).cpu())
    assert nki.last_report().grid == (2,)

    def step(a, b):  # type: ignore[no-untyped-def]
        o = torch.empty_like(a)
        add_caller[2](a, b, o, 0.5)
        return o.relu()

    torch._dynamo.reset()
    got = torch.compile(step, backend="neuron", fullgraph=True)(x, y)
    assert torch.allclose(got.cpu(), (0.5 * (x + y)).relu().cpu())
    x, y = x[:128], y[:128]
    assert torch.equal(torch_neuronx.wrap_nki(add_kernel)(x, y).cpu(), (x + y).cpu())


def test_kernels_that_allocate_outputs_under_compile_are_pointed_to_nki_op() -> None:
    caller = torch_neuronx.wrap_nki(add_kernel)
    x = torch.randn(8, 8, device="neuron")
    torch._dynamo.reset()
    with pytest.raises(Exception, match="nki_op"):
        torch.compile(lambda a: caller(a, a), backend="neuron", fullgraph=True)(x)


def test_launches_show_in_profiler_and_executed_ops() -> None:
    x = torch.randn(128, 8, device="neuron")
    torch_neuronx.clear_op_tracking()
    add_kernel(x, x)
    assert "nki::add_kernel" in torch_neuronx.get_executed_ops()
    torch_neuronx.clear_op_tracking()
    assert "nki::add_kernel" not in torch_neuronx.get_executed_ops()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        add_kernel(x, x)
    assert any(e.name == "nki::add_kernel" for e in prof.events())


def test_bad_names_grids_and_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="qualified op name"):
        torch_neuronx.nki_op("add")
    with pytest.raises(ValueError, match="positive ints"):
        torch_neuronx.wrap_nki(add_into)[(0, 2)]
    with pytest.raises(TypeError, match="NKI kernel"):
        torch_neuronx.wrap_nki(42)  # type: ignore[arg-type]
    x = torch.randn(128, 8, device="neuron")
    with pytest.raises(nki.NkiValidationError, match="err-unsupported-dtype"):
        add_kernel(x.double(), x.double())


def test_provider_names_which_nki_an_import_gives(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from torch_neuronx.tools.nki import provider

    assert provider()["provider"] == "torch_neuronx" and provider()["location"].endswith("nki.py")
    (tmp_path / "nki").mkdir()
    (tmp_path / "nki" / "__init__.py").write_text("REAL = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert provider() == {"provider": "aws", "location": str(tmp_path / "nki")}
