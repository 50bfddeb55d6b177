"""Fusion discovery on an ATen FX graph: pointwise chains become groups (an aten.cat takes in
the groups of its operands, and the group goes on over the cat's shape: rotary embeddings'
cat([-x2, x1]) * sin + x * cos is one group); a GEMM (mm, addmm,
bmm, baddbmm) starts a group that absorbs the pointwise ops after it as its epilogue (seen
through one view of its result: [M, N] as [B, S, N], a bmm's [B*H, S, S] as [B, H, S, S]);
a reduction over dim 0 of a 2-D value (a bias gradient) is a column group, with the pointwise
ops before it that nothing else reads and the per-column ops after it; max pooling
and its gradient (window ops), and rows added into a zeroed fp32 buffer at an index (a
gathered rows' or an embedding's gradient: scatter_fragment.py), are groups of one op each; other
reductions are recorded as groups of their own kind, routed "bypass" until the client spells
them.

A node joins the group of one of its producers when it is pointwise, has the group's shape,
and none of its other operands depends on that group (joining would make the group wait on
its own result), on any path: a group runs as one call, so a value computed from any member
of a group depends on all that group's inputs. A GEMM group is preferred (the epilogue is free in its registers), but an
op reading the GEMM's own operands cannot join it (the operands are streamed through shared
memory, not addressable per output element). Groups grow in graph order; nothing is fused
across a mutating op, because a mutating op never joins and a group never waits on one of
its own descendants.

Sibling GEMMs (siblings.py): when a pointwise node could join two GEMM groups whose products
read one A by two B's of one shape (SwiGLU's silu(gate(x)) * up(x)), the two groups merge
into one with both products, each one's epilogue and the combining node, provided neither
group depends on the other and no mutating op lies between them; otherwise the node joins
one of them, as for any two candidates.

Epilogues into rows: a GEMM group whose pointwise epilogue feeds one rows group hands that
epilogue to the rows group, and its product runs on cuBLAS: the residual stream and the next
RMSNorm / LayerNorm are one rows kernel, and so are a logits softcap and the loss's softmax
(_epilogue_into_rows says why that wins).

Chains (chains.py): after the groups are formed, a GEMM group whose only value feeds another
GEMM group's product as its A (nothing else reads it: not a graph output, not saved for
backward) merges with it into one group of two stages, when the chain kernel can run the
pair. A combined group (siblings or a chain) remembers its two original groups (`parts`):
if the daemon refuses it, split_apart() gives them back and they are requested apart.

Horizontal fusion (horizontal.py): last, pointwise groups of one shape, or rows groups over the
same rows, that read a value in common with no path between them merge into one group of
several outputs (a router's lone ops on one sort, a loss's reductions over its tokens)."""

import bisect
import math
import operator
import types
from dataclasses import dataclass, field

import torch

from . import chains as chain_rules, horizontal, ops, siblings
from ._log import log
from .bmm_fragment import collapse
from .scatter_fragment import scatter_operands
from .shapes import same_known_shape


@dataclass
class Served:
    """What happens to a group once its graph is compiled: the daemon's answer for its
    fragment, then what the runtime decides and learns while the graph runs. The partition
    result (Group) holds it; only the backend, the runtime and the upgrade path write it."""

    key: str  # the kernel's key in the daemon's store
    state: str  # "untuned" | "verified" | "tuned" (upgrade.py moves it on)
    origin: str  # "compiled" | "joined" | "hit"
    # measured routing on the first launch: ("kernel" | "aten", kernel ms, ATen ms); the times
    # None where the ATen ops were not timed (runtime.ATEN_HEAVY_BYTES)
    route_measured: tuple = None


def served(group, kernel):
    """group.served, made from a runner's kernel (key, state, ...) where the daemon's answer
    was not recorded on the group (a runner given its kernel directly)."""
    if group.served is None:
        group.served = Served(kernel[0], kernel[1], None)
    return group.served


@dataclass(eq=False)
class Group:
    """A fused group as the partition made it (its members, inputs, outputs, shape, the
    route it asks for and why) and, once built, its fragment. What the daemon and the
    runtime decide later is `served` (None until the daemon answers). A group is itself
    (compared and hashed by identity): comparing every field made the partition's list
    removals cost 0.3 s of a ResNet-50 training graph's compile."""

    gid: int
    kind: str  # "pointwise" | "rows" | "gemm" | "columns" | "window" | "scatter" | "reduction"
    members: list  # FX nodes, graph order
    inputs: list = field(default_factory=list)  # nodes read from outside, first use order
    outputs: list = field(default_factory=list)  # members used outside (incl. graph outputs)
    escapes: list = field(default_factory=list)  # outputs other than the last member
    route: str = "bypass"  # "kernel" | "bypass"
    reason: str = ""
    built: object = None
    shape: object = None  # the iteration shape (rows: the row shape)
    served: Served = None
    chain: bool = False  # a GEMM group of two back-to-back products (chains.py)
    # a combined GEMM group (siblings or chain): the member lists of the two groups it was
    # made of, which run apart if the daemon refuses it (split_apart)
    parts: list = None
    apart_of: object = None  # a group split from a refused combined group: that group

    # read-only views of `served`, for explain(), describe() and tests
    key = property(lambda self: self.served and self.served.key)
    state = property(lambda self: self.served and self.served.state)
    origin = property(lambda self: self.served and self.served.origin)
    route_measured = property(lambda self: self.served and self.served.route_measured)

    @property
    def op_names(self):
        return [
            # a Python function's (a scatter group's call) by its name, not its repr's address
            n.target.__name__
            if isinstance(n.target, types.FunctionType)
            else str(n.target).replace("aten.", "").replace("fuseml.", "").split(".")[0]
            for n in self.members
            if n.target is not operator.getitem  # a window op's values
        ]

    @property
    def siblings(self):
        """A GEMM group with two products sharing A (siblings.py)."""
        return self.kind == "gemm" and not self.chain and len(ops.products(self.members)) == 2

    @property
    def label(self):
        """The kind as explain() shows it: "gemm", "gemm siblings", "gemm chain", ..."""
        return self.kind + (" siblings" if self.siblings else " chain" if self.chain else "")

    def describe(self):
        s = f"group {self.gid} [{self.label}] {' -> '.join(self.op_names)}: {self.route}"
        if self.reason:
            s += f" ({self.reason})"
        if self.apart_of is not None:
            s += f"; apart from group {self.apart_of.gid}"
        if self.escapes:
            s += f"; escapes {[n.name for n in self.escapes]}"
        if self.route_measured and self.route_measured[1] is None:
            s += "; kernel, ATen not timed (its ops would write far more)"
        elif self.route_measured:
            s += "; measured: kernel %.4f ms, ATen %.4f ms -> %s" % (
                self.route_measured[1],
                self.route_measured[2],
                self.route_measured[0],
            )
        return s


