"""A graph rewrite before partitioning: a reduction over the leading dims of a contiguous
tensor becomes a column reduction (vocabulary 5) of its 2-D view.

Weight gradients reduce over batch and tokens: an RMSNorm's `(g * x).sum([0, 1], keepdim)` of
a [B, S, D] tensor, a learned attention bias's `sum([0])` of [B, H, S, S]. Each is the column
sum of the same elements seen as [B * S, D] (or [B, H * S * S]), which a column group runs:
  r = sum(x, [0, 1], True)  ->  view(sum(view(x, [B * S, D]), [0], True), [1, 1, D])
Exact: the views are the same memory (x is contiguous), the reduction the same elements.
Static shapes only (a symbolic size would have to flow through the views as a graph value);
anything else is left as it was."""
import math

import torch
from torch._guards import detect_fake_mode

from . import ops
from .shapes import is_plain_int

aten = torch.ops.aten


def _leading(node):
    """(M, N) when node reduces dims 0..k-1 (1 <= k < rank, rank >= 3) of a contiguous float
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
    return math.prod(int(d) for d in t.shape[:k]), math.prod(int(d) for d in t.shape[k:])


def _fake(fake_mode, target, *args):
    with fake_mode:
        return target(*args)


def spell_columns(gm):
    """Rewrites gm in place (above); returns whether anything changed."""
    found = [(n, mn) for n in gm.graph.nodes for mn in [_leading(n)] if mn is not None]
    if not found:
        return False
    fake_mode = detect_fake_mode([n.meta.get("val") for n in gm.graph.nodes])
    if fake_mode is None:
        return False
    for node, (m, n) in found:
        x, shape = node.args[0], [int(d) for d in node.meta["val"].shape]
        with gm.graph.inserting_before(node):
            flat = gm.graph.call_function(aten.view.default, (x, [m, n]))
            flat.meta["val"] = _fake(fake_mode, aten.view.default, x.meta["val"], [m, n])
            red = gm.graph.call_function(node.target, (flat, [0], True))
            red.meta["val"] = _fake(fake_mode, node.target, flat.meta["val"], [0], True)
            out = gm.graph.call_function(aten.view.default, (red, shape))
            out.meta["val"] = _fake(fake_mode, aten.view.default, red.meta["val"], shape)
        node.replace_all_uses_with(out)
        gm.graph.erase_node(node)
    gm.graph.lint()
    gm.recompile()
    return True
