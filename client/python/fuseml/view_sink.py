"""A graph rewrite before partitioning: a reshape between two pointwise ops moves below the
second, whose other operands are reshaped the same way, so that the two ops fuse. A group
runs over one iteration shape, and a reshape between its ops splits it in two kernels, the
first writing its whole value for the second to read back.

Cross-entropy's backward on a causal LM's flattened logits (Hugging Face returns the logits
too, so the graph adds their own gradient):
  g = mul(where(eq, exp - 1, exp), w)                     [N, V] fp32, the loss's rows
  d = add(tangent, _to_copy(view(g, [B, S, V]), bf16))    [B, S, V] bf16
ran as two kernels, the first writing g in fp32 (4 bytes an element over the whole
vocabulary) for the second to read. Rewritten as
  d = view(add(view(tangent, [N, V]), _to_copy(g, bf16)), [B, S, V])
the cast and the add join g's group: one pass writes the bf16 gradient.

Exact: the ops are elementwise, and a view of a contiguous value re-indexes the same elements
in the same order. Moved only where every value involved is contiguous (the views exist),
where the reshape's source is itself computed by a pointwise op or a row reduction (a GEMM's
product keeps the view its group looks through, siblings.py and chains.py read that form),
and where each other operand of the op has the reshape's shape or one element.

A broadcast (an expand of a per-row value to its rows) moves the same way: a pointwise op of
one tensor operand runs before it (per row, not per element), and an op with another operand
of the broadcast shape reads the unexpanded value, broadcasting as the expand did. The
backward of Hugging Face's RMSNorm expands a per-row sum to the rows before dividing and
scaling it; the expand, an op no group takes, cut the norm's backward in two kernels, the
first writing an fp32 row-shaped value for the second. Exact for the same reason: an
elementwise op of a broadcast value is the broadcast of the op's value.

A round trip goes first, and again after the moves: a reshape that undoes earlier ones
through pointwise ops (_undo_round_trips), the ops then computed over the first shape."""

import torch

from . import fake_meta, graph_code, ops
from ._log import log
from .fake_meta import same_layout, tensor_val
from .shapes import is_plain_int

aten = torch.ops.aten
RESHAPES = {aten.view.default, aten._unsafe_view.default, aten.reshape.default}
EXPANDS = {aten.expand.default}
_MAX_PASSES = 8


def _plain_contiguous(t):
    return t is not None and all(is_plain_int(d) for d in t.shape) and t.is_contiguous()


def _broadcast_reader(expand):
    """For an expand: ("before", reader) when its one reader is a pointwise op of no other
    tensor operand (it moves before the expand), ("drop", reader) when a reader has another
    operand of the expanded shape (it reads the value unexpanded), else None."""
    if expand.op != "call_function" or expand.target not in EXPANDS or not expand.users:
        return None
    x, y = expand.args[0], tensor_val(expand)
    if (
        not isinstance(x, torch.fx.Node)
        or tensor_val(x) is None
        or y is None
        or not all(is_plain_int(d) for d in y.shape)
        or any(isinstance(a, torch.fx.Node) for a in expand.args[1:])
    ):
        return None
    for reader in expand.users:
        if (
            not ops.computes_pointwise(reader)
            or tensor_val(reader) is None
            or tuple(tensor_val(reader).shape) != tuple(y.shape)
        ):
            continue
        others = [a for a in reader.all_input_nodes if a is not expand]
        if not others and len(expand.users) == 1:
            return "before", reader
        if any(tensor_val(a) is not None and tuple(tensor_val(a).shape) == tuple(y.shape) for a in others):
            return "drop", reader
    return None