def _is_mutating(node):
    schema = getattr(node.target, "_schema", None)
    return bool(schema and schema.is_mutable)


def _order(gm):
    pos = {n: i for i, n in enumerate(gm.graph.nodes)}
    return pos.__getitem__


def _per_row(shape):
    return list(shape[:-1]) + [1]


def _has_extent_op(g):
    """Whether g has an op a pointwise fragment's extent form runs (a cat, rows read at an
    index), which no rows, column or GEMM template takes."""
    return any(ops.cat_dim(n) is not None or ops.take_rows(n) is not None for n in g.members)


def _has_integers(g):
    """Whether g computes on int64 values (vocabulary 10: a loss's labels, a router's token
    numbers), which only a plain pointwise fragment takes: no reduction, product, cat or
    take_rows beside them. A take_rows' index is read as rows, not as a value."""
    return any(ops.is_integer_node(n) and ops.take_rows(n) is None for n in g.members)


def _widens(node):
    """Whether node casts a 16-bit float value to f32 and does nothing else."""
    if node.op != "call_function" or node.target is not ops.aten._to_copy.default or node.kwargs.keys() - {"dtype"}:
        return False
    src = node.args[0].meta.get("val") if isinstance(node.args[0], torch.fx.Node) else None
    return (
        node.kwargs.get("dtype") is torch.float32 and src is not None and src.dtype in (torch.bfloat16, torch.float16)
    )


def _loads_only(g):
    """Whether group g only reads rows at an index (a position embedding): a reader that does
    it again per element makes the load it would make of g's result anyway."""
    return all(ops.take_rows(n) is not None for n in g.members)


def _pointwise_only(g):
    """Whether g runs in a pointwise fragment only: it has an extent op or integer values."""
    return _has_extent_op(g) or _has_integers(g)


def _mixes_forms(g, h):
    """Whether merging g and h would put integer values beside an extent op."""
    return (_has_integers(g) and _has_extent_op(h)) or (_has_integers(h) and _has_extent_op(g))


def _takes_from(g, h):
    """Whether a take_rows of group g reads its rows from a member of group h: a fragment
    loads those rows from memory, so h's value cannot be computed in g's kernel."""
    hs = set(h.members)
    return any((t := ops.take_rows(n)) is not None and t[0] in hs for n in g.members)


def _fits(g, shape, reduce, integer=False, extent=False):
    """Can a node over `shape` (a reduction: of its operand's rows; integer: computing on
    int64 values; extent: a cat or take_rows) join group g?"""
    if reduce and _pointwise_only(g):
        return False  # a cat, or an integer value, runs in a pointwise fragment only
    if integer and (g.kind != "pointwise" or _has_extent_op(g)):
        return False
    if extent and _has_integers(g):
        return False
    if g.kind == "gemm":
        return not reduce and same_known_shape(g.shape, shape)
    if g.kind == "columns":  # a per-column value after the reductions (a cast of the sum)
        return not reduce and _per_column(g.shape, shape)
    if g.kind not in ("pointwise", "rows"):
        return False
    if same_known_shape(g.shape, shape):
        return True
    # a per-row value (a statistic and what is computed from it) joins its rows group
    return not reduce and g.kind == "rows" and len(shape) == len(g.shape) and same_known_shape(_per_row(g.shape), shape)


def _one_batch_stride(g, node):
    """For a batched GEMM group g: does every operand `node` reads from outside g have one
    batch stride in g's space (its batch dims all broadcast, or none: bmm_fragment.collapse)?
    A [B, 1, S, S] mask beside [B, H, S, S] scores has not, and the template cannot take it;
    the op starts a group of its own instead, which the softmax after it joins (Gemma 2's
    soft-capped, masked attention scores: one rows kernel, as Inductor makes of them, where a
    refused GEMM group left its epilogue a kernel apart)."""
    if not ops.is_batched_gemm(g.members[0]):
        return True
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor) or val.dim() < 3:
        return False
    batch = math.prod(val.shape[:-2])
    mset = set(g.members)
    for a in node.all_input_nodes:
        t = a.meta.get("val")
        if a in mset or not isinstance(t, torch.Tensor):
            continue
        try:
            size, _ = collapse(t.shape, t.stride(), val.dim())
        except ValueError:
            return False
        if not (same_known_shape([size[0]], [1]) or same_known_shape([size[0]], [batch])):
            return False
    return True


SMALL_BROADCAST = 1 << 12  # elements of a pointwise group a reader computes again per element


def _broadcasts_small(shape, into, limit=SMALL_BROADCAST):
    """Is `shape` (static, at most `limit` elements, not `into` itself) broadcast to `into`: of
    its rank, each dim `into`'s or 1, or a 0-dim value (a loss's mean scale)?"""
    if shape is not None and into is not None and len(shape) == 0:
        return len(into) > 0
    if shape is None or into is None or len(shape) != len(into) or same_known_shape(shape, into):
        return False
    if not all(isinstance(d, int) for d in shape) or math.prod(shape) > limit:
        return False
    return all(d == 1 or same_known_shape([d], [e]) for d, e in zip(shape, into))


