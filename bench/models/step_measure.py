"""Measurements of one model's steps: first-call (compile) time, interleaved wall time, the
profiler's GPU time with its breakdown by kernel class and the ATen ops that ran, the peak
memory of a step, and the relative error against the fp32 copy. Works on the CPU too (the
smoke test): what only a GPU has (GPU time, kernels, memory) is None there."""

import collections
import math
import statistics
import time

import torch

import kernel_classes


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def timed_call(step, dev):
    """Seconds of one call of step, the device drained before and after."""
    sync(dev)
    t0 = time.perf_counter()
    step()
    sync(dev)
    return time.perf_counter() - t0


def wall_ms(steps, dev, reps, target_ms=25.0):
    """Median wall ms per step of every named step, interleaved: each repetition times every
    step once, the order rotated by one per repetition, so drift in clocks or host load lands
    on every mode alike. A sample is `inner` steps back to back (about target_ms), the device
    drained before and after, divided by inner. Returns {name: {ms, iqr_ms, inner, samples}}."""
    names = list(steps)
    inner = {}
    for name in names:
        est = timed_call(steps[name], dev) * 1e3
        inner[name] = max(1, min(200, math.ceil(target_ms / max(est, 1e-3))))
    samples = {n: [] for n in names}
    for r in range(reps):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            step = steps[name]
            sync(dev)
            t0 = time.perf_counter()
            for _ in range(inner[name]):
                step()
            sync(dev)
            samples[name].append((time.perf_counter() - t0) * 1e3 / inner[name])
    out = {}
    for name, s in samples.items():
        s = sorted(s)
        out[name] = {
            "ms": statistics.median(s),
            "iqr_ms": s[(3 * len(s)) // 4] - s[len(s) // 4],
            "inner": inner[name],
            "samples": len(s),
        }
    return out


def peak_memory_gb(step, dev, capture_peak_bytes=0):
    """The peak memory of one step above what was allocated before it, in GB (None off the
    GPU). capture_peak_bytes: for a mode that replays CUDA graphs, the peak seen while its
    graphs were captured (a replay allocates nothing the allocator sees; the graph's pool was
    taken at capture)."""
    if dev.type != "cuda":
        return None
    sync(dev)
    base = torch.cuda.memory_allocated(dev)
    torch.cuda.reset_peak_memory_stats(dev)
    step()
    sync(dev)
    peak = torch.cuda.max_memory_allocated(dev) - base
    return max(peak, capture_peak_bytes) / 1e9


def _self_device_us(avg):
    for key in ("self_device_time_total", "self_cuda_time_total"):
        if hasattr(avg, key):
            return getattr(avg, key)
    return 0.0


def profile(step, dev, steps=3, top=25):
    """GPU time per step from torch.profiler (kernels, memcpy and memset; host excluded),
    kernels per step, ms per kernel class, the costliest kernels, and the ATen ops that ran
    with their own (self) device time: what a fused backend left to ATen. Off the GPU, the
    ATen ops with their CPU time and no GPU figures."""
    from torch.profiler import ProfilerActivity, profile as torch_profile

    cuda = dev.type == "cuda"
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    step()
    sync(dev)
    with torch_profile(activities=acts) as prof:
        for _ in range(steps):
            step()
        sync(dev)
    by_class = collections.defaultdict(float)
    by_kernel = collections.defaultdict(lambda: [0, 0.0])
    n_kernels = 0
    gpu_us = 0.0
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        us = e.time_range.elapsed_us()
        cls = kernel_classes.classify(e.name)
        by_class[cls] += us
        gpu_us += us
        if cls != kernel_classes.MEMCPY:
            n_kernels += 1
        k = by_kernel[e.name]
        k[0] += 1
        k[1] += us
    ops = []
    for avg in prof.key_averages():
        if not avg.key.startswith("aten::"):
            continue
        us = _self_device_us(avg) if cuda else avg.self_cpu_time_total
        if us > 0:
            ops.append({"op": avg.key, "calls": avg.count / steps, "ms": us / steps / 1e3})
    ops.sort(key=lambda o: -o["ms"])
    kernels = sorted(
        (
            {"kernel": name[:160], "class": kernel_classes.classify(name), "calls": c / steps, "ms": us / steps / 1e3}
            for name, (c, us) in by_kernel.items()
        ),
        key=lambda k: -k["ms"],
    )
    return {
        "gpu_ms": gpu_us / steps / 1e3 if cuda else None,
        "kernels": n_kernels / steps if cuda else None,
        "breakdown_ms": {c: by_class[c] / steps / 1e3 for c in kernel_classes.ORDER if by_class.get(c)},
        "top_kernels": kernels[:top],
        "aten_ops": ops[:top],
    }


def rel_err(got, want):
    """||got - want|| / ||want|| over the concatenation of the tensors (want in fp32): one
    figure for a step's output, or for all of its gradients together. NaN or inf anywhere in
    got gives inf: a NaN never passes."""
    num = den = 0.0
    for g, w in zip(got, want):
        if g is None or w is None:
            continue
        g, w = g.detach().double(), w.detach().double()
        if not torch.isfinite(g).all():
            return math.inf
        num += (g - w).pow(2).sum().item()
        den += w.pow(2).sum().item()
    return math.sqrt(num) / max(math.sqrt(den), 1e-30)
