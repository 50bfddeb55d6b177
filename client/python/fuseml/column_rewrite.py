"""A graph rewrite before partitioning: a reduction over the leading dims of a contiguous
tensor becomes a column reduction (vocabulary 5) of its 2-D view.

Weight gradients reduce over batch and tokens: an RMSNorm's `(g * x).sum([0, 1], keepdim)` of
a [B, S, D] tensor, a learned attention bias's `sum([0])` of [B, H, S, S]. Each is the column
sum of the same elements seen as [B * S, D] (or [B, H * S * S]), which a column group runs:
  r = sum(x, [0, 1], True)  ->  view(sum(view(x, [B * S, D]), [0], True), [1, 1, D])
Exact: the views are the same memory (x is contiguous), the reduction the same elements.
Static shapes only (a symbolic size would have to flow through the views as a graph value);
anything else is left as it was. A reduction to the columns alone ([D] of a [B, S, D] sum
without keepdim) is the 2-D reduction's own [D] result, with no view after it, so that a cast
of it can join the column group.

The pointwise ops that compute x (its prologue) are written again over 2-D views of their
operands when every operand outside the chain is contiguous and full ([B, S, D] read as
[B * S, D]), per row ([B, S, 1] as [B * S, 1]), per column ([D] or [1, 1, D] as [1, D]) or a
0-dim scalar. The column group then computes its operand from those inputs instead of
reading a materialised copy: LayerNorm's weight gradient (g * x_hat).sum([0, 1]) reads g, x
and the per-row mean and rstd, not an fp32 g * x_hat that the rows group beside it would have
to write for it. The chain's original ops stay for their other readers (that rows group) and
go where nothing else reads them."""

import math

import torch
from torch._guards import detect_fake_mode

from . import fake_meta, graph_code, ops
from .shapes import is_plain_int

aten = torch.ops.aten


def _leading(node):
    """(M, N, k) when node reduces dims 0..k-1 (1 <= k < rank, rank >= 3) of a contiguous float
    tensor of static shape into its own dtype, else None."""
    if node.op != "call_function" or node.target not in ops.COLUMN_REDUCTIONS:
        return None
    if set(node.kwargs) - {"dim", "keepdim"} or len(node.args) > 3:
        return None
    x, val = node.args[0], node.meta.get("val")
    t = x.meta.get("val") if isinstance(x, torch.fx.Node) else None
    if not isinstance(t, torch.Tensor) or not isinstance(val, torch.Tensor) or t.dim() < 3:
        return None
    if t.dtype not in ops.DTYPES or t.dtype == torch.bool or val.dtype != t.dtype:
        return None
    dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    if not isinstance(dims, (list, tuple)) or not dims or not all(isinstance(d, int) for d in dims):
        return None
    k = len(dims)
    if sorted(d % t.dim() for d in dims) != list(range(k)) or k >= t.dim():
        return None
    if not all(is_plain_int(d) for d in t.shape) or not all(is_plain_int(s) for s in t.stride()):
        return None
    if not t.is_contiguous():
        return None
    return math.prod(int(d) for d in t.shape[:k]), math.prod(int(d) for d in t.shape[k:]), k


MAX_PROLOGUE = 24  # ops of a chain written again over the 2-D views (a longer one: x as is)


def _in_space(node, shape):
    """Can node be written again over the 2-D view: a pointwise op (not a clone or expand,
    whose meaning is their strides) producing exactly `shape`?"""
    if node.op != "call_function" or node.target in ops.ALIASES or ops.why_not_pointwise(node):
        return False
    val = node.meta.get("val")
    return isinstance(val, torch.Tensor) and list(val.shape) == shape


def _read_as(t, shape, k, m, n):
    """The 2-D shape operand t (broadcast to `shape`, reduced over its first k dims) is read
    at: [m, n] full, [m, 1] per row, [1, n] per column, [1, 1] one element; [] for a 0-dim
    tensor (read as it is: its type promotion is a scalar's); None for anything else."""
    if t.dim() == 0:
        return []
    if not t.is_contiguous() or not all(is_plain_int(d) for d in t.shape) or t.dim() > len(shape):
        return None
    s = [1] * (len(shape) - t.dim()) + [int(d) for d in t.shape]
    lead, tail = s[:k], s[k:]
    rows = [m] if lead == shape[:k] else [1] if all(d == 1 for d in lead) else None
    cols = [n] if tail == shape[k:] else [1] if all(d == 1 for d in tail) else None
    return None if rows is None or cols is None else rows + cols