def _inside_rows(row_shape, shape):
    """Can a pointwise group over `shape` run inside a rows group over `row_shape`: the same
    shape, one value per row, or one per column ([N])?"""
    return (
        same_known_shape(row_shape, shape)
        or (len(shape) == len(row_shape) and same_known_shape(_per_row(row_shape), shape))
        or (len(shape) == 1 and same_known_shape(row_shape[-1:], shape))
    )


def _per_column(space, shape):
    """Is shape that of a per-column value of column space [M, N] ([N] or [1, N]), which a
    column group computes after its reductions (M > 1: with one row, every value would be)?"""
    m, n = space
    return not same_known_shape([m], [1]) and (same_known_shape(shape, [n]) or same_known_shape(shape, [1, n]))


def _column_prologue(g, space):
    """g, when a column reduction over `space` may join it: a column group over that space,
    or a pointwise group over it (no cat) none of whose values is read but by its own members
    and column reductions over that space; else None."""
    if (
        g is None
        or g.kind not in ("columns", "pointwise")
        or not same_known_shape(g.shape, space)
        or _pointwise_only(g)
    ):
        return None
    if g.kind == "columns":  # its column-space values were checked when it took them in
        return g
    mset = set(g.members)
    for n in g.members:
        for u in n.users:
            if u not in mset and not (ops.column_reduction(u) and u.args[0] in mset):
                return None
    return g


def _absorbs(g, operand, cat):
    """Can aten.cat node `cat` take in group g, which computes its operand `operand`? Only a
    pointwise group over the operand's shape without a cat of its own (the daemon refuses a
    cat of a cat), none of whose values is read outside it but by the cat: its values have
    the operand's size, and a group's outputs have the group's (the cat's) shape."""
    if g.kind != "pointwise" or not same_known_shape(g.shape, operand.meta["val"].shape) or _pointwise_only(g):
        return False
    mset = set(g.members)
    return all(u in mset or u is cat for n in g.members for u in n.users)


def _sees_through(view, g):
    """Can GEMM group g take in `view` (a reshape of its last member) and go on over the view's
    shape? Once per group: [M, N] seen as [B, S, N], or a bmm's [Bt, M, N] as [B, H, M, N]."""
    if any(n.target in ops.RESHAPE_OPS for n in g.members):
        return False
    if not ops.is_batched_gemm(g.members[0]):
        return ops.splits_rows(view, g.shape)
    if ops.batched_view(view, g.shape) is None:
        return False
    # A symbolic batch ([s0 * H, S, S] viewed as [s0, H, S, S]) is named in the view's size
    # list by a SymInt node; the group must read tensors only (its inputs are what the
    # fuseml::group op takes), so the one symbolic size is spelled -1, which view infers to
    # the same value. Graph surgery, but it changes no value.
    size = view.args[1] if len(view.args) > 1 else None
    if not isinstance(size, (list, tuple)):
        return False
    syms = [i for i, d in enumerate(size) if isinstance(d, torch.fx.Node)]
    if len(syms) > 1 or any(not isinstance(d, (int, torch.fx.Node)) for d in size):
        return False
    if syms:
        size = list(size)
        size[syms[0]] = -1
        view.args = (view.args[0], size) + tuple(view.args[2:])
        if view.graph.owning_module is not None:
            view.graph.owning_module.recompile()  # its code must say what its graph says
    return True


