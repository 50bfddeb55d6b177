"""Generated straight-line code (fuseml/straight_line.py) on the CPU: what it computes, when it
is made, when it steps aside. The kernel launches it writes need a GPU:
tests/python/device_straight.py checks those on the device machine."""

import gc
import weakref

import pytest
import torch
from functorch.compile import make_boxed_func
from torch._functorch.aot_autograd import aot_function

import fuseml
from fuseml import straight_line


def _graph_of(f, *args, dynamic=False):
    """The ATen inference graph aot_autograd makes of f, and its output on args."""
    got = {}

    def compiler(gm, example_inputs):
        got["gm"] = gm
        return make_boxed_func(gm)

    with torch.no_grad():
        aot_function(f, fw_compiler=compiler, dynamic=dynamic)(*args)
    return got["gm"]


def _views_and_ops(x, w, b):
    y = x.view(4, 8, 16).permute(0, 2, 1)
    z = torch.mm(x, w.t()) + b
    return y.sum(1), z.relu(), x[1:3]


def _inputs():
    torch.manual_seed(0)
    return [torch.randn(32, 16), torch.randn(8, 16), torch.randn(8)]


def _generated(gm, args):
    """The generated (first, fast) functions of gm, each checked to give gm's values on args
    in gm's layouts."""
    first, fast = straight_line.generate(gm, None, lambda a: gm(*a))[0]
    want = gm(*args)
    for fn in (first, fast):
        got = fn(list(args))
        assert len(got) == len(want)
        for a, b in zip(got, want):
            assert torch.equal(a, b) and a.stride() == b.stride()
    return first, fast


def test_generated_code_computes_what_the_graph_does():
    args = _inputs()
    gm = _graph_of(_views_and_ops, *args)
    first, fast = _generated(gm, args)
    # views are reinterpreted, not dispatched: no aten.view/permute/t/slice call is left
    assert "reinterpret(" in fast.source
    # a library call goes through torch's binding, not the OpOverload's schema parsing
    assert torch.mm in fast.__globals__.values() or torch.addmm in fast.__globals__.values()
    for op in ("view", "permute", "slice"):
        assert f"aten.{op}" not in fast.source


def _per_channel(x, w, b):
    """Batch norm's parameters as a channels-last reader takes them: views of views."""
    scale = w.unsqueeze(-1).unsqueeze(-1).unsqueeze(0).permute(0, 2, 3, 1)
    shift = b.unsqueeze(-1).unsqueeze(-1)
    return x * scale + shift.unsqueeze(0).permute(0, 2, 3, 1), shift.exp()


def test_a_chain_of_views_of_an_input_is_made_once():
    """Views that only views read are never made: the last view of a chain is made from its
    root directly (one reinterpret where there were four). A view something else reads
    (shift, read by exp) is made, from the input directly too, and the views of it from it.
    Each input is deleted after the last view made from it."""
    torch.manual_seed(0)
    args = [torch.randn(2, 5, 6, 8), torch.randn(8), torch.randn(8)]
    gm = _graph_of(_per_channel, *args)
    first, fast = _generated(gm, args)
    views = sum(n.target in (torch.ops.aten.unsqueeze.default, torch.ops.aten.permute.default) for n in gm.graph.nodes)
    assert views == 8
    assert fast.source.count("reinterpret(") == 3, fast.source  # scale; shift; its unsqueeze and permute
    assert "del v1" in fast.source and "del v2" in fast.source


def _qkv(x, w):
    """GPT-2's attention input: one projection split in three, each read as heads."""
    q, k, v = torch.mm(x, w).split(16, dim=1)
    return q.relu(), k.view(4, 2, 8).transpose(0, 1).sum(0), v.exp(), torch.mm(x, w).unbind(1)[3].neg()


