"""A compiled graph as generated straight-line Python, the way Inductor's wrapper runs one.

Run as an FX graph, a step pays Python per node: each view op (`view`, `permute`, `t`,
`expand`, `slice`, ...) goes through the dispatcher to make a tensor that is only a new size
and stride, each fused group walks the runner's checks (kernel served? device? dtype?
strides? alignment? output layouts for this shape?) before its launch, and the argument
list holds every input until the graph returns. On an H200 a Llama training step spent
30 us of host time per kernel that way, against Inductor's 9 (bench/NOTES.md, "Host time
per kernel").

Once every group of a graph is routed (runtime.GroupRunner decides kernel or ATen at its
first call), everything the FX graph decides per call is known: shapes and strides (static
graphs only), which kernel each group launches, its output layouts, its launch size. This
module writes one Python function per graph with those facts as constants:

    v3 = reinterpret(v0, (4096, 1024), (1024, 1), 0)         # a view op: no dispatcher
    v5 = empty((4096, 1024), (1024, 1), bf16)                 # a group's output
    launch_2(v3.data_ptr(), v1.data_ptr(), v5.data_ptr(), -1, stream)  # inputs, outputs
    v6 = aten_mm_default(v5, v2)                              # an op left to ATen
    del v3

A kernel that adds into its output (a scatter fragment: Built.zeroed) gets it zeroed after its
allocation (`v5.zero_()`).

Inputs are checked against their traced sizes and strides on entry (what Inductor's
assert_size_stride does); a call that differs runs the FX graph instead. What the check
cannot see is verified once: the first call runs a variant that also checks the layout of
every ATen result a view or a kernel relies on. Pointer alignment, which no trace fixes, is
tested where a kernel reads a graph input, and a misaligned call runs that group's ATen ops.
The argument list is cleared on entry and each value deleted after its last use, so saved
activations are freed as the backward consumes them.

    (first, fast), why_not = generate(gm, device_index, slow)   # or (None, why)
    first(args) -> list: the checked variant, for the first call (first.missed: the ATen
        results it found at another layout than traced and copied; first.keeps_args: it
        does not clear args and raises AssertionError on such a result instead)
    fast(args) -> list: every later call (clears args)"""

import functools
import operator

import torch

from . import runtime
from .shapes import has_plain_layout

_guards = torch._C._dynamo.guards
_reinterpret = getattr(_guards, "_reinterpret_tensor", None)
_empty_cuda = getattr(_guards, "_empty_strided_cuda", None)
_assert_layout = getattr(_guards, "assert_size_stride", None)
_device_guard = getattr(torch.cuda, "_DeviceGuard", None) or torch.cuda.device

# The caching allocator's blocks start at multiples of this many bytes.
_ALLOCATION_ALIGN = 512
# Kernels that need scratch (a split column reduction's partial sums; a cuBLASLt plan's split
# epilogue) share one buffer per call, the largest any of them needs, where each had an
# allocation and a free of its own (87 a ResNet-50 training step, ~4 us of host each). The
# launches run in order on one stream, so one kernel's scratch is free again when the next
# starts. A need above this many bytes keeps its own buffer, freed after its launch.
SHARED_SCRATCH_BYTES = 64 << 20

# Ops that return a view but whose schema does not say so: aot_autograd emits them to hide
# an alias it has already accounted for; eager they are views all the same.
_UNMARKED_VIEWS = {torch.ops.aten._unsafe_view.default}


# ATen ops called through torch's generated Python bindings, where one takes the op's
# positional arguments as they are: an OpOverload's call parses its arguments against the
# schema in Python's stead and costs more (a ResNet-50 convolution on an H200: 18 against 27
# us of host; Inductor's wrapper calls these bindings too).
_BINDINGS = {
    torch.ops.aten.convolution.default: torch.convolution,
    torch.ops.aten.mm.default: torch.mm,
    torch.ops.aten.addmm.default: torch.addmm,
    torch.ops.aten.bmm.default: torch.bmm,
    # what stays ATen between groups: a batch norm's num_batches_tracked + 1 (53 a ResNet-50
    # training step), a pooling mean and its gradient's division
    torch.ops.aten.add.Tensor: torch.add,
    torch.ops.aten.sub.Tensor: torch.sub,
    torch.ops.aten.mul.Tensor: torch.mul,
    torch.ops.aten.div.Tensor: torch.div,
    torch.ops.aten.div.Scalar: torch.div,
    torch.ops.aten.mean.dim: torch.mean,
}


