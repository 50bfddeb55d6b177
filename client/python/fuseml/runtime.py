"""Running a fused group: the custom op `fuseml::group` that the rewritten graph calls, and
the runner behind it, which launches the served kernel or runs the group's ATen ops.

Launch needs: CUDA tensors on one device, a kernel verified on the GPU by the daemon (state
"tuned", or "verified": served before its background tune, which upgrade.py picks up; any
other state only with FUSEML_ALLOW_UNTUNED=1, a testing aid), libfusemld, and inputs with the
strides and alignment the fragment was built for. Anything else runs the ATen ops, with one
warning per cause."""

import torch

from . import launcher, ops, routes, scatter_fragment, settings
from ._log import log, warn_once
from .bmm_fragment import collapse
from .partition import served

_registry = {}
_next_gid = [0]
_modules = {}  # (key, device index) -> launcher.Module: one load per process and device
VERIFIED_STATES = ("tuned", "verified")  # checked against the reference on the GPU by the daemon
counters = {"launches": 0, "eager": 0, "module_loads": 0, "routes_recalled": 0}  # for tests and explain()

_lib = torch.library.Library("fuseml", "DEF")
_lib.define("group(int gid, Tensor[] xs) -> Tensor[]")


def _group_impl(gid, xs):
    return _registry[gid].run(xs)


def _group_fake(gid, xs):
    return _registry[gid].fake(xs)


_lib.impl("group", _group_impl, "CompositeExplicitAutograd")
torch.library.register_fake("fuseml::group", _group_fake, lib=_lib)


# GPU cycles of the spin queued ahead of each timed run (~0.2 ms): longer than the host takes
# to issue one run of a group's ATen ops, so the events time the kernels back to back.
_SPIN_CYCLES = 400_000


