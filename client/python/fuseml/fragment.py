"""A group of FX nodes -> a fragment in wire form (protocol/PROTOCOL.md), plus the layout the
runtime needs to launch it (which input gives the symbolic sizes, the output strides).

Shapes come from the fake-tensor metadata. Leading symbolic dims ([s0, s1, 4096] when both
batch and sequence are dynamic) are collapsed into the one symbolic dim 0 the protocol has,
which is exact when every tensor is either dense across them or broadcast over all of them."""

import operator

import torch
from torch.fx.experimental.symbolic_shapes import statically_known_true

from .ops import (
    DTYPES,
    LOGICAL_REDUCTIONS,
    POINTWISE,
    cat_dim,
    column_reduction,
    dtype_name,
    is_integer_node,
    row_reduction,
    take_rows,
    window_op,
)
from .shapes import is_known_int, known_equal
from . import column_index

VOCAB = 1
VOCAB_ROWS = 2
VOCAB_COLUMNS = 5
VOCAB_CAT = 6
VOCAB_WINDOW = 7
VOCAB_SCATTER = 8  # scatter_fragment.py
VOCAB_GATHER = 9  # take_rows: rows read at an index
VOCAB_INTEGER = 10  # integer values: int64 tensors read, computed and stored
VOCAB_IOTA = 11  # the column index computed in the kernel (column_index.py)


class Unfusable(Exception):
    """The group cannot be spelled as a fragment; the message says why."""


_RANK = {"bool": 0, "f16": 1, "bf16": 1, "f32": 2}


def _promote(a, b):
    """The protocol's promotion (dtype names; "const" is a weak f32 scalar). An i64 value
    meets only integers (ops.why_not_pointwise) and stays i64."""
    if "i64" in (a, b):
        return "i64"
    if a == "const" and b == "const":
        return "f32"
    if a == "const":
        return "f32" if b == "bool" else b
    if b == "const":
        return "f32" if a == "bool" else a
    if a == b:
        return "f32" if a == "bool" else a
    if a == "bool":
        return b
    if b == "bool":
        return a
    return "f32"  # bf16 with f16, or anything with f32


_COMPARE = {"gt", "ge", "lt", "le", "eq", "ne"}