class NotStraight(Exception):
    """Why a graph keeps running as its FX graph."""


def _same_layout(shape_a, stride_a, shape_b, stride_b):
    """Equal sizes, and equal strides wherever the size is above 1 (a stride of a size-1 dim
    addresses nothing)."""
    if tuple(shape_a) != tuple(shape_b):
        return False
    return all(n <= 1 or s == t for n, s, t in zip(shape_a, stride_a, stride_b))


def _lowbit(n):
    """The largest power of two dividing n (n = 0: the allocation alignment)."""
    return n & -n if n else _ALLOCATION_ALIGN


def _returns_alias(target):
    """Whether an op's first result may alias one of its arguments (its schema says so)."""
    schema = getattr(target, "_schema", None)
    if schema is None:
        return True
    return any(r.alias_info is not None for r in schema.returns)


def _is_view(target):
    """A one-tensor view op: reinterpreting its base with the traced size and stride is
    the same tensor it would make."""
    if target in _UNMARKED_VIEWS:
        return True
    schema = getattr(target, "_schema", None)
    if schema is None or len(schema.returns) != 1:
        return False
    ret = schema.returns[0]
    return ret.alias_info is not None and not ret.alias_info.is_write and str(ret.type) == "Tensor"


class _Value:
    """What the generated code knows about one graph value at run time."""

    __slots__ = ("name", "layout_known", "align", "root")

    def __init__(self, name, layout_known, align, root=None):
        self.name = name
        self.layout_known = layout_known  # its size and stride are the traced ones
        self.align = align  # bytes its pointer is known aligned to; None: unknown
        # a view the code never makes (_call): (the input it is a view of, that input's
        # traced storage offset), from which the views of it are made directly
        self.root = root


