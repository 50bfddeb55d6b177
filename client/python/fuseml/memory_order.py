"""A graph rewrite before partitioning: pointwise ops and reductions over channels-last values
(channels_last.py) run in their memory order. A fragment
iterates its tensors' dims as given, so a [N, C, H, W] value stored as [N, H, W, C] was
walked with its innermost dim W at a stride of C elements: no access coalesced, no vector
loads. Seen through permute(x, order), the same memory is a contiguous [N, H, W, C] tensor,
which the kernel walks flat; and batch norm's statistics over [0, 2, 3] become a reduction
over the leading [N, H, W], the column reduction of its [N * H * W, C] view that
column_rewrite.py spells:
  y = f(x, s)                 x channels-last, s per channel [1, C, 1, 1]
  ->  y = permute(f(permute(x, order), permute(s, order)), inverse)
  m = mean(x, [0, 2, 3], keepdim)
  ->  m = permute(mean(permute(x, order), [0, 1, 2], keepdim), inverse)
A permute of a value this rewrite made is its source, so a chain of such ops meets no view
between its ops; the permutes left are views the other ops (convolutions, pooling) read in
place.

Exact: an elementwise op commutes with a permutation of all its operands, and a reduction
reduces the same elements. A node is rewritten only where the result is laid out as the
value was (its strides, save those of size-1 dims, which address nothing), where the
operation's own output is contiguous in the new order, and, for a reduction, where the dims
it keeps stay in their order."""

import torch

from . import fake_meta, graph_code, ops
from ._log import log
from .fake_meta import tensor_val
from .shapes import dense_order

aten = torch.ops.aten
REDUCTIONS = {aten.sum.dim_IntList, aten.mean.dim, aten.amax.default}


CHANNELS_LAST = [0, 2, 3, 1]


def _order(t):
    """The channels-last order of a value laid out so, else None. Only that one, and only in
    a graph that convolves: the transposed values of attention ([B, H, S, D] read as
    [B, S, H, D], or T5's [1, H, S, S] bias gathered as [S, S, H]) are what the
    partitioner's other rules (view_sink.py, cast_sink.py, transpose_rewrite.py) arrange,
    and their groups stay as those rules made them."""
    order = dense_order(t) if t is not None and t.dim() == 4 else None
    return order if order == CHANNELS_LAST else None


def _pointwise(node):
    """A pointwise op of tensors and scalars alone (no dims, sizes or layouts among its
    arguments, which a permutation would have to rewrite), whose value has a permuted order."""
    if node.op != "call_function" or node.target in ops.ALIASES or ops.cat_dim(node) is not None:
        return None
    if ops.why_not_pointwise(node) is not None or "memory_format" in node.kwargs:
        return None
    if any(isinstance(a, (list, tuple)) for a in list(node.args) + list(node.kwargs.values())):
        return None
    return _order(tensor_val(node))


def _reduction(node):
    """(order, the permuted dims) when node reduces a value of a permuted order over dims that
    lead in that order, keeping the other dims in theirs; else None."""
    if node.op != "call_function" or node.target not in REDUCTIONS or set(node.kwargs) - {"keepdim"}:
        return None
    x = node.args[0]
    order = _order(tensor_val(x))
    dims = node.args[1] if len(node.args) > 1 else None
    if order is None or not isinstance(dims, (list, tuple)) or not all(isinstance(d, int) for d in dims):
        return None
    rank = len(order)
    dims = sorted({d % rank for d in dims})
    moved = sorted(order.index(d) for d in dims)
    if moved != list(range(len(dims))) or len(dims) >= rank:
        return None
    kept = [d for d in order if d not in dims]
    return (order, moved) if kept == sorted(kept) else None


SMALL = 1 << 12  # elements of a per-channel value whose ops a reader computes again


def _small(node, rank):
    """A pointwise op of at most SMALL elements (batch norm's rsqrt(var + eps) per channel,
    its statistics cast to fp32) whose tensor operands are of its rank or lower: the ops
    reading it in memory order compute it again from its operands, seen in that order, so
    that its chain joins their group instead of running as kernels of its own over a few
    hundred elements (a ResNet-50 inference step: two such kernels per batch norm)."""
    t = tensor_val(node)
    if t is None or t.numel() > SMALL or t.dim() > rank or node.op != "call_function":
        return False
    if node.target in ops.ALIASES or ops.why_not_pointwise(node) is not None or "memory_format" in node.kwargs:
        return False
    if any(isinstance(a, (list, tuple)) for a in list(node.args) + list(node.kwargs.values())):
        return False
    return all(tensor_val(a) is not None and tensor_val(a).dim() <= t.dim() for a in node.all_input_nodes)