class Emitter:
    """Builds the ops of one fragment. Value ids: inputs 0..n-1 are assigned when the group's
    inputs are known; ops take the ids after them."""

    def __init__(self, inputs):
        self.ops = []
        self.dtype = {}
        self.ids = {}
        self.next_id = 0
        for node in inputs:
            self.ids[node] = self.next_id
            self.dtype[self.next_id] = dtype_name(node.meta["val"].dtype)
            self.next_id += 1

    def _new(self, dtype):
        vid = self.next_id
        self.next_id += 1
        self.dtype[vid] = dtype
        return vid

    def const(self, value):
        if isinstance(value, bool):
            value = float(value)
        vid = self._new("const")
        self.ops.append({"op": "const", "out": vid, "args": [], "value": float(value)})
        return vid

    def arg(self, x):
        if isinstance(x, torch.fx.Node):
            return self.ids[x]
        return self.const(x)

    def iota(self, dtype, start):
        """The element's column (vocabulary 11), plus start."""
        vid = self._new(dtype)
        self.ops.append({"op": "iota", "out": vid, "args": [], "dtype": dtype})
        return self.op("add", vid, self.const(start)) if start else vid

    def cast(self, vid, dtype):
        if self.dtype[vid] == dtype:
            return vid
        out = self._new(dtype)
        self.ops.append({"op": "cast", "out": out, "args": [vid], "dtype": dtype})
        return out

    def op(self, name, *args):
        args = list(args)
        dts = [self.dtype[a] for a in args]
        if name in _COMPARE:
            dtype = "bool"
        elif name == "where":
            if dts[0] != "bool":
                args[0] = self.cast(args[0], "bool")
            dtype = _promote(dts[1], dts[2])
        elif len(args) == 2:
            dtype = "f32" if name == "div" and "i64" in dts else _promote(dts[0], dts[1])
        else:
            if dts[0] == "bool":  # unary ops refuse bool operands: widen first, as torch does
                args[0] = self.cast(args[0], "f32")
            dtype = "f32" if dts[0] in ("const", "bool") else dts[0]
        out = self._new(dtype)
        self.ops.append({"op": name, "out": out, "args": args})
        return out

    def reduce(self, name, vid, correction, dim=-1):
        """A reduction with keepdim, of the last dim (vocabulary 2) or of dim 0 of a 2-D
        value (vocabulary 5); the result keeps the dtype, but all/any's (ops.LOGICAL_REDUCTIONS)
        is bool."""
        if name in LOGICAL_REDUCTIONS:
            # all: no element false (the largest of b ? 0 : 1 is 0); any: some element true
            truth = self.cast(vid, "bool")
            every = name == "all"
            flags = self.op("where", truth, self.const(0.0 if every else 1.0), self.const(1.0 if every else 0.0))
            top = self.reduce("amax", flags, 0, dim)
            return self.op("eq" if every else "ne", top, self.const(0.0))
        if self.dtype[vid] in ("const", "bool"):
            vid = self.cast(vid, "f32")
        out = self._new(self.dtype[vid])
        op = {"op": name, "out": out, "args": [vid], "dim": dim, "keepdim": True}
        if name == "var":
            op["correction"] = correction
        self.ops.append(op)
        return out

    def cat(self, vids, dim):
        """cat along fragment dim `dim` (vocabulary 6): one dtype stays, mixed ones promote."""
        dts = [self.dtype[v] for v in vids]
        dtype = dts[0]
        if dtype == "const" or any(d != dtype for d in dts):
            dtype = dts[0]
            for d in dts[1:]:
                dtype = _promote(dtype, d)
        out = self._new(dtype)
        self.ops.append({"op": "cat", "out": out, "args": list(vids), "dim": dim})
        return out

    def window(self, node):
        """The window ops (vocabulary 7) of node, whose tensor operands are fragment inputs:
        the backward's gradient, or the forward's max and its argmax's taps (as f16, the
        dtype the client stores them in), the values of node's getitems."""
        name, window, ceil_mode = window_op(node)
        args = [self.ids[a] for a in node.args if isinstance(a, torch.fx.Node)]
        keys = {"window": window, "ceil_mode": ceil_mode}
        if name == "max_pool2d_backward":
            out = self._new(self.dtype[args[0]])
            self.ops.append({"op": name, "out": out, "args": args, **keys})
            self.ids[node] = out
            return out
        y = self._new(self.dtype[args[0]])
        self.ops.append({"op": name, "out": y, "args": args, **keys})
        taps = self._new("f32")
        self.ops.append({"op": "max_pool2d_argmax", "out": taps, "args": args, **keys})
        values = (y, self.cast(taps, DTYPES[node.meta["val"][1].dtype]))
        for u in node.users:
            if u.target is operator.getitem:
                self.ids[u] = values[u.args[1]]
        return y

    def emit_node(self, node, layout=None):
        if window_op(node):
            return self.window(node)
        taken = take_rows(node)
        if taken is not None:  # vocabulary 9: the rows input read where the index input points
            x, idx = (self.ids[a] for a in taken)
            vid = self._new(self.dtype[x])
            self.ops.append({"op": "take_rows", "out": vid, "args": [x, idx]})
            self.ids[node] = vid
            return vid
        if node.target is operator.getitem and node in self.ids:  # a window op's value
            return self.ids[node]
        dim = cat_dim(node)
        if dim is not None:
            if layout is None or dim < layout.k:
                raise Unfusable(f"{node.name}: a cat along a symbolic dim")
            vid = self.cat([self.arg(x) for x in node.args[0]], dim - layout.k + 1 if layout.k else dim)
            vid = self.cast(vid, DTYPES[node.meta["val"].dtype])
            self.ids[node] = vid
            return vid
        red = row_reduction(node)
        col = None if red else column_reduction(node)
        if col:
            red = (col, 0)
        if red:
            vid = self.reduce(red[0], self.arg(node.args[0]), red[1], dim=0 if col else -1)
            vid = self.cast(vid, DTYPES[node.meta["val"].dtype])
            self.ids[node] = vid
            return vid
        vid = POINTWISE[node.target](self, node)
        # Keep every value at the dtype torch gives it, so later ops and the stored outputs
        # see what eager would (a 0-dim f32 tensor does not promote a bf16 tensor in torch).
        vid = self.cast(vid, dtype_name(node.meta["val"].dtype))
        self.ids[node] = vid
        return vid


def _align_of(t):
    off = int(t.storage_offset()) * t.element_size() if is_known_int(t.storage_offset()) else 1
    align = 16
    while align > t.element_size() and off % align:
        align //= 2
    return max(align, t.element_size())