def find_groups(gm, min_ops=2, chains=True):
    """Returns the groups of gm.graph (every pointwise group, fused or not, and every
    GEMM/reduction), with inputs, outputs and escapes filled in. chains: merge back-to-back
    GEMM groups (chains.py)."""
    group_of = {}  # node -> Group
    deps = {}  # node -> gids it depends on, through any path
    gdeps = {}  # gid -> gids its external inputs depend on
    root = {}  # gid -> the gid it was merged into (union-find)
    groups = []
    next_gid = iter(range(1 << 30))

    def find(gid):
        top = gid
        while root.get(top, top) != top:
            top = root[top]
        while gid != top:  # path compression: the walks below call this millions of times
            root[gid], gid = top, root[gid]
        return top

    def reaches(gids, gid):
        """Is group gid one of `gids` or upstream of one of them? A group runs as one call
        (all its outputs wait on all its inputs), so the walk goes through each group's
        external inputs (gdeps), not only along the nodes' own edges."""
        # level by level, each level's gdeps united in C: a group's gdeps already hold most
        # of its ancestry (deps are transitive along the nodes), so a walk one edge at a time
        # visited each ancestor's thousands of entries again (ResNet-50's backward: ~10M)
        seen, frontier = set(), {find(x) for x in gids}
        while frontier:
            if gid in frontier:
                return True
            seen |= frontier
            upstream = set().union(*(gdeps.get(x, ()) for x in frontier))
            frontier = {find(y) for y in upstream - seen} - seen
        return False

    def depends(node, gid):
        """Does node wait on group gid (its own group included)?"""
        return reaches(list(deps[node]) + ([group_of[node].gid] if node in group_of else []), gid)

    pos = _order(gm)

    def merge(g, h):
        """Group h's members join group g; h is gone (its gid now finds g's)."""
        g.members = sorted(g.members + h.members, key=pos)
        for n in h.members:
            group_of[n] = g
        gdeps[g.gid] = gdeps.get(g.gid, set()) | gdeps.pop(h.gid, set())
        root[h.gid] = g.gid
        groups.remove(h)

    mutations = [pos(n) for n in gm.graph.nodes if n.op == "call_function" and _is_mutating(n)]

    def reads_from(g, h):
        """Does anything group g reads from outside come from group h, on any path?"""
        mset = set(g.members)
        return any(b not in mset and depends(b, h.gid) for n in g.members for b in n.all_input_nodes)

    def why_not_siblings(g, h, node):
        """None when GEMM groups g and h may merge into one sibling group that `node` (a
        pointwise op reading both) joins; else why not: the sibling rules (siblings.py),
        then what the dependency state says."""
        why = siblings.why_not_groups(g, h, node)
        if why:
            return why
        if reads_from(g, h) or reads_from(h, g):
            return "one group depends on the other"  # merged, the group would wait on itself
        # the merged group runs where its first value is needed, its inputs pulled ahead:
        # a mutation in its span could be reordered against a read
        pg, ph = ops.products(g.members), ops.products(h.members)
        lo = min(pos(n) for n in g.members + h.members + [pg[0].args[-2], ph[0].args[-2]])
        if any(lo < m < pos(node) for m in mutations):
            return "a mutating op lies between them"
        return None

    def why_not_prologue(g, h, node):
        """None when pointwise group h, computed from tensors of GEMM group g's epilogue shape
        and read only by g and `node` (which joins g), may join g: the epilogue computes h's
        values per output element (GELU-tanh's backward in GPT-2 computes 0.5 * x and
        1 + tanh(u) from the forward's saved tensors, two more kernels over [M, 4D] a layer
        otherwise); else why not."""
        if _pointwise_only(h) or any(not same_known_shape(n.meta["val"].shape, g.shape) for n in h.members):
            return "not of the epilogue's shape"
        operands = {a for p in ops.products(g.members) for a in p.args[-2:]}
        if any(a in operands for n in h.members for a in n.all_input_nodes):
            return "it reads the product's operands (streamed through shared memory)"
        inside = set(g.members) | set(h.members) | {node}
        if any(u not in inside for n in h.members for u in n.users):
            return "its values are read elsewhere"
        if reaches(gdeps.get(h.gid, ()), g.gid) or reaches(gdeps.get(g.gid, ()), h.gid):
            return "one group depends on the other"
        # the merged group runs where its first member was, its inputs pulled ahead
        lo = min(pos(n) for n in h.members + g.members)
        if any(lo < m < pos(node) for m in mutations):
            return "a mutating op lies between them"
        return None

    for node in gm.graph.nodes:
        d = set()
        for a in node.all_input_nodes:
            d |= deps[a]
            if a in group_of:
                d.add(group_of[a].gid)
        deps[node] = d
        if node.op != "call_function" or _is_mutating(node):
            continue
        if ops.window_op(node):
            # max pooling and its gradient (vocabulary 7): a kernel of its own, whose
            # operands are its inputs (the daemon loads each window's taps from memory); the
            # forward's two values (the max, the argmax's taps) are its getitems
            val = node.meta["val"]
            g = Group(next(next_gid), "window", [node], shape=(val[0] if isinstance(val, tuple) else val).shape)
            groups.append(g)
            group_of[node] = g
            gdeps[g.gid] = set(d)
            continue
        if scatter_operands(node):
            # rows added at an index into a zeroed fp32 buffer (vocabulary 8): a kernel of its
            # own of atomic adds, whose operands are its inputs, against the call's ATen form
            g = Group(next(next_gid), "scatter", [node], shape=node.meta["val"].shape)
            groups.append(g)
            group_of[node] = g
            gdeps[g.gid] = set(d)
            continue
        if node.target is operator.getitem and getattr(group_of.get(node.args[0]), "kind", None) == "window":
            group_of[node] = group_of[node.args[0]]
            group_of[node].members.append(node)
            continue
        if ops.column_reduction(node):
            # a bias gradient's grad.sum(0): a column group, which takes in the pointwise
            # group computing its operand when nothing else reads that group's values (its
            # prologue), and other column reductions of that prologue (a LayerNorm's weight
            # and bias gradients: column_rewrite.py)
            space = node.args[0].meta["val"].shape
            g = _column_prologue(group_of.get(node.args[0]), space)
            if g is None:
                g = Group(next(next_gid), "columns", [], shape=space)
                groups.append(g)
                gdeps[g.gid] = set(d)
            g.kind = "columns"
            g.members.append(node)
            group_of[node] = g
            continue
        reduce = ops.row_reduction(node)
        kind = None if reduce else ops.kind_of(node)
        if kind:
            why = ops.why_not_gemm(node) if kind == "gemm" else "no kernel template yet"
            if kind == "gemm" and why is None:
                g = Group(next(next_gid), kind, [node], shape=node.meta["val"].shape)
            else:
                g = Group(next(next_gid), kind, [node], reason=why)
                g.kind = kind if kind != "gemm" else "gemm_bypass"
            groups.append(g)
            group_of[node] = g
            gdeps[g.gid] = set(d)
            continue
        src = group_of.get(node.args[0]) if node.args and isinstance(node.args[0], torch.fx.Node) else None
        if src is not None and src.kind == "gemm" and node.args[0] is src.members[-1] and _sees_through(node, src):
            # nn.Linear on [B, S, D]: the epilogue continues over the [B, S, N] view;
            # torch.matmul on [B, H, S, D]: over the [B, H, S, S] view of the bmm's result
            src.members.append(node)
            src.shape = node.meta["val"].shape
            group_of[node] = src
            continue
        cat = not reduce and ops.cat_dim(node) is not None
        # rows read at an index: a group of their own shape, never their source's (below)
        take = None if reduce or cat else ops.take_rows(node)
        if not reduce and not cat and take is None and ops.why_not_pointwise(node) is not None:
            continue
        integer = take is None and ops.is_integer_node(node)
        # A reduction works on rows of its operand's shape; anything else on its own shape.
        shape = node.args[0].meta["val"].shape if reduce else node.meta["val"].shape
        # Producer groups this node may join: of its shape (a rows group also takes per-row
        # values), and not reached through any other operand (joining would make the group
        # wait on itself). A cat takes in the groups of its operands instead (_absorbs).
        cands = []
        for a in node.all_input_nodes:
            g = group_of.get(a)
            if g is None or g in cands:
                continue
            if not (_absorbs(g, a, node) if cat else _fits(g, shape, reduce, integer=integer, extent=take is not None)):
                continue
            if take is not None and a is take[0]:
                continue  # the rows are loaded from memory: their producer's group stays apart
            if g.kind == "gemm" and any(
                b in p.args[-2:] for p in ops.products(g.members) for b in node.all_input_nodes
            ):
                continue
            if g.kind == "gemm" and not _one_batch_stride(g, node):
                continue
            others = [b for b in node.all_input_nodes if group_of.get(b) is not g]
            if any(depends(b, g.gid) for b in others):
                continue
            cands.append(g)
        # A GEMM's epilogue first. Two GEMM groups meeting here (silu(gate) * up) merge as
        # siblings when they can; sibling pointwise chains meeting here merge when neither
        # depends on the other. A GEMM group takes in no pointwise group.
        cands.sort(key=lambda g: g.kind != "gemm")
        chosen = cands[0] if cands else None
        if chosen is not None and chosen.kind == "gemm":
            for h in [h for h in cands[1:] if h.kind == "gemm"]:
                why = why_not_siblings(chosen, h, node)
                if why:
                    log.debug("fuseml: %s: GEMM groups %d and %d stay apart: %s", node.name, chosen.gid, h.gid, why)
                    continue
                siblings.share_a(ops.products(chosen.members)[0], ops.products(h.members)[0])
                # apart again, h is its own group and everything else (what joins later
                # too) is chosen's, as it would be without siblings: part 0 is filled in last
                chosen.parts = [None, list(h.members)]
                merge(chosen, h)
                break  # two products at most
        for h in cands[1:]:
            if chosen.kind == "gemm" and h.kind == "pointwise":
                why = why_not_prologue(chosen, h, node)
                if why is None:
                    merge(chosen, h)
                else:
                    log.debug(
                        "fuseml: %s: pointwise group %d stays out of GEMM group %d: %s",
                        node.name,
                        h.gid,
                        chosen.gid,
                        why,
                    )
                continue
            # a pointwise group of per-row values (a statistic saved by the forward, raised to
            # a power in the backward) joins the rows group, as a per-row node would
            per_row = (
                chosen.kind == "rows"
                and h.kind == "pointwise"
                and len(h.shape) == len(chosen.shape)
                and same_known_shape(_per_row(chosen.shape), h.shape)
            )
            # per-column ops of other inputs (0.9 * running_mean) join a column group's
            # epilogue, as a per-column node would
            per_column = chosen.kind == "columns" and h.kind == "pointwise" and _per_column(chosen.shape, h.shape)
            if (
                chosen.kind == "gemm"
                or h.kind == "gemm"
                or not (cat or per_row or per_column or same_known_shape(chosen.shape, h.shape))
            ):
                continue
            if reaches(gdeps.get(h.gid, ()), chosen.gid) or reaches(gdeps.get(chosen.gid, ()), h.gid):
                continue
            if (chosen.kind != "pointwise" or h.kind != "pointwise") and (
                _pointwise_only(chosen) or _pointwise_only(h)
            ):
                continue  # a cat, or an integer value, runs in a pointwise fragment only
            if _mixes_forms(chosen, h):
                continue
            if _takes_from(chosen, h) or _takes_from(h, chosen):
                continue  # rows a take_rows loads from memory are no value of its kernel
            merge(chosen, h)
            if h.kind == "rows":
                chosen.kind = "rows"
        if chosen is None:
            chosen = Group(next(next_gid), "pointwise", [], shape=shape)
            groups.append(chosen)
        if cat:
            chosen.shape = shape  # the operands' groups now run over the cat's shape
        if reduce:
            chosen.kind = "rows"
        chosen.members.append(node)
        group_of[node] = chosen
        for b in node.all_input_nodes:
            if group_of.get(b) is not chosen:
                gdeps.setdefault(chosen.gid, set()).update(deps[b])
                if b in group_of:
                    gdeps[chosen.gid].add(group_of[b].gid)

    def why_not_chain(g1, g2, value, lnk):
        """None when GEMM group g1, whose value `value` is the A of g2's product (through the
        reshape `lnk`, or lnk is value), may merge with g2 into one chain group; else why
        not: the chain rules (chains.py), then what the dependency state says."""
        why = chain_rules.why_not_groups(g1, g2, value, lnk)
        if why:
            return why
        if lnk is not value and lnk in group_of:
            return "the view between the products belongs to a group"
        # merged, the group would wait on itself if the second reads the first another way
        p1 = ops.products(g1.members)[0]
        second_reads = chain_rules.stage_inputs(g1, g2, lnk)[1]
        if reads_from(g1, g2) or any(b is not lnk and depends(b, g1.gid) for b in second_reads):
            return "the second group reads the first through another path"
        lo = min(pos(n) for n in g1.members + [p1.args[-2]])
        hi = max(pos(n) for n in g2.members)
        if any(lo < m < hi for m in mutations):
            return "a mutating op lies between them"
        return None

    if chains:
        for g2 in sorted([g for g in groups if g.kind == "gemm"], key=lambda g: pos(g.members[0])):
            p2s = ops.products(g2.members)
            found = chain_rules.link(p2s[0]) if len(p2s) == 1 else None
            g1 = group_of.get(found[0]) if found else None
            if g1 is None or g1 is g2 or g1.kind != "gemm":
                continue
            value, lnk = found
            why = why_not_chain(g1, g2, value, lnk)
            if why:
                log.debug("fuseml: GEMM groups %d and %d are no chain: %s", g1.gid, g2.gid, why)
                continue
            parts = [list(g1.members), list(g2.members)]
            merge(g2, g1)
            if lnk is not value:  # the view is the same elements: an alias in the fragment
                g2.members = sorted(g2.members + [lnk], key=pos)
                group_of[lnk] = g2
            gdeps[g2.gid].discard(g1.gid)
            g2.chain, g2.parts = True, parts

    for g in [g for g in groups if g.kind == "gemm" and not g.chain and not g.parts]:
        _epilogue_into_rows(g, group_of, pos)

    # A pointwise group read by one group alone runs inside it, its values never written and
    # its launch gone, when that group is
    #  - a rows group over its shape, one value per row or one per column (LayerNorm's
    #    backward: x_hat recomputed when the op that would have joined the two went to a
    #    GEMM's epilogue first and that epilogue moved into the rows group above; rstd / N;
    #    the weight's cast to fp32);
    #  - a pointwise group over a shape its own broadcasts to, when it is small (per channel:
    #    batch norm's rsqrt(var + eps), its statistics cast to fp32; the reader computes those
    #    few ops again per element, and two launches a batch norm go);
    #  - a column group, when it is small and per column (batch norm's backward: the saved
    #    mean cast to fp32 for the sums' prologue, computed again per element likewise).
    # Integer values (a padding mask's int64 cast to bool) run inside a plain pointwise group
    # only; rows read at an index alone (BERT's and GPT-2's position embeddings, [1, S, D]
    # beside [B, S, D]) inside a pointwise group without integers, at any size. Not when it
    # waits on the reader itself.
    def runs_inside(r, p):
        if r is None:
            return False
        if _has_extent_op(p):
            return r.kind == "pointwise" and not _has_integers(r) and _broadcasts_small(p.shape, r.shape, math.inf)
        if _has_extent_op(r):
            return False
        if _has_integers(r) or _has_integers(p):
            return r.kind == "pointwise" and _broadcasts_small(p.shape, r.shape)
        if r.kind == "rows":
            return _inside_rows(r.shape, p.shape)
        if r.kind == "columns":
            return _per_column(r.shape, p.shape) and _broadcasts_small(p.shape, r.shape)
        return r.kind == "pointwise" and _broadcasts_small(p.shape, r.shape)

    for p in [g for g in groups if g.kind == "pointwise" and (_loads_only(g) or not _has_extent_op(g))]:
        mset = set(p.members)
        readers = {id(group_of.get(u)): group_of.get(u) for n in p.members for u in n.users if u not in mset}
        r = readers.popitem()[1] if len(readers) == 1 else None
        if not runs_inside(r, p) or reaches(gdeps.get(p.gid, ()), r.gid):
            continue
        merge(r, p)
        gdeps[r.gid].discard(p.gid)

    # A pointwise group of one row gather and the ops after it, whose values a rows group
    # reads (a Llama's embedding cast and squared for its RMSNorm; Gemma 2's scaled first, the
    # scaled rows read by the residual add too), saves no kernel: the gather is one launch
    # either way, and the rows group would have computed those ops from the gathered bf16 rows
    # instead of reading the f32 values this group writes. The ops go into the rows group
    # (their other readers, in groups downstream of it, read them from there); the gather is
    # left a group of its own (ATen's).
    for p in [g for g in groups if g.kind == "pointwise" and len(g.members) > 1]:
        takes = [n for n in p.members if ops.take_rows(n) is not None]
        if len(takes) != 1 or _has_integers(p) or any(ops.cat_dim(n) is not None for n in p.members):
            continue
        rest = [n for n in p.members if n is not takes[0]]
        mset = set(p.members)
        users = [u for n in rest for u in n.users if u not in mset]
        if any(u not in group_of for u in users):
            continue  # an ATen op reads them: it would wait on the rows group
        readers = {id(group_of[u]): group_of[u] for u in users}
        last = {id(group_of[u]): group_of[u] for u in rest[-1].users}  # the ops end in the norm
        r = last.popitem()[1] if len(last) == 1 else None
        if r is None or r.kind != "rows" or not all(_inside_rows(r.shape, n.meta["val"].shape) for n in rest):
            continue
        if any(h is not r and reaches(gdeps.get(r.gid, ()), h.gid) for h in readers.values()):
            continue
        take = Group(next(next_gid), "pointwise", list(takes), shape=takes[0].meta["val"].shape)
        groups.append(take)
        group_of[takes[0]] = take
        gdeps[take.gid] = set(gdeps.get(p.gid, ()))
        p.members = rest
        merge(r, p)
        gdeps[r.gid].discard(p.gid)
        gdeps[r.gid].add(take.gid)

    # A cast to f32 ending a pointwise group that only the rows group after it reads (the
    # embeddings' sum, cast for BERT's and GPT-2's LayerNorm) moves into that group: the
    # pointwise kernel writes the 16-bit sum, the rows kernel widens it as it loads.
    for p in [g for g in groups if g.kind == "pointwise" and len(g.members) > 2]:
        last = p.members[-1]
        readers = {id(group_of.get(u)): group_of.get(u) for u in last.users}
        r = readers.popitem()[1] if len(readers) == 1 else None
        if r is None or r.kind != "rows" or not _widens(last) or not _inside_rows(r.shape, last.meta["val"].shape):
            continue
        p.members.remove(last)
        r.members = sorted(r.members + [last], key=pos)
        group_of[last] = r

    # A column group reading a value another column group of its space computes for its own
    # reduction runs inside that one: sibling reductions of one prologue (batch norm's
    # backward sums g and g * (x - mean) of one g), which the walk above split when the
    # first met the prologue before the second's ops had joined it. Not when it waits on the
    # other group's results by another way (a variance after its mean).
    for c2 in [g for g in groups if g.kind == "columns"]:
        mset = set(c2.members)
        inside = {id(h): h for h in (group_of.get(b) for n in c2.members for b in n.all_input_nodes if b not in mset)}
        for c1 in [h for h in inside.values() if h is not None and h.kind == "columns" and h is not c2]:
            if not same_known_shape(c1.shape, c2.shape):
                continue
            others = {find(d) for d in gdeps.get(c2.gid, ())} - {find(c1.gid)}
            if reaches(others, find(c1.gid)):
                continue
            merge(c1, c2)
            gdeps[c1.gid].discard(c1.gid)
            break

    # Column groups of one space that read the same value of that space from outside run as
    # one: batch norm's backward sums g and g * (x - mean) where each took its own copy of g's
    # prologue (threshold_backward of the same two views), so no value of one reaches the
    # other. One kernel reads the shared values once, and a launch goes. Not when either
    # waits on the other.
    def space_inputs(c):
        mset = set(c.members)
        return {
            b
            for n in c.members
            for b in n.all_input_nodes
            if b not in mset
            and isinstance(b.meta.get("val"), torch.Tensor)
            and same_known_shape(b.meta["val"].shape, c.shape)
        }

    columns = [g for g in groups if g.kind == "columns"]
    shared = {g.gid: space_inputs(g) for g in columns}
    for i, c2 in enumerate(columns):
        for c1 in columns[:i]:
            if c1 not in groups or not same_known_shape(c1.shape, c2.shape) or not shared[c1.gid] & shared[c2.gid]:
                continue
            if reaches(gdeps.get(c2.gid, ()), c1.gid) or reaches(gdeps.get(c1.gid, ()), c2.gid):
                continue
            merge(c1, c2)
            gdeps[c1.gid].discard(c1.gid)
            shared[c1.gid] |= shared[c2.gid]
            break

    # Pointwise groups of one shape (rows groups over the same rows) reading one value side by
    # side run as one kernel (horizontal.py): the value is read once and a launch goes. Not
    # when either waits on the other, when integer values would meet an extent op, or across
    # a mutation. Each group looks back over the groups that start at most MAX_DISTANCE nodes
    # before it (one sort of the groups, not one per group: a ResNet-50 backward has hundreds).
    def producer(b):
        return group_of.get(b)

    side = sorted([g for g in groups if g.kind in horizontal.KINDS], key=lambda g: pos(g.members[0]))
    starts = [pos(g.members[0]) for g in side]
    merged = set()
    for i, h in enumerate(side):
        for g in side[bisect.bisect_left(starts, starts[i] - horizontal.MAX_DISTANCE) : i]:
            if id(g) in merged or horizontal.why_not_pair(g, h, pos, producer):
                continue
            if reaches(gdeps.get(h.gid, ()), g.gid) or reaches(gdeps.get(g.gid, ()), h.gid):
                continue
            if _mixes_forms(g, h) or _takes_from(g, h) or _takes_from(h, g):
                continue
            lo, hi = pos(g.members[0]), max(pos(n) for n in g.members + h.members)
            if any(lo < m < hi for m in mutations):
                continue
            merge(g, h)
            merged.add(id(h))
            break

    for i, g in enumerate(groups):
        g.gid = i
    for g in groups:
        if g.parts is not None and g.parts[0] is None:
            second = set(g.parts[1])
            g.parts[0] = [n for n in g.members if n not in second]
        _finish(g, min_ops)
    return groups


