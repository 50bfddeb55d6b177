"""Graph rewrites that spell concatenations as aten.cat, so that the partitioner can fuse them
(vocabulary 6), before any group is formed.

Autograd writes the backward of a cat of slices (rotary embeddings' rotate_half) as
  s1 = slice(g, d, 0, h); s2 = slice(g, d, h, n)       g = grad * sin, computed in the graph
  add(slice_backward(neg(s1), shape, d, h, n), slice_backward(s2, shape, d, 0, h))
Two rewrites, each exact (elementwise ops commute with slicing; zeros added to a tile are
the tile), turn it into one pointwise group:
  * slice_backward nodes of one shape whose ranges tile dim d, summed (two, or up to 8: a
    fused QKV projection's three): cat of them, in range order (the only difference: -0.0
    stays -0.0 where 0.0 + -0.0 gave 0.0);
  * a slice along d of a pointwise node read only by slices and pointwise ops, on its way to
    a cat: the node applied to slices of its operands (an operand of size 1 along d is not
    sliced), so the slices reach the graph's inputs, where they are views the kernel reads
    in place.
And a stack copied into a transposed layout, what the backward of q, k, v = qkv.unbind()
after a permute writes (timm's attention: the three gradients of SDPA into the QKV
projection's [B, N, 3, H, D] layout),
  clone(permute(stack([dq, dk, dv], d), perm))   (the clone contiguous)
is the cat of the permuted operands along d's new place, which is contiguous too:
  cat([permute(unsqueeze(dq, d), perm), ...], perm.index(d))
one pass that reads each gradient in place where ATen ran two copies (the stack, then the
clone of its permuted view).
Nothing else changes: a graph without these patterns is left as it was."""

import torch
from torch._guards import detect_fake_mode

from . import fake_meta, graph_code, ops
from ._log import log
from .shapes import is_plain_int, same_known_shape

aten = torch.ops.aten
_SLICE = aten.slice.Tensor
_SLICE_BACKWARD = aten.slice_backward.default
_MAX_HOPS = 8  # pointwise ops between a slice and the cat it feeds


def _range(node):
    """(dim, start, end) of a step-1 slice node over its operand's static size, else None."""
    args = list(node.args) + [None] * 5
    x, dim, start, end, step = args[:5]
    t = x.meta.get("val") if isinstance(x, torch.fx.Node) else None
    if not isinstance(t, torch.Tensor) or (step or 1) != 1 or node.kwargs:
        return None
    dim = 0 if dim is None else dim
    if not isinstance(dim, int) or not -t.dim() <= dim < t.dim():
        return None
    dim %= t.dim()
    n = t.shape[dim]
    if not is_plain_int(n) or not all(v is None or isinstance(v, int) for v in (start, end)):
        return None
    start = 0 if start is None else (start + n if start < 0 else start)
    end = n if end is None else (end + n if end < 0 else end)
    start, end = max(0, min(start, n)), max(0, min(end, n))
    return (dim, start, end) if start < end else None


def _tile(node):
    """(grad, dim, start, end) of a slice_backward(grad, sizes, dim, start, end, 1) node, else
    None."""
    if node.op != "call_function" or node.target is not _SLICE_BACKWARD or node.kwargs:
        return None
    grad, sizes, dim, start, end, step = node.args
    val = node.meta.get("val")
    if step != 1 or not isinstance(grad, torch.fx.Node) or not isinstance(val, torch.Tensor):
        return None
    if not isinstance(dim, int) or not all(isinstance(v, int) for v in (start, end)):
        return None
    dim %= val.dim()
    n = val.shape[dim]
    if not is_plain_int(n):
        return None
    start = start + n if start < 0 else start
    end = min(end + n if end < 0 else end, n)
    return grad, dim, start, end


def _is_plain_add(node):
    return (
        isinstance(node, torch.fx.Node)
        and node.op == "call_function"
        and node.target is aten.add.Tensor
        and not node.kwargs
        and len(node.args) == 2
    )


def _sum_tree(node, limit=8):
    """(leaves, inner adds) of the sum `node` is, through adds read only by the add above
    them (inner adds listed readers first); None past `limit` leaves."""
    leaves, inner, todo = [], [], list(node.args)
    while todo:
        a = todo.pop(0)
        if _is_plain_add(a) and len(a.users) == 1:
            inner.append(a)
            todo[:0] = list(a.args)
        else:
            leaves.append(a)
        if len(leaves) > limit:
            return None
    return leaves, inner