def test_a_split_is_made_by_reinterpreting_its_operand():
    """split and unbind give views of their operand: each part read is a reinterpretation of
    it (no split call, nothing for the split itself to delete), with the values of the graph."""
    torch.manual_seed(0)
    args = [torch.randn(4, 16), torch.randn(16, 48)]
    gm = _graph_of(_qkv, *args)
    first, fast = _generated(gm, args)
    assert "split" not in fast.source and "unbind" not in fast.source, fast.source
    assert fast.source.count("reinterpret(") >= 4, fast.source


def test_the_argument_list_is_cleared_and_values_freed_after_their_last_use():
    torch.manual_seed(0)

    def f(x, w):
        return torch.mm(x.relu(), w)  # x is dead after relu

    x, w = torch.randn(16, 16), torch.randn(16, 4)
    gm = _graph_of(f, x, w)
    first, fast = straight_line.generate(gm, None, lambda a: gm(*a))[0]
    args = [x, w]
    first(args)
    assert args == []  # the first call clears them too: it has no view's layout to check
    args = [x, w]
    dead = weakref.ref(x)
    del x
    args_fast = args
    del args
    out = fast(args_fast)
    assert args_fast == []
    gc.collect()
    assert dead() is None  # freed when relu had read it, not at return
    assert out[0].shape == (16, 4)
    assert "del v0" in fast.source


def test_inputs_of_another_layout_run_the_graph():
    args = _inputs()
    gm = _graph_of(_views_and_ops, *args)
    calls = []

    def slow(a):
        calls.append(len(a))
        return gm(*a)

    _, fast = straight_line.generate(gm, None, slow)[0]
    transposed = torch.randn(16, 32).t()  # same size, other strides
    out = fast([transposed] + args[1:])
    assert calls == [3]  # the graph ran, with every argument
    for a, b in zip(out, gm(transposed, *args[1:])):
        assert torch.equal(a, b)


def test_dynamic_shapes_keep_the_graph():
    gm = _graph_of(lambda x: (x * 2).relu(), torch.randn(8, 4), dynamic=True)
    fns, why = straight_line.generate(gm, None, lambda a: gm(*a))
    assert fns is None and "symbolic" in why


def test_an_aten_result_whose_layout_is_not_its_trace_is_caught_on_the_first_call():
    """A view of an ATen result is reinterpreted from its traced layout: the first call
    checks that layout. A trace that lies (here, the meta of `add` says transposed) has the
    first call copy that result to the traced layout, so it reads the right elements all the
    same, and say so (first.missed: its graph then keeps its FX form); the call still frees
    its arguments as it goes."""

    # the meta of `add` says transposed; its transpose, as a trace would have it then, row-major
    f, x, gm = _lying_trace(((8, 4), (1, 8)), ((4, 8), (8, 1)))
    first, fast = straight_line.generate(gm, None, lambda a: gm(*a))[0]
    assert "conform(" in first.source and "conform(" not in fast.source
    args = [x]
    (out,) = first(args)
    assert args == [] and not first.keeps_args
    assert torch.equal(out, f(x))
    assert len(first.missed) == 1 and "traced (8, 4) (1, 8)" in first.missed[0]


def _lying_trace(add_val, transpose_val):
    """(f, x, graph of f) for f(x) = (x + 1).t().contiguous() * 2, its `add` and the transpose
    of it traced as the (shape, stride) pairs given: a trace that lies about an ATen result."""

    def f(x):
        return (x + 1).t().contiguous() * 2

    x = torch.randn(8, 4)
    gm = _graph_of(f, x)
    add = next(n for n in gm.graph.nodes if n.target == torch.ops.aten.add.Tensor)
    add.meta["val"] = torch.empty_strided(*add_val, device="meta")
    (t,) = add.users
    t.meta["val"] = torch.empty_strided(*transpose_val, device="meta")
    return f, x, gm


