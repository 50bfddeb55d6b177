"""A graph rewrite before partitioning: a scatter of a few picks a row as compares against a
column iota, pointwise ops a fused kernel runs.

topk's backward puts the gradient of each row's k picks back at the columns they came from:
  grad_in = scatter(zeros[T, E], -1, indices[T, k], grad_out[T, k])
ATen runs it as two kernels (the zeros copied into the output, then the scatter), and the
zeros are a constant tensor of their own that const_fold keeps. With k small (an MoE
router's top-2 of 8 experts) the same values are, per element,
  acc = self;  for j < k:  acc = where(indices[..., j] == column, src[..., j], acc)
`where`, `eq` of int64 values and a constant iota, all pointwise (vocabulary 10), which one
kernel computes; a zero `self` is a 0-dim zero, never read from memory.

Exact for in-range indices: each element takes the src of the last pick naming its column,
which is what scatter writes where picks are distinct (topk's are) and one of the results it
may write where they repeat (torch leaves which one unspecified). An index outside [0, E),
which ATen's scatter reports as an error, selects no column here."""

import torch

from . import const_fold, fake_meta, graph_code, ops
from ._log import log
from .fake_meta import tensor_val
from .shapes import is_plain_int

aten = torch.ops.aten
MAX_PICKS = 8  # picks a row: a where and a compare each, recomputed per element


def _zero_constant(gm, node):
    """Whether node is a constant tensor of zeros (const_fold's, or a call of zeros / full 0)."""
    if node.op == "get_attr":
        t = const_fold.constant(gm, node)
        return t is not None and t.numel() > 0 and not bool(torch.count_nonzero(t))
    if node.op == "call_function" and node.target is aten.zeros.default:
        return True
    return node.op == "call_function" and node.target is aten.full.default and node.args[1] == 0


def _picks(node):
    """(self, dim, index, src, k) when node is a scatter of at most MAX_PICKS int64 picks a
    row along dim, its index and src of one static shape that is self's but at dim."""
    if node.op != "call_function" or node.target is not aten.scatter.src or node.kwargs:
        return None
    base, dim, index, src = node.args
    vb, vi, vs = tensor_val(base), tensor_val(index), tensor_val(src)
    if vb is None or vi is None or vs is None or not isinstance(dim, int) or vi.dtype != torch.int64:
        return None
    if vb.dim() == 0 or not vb.dim() == vi.dim() == vs.dim() or vs.dtype != vb.dtype or vb.dtype not in ops.DTYPES:
        return None
    dim %= vb.dim()
    shapes = (vb.shape, vi.shape, vs.shape)
    if not all(is_plain_int(d) for s in shapes for d in s):
        return None
    k = vi.shape[dim]
    if tuple(vi.shape) != tuple(vs.shape) or not 0 < k <= MAX_PICKS:
        return None
    if any(a != b for j, (a, b) in enumerate(zip(vb.shape, vi.shape)) if j != dim):
        return None
    return base, dim, index, src, k


def spell_pick_scatters(gm):
    """Rewrites each scatter of a few picks a row (above) as compares and wheres against a
    column iota. Returns how many it rewrote."""
    mode, found = fake_meta.matches(gm, _picks)
    done = []
    for node, (base, dim, index, src, k) in found:
        want = tensor_val(node)
        made = []
        with gm.graph.inserting_before(node):
            columns = want.shape[dim]
            iota = fake_meta.call(
                gm, mode, aten.arange.start_step, (0, columns, 1), {"dtype": torch.int64, "device": want.device}, made
            )
            at = [1] * want.dim()
            at[dim] = columns
            iota = fake_meta.call(gm, mode, aten.view.default, (iota, at), None, made)
            if _zero_constant(gm, base):
                base = fake_meta.call(
                    gm, mode, aten.scalar_tensor.default, (0.0,), {"dtype": want.dtype, "device": want.device}, made
                )
            acc = base
            for j in range(k):
                pick = fake_meta.call(gm, mode, aten.slice.Tensor, (index, dim, j, j + 1), None, made)
                value = fake_meta.call(gm, mode, aten.slice.Tensor, (src, dim, j, j + 1), None, made)
                hit = fake_meta.call(gm, mode, aten.eq.Tensor, (pick, iota), None, made)
                acc = fake_meta.call(gm, mode, aten.where.self, (hit, value, acc), None, made)
        if fake_meta.substitute(gm, node, acc, made):
            done.append(node)
    if done:
        gm.graph.eliminate_dead_code()
        graph_code.edited(gm)
        log.debug("fuseml: %d scatter(s) of a few picks a row as compares against a column iota", len(done))
    return len(done)