def _same_value(a, b):
    """Same shape and dtype, and the same strides where a dim has more than one element."""
    if tuple(a.shape) != tuple(b.shape) or a.dtype != b.dtype:
        return False
    return all(n == 1 or s == t for n, s, t in zip(a.shape, a.stride(), b.stride()))


class _Rewrite:
    def __init__(self, gm, fake):
        self.gm, self.fake = gm, fake
        self.source = {}  # a permute back this rewrite made -> (the value in order, order)
        self.views = {}  # (node, order) -> its permuted view

    def view(self, a, order, made):
        """a as the op in `order` reads it: the source of a permute back; a small pointwise
        value (per channel) computed again from its operands so read (_small); else a
        permuted view (of a value of lower rank, unsqueezed on the left first)."""
        t = tensor_val(a)
        if t is None or t.dim() == 0:
            return a
        if a in self.source and self.source[a][1] == order:
            return self.source[a][0]
        key = (a, tuple(order))
        if key not in self.views:
            if _small(a, len(order)):
                args, kwargs = torch.fx.node.map_arg((a.args, a.kwargs), lambda b: self.view(b, order, made))
                self.views[key] = fake_meta.call(self.gm, self.fake, a.target, args, kwargs, made)
                return self.views[key]
            x = a
            for _ in range(len(order) - t.dim()):
                x = fake_meta.call(self.gm, self.fake, aten.unsqueeze.default, (x, 0), made=made)
            self.views[key] = fake_meta.call(self.gm, self.fake, aten.permute.default, (x, order), made=made)
        return self.views[key]

    def node(self, n, order, dims=None):
        """n written in `order`; False (the graph as it was) when the result would differ."""
        made, views = [], dict(self.views)
        try:
            with self.gm.graph.inserting_before(n):
                args = torch.fx.node.map_arg(n.args, lambda a: self.view(a, order, made))
                if dims is not None:
                    args = (args[0], dims) + tuple(args[2:])
                op = fake_meta.call(self.gm, self.fake, n.target, args, n.kwargs, made)
                if not op.meta["val"].is_contiguous():
                    raise ValueError("its value is not contiguous in the new order")
                out = op
                if op.meta["val"].dim() == len(order):
                    inverse = [order.index(d) for d in range(len(order))]
                    out = fake_meta.call(self.gm, self.fake, aten.permute.default, (op, inverse), made=made)
                    self.source[out] = (op, order)
            if not _same_value(out.meta["val"], n.meta["val"]):
                raise ValueError("the result would be laid out otherwise")
        except Exception as e:
            log.debug("fuseml: %s stays in its order: %s", n.name, e)
            for w in reversed(made):
                self.source.pop(w, None)
                self.gm.graph.erase_node(w)
            self.views = views
            return False
        n.replace_all_uses_with(out)
        self.gm.graph.erase_node(n)
        return True


CONVOLUTIONS = {aten.convolution.default, aten.convolution_backward.default}


def run_in_memory_order(gm):
    """Rewrites gm in place (above) when it convolves (its channels-last values are
    channels_last.py's); returns whether anything changed."""
    if not any(n.target in CONVOLUTIONS for n in gm.graph.nodes):
        return False
    fake, found = fake_meta.matches(gm, lambda n: _pointwise(n) or _reduction(n))
    if not found:
        return False
    rewrite, changed = _Rewrite(gm, fake), False
    for n, _ in found:  # graph order: a producer is rewritten before its readers
        red = _reduction(n)
        if red is not None:
            changed |= rewrite.node(n, red[0], red[1])
        elif _pointwise(n) is not None:
            changed |= rewrite.node(n, _pointwise(n))
    for view in [v for v in rewrite.views.values() if not v.users]:
        gm.graph.erase_node(view)
    if changed:
        gm.graph.eliminate_dead_code()
        gm.graph.lint()
        graph_code.edited(gm)
        log.debug("fuseml: ops run in their values' memory order:\n%s", graph_code.source(gm))
    return changed
