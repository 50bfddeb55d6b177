"""A graph rewrite before partitioning: a full reduction of a short 1-D value is a row
reduction of one row, which the rows template runs with the pointwise ops before it.

A language model's loss ends in reductions to a 0-dim value over its T tokens: the summed
per-token losses where the label is kept, the count of kept labels (a sum of a bool into
int64, cast to float for the division), and the range check on the labels (`all`, before an
async assert). ATen ran each as a kernel of its own, with the `where` before the sum a fourth
and the division a fifth: on a host-bound training step each ATen op costs tens of
microseconds of host. Rewritten as
  sum(x)                  ->  view(sum(x, [-1], keepdim=True), [])
  all(b), any(b)          ->  view(all(b, [-1], keepdim=True), [])
  to_f(sum(b)) (b bool)   ->  view(sum(to_f(b), [-1], keepdim=True), [])
the three are row reductions over the same [T], one rows kernel with the `where` they read.

Numerics: the row kernels accumulate in fp32, as ATen's reductions do; a count of at most
2^24 ones is exact in fp32, so the count cast to float is the int64 count's value. Only a
static T of at most MAX_ELEMENTS: one row is one block's work, and a longer value is a
reduction that ATen spreads over the whole GPU."""

import torch

from . import fake_meta, graph_code, ops
from ._log import log
from .fake_meta import tensor_val
from .shapes import is_plain_int

aten = torch.ops.aten
MAX_ELEMENTS = 1 << 15  # one block reads this many in a few microseconds
FULL = {aten.sum.default: aten.sum.dim_IntList, aten.all.default: aten.all.dim, aten.any.default: aten.any.dim}
FLOATS = (torch.float32, torch.bfloat16, torch.float16)


def _short_1d(x):
    """x's value when it is a static 1-D tensor of 2..MAX_ELEMENTS elements, else None."""
    t = tensor_val(x)
    if t is None or t.dim() != 1 or not is_plain_int(t.shape[0]) or not 1 < t.shape[0] <= MAX_ELEMENTS:
        return None
    return t


def _count_cast(node):
    """The bool operand b when node casts sum(b) (int64, read by node alone) to a float."""
    if node.op != "call_function" or node.target is not aten._to_copy.default or set(node.kwargs) - {"dtype"}:
        return None
    s = node.args[0]
    if node.kwargs.get("dtype") not in FLOATS or len(node.args) != 1 or not isinstance(s, torch.fx.Node):
        return None
    if s.op != "call_function" or s.target is not aten.sum.default or len(s.args) != 1 or s.kwargs or len(s.users) != 1:
        return None
    t = _short_1d(s.args[0])
    return s.args[0] if t is not None and t.dtype == torch.bool else None


def _full(node):
    """("cast", b) for a count cast to float (above); ("full", x) for a full sum, all or any of
    a short 1-D x into its own dtype (bool for all and any); else None."""
    b = _count_cast(node)
    if b is not None:
        return "cast", b
    if node.op != "call_function" or node.target not in FULL or len(node.args) != 1 or node.kwargs:
        return None
    t, val = _short_1d(node.args[0]), tensor_val(node)
    if t is None or val is None:
        return None
    if node.target is aten.sum.default:
        ok = t.dtype in ops.DTYPES and t.dtype != torch.bool and val.dtype == t.dtype
    else:
        ok = t.dtype == torch.bool
    return ("full", node.args[0]) if ok else None


def spell_full_sums(gm):
    """Rewrites each full reduction of a short 1-D value (above) as a row reduction of one
    row and a view to 0-dim. Returns how many it rewrote."""
    mode, found = fake_meta.matches(gm, _full)
    done = 0
    for node, (form, x) in found:
        made = []
        with gm.graph.inserting_before(node):
            if form == "cast":
                dtype = node.kwargs["dtype"]
                x = fake_meta.call(gm, mode, aten._to_copy.default, (x,), {"dtype": dtype}, made)
                target = aten.sum.dim_IntList
            else:
                target = FULL[node.target]
            dims = [-1] if target is aten.sum.dim_IntList else -1
            row = fake_meta.call(gm, mode, target, (x, dims, True), None, made)
            value = fake_meta.call(gm, mode, aten.view.default, (row, []), None, made)
        summed = node.args[0] if form == "cast" else None
        if fake_meta.substitute(gm, node, value, made):
            done += 1
            if summed is not None and not summed.users:
                gm.graph.erase_node(summed)
    if done:
        graph_code.edited(gm)
        log.debug("fuseml: %d full reduction(s) of a short 1-D value as one row", done)
    return done
