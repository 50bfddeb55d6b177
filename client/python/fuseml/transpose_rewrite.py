"""A graph rewrite before partitioning: a contiguous copy of a transposed pointwise value
computes the value in the copy's layout. A group runs over one iteration shape, and
  y = clone(permute(f(a, b), perm))          contiguous, f pointwise, read only through y
ran as two kernels: f's group wrote its value in f's layout, and a copy (ATen's or a lone
clone's) read it back transposed to write y. Rewritten as
  y = clone(f(permute(a, perm), permute(b, perm)))
the permutation moves to f's operands, which are views a kernel reads in place at their
strides, and y is one group's output: one pass where there were two.

The backward of rotary embeddings is the case that matters: the query's and key's gradients
come out of SDPA's backward as [B, H, S, D], the rotation's backward (a cat of two halves,
cat_rewrite.py) is computed there, and the projection's gradient GEMM reads it as
[B, S, H, D] through transpose + clone: two copies of [B, S, H*D] a layer that ATen ran on
their own.

The move goes as far up as it can at once: through every op above the value that is
pointwise or a cat (its dim follows the permutation), whose value only the op below reads
and whose rank is the value's. Any other operand becomes a leaf read through a permuted view
(an operand of lower rank is first unsqueezed on the left, as broadcasting aligns it). Exact:
an elementwise op commutes with a permutation of all its operands, and a cat along d of
permuted operands is the permuted cat along perm's image of d. The rewrite is dropped when
the result would not have the copy's shape, dtype and strides."""

import torch

from . import fake_meta, graph_code, ops
from ._log import log
from .fake_meta import same_layout, tensor_val

aten = torch.ops.aten
_MAX_OPS = 48  # ops moved under one copy: a pointwise chain, not a whole graph


def _perm(view):
    """The permutation of a permute or transpose node other than the identity, else None."""
    t = tensor_val(view.args[0]) if view.args else None
    if view.op != "call_function" or t is None or view.kwargs:
        return None
    if view.target not in (aten.permute.default, aten.transpose.int):
        return None
    perm = ops.permutation(view)
    return perm if sorted(perm) == list(range(t.dim())) and perm != list(range(t.dim())) else None


def _transposed_copy(node):
    """(value, perm) when node is clone(permute(value)) into a contiguous tensor, the permute
    read by the clone alone and value computed by a pointwise op or a cat read by the permute
    alone; else None."""
    val = tensor_val(node)
    if node.op != "call_function" or node.target is not aten.clone.default or val is None:
        return None
    if not val.is_contiguous() or node.kwargs.get("memory_format", torch.preserve_format) not in (
        torch.contiguous_format,
        torch.preserve_format,
    ):
        return None
    view = node.args[0]
    if not isinstance(view, torch.fx.Node) or len(view.users) != 1:
        return None
    perm = _perm(view)
    if perm is None:  # also a clone of an input or of a folded constant (no args)
        return None
    value = view.args[0]
    if not _movable(value, tensor_val(value).dim()) or len(value.users) != 1:
        return None
    return value, perm


def _movable(node, rank):
    """Can the permutation move above node: a pointwise op (not a broadcast) or a cat, of the
    value's rank, with no argument but tensors, numbers and dtypes (no sizes or dims a
    permutation would have to rewrite; a cat's dim is rewritten)?"""
    v = tensor_val(node)
    if v is None or v.dim() != rank or node.op != "call_function":
        return False
    if ops.cat_dim(node) is not None:
        return not node.kwargs
    if node.target is aten.expand.default or ops.why_not_pointwise(node) is not None:
        return False
    return not any(isinstance(a, (list, tuple)) for a in list(node.args) + list(node.kwargs.values()))


def _region(value, rank):
    """The ops the permutation moves above, in graph order: value and, recursively, each
    movable operand read by ops of the region alone."""
    region, todo = {value}, [value]
    while todo:
        n = todo.pop()
        for a in n.all_input_nodes:
            if a in region or not _movable(a, rank) or any(u not in region for u in a.users):
                continue
            region.add(a)
            todo.append(a)
            if len(region) > _MAX_OPS:
                return None
    return [n for n in value.graph.nodes if n in region]


def _hoist(gm, fake_mode, copy, value, perm):
    """Rewrites copy = clone(permute(value)) as above; False (the graph as it was) when the
    result would differ."""
    rank = len(perm)
    region = _region(value, rank)
    if region is None:
        return False
    moved, leaves, new = {}, {}, []

    def leaf(a, new):
        t = tensor_val(a)
        if t is None or t.dim() == 0:
            return a  # a scalar broadcasts the same either way
        if a not in leaves:
            x = a
            for _ in range(rank - t.dim()):
                x = fake_meta.call(gm, fake_mode, aten.unsqueeze.default, (x, 0), made=new)
            leaves[a] = fake_meta.call(gm, fake_mode, aten.permute.default, (x, perm), made=new)
        return leaves[a]

    def operand(a):
        if not isinstance(a, torch.fx.Node):
            return a
        return moved[a] if a in moved else leaf(a, new)

    try:
        with gm.graph.inserting_before(copy):
            for n in region:
                args, kwargs = torch.fx.node.map_arg((n.args, n.kwargs), operand)
                if ops.cat_dim(n) is not None:
                    args = (args[0], perm.index(ops.cat_dim(n))) + tuple(args[2:])
                moved[n] = fake_meta.call(gm, fake_mode, n.target, args, kwargs, made=new)
            out = fake_meta.call(
                gm, fake_mode, aten.clone.default, (moved[value],), {"memory_format": torch.contiguous_format}, new
            )
        if not same_layout(out.meta["val"], copy.meta["val"]):
            raise ValueError("the result would differ in shape, dtype or layout")
    except Exception as e:  # leave the copy as it was
        log.debug("fuseml: %s stays a copy of a transposed value: %s", copy.name, e)
        fake_meta.discard(gm, new)
        return False
    view = copy.args[0]
    copy.replace_all_uses_with(out)
    for n in [copy, view] + region[::-1]:
        gm.graph.erase_node(n)
    return True


def compute_in_copy_layout(gm):
    """Rewrites gm in place (above); returns whether anything changed."""
    fake_mode, found = fake_meta.matches(gm, _transposed_copy)
    if not found:
        return False
    changed = False
    for copy, (value, perm) in found:
        changed |= _hoist(gm, fake_mode, copy, value, perm)
    if changed:
        gm.graph.lint()
        graph_code.edited(gm)
        log.debug("fuseml: transposed copies computed in their layout:\n%s", graph_code.source(gm))
    return changed