def test_an_aten_result_of_another_shape_than_traced_is_a_clear_error():
    """A static trace fixes every result's shape: one that differs is fuseml's bug, which the
    first call reports by name rather than copying or reading wrong elements."""

    f, x, gm = _lying_trace(((4, 8), (1, 4)), ((8, 4), (4, 1)))
    first, _ = straight_line.generate(gm, None, lambda a: gm(*a))[0]
    with pytest.raises(RuntimeError, match="shape differs from its trace: v1 .*traced \\(4, 8\\)"):
        first([x])


@pytest.mark.parametrize("returned, backward", [(False, False), (True, False), (True, True)])
def test_a_checked_view_is_copied_unless_it_leaves_the_graph(returned, backward):
    """A view op's result (a dtype view, which ATen makes) read through a view is checked on
    the first call. Read only inside the graph, it may be copied to its traced layout like a
    fresh result, so the first call frees its arguments; returned (as a view of it), a copy
    would not alias the input as aot_autograd expects, so the first call keeps its arguments
    and steps aside on a miss. A backward's outputs are gradients, which need alias nothing:
    there it is copied all the same."""

    def f(x):
        shown = x.view(torch.int32).view(-1)
        return (shown if returned else shown + 1), x * 2

    x = torch.randn(8, 4)
    gm = _graph_of(f, x)
    first, fast = straight_line.generate(gm, None, lambda a: gm(*a), backward=backward)[0]
    keeps = returned and not backward  # whether the first call must keep its arguments
    assert first.keeps_args == keeps
    assert ("conform(" in first.source) == (not keeps) and ("check(v1" in first.source) == keeps
    args = [x]
    got = first(args)
    assert (args == [x]) == keeps
    for a, b in zip(got, f(x)):
        assert torch.equal(a, b)


def test_a_compiled_graph_says_how_it_runs(dead_socket, monkeypatch):
    """Through torch.compile: the first call runs the FX graph (groups are routed there),
    the second the generated code's checked variant, the third on the verified one; with
    FUSEML_STRAIGHT_LINE=0 the FX graph stays."""
    monkeypatch.setenv("FUSEML_REQUEST_CPU_GRAPHS", "1")
    f = lambda x: torch.relu(x.view(4, 8) * 2.0 + 1.0).t()  # noqa: E731
    x = torch.randn(32)
    for setting, want in (("1", "generated straight-line code"), ("0", "FX graph (FUSEML_STRAIGHT_LINE=0)")):
        monkeypatch.setenv("FUSEML_STRAIGHT_LINE", setting)
        torch._dynamo.reset()
        c = fuseml.FuseMLCompiler()
        fn = torch.compile(f, backend=c)
        with torch.no_grad():
            outs = [fn(x) for _ in range(3)]
        (plan,) = c.plans
        assert plan.compiled.path == want
        assert f"runs as {want}" in plan.describe()
        for out in outs:
            assert torch.equal(out, f(x))


def _three_calls(fn, *args):
    return [fn(*args) for _ in range(3)]


