import collections
import contextlib
import copy

import pytest
import torch

import fuseml
from fuseml import graph_replay


class Fn(torch.nn.Module):
    """A module that calls f: a function compiled as a model."""

    def __init__(self, f):
        super().__init__()
        self.f = f

    def forward(self, x):
        return self.f(x)


def run_step(fn, params, x, train=True):
    """(output, gradients of params and x) of one step of fn on a fresh copy of x; the loss
    weights each output element by a ramp, so no gradient is trivially zero."""
    for p in params:
        p.grad = None
    xi = x.detach().clone().requires_grad_(train)
    if train:
        y = fn(xi)
        (y.float() * torch.linspace(-1, 1, y.numel()).view(y.shape)).sum().backward()
        return y.detach(), [p.grad.clone() for p in params] + [xi.grad.clone()]
    with torch.no_grad():
        return fn(xi), []


def compile_run(model, x, compiler=None, train=True, **kw):
    """Compiles model with a FuseMLCompiler, runs it (and backward when train), and returns
    (compiler, output, grads) next to eager's (output, grads)."""
    compiler = compiler or fuseml.FuseMLCompiler()
    params = list(model.parameters())
    want = run_step(model, params, x, train)
    got = run_step(torch.compile(model, backend=compiler, **kw), params, x, train)
    return compiler, got, want


def fp32_step(model, x, train=True):
    """run_step of an fp32 copy of model on x in fp32: the reference for bf16 runs."""
    ref = copy.deepcopy(model).float()
    return run_step(ref, list(ref.parameters()), x.float(), train)


def assert_close(got, want, atol=1e-5, rtol=1e-5):
    (y, grads), (y0, grads0) = got, want
    torch.testing.assert_close(y, y0, atol=atol, rtol=rtol)
    assert len(grads) == len(grads0)
    for g, g0 in zip(grads, grads0):
        torch.testing.assert_close(g, g0, atol=atol, rtol=rtol)


def rel_err(a, b):
    """||a - b|| / ||b||, in fp32."""
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm()).item()


def close_bf16(got, want, ref=None):
    """bf16 outputs and gradients: ||got - want|| / ||want|| below 1e-2 each, never NaN. With
    ref (fp32_step's): a value farther from eager bf16 than that passes when it is no farther
    from fp32 than eager bf16 is (a decomposition that accumulates in fp32 where the eager
    kernel did not, as LayerNorm's weight gradient on the CPU)."""
    (y, grads), (y0, grads0) = got, want
    refs = [None] * (1 + len(grads)) if ref is None else [ref[0]] + ref[1]
    for a, b, r in zip([y] + grads, [y0] + grads0, refs):
        err = rel_err(a, b)
        assert err == err, err  # NaN never passes
        if err >= 1e-2 and r is not None:
            assert rel_err(a, r) <= rel_err(b, r) * 1.05 + 1e-3, (err, rel_err(a, r), rel_err(b, r))
            continue
        assert err < 1e-2, err


def median_ms(fns, reps=30):
    """Interleaved CUDA-event medians of each fn in fns (the order rotates every rep); for the
    device scripts."""
    times = [[] for _ in fns]
    for r in range(reps):
        order = list(range(len(fns)))
        order = order[r % len(order) :] + order[: r % len(order)]
        for i in order:
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fns[i]()
            e.record()
            times[i].append((s, e))
    torch.cuda.synchronize()
    return [sorted(s.elapsed_time(e) for s, e in t)[len(t) // 2] for t in times]


def plan(compiler, which):
    plans = [p for p in compiler.plans if p.which == which]
    assert plans, f"no {which} graph compiled"
    return plans[-1]


class _FakeCuda:
    """A stand-in for torch.cuda's graph capture on a CPU machine: a capture records the
    function, and a replay runs it again on the captured inputs into the captured outputs
    (what a CUDA graph does to device memory); each capture grows the reserved memory."""

    def __init__(self):
        self.captures = 0
        self.pools = 0
        self.reserved = 0
        self.MB_PER_CAPTURE = 10
        self.fail = None
        self.current = None  # (graph, fn, inputs) while capturing
        self.holds = collections.Counter()  # storage -> captured inputs the fake keeps

    def install(self, monkeypatch):
        fake = self

        class Graph:
            def replay(self):
                out = self.fn(list(self.inputs))
                for o, n in zip(self.outputs, out):
                    if isinstance(o, torch.Tensor):
                        # .data: a graph writes memory without bumping autograd's version
                        # counters (a saved value aliased here must not look modified)
                        o.data.copy_(n)

        @contextlib.contextmanager
        def graph(g, pool=None, capture_error_mode=None):
            assert pool == "pool" and capture_error_mode == "thread_local"
            fake.pools += 1
            if fake.fail:
                raise RuntimeError(fake.fail)
            fake.captures += 1
            fake.reserved += fake.MB_PER_CAPTURE << 20
            g.capturing = True
            yield
            g.capturing = False

        monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
        monkeypatch.setattr(torch.cuda, "graph", graph)
        monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: "pool")
        monkeypatch.setattr(torch.cuda, "device", lambda i: contextlib.nullcontext())
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
        # each capture grows the reserved memory by MB_PER_CAPTURE; the budget is the env's
        monkeypatch.setattr(torch.cuda, "memory_reserved", lambda i: fake.reserved)
        monkeypatch.setenv("FUSEML_GRAPH_MEMORY_MB", "1000")
        # the recorded graph remembers its function (the replay's being recorded), inputs and
        # outputs: what a capture fixes
        orig_record = graph_replay.GraphReplay._record

        def record(self, args, *a, **k):
            fake.fn = self.fn
            # a capture runs nothing on the GPU: what the fake's capture computed in place (a
            # graph updating its inputs, batch norm's running statistics) is undone after it
            before = [(t, t.detach().clone()) for t in args if isinstance(t, torch.Tensor)]
            rec = orig_record(self, args, *a, **k)
            for t, v in before:
                t.data.copy_(v)
            return rec

        monkeypatch.setattr(graph_replay.GraphReplay, "_record", record)
        orig = graph_replay._Recorded.__init__

        def init(self, g, outputs, inputs, buffers, nbytes=0):
            g.fn, g.inputs, g.outputs = fake.fn, list(inputs), outputs
            for t in g.inputs:
                if isinstance(t, torch.Tensor):
                    fake.holds[t.untyped_storage()._cdata] += 1
            orig(self, g, outputs, inputs, buffers, nbytes)

        monkeypatch.setattr(graph_replay._Recorded, "__init__", init)
        # A real graph holds no Python reference to what it read: the fake's own references
        # to its captured inputs (a backward's are a forward recording's outputs) are not
        # counted as held by the caller
        real = graph_replay._use_count
        if real is not None:
            monkeypatch.setattr(graph_replay, "_use_count", lambda cdata: real(cdata) - fake.holds[cdata])


@pytest.fixture
def fake_cuda(monkeypatch):
    f = _FakeCuda()
    f.install(monkeypatch)
    return f
