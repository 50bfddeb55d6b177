"""CUDA graphs (mode="reduce-overhead") without a GPU: how the request is read (torch.compile's
mode and options, FuseMLCompiler(cudagraphs=), FUSEML_CUDAGRAPHS), CPU models that ask for graphs
run as eager with one warning, a torch without the private API used runs without graphs with
one warning, and, with a stand-in for CUDA graph capture and a CUDA device (helpers.fake_cuda),
every graph under fuseml's own replay: a training step's forward and backward (static inputs,
results right every step with saved values and gradients held, gradients accumulated into a
held p.grad), Inductor for the rest, a graph torch will not record, an inference graph. The
replay's own rules are tested in test_graph_replay.py."""

import logging

import pytest
import torch
from torch._dynamo.backends import cudagraphs as torch_cudagraphs

from helpers import assert_close, compile_run, fake_cuda  # noqa: F401  (the fixture)
from models import MODELS

import fuseml
from fuseml import backend, cudagraphs, graph_replay


def _graph_warnings(caplog):
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and "CUDA graph" in r.getMessage()]


def test_modes_and_options(monkeypatch):
    monkeypatch.delenv("FUSEML_CUDAGRAPHS", raising=False)
    assert cudagraphs.wanted() is False
    assert cudagraphs.wanted("default") is False
    assert cudagraphs.wanted("max-autotune-no-cudagraphs") is False
    assert cudagraphs.wanted("reduce-overhead") is True
    assert cudagraphs.wanted("max-autotune") is True
    assert cudagraphs.wanted(options={"cudagraphs": True}) is True
    assert cudagraphs.wanted("reduce-overhead", {"cudagraphs": False}) is False
    assert cudagraphs.wanted(default=True) is True
    assert cudagraphs.wanted("default", default=True) is False  # an explicit mode wins
    with pytest.raises(ValueError, match="reduce-overhead"):
        cudagraphs.wanted("fast")
    with pytest.raises(ValueError, match="cudagraphs"):
        cudagraphs.wanted(options={"triton.cudagraphs": True})
    monkeypatch.setenv("FUSEML_CUDAGRAPHS", "1")
    assert cudagraphs.wanted() is True
    assert cudagraphs.wanted(default=False) is False  # the constructor wins
    assert cudagraphs.wanted("default") is False
    monkeypatch.setenv("FUSEML_CUDAGRAPHS", "0")
    assert cudagraphs.wanted() is False


def test_backend_takes_torch_compile_keywords(dead_socket):
    gm = torch.fx.symbolic_trace(MODELS["mlp"]())
    x = torch.randn(4, 32)
    with pytest.raises(ValueError, match="mode must be one of"):
        fuseml.fuseml_backend(gm, [x], mode="fast")
    with pytest.raises(ValueError, match="unknown options"):
        fuseml.FuseMLCompiler()(gm, [x], options={"epilogue_fusion": True})
    # newer torch also passes name=; unknown keywords are ignored
    model = MODELS["mlp"]()
    seen = []
    c = fuseml.FuseMLCompiler()
    compiler = lambda gm, ex, **kw: (seen.append(kw), c(gm, ex, **kw, name="m", later=1))[1]
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(model, backend=compiler, mode="max-autotune")(x), model(x))
    assert seen == [{"mode": "max-autotune"}] and c.plans[-1].graphs


def test_mode_reaches_the_backend_by_name(dead_socket, monkeypatch):
    """torch.compile(backend="fuseml", mode=...) and options={"cudagraphs": True} reach the
    registered backend: each compiled graph's plan says whether it got graphs."""
    monkeypatch.setattr(backend, "_default", None)
    model, x = MODELS["mlp"](), torch.randn(4, 32)
    with torch.no_grad():
        torch.compile(model, backend="fuseml", mode="reduce-overhead")(x)
    assert backend._default.plans[-1].graphs == "no CUDA graphs: no CUDA tensors"
    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(model, backend="fuseml")(x)
    assert backend._default.plans[-1].graphs is None
    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(model, backend="fuseml", options={"cudagraphs": True})(x)
    assert backend._default.plans[-1].graphs.startswith("no CUDA graphs")
    assert "no CUDA graphs" in backend._default.plans[-1].describe()


