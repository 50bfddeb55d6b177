"""GEMMs with a dimension that is not a multiple of 8 padded to one (what Inductor's pad_mm
does; this is our own code). cuBLAS runs a bf16/f16 GEMM whose M, N or K (or a leading
dimension) is not a multiple of 8 elements (16 bytes) on its `align1` kernels: GPT-2's tied
lm_head (vocabulary 50257) took 3.36 ms against 0.44 ms padded on an H200, and 9.3 against
2.8 ms in a training step (bench/NOTES.md, "Whole models, first run"). Each such `mm`,
`addmm` or `bmm` node becomes:

    mm(constant_pad_nd(a), constant_pad_nd(b))[:m, :n]

Zeros pad K in both operands (they add nothing to any product); M pads A's rows and N B's
columns (and a bias along the padded dims), and the result is sliced back: a view, so its
readers take it in place, at the padded row stride. An operand padded along one dim is
`cat([x, zeros])` (below), along two `constant_pad_nd`. An operand that is a transpose of a value
(`weight.t()`) is padded before the transpose, so a weight keeps its layout and two GEMMs that
read one value both ways (a backward's `grad @ w` and `grad.t() @ x`) share one padded copy.

What the rewrite changes downstream is known before the graph changes: the values of the
nodes after it are recomputed on fake tensors (fake_meta.py), since fragments bake in their
inputs' strides; a GEMM whose rewrite any reader cannot take is left as it was. The values
that leave the graph keep the padded row stride when the caller says the output slots they
reach may (`keeps_layout`): a model's logits, returned as Inductor returns them (a view at the
padded stride; copying GPT-2's 4096 x 50257 bf16 logits back took 0.47-0.49 ms on an H200, as
long as the lm_head GEMM itself), and in a training forward the same logits saved for the
backward (the caller reports their strides, so that the backward is compiled for them).
Otherwise (a gradient; two user outputs that alias) they are copied back to their old
contiguous layout.

A value computed in the graph and padded along one dim (BERT's logits gradient, from
cross-entropy's backward) is read by its other readers through a slice of its padded copy, so
that the cat is its only reader and fuses into the group that computes it: one kernel writes
the gradient padded, where a second pass copied it (a 4096 x 30522 bf16 gradient: 0.15 ms on
an H200).

Which GEMMs (mode "auto", FUSEML_PAD_GEMM): bf16/f16 only, where the align1 penalty is
measured; fp32 GEMMs run on kernels that care little for alignment unless TF32 is on. Static
sizes only. Padding costs a copy of each padded operand; it pays when the GEMM is large and
compute-bound:
  - at least MIN_FLOPS (2 GFLOP, about 3 us at the ~700 TFLOP/s an H100 reaches): the align1
    kernel costs 3-8x the aligned one (the figures above), so the GEMM then loses at least
    ~6 us, more than the pad kernel's launch and a small copy;
  - at least MIN_INTENSITY FLOPs per byte the padding moves (read and written): at H100/H200
    balance (~700 TFLOP/s over ~3.3-4.8 TB/s, 150-210 FLOP/byte) and a 3x penalty, the GEMM's
    saved time is twice its aligned time, which beats the copy's when its intensity is above
    ~100. GPT-2's lm_head: 2000 forward, 320-390 for the backward's two GEMMs.
A size of 1 is never padded (a vector needs no alignment). Mode "all" pads every unaligned
bf16/f16 GEMM (a testing aid, and a way to measure small ones); "off" none."""

import torch

from . import fake_meta, graph_code, ops
from ._log import log
from .shapes import dense_order, is_known_int

aten = torch.ops.aten