class _Writer:
    """Generates the function's source and the globals it reads."""

    def __init__(self, gm, device_index):
        self.gm = gm
        self.device_index = device_index
        self.names = {n: f"v{i}" for i, n in enumerate(gm.graph.nodes)}
        self.consts = {}
        self.root_node = {}  # a view never made -> the node its root names
        self.death = None  # _Deaths, set by _generate
        self.copy_any = False  # any checked result may be copied (a backward's: set by _generate)
        self.const_names = {}  # id(obj) -> its name in consts
        self.values = {}
        self.input_checks = []
        self.launches = 0
        self.scratch = None  # (bytes, dtype's name): the call's one scratch buffer, if a kernel needs one

    def const(self, obj, hint="k"):
        """The global name the code reads obj by: one per object (kept alive in consts)."""
        name = self.const_names.get(id(obj))
        if name is None:
            name = self.const_names[id(obj)] = f"{hint}{len(self.consts)}"
            self.consts[name] = obj
        return name

    def tensor(self, a):
        """An expression for value a as a tensor: its name, or for a view the code never made
        (a kernel launch reads it by pointer) a reinterpretation of its root made here."""
        known = self.values[a]
        if known.root is None:
            return known.name
        root, offset = known.root
        val = a.meta["val"]
        return f"reinterpret({root}, {tuple(val.shape)!r}, {tuple(val.stride())!r}, {val.storage_offset() - offset})"

    def pointer(self, a):
        """An expression for the address of value a's first element."""
        known = self.values[a]
        if known.root is None:
            return f"{known.name}.data_ptr()"
        root, offset = known.root
        val = a.meta["val"]
        delta = (val.storage_offset() - offset) * val.element_size()
        return f"{root}.data_ptr() + {delta}" if delta else f"{root}.data_ptr()"

    def literal(self, a):
        if isinstance(a, torch.fx.Node):
            return self.values[a].name
        if isinstance(a, (list, tuple)):
            inner = ", ".join(self.literal(x) for x in a)
            if isinstance(a, tuple):
                return f"({inner},)" if len(a) == 1 else f"({inner})"
            return f"[{inner}]"
        if a is None or isinstance(a, (bool, str)):
            return repr(a)
        if isinstance(a, int):
            return repr(a)
        if isinstance(a, float):
            return repr(a) if a == a and a not in (float("inf"), float("-inf")) else f"float({str(a)!r})"
        if isinstance(a, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            raise NotStraight("a symbolic size (dynamic shapes)")
        return self.const(a)


def _check_line(name, val):
    return f"check({name}, {tuple(val.shape)!r}, {tuple(val.stride())!r})"


class _Check:
    """The first call's check of an ATen result whose layout the code relies on. A result
    that comes back at another layout is copied to the traced one, and the call goes on: the
    first call can then free its inputs as it goes, as every later call does. Where that
    result may alias another value that leaves the graph (a view op's result that is, or has
    a view that is, an output of a forward or inference graph, which aot_autograd may remake
    from its base), a copy would betray the aliasing: a graph with such a check keeps its
    arguments on the first call and runs its FX graph again on a miss. A backward's outputs
    are gradients, which nothing expects to alias anything: there a copy is always right."""

    def __init__(self, name, val, copyable):
        self.name, self.copyable = name, copyable
        self.size, self.stride = tuple(val.shape), tuple(val.stride())

    def line(self, conform):
        if conform:
            return f"{self.name} = conform({self.name}, {self.size!r}, {self.stride!r}, {self.name!r})"
        return f"check({self.name}, {self.size!r}, {self.stride!r})"


def _conform_layout(missed, value, size, stride, name):
    """value, or a copy of it at the traced layout when ATen returned another (noted in missed:
    that graph keeps its FX form after this call)."""
    if value.shape == size and value.stride() == stride:
        return value
    missed.append(f"{name} {tuple(value.shape)} {value.stride()}, traced {size} {stride}")
    if value.shape != size:
        raise RuntimeError(f"fuseml: an ATen result's shape differs from its trace: {missed[-1]}")
    return torch.empty_strided(size, stride, dtype=value.dtype, device=value.device).copy_(value)


def generate(gm, device_index, slow, backward=False):
    """(fn, None) where gm (whose fused groups are calls of their runners, every one routed to
    its kernel) can run as generated code, else (None, why). fn(args) is boxed: it clears
    args. slow(args) runs gm; fn calls it when the inputs' layouts are not the traced ones.
    backward: gm is a backward, whose outputs are gradients that nothing expects to alias
    anything, so any result the first call checks may be copied (_Check)."""
    if None in (_reinterpret, _empty_cuda, _assert_layout):
        return None, "this torch lacks the helpers Inductor's generated code uses"
    try:
        return _generate(gm, device_index, slow, backward), None
    except NotStraight as e:
        return None, str(e)


def _generate(gm, device_index, slow, backward):
    w = _Writer(gm, device_index)
    w.copy_any = backward
    nodes = list(gm.graph.nodes)
    last_use = {}
    for i, n in enumerate(nodes):
        for a in n.all_input_nodes:
            last_use[a] = i
    w.death = _Deaths(last_use)
    unmade = _unmade_views(nodes)
    matters = _layout_matters(nodes)
    placeholders, unused_inputs, body = [], [], []
    output = None
    for i, n in enumerate(nodes):
        name = w.names[n]
        val = n.meta.get("val")
        if n.op == "placeholder":
            placeholders.append(name)
            if n not in last_use:
                unused_inputs.append(name)
            if isinstance(val, torch.Tensor):
                if not has_plain_layout(val):
                    raise NotStraight("a symbolic size (dynamic shapes)")
                w.input_checks.append(_check_line(name, val))
            elif isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool)):
                raise NotStraight("a symbolic input (dynamic shapes)")
            w.values[n] = _Value(name, isinstance(val, torch.Tensor), None)
        elif n.op == "get_attr":
            obj = gm
            for part in n.target.split("."):
                obj = getattr(obj, part)
            # a tensor held by the graph (a folded constant): its layout and pointer are fixed
            fixed = (
                isinstance(obj, torch.Tensor)
                and isinstance(val, torch.Tensor)
                and has_plain_layout(val)
                and tuple(obj.shape) == tuple(val.shape)
                and tuple(obj.stride()) == tuple(val.stride())
            )
            w.values[n] = _Value(w.const(obj, "c"), fixed, _lowbit(obj.data_ptr()) if fixed else None)
        elif n.op == "call_function":
            body += _call(w, n, name, val, matters, unmade)
        elif n.op == "output":
            output = n
            break
        else:
            raise NotStraight(f"a {n.op} node")
        # free each value after its last use (a constant is a global: never deleted; a view
        # never made has no name)
        dead = [
            w.values[a].name
            for a in w.death.at(i)
            if a in w.values and a.op in ("placeholder", "call_function") and w.values[a].root is None
        ]
        if dead:
            body.append("del " + ", ".join(dead))
    if output is None:
        raise NotStraight("no output node")
    results = output.args[0]
    ret = w.literal(list(results) if isinstance(results, (list, tuple)) else [results])

    # the first call keeps its arguments only where a checked result may alias an output (_Check)
    conform = all(line.copyable for line in body if isinstance(line, _Check))

    def source(first_call):
        out = ["def call(args):"]
        if placeholders:
            out.append(f"    {', '.join(placeholders)}{',' if len(placeholders) == 1 else ''} = args")
        if w.input_checks:
            out.append("    try:")
            out += [f"        {c}" for c in w.input_checks]
            out.append("    except AssertionError:")
            out.append("        return slow(args)")
        if not first_call or conform:
            out.append("    args.clear()")
        if unused_inputs:
            out.append(f"    del {', '.join(unused_inputs)}")
        if w.launches:
            out.append(f"    with device_guard({device_index}):")
            out.append(f"        stream = raw_stream({device_index})")
            if w.scratch:  # alive until the call returns: every launch that uses it is queued by then
                out.append(f"        shared_scratch = empty(({w.scratch[0]},), (1,), {w.scratch[1]})")
                out.append("        scratch_p = shared_scratch.data_ptr()")
        else:  # no kernel of ours: nothing needs the device current or its stream
            out.append("    if True:")
        for line in body:
            if isinstance(line, _Check):  # the first call's only
                if first_call:
                    out.append("        " + line.line(conform))
                continue
            out += ["        " + part for part in line.split("\n")]
        if w.launches:  # the launch count tests and explain() read (runtime.counters)
            out.append(f"        counters['launches'] += {w.launches}")
        out.append(f"        return {ret}")
        return "\n".join(out) + "\n"

    env = dict(w.consts)
    env.update(
        check=_assert_layout,
        reinterpret=_reinterpret,
        empty=_empty_cuda,
        device_guard=_device_guard,
        raw_stream=runtime._raw_stream,
        slow=slow,
        counters=runtime.counters,
    )
    fns = []
    for first_call in (True, False):
        src = source(first_call)
        scope = dict(env)
        missed = []
        scope["conform"] = functools.partial(_conform_layout, missed)
        exec(compile(src, "<fuseml straight line>", "exec"), scope)
        scope["call"].source = src
        scope["call"].keeps_args = first_call and not conform
        scope["call"].missed = missed
        fns.append(scope["call"])
    return fns[0], fns[1]