def _tiles_to_cat(gm):
    """A sum of slice_backward nodes whose ranges tile the dim -> cat of their gradients, in
    range order (two: rotate_half's backward; three: a fused QKV projection's, Phi-3's)."""
    changed, gone = False, set()
    for node in list(gm.graph.nodes):
        if node in gone or not _is_plain_add(node):
            continue
        tree = _sum_tree(node)
        if tree is None or not all(isinstance(a, torch.fx.Node) for a in tree[0]):
            continue
        leaves, inner = tree
        parts = [_tile(a) for a in leaves]
        if None in parts or any(len(a.users) != 1 for a in leaves):
            continue
        dims, sizes = {p[1] for p in parts}, {tuple(a.args[1]) for a in leaves}
        if len(dims) != 1 or len(sizes) != 1:
            continue
        parts.sort(key=lambda p: p[2])
        n = node.meta["val"].shape[parts[0][1]]
        bounds = [0] + [p[3] for p in parts]
        if any(p[2] != b for p, b in zip(parts, bounds)) or bounds[-1] != n:
            continue
        with gm.graph.inserting_before(node):
            cat = gm.graph.call_function(aten.cat.default, ([p[0] for p in parts], parts[0][1]))
        cat.meta = dict(node.meta)
        node.replace_all_uses_with(cat)
        for a in [node] + inner + leaves:
            gm.graph.erase_node(a)
        gone.update(inner + leaves)
        changed = True
    return changed


def _feeds_cat(node):
    """Does node reach an aten.cat through pointwise ops only (at most _MAX_HOPS)?"""
    frontier, seen = [node], set()
    for _ in range(_MAX_HOPS):
        nxt = []
        for n in frontier:
            for u in n.users:
                if u in seen:
                    continue
                seen.add(u)
                if ops.cat_dim(u) is not None:
                    return True
                if ops.why_not_pointwise(u) is None:
                    nxt.append(u)
        frontier = nxt
    return False


def _only_pointwise_readers(x):
    """Are x's readers slices and pointwise ops? A slice of x that moves above x then makes
    the cat's group compute its part of x again, where a pointwise reader's group computes
    x whole: the same reads in one kernel instead of x written by one group for the next
    (a GQA key's gradient, summed over the repeated heads, read by the rotation's backward
    both sliced and whole). A reader that is neither (a GEMM, a reduction) needs x
    written anyway, and its slices are views of it."""
    return all(u.target is _SLICE or (u.op == "call_function" and ops.why_not_pointwise(u) is None) for u in x.users)


def _push_slices(gm, fake_mode):
    """slice(f(a, b), d, s, e) -> f(slice(a), slice(b)) for a pointwise f read only by slices
    that feed a cat and by pointwise ops (_only_pointwise_readers)."""
    changed = False
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not _SLICE:
            continue
        x = node.args[0]
        if not isinstance(x, torch.fx.Node) or x.op != "call_function" or ops.why_not_pointwise(x) is not None:
            continue
        rng = _range(node)
        if rng is None or not _only_pointwise_readers(x) or not _feeds_cat(node):
            continue
        dim, start, end = rng
        rank = x.meta["val"].dim()

        def sliced(a):
            t = a.meta.get("val") if isinstance(a, torch.fx.Node) else None
            if not isinstance(t, torch.Tensor):
                return a
            d = dim - (rank - t.dim())  # broadcasting aligns dims from the right
            if d < 0 or t.shape[d] == 1:
                return a  # broadcast along the sliced dim: as it is
            s = gm.graph.call_function(_SLICE, (a, d, start, end))
            s.meta["val"] = fake_meta.run(fake_mode, _SLICE, (t, d, start, end), {})
            return s

        with gm.graph.inserting_before(node):
            args = torch.fx.node.map_arg(x.args, sliced)
            kwargs = torch.fx.node.map_arg(x.kwargs, sliced)
            y = gm.graph.call_function(x.target, args, kwargs)
        vals = torch.fx.node.map_arg((args, kwargs), lambda a: a.meta["val"])
        y.meta["val"] = fake_meta.run(fake_mode, x.target, *vals)
        node.replace_all_uses_with(y)
        gm.graph.erase_node(node)
        if not x.users:
            gm.graph.erase_node(x)
        changed = True
    return changed