ALIGN = 8  # elements: 16 bytes of bf16/f16, what cuBLAS's fast kernels need
BIG = 4096  # from this size a dimension is padded to a multiple of BIG_ALIGN:
BIG_ALIGN = 64  # 128 bytes, whole cache lines and whole 64-wide tiles, for < 1.6% more work
MIN_FLOPS = 2 << 30
MIN_INTENSITY = 100
DTYPES = (torch.bfloat16, torch.float16)
GEMMS = {aten.mm.default: 2, aten.addmm.default: 2, aten.bmm.default: 3}  # -> operand rank
TRANSPOSES = {aten.t.default, aten.transpose.int, aten.permute.default}


def padded_size(d):
    """The size a dimension of d elements is padded to (d when it needs none)."""
    if d % ALIGN == 0 or d <= 1:
        return d
    step = BIG_ALIGN if d >= BIG else ALIGN
    return -(-d // step) * step


def _operands(node):
    """(a, b, bias or None) of a GEMM node."""
    if node.target is aten.addmm.default:
        return node.args[1], node.args[2], node.args[0]
    return node.args[0], node.args[1], None


def _why_not(node, mode):
    """None when the GEMM node is padded, else why not."""
    rank = GEMMS.get(node.target) if node.op == "call_function" else None
    if rank is None:
        return "not a GEMM"
    a, b, bias = _operands(node)
    if not all(isinstance(x, torch.fx.Node) for x in (a, b)):
        return "operands are not tensors"
    ta, tb = a.meta.get("val"), b.meta.get("val")
    if not isinstance(ta, torch.Tensor) or not isinstance(tb, torch.Tensor):
        return "no tensor metadata"
    if ta.dtype not in DTYPES or tb.dtype != ta.dtype:
        return f"{ta.dtype} GEMM"
    if ta.dim() != rank or tb.dim() != rank:
        return "operands of another rank"
    if not all(is_known_int(d) for d in list(ta.shape) + list(tb.shape)):
        return "symbolic sizes"
    if bias is not None and not (isinstance(bias, torch.fx.Node) and isinstance(bias.meta.get("val"), torch.Tensor)):
        return "bias is not a tensor"
    m, k, n = int(ta.shape[-2]), int(ta.shape[-1]), int(tb.shape[-1])
    if min(m, k, n) == 0:
        return "empty"
    if (padded_size(m), padded_size(k), padded_size(n)) == (m, k, n):
        return "aligned"
    if mode == "all":
        return None
    batch = int(ta.shape[0]) if rank == 3 else 1
    flops = 2 * batch * m * n * k
    if flops < MIN_FLOPS:
        return f"{flops / 1e9:.2g} GFLOP, under {MIN_FLOPS / 1e9:.2g}"
    moved = sum(
        2 * t.numel() * t.element_size()
        for t, dims in ((ta, (m, k)), (tb, (k, n)))
        if tuple(padded_size(d) for d in dims) != dims
    )
    if flops < MIN_INTENSITY * moved:
        return f"{flops / moved:.0f} FLOP per byte padded, under {MIN_INTENSITY}"
    return None


class _Rewrite:
    """The padding of one GEMM node, its new values computed before the graph changes."""

    def __init__(self, gm, node, mode, padded):
        self.gm, self.node, self.mode = gm, node, mode
        self.padded = padded  # (base node, pads) -> its padded node, shared by GEMMs
        a, b, bias = _operands(node)
        ta, tb = a.meta["val"], b.meta["val"]
        self.rank = ta.dim()
        self.m, self.k, self.n = int(ta.shape[-2]), int(ta.shape[-1]), int(tb.shape[-1])
        self.mp, self.kp, self.np = (padded_size(d) for d in (self.m, self.k, self.n))
        self.steps = []  # (target, args, kwargs, val): the new nodes, in order
        self.vals = {}  # new value of each node after the rewrite
        self.clones = {}  # output value -> its contiguous copy's step index
        self.cats = []  # step indices of the cats with zeros that pad a value of the graph
        self.made = {}  # step index -> its node, once applied
        self.out_slots = []  # (position, value) of each output slot whose value changed
        self.kept = []  # the positions of out_slots left at the padded layout

    def describe(self):
        dims = ", ".join(
            f"{name} {d} -> {p}"
            for name, d, p in (("M", self.m, self.mp), ("K", self.k, self.kp), ("N", self.n, self.np))
            if p != d
        )
        return f"{self.node.name} ({dims})"

    # -- the new values --------------------------------------------------------------------

    def _step(self, target, args, kwargs=None):
        """A new node to be: its index stands for it in later steps' args (_Ref)."""
        vals = torch.fx.node.map_aggregate(args, self._value)
        val = fake_meta.run(self.mode, target, vals, kwargs)
        self.steps.append((target, args, kwargs or {}, val))
        return _Ref(len(self.steps) - 1)

    def _value(self, x):
        if isinstance(x, _Ref):
            return self.steps[x.index][3]
        if isinstance(x, torch.fx.Node):
            return self.vals.get(x, x.meta.get("val"))
        return x

    def _pad(self, node, want):
        """node (a tensor value) padded to the sizes `want`; through the transposes it is of
        a value, down to that value (a weight's `t(t(w))` in a backward is w: padding w keeps
        the copy contiguous, where padding the transposed view copied it element by element,
        0.36 ms against 0.04 for GPT-2's tied weight on an H200)."""
        have = [int(d) for d in node.meta["val"].shape]
        if have == list(want):
            return node
        base, perm = node, list(range(len(want)))  # node's dim i is base's dim perm[i]
        while base.op == "call_function" and base.target in TRANSPOSES:
            step = ops.permutation(base)
            perm = [step[k] for k in perm]
            base = base.args[0]
        if base is node:
            return self._padded(node, want)
        base_want = [0] * len(want)
        for i, p in enumerate(perm):
            base_want[p] = want[i]
        padded = self._padded(base, base_want)
        if perm == sorted(perm):
            return padded
        return self._step(aten.permute.default, (padded, perm))

    def _padded(self, node, want):
        have = [int(d) for d in node.meta["val"].shape]
        key = (node, tuple(want))
        if key not in self.padded:
            grown = [d for d, (h, w) in enumerate(zip(have, want)) if h != w]
            order = dense_order(node.meta["val"])
            if len(grown) == 1 and order is not None:
                # a permuted view of a contiguous value (a transposed weight the forward saved
                # for the backward): padded in its memory order, so the copy is contiguous
                inverse = [order.index(d) for d in range(len(order))]
                flat = self._step(aten.permute.default, (node, order))
                cat = self._cat_zeros(flat, inverse[grown[0]], want[grown[0]] - have[grown[0]])
                self.padded[key] = self._step(aten.permute.default, (cat, inverse))
            elif len(grown) == 1:
                self.padded[key] = self._cat_zeros(node, grown[0], want[grown[0]] - have[grown[0]])
            else:
                pads = []
                for h, w in reversed(list(zip(have, want))):  # constant_pad_nd: last dim first
                    pads += [0, w - h]
                self.padded[key] = self._step(aten.constant_pad_nd.default, (node, pads, 0.0))
        return self.padded[key]

    def _cat_zeros(self, node, dim, extra):
        """node padded by `extra` zeros along dim, as cat([node, zeros]) with the zeros a
        contiguous tensor of their own: ATen's cat of contiguous operands reads and writes
        each element once, where constant_pad_nd fills the whole result and then copies into
        it (padding a 4096 x 50257 bf16 gradient: 0.44 against 0.60 ms on an H200; a cat with
        the zeros expanded from one row took 0.75, copied operand by operand)."""
        val = self._value(node)
        sizes = [int(d) for d in val.shape]
        sizes[dim] = extra
        zeros = self._step(
            aten.full.default, (sizes, 0.0), {"dtype": val.dtype, "device": val.device, "pin_memory": False}
        )
        cat = self._step(aten.cat.default, ([node, zeros], dim))
        if isinstance(node, torch.fx.Node):
            self.cats.append(cat.index)
        return cat

    def compute(self, keeps_layout):
        """The new nodes' values and those of every node after the GEMM whose value changes;
        raises when a reader cannot take the new layout. keeps_layout(positions): whether the
        output slots at those positions may keep the padded layout."""
        a, b, bias = _operands(self.node)
        lead = [int(d) for d in a.meta["val"].shape[:-2]]
        pa = self._pad(a, lead + [self.mp, self.kp])
        pb = self._pad(b, lead + [self.kp, self.np])
        if bias is not None:
            tbias = bias.meta["val"]
            out = [self.mp, self.np]  # a bias broadcasts from the right; a size-1 dim stays
            want = [int(d) if int(d) == 1 else out[len(out) - tbias.dim() + i] for i, d in enumerate(tbias.shape)]
            args = (self._pad(bias, want), pa, pb)
        else:
            args = (pa, pb)
        out = self._step(self.node.target, args, dict(self.node.kwargs))
        for dim, (size, full) in enumerate(((self.mp, self.m), (self.np, self.n))):
            if size != full:
                out = self._step(aten.slice.Tensor, (out, self.rank - 2 + dim, 0, full))
        self.result = out
        self.vals[self.node] = self._value(out)
        self._propagate()
        if self.out_slots and keeps_layout([i for i, _ in self.out_slots]):
            self.kept = [i for i, _ in self.out_slots]
            return
        for _, x in self.out_slots:
            old = x.meta.get("val")
            if not (isinstance(old, torch.Tensor) and old.is_contiguous()):
                raise ValueError(f"output {x.name} had a layout a copy cannot restore")
            if x not in self.clones:
                self.clones[x] = self._step(aten.clone.default, (x,), {"memory_format": torch.contiguous_format})

    def _propagate(self):
        nodes = list(self.gm.graph.nodes)
        for u in nodes[nodes.index(self.node) + 1 :]:
            ins = [x for x in u.all_input_nodes if x in self.vals]
            if not ins:
                continue
            if u.op == "output":
                self.out_slots = [(i, x) for i, x in enumerate(output_values(u)) if x in self.vals]
                continue
            if u.op != "call_function":
                raise ValueError(f"{u.name} ({u.op}) reads a padded GEMM's value")
            new = fake_meta.run(self.mode, u.target, *torch.fx.node.map_arg((u.args, u.kwargs), self._value))
            if not fake_meta.same_layout(new, u.meta.get("val")):
                self.vals[u] = new

    # -- the graph change --------------------------------------------------------------------

    def apply(self):
        graph, made = self.gm.graph, {}

        def real(x):
            return made[x.index] if isinstance(x, _Ref) else x

        output = next(n for n in reversed(graph.nodes) if n.op == "output")
        clones = {s.index: x for x, s in self.clones.items()}
        for i, (target, args, kwargs, val) in enumerate(self.steps):
            if i in clones:
                continue
            with graph.inserting_before(self.node):
                made[i] = graph.call_function(target, torch.fx.node.map_aggregate(args, real), kwargs)
            made[i].meta["val"] = val
        new = made[self.result.index]
        self.node.replace_all_uses_with(new)
        for u, v in self.vals.items():
            if u is not self.node:
                u.meta["val"] = v
        graph.erase_node(self.node)
        for i, x in clones.items():
            x = new if x is self.node else x
            with graph.inserting_after(x):  # made beside the value, not at the graph's end
                copy = graph.call_function(aten.clone.default, (x,), self.steps[i][2])
            copy.meta["val"] = self.steps[i][3]
            output.args = torch.fx.node.map_arg(output.args, lambda y: copy if y is x else y)
        for key, ref in list(self.padded.items()):
            if isinstance(ref, _Ref):
                self.padded[key] = made[ref.index]
        self.made = made


def _read_through_pad(gm, cat, mode):
    """The readers of the value `cat` pads (other than the cat) read it through a slice of the
    cat instead, when the value is computed in the graph (or a reshape of a value computed
    for it alone; not an input: nothing to fuse into) and every such reader comes after the
    cat and keeps its own value's layout (a reduction's, a pointwise op's: so nothing after it
    changes). A view nobody reads is dropped. Returns whether the readers moved."""
    (x, _zeros), dim = cat.args[0], cat.args[1]
    base = x
    while base.op == "call_function" and base.target in ops.RESHAPE_OPS and len(base.args[0].users) == 1:
        base = base.args[0]
    if base.op != "call_function" or base.target in ops.VIEW_OPS or base.target in ops.RESHAPE_OPS:
        return False
    for u in [u for u in x.users if u is not cat and not u.users and u.op == "call_function"]:
        if u.target in ops.VIEW_OPS or u.target in ops.RESHAPE_OPS:
            gm.graph.erase_node(u)
    readers = [u for u in x.users if u is not cat]
    if not readers:
        return False
    pos = {n: i for i, n in enumerate(gm.graph.nodes)}
    size = int(x.meta["val"].shape[dim])
    sliced = fake_meta.run(mode, aten.slice.Tensor, (cat.meta["val"], dim, 0, size))
    news = {}
    for u in readers:
        if u.op != "call_function" or pos[u] < pos[cat]:
            return False
        vals = torch.fx.node.map_arg((u.args, u.kwargs), lambda a: sliced if a is x else a.meta.get("val"))
        new = fake_meta.run(mode, u.target, *vals)
        if not fake_meta.same_layout(new, u.meta.get("val")):
            return False
        news[u] = new
    with gm.graph.inserting_after(cat):
        view = gm.graph.call_function(aten.slice.Tensor, (cat, dim, 0, size))
    view.meta["val"] = sliced
    for u in readers:
        u.replace_input_with(x, view)
        u.meta["val"] = news[u]
    return True


class _Ref:
    """A new node not yet in the graph: the index of its step."""

    def __init__(self, index):
        self.index = index


def output_values(output):
    """The values an output node returns, one per slot, in order (the positions keeps_layout
    and pad's kept list count)."""
    args = output.args[0]
    return list(args) if isinstance(args, (list, tuple)) else [args]


def pad(gm, mode, keeps_layout=lambda positions: False):
    """Pads gm's unaligned GEMMs in place (mode "auto", "all" or "off"); returns (a
    description of each one padded, the output positions left at a padded layout).
    keeps_layout(positions): whether the graph's output slots at those positions, all reached
    from one padded GEMM, may keep its padded row stride (default: none may)."""
    if mode == "off":
        return [], []
    fake = fake_meta.mode_of(gm)
    if fake is None:
        return [], []
    done, padded, kept, cats = [], {}, [], []
    for node in list(gm.graph.nodes):
        why = _why_not(node, mode)
        if why is not None:
            if why not in ("not a GEMM", "aligned"):
                log.debug("fuseml: %s not padded: %s", node.name, why)
            continue
        rewrite = _Rewrite(gm, node, fake, dict(padded))
        try:
            rewrite.compute(keeps_layout)
        except Exception as e:  # a reader that cannot take the padded layout: left as it was
            log.debug("fuseml: %s not padded: %s: %s", node.name, type(e).__name__, e)
            continue
        rewrite.apply()
        cats += [rewrite.made[i] for i in rewrite.cats]
        padded.update(rewrite.padded)
        done.append(rewrite.describe())
        kept += rewrite.kept
    # once every GEMM reads its padded operands (a value two GEMMs read is padded once)
    for cat in cats:
        if _read_through_pad(gm, cat, fake):
            log.debug("fuseml: %s read through its padded copy", cat.args[0][0].name)
    if done:
        gm.graph.lint()
        graph_code.edited(gm)
        log.debug("fuseml: padded GEMMs: %s", "; ".join(done))
    return done, sorted(kept)
