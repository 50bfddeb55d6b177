"""Rows added at an index into a zeroed fp32 buffer as a scatter group (scatter_fragment.py,
vocabulary 8): the gradient of a gather of rows (scatter_add.py's index_add_to_zeros_fp32) and
a tied embedding's weight gradient (embedding_grad_fp32) are groups of one call each, spelled
as one index_add over the values in their own dtype; the gradients are eager's without a daemon
and through the group's ATen form; the runtime and the generated code hand the kernel a zeroed
output; what the fragment cannot spell stays the call; a real fusemld accepts the fragments."""

import types

import pytest
import torch

from helpers import plan, rel_err
from test_straight_line import _FakeGuard

import fuseml
from fuseml import embedding_grad, plan_view, runtime, scatter_add, straight_line
from fuseml.scatter_fragment import flat

aten = torch.ops.aten


def _gather_loss(x, idx, w):
    """Rows of x gathered (each twice: a top-2 router's dispatch), weighted and summed."""
    return (x[idx].float() * w).sum()


def _inputs(rows=16, row=(4, 2), dtype=torch.bfloat16):
    torch.manual_seed(0)
    x = torch.randn(rows, *row).to(dtype)
    idx = torch.randperm(rows).repeat(2)
    return x, idx, torch.randn(2 * rows, *row)


def _grad(fn, x, idx, w):
    xi = x.detach().clone().requires_grad_(True)
    return torch.autograd.grad(fn(xi, idx, w), xi)[0]


def scatter_groups(c, which="backward"):
    return [g for g in plan(c, which).groups if g.kind == "scatter"]


def test_a_gathers_gradient_is_a_scatter_group(dead_socket):
    """The exact wire: the bf16 values read as [M, D] (D the product of a row's dims), the
    int64 index as [M], one index_add, the fp32 sums as a row-major [R, D] viewed as x's
    [R, *row]; the values reach it in bf16 (no fp32 cast node before the call)."""
    x, idx, w = _inputs()
    c = fuseml.FuseMLCompiler()
    _grad(torch.compile(_gather_loss, backend=c), x, idx, w)
    (g,) = scatter_groups(c)
    assert g.route == "kernel" and g.op_names == ["index_add_to_zeros_fp32"], g.describe()
    assert g.describe() == f"group {g.gid} [scatter] index_add_to_zeros_fp32: kernel", g.describe()
    assert g.built.wire == {
        "vocab": 8,
        "inputs": [
            {"id": 0, "dtype": "bf16", "shape": [32, 8], "strides": [8, 1], "align": 16},
            {"id": 1, "dtype": "i64", "shape": [32], "strides": [1], "align": 16},
        ],
        "ops": [{"op": "index_add", "out": 2, "args": [0, 1]}],
        "outputs": [{"id": 2, "dtype": "f32", "shape": [16, 8], "strides": [8, 1], "align": 16}],
    }
    values, index = g.inputs
    assert values.meta["val"].dtype == torch.bfloat16 and index.meta["val"].dtype == torch.int64
    assert values.target is not aten._to_copy.default or values.kwargs["dtype"] != torch.float32
    assert g.built.zeroed and g.built.out_views == [[16, 4, 2]]
    (row,) = [r for r in plan_view.groups(c) if r["kind"] == "scatter"]
    assert row["ops"] == ["index_add_to_zeros_fp32"] and row["graph"] == "backward"


@pytest.mark.parametrize("row", [(8,), (4, 2), ()])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gradient_is_eagers_without_a_daemon_and_through_the_group(dead_socket, served, row, dtype):
    """With no daemon (the call in the graph) and with a 'served' kernel (the graph calls the
    group's runner, which on the CPU runs the group's ATen form: the call, its inputs handed in
    the wire's order), the gradient is eager's; rows of one dim, of two, and of none."""
    x, idx, w = _inputs(row=row, dtype=dtype)
    want = _grad(_gather_loss, x, idx, w)
    c = fuseml.FuseMLCompiler()
    got = _grad(torch.compile(_gather_loss, backend=c), x, idx, w)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert rel_err(got, want) < (1e-6 if dtype == torch.float32 else 1e-2)
    (g,) = scatter_groups(c)
    assert g.built.wire["outputs"][0]["shape"] == [16, max(1, int(torch.Size(row).numel()))]
    runners = [r for r in plan(c, "backward").compiled.runners.values() if r.group is g]
    assert runners and runners[0].kernel is not None  # the served path ran