class Layout:
    """How the group's iteration space maps onto the fragment's: `k` leading dims (symbolic,
    or 0 when static) collapse into fragment dim 0."""

    def __init__(self, shape, ragged=False, pooled=False, gathered=False):
        self.shape = list(shape)
        # a group that reads rows at an index (take_rows): a tensor's dim 0 may be of any size
        # (the rows read), and an index is read along dim 0 alone; static sizes only
        self.gathered = gathered
        # a cat group: its tensors may be smaller than the group along a static dim (a cat's
        # operands); the daemon checks that every size adds up (vocabulary 6)
        self.ragged = ragged
        # a window group: its tensors may be of any size along the last two dims (a pooled
        # input is larger than its output, a gradient smaller); the daemon checks them
        self.pooled = pooled
        sym = [i for i, d in enumerate(self.shape) if not is_known_int(d)]
        self.k = 0
        while self.k < len(self.shape) and not is_known_int(self.shape[self.k]):
            self.k += 1
        if any(i >= self.k for i in sym):
            raise Unfusable("a symbolic dim after a static one")
        if gathered and self.k:
            raise Unfusable("rows read at an index in a group of symbolic sizes")

    def tensor(self, t, where, index=False, source=False):
        """(fragment shape, strides, full_leading) of tensor t, padded to the group's rank (an
        index, [T] or [B, S] read along the leading dims: padded after them; the rows source
        of an index of rank k > 1, [S, D]: padded after its dim 0, to [S, 1, D])."""
        r = len(self.shape)
        size, stride = list(t.shape), list(t.stride())
        if len(size) > r:
            raise Unfusable(f"{where}: rank above the group's")
        if index:
            size, stride = size + [1] * (r - len(size)), stride + [0] * (r - len(stride))
        elif source:
            pad = r - len(size)
            size, stride = size[:1] + [1] * pad + size[1:], stride[:1] + [0] * pad + stride[1:]
        size = [1] * (r - len(size)) + size
        stride = [0] * (r - len(stride)) + stride
        shape, strides = [], []
        full = False
        if self.k:
            lead = size[: self.k]
            if all(is_known_int(d) and int(d) == 1 for d in lead):
                shape.append(1)
                strides.append(0)
            elif all(known_equal(a, b) for a, b in zip(lead, self.shape[: self.k])):
                for i in range(self.k - 1):
                    if not statically_known_true(stride[i] == stride[i + 1] * size[i + 1]):
                        raise Unfusable(f"{where}: not dense across the symbolic dims")
                if not is_known_int(stride[self.k - 1]):
                    raise Unfusable(f"{where}: symbolic stride")
                shape.append(-1)
                strides.append(int(stride[self.k - 1]))
                full = True
            else:
                raise Unfusable(f"{where}: broadcast over part of the symbolic dims")
        for i in range(self.k, r):
            d, g = size[i], self.shape[i]
            if not is_known_int(d):
                raise Unfusable(f"{where}: symbolic dim {i}")
            pooled = self.pooled and i >= r - 2
            rows = self.gathered and i == 0
            if int(d) != int(g) and int(d) != 1 and not (self.ragged and int(d) < int(g)) and not pooled and not rows:
                raise Unfusable(f"{where}: dim {i} is {int(d)}, not {int(g)} or 1")
            if int(d) == 1:
                shape.append(1)
                strides.append(0)
            else:
                if not is_known_int(stride[i]):
                    raise Unfusable(f"{where}: symbolic stride")
                shape.append(int(d))
                strides.append(int(stride[i]))
        return shape, strides, full


class Built:
    """A group's fragment and what launching it needs."""

    def __init__(self, wire, layout, in_nodes, out_nodes, full_input, out_strides, in_align):
        self.wire = wire
        self.layout = layout
        self.in_nodes = in_nodes
        self.out_nodes = out_nodes
        self.full_input = full_input  # index of an input whose leading dims give `outer`
        self.out_strides = out_strides  # fragment strides of each output
        self.in_align = in_align
        self.gemm = False  # a GEMM fragment (gemm_fragment, bmm_fragment)
        self.siblings = False  # a GEMM fragment with two products sharing A
        self.chain = False  # a GEMM fragment with two products in sequence
        # GEMM: per output, the shape to view it as ([B, S, N] of an [M, N] product; [B, H, M, N]
        # of a [Bt, M, N] batched one, -1 where its batch dim is symbolic)
        self.out_views = None
        # batched GEMM: per input, the rank of the space it is read in (its batch dims are
        # collapsed into one from that rank: bmm_fragment.collapse)
        self.in_ranks = None
        # each output's static dims after the collapsed symbolic ones (a rows fragment's
        # per-row outputs end in 1 where the iteration shape has N)
        self.out_tails = [[int(d) for d in layout.shape[layout.k :]] for _ in out_nodes]
        # (shape, strides) of each output when they do not follow the launch's M (a column
        # fragment's per-column results: cols_fragment)
        self.out_fixed = None
        # the kernel adds into its outputs (a scatter fragment): they are allocated zeroed
        self.zeroed = False
        # a scatter fragment: per input, the leading dims read as its [M] (None: all of them,
        # the index), the rest as its [D] (scatter_fragment.flat)
        self.in_splits = None
        # positions among the group's inputs of the tensors the kernel reads, in the wire's
        # order (None: every input): a column index the kernel computes (column_index.py) is
        # passed to the group, for its ATen ops, and not to the kernel
        self.read = None