def _movable(view):
    """The pointwise reader the reshape `view` can move below, or None."""
    if view.op != "call_function" or view.target not in RESHAPES or len(view.users) != 1:
        return None
    x, y = view.args[0], tensor_val(view)
    if not isinstance(x, torch.fx.Node) or not ops.fusible(x):
        return None
    if not (_plain_contiguous(tensor_val(x)) and _plain_contiguous(y)):
        return None
    (reader,) = view.users
    if not ops.computes_pointwise(reader):
        return None
    out = tensor_val(reader)
    if not _plain_contiguous(out) or tuple(out.shape) != tuple(y.shape):
        return None
    for a in reader.all_input_nodes:
        if a is view:
            continue
        t = tensor_val(a)
        if t is None or not (t.numel() == 1 or (tuple(t.shape) == tuple(y.shape) and t.is_contiguous())):
            return None
    return reader


def _reorder(gm, fake_mode, view, reader, operand):
    """Replaces view -> reader with reader' -> view': reader' reads view's source where reader
    read view, each other tensor operand through operand(gm, node, new); view' is view's op
    over reader's value with reader's shape. False (the graph as it was) when the result
    would differ in shape, dtype or layout."""
    x, new = view.args[0], []
    try:
        with gm.graph.inserting_before(reader):
            args = [x if a is view else operand(a, new) if isinstance(a, torch.fx.Node) else a for a in reader.args]
            op = fake_meta.call(gm, fake_mode, reader.target, args, reader.kwargs, new)
            size = list(tensor_val(reader).shape) if view.target in RESHAPES else view.args[1]
            back = fake_meta.call(gm, fake_mode, view.target, (op, size) + tuple(view.args[2:]), None, new)
        got, want = back.meta["val"], tensor_val(reader)
        if (
            tuple(got.shape) != tuple(want.shape)
            or got.dtype != want.dtype
            or (view.target in RESHAPES and not same_layout(got, want))
        ):
            raise ValueError("the result would differ in shape, dtype or layout")
    except Exception as e:  # leave the pair as it was
        log.debug("fuseml: %s stays before %s: %s", view.name, reader.name, e)
        fake_meta.discard(gm, new)
        return False
    reader.replace_all_uses_with(back)
    gm.graph.erase_node(reader)
    gm.graph.erase_node(view)
    return True


def _sink_one(gm, fake_mode, view, reader):
    """A reshape below its reader; the reader's other operands reshaped to its source shape."""
    shape = list(tensor_val(view.args[0]).shape)

    def operand(a, new):
        ones = [1] * len(shape) if tensor_val(a).numel() == 1 else shape
        return fake_meta.call(gm, fake_mode, aten.view.default, (a, ones), None, new)

    return _reorder(gm, fake_mode, view, reader, operand)


def _move_broadcast(gm, fake_mode, expand, how, reader):
    """A broadcast below its one-operand reader, or dropped for a reader that broadcasts."""
    if how == "drop":  # the reader broadcasts the source as the expand did
        reader.args = tuple(expand.args[0] if a is expand else a for a in reader.args)
        if not expand.users:
            gm.graph.erase_node(expand)
        return True
    return _reorder(gm, fake_mode, expand, reader, lambda a, new: a)


def _collapse_chains(gm):
    """A reshape of a reshape of x reads x; a reshape left without readers goes. The moves
    leave such chains ([B, S, V] -> [N, V] -> [B, S, V] ... each move one more), and a
    reshape whose source is another reshape moves no further: Gemma 2's logits' softcap
    gradient, a division reading through five of them, stayed an ATen kernel over the logits.
    Exact for the reason the moves are: reshapes of a contiguous value re-index the same
    elements in the same order. Returns whether anything changed."""
    changed = False
    for n in list(gm.graph.nodes):
        if n.op != "call_function" or n.target not in RESHAPES:
            continue
        src = n.args[0]
        if not isinstance(src, torch.fx.Node) or src.op != "call_function" or src.target not in RESHAPES:
            continue
        base = src.args[0]
        if not isinstance(base, torch.fx.Node) or not _plain_contiguous(tensor_val(base)):
            continue
        if not _plain_contiguous(tensor_val(n)):
            continue
        n.args = (base,) + tuple(n.args[1:])
        if not src.users:
            gm.graph.erase_node(src)
        changed = True
        if tuple(tensor_val(n).shape) == tuple(tensor_val(base).shape):
            # back at base's own shape ([1] -> [] -> [1] around a loss's division): base
            # itself, so that the op reading it joins base's group; a graph output keeps the
            # view (the runtime was told which outputs alias)
            n.replace_all_uses_with(base, delete_user_cb=lambda u: u.op != "output")
            if not n.users:
                gm.graph.erase_node(n)
    return changed


