"""A graph rewrite before partitioning: a pointwise op whose one reader is a row gather
(`x[idx]`, ATen's index with one 1-D index) moves below it, its operands gathered instead, and
the picked rows of a reshape into row groups (`y.view(T, k, ...)[:, j]`) computed per pick.

Hugging Face's mixture-of-experts layer (grouped-GEMM experts) scales each expert row of its
down projection by its routing weight, puts the rows back in token order and sums each
token's k picks into the residual stream:
  s = grouped_mm(h, w_down) * weight[:, None]             [T*k, D] fp32
  y = s[inverse].view(T, k, D)                             [T, k, D] fp32
  out = residual + (y[:, 0] + y[:, 1]).to(bf16)            [T, D]
ran as ATen's multiply writing s in fp32, ATen's gather reading and writing it again, and one
kernel reading it a third time. Rewritten as
  g = grouped_mm(h, w_down)[inverse].view(T, k, D)         (ATen's gather of the bf16 product)
  c = weight[inverse].view(T, k, 1)
  out = residual + (g[:, 0] * c[:, 0] + g[:, 1] * c[:, 1]).to(bf16)
the gather moves the bf16 product, and the scaling, the sum of the picks and the residual are
one kernel reading it where it lies: ~100 MB less a layer at d1024 and 8192 picked rows.

Exact: the op is elementwise, so a row of its value is the op of the same row of each operand
(an operand of one row, or of fewer dims, broadcasts to every row alike), and a pick of a row
group is such a row. The gather moves only where its gathered operands hold no more bytes than
the op's value (a cast to fp32 after the gather, not before), the op has no other reader and
every reader of each pick is a pointwise op (a pick is now a value of its own rather than a
view)."""

import torch

from . import fake_meta, graph_code, ops
from ._log import log
from .fake_meta import tensor_val
from .shapes import is_plain_int

aten = torch.ops.aten


def _rows_operands(op):
    """The operands of pointwise op with its rows along dim 0, each once in the op's order
    (the others broadcast along it; the order keeps the rewritten graph, and so its fragments'
    keys, the same in every process), or None when an operand is neither or none has them."""
    out = tensor_val(op)
    if out is None or out.dim() == 0 or not all(is_plain_int(d) for d in out.shape):
        return None
    if any(not any(a is b for b in op.args) for a in op.all_input_nodes):
        return None  # an operand inside a list or a keyword: the move replaces direct ones only
    rows = {}
    for a in op.all_input_nodes:
        t = tensor_val(a)
        if t is None or not all(is_plain_int(d) for d in t.shape):
            return None
        if t.dim() == out.dim() and t.shape[0] == out.shape[0] and out.shape[0] != 1:
            rows[a] = None
        elif t.dim() == out.dim() and t.shape[0] != 1:
            return None  # not this op's rows, nor broadcast along them
    return list(rows) or None


def _gathered(index):
    """(op, idx, operands) when `index` gathers rows of a pointwise op the move takes."""
    if index.op != "call_function" or index.target is not aten.index.Tensor or len(index.args) != 2:
        return None
    op, idxs = index.args
    if not isinstance(op, torch.fx.Node) or not isinstance(idxs, (list, tuple)) or len(idxs) != 1:
        return None
    idx = idxs[0]
    vi = tensor_val(idx) if isinstance(idx, torch.fx.Node) else None
    if vi is None or vi.dim() != 1 or vi.dtype not in (torch.int32, torch.int64):
        return None
    if len(op.users) != 1 or not ops.computes_pointwise(op):
        return None
    rows = _rows_operands(op)
    if rows is None:
        return None
    out, per_row = tensor_val(op), lambda t: t.numel() // t.shape[0] * t.element_size()
    if sum(per_row(tensor_val(a)) for a in rows) > per_row(out):
        return None  # the operands' rows are wider than the op's: gather the value instead
    return op, idx, rows


def _picks(view):
    """(op, its rows operands, k, picks) when reshape `view` splits the rows of pointwise op
    (its one reader) into groups of k, [R, ...] -> [R / k, k, ...], and every reader of the
    view is a pick `select(view, 1, j)` that only pointwise ops read."""
    if view.op != "call_function" or view.target not in (aten.view.default, aten._unsafe_view.default):
        return None
    op = view.args[0]
    if not isinstance(op, torch.fx.Node) or len(op.users) != 1 or not ops.computes_pointwise(op):
        return None
    vo, vv = tensor_val(op), tensor_val(view)
    if vo is None or vv is None or vv.dim() != vo.dim() + 1 or vv.dim() < 2:
        return None
    if not all(is_plain_int(d) for d in vv.shape) or vv.shape[0] * vv.shape[1] != vo.shape[0]:
        return None
    rows = _rows_operands(op)
    if tuple(vv.shape[2:]) != tuple(vo.shape[1:]) or rows is None:
        return None
    picks = list(view.users)
    for p in picks:
        if p.op != "call_function" or p.target is not aten.select.int or p.args[1] != 1:
            return None
        if not p.users or not all(ops.computes_pointwise(r) for r in p.users):
            return None
    return op, rows, vv.shape[1], picks