def wire_inputs(layout, in_nodes, indices=(), sources=()):
    """(the wire's inputs, index of the first one carrying the symbolic dims, each input's
    alignment) of in_nodes read in `layout` (those in `indices`: take_rows' indices; in
    `sources`: the rows they read, where an index has more than one dim)."""
    inputs, full_input, in_align = [], None, []
    for i, node in enumerate(in_nodes):
        t = node.meta["val"]
        where = f"input {node.name}"
        fshape, fstrides, full = layout.tensor(t, where, index=node in indices, source=node in sources)
        if full and full_input is None:
            full_input = i
        in_align.append(_align_of(t))
        inputs.append(
            {"id": i, "dtype": dtype_name(t.dtype), "shape": fshape, "strides": fstrides, "align": in_align[-1]}
        )
    if layout.k and full_input is None:
        raise Unfusable("no input carries the symbolic dims")
    return inputs, full_input, in_align


def _taken_inputs(members, taken):
    """(the indices, the rows sources read at an index of rank > 1) of a group's take_rows: each
    input read in one form only (a source padded after its dim 0 is no operand of another op)."""
    indices = {idx for _, idx in taken}
    sources = {x for x, idx in taken if idx.meta["val"].dim() > 1}
    for n in members:
        source, idx = take_rows(n) or (None, None)
        for a in n.all_input_nodes:
            if (a in indices and a is not idx) or (a in sources and a is not source):
                raise Unfusable(f"{n.name} reads an index or a row source as a value")
    return indices, sources


def build(members, in_nodes, out_nodes, shape=None):
    """members in graph order; in_nodes: the group's tensor inputs (fragment order);
    out_nodes: the members whose values leave the group (fragment order); shape: the
    iteration shape (a rows group's row shape; default: the last member's shape)."""
    shape = shape if shape is not None else members[-1].meta["val"].shape
    cats = any(cat_dim(n) is not None for n in members)
    windows = any(window_op(n) for n in members)
    taken = [t for t in (take_rows(n) for n in members) if t is not None]
    layout = Layout(shape, ragged=cats or windows, pooled=windows, gathered=bool(taken))
    rows = any(row_reduction(n) for n in members)
    # an arange input along the last dim is computed, not read (the extent forms index their
    # values otherwise: there it stays an input)
    columns = {}
    if not (cats or windows or taken):
        columns = {n: s for n in in_nodes if (s := column_index.column_start(n, layout.shape)) is not None}
    read = [i for i, n in enumerate(in_nodes) if n not in columns]
    in_nodes = [in_nodes[i] for i in read]
    e = Emitter(in_nodes)
    for node, start in columns.items():
        e.ids[node] = e.iota(dtype_name(node.meta["val"].dtype), start)
    for node in members:
        e.emit_node(node, layout)
    inputs, full_input, in_align = wire_inputs(layout, in_nodes, *_taken_inputs(members, taken))
    outputs, out_strides, out_tails = [], [], []
    for node in out_nodes:
        t = node.meta["val"]
        fshape, fstrides, _ = layout.tensor(t, f"output {node.name}")
        want = _frag_dims(layout)
        per_row = rows and fshape[-1] == 1 and len(fshape) == len(want)
        if per_row:
            want = want[:-1] + [1]  # a statistic (or a value computed from one) per row
        if len(fshape) != len(want) or any(a != b and a != -1 for a, b in zip(fshape, want)):
            raise Unfusable(f"output {node.name} is not of the group's shape")
        outputs.append(
            {"id": e.ids[node], "dtype": dtype_name(t.dtype), "shape": fshape, "strides": fstrides, "align": 16}
        )
        out_strides.append(fstrides)
        out_tails.append([int(d) for d in want[1 if layout.k else 0 :]])
    # the lowest vocabulary that spells every op: each kind's came after the ones before it
    integer = any(is_integer_node(n) and take_rows(n) is None for n in members)
    kinds = (
        (rows, VOCAB_ROWS),
        (cats, VOCAB_CAT),
        (windows, VOCAB_WINDOW),
        (taken, VOCAB_GATHER),
        (integer, VOCAB_INTEGER),
        (bool(columns), VOCAB_IOTA),
    )
    wire = {
        "vocab": max([VOCAB] + [v for present, v in kinds if present]),
        "inputs": inputs,
        "ops": e.ops,
        "outputs": outputs,
    }
    built = Built(wire, layout, in_nodes, out_nodes, full_input, out_strides, in_align)
    built.out_tails = out_tails
    if columns:
        built.read = read
    return built


def _frag_dims(layout):
    return ([-1] if layout.k else []) + [int(d) for d in layout.shape[layout.k :]]