def _product_and_views(g):
    """The products of GEMM group g and the views of them that g looks through."""
    prods = set(ops.products(g.members))
    views = set()
    for n in g.members:
        if n.target in ops.RESHAPE_OPS and n.args and (n.args[0] in prods or n.args[0] in views):
            views.add(n)
    return prods | views


def _epilogue_into_rows(g, group_of, pos):
    """Moves the pointwise epilogue of GEMM group g into the rows group it feeds (a residual
    add and the next norm; a softcap and the softmax over the scores or the logits). The GEMM
    is then lone and runs on cuBLAS, and the rows kernel reads the product once where it would
    have read what the epilogue wrote: the bytes moved are the same or fewer (the epilogue
    wrote the residual sum and often an fp32 copy for the norm; Gemma 2's lm_head wrote its
    softcapped logits in bf16 and fp32), the mainloop is cuBLAS's (at a Llama's shapes ours
    is 1.1-1.2x slower, and measured routing dropped these groups, whose epilogue then ran as
    one more pointwise kernel), and a launch goes. An activation moves too: what the epilogue
    computes costs the rows kernel no more than the GEMM's. Moved only when it cannot make a
    group wait on itself: nothing the rows group reads may be computed from
    the epilogue outside the rows group (a group runs as one call, so every member of a
    group on such a path counts)."""
    if len(ops.products(g.members)) != 1:
        return
    base = _product_and_views(g)
    epi = [n for n in g.members if n not in base]
    if not epi or any(n.target is not ops.aten.clone.default and not ops.computes_pointwise(n) for n in epi):
        return
    shape = epi[0].meta["val"].shape
    if any(not same_known_shape(n.meta["val"].shape, shape) for n in epi):
        return
    rows = []
    for h in (group_of.get(u) for n in epi for u in n.users):
        if h is not None and h is not g and h.kind == "rows" and all(h is not x for x in rows):
            rows.append(h)
    if len(rows) != 1 or not same_known_shape(rows[0].shape, shape):
        return
    r = rows[0]
    rset, eset = set(r.members), set(epi)
    # everything computed from the epilogue outside r (whole groups on the way)
    seen, stack = set(), [u for n in epi for u in n.users if u not in rset and u not in eset]
    while stack:
        x = stack.pop()
        if x in seen or x in rset or x in eset:
            continue
        seen.add(x)
        h = group_of.get(x)
        stack.extend(h.members if h is not None and h is not g else [])
        stack.extend(x.users)
    if any(a in seen for n in r.members for a in n.all_input_nodes):
        return
    g.members = [n for n in g.members if n in base]
    r.members = sorted(r.members + epi, key=pos)
    for n in epi:
        group_of[n] = r