@pytest.mark.parametrize("case", ["graph_break", "autocast", "input_mutation", "aliased_output", "dynamic"])
def test_what_the_fast_path_cannot_assume_stays_right(case, dead_socket, monkeypatch):
    """Graph breaks (two graphs, each generated), autocast, a mutated input, an output that
    aliases an input, dynamic shapes (the FX graph, said why): three calls each give eager's
    results, and each graph says how it runs."""
    monkeypatch.setenv("FUSEML_REQUEST_CPU_GRAPHS", "1")
    torch._dynamo.reset()
    torch.manual_seed(0)
    c = fuseml.FuseMLCompiler()
    w = torch.randn(16, 16)

    def graph_break(x):
        y = torch.relu(x * 2.0 + 1.0)
        torch._dynamo.graph_break()
        return (y.t() * 3.0).sum(0)

    def autocast(x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return torch.relu(torch.mm(x, w) + 1.0)

    def input_mutation(x):
        x.mul_(2.0)
        return torch.relu(x.view(4, 64).t() + 1.0)

    def aliased_output(x):
        return x.view(16, 16), torch.relu(x * 2.0)

    def dynamic(x):
        return torch.relu(x * 2.0 + 1.0).sum(-1)

    f = locals()[case]
    fn = torch.compile(f, backend=c, dynamic=case == "dynamic")
    sizes = [(256,), (256,), (256,)] if case != "dynamic" else [(8, 16), (9, 16), (12, 16)]
    if case == "autocast":
        sizes = [(16, 16)] * 3
    for size in sizes:
        x = torch.randn(*size)
        x_eager, x_comp = x.clone(), x.clone()
        want = f(x_eager)
        got = fn(x_comp)
        for a, b in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
            torch.testing.assert_close(a, b)
        torch.testing.assert_close(x_comp, x_eager)  # the mutation is applied, once
        if case == "aliased_output":
            assert got[0].data_ptr() == x_comp.data_ptr()  # still a view of the input
    ways = [p.compiled.path for p in c.plans]
    if case == "graph_break":
        assert len(ways) == 2
    if case == "dynamic":
        assert ways and all("dynamic shapes" in w_ for w_ in ways), ways
    else:
        assert ways and all(w_ == "generated straight-line code" for w_ in ways), ways


def test_upgraded_kernels_get_their_code_written_again(dead_socket, monkeypatch):
    """An upgrade (the daemon's tuned kernels swapped in) makes the generated code stale: the
    next call runs the FX graph, and the code is written again after it."""
    monkeypatch.setenv("FUSEML_REQUEST_CPU_GRAPHS", "1")
    torch._dynamo.reset()
    f = lambda x: torch.relu(x * 2.0 + 1.0).t()  # noqa: E731
    x = torch.randn(8, 4)
    c = fuseml.FuseMLCompiler()
    fn = torch.compile(f, backend=c)
    with torch.no_grad():
        for _ in range(3):
            fn(x)
        (plan,) = c.plans
        assert plan.compiled.path == "generated straight-line code"
        plan.compiled.rewrite_code()
        assert plan.compiled.path.startswith("FX graph (kernels upgraded")
        outs = [fn(x) for _ in range(3)]
    assert plan.compiled.path == "generated straight-line code"
    for out in outs:
        assert torch.equal(out, f(x))


class _FakeGuard:
    def __init__(self, index):
        self.index = index

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _compiled_with_kernels(f, *args):
    """f compiled through the daemon and checked against eager on args: (its compiled graph,
    the runners the daemon served a kernel)."""
    c = fuseml.FuseMLCompiler()
    torch.testing.assert_close(torch.compile(f, backend=c)(*args), f(*args))
    (plan,) = c.plans
    return plan.compiled, [r for r in plan.compiled.runners.values() if r.kernel is not None]


def test_kernels_share_one_scratch_buffer_a_call(daemon, monkeypatch):
    """Kernels that need scratch (a split column reduction, a cuBLASLt plan's split epilogue)
    get one buffer a call, the largest any needs, allocated once before the first launch and
    alive until the call returns; a need above SHARED_SCRATCH_BYTES keeps a buffer of its own."""
    import types

    from fuseml import runtime

    torch.manual_seed(0)

    def f(x, w):
        y = torch.relu(x * w + 1.0)
        return torch.tanh(torch.cumsum(y, 0) * 2.0 + 1.0)  # cumsum: no kernel, so two groups

    x, w = torch.randn(9, 64), torch.randn(64)
    compiled, runners = _compiled_with_kernels(f, x, w)
    assert len(runners) == 2, compiled.runners
    calls, sizes = [], iter([4096, 1 << 20])
    for r in runners:
        r.use_kernel = True
        need = next(sizes)
        fake = types.SimpleNamespace(
            launch=None,
            launch_flat=lambda *a: calls.append(a),
            scratch=(need, 0),
            scratch_bytes=lambda outer, need=need: need,
        )
        monkeypatch.setitem(runtime._modules, (r.kernel[0], 0), fake)
    made = []

    def empty(shape, strides, dtype):
        made.append(tuple(shape))
        return torch.empty_strided(shape, strides, dtype=dtype)

    monkeypatch.setattr(straight_line, "_empty_cuda", empty)
    monkeypatch.setattr(straight_line, "_device_guard", _FakeGuard)
    monkeypatch.setattr(runtime, "_raw_stream", lambda index: 0x5A)
    fns, why = straight_line.generate(compiled.current, 0, compiled.slow)
    assert fns is not None, why
    _, fast = fns
    assert fast.source.count("shared_scratch = empty(") == 1 and "del scratch" not in fast.source, fast.source
    fast([x, w])
    assert len(calls) == 2
    # the scratch pointer is the last before (outer, stream): the same buffer for both
    assert calls[0][-3] == calls[1][-3]
    assert (1 << 20,) in made and (4096,) not in made
    # a need above the limit: its own buffer, made and freed around its launch
    monkeypatch.setattr(straight_line, "SHARED_SCRATCH_BYTES", 1 << 16)
    fns, why = straight_line.generate(compiled.current, 0, compiled.slow)
    _, fast = fns
    assert fast.source.count("shared_scratch = empty(") == 1 and fast.source.count("del scratch") == 1, fast.source
    calls.clear()
    fast([x, w])
    assert len(calls) == 2 and calls[0][-3] != calls[1][-3]


def test_launches_get_their_pointers_and_views_are_not_made(daemon, monkeypatch):
    """The launch lines of generated code, on the CPU: each kernel (a stand-in module that
    records its arguments) is called with its pointers as arguments (launch_flat, no tuples),
    and an input it reads through views (a slice one row in, a parameter through an
    unsqueeze) gets its root's pointer plus the view's offset: no view is made."""
    import types

    from fuseml import runtime

    torch.manual_seed(0)

    def f(x, w):
        return torch.relu(x[1:] * w.unsqueeze(0) + 1.0)

    x, w = torch.randn(9, 64), torch.randn(64)
    compiled, runners = _compiled_with_kernels(f, x, w)
    assert len(runners) == 1, compiled.runners
    (r,) = runners
    r.use_kernel = True
    calls = []
    fake = types.SimpleNamespace(
        launch=None, launch_flat=lambda *a: calls.append(a), scratch=None, scratch_bytes=lambda outer: 0
    )
    monkeypatch.setitem(runtime._modules, (r.kernel[0], 0), fake)
    monkeypatch.setattr(straight_line, "_empty_cuda", lambda s, st, dt: torch.empty_strided(s, st, dtype=dt))
    monkeypatch.setattr(straight_line, "_device_guard", _FakeGuard)
    monkeypatch.setattr(runtime, "_raw_stream", lambda index: 0x5A)
    fns, why = straight_line.generate(compiled.current, 0, compiled.slow)
    assert fns is not None, why
    first, fast = fns
    # views are made only in the branch a misaligned input takes (the group's ATen ops)
    assert all(".eager(" in line for line in fast.source.split("\n") if "reinterpret(" in line), fast.source
    assert "data_ptr() + 256" in fast.source, fast.source
    outs = fast([x, w])
    ((*ptrs, outer, stream),) = calls
    assert stream == 0x5A
    want_in = {x.data_ptr() + 64 * x.element_size(), w.data_ptr()}  # x[1:] by pointer, one row in
    assert set(ptrs[:2]) == want_in, (ptrs, want_in)
    assert ptrs[2] == outs[0].data_ptr() and len(ptrs) == 3
    # an input 4 bytes off its allocation: the group's ATen ops, on views made from the root
    xm = torch.randn(9 * 64 + 1)[1:].view(9, 64)
    torch.testing.assert_close(fast([xm, w])[0], f(xm, w))
    assert len(calls) == 1
