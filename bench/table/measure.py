"""Measurements of one row: ceilings (copy bandwidth, bf16 GEMM rate), interleaved timing of
the columns, kernel launches per step (torch.profiler), relative error against an fp32
reference, and the analytical HBM model (eager: every op reads its inputs and writes its
outputs; fused: a served group reads its inputs and writes its outputs once)."""

import math
import operator
import statistics
import time

import torch

try:
    from fuseml import ops as _fm_ops

    _FREE_OPS = set(_fm_ops.VIEW_OPS)
except ImportError:  # the HBM model does not need fuseml; the fused column does
    _FREE_OPS = set()
_aten = torch.ops.aten
_FREE_OPS |= {
    _aten.alias.default,
    _aten.detach.default,
    _aten._unsafe_view.default,
    _aten.view.default,
    _aten.t.default,
    _aten.expand.default,
    operator.getitem,
}


def _sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


class Clock:
    """CUDA events on a GPU, perf_counter on the CPU (the smoke mode)."""

    def __init__(self, dev):
        self.cuda = dev.type == "cuda"
        self.dev = dev

    def time_ms(self, fn, inner):
        if self.cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for i in range(inner):
                fn(i)
            b.record()
            b.synchronize()
            return a.elapsed_time(b) / inner
        t0 = time.perf_counter()
        for i in range(inner):
            fn(i)
        return (time.perf_counter() - t0) * 1e3 / inner


def ceilings(dev, smoke=False):
    """Copy bandwidth (bytes read + written per second, of a device-to-device copy far larger
    than L2) and the bf16 GEMM rate (flop/s of a large torch.mm), medians, in this run."""
    clock = Clock(dev)
    n = (8 << 20) if smoke else (512 << 20)  # bytes per buffer
    src = torch.empty(n // 2, dtype=torch.bfloat16, device=dev).normal_()
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    _sync(dev)
    t = statistics.median(clock.time_ms(lambda i: dst.copy_(src), 1) for _ in range(20 if not smoke else 5))
    bw = 2 * n / (t * 1e-3)
    del src, dst
    s = 256 if smoke else 8192
    a = torch.randn(s, s, device=dev, dtype=torch.bfloat16)
    b = torch.randn(s, s, device=dev, dtype=torch.bfloat16)
    for _ in range(3):
        torch.mm(a, b)
    _sync(dev)
    t = statistics.median(clock.time_ms(lambda i: torch.mm(a, b), 1) for _ in range(10 if not smoke else 3))
    rate = 2 * s**3 / (t * 1e-3)
    return {"copy_bytes_per_s": bw, "bf16_gemm_flops_per_s": rate, "copy_buffer_bytes": n, "gemm_size": s}


def time_columns(steps, xs, dev, reps, target_ms=2.0, warmup=3):
    """Median ms per step of every column, all in this process, interleaved: each repetition
    times every column once, the order rotated by one per repetition. Each sample runs
    `inner` steps back to back (enough for ~target_ms) over the input buffers in turn, so a
    small working set does not sit in L2 from one step to the next."""
    clock = Clock(dev)
    names = list(steps)
    inner = {}
    for name in names:
        fn = steps[name]
        # every input buffer twice at least: fuseml's CUDA-graph replay runs a new input set
        # once as compiled and records it at its second call (bench/NOTES.md, third run)
        for i in range(max(warmup, 2 * len(xs))):
            fn(xs[i % len(xs)])
        _sync(dev)
        est = clock.time_ms(lambda i, fn=fn: fn(xs[i % len(xs)]), 2)
        inner[name] = max(1, min(100, math.ceil(target_ms / max(est, 1e-3))))
    samples = {n: [] for n in names}
    for r in range(reps):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            fn = steps[name]
            samples[name].append(clock.time_ms(lambda i, fn=fn: fn(xs[i % len(xs)]), inner[name]))
    out = {}
    for name, s in samples.items():
        s = sorted(s)
        q1, q3 = s[len(s) // 4], s[(3 * len(s)) // 4]
        out[name] = {"ms": statistics.median(s), "iqr_ms": q3 - q1, "samples": len(s), "inner": inner[name]}
    return out


def count_kernels(step, x, dev, steps=3):
    """CUDA kernels launched per step (torch.profiler; memcpy/memset not counted). None off
    the GPU."""
    if dev.type != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile

    step(x)
    _sync(dev)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step(x)
        _sync(dev)
    n = 0
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        name = e.name.lower()
        if name.startswith("memcpy") or name.startswith("memset"):
            continue
        n += 1
    return n / steps


def rel_err(got, want):
    """max over the step's tensors of ||got - want|| / ||want|| (want in fp32)."""
    worst = 0.0
    for g, w in zip(got, want):
        if g is None or w is None:
            continue
        w = w.detach().double()
        d = (g.detach().double() - w).norm().item()
        worst = max(worst, d / max(w.norm().item(), 1e-30))
    return worst


# -- the analytical HBM model --------------------------------------------------------------


def _bytes(v):
    """Bytes of the distinct elements of a tensor value (a broadcast dim, stride 0, is read
    once); tuples summed."""
    if isinstance(v, torch.Tensor):
        n = 1
        for size, stride in zip(v.shape, v.stride()):
            if stride != 0:
                n *= int(size)
        return n * v.element_size()
    if isinstance(v, (list, tuple)):
        return sum(_bytes(x) for x in v)
    return 0


def _val_bytes(node):
    return _bytes(node.meta.get("val")) if hasattr(node, "meta") else 0


def _node_bytes(node):
    if node.op != "call_function" or node.target in _FREE_OPS or getattr(node.target, "is_view", False):
        return 0
    reads = sum(_val_bytes(a) for a in dict.fromkeys(node.all_input_nodes))
    return reads + _val_bytes(node)


def hbm_bytes(graphs, groups_per_graph):
    """(eager, fused) bytes of one step over the ATen graphs the backend saw (forward and
    backward, or inference). groups_per_graph[i]: the groups of graphs[i] whose kernel is
    served; each counts its inputs read and outputs written once, its members nothing more."""
    eager = fused = 0
    for gm, groups in zip(graphs, groups_per_graph):
        in_group = {}
        for g in groups:
            for n in g.members:
                in_group[n] = g
        for node in gm.graph.nodes:
            b = _node_bytes(node)
            eager += b
            if node not in in_group:
                fused += b
        for g in groups:
            fused += sum(_val_bytes(a) for a in g.inputs) + sum(_val_bytes(o) for o in g.outputs)
    return eager, fused
