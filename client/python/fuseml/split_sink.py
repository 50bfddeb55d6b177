"""A graph rewrite before partitioning: a pointwise op whose one reader is a split moves below
it, one copy of the op per piece, so that each piece's op joins the pointwise ops that read
the piece. A split is a view no group takes; an op before it is a kernel of its own (or ATen's
op) writing its whole value for the pieces' readers to read back.

Hugging Face's mixture-of-experts layer (grouped-GEMM experts) zeroes the padded rows of the
gate and up projections' product before splitting it into the two halves that SwiGLU
multiplies:
  h = masked_fill(grouped_mm(x, w), pad[:, None], 0)      [T, 2F]
  gate, up = split(h, F, -1)
  y = silu(gate) * up                                      [T, F]
ran as ATen's clone and masked fill over [T, 2F] and then the SwiGLU kernel. Rewritten as
  g, u = split(grouped_mm(x, w), F, -1)
  y = silu(masked_fill(g, pad[:, None], 0)) * masked_fill(u, pad[:, None], 0)
it is one kernel reading the product's two halves where they lie.

Exact: the op is elementwise and every operand but the one split has one element along the
split's dim (it broadcasts there), so a piece of the op's value is the op of the same piece of
that operand. Moved only where the op's value has no other reader and every reader of every
piece is a pointwise op (a piece is now a value of its own rather than a view, which a
pointwise reader reads the same way but a graph output or a GEMM would see with other
strides)."""

import operator

import torch

from . import fake_meta, graph_code, ops
from ._log import log
from .fake_meta import tensor_val
from .shapes import is_plain_int

aten = torch.ops.aten
SPLITS = {aten.split.Tensor, aten.split_with_sizes.default}


def _split_dim(split):
    dim = split.args[2] if len(split.args) > 2 else split.kwargs.get("dim", 0)
    return dim if isinstance(dim, int) else None


def _movable(split):
    """(op, operand): the pointwise op split reads and the operand of op it splits instead,
    when the move is exact and helps (above), else None."""
    if split.op != "call_function" or split.target not in SPLITS or not split.users:
        return None
    op, dim = split.args[0], _split_dim(split)
    if not isinstance(op, torch.fx.Node) or len(op.users) != 1 or dim is None or not ops.computes_pointwise(op):
        return None
    out = tensor_val(op)
    if out is None or out.dim() == 0 or not all(is_plain_int(d) for d in out.shape):
        return None
    dim %= out.dim()
    if any(u.op != "call_function" or u.target is not operator.getitem for u in split.users):
        return None
    if not all(ops.computes_pointwise(r) for piece in split.users for r in piece.users):
        return None
    whole, rest = [], []
    for a in op.all_input_nodes:
        t = tensor_val(a)
        if t is None:
            return None
        (whole if tuple(t.shape) == tuple(out.shape) else rest).append(a)
    if len(set(whole)) != 1:
        return None
    for a in rest:  # broadcast along the split's dim: aligned on the right, one element there
        t, at = tensor_val(a), dim - (out.dim() - tensor_val(a).dim())
        if at >= 0 and t.shape[at] != 1:
            return None
    return op, whole[0]


def _move(gm, mode, split, op, operand):
    """split(op(operand, ...)) -> op(piece, ...) per piece of split(operand). False (the graph
    as it was) when a piece's value would differ in shape or dtype."""
    made, pieces = [], []
    try:
        with gm.graph.inserting_before(split):
            parts = fake_meta.call(gm, mode, split.target, (operand,) + tuple(split.args[1:]), split.kwargs, made)
            for piece in list(split.users):
                part = fake_meta.call(gm, mode, operator.getitem, (parts, piece.args[1]), None, made)
                args = [part if a is operand else a for a in op.args]
                new = fake_meta.call(gm, mode, op.target, args, op.kwargs, made)
                fake_meta.require_same_value(new, piece)
                pieces.append((piece, new))
    except Exception as e:  # leave the split where it was
        log.debug("fuseml: %s stays below %s: %s", op.name, split.name, e)
        fake_meta.discard(gm, made)
        return False
    fake_meta.replace(gm, pieces, (split, op))
    return True


def sink_splits(gm):
    """Moves each pointwise op that a split reads below it (above), where that is exact and
    every piece's readers are pointwise. Returns how many moved."""
    mode, found = fake_meta.matches(gm, _movable)
    moved = sum(_move(gm, mode, split, op, operand) for split, (op, operand) in found)
    if moved:
        graph_code.edited(gm)
        log.debug("fuseml: %d pointwise op(s) moved below their split", moved)
    return moved