MAX_ROUND_TRIP_OPS = 64  # pointwise ops in one round trip's cone (a loss's backward has ~10)


def _round_trip(r):
    """(leaves, cone) when reshape `r` undoes reshapes through pointwise ops: r = reshape(f(...),
    S0) where f's value is computed over S1 by pointwise ops (the cone, graph order) whose
    tensor operands are each another op of the cone, one element, or a reshape to S1 of a
    source of shape S0 (leaves: {reshape: source}). Gemma 2's logits' gradient: the softcap's
    backward reads the saved product and the loss's gradient, each [N, V] seen as [B, S, V].
    Of several leaves none is a product of this graph (a GEMM group reads its products'
    views). Else None."""
    if r.op != "call_function" or r.target not in RESHAPES or not _plain_contiguous(tensor_val(r)):
        return None
    want, top = tuple(tensor_val(r).shape), r.args[0]
    if not isinstance(top, torch.fx.Node) or not ops.computes_pointwise(top) or not _plain_contiguous(tensor_val(top)):
        return None
    shape = tuple(tensor_val(top).shape)
    cone, leaves, todo = set(), {}, [top]
    while todo:
        y = todo.pop()
        if y in cone or y in leaves:
            continue
        v = tensor_val(y)
        if v is None:
            return None
        if y is not top and v.numel() == 1:
            continue  # a scalar operand: viewed to S0's rank where it is read
        if ops.computes_pointwise(y) and tuple(v.shape) == shape and _plain_contiguous(v):
            if len(cone) == MAX_ROUND_TRIP_OPS:
                return None
            cone.add(y)
            todo += y.all_input_nodes
            continue
        src = y.args[0] if y.op == "call_function" and y.target in RESHAPES else None
        if not isinstance(src, torch.fx.Node) or tuple(v.shape) != shape or not _plain_contiguous(tensor_val(src)):
            return None
        if tuple(tensor_val(src).shape) != want:
            return None
        leaves[y] = src
    if not leaves:
        return None
    if len(leaves) > 1 and any(src.op == "call_function" and src.target in ops.GEMM_OPS for src in leaves.values()):
        # siblings' products (SwiGLU's gate and up) keep the views their group looks through
        return None
    return leaves, [n for n in top.graph.nodes if n in cone]


