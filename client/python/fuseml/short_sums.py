"""A graph rewrite before partitioning: a sum over one short inner dim is the sum of that
dim's slices, a pointwise op that fuses with the ops around it. No kernel template reduces a
middle dim, so ATen ran such a sum on its own, and the pointwise ops reading it became a
group of their own too.

The case that matters is grouped-query attention's backward: Hugging Face's repeat_kv
expands the key and value heads [B, KV, S, D] to [B, KV, R, S, D] before SDPA, so the
gradients come back summed over R (4 for a 16/4-head model):
  dv = sum(view(g, [B, KV, R, S, D]), [2], keepdim=True)      then squeezed, transposed
       and copied to [B, S, KV, D] for the projection's gradient
Rewritten as
  dv = to_bf16(f32(select(x, 2, 0)) + f32(select(x, 2, 1)) + ...)
the slices are views a kernel reads in place, and the copy to the projection's layout
(transpose_rewrite.py) computes the sum where it copies.

Numerics as ATen's: each slice is cast to fp32 and the adds accumulate in fp32, rounded once
to the sum's dtype. Only a dim of at most MAX_TERMS elements (unrolled adds; a longer one is
a reduction's work) that is neither the first (a column sum, column_rewrite.py) nor the last
(a row sum) of a float tensor."""

import torch

from . import fake_meta, graph_code, ops
from ._log import log
from .fake_meta import tensor_val
from .shapes import is_plain_int

aten = torch.ops.aten
MAX_TERMS = 8


def _short_sum(node):
    """(x, d, keepdim) when node sums x over one inner dim d of 2..MAX_TERMS static elements
    into x's dtype, else None."""
    if node.op != "call_function" or node.target is not aten.sum.dim_IntList:
        return None
    x, t, val = node.args[0], tensor_val(node.args[0]), tensor_val(node)
    if t is None or val is None or t.dtype not in ops.DTYPES or t.dtype == torch.bool or val.dtype != t.dtype:
        return None
    if set(node.kwargs) - {"keepdim"} or len(node.args) < 2:
        return None
    dims = node.args[1]
    dims = [dims] if isinstance(dims, int) else list(dims or [])
    if len(dims) != 1 or not isinstance(dims[0], int):
        return None
    d = dims[0] % t.dim()
    n = t.shape[d]
    if not 0 < d < t.dim() - 1 or not is_plain_int(n) or not 2 <= n <= MAX_TERMS:
        return None
    keepdim = node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False)
    return x, d, bool(keepdim)


def _as_adds(gm, fake_mode, node, x, d, keepdim):
    """The nodes that replace `node`: the fp32 sum of x's slices along d, in x's dtype."""
    t = tensor_val(x)
    wide = t.dtype != torch.float32
    terms = []
    for i in range(t.shape[d]):
        s = fake_meta.call(gm, fake_mode, aten.select.int, (x, d, i))
        terms.append(
            fake_meta.call(gm, fake_mode, aten._to_copy.default, (s,), {"dtype": torch.float32}) if wide else s
        )
    total = terms[0]
    for s in terms[1:]:
        total = fake_meta.call(gm, fake_mode, aten.add.Tensor, (total, s))
    if wide:
        total = fake_meta.call(gm, fake_mode, aten._to_copy.default, (total,), {"dtype": t.dtype})
    return fake_meta.call(gm, fake_mode, aten.unsqueeze.default, (total, d)) if keepdim else total


def _drop_squeezes(node, d):
    """squeeze(unsqueeze(v, d), d) -> v for node = unsqueeze(v, d): the squeezed readers read
    the sum itself, so a pointwise reader meets it without a view between them."""
    for u in list(node.users):
        if u.target is aten.squeeze.dim and len(u.args) == 2 and u.args[1] % tensor_val(u.args[0]).dim() == d:
            u.replace_all_uses_with(node.args[0])
            node.graph.erase_node(u)


def spell_short_sums(gm):
    """Rewrites gm in place (above); returns whether anything changed."""
    fake_mode, found = fake_meta.matches(gm, _short_sum)
    if not found:
        return False
    for node, (x, d, keepdim) in found:
        with gm.graph.inserting_before(node):
            out = _as_adds(gm, fake_mode, node, x, d, keepdim)
        node.replace_all_uses_with(out)
        gm.graph.erase_node(node)
        if keepdim:
            _drop_squeezes(out, d)
            if not out.users:
                gm.graph.erase_node(out)
    gm.graph.lint()
    graph_code.edited(gm)
    log.debug("fuseml: short sums spelled as adds:\n%s", graph_code.source(gm))
    return True