def _prologue(x, shape, k, m, n):
    """(the chain of pointwise nodes computing x over `shape`; {operand: its 2-D shape} for
    the nodes outside the chain that it reads), or None when x is not such a node. An op of
    the chain with an operand that cannot be read in the 2-D space (a position embedding
    [1, S, D] broadcast over the batch) is read itself instead, as a full operand, and so is
    every op past MAX_PROLOGUE, and a 16-bit value that other ops read too (written for
    them anyway, it costs two bytes an element to read where recomputing it would add reads
    of its own operands and make the groups that compute them write those)."""
    chain = set()

    def visit(node):
        """Takes node into the chain when each of its operands is a chain node or can be read."""
        if node in chain:
            return True
        if len(chain) >= MAX_PROLOGUE or not _in_space(node, shape):
            return False
        if node.meta["val"].element_size() < 4 and len(node.users) > 1:
            return False  # a 16-bit value read elsewhere too: written anyway, read as is
        for a in node.all_input_nodes:
            if not visit(a) and _leaf_view(a, shape, k, m, n) is None:
                return False
        chain.add(node)
        return True

    if not visit(x):
        return None
    used, leaves, stack = set(), {}, [x]  # the chain's nodes that x is computed from
    while stack:
        node = stack.pop()
        if node in used:
            continue
        used.add(node)
        for a in node.all_input_nodes:
            if a in chain:
                stack.append(a)
            else:
                leaves[a] = _leaf_view(a, shape, k, m, n)
    return used, leaves


def _leaf_view(a, shape, k, m, n):
    t = a.meta.get("val")
    return _read_as(t, shape, k, m, n) if isinstance(t, torch.Tensor) else None


def _reads(leaves, results, hops=64):
    """Is any of leaves computed from one of results (within `hops` nodes upwards)?"""
    seen, todo = set(), list(leaves)
    while todo and len(seen) < hops:
        a = todo.pop()
        if a in results:
            return True
        if a not in seen:
            seen.add(a)
            todo += a.all_input_nodes
    return False


def _flatten(gm, x, shape, k, m, n, fake_mode, made, results):
    """(the 2-D [m, n] node whose elements are x's, inserted at the graph's insertion point;
    the nodes of x's prologue it replaces): x's prologue written again over the 2-D views
    (above), or a view of x. made: {(node, m, n): its 2-D node} of the reductions before this
    one, reused (the weight's and the bias's gradients of one LayerNorm read one g) unless x
    reads one of their results: a reduction after another (batch norm's variance after its
    mean) runs in a column group of its own, which computes its prologue again rather than
    read a value the first group would then have to write for it."""
    found = _prologue(x, shape, k, m, n)
    if found is None:
        flat = gm.graph.call_function(aten.view.default, (x, [m, n]))
        flat.meta["val"] = fake_meta.run(fake_mode, aten.view.default, (x.meta["val"], [m, n]))
        return flat, set()
    chain, leaves = found
    shared = list(leaves) if _reads(leaves, results) else list(chain) + list(leaves)
    new = {a: made[(a, m, n)] for a in shared if (a, m, n) in made}
    for leaf, at in leaves.items():
        if leaf in new:
            continue
        if not at:
            new[leaf] = leaf
            continue
        v = new[leaf] = made[(leaf, m, n)] = gm.graph.call_function(aten.view.default, (leaf, at))
        v.meta["val"] = fake_meta.run(fake_mode, aten.view.default, (leaf.meta["val"], at))
    for node in x.graph.nodes:  # graph order: operands before their readers
        if node not in chain or node in new:
            continue
        args = torch.fx.node.map_arg(node.args, new.__getitem__)
        kwargs = torch.fx.node.map_arg(node.kwargs, new.__getitem__)
        c = new[node] = made[(node, m, n)] = gm.graph.call_function(node.target, args, kwargs)
        vals = torch.fx.node.map_arg((args, kwargs), lambda a: a.meta["val"])
        c.meta["val"] = fake_meta.run(fake_mode, node.target, *vals)
    return new[x], chain


def _drop_unread(gm, nodes):
    """Erases those of nodes nothing reads any more (pure pointwise ops), readers first."""
    for node in reversed(list(gm.graph.nodes)):
        if node in nodes and not node.users:
            gm.graph.erase_node(node)


def spell_columns(gm):
    """Rewrites gm in place (above); returns whether anything changed."""
    found = [(n, mnk) for n in gm.graph.nodes for mnk in [_leading(n)] if mnk is not None]
    if not found:
        return False
    fake_mode = detect_fake_mode([n.meta.get("val") for n in gm.graph.nodes])
    if fake_mode is None:
        return False
    replaced, made, results = set(), {}, set()
    for node, (m, n, k) in found:
        x, shape = node.args[0], [int(d) for d in node.meta["val"].shape]
        columns_only = shape == [n]  # no keepdim: the 2-D reduction's own [n] result
        with gm.graph.inserting_before(node):
            flat, chain = _flatten(gm, x, [int(d) for d in x.meta["val"].shape], k, m, n, fake_mode, made, results)
            red = gm.graph.call_function(node.target, (flat, [0], not columns_only))
            red.meta["val"] = fake_meta.run(fake_mode, node.target, (flat.meta["val"], [0], not columns_only))
            out = red
            if not columns_only:
                out = gm.graph.call_function(aten.view.default, (red, shape))
                out.meta["val"] = fake_meta.run(fake_mode, aten.view.default, (red.meta["val"], shape))
        node.replace_all_uses_with(out)
        gm.graph.erase_node(node)
        replaced |= chain
        results |= {red, out}
    _drop_unread(gm, replaced)
    gm.graph.lint()
    graph_code.edited(gm)
    return True