def _inner_cat(p, dim):
    """An aten.cat along `dim` that pointwise node p computes from, through pointwise nodes
    read only by the chain (at most _MAX_HOPS), whose size along dim is p's: the rotation
    inside a partial rotary embedding, cat([-x2, x1]) * sin + x * cos. Else None."""
    size = p.meta["val"].shape[dim]
    frontier, seen = [p], set()
    for _ in range(_MAX_HOPS):
        nxt = []
        for n in frontier:
            for a in n.all_input_nodes:
                if a in seen or len(a.users) != 1:
                    continue
                seen.add(a)
                if ops.cat_dim(a) == dim and a.meta["val"].dim() == p.meta["val"].dim():
                    if a.meta["val"].shape[dim] == size:
                        return a
                if a.op == "call_function" and ops.why_not_pointwise(a) is None:
                    nxt.append(a)
        frontier = nxt
    return None


def _split_nested(gm, fake_mode):
    """cat([p, y], d) where pointwise p is computed from a cat along d of p's size (partial
    rotary embeddings: GPT-NeoX, Phi-2, StableLM concatenate the rotated part, itself made
    with a cat, and the part passed through): p is read as its slices at the inner cat's
    boundaries, which _push_slices then moves to the inner cat's operands. The daemon takes
    no cat of a cat; one cat of three parts is one kernel where the outer cat was a copy."""
    changed = False
    for node in list(gm.graph.nodes):
        dim = ops.cat_dim(node)
        if dim is None:
            continue
        xs, new = list(node.args[0]), []
        for p in xs:
            inner = None
            if isinstance(p, torch.fx.Node) and len(p.users) == 1 and p.op == "call_function":
                if ops.why_not_pointwise(p) is None:
                    inner = _inner_cat(p, dim)
            if inner is None:
                new.append(p)
                continue
            bounds = [0]
            for x in inner.args[0]:
                bounds.append(bounds[-1] + int(x.meta["val"].shape[dim]))
            with gm.graph.inserting_before(node):
                for s, e in zip(bounds, bounds[1:]):
                    piece = gm.graph.call_function(_SLICE, (p, dim, s, e))
                    piece.meta["val"] = fake_meta.run(fake_mode, _SLICE, (p.meta["val"], dim, s, e), {})
                    new.append(piece)
        if len(new) != len(xs) and len(new) <= ops.MAX_CAT:
            node.args = (new,) + tuple(node.args[1:])
            changed = True
        elif len(new) != len(xs):  # too many parts: as it was
            for piece in new:
                if piece not in xs:
                    gm.graph.erase_node(piece)
    return changed


def _slices_of_cats(gm):
    """slice(cat(xs, d), d, s, e) spanning exactly one operand of the cat: that operand."""
    changed = False
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not _SLICE:
            continue
        c, rng = node.args[0], _range(node)
        if rng is None or not isinstance(c, torch.fx.Node) or ops.cat_dim(c) != rng[0]:
            continue
        at = 0
        for x in c.args[0]:
            n = int(x.meta["val"].shape[rng[0]])
            if (at, at + n) == (rng[1], rng[2]) and same_known_shape(x.meta["val"].shape, node.meta["val"].shape):
                node.replace_all_uses_with(x)
                gm.graph.erase_node(node)
                if not c.users:
                    gm.graph.erase_node(c)
                changed = True
                break
            at += n
    return changed


def _stack_copy(node):
    """(operands, d, perm) when node is clone(permute(stack(operands, d), perm)) into a
    contiguous tensor, each of stack and permute read by the next alone; else None."""
    val = node.meta.get("val")
    if node.target is not aten.clone.default or not isinstance(val, torch.Tensor) or not val.is_contiguous():
        return None
    p = node.args[0]
    if not isinstance(p, torch.fx.Node) or p.target is not aten.permute.default or len(p.users) != 1:
        return None
    s = p.args[0]
    if not isinstance(s, torch.fx.Node) or s.target is not aten.stack.default or len(s.users) != 1:
        return None
    xs = s.args[0]
    d = s.args[1] if len(s.args) > 1 else s.kwargs.get("dim", 0)
    if not isinstance(xs, (list, tuple)) or not 2 <= len(xs) <= ops.MAX_CAT or not isinstance(d, int):
        return None
    rank = s.meta["val"].dim()
    return list(xs), d % rank, [int(i) % rank for i in p.args[1]]