LARGE_CAT = 1 << 16  # elements of a lone cat worth a kernel of its own
ATEN_CAT_MAX_DIMS = 4  # ATen's CUDA cat batches its operands in one kernel up to this rank


def _large_cat(g):
    """A lone cat of at least LARGE_CAT elements that a kernel of its own writes faster than
    ATen's cat (measured routing still times the two on the first call):
    - an operand read transposed (the attention gradients of a ViT stacked into the QKV
      projection's layout, cat_rewrite.py): ATen copies such operands in two passes at a
      fraction of the bandwidth (stack and clone: 0.11 ms a layer of a ViT-S on an H200), a
      kernel of its own reads each in place;
    - rows padded to whole 16-byte vectors along the last dim from operands whose rows are not
      (GPT-2's 4096 x 50257 logits gradient padded to 50304 for the lm_head's GEMMs, pad_gemm):
      our kernel stores each row 16 bytes at a time, where ATen's cat ran at 1.9 TB/s;
    - a result of more than ATEN_CAT_MAX_DIMS dims: ATen's batched cat kernel takes at most
      that many, above it ATen copies each operand into its slice of the result, one strided
      copy kernel an operand (a ViT's q, k, v gradients, contiguous [B, N, 1, H, D] each as
      cuDNN's attention backward writes them, catted into [B, N, 3, H, D]: three copies of
      14 us a layer of a ViT-S on an H200).
    Other cats of contiguous operands stay ATen's."""
    cats = [(n, ops.cat_dim(n)) for n in g.members if ops.cat_dim(n) is not None]
    if len(cats) != 1 or cats[0][0].meta["val"].numel() < LARGE_CAT:
        return False
    ((cat, dim),) = cats
    xs = [x for x in cat.args[0] if isinstance(x, torch.fx.Node)]
    if any(not x.meta["val"].is_contiguous() for x in xs) or cat.meta["val"].dim() > ATEN_CAT_MAX_DIMS:
        return True
    return _pads_rows_to_vectors(cat, dim, xs)