def _undo_round_trip(gm, fake_mode, r, leaves, cone):
    """The cone computed over the sources' shape, r reading its last op; the cone's other
    readers read a reshape of the op they read. False (the graph as it was) when a value would
    differ in dtype or layout."""
    top = r.args[0]
    ones = [1] * len(tensor_val(r).shape)
    made, remade = [], {}  # remade: old op -> its op over the sources' shape
    try:
        for op in cone:
            with gm.graph.inserting_before(op):
                args = [
                    remade[a]
                    if a in remade
                    else leaves[a]
                    if a in leaves
                    else fake_meta.call(gm, fake_mode, aten.view.default, (a, ones), None, made)
                    if isinstance(a, torch.fx.Node)
                    else a
                    for a in op.args
                ]
                remade[op] = fake_meta.call(gm, fake_mode, op.target, args, op.kwargs, made)
            if tensor_val(remade[op]).dtype != tensor_val(op).dtype:
                raise ValueError("an op's dtype would differ")
        if not same_layout(tensor_val(remade[top]), tensor_val(r)):
            raise ValueError("the result's layout would differ")
    except Exception as e:  # leave the graph as it was
        log.debug("fuseml: %s keeps its round trip: %s", r.name, e)
        fake_meta.discard(gm, made)
        return False
    r.replace_all_uses_with(remade[top])
    gm.graph.erase_node(r)
    size = list(tensor_val(top).shape)
    order = {n: i for i, n in enumerate(gm.graph.nodes)}  # the readers' places (nothing moves)
    for op in reversed(cone):  # from the last op: each one's readers in the cone are gone first
        readers = [u for u in op.users if u not in remade]
        if readers:  # a reader outside the cone reads the old shape, reshaped where it is read
            with gm.graph.inserting_before(min(readers, key=order.__getitem__)):
                back = fake_meta.call(gm, fake_mode, aten.view.default, (remade[op], size))
            for u in readers:
                u.replace_input_with(op, back)
        gm.graph.erase_node(op)
    for v in leaves:  # the reshapes the cone read, unread now (a GEMM group would look through them)
        if not v.users:
            gm.graph.erase_node(v)
    return True


def _undo_round_trips(gm):
    """A reshape that undoes an earlier one through pointwise ops goes, the ops computed over
    the first shape. Gemma 2's logits: the product [N, V] seen as [B, S, V], softcapped, cast
    to fp32 and seen as [N, V] again for the loss; the loss's rows group could not take the
    softcap in over a different shape, and the GEMM wrote the softcapped logits in bf16 and
    fp32 for the rows kernel to read back. Exact: the ops are elementwise, and reshapes of a
    contiguous value re-index the same elements in the same order."""
    found = [(n, m) for n, m in ((n, _round_trip(n)) for n in gm.graph.nodes) if m is not None]
    fake_mode = fake_meta.mode_of(gm) if found else None
    changed = False
    for r, _ in found if fake_mode is not None else ():
        if r._erased:  # an earlier undo's leaf
            continue
        m = _round_trip(r)  # again: an earlier undo may have remade its cone
        if m is not None and _undo_round_trip(gm, fake_mode, r, *m):
            changed = True
    return changed


def _moves(gm):
    """(node, how, reader) for each reshape or broadcast that can move now."""
    out = []
    for n in gm.graph.nodes:
        r = _movable(n)
        if r is not None:
            out.append((n, "reshape", r))
            continue
        b = _broadcast_reader(n)
        if b is not None:
            out.append((n, b[0], b[1]))
    return out


def sink_views(gm):
    """Rewrites gm in place (above); returns whether anything changed."""
    changed = _undo_round_trips(gm)
    changed = _collapse_chains(gm) or changed
    pairs = _moves(gm)
    fake_mode = fake_meta.mode_of(gm) if pairs else None
    if fake_mode is None:
        if changed:
            gm.graph.lint()
            graph_code.edited(gm)
        return changed
    # each move leaves the reshape below the op, where the next op may take it further
    for _ in range(_MAX_PASSES):
        erased, moved = set(), False
        for view, how, reader in pairs:
            if view in erased or reader in erased:
                continue
            if how == "reshape":
                ok = _movable(view) is reader and _sink_one(gm, fake_mode, view, reader)
            else:
                ok = _broadcast_reader(view) == (how, reader) and _move_broadcast(gm, fake_mode, view, how, reader)
            if ok:
                erased |= {view, reader} if how != "drop" else set()
                moved = True
        if not moved:
            break
        changed = True
        _collapse_chains(gm)
        pairs = _moves(gm)
    # the moves can leave a round trip of their own (the loss's gradient seen as [B, S, V]
    # where the softcap's backward reads it, and as [N, V] again for the head's GEMMs)
    if _undo_round_trips(gm):
        _collapse_chains(gm)
        changed = True
    if changed:
        gm.graph.lint()
        graph_code.edited(gm)
    return changed