@pytest.mark.parametrize("train", [False, True])
def test_cpu_model_runs_eager_with_one_warning(daemon, caplog, train):
    caplog.set_level(logging.WARNING)
    c, got, want = compile_run(MODELS["activation_heavy"](), torch.randn(6, 32), train=train, mode="reduce-overhead")
    assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert any(p.kernels() for p in c.plans)  # the daemon served its groups
    assert all(p.graphs.startswith("no CUDA graphs") for p in c.plans)
    warned = _graph_warnings(caplog)
    assert len(warned) == 1 and "no CUDA tensors" in warned[0], warned


def test_env_turns_graphs_on(dead_socket, monkeypatch, caplog):
    caplog.set_level(logging.WARNING)
    monkeypatch.setenv("FUSEML_CUDAGRAPHS", "1")
    c, got, want = compile_run(MODELS["mlp"](), torch.randn(6, 32))
    assert_close(got, want)
    assert all(p.graphs for p in c.plans)
    assert len(_graph_warnings(caplog)) == 1


def test_torch_without_the_api_runs_without_graphs(dead_socket, monkeypatch, caplog):
    caplog.set_level(logging.WARNING)
    monkeypatch.delattr(torch_cudagraphs, "check_for_skip")
    c, got, want = compile_run(MODELS["llama_mlp"](), torch.randn(6, 32), fuseml.FuseMLCompiler(cudagraphs=True))
    assert_close(got, want)
    warned = _graph_warnings(caplog)
    assert len(warned) == 1 and "unavailable" in warned[0], warned
    assert all(
        p.graphs == "no CUDA graphs: torch API missing" or p.graphs == "no CUDA graphs: forward not recorded"
        for p in c.plans
    )


@pytest.fixture
def on_cuda(monkeypatch, fake_cuda):
    """A CPU model taken for a CUDA one that torch lets record: every graph goes to fuseml's
    replay, whose captures the fake records and replays."""
    monkeypatch.setattr(torch_cudagraphs, "check_for_skip", lambda gm, fixed: None)
    monkeypatch.setattr(cudagraphs, "_cuda_index", lambda gm: 0)
    made = []
    orig = graph_replay.GraphReplay.__init__

    def init(self, *a, **k):
        orig(self, *a, **k)
        made.append(self)

    monkeypatch.setattr(graph_replay.GraphReplay, "__init__", init)
    fake_cuda.made = made
    return fake_cuda


def _train_steps(model, compiled, xs, steps):
    """`steps` training steps over the buffers xs, each compared with eager's; the grads of
    each step are kept until the next one returns (as a loop holding its last results). The
    output's gradient is one tensor (as the benchmark's): the CPU allocator would put a
    computed one at a new address every step, where CUDA's caching allocator hands a steady
    loop the same few (graph_replay's MAX_FRESH covers a loop where it does not)."""
    params = list(model.parameters())
    gy = {}
    kept = None
    for i in range(steps):
        x = xs[i % len(xs)]
        got = []
        for fn in (model, compiled):
            for p in params:
                p.grad = None
            xi = x.detach().requires_grad_(True)
            y = fn(xi)
            if y.shape not in gy:
                gy[y.shape] = torch.linspace(-1, 1, y.numel()).view(y.shape)
            y.backward(gy[y.shape])
            got.append([y.detach()] + [p.grad for p in params] + [xi.grad])
        for a, b in zip(got[1], got[0]):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
        kept = got[1]
    return kept


