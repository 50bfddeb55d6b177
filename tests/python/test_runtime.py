"""The launch path without a GPU: a stand-in module records what fm_module_launch would get
(pointer counts, outer) while the outputs come from torch.empty_strided as on CUDA. Checks
the output shapes and strides against eager, the collapsing of symbolic dims into `outer`,
the layout checks that send a group back to eager, and the registered backend name."""

import gc
import logging
import types
import weakref

import pytest
import torch

from models import MODELS

import fuseml
from fuseml import runtime
from fuseml.partition import Served


class _StandIn:
    """launcher.Module's interface without a GPU: records each launch (and a plan's scratch)."""

    calls = []

    def __init__(self, cubin, meta):
        blas = meta.get("blas")
        self.scratch = tuple(blas["scratch"]) if blas else None

    def scratch_bytes(self, outer):
        fixed, per_row = self.scratch
        return fixed + max(outer, 0) * per_row

    def launch(self, ins, outs, outer, stream):
        _StandIn.calls.append((len(ins), len(outs), outer))


class _Dev:
    def __init__(self, idx):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


@pytest.fixture
def standin(monkeypatch):
    monkeypatch.setattr(runtime.launcher, "Module", _StandIn)
    monkeypatch.setattr(torch.cuda, "device", _Dev)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a: types.SimpleNamespace(cuda_stream=0))
    monkeypatch.setattr(runtime, "_raw_stream", lambda idx: 0)
    # the stand-in launches nothing, so there is nothing to time: always the kernel
    monkeypatch.setenv("FUSEML_ROUTE", "kernel")
    _StandIn.calls = []
    return _StandIn


def _runners(c):
    ids = {id(g.built) for p in c.plans for g in p.kernels()}
    return [r for r in runtime._registry.values() if r.built is not None and id(r.built) in ids]


def test_launch_layout_dynamic_3d(dead_socket, standin):
    c = fuseml.FuseMLCompiler()
    torch.compile(MODELS["llama_mlp"](), backend=c, dynamic=True)(torch.randn(3, 5, 32))
    cpu = torch.device("cpu")
    for r in _runners(c):
        assert r.built.layout.k == 2
        xs = [torch.randn(3, 5, 64) for _ in r.built.in_nodes]
        r.kernel = ("k" * 64, "tuned", b"", {})
        got = r._launch(xs, cpu, r.kernel[0], b"", {})
        want = r.eager(xs)
        assert [(o.shape, o.stride(), o.dtype) for o in got] == [(o.shape, o.stride(), o.dtype) for o in want]
    assert standin.calls and all(outer == 15 for _, _, outer in standin.calls)


def test_layout_mismatch_goes_eager(dead_socket, standin):
    c = fuseml.FuseMLCompiler()
    f = lambda x: torch.relu(x * 2.0 + 1.0)  # noqa: E731
    torch.compile(f, backend=c)(torch.randn(4, 8))
    (r,) = _runners(c)
    r.kernel = ("k" * 64, "tuned", b"", {})
    with pytest.raises(runtime._Layout):
        r._launch([torch.randn(8, 4).t()], torch.device("cpu"), r.kernel[0], b"", {})
    with pytest.raises(runtime._Layout):
        r._launch([torch.randn(4, 8, dtype=torch.float64)], torch.device("cpu"), r.kernel[0], b"", {})
    # misaligned base: one float past a 16-byte boundary
    base = torch.randn(33)
    with pytest.raises(runtime._Layout):
        r._launch([base[1:].view(4, 8)], torch.device("cpu"), r.kernel[0], b"", {})
    assert not standin.calls


def test_untuned_needs_the_testing_flag(dead_socket, caplog):
    caplog.set_level(logging.WARNING, logger="fuseml")
    c = fuseml.FuseMLCompiler()
    f = lambda x: torch.relu(x * 2.0)  # noqa: E731
    x = torch.randn(4, 8)
    torch.compile(f, backend=c)(x)
    (r,) = _runners(c)
    r.kernel = ("k" * 64, "untuned", b"", {})
    fake = types.SimpleNamespace(device=torch.device("cuda", 0))
    # a "CUDA" input list: the device check passes, the state check sends it eager
    called = []
    r.eager = lambda xs: called.append(xs) or []
    r.run([fake])
    assert called and "untuned" in caplog.text


def test_backend_by_name(dead_socket):
    assert "fuseml" in torch._dynamo.list_backends()
    f = lambda x: torch.sigmoid(x) * x + 1.0  # noqa: E731
    x = torch.randn(5, 7)
    torch.testing.assert_close(torch.compile(f, backend="fuseml")(x), f(x))