def _stacks_to_cat(gm, fake_mode):
    changed = False
    for node in list(gm.graph.nodes):
        found = _stack_copy(node)
        if found is None:
            continue
        xs, d, perm = found
        permute, stack = node.args[0], node.args[0].args[0]
        with gm.graph.inserting_before(node):
            parts = []
            for x in xs:
                u = gm.graph.call_function(aten.unsqueeze.default, (x, d))
                u.meta["val"] = fake_meta.run(fake_mode, aten.unsqueeze.default, (x.meta["val"], d), {})
                v = gm.graph.call_function(aten.permute.default, (u, perm))
                v.meta["val"] = fake_meta.run(fake_mode, aten.permute.default, (u.meta["val"], perm), {})
                parts.append(v)
            cat = gm.graph.call_function(aten.cat.default, (parts, perm.index(d)))
            cat.meta["val"] = fake_meta.run(
                fake_mode, aten.cat.default, ([v.meta["val"] for v in parts], perm.index(d)), {}
            )
        if cat.meta["val"].shape != node.meta["val"].shape or cat.meta["val"].stride() != node.meta["val"].stride():
            for n in [cat] + parts[::-1] + [v.args[0] for v in parts[::-1]]:
                gm.graph.erase_node(n)
            continue
        node.replace_all_uses_with(cat)
        for n in (node, permute, stack):
            gm.graph.erase_node(n)
        changed = True
    return changed


def _empty(node):
    t = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return isinstance(t, torch.Tensor) and all(is_plain_int(d) for d in t.shape) and t.numel() == 0


def _stands_for(x, node):
    """Can node x stand for `node`'s value: a tensor of its shape and dtype?"""
    t, want = x.meta.get("val") if isinstance(x, torch.fx.Node) else None, node.meta["val"]
    return isinstance(t, torch.Tensor) and same_known_shape(t.shape, want.shape) and t.dtype == want.dtype


def _copy_of(gm, fake_mode, node, x):
    """What replaces `node`, a fresh value equal to x: x itself where the graph does not
    return node (no reader sees the difference), else a contiguous clone of x (a graph output
    keeps the layout and identity it was traced with; the clone joins x's group)."""
    if not any(u.op == "output" for u in node.users):
        return x
    with gm.graph.inserting_before(node):
        return fake_meta.call(gm, fake_mode, aten.clone.default, (x,), {"memory_format": torch.contiguous_format})


def _drop_empty(gm, fake_mode):
    """Operands with no elements, which change nothing: a cat's are dropped (a cat of one
    operand left is that operand), and an add of slice_backward of an empty gradient (zeros)
    is its other operand. Hugging Face's rotary embeddings with the whole head rotated
    (Phi-3: partial_rotary_factor 1.0) concatenate an empty pass-through slice to q and k, and
    the backward adds its zero gradient back: a copy, a zeroed tensor and an add a layer for
    nothing."""
    changed = False
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not aten.cat.default or node.kwargs:
            continue
        xs = list(node.args[0])
        kept = [x for x in xs if not _empty(x)]
        if len(kept) == len(xs) or not kept:
            continue
        if len(kept) > 1:  # the cat stays, of fewer operands
            node.args = (kept,) + tuple(node.args[1:])
        else:
            if not _stands_for(kept[0], node):
                continue
            node.replace_all_uses_with(_copy_of(gm, fake_mode, node, kept[0]))
            gm.graph.erase_node(node)
        changed = True
    for node in list(gm.graph.nodes):
        if not _is_plain_add(node):
            continue
        zeros = [
            a for a in node.args if isinstance(a, torch.fx.Node) and a.target is _SLICE_BACKWARD and _empty(a.args[0])
        ]
        others = [a for a in node.args if a not in zeros]
        if len(zeros) != 1 or len(others) != 1 or not _stands_for(others[0], node):
            continue
        node.replace_all_uses_with(_copy_of(gm, fake_mode, node, others[0]))
        gm.graph.erase_node(node)
        if not zeros[0].users:
            gm.graph.erase_node(zeros[0])
        changed = True
    return changed


def spell_cats(gm):
    """Rewrites gm in place (above); returns whether anything changed."""
    if not any(n.target in (_SLICE_BACKWARD, aten.stack.default, aten.cat.default) for n in gm.graph.nodes):
        return False
    fake_mode = detect_fake_mode([n.meta.get("val") for n in gm.graph.nodes])
    if fake_mode is None:
        return False
    stacks = _drop_empty(gm, fake_mode)
    stacks |= _stacks_to_cat(gm, fake_mode)
    changed = _tiles_to_cat(gm)
    changed |= _split_nested(gm, fake_mode)
    # each pass moves a slice one op towards the inputs, where a slice of a cat at one of its
    # operands is that operand
    for _ in range(_MAX_HOPS if changed else 0):
        pushed = _push_slices(gm, fake_mode)
        if not (_slices_of_cats(gm) or pushed):
            break
    changed |= stacks
    if changed:
        gm.graph.lint()
        graph_code.edited(gm)
        log.debug("fuseml: concatenations spelled as aten.cat:\n%s", graph_code.source(gm))
    return changed