def _median_ms(fn, reps, stream):
    """Median GPU milliseconds of fn. Each run is queued behind a short spin kernel: timed
    from an idle GPU, the events would also count the host issuing the launches (three ATen
    ops cost three Python launches, our kernel one), which a CUDA-graph replay does not pay,
    and a kernel twice as slow as cuBLAS on the GPU could win the routing on a slow host."""
    spin = getattr(torch.cuda, "_sleep", None)
    times = []
    for _ in range(reps):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        if spin is not None:
            spin(_SPIN_CYCLES)
        start.record(stream)
        fn()
        end.record(stream)
        times.append((start, end))
    torch.cuda.synchronize()
    ms = sorted(s.elapsed_time(e) for s, e in times)
    return ms[len(ms) // 2]


def _val_reads(a, out):
    """Collects the ("val", j) references in an ATen step's operand (as _operand reads them)."""
    if isinstance(a, tuple) and len(a) == 2 and a[0] == "val" and isinstance(a[1], int):
        out.append(a[1])
    elif isinstance(a, (list, tuple)):
        for x in a:
            _val_reads(x, out)
    return out


def _drops(steps, out_slots):
    """For each ATen step of a group, the values read there for the last time (never its
    outputs): eager() lets go of them after the step, so a group run as ATen holds its live
    values only, as the FX graph would, not every intermediate until it returns. Measured
    routing times a group's ATen ops at the first step, beside every activation: holding all
    of them, a ResNet-50 training step's first call peaked 1.9 GB above its later steps."""
    last = list(range(len(steps)))  # a value never read is dropped at once
    for i, (_, args, kwargs) in enumerate(steps):
        for j in _val_reads(list(args) + list(kwargs.values()), []):
            last[j] = i
    keep = set(out_slots)
    drops = [[] for _ in steps]
    for j, i in enumerate(last):
        if j not in keep:
            drops[i].append(j)
    return drops


def _operand(a, xs, vals):
    """An ATen step's operand: ("in", i) the group's input i, ("val", j) step j's value, a
    list of those (a cat's operands), anything else itself. A function of the module, not a
    closure in eager(): a closure that calls itself is a reference cycle holding every value
    of the call, so each call's intermediates (gigabytes over a cross-entropy's logits) would
    live until the cycle collector ran, and measured routing's seven timed calls of a group
    all at once (32.9 GB at the first step of a Llama d1024 on an H200, whose later steps
    peak at 1.43 GB)."""
    if isinstance(a, tuple) and len(a) == 2 and a[0] in ("in", "val") and isinstance(a[1], int):
        return xs[a[1]] if a[0] == "in" else vals[a[1]]
    if isinstance(a, list):  # a cat's operands
        return [_operand(x, xs, vals) for x in a]
    return a


# Measured routing does not time a group's ATen ops when they would write ATEN_HEAVY_BYTES
# more than its kernel reads and writes, and ATEN_HEAVY_RATIO times as much: a pointwise or
# rows kernel moving a fraction of the bytes wins anyway, and the timed ATen calls would
# allocate every intermediate at the first step (a cross-entropy group over a Llama's fp32
# logits: 3.8 GB for one call, where the step itself peaks at 1.4 GB; over T5's decoder
# logits, 0.43 GB alive at once, which took its first step 0.3 GB above a later one's).
ATEN_HEAVY_BYTES = 256 << 20
ATEN_HEAVY_RATIO = 4


def _static_bytes(nodes):
    """Bytes of the nodes' values when every shape is static, else None."""
    total = 0
    for n in nodes:
        v = n.meta.get("val")
        if not isinstance(v, torch.Tensor) or not all(isinstance(d, int) for d in v.shape):
            return None
        total += v.numel() * v.element_size()
    return total


def _aten_heavy(group, built):
    """The bytes a group's ATen ops would write when measured routing should not time them
    (above; never a GEMM group, whose kernel can lose to cuBLAS whatever the bytes), else None."""
    if built is None or built.gemm:
        return None
    written = _static_bytes([n for n in group.members if n.target not in ops.VIEW_OPS])
    moved = _static_bytes(list(built.in_nodes) + list(built.out_nodes))
    if written is None or moved is None:
        return None
    if written - moved < ATEN_HEAVY_BYTES or written < ATEN_HEAVY_RATIO * moved:
        return None
    return written


class GroupRunner:
    def __init__(self, group):
        self.name = f"group {group.gid} ({' -> '.join(group.op_names)})"
        index = {n: i for i, n in enumerate(group.inputs)}
        # The ATen program: each step (target, args, kwargs) with operands as ("in", i) or
        # ("val", j) references, run by eager().
        slot = {}
        self.steps = []

        def ref(a):
            if isinstance(a, torch.fx.Node):
                return ("val", slot[a]) if a in slot else ("in", index[a])
            return a

        for j, n in enumerate(group.members):
            self.steps.append(
                (
                    n.target,
                    tuple(torch.fx.node.map_aggregate(n.args, ref)),
                    dict(torch.fx.node.map_aggregate(n.kwargs, ref)),
                )
            )
            slot[n] = j
        self.out_slots = [slot[n] for n in group.outputs]
        self.drops = _drops(self.steps, self.out_slots)
        self.kernel = None  # (key, state, cubin, meta) once the daemon served one
        self.why_eager = None  # (cause, message) when there is no kernel to launch
        b = group.built
        self.built = b
        if b is not None:
            self.in_meta = [
                (
                    n.meta["val"].dtype,
                    tuple(n.meta["val"].stride()) if all(isinstance(s, int) for s in n.meta["val"].stride()) else None,
                )
                for n in b.in_nodes
            ]
            self.out_dtypes = [n.meta["val"].dtype for n in b.out_nodes]
        self._out_layouts = {}  # lead dims -> [(shape, strides)] per output: once per shape
        self.group = group
        # Inductor compiles a graph against the strides a custom op's fake returns and asserts
        # them at every call: there every call returns the kernel's layout, whichever route ran
        # (set by the backend for the groups it gives Inductor; fake(), run())
        self.fixed_layout = False
        self.aten_heavy = _aten_heavy(group, b)  # bytes when ATen is not timed, else None
        self.use_kernel = None  # measured routing: None until the first launch decides
        self.timing = None  # (kernel ms, ATen ms) of that decision
        self.decided_on = None  # (inputs' layouts, GPU) it was made for: upgrade.swap's key
        gid = _next_gid[0]
        _next_gid[0] += 1
        self.gid = gid
        _registry[gid] = self

    def eager(self, xs):
        counters["eager"] += 1
        vals = []
        for (target, args, kwargs), drops in zip(self.steps, self.drops):
            args = tuple(_operand(a, xs, vals) for a in args)
            kwargs = {k: _operand(v, xs, vals) for k, v in kwargs.items()}
            vals.append(target(*args, **kwargs))
            for j in drops:
                vals[j] = None
        return [vals[j] for j in self.out_slots]

    def fake(self, xs):
        """The outputs' metadata for tracing: the ATen ops' on fake tensors, in the kernel's
        layout where the layout is fixed (above)."""
        outs = self.eager(xs)
        if not self.fixed_layout or self.built is None:
            return outs
        layouts = self._kernel_layouts(xs, False)
        return self._views([o.new_empty_strided(*lay) for lay, o in zip(layouts, outs)])

    def run(self, xs):
        if self.kernel is None:
            if self.why_eager:
                warn_once(*self.why_eager)
            return self._aten(xs)
        dev = xs[0].device if xs else None
        if dev is None or dev.type != "cuda":
            warn_once("cpu", "%s: tensors on %s, kernels run on CUDA only", self.name, dev)
            return self._aten(xs)
        key, state, cubin, meta = self.kernel
        if state not in VERIFIED_STATES and not settings.allow_untuned():
            warn_once("untuned", "kernel %s is %s (not verified on a GPU yet)", key[:12], state)
            self._never()
            return self._aten(xs)
        try:
            if self.use_kernel is None:
                outs = self._decide(xs, dev, key, cubin, meta)
                if outs is not None:
                    return outs
            if not self.use_kernel:
                return self._aten(xs)
            return self._launch(xs, dev, key, cubin, meta)
        except _Layout as e:
            warn_once("layout", "%s: %s", self.name, e)
            self._never()
        except RuntimeError as e:
            warn_once("launch", "%s: %s", self.name, e)
            self._never()
        return self._aten(xs)

    def _aten(self, xs):
        """The ATen ops' outputs for the call, in the kernel's layout where it is fixed (a
        copy where they differ)."""
        outs = self.eager(xs)
        if not self.fixed_layout or self.built is None:
            return outs
        want = [torch.empty_strided(*lay, device="meta") for lay in self._kernel_layouts(xs, True)]
        want = [w.stride() for w in self._views(want)]
        return [o if o.stride() == w else o.new_empty_strided(o.shape, w).copy_(o) for o, w in zip(outs, want)]

    def _never(self):
        """The first call could not launch the kernel (its state, a layout, a failed launch):
        the group is routed to its ATen ops, so the graph's routing is settled (and it can be
        generated) rather than retried at every call. A group already routed to its kernel
        keeps it: one call's odd input runs ATen for that call only."""
        if self.use_kernel is None:
            self.use_kernel = False

    def _decide(self, xs, dev, key, cubin, meta):
        """Measured routing, once per group: the kernel and the ATen ops it replaces, timed on
        these inputs (median of a few runs each); the slower one is never run again. A decision
        an earlier process made for the same kernel, ops, inputs and GPU is taken instead of
        timing again (routes.py). Skipped (kernel chosen) in FUSEML_ROUTE=kernel mode, while a
        CUDA graph is captured, where timing is impossible, and where the ATen ops would write
        far more than the kernel moves (ATEN_HEAVY_BYTES). Returns the outputs of the route
        taken. The kernel's first outputs are dropped before the ATen ops run, and the winner
        runs once more for the call's results where it was timed: at most one set of the group's outputs is alive
        at a time, so measuring costs the first step no more memory than a later one (the
        cross-entropy gradient's group writes 0.25 GB in BERT)."""
        launched = counters["launches"]
        outs = self._launch(xs, dev, key, cubin, meta)  # a failure raises before any decision
        stream = torch.cuda.current_stream(dev)
        if settings.route() == "kernel" or torch.cuda.is_current_stream_capturing():
            self.use_kernel = True
            return outs
        if self.aten_heavy is not None:
            self.use_kernel = True
            served(self.group, self.kernel or (key, None)).route_measured = ("kernel", None, None)
            log.info(
                "fuseml: %s: kernel, ATen not timed (its ops would write %.2f GB)", self.name, self.aten_heavy / 1e9
            )
            return outs
        self.decided_on = (routes.layouts(xs), routes.gpu_identity(dev))
        sig = routes.signature(cubin, self.steps, *self.decided_on)
        known = routes.recall(sig)
        if known is not None:
            route, k_ms, e_ms = known
            counters["routes_recalled"] += 1
        else:
            outs = None
            counters["launches"] = launched  # a trial run, as the timed ones: not the call's launch
            saved = counters["launches"], counters["eager"]
            self.eager(xs)  # untimed: a first ATen call of a shape may set up cuBLAS or allocate
            k_ms = _median_ms(lambda: self._launch(xs, dev, key, cubin, meta), 7, stream)
            e_ms = _median_ms(lambda: self.eager(xs), 7, stream)
            counters["launches"], counters["eager"] = saved
            route = "kernel" if k_ms <= e_ms else "aten"
            routes.remember(sig, route, k_ms, e_ms)
        self.timing = (k_ms, e_ms)
        self.use_kernel = route == "kernel"
        served(self.group, self.kernel or (key, None)).route_measured = (route, k_ms, e_ms)
        log.info(
            "fuseml: %s: kernel %.4f ms, ATen %.4f ms%s: %s",
            self.name,
            k_ms,
            e_ms,
            " (remembered)" if known is not None else "",
            "kernel" if self.use_kernel else "ATen (the kernel is slower here)",
        )
        if not self.use_kernel:
            outs = None  # gone before the ATen ops allocate theirs
            counters["launches"] = launched
            return self._aten(xs)
        return outs if outs is not None else self._launch(xs, dev, key, cubin, meta)

    def _launch(self, xs, dev, key, cubin, meta):
        b = self.built
        idx = dev.index if dev.index is not None else torch.cuda.current_device()
        mod = _modules.get((key, idx))
        if mod is None:
            if torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing():
                # cuModuleLoadData is not a stream operation: never inside a capture (the
                # CUDA-graph trees warm each graph up first, so this is a capture without one)
                raise _Layout("kernel not loaded before CUDA graph capture")
            mod = load_module(key, idx, cubin, meta)
        k = b.layout.k
        ptrs = []
        if b.read is not None:  # a column index the kernel computes is not passed to it
            xs = [xs[j] for j in b.read]
        for i, x in enumerate(xs):
            dtype, strides = self.in_meta[i]
            if x.device != dev or x.dtype != dtype:
                raise _Layout(f"input {i} is {x.dtype} on {x.device}")
            if strides is None or x.stride() != strides:
                self._check_strides(i, x)
            p = x.data_ptr()
            if p % b.in_align[i]:
                raise _Layout(f"input {i} is not aligned to {b.in_align[i]} bytes")
            ptrs.append(p)
        outer = -1
        if k:
            outer = 1
            for d in xs[b.full_input].shape[:k]:
                outer *= d
        layouts = self._kernel_layouts(xs, True, read=True)
        stream = _raw_stream(idx)
        outs = [
            torch.empty_strided(shape, strides, dtype=dt, device=dev)
            for (shape, strides), dt in zip(layouts, self.out_dtypes)
        ]
        if b.zeroed:  # the kernel adds into them (a scatter fragment)
            for o in outs:
                o.zero_()
        out_ptrs = [o.data_ptr() for o in outs]
        if mod.scratch is not None:
            # a cuBLASLt plan's workspace (+ product): from torch's allocator on this stream, so
            # freeing it after the launch is safe and a CUDA graph captures it like any tensor
            scratch = torch.empty(mod.scratch_bytes(outer), dtype=torch.uint8, device=dev)
            out_ptrs.append(scratch.data_ptr())
        mod.launch(ptrs, out_ptrs, outer, stream)
        counters["launches"] += 1
        return self._views(outs)

    def _kernel_layouts(self, xs, cached, read=False):
        """(shape, strides) of each output the kernel writes for the group's inputs xs (the
        kernel's own, `read`) before its views; `cached`: from the per-shape cache (real
        sizes; fake ones may be symbols)."""
        b = self.built
        if b.out_fixed:
            return b.out_fixed
        if b.read is not None and not read:  # a column index the kernel computes is not passed to it
            xs = [xs[j] for j in b.read]
        k = b.layout.k
        lead = tuple(xs[b.full_input].shape[:k]) if k else ()
        layouts = self._out_layouts.get(lead) if cached else None
        if layouts is None:
            layouts = [self._out_layout(lead, f, tail) for f, tail in zip(b.out_strides, b.out_tails)]
            if cached:
                if len(self._out_layouts) >= 64:  # dynamic shapes: keep the cache bounded
                    self._out_layouts.clear()
                self._out_layouts[lead] = layouts
        return layouts

    def _views(self, outs):
        """The kernel's outputs as the group returns them (its out_views)."""
        views = self.built.out_views or [None] * len(outs)
        return [o.view(v) if v else o for o, v in zip(outs, views)]

    def _out_layout(self, lead, fstrides, static):
        k = self.built.layout.k
        if not k:
            return static, [s if d > 1 else _dense(static, i) for i, (d, s) in enumerate(zip(static, fstrides))]
        tail = [s if d > 1 else _dense(static, i) for i, (d, s) in enumerate(zip(static, fstrides[1:]))]
        lead_strides = [0] * k
        lead_strides[k - 1] = fstrides[0]
        for i in range(k - 2, -1, -1):
            lead_strides[i] = lead_strides[i + 1] * lead[i + 1]
        return list(lead) + static, lead_strides + tail

    def _check_strides(self, i, x):
        """The slow path when x's strides differ from the traced ones: still launchable if
        every dim the kernel reads with a stride has the fragment's stride."""
        b = self.built
        spec = b.wire["inputs"][i]
        k = b.layout.k
        size, stride = list(x.shape), list(x.stride())
        if b.in_splits is not None:  # a scatter fragment reads its inputs flattened
            if scatter_fragment.flat(size, stride, b.in_splits[i]) != (spec["shape"], spec["strides"]):
                raise _Layout(f"input {i} is not read as {spec['shape']} by strides {spec['strides']}")
            return
        if b.gemm:  # every dim of a GEMM fragment's input is one the kernel strides
            ranks = b.in_ranks
            if ranks:  # a batched GEMM: the input's batch dims collapse as when it was built
                try:
                    size, stride = collapse(size, stride, ranks[i])
                except ValueError as e:
                    raise _Layout(f"input {i}: {e}") from None
            if len(size) != len(spec["shape"]):
                raise _Layout(f"input {i} has rank {len(size)}")
            for d, (s, want_n, want_s) in enumerate(zip(stride, spec["shape"], spec["strides"])):
                if want_n != 1 and size[d] > 1 and s != want_s:
                    raise _Layout(f"input {i} has stride {s} in dim {d}, the kernel {want_s}")
            return
        r = len(b.layout.shape)
        size = [1] * (r - len(size)) + size
        stride = [0] * (r - len(stride)) + stride
        if k:
            if spec["shape"][0] == -1:
                for d in range(k - 1):
                    if size[d + 1] > 1 and stride[d] != stride[d + 1] * size[d + 1]:
                        raise _Layout(f"input {i} is not dense across dims 0..{k - 1}")
                if stride[k - 1] != spec["strides"][0] and size[k - 1] > 1:
                    raise _Layout(f"input {i} has stride {stride[k - 1]} in dim {k - 1}")
            size, stride = size[k - 1 :], stride[k - 1 :]
            size, stride = size[1:], stride[1:]
            fs, fst = spec["shape"][1:], spec["strides"][1:]
        else:
            fs, fst = spec["shape"], spec["strides"]
        for d, (n, s, want_n, want_s) in enumerate(zip(size, stride, fs, fst)):
            if want_n > 1 and s != want_s:
                raise _Layout(f"input {i} has stride {s} in dim {d + k}, the kernel {want_s}")


def _raw_stream(idx):
    """The current stream's handle on device idx: torch's private fast path (what Inductor's
    generated code calls) when present, else the public one (a few microseconds more)."""
    try:
        return torch._C._cuda_getCurrentRawStream(idx)
    except AttributeError:
        return torch.cuda.current_stream(idx).cuda_stream


def _dense(shape, i):
    s = 1
    for d in shape[i + 1 :]:
        s *= d
    return s


def load_module(key, device_index, cubin, meta):
    """Loads kernel `key` on CUDA device `device_index` (replacing any module cached for it)
    and returns it. Never while a CUDA graph is being captured: cuModuleLoadData is not a
    stream operation."""
    with torch.cuda.device(device_index):
        torch.cuda.current_stream(device_index)  # makes torch's context current on this thread
        mod = _modules[(key, device_index)] = launcher.Module(cubin, meta)
    counters["module_loads"] += 1
    return mod


class _Layout(Exception):
    pass
