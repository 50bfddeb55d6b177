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

A round trip goes first: a reshape that undoes an earlier one through pointwise ops
(_undo_round_trips), the ops then computed over the first shape."""

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
    return changed


def _round_trip(r):
    """(source, chain) when reshape `r` undoes a reshape through a chain of pointwise ops:
    r = reshape(f_k(...f_1(reshape(source, S1))), S0) with source of shape S0, each f_i of
    one tensor operand of S1 (others of one element); chain is [f_k, ..., f_1]. Else None."""
    if r.op != "call_function" or r.target not in RESHAPES or not _plain_contiguous(tensor_val(r)):
        return None
    want, chain, y = tuple(tensor_val(r).shape), [], r.args[0]
    while isinstance(y, torch.fx.Node) and ops.computes_pointwise(y) and _plain_contiguous(tensor_val(y)):
        shape = tuple(tensor_val(y).shape)
        wide = [a for a in y.all_input_nodes if tensor_val(a) is None or tensor_val(a).numel() != 1]
        if len(wide) != 1 or tensor_val(wide[0]) is None or tuple(tensor_val(wide[0]).shape) != shape:
            return None
        chain.append(y)
        y = wide[0]
    if not chain or y.op != "call_function" or y.target not in RESHAPES:
        return None
    src = y.args[0]
    if not isinstance(src, torch.fx.Node) or not _plain_contiguous(tensor_val(src)):
        return None
    return (src, chain) if tuple(tensor_val(src).shape) == want else None


def _undo_round_trip(gm, fake_mode, r, src, chain):
    """The chain computed over src's shape, r reading its last op; the chain's other readers
    read a reshape of the op they read. False (the graph as it was) when a value would differ
    in dtype or layout."""
    new, made, ones = src, [], [1] * len(tensor_val(src).shape)
    remade = []  # (old op, its op over src's shape)
    try:
        for op in reversed(chain):
            wide = next(a for a in op.all_input_nodes if tensor_val(a).numel() != 1)
            with gm.graph.inserting_before(op):
                args = [
                    new
                    if a is wide
                    else fake_meta.call(gm, fake_mode, aten.view.default, (a, ones), None, made)
                    if isinstance(a, torch.fx.Node)
                    else a
                    for a in op.args
                ]
                new = fake_meta.call(gm, fake_mode, op.target, args, op.kwargs, made)
            if tensor_val(new).dtype != tensor_val(op).dtype:
                raise ValueError("an op's dtype would differ")
            remade.append((op, new))
        if not same_layout(tensor_val(new), tensor_val(r)):
            raise ValueError("the result's layout would differ")
    except Exception as e:  # leave the graph as it was
        log.debug("fuseml: %s keeps its round trip: %s", r.name, e)
        fake_meta.discard(gm, made)
        return False
    r.replace_all_uses_with(new)
    gm.graph.erase_node(r)
    size, first_view = list(tensor_val(chain[0]).shape), chain[-1].all_input_nodes
    order = {n: i for i, n in enumerate(gm.graph.nodes)}  # the readers' places (nothing moves)
    in_chain = set(chain)
    for op, remade_op in reversed(remade):  # from the last op: each one's readers are gone first
        readers = [u for u in op.users if u not in in_chain]
        if readers:  # a reader outside the chain reads the old shape, reshaped where it is read
            with gm.graph.inserting_before(min(readers, key=order.__getitem__)):
                back = fake_meta.call(gm, fake_mode, aten.view.default, (remade_op, size))
            for u in readers:
                u.replace_input_with(op, back)
        gm.graph.erase_node(op)
    for v in first_view:  # the reshape the chain read, unread now (a GEMM group would look through it)
        if v.target in RESHAPES and not v.users:
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
        m = _round_trip(r)  # again: an earlier undo may have remade its chain's start
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
    if changed:
        gm.graph.lint()
        graph_code.edited(gm)
    return changed