def test_runtime_allocates_the_output_zeroed(dead_socket, served, monkeypatch):
    """The runner's launch (on the CPU, with a stand-in module that launches nothing) hands the
    kernel an output allocated zeroed, whatever the allocator gave."""
    x, idx, w = _inputs()
    c = fuseml.FuseMLCompiler()
    _grad(torch.compile(_gather_loss, backend=c), x, idx, w)
    (g,) = scatter_groups(c)
    (r,) = [r for r in plan(c, "backward").compiled.runners.values() if r.group is g]
    calls = []
    fake = types.SimpleNamespace(launch=lambda *a: calls.append(a), scratch=None)
    monkeypatch.setitem(runtime._modules, (r.kernel[0], 0), fake)
    monkeypatch.setattr(runtime, "_raw_stream", lambda index: 0x5A)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    values = torch.randn(32, 4, 2).to(torch.bfloat16)
    empty = torch.empty_strided
    with monkeypatch.context() as m:  # an allocator handing out poisoned memory
        m.setattr(torch, "empty_strided", lambda *a, **k: empty(*a, **k).fill_(float("nan")))
        (out,) = r._launch([values, idx], torch.device("cpu"), *r.kernel[:1], None, {})
    assert len(calls) == 1 and out.shape == (16, 4, 2) and out.dtype == torch.float32
    assert torch.equal(out, torch.zeros(16, 4, 2))


def test_generated_code_zeroes_the_output(dead_socket, served, monkeypatch):
    """Straight-line code allocates the group's output and zeroes it before the launch; other
    groups' outputs are not zeroed."""
    x, idx, w = _inputs()
    c = fuseml.FuseMLCompiler()
    _grad(torch.compile(_gather_loss, backend=c), x, idx, w)
    compiled = plan(c, "backward").compiled
    calls = []
    fake = types.SimpleNamespace(
        launch=None, launch_flat=lambda *a: calls.append(a), scratch=None, scratch_bytes=lambda outer: 0
    )
    for r in compiled.runners.values():
        if r.kernel is not None:
            r.use_kernel = True
            monkeypatch.setitem(runtime._modules, (r.kernel[0], 0), fake)
    monkeypatch.setattr(
        straight_line,
        "_empty_cuda",
        lambda s, st, dt: torch.full_like(torch.empty_strided(s, st, dtype=dt), float("nan")),
    )
    monkeypatch.setattr(straight_line, "_device_guard", _FakeGuard)
    monkeypatch.setattr(runtime, "_raw_stream", lambda index: 0x5A)
    fns, why = straight_line.generate(compiled.current, 0, compiled.slow, backward=True)
    assert fns is not None, why
    _, fast = fns
    zeroed = [line.strip() for line in fast.source.split("\n") if ".zero_()" in line]
    assert len(zeroed) == 1, fast.source
    name = zeroed[0].split(".")[0]
    lines = fast.source.split("\n")
    at = next(i for i, line in enumerate(lines) if line.strip().startswith(f"{name} = empty("))
    assert lines[at + 1].strip() == f"{name}.zero_()", fast.source
    assert "(16, 8), (8, 1)" in lines[at], lines[at]
    launches = [i for i, line in enumerate(lines) if "launch_" in line and f"{name}.data_ptr()" in line]
    assert launches and launches[0] > at + 1, fast.source


def _tied(ids, table, head):
    """An embedding whose table is also read as a weight (GPT-2's tied lm_head): its gradient
    is added to the head's, a fusible reader, so the graph keeps the fp32 sums."""
    return (torch.nn.functional.embedding(ids, table) @ (table * head).t()).float().sum()