def _move_gather(gm, mode, index, op, idx, rows):
    made = []
    try:
        with gm.graph.inserting_before(index):
            got = {a: fake_meta.call(gm, mode, aten.index.Tensor, (a, [idx]), None, made) for a in rows}
            new = fake_meta.call(gm, mode, op.target, [got.get(a, a) for a in op.args], op.kwargs, made)
        fake_meta.require_same_value(new, index)
    except Exception as e:  # leave the gather where it was
        log.debug("fuseml: %s stays above %s: %s", op.name, index.name, e)
        fake_meta.discard(gm, made)
        return False
    index.replace_all_uses_with(new)
    gm.graph.erase_node(index)
    gm.graph.erase_node(op)
    return True


def _move_picks(gm, mode, view, op, rows, k, picks):
    made, done = [], []
    try:
        with gm.graph.inserting_before(view):
            grouped = {}
            for a in rows:
                t = tensor_val(a)
                grouped[a] = fake_meta.call(
                    gm, mode, aten.view.default, (a, [t.shape[0] // k, k, *t.shape[1:]]), None, made
                )
            for p in picks:
                args = [
                    fake_meta.call(gm, mode, aten.select.int, (grouped[a], 1, p.args[2]), None, made)
                    if a in grouped
                    else a
                    for a in op.args
                ]
                new = fake_meta.call(gm, mode, op.target, args, op.kwargs, made)
                fake_meta.require_same_value(new, p)
                done.append((p, new))
    except Exception as e:  # leave the picks where they were
        log.debug("fuseml: %s stays above %s: %s", op.name, view.name, e)
        fake_meta.discard(gm, made)
        return False
    fake_meta.replace(gm, done, (view, op))
    return True


def _gathered_picks(view):
    """(x, idx, k, picks) when reshape `view` splits the rows of a row gather x[idx] (its one
    reader) into groups of k and every reader of the view is a pick `select(view, 1, j)`: each
    pick is then x[idx.view(R / k, k)[:, j]], rows a fragment reads where its own index points
    (take_rows) instead of a gathered copy."""
    if view.op != "call_function" or view.target not in (aten.view.default, aten._unsafe_view.default):
        return None
    index = view.args[0]
    taken = ops.take_rows(index) if isinstance(index, torch.fx.Node) and len(index.users) == 1 else None
    if taken is None:
        return None
    x, idx = taken
    vi, vv = tensor_val(index), tensor_val(view)
    if vv is None or vv.dim() != vi.dim() + 1 or not all(is_plain_int(d) for d in vv.shape):
        return None
    if vv.shape[0] * vv.shape[1] != vi.shape[0] or tuple(vv.shape[2:]) != tuple(vi.shape[1:]):
        return None
    picks = list(view.users)
    if not picks or any(p.op != "call_function" or p.target is not aten.select.int or p.args[1] != 1 for p in picks):
        return None
    return x, idx, vv.shape[1], picks


def _pick_gathers(gm, mode, view, x, idx, k, picks):
    made, done = [], []
    try:
        with gm.graph.inserting_before(view):
            rows = fake_meta.call(gm, mode, aten.view.default, (idx, [tensor_val(idx).shape[0] // k, k]), None, made)
            for p in picks:
                pick = fake_meta.call(gm, mode, aten.select.int, (rows, 1, p.args[2]), None, made)
                new = fake_meta.call(gm, mode, aten.index.Tensor, (x, [pick]), None, made)
                fake_meta.require_same_value(new, p)
                done.append((p, new))
    except Exception as e:  # leave the gather where it was
        log.debug("fuseml: the picks of %s stay gathered: %s", view.name, e)
        fake_meta.discard(gm, made)
        return False
    fake_meta.replace(gm, done, (view, view.args[0]))
    return True


def sink_gathers(gm):
    """Moves each pointwise op a row gather reads below it, then each pointwise op whose row
    groups are picked below the picks (above). Returns how many moved."""
    mode, found = fake_meta.matches(gm, _gathered)
    moved = sum(_move_gather(gm, mode, index, *m) for index, m in found)
    mode, found = fake_meta.matches(gm, _picks)
    moved += sum(_move_picks(gm, mode, view, *m) for view, m in found)
    if moved:
        graph_code.edited(gm)
        log.debug("fuseml: %d pointwise op(s) moved below a row gather or pick", moved)
    return moved


def gather_picks(gm):
    """Moves each row gather whose row groups are picked below the picks, each pick then rows
    read at its own index (above; after sink_gathers, whose moves leave such gathers, and after
    the round trips through a permutation are dropped, unsort.py). Returns how many moved."""
    mode, found = fake_meta.matches(gm, _gathered_picks)
    moved = sum(_pick_gathers(gm, mode, view, *m) for view, m in found)
    if moved:
        graph_code.edited(gm)
        log.debug("fuseml: %d row gather(s) moved below their picks", moved)
    return moved