def _large_copy(g):
    """A lone clone of at least LARGE_CAT elements from a view that repeats or strides its
    elements (Hugging Face's repeat_kv: a GQA decoder's keys and values expanded over the
    query heads and copied, [B, kv, rep, S, D] from [B, S, kv, D]): ATen copies such a view
    one element at a time (0.75 TB/s, 8 copies a step of the GQA decoder on an H200), a kernel
    of its own reads it broadcast and stores 16 bytes at a time. Measured routing still times
    the two on the first call."""
    if len(g.members) != 1 or g.members[0].target is not ops.aten.clone.default:
        return False
    src = g.members[0].args[0]
    val = src.meta.get("val") if isinstance(src, torch.fx.Node) else None
    return isinstance(val, torch.Tensor) and val.numel() >= LARGE_CAT and not val.is_contiguous()


_FILLS = (ops.aten.masked_fill.Scalar, ops.aten.masked_fill.Tensor)


def _lone_fill(g):
    """A lone out-of-place masked_fill of at least LARGE_CAT elements: ATen runs it as a clone
    and an in-place fill (two passes over the value, the second one element at a time where
    the mask broadcasts), a kernel of its own reads the value and the mask once and writes
    once. The MoE decoder zeroes its padded expert rows so around each grouped GEMM (12 a
    training step, 0.65 ms of ATen's clones and fills on an H200). Measured routing still
    times the two on the first call."""
    if len(g.members) != 1 or g.members[0].target not in _FILLS:
        return False
    val = g.members[0].meta.get("val")
    return isinstance(val, torch.Tensor) and val.numel() >= LARGE_CAT