def _layout_matters(nodes):
    """The values whose run-time layout the generated code relies on: those a view is taken
    of (reinterpreted from the traced layout) and those a kernel reads."""
    out = set()
    for n in nodes:
        if n.op != "call_function":
            continue
        if _runner_of(n) is not None:
            out.update(n.all_input_nodes)
        elif (_is_view(n.target) or n.target in _SPLITS) and n.args and isinstance(n.args[0], torch.fx.Node):
            out.add(n.args[0])
    return out


def _unmade_views(nodes):
    """The views the code never makes: every reader is a kernel launch (which reads the
    root's pointer plus the view's offset) or a view of it that _call reinterprets from the
    root directly. A view costs ~1 us of host and a tensor object for the garbage collector
    to count: batch norm's per-channel parameters seen through three unsqueezes and a
    permute, a kernel's input seen through a reshape, ~500 a ResNet-50 inference step. _call
    still makes one whose base has no known layout."""
    out = set()
    for n in nodes:
        if n.op != "call_function" or not _is_view(n.target) or not n.args or not isinstance(n.args[0], torch.fx.Node):
            continue
        val, bval = n.meta.get("val"), n.args[0].meta.get("val")
        if not (has_plain_layout(val) and has_plain_layout(bval) and val.dtype == bval.dtype):
            continue
        if n.users and all(_runner_of(u) is not None or _reinterpreted_view_of(u, n) for u in n.users):
            out.add(n)
    return out