def test_training_graphs_under_fuseml_replay(dead_socket, on_cuda, caplog):
    """A training step's forward and backward are both recorded and replayed by fuseml (no
    cudagraph trees): parameters static in the forward, saved values static in the
    backward, the user's input and the tangents not; every step's output and gradients
    right while the saved values and the last step's gradients are held."""
    caplog.set_level(logging.WARNING)
    model = MODELS["mlp"]()
    shapes = sorted(tuple(p.shape) for p in model.parameters())
    compiler = fuseml.FuseMLCompiler()
    compiled = torch.compile(model, backend=compiler, mode="reduce-overhead")
    xs = [torch.randn(6, 32) for _ in range(2)]
    _train_steps(model, compiled, xs, 10)
    assert not _graph_warnings(caplog)
    fw, bw = on_cuda.made
    assert (fw.which, bw.which) == ("forward", "backward")
    assert all(p.graphs.startswith("CUDA graphs (fuseml replay") for p in compiler.plans)
    # recorded: each input buffer warmed up once, then recorded; replayed from then on
    assert fw.recordings >= 2 and fw.replays >= 4 and fw.off is None
    assert bw.recordings >= 2 and bw.replays >= 4 and bw.off is None
    # the forward's static inputs are the parameters (the user's input is keyed by its
    # layout too); the backward's are the saved values, not the tangent or the user's input
    key = next(iter(fw.direct))
    assert len(fw.static) == len(shapes) and len(key) == len(shapes) + 1
    assert [tuple(key[i][1]) for i in range(len(key)) if i not in fw.static] == [(6, 32)]
    bkey = next(iter(bw.direct))
    assert bw.static
    assert sorted(tuple(bkey[i][1]) for i in range(len(bkey)) if i not in bw.static) == [(6, 32), (6, 32)]


def test_training_gradients_kept_across_steps_stay_right(dead_socket, on_cuda):
    """Gradients are aliases of the backward's recording: one held (as p.grad kept with
    zero_grad(set_to_none=False), or a list of last step's grads) is never overwritten by
    the next replay; the next step uses a second recording or runs as compiled."""
    model = MODELS["mlp"]()
    compiled = torch.compile(model, backend=fuseml.FuseMLCompiler(), mode="reduce-overhead")
    x = torch.randn(6, 32)
    _train_steps(model, compiled, [x], 4)  # warm-up, recordings, replays
    fw, bw = on_cuda.made
    params = list(model.parameters())
    for p in params:
        p.grad = None
    gy = torch.randn(6, 32)
    compiled(x.detach().requires_grad_(True)).backward(gy)
    held = [p.grad for p in params]
    before = [g.clone() for g in held]
    r0 = bw.replays
    for _ in range(3):  # p.grad accumulates: the held ones grow
        compiled(x.detach().requires_grad_(True)).backward(gy)
    assert bw.replays >= r0 + 2
    for p, g0 in zip(params, before):
        torch.testing.assert_close(p.grad, 4 * g0, atol=1e-5, rtol=1e-5)
    for p in params:
        p.grad = None
    _train_steps(model, compiled, [x, torch.randn(6, 32)], 6)  # and a new buffer after it
    assert bw.off is None and fw.off is None


def test_micro_batches_forward_all_then_backward_all(dead_socket, on_cuda):
    """Gradient accumulation with every forward before any backward (pipeline style): each
    forward's saved values stay held until its own backward, so the first two forwards get
    their own recordings and the third runs as compiled; the backwards, in reverse order,
    read the right saved values, and the accumulated gradients are eager's."""
    model = MODELS["mlp"]()
    compiled = torch.compile(model, backend=fuseml.FuseMLCompiler(), mode="reduce-overhead")
    xs = [torch.randn(6, 32) for _ in range(3)]
    gy = torch.linspace(-1, 1, 6 * 32).view(6, 32)
    _train_steps(model, compiled, [xs[0]], 4)  # warm-up and recordings of the input set
    params = list(model.parameters())

    def accumulate(fn):
        for p in params:
            p.grad = None
        ys = [fn(x.detach().requires_grad_(True)) for x in (xs[0], xs[0], xs[0])]
        for y in reversed(ys):
            y.backward(gy)
        return [y.detach().clone() for y in ys] + [p.grad.clone() for p in params]

    want = accumulate(model)
    fw, bw = on_cuda.made
    held0 = fw.held_runs
    got = accumulate(compiled)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert fw.held_runs == held0 + 1 and fw.off is None and bw.off is None


def test_rest_inductor_under_fuseml_replay(dead_socket, on_cuda):
    c, got, want = compile_run(
        MODELS["activation_heavy"](), torch.randn(6, 32), fuseml.FuseMLCompiler(rest="inductor"), mode="reduce-overhead"
    )
    assert_close(got, want, atol=1e-4, rtol=1e-4)
    assert [r.which for r in on_cuda.made] == ["forward", "backward"]