def _pads_rows_to_vectors(cat, dim, xs):
    """cat along the last dim (dim) into contiguous rows of whole 16-byte vectors, from an
    operand whose rows are not."""
    val = cat.meta["val"]
    row_bytes = val.shape[-1] * val.element_size()
    if dim != val.dim() - 1 or not val.is_contiguous() or row_bytes % 16:
        return False
    return any(x.meta["val"].shape[-1] * x.meta["val"].element_size() % 16 for x in xs)


def _finish(g, min_ops):
    """Fills in a formed group's inputs, outputs and escapes, and routes it."""
    mset = set(g.members)
    for n in g.members:
        for a in n.all_input_nodes:
            if a not in mset and a not in g.inputs:
                g.inputs.append(a)
    for n in g.members:
        if any(u not in mset for u in n.users):
            g.outputs.append(n)
    # (a window op's getitems are its values, each an output, none escaping)
    g.escapes = [n for n in g.outputs if n is not g.members[-1] and g.kind != "window"]
    if g.kind == "gemm_bypass":
        g.kind = "gemm"
    elif g.kind == "gemm" and g.route == "bypass" and not g.reason:
        if sum(n.target not in ops.RESHAPE_OPS for n in g.members) < 2:
            g.reason = "lone GEMM: cuBLAS runs it"
        else:
            g.route = "kernel"
    elif g.kind in ("columns", "window", "scatter"):  # one op, but a kernel of its own against ATen's
        g.route, g.reason = "kernel", ""
    elif g.kind in ("pointwise", "rows"):
        # an expand to its own shape moves nothing: a group of views alone is no kernel
        compute = [n for n in g.members if n.target is not ops.aten.expand.default]
        if len(compute) < min_ops and not any(f(g) for f in (_large_cat, _large_copy, _lone_fill)):
            g.reason = "single op: nothing to fuse"
        else:
            g.route = "kernel"
            g.reason = ""


def split_apart(g, first_gid, min_ops=2):
    """The two GEMM groups a combined group g (siblings or a chain) was made of, as groups of
    their own (gids first_gid, first_gid + 1), routed as find_groups routes any GEMM group:
    what runs when the daemon refuses g. A chain's view between the products is in neither:
    it runs as the ATen op it is."""
    out = []
    for i, members in enumerate(g.parts):
        h = Group(first_gid + i, "gemm", list(members), shape=members[-1].meta["val"].shape)
        h.apart_of = g
        _finish(h, min_ops)
        out.append(h)
    return out


def epilogue_apart(g, gid, min_ops=2):
    """The epilogue of GEMM group g as a pointwise group of its own (gid), or None: what runs
    when measured routing finds g's fused kernel slower than its ATen ops. The product then
    runs on cuBLAS and its epilogue (bias, activation, residual, casts, the values saved for
    backward) as one kernel instead of one ATen kernel per op. A view of the product is in
    neither group (it runs as the ATen view it is). Siblings' shared epilogue (SwiGLU's
    silu(gate) * up over both products) is one group as well; a chain, whose epilogue holds
    its second product, or an epilogue with a reshape inside, has none."""
    if g.kind != "gemm" or g.chain:
        return None
    base = _product_and_views(g)
    members = [n for n in g.members if n not in base]
    if any(n.target in ops.RESHAPE_OPS for n in members):
        return None
    shape = members[-1].meta["val"].shape if members else None
    if not members or any(not same_known_shape(n.meta["val"].shape, shape) for n in members):
        return None
    h = Group(gid, "pointwise", members, shape=shape)
    h.apart_of = g
    _finish(h, min_ops)
    return h if h.route == "kernel" else None