def _reinterpreted_view_of(u, n):
    """Is u a view of n alone, of the same dtype and a plain layout (made by reinterpreting)?"""
    return (
        u.op == "call_function"
        and _is_view(u.target)
        and u.args
        and u.args[0] is n
        and len(u.all_input_nodes) == 1
        and has_plain_layout(u.meta.get("val"))
        and u.meta["val"].dtype == n.meta["val"].dtype
    )


class _Deaths:
    """When each value is deleted: after its last reader, or, for the root of views never
    made, after the last reader of any of them (extended as each such view is written)."""

    def __init__(self, last_use):
        self.when = dict(last_use)
        self.by_index = {}
        for a, i in last_use.items():
            self.by_index.setdefault(i, set()).add(a)

    def extend(self, root, view):
        """root (a node) lives as long as view, which is read through it."""
        i, j = self.when.get(root), self.when.get(view)
        if j is None or (i is not None and i >= j):
            return
        if i is not None:
            self.by_index[i].discard(root)
        self.when[root] = j
        self.by_index.setdefault(j, set()).add(root)

    def at(self, i):
        """The values deleted after node i, in a fixed order (by name)."""
        return sorted(self.by_index.get(i, ()), key=lambda a: a.name)


def _runner_of(n):
    runner = getattr(n.target, "__self__", None)
    return runner if isinstance(runner, runtime.GroupRunner) else None


# Ops whose results (a list) are views of their first operand, read through getitem: made
# by reinterpreting the operand, not through the dispatcher (GPT-2's QKV projection split in
# three: 29 us of host each on an H200's host).
_SPLITS = {torch.ops.aten.split.Tensor, torch.ops.aten.split_with_sizes.default, torch.ops.aten.unbind.int}


def _split_base(w, n):
    """(root name, root's traced offset) when node n is a split of a value whose layout the
    code knows, else None."""
    if n.op != "call_function" or n.target not in _SPLITS or not isinstance(n.args[0], torch.fx.Node):
        return None
    base = n.args[0]
    known, bval = w.values.get(base), base.meta.get("val")
    if known is None or not known.layout_known or not has_plain_layout(bval):
        return None
    parts = n.meta.get("val")
    if not isinstance(parts, (list, tuple)) or not all(has_plain_layout(p) and p.dtype == bval.dtype for p in parts):
        return None
    return known.root or (known.name, bval.storage_offset())


