"""A graph rewrite before partitioning: per-column ops on a column reduction's result run in
the reduction's own shape, so that they join its column group as its epilogue.

Batch norm in training, decomposed over channels-last values: its statistics are column
reductions of the [N * H * W, C] value (means of shape [1, C]), and what is computed from them
per channel (rsqrt(var + eps) saved for the backward, the running mean and variance updates,
the casts of the saved statistics) reads them through views to [1, C, 1, 1], [1, 1, 1, C] or
[C]. A group takes in only ops that read its members, so a view between the reduction and
such an op kept them apart: each ran as a kernel of its own, five a batch norm, 265 launches
in a ResNet-50 forward. Rewritten, op(view(s)) is view(op(s)): the op reads the reduction and
joins its column group, whose epilogue computes it once per column; its other operands (a
running statistic of shape [C]) are viewed to the reduction's shape.

Exact: a value with one dim other than 1 holds its elements in the same order under every
view, so an elementwise op computes the same values in either shape. Only values of that
kind are touched, and only ops whose every tensor operand is one (no broadcast changes)."""

import torch

from . import fake_meta, graph_code, ops
from ._log import log
from .fake_meta import tensor_val
from .shapes import is_plain_int

aten = torch.ops.aten
# views that keep a one-dim value's elements in order
VIEWS = {
    aten.view.default,
    aten._unsafe_view.default,
    aten.reshape.default,
    aten.permute.default,
    aten.squeeze.dims,
    aten.squeeze.dim,
    aten.squeeze.default,
    aten.unsqueeze.default,
}


def _length(t):
    """n when tensor t has static sizes, exactly one of them other than 1, and that one is n
    (n > 1): a vector, whatever its rank; else None."""
    if t is None or not all(is_plain_int(d) for d in t.shape):
        return None
    big = [int(d) for d in t.shape if int(d) != 1]
    return big[0] if len(big) == 1 else None


def _follows(a, node):
    """Is a a pointwise op of vectors as long as node's, read by node alone (it would be a
    kernel of its own beside node's group otherwise)?"""
    n = _length(tensor_val(node))
    return (
        ops.computes_pointwise(a)
        and list(a.users) == [node]
        and _length(tensor_val(a)) == n
        and all(_length(tensor_val(b)) == n for b in a.all_input_nodes)
    )


def keep_column_shape(gm):
    """Rewrites gm in place (above); returns how many ops now run in a reduction's shape."""
    mode = None
    roots = {}  # node -> the column-shaped node ([N] or [1, N]) holding the same elements
    moved = 0
    for node in list(gm.graph.nodes):
        val = tensor_val(node)
        n = _length(val)
        if n is None or node.op != "call_function":
            continue
        if ops.column_reduction(node) is not None:
            roots[node] = node
            continue
        if node.target in VIEWS:
            src = node.args[0]
            if src in roots and _length(tensor_val(roots[src])) == n:
                roots[node] = roots[src]
            continue
        if not ops.computes_pointwise(node):
            continue
        operands = node.all_input_nodes
        rooted = [a for a in operands if a in roots]
        if not rooted or any(_length(tensor_val(a)) != n for a in operands):
            continue
        shape = list(tensor_val(roots[rooted[0]]).shape)
        if all(a in roots and roots[a] is a for a in operands) and list(val.shape) == shape:
            roots[node] = node  # already in the shape, reading the reductions' values
            continue
        mode = mode or fake_meta.mode_of(gm)
        new = _in_shape(gm, mode, node, shape, roots)
        if new is not None:
            roots[new] = new
            moved += 1
    if moved:
        for node in reversed(list(gm.graph.nodes)):  # the views the moved ops read through
            if node.op == "call_function" and node.target in VIEWS and not node.users:
                gm.graph.erase_node(node)
        gm.graph.lint()
        graph_code.edited(gm)
        log.debug("fuseml: %d per-column ops run in their column reduction's shape", moved)
    return moved


def _in_shape(gm, mode, node, shape, roots):
    """node computed over `shape` from its operands' roots (or their views to `shape`), then
    viewed back to node's shape for its users; the new op, or None (the graph as it was)
    when the value would differ in dtype."""
    made = []
    seen = {}  # an operand read twice (x * x) is pulled once: the pull erases it

    def operand(a):
        if not isinstance(a, torch.fx.Node):
            return a
        if a not in seen:
            seen[a] = _operand(a)
        return seen[a]

    def _operand(a):
        if a in roots and list(tensor_val(roots[a]).shape) == shape:
            return roots[a]
        if _follows(a, node):  # an op of node's alone (0.9 * running_mean) moves with it
            pulled = _in_shape(gm, mode, a, shape, roots)
            if pulled is not None:
                return pulled
        if list(tensor_val(a).shape) == shape:
            return a
        return fake_meta.call(gm, mode, aten.view.default, (a, shape), None, made)

    try:
        with gm.graph.inserting_before(node):
            args = [operand(a) for a in node.args]
            new = fake_meta.call(gm, mode, node.target, args, node.kwargs, made)
            back = fake_meta.call(gm, mode, aten.view.default, (new, list(tensor_val(node).shape)), None, made)
        if tensor_val(back).dtype != tensor_val(node).dtype:
            raise ValueError("the value would change dtype")
    except Exception as e:  # leave the op as it was
        log.debug("fuseml: %s stays in its shape: %s", node.name, e)
        fake_meta.discard(gm, made)
        return None
    node.replace_all_uses_with(back)
    gm.graph.erase_node(node)
    roots[back] = new
    return new
