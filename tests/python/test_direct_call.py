"""Inference graphs called without aot_autograd's runtime wrappers (direct_call.py): taken
only where the wrappers would do nothing, and every case where they do something (a mutated
input, an output aliasing an input, autocast, grad mode) still computes what eager does."""

import sys

import pytest
import torch

from helpers import plan
from models import MODELS

import fuseml


def _ran_aot_wrappers(fn, *args):
    """The frames of aot_autograd's runtime wrappers (runtime_wrappers.py, and the forward of
    aot_autograd.py that prepends lifted parameters) that a call of fn ran."""
    seen = []

    def probe(frame, event, arg):
        path = frame.f_code.co_filename.replace("\\", "/")
        if event == "call" and path.endswith(("/_aot_autograd/runtime_wrappers.py", "/_functorch/aot_autograd.py")):
            seen.append(frame.f_code.co_name)

    sys.setprofile(probe)
    try:
        fn(*args)
    finally:
        sys.setprofile(None)
    return seen


@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_mlp_inference_is_called_directly(served, mode):
    torch.manual_seed(0)
    model = MODELS["mlp"]()
    x = torch.randn(6, 32)
    c = fuseml.FuseMLCompiler(min_ops=1)
    compiled = torch.compile(model, backend=c, mode=mode)
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(compiled(x), model(x))
        graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
        assert not _ran_aot_wrappers(compiled, x)
        compiled(torch.randn(6, 32))
    p = plan(c, "inference")
    assert p.called == "directly", p.describe()
    assert p.kernels(), "the rewritten graph is what runs"
    assert "called directly" in p.describe()
    # dynamo never traced into the direct function: no graph was added by the calls
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == graphs


@pytest.mark.parametrize("how", ["option", "env"])
def test_turned_off_keeps_the_wrappers(served, monkeypatch, how):
    if how == "env":
        monkeypatch.setenv("FUSEML_DIRECT", "0")
    c = fuseml.FuseMLCompiler(direct=False if how == "option" else None)
    model = MODELS["mlp"]()
    x = torch.randn(6, 32)
    compiled = torch.compile(model, backend=c)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
        assert _ran_aot_wrappers(compiled, x)
    assert plan(c, "inference").called == "through aot_autograd (not asked for)"


def test_grad_on_without_grad_inputs(served):
    """An inference graph compiled with grad on (no input requires grad) runs with grad off,
    as aot_autograd runs it, and leaves grad on for the caller."""

    def f(x, w):
        return torch.nn.functional.gelu(x @ w) * 2.0 + 1.0

    x, w = torch.randn(8, 16), torch.randn(16, 4)
    c = fuseml.FuseMLCompiler()
    got = torch.compile(f, backend=c)(x, w)
    torch.testing.assert_close(got, f(x, w))
    assert torch.is_grad_enabled() and not got.requires_grad
    assert plan(c, "inference").called == "directly"


def test_mutated_input_keeps_the_wrappers(served):
    def f(x, y):
        x.add_(1.0)
        return torch.sigmoid(x * y) + y

    x, y = torch.randn(8, 8), torch.randn(8, 8)
    x0 = x.clone()
    c = fuseml.FuseMLCompiler()
    with torch.no_grad():
        got = torch.compile(f, backend=c)(x, y)
    torch.testing.assert_close(x, x0 + 1.0)  # the mutation reached the caller's x
    torch.testing.assert_close(got, torch.sigmoid((x0 + 1.0) * y) + y)
    assert plan(c, "inference").called == "through aot_autograd (an input is mutated)"


def test_output_aliasing_an_input_keeps_the_wrappers(served):
    def f(x, y):
        return x.view(-1), torch.tanh(x * y) - y

    x, y = torch.randn(8, 8), torch.randn(8, 8)
    c = fuseml.FuseMLCompiler()
    with torch.no_grad():
        view, got = torch.compile(f, backend=c)(x, y)
    assert view.data_ptr() == x.data_ptr() and view._base is x  # a view of x, as in eager
    torch.testing.assert_close(got, torch.tanh(x * y) - y)
    assert plan(c, "inference").called.startswith("through aot_autograd (an output aliases")


def test_autocast_keeps_the_wrappers(served):
    model = MODELS["mlp"]()
    x = torch.randn(6, 32)
    c = fuseml.FuseMLCompiler()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        want = model(x)
        got = torch.compile(model, backend=c)(x)
    assert got.dtype == want.dtype
    torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)
    assert plan(c, "inference").called == "through aot_autograd (autocast)"


def test_training_graphs_keep_the_wrappers(served):
    model = MODELS["mlp"]()
    x = torch.randn(6, 32, requires_grad=True)
    c = fuseml.FuseMLCompiler()
    torch.compile(model, backend=c)(x).sum().backward()
    assert x.grad is not None and all(p.grad is not None for p in model.parameters())
    assert [p.which for p in c.plans] == ["forward", "backward"]
    assert all(p.called is None for p in c.plans)


def test_explain_says_how_the_inference_graph_is_called(served):
    import io

    buf = io.StringIO()
    with torch.no_grad():
        fuseml.explain(MODELS["mlp"](), torch.randn(6, 32), file=buf)
    heads = [line for line in buf.getvalue().splitlines() if line.startswith("inference graph")]
    # explain() runs the model once: the graph's code is generated after that first call
    assert heads == [
        "inference graph: (called directly; runs as generated straight-line code " "(first call pending))"
    ], buf.getvalue()


def test_dynamic_shapes_keep_the_wrappers(served):
    """A graph compiled for a symbolic batch marks its outputs' dynamic dimensions at every
    call (aot_autograd's wrapper does, so that a later compiled region sees them dynamic):
    it keeps the wrappers, and computes what eager computes for every batch."""
    torch.manual_seed(0)
    model = MODELS["llama_mlp"]()
    c = fuseml.FuseMLCompiler(min_ops=1)
    compiled = torch.compile(model, backend=c, dynamic=True)
    with torch.no_grad():
        for batch in (3, 7, 11):
            x = torch.randn(batch, 4, 32)
            torch.testing.assert_close(compiled(x), model(x))
    p = plan(c, "inference")
    assert p.called == "through aot_autograd (outputs marked dynamic)", p.describe()