def _call(w, n, name, val, matters, unmade):
    runner = _runner_of(n)
    if runner is not None:
        return _launch(w, n, runner)
    split = _split_base(w, n)
    if split is not None:  # no statement: each getitem reinterprets the root
        w.values[n] = _Value(name, False, None, split)
        w.root_node[n] = w.root_node.get(n.args[0], n.args[0])
        w.death.extend(w.root_node[n], n)
        return []
    if n.target is operator.getitem and isinstance(n.args[0], torch.fx.Node) and n.args[0] in w.root_node:
        src = w.values.get(n.args[0])
        if src is not None and not src.layout_known and src.root is not None:  # a part of a split
            root, offset = src.root
            delta = val.storage_offset() - offset
            w.values[n] = _Value(name, True, None)
            return [f"{name} = reinterpret({root}, {tuple(val.shape)!r}, {tuple(val.stride())!r}, {delta})"]
    if n.target is operator.getitem and isinstance(n.args[0], torch.fx.Node) and _runner_of(n.args[0]) is not None:
        if n not in w.values:
            raise NotStraight("an output of a group read before its launch")
        return []
    if _is_view(n.target) and has_plain_layout(val) and n.args and isinstance(n.args[0], torch.fx.Node):
        base = n.args[0]
        bval = base.meta.get("val")
        known = w.values[base]
        if known.layout_known and has_plain_layout(bval) and bval.dtype == val.dtype:
            root, offset = known.root or (known.name, bval.storage_offset())
            delta = val.storage_offset() - offset
            align = None if known.align is None else min(known.align, _lowbit(delta * val.element_size()))
            if n in unmade:  # read by pointer, or through views made from its root
                w.values[n] = _Value(name, True, align, (root, offset))
                w.root_node[n] = w.root_node.get(base, base)
                w.death.extend(w.root_node[n], n)
                return []
            w.values[n] = _Value(name, True, align)
            return [f"{name} = reinterpret({root}, {tuple(val.shape)!r}, {tuple(val.stride())!r}, {delta})"]
    args = ", ".join([w.literal(a) for a in n.args] + [f"{k}={w.literal(v)}" for k, v in n.kwargs.items()])
    fn = w.const(_BINDINGS.get(n.target, n.target) if not n.kwargs else n.target, "f")
    fresh = has_plain_layout(val) and not _returns_alias(n.target)
    if n.target is operator.getitem:
        src = n.args[0]
        fresh = (
            has_plain_layout(val)
            and isinstance(src, torch.fx.Node)
            and src.op == "call_function"
            and not _returns_alias(src.target)
        )
    align = _lowbit(val.storage_offset() * val.element_size()) if fresh else None
    w.values[n] = _Value(name, has_plain_layout(val), align)
    lines = [f"{name} = {fn}({args})"]
    if n in matters and has_plain_layout(val):
        lines.append(_Check(name, val, fresh or w.copy_any or not _output_through_views(n)))
    return lines


def _output_through_views(n):
    """Whether n, or a view of it (of a view...), is an output of its graph: the values whose
    storage a caller may rely on (aot_autograd remakes an output that aliases an input from
    its base), which a copy to another buffer would betray."""
    todo, seen = [n], set()
    while todo:
        x = todo.pop()
        if x in seen:
            continue
        seen.add(x)
        for u in x.users:
            if u.op == "output":
                return True
            if u.op == "call_function" and (_returns_alias(u.target) or u.target is operator.getitem):
                todo.append(u)
    return False