def test_groups_routed_to_aten_are_inlined(dead_socket, standin):
    """A group with a kernel is a fuseml::group call; once measured routing sends it to ATen
    the graph is rebuilt with its ATen ops inline (no custom-op cost), and still computes the
    same; a group the daemon never served is inlined from the start."""
    from fuseml.backend import Compiled

    c = fuseml.FuseMLCompiler()
    f = lambda x: torch.relu(x * 2.0 + 1.0)  # noqa: E731
    x = torch.randn(4, 8)
    torch.compile(f, backend=c)(x)
    (p,) = c.plans
    (g,) = p.kernels()
    (r,) = _runners(c)
    gm = next(iter(p.groups)).members[0].graph.owning_module
    # no daemon: no kernel, inlined from the start
    served_none = Compiled(gm, [g], {g.gid: r})
    assert not served_none.kept and served_none.current is gm
    r.kernel = ("k" * 64, "tuned", b"", {})
    comp = Compiled(gm, [g], {g.gid: r})

    def has_group(m):
        # the runner is called directly (what the fuseml::group op calls)
        return any(getattr(n.target, "__self__", None) is r for n in m.graph.nodes)

    assert has_group(comp.current) and comp.pending
    r.use_kernel = False  # what _decide does when ATen wins
    (out,) = comp([x])  # boxed: the argument list
    assert not has_group(comp.current) and not comp.pending
    torch.testing.assert_close(out, f(x))


def test_gemm_group_through_a_view_launch_layout(dead_socket, standin):
    """nn.Linear on [B, S, D] then GELU: one GEMM group through the view; the kernel's [M, N]
    outputs come back viewed as the [B, S, N] the graph expects, the escaping 2-D
    pre-activation stays [M, N]; outer is M = B * S."""
    lin = torch.nn.Linear(32, 64).to(torch.bfloat16)
    f = torch.nn.Sequential(lin, torch.nn.GELU())
    c = fuseml.FuseMLCompiler()
    x = torch.randn(2, 8, 32, dtype=torch.bfloat16, requires_grad=True)
    torch.compile(f, backend=c)(x)
    (r,) = [r for r in _runners(c) if r.built.gemm]
    assert r.built.out_views
    xs = []
    for n in r.built.in_nodes:
        v = n.meta["val"]
        xs.append(torch.empty_strided(v.shape, v.stride(), dtype=v.dtype).normal_())
    r.kernel = ("k" * 64, "tuned", b"", {})
    got = r._launch(xs, torch.device("cpu"), r.kernel[0], b"", {})
    want = r.eager(xs)
    assert [(o.shape, o.stride(), o.dtype) for o in got] == [(o.shape, o.stride(), o.dtype) for o in want]
    assert any(o.dim() == 3 for o in got)
    assert standin.calls and standin.calls[-1][2] == 16
    n_out = standin.calls[-1][1]
    # served a cuBLASLt plan: one more pointer after the outputs, the scratch
    runtime._modules.clear()
    plan = {"kind": "cublaslt", "blas": {"form": "split", "scratch": [4 << 20, 64 * 2]}}
    r._launch(xs, torch.device("cpu"), "p" * 64, b"", plan)
    assert standin.calls[-1] == (len(xs), n_out + 1, 16)
    # explain's view of a group served a plan: its strategy names the plan and its form
    from fuseml import plan_view

    r.kernel = ("p" * 64, "tuned", b"", plan)
    r.group.served, r.use_kernel = Served("p" * 64, "tuned", "compiled"), True
    (row,) = [x for x in plan_view.groups(c) if x["gid"] == r.group.gid and x["plan"]]
    assert row["strategy"] == "cublaslt plan (tuned): cuBLASLt + a generated epilogue kernel"
    assert row["plan"] == "split" and row["template"] == "cublaslt"


def _eager_call_watched(f, x):
    """Runs the one group of f compiled as its ATen ops, with the cycle collector off; returns
    (its output, a weak reference to each step's value, how many of them were alive as each
    step began)."""
    import gc
    import weakref

    c = fuseml.FuseMLCompiler()
    torch.compile(f, backend=c)(x)
    (r,) = _runners(c)
    made, alive = [], []

    def recorded(target):
        def step(*args, **kwargs):
            alive.append(sum(ref() is not None for ref in made))
            out = target(*args, **kwargs)
            made.append(weakref.ref(out))
            return out

        return step

    r.steps = [(recorded(t), a, k) for t, a, k in r.steps]
    gc.disable()
    try:
        (out,) = r.eager([x])
        return out, made, alive
    finally:
        gc.enable()


def test_an_aten_call_of_a_group_frees_its_values_at_once(dead_socket, standin):
    """A group run as its ATen ops (no kernel, or measured routing's timed calls) holds no
    value of its own after it returns, without waiting for the cycle collector: measured
    routing times seven calls of a group in a row, and over a cross-entropy's logits each call's
    intermediates are gigabytes."""
    f = lambda x: torch.relu(torch.sigmoid(x * 2.0) + 1.0)  # noqa: E731
    x = torch.randn(4, 8)
    out, made, _ = _eager_call_watched(f, x)
    torch.testing.assert_close(out, f(x))
    del out
    assert len(made) >= 3 and all(ref() is None for ref in made), [ref() is None for ref in made]