@pytest.mark.parametrize("skipped", ["forward", "backward"])
def test_a_graph_torch_will_not_record_runs_as_compiled(dead_socket, on_cuda, monkeypatch, skipped):
    """torch's rule refuses one graph (an op that cannot be captured): it runs as compiled,
    right; an unrecorded forward leaves its backward unrecorded too (its saved values would
    sit at new addresses every step)."""
    seen = []

    def check(gm, fixed):
        seen.append(gm)
        which = "forward" if len(seen) == 1 else "backward"
        return "skipping cudagraphs due to incompatible op (x)" if which == skipped else None

    monkeypatch.setattr(torch_cudagraphs, "check_for_skip", check)
    model = MODELS["mlp"]()
    compiler = fuseml.FuseMLCompiler()
    compiled = torch.compile(model, backend=compiler, mode="reduce-overhead")
    _train_steps(model, compiled, [torch.randn(6, 32)], 4)
    notes = [p.graphs for p in compiler.plans]
    if skipped == "forward":
        assert notes == ["no CUDA graphs: incompatible op (x)", "no CUDA graphs: forward not recorded"]
        assert on_cuda.made == []
    else:
        assert notes[0].startswith("CUDA graphs (fuseml replay")
        assert notes[1] == "no CUDA graphs: incompatible op (x)"
        assert [r.which for r in on_cuda.made] == ["forward"] and on_cuda.made[0].replays >= 1


def test_inference_graph_under_fuseml_replay(dead_socket, on_cuda):
    model = MODELS["mlp"]()
    c, got, want = compile_run(model, torch.randn(6, 32), train=False, mode="reduce-overhead")
    assert_close(got, want)
    [plan] = c.plans
    assert plan.which == "inference" and plan.graphs.startswith("CUDA graphs (fuseml replay")
    assert plan.graphs.count(",") == 3  # the 4 parameters are the static inputs


class _Normed(torch.nn.Module):
    """A training forward that updates buffers: batch norm's running statistics."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(32, 16)
        self.bn = torch.nn.BatchNorm1d(16)

    def forward(self, x):
        return torch.relu(self.bn(self.fc(x)))


def test_buffer_updates_are_recorded_with_the_graph(dead_socket, on_cuda):
    """The running statistics a training forward updates are inputs at fixed addresses: the
    graph writes them itself inside its recording (no copy per buffer by aot_autograd's
    wrapper after each call), and every replay updates them as eager does."""
    torch.manual_seed(0)
    model = _Normed()
    ref = _Normed()
    ref.load_state_dict(model.state_dict())
    compiler = fuseml.FuseMLCompiler()
    compiled = torch.compile(model, backend=compiler, mode="reduce-overhead")
    x = torch.randn(8, 32)
    for _ in range(6):
        compiled(x).sum().backward()
        ref(x).sum().backward()
    fw = [r for r in on_cuda.made if r.which == "forward"]
    assert fw and fw[0].replays >= 2 and fw[0].off is None
    assert compiler.plans[0].graphs.startswith("CUDA graphs (fuseml replay")
    updates = [
        n.target
        for n in compiler.plans[0].compiled.gm.graph.nodes
        if n.target in (torch.ops.aten.copy_.default, torch._foreach_copy_, torch._foreach_add_)
    ]
    assert updates  # in the recorded graph, not aot_autograd's wrapper
    torch.testing.assert_close(model.bn.running_mean, ref.bn.running_mean)
    torch.testing.assert_close(model.bn.running_var, ref.bn.running_var)
    assert int(model.bn.num_batches_tracked) == int(ref.bn.num_batches_tracked) == 6


def test_a_mutated_input_that_moves_keeps_the_graph_unrecorded(dead_socket, on_cuda):
    """An input the graph updates that is not at a fixed address (the caller's tensor) cannot
    be written by a recording: the graph runs as compiled, and the update still lands."""

    def f(x, acc):
        acc.add_(x)
        return torch.relu(acc * 2.0)

    compiler = fuseml.FuseMLCompiler()
    compiled = torch.compile(f, backend=compiler, mode="reduce-overhead")
    x = torch.randn(6, 32)
    acc, want = torch.zeros(6, 32), torch.zeros(6, 32)
    for _ in range(3):
        torch.testing.assert_close(compiled(x, acc), f(x, want))
    torch.testing.assert_close(acc, want)
    assert "mutated inputs" in compiler.plans[0].graphs and on_cuda.made == []