def _launch(w, n, runner):
    """The lines of one fused group: its outputs allocated, its kernel launched (its ATen ops
    instead when a graph input arrives less aligned than the kernel needs)."""
    if runner.kernel is None or runner.use_kernel is not True:
        raise NotStraight(f"{runner.name} is not routed to its kernel")
    b = runner.built
    key = runner.kernel[0]
    mod = runtime._modules.get((key, w.device_index))
    if mod is None:
        raise NotStraight(f"{runner.name}: kernel not loaded")
    xs = n.args[0]
    if b.read is not None:  # a column index the kernel computes is not passed to it
        xs = [xs[j] for j in b.read]
    ptrs, runtime_align = [], []
    for i, x in enumerate(xs):
        if not isinstance(x, torch.fx.Node):
            raise NotStraight(f"{runner.name}: input {i} is not a graph value")
        val, known = x.meta.get("val"), w.values[x]
        if not has_plain_layout(val) or not known.layout_known:
            raise NotStraight(f"{runner.name}: input {i} has no known layout")
        dtype, strides = runner.in_meta[i]
        if val.dtype != dtype:
            raise NotStraight(f"{runner.name}: input {i} is {val.dtype}, the kernel's {dtype}")
        if strides is None or tuple(val.stride()) != strides:
            try:
                runner._check_strides(i, val)
            except runtime._Layout as e:
                raise NotStraight(f"{runner.name}: {e}") from None
        p = w.pointer(x)
        need = b.in_align[i]
        if known.align is None or known.align % need:
            pname = f"{w.names[n]}_p{i}"
            runtime_align.append((pname, p, need - 1))
            p = pname
        ptrs.append(p)
    k = b.layout.k
    if k:
        lead = tuple(xs[b.full_input].meta["val"].shape[:k])
        outer = 1
        for d in lead:
            outer *= d
    else:
        lead, outer = (), -1
    layouts = b.out_fixed or [runner._out_layout(lead, f, tail) for f, tail in zip(b.out_strides, b.out_tails)]
    getitems = {u.args[1]: u for u in n.users if u.target is operator.getitem}
    names = [w.names[getitems[j]] if j in getitems else f"{w.names[n]}_{j}" for j in range(len(layouts))]
    if w.device_index is None:
        raise NotStraight("kernels but no CUDA device")
    w.launches += 1
    flat = getattr(mod, "launch_flat", None)  # the C extension's: the pointers as arguments
    launch = w.const(flat or mod.launch, "launch_")
    R = w.const(runner, "group_")
    alloc, views = [], []
    for j, ((shape, strides), dtype) in enumerate(zip(layouts, runner.out_dtypes)):
        u = getitems.get(j)
        alloc.append(f"{names[j]} = empty({tuple(shape)!r}, {tuple(strides)!r}, {w.const(dtype, 'dt')})")
        if b.zeroed:  # the kernel adds into it (a scatter fragment)
            alloc.append(f"{names[j]}.zero_()")
        final_shape, final_strides = list(shape), list(strides)
        if b.out_views and b.out_views[j]:
            t = torch.empty_strided(shape, strides, dtype=dtype, device="meta").view(b.out_views[j])
            final_shape, final_strides = list(t.shape), list(t.stride())
            views.append(f"{names[j]} = reinterpret({names[j]}, {tuple(final_shape)!r}, {tuple(final_strides)!r}, 0)")
        if u is not None:
            uval = u.meta.get("val")
            same = has_plain_layout(uval) and _same_layout(final_shape, final_strides, uval.shape, uval.stride())
            w.values[u] = _Value(names[j], same, _ALLOCATION_ALIGN)
    outs = [f"{x}.data_ptr()" for x in names]
    scratch = []
    if mod.scratch is not None:
        nbytes = mod.scratch_bytes(outer)
        if nbytes <= SHARED_SCRATCH_BYTES:  # the call's one buffer (see SHARED_SCRATCH_BYTES)
            w.scratch = (max(nbytes, w.scratch[0] if w.scratch else 0), w.const(torch.uint8, "dt"))
            outs.append("scratch_p")
        else:
            scratch = [f"scratch = empty(({nbytes},), (1,), {w.const(torch.uint8, 'dt')})"]
            outs.append("scratch.data_ptr()")
    tup = lambda xs: f"({', '.join(xs)},)" if len(xs) == 1 else f"({', '.join(xs)})"  # noqa: E731
    call = (
        f"{launch}({', '.join(ptrs + outs)}, {outer}, stream)"
        if flat
        else f"{launch}({tup(ptrs)}, {tup(outs)}, {outer}, stream)"
    )
    launch_lines = alloc + scratch + [call] + views
    if scratch:
        launch_lines.append("del scratch")
    unused = [names[j] for j in range(len(names)) if j not in getitems]
    if unused:
        launch_lines.append("del " + ", ".join(unused))
    if not runtime_align:
        return launch_lines
    # A graph input (or a view of one) the kernel reads: its alignment is the caller's.
    eager_outs = ", ".join(names) + ("," if len(names) == 1 else "")
    xs_src = "[" + ", ".join(w.tensor(x) for x in xs) + "]"
    test = " or ".join(f"{pn} & {mask}" for pn, _, mask in runtime_align)
    lines = [f"{pn} = {p}" for pn, p, _ in runtime_align]
    lines.append(f"if {test}:")
    lines.append(f"    {eager_outs} = {R}.eager({xs_src})")
    lines.append("    counters['launches'] -= 1")
    if unused:
        lines.append("    del " + ", ".join(unused))
    lines.append("else:")
    lines += ["    " + x for x in launch_lines]
    return ["\n".join(lines)]