def test_an_aten_call_of_a_group_lets_go_of_each_value_after_its_last_read(dead_socket, standin):
    """Inside a group run as its ATen ops, an intermediate is dropped once the last step that
    reads it ran (the FX graph's rule): at each step of a chain only the value it reads is
    alive, and the result is eager's."""
    f = lambda x: torch.tanh(torch.relu(torch.sigmoid(x * 2.0) + 1.0) * x)  # noqa: E731
    x = torch.randn(4, 8)
    out, made, alive = _eager_call_watched(f, x)
    torch.testing.assert_close(out, f(x))
    assert len(made) >= 5, len(made)
    assert alive[1:] == [1] * (len(made) - 1), alive  # only the previous step's value


def test_aten_ops_that_write_far_more_are_not_timed(dead_socket, standin, monkeypatch):
    """Measured routing does not run a group's ATen ops when they would write far more than
    its kernel moves (runtime.ATEN_HEAVY_BYTES, ATEN_HEAVY_RATIO): the kernel is chosen
    without timing, so the first step allocates no ATen intermediates; explain() says so. A
    group below the bar is timed as before."""
    monkeypatch.setenv("FUSEML_ROUTE", "measure")
    c = fuseml.FuseMLCompiler()
    # eight ops over the input's size: ATen writes 4x what the kernel reads and writes
    f = lambda x: (((((x * 2.0 + 1.0).exp() * 3.0) - 1.0).tanh() + 0.5) * 0.25)  # noqa: E731
    x = torch.randn(64, 64)
    torch.compile(f, backend=c)(x)
    (r,) = _runners(c)
    assert r.aten_heavy is None  # 98 KB: far below the default bar
    monkeypatch.setattr(runtime, "ATEN_HEAVY_BYTES", 1024)
    heavy = runtime._aten_heavy(r.group, r.built)
    assert heavy == 8 * x.numel() * x.element_size(), heavy
    monkeypatch.setattr(runtime, "ATEN_HEAVY_RATIO", 100)
    assert runtime._aten_heavy(r.group, r.built) is None  # not 100x: timed
    r.aten_heavy = heavy
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    eager_calls = []
    monkeypatch.setattr(r, "eager", lambda xs: eager_calls.append(1))
    (out,) = r._decide([x], torch.device("cpu"), "k" * 64, b"", {})
    assert r.use_kernel and not eager_calls and _StandIn.calls
    assert r.group.route_measured == ("kernel", None, None)
    assert "ATen not timed" in r.group.describe()


@pytest.mark.parametrize("winner, remembered", [("kernel", False), ("aten", False), ("kernel", True), ("aten", True)])
def test_measured_routing_never_holds_both_routes_outputs(dead_socket, standin, monkeypatch, winner, remembered):
    """Measured routing times a group's kernel and its ATen ops; the kernel's first outputs
    are gone before the ATen ops run, and the route taken runs once more for the call's
    results, so the first step holds one set of the group's outputs at a time (as every later
    step does). The trial launch is not counted as the call's. A route an earlier process
    remembered is taken untimed: the kernel's first outputs are the call's, or gone before
    the ATen ops run."""
    monkeypatch.setenv("FUSEML_ROUTE", "measure")
    c = fuseml.FuseMLCompiler()
    f = lambda x: (x * 2.0 + 1.0).exp()  # noqa: E731
    x = torch.randn(64, 64)
    torch.compile(f, backend=c)(x)
    (r,) = _runners(c)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(runtime.routes, "recall", lambda sig: (winner, 1.0, 2.0) if remembered else None)
    monkeypatch.setattr(runtime.routes, "remember", lambda *a: None)
    monkeypatch.setattr(runtime.routes, "gpu_identity", lambda dev: "stand-in GPU")
    alive, seen_with_kernel_out, made = [], [], []

    def launch(xs, dev, key, cubin, meta):
        out = torch.empty(64, 64)
        alive.append(weakref.ref(out))
        made.append("kernel")
        runtime.counters["launches"] += 1
        return [out]

    def eager(xs):
        gc.collect()
        seen_with_kernel_out.append(any(ref() is not None for ref in alive))
        made.append("aten")
        return [torch.empty(64, 64)]

    times = {"kernel": 1.0, "aten": 2.0} if winner == "kernel" else {"kernel": 2.0, "aten": 1.0}

    def median_ms(fn, reps, stream):
        fn()
        return times[made[-1]]

    monkeypatch.setattr(runtime, "_median_ms", median_ms)
    monkeypatch.setattr(r, "_launch", launch)
    monkeypatch.setattr(r, "eager", eager)
    launches = runtime.counters["launches"]
    (out,) = r._decide([x], torch.device("cpu"), "k" * 64, b"", {})
    assert r.use_kernel == (winner == "kernel")
    assert made[-1] == winner  # the call's results come from the route taken, run last
    assert runtime.counters["launches"] == launches + (winner == "kernel")
    if remembered:  # nothing timed: one launch, and the ATen ops once where they won
        assert made == ["kernel"] + (["aten"] if winner == "aten" else [])
    if winner == "aten" or not remembered:
        assert seen_with_kernel_out and not any(seen_with_kernel_out)