def test_a_tied_embeddings_gradient_is_a_scatter_group(dead_socket):
    """embedding_grad_fp32 of [B, S] int64 ids: the ids read as [M], the gradient as [M, D]."""
    torch.manual_seed(0)
    ids = torch.randint(0, 10, (2, 3))
    table, head = torch.randn(10, 8).to(torch.bfloat16), torch.randn(10, 8).to(torch.bfloat16)
    c = fuseml.FuseMLCompiler()

    def loss(table, ids, head):
        return _tied(ids, table, head)

    got = _grad(torch.compile(loss, backend=c), table, ids, head)
    want = _grad(loss, table, ids, head)
    assert rel_err(got, want) < 1e-2
    (g,) = scatter_groups(c)
    assert g.op_names == ["embedding_grad_fp32"]
    wire = g.built.wire
    assert [(i["dtype"], i["shape"]) for i in wire["inputs"]] == [("bf16", [6, 8]), ("i64", [6])]
    assert wire["outputs"][0]["shape"] == [10, 8] and wire["outputs"][0]["strides"] == [8, 1]


def test_what_the_fragment_cannot_spell_stays_the_call():
    """An int32 index, a padding_idx, rows that are not one stride apart: no scatter group."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from fuseml.partition import find_groups

    v = torch.randn(5, 6).to(torch.bfloat16)
    i64, i32 = torch.tensor([0, 3, 3, 1, 0]), torch.tensor([0, 3, 3, 1, 0], dtype=torch.int32)

    def adds(i, v):
        return aten.index_put.default(v.new_zeros(4, 6), [i], v * 2, True)

    def embedding(i, v, pad):
        return aten.embedding_dense_backward.default(v * 2, i, 4, pad, False) + 1  # a fusible reader

    def kinds(f, *args):
        gm = make_fx(f, tracing_mode="fake")(*args)
        assert scatter_add.rewrite_index_put_adds(gm) + embedding_grad.rewrite_embedding_grads(gm) == 1
        return [g.kind for g in find_groups(gm)]

    assert "scatter" in kinds(adds, i64, v)
    assert "scatter" not in kinds(adds, i32, v)
    assert "scatter" in kinds(lambda i, v: embedding(i, v, -1), i64, v)
    assert "scatter" not in kinds(lambda i, v: embedding(i, v, 0), i64, v)
    # a transposed row is not one stride apart; a sliced index is, by its own stride
    assert flat([5, 2, 3], [6, 1, 2], 1) is None
    assert flat([5, 2, 3], [6, 3, 1], 1) == ([5, 6], [6, 1])
    assert flat([5], [2]) == ([5], [2]) and flat([5], [1], 1) == ([5, 1], [1, 1])


def test_route_signature_does_not_hold_an_address():
    """A group's ATen program holding a Python function (the call) keys its measured routing
    by the function's name: the same in every process."""
    from fuseml import routes

    steps = [(scatter_add.index_add_to_zeros_fp32, (("in", 1), ("in", 0), [16, 8]), {})]
    xs = routes.layouts([torch.randn(32, 8), torch.zeros(32, dtype=torch.long)])
    sig = routes.signature(b"cubin", steps, xs, ("GPU",))
    f = scatter_add.index_add_to_zeros_fp32
    elsewhere = types.FunctionType(f.__code__, f.__globals__, f.__name__)  # another address
    elsewhere.__qualname__ = f.__qualname__
    assert sig == routes.signature(b"cubin", [(elsewhere,) + steps[0][1:]], xs, ("GPU",))
    renamed = [(embedding_grad.embedding_grad_fp32,) + steps[0][1:]]
    assert sig != routes.signature(b"cubin", renamed, xs, ("GPU",))


def test_daemon_accepts_the_fragment(daemon):
    """A fusemld of vocabulary 8 answers the scatter fragment with a kernel (compile-only
    here: not yet tuned on a GPU)."""
    x, idx, w = _inputs()
    c = fuseml.FuseMLCompiler()
    got = _grad(torch.compile(_gather_loss, backend=c), x, idx, w)
    assert rel_err(got, _grad(_gather_loss, x, idx, w)) < 1e-2
    (g,) = scatter_groups(c)
    assert g.key and g.state in ("untuned", "tuned"), g.describe()
