"""Sibling GEMMs: two matrix products that read one A, fused with the epilogue that combines
them. Llama's SwiGLU MLP, down(silu(gate(x)) * up(x)), reaches the ATen graph as two mm (or
addmm) of the same x by two weights, then silu, then mul; one kernel streams x once, keeps
both [M, N] accumulators in registers and stores only what leaves the group. On the wire it
is an ordinary vocabulary-3 GEMM fragment with two products sharing A's value id
(protocol/fm_fragment.h, "Siblings"); gemm_fragment.build_gemm spells it.

This module decides, for the partitioner, whether two GEMM groups *can* be siblings by what
they compute and read (the same A, two B's of one shape, dtype and layout, within the
generated templates' limits; an epilogue that never reads a product's operand). Whether the
merge is legal in the graph (no cycle, no mutation in between) is the partitioner's to
check: it holds the dependency state.

aot_autograd writes nn.Linear on a [B, S, D] input as a separate `view(x, [B*S, D])` per
projection, so the two A's are usually two nodes. They are one value when they are the same
pure function of the same inputs (`same_value`); `share_a` then points the later product at
the earlier node, so that the group, the fragment and the ATen fallback all read one tensor."""

import operator

import torch

from . import graph_code
from .ops import RESHAPE_OPS, VIEW_OPS, aten, products
from .shapes import is_plain_int, same_known_shape

# The products a sibling group takes: vocabulary 3's (a bmm pair is not a sibling shape).
PRODUCT_OPS = {aten.mm.default, aten.addmm.default}

# Ops that compute the same value from the same arguments and never copy data another op
# could have changed in between: views, and the SymInt arithmetic that sizes them under
# dynamic shapes.
_PURE = VIEW_OPS | RESHAPE_OPS | {aten.sym_size.int, operator.mul, operator.add, operator.sub, operator.floordiv}


def same_value(a, b, depth=6):
    """True when FX values a and b are provably one value: the same node, or the same pure op
    (a view, a size computation) of provably equal arguments."""
    if a is b:
        return True
    if isinstance(a, torch.fx.Node) != isinstance(b, torch.fx.Node):
        return False
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(same_value(x, y, depth) for x, y in zip(a, b))
    if not isinstance(a, torch.fx.Node):
        return type(a) is type(b) and a == b
    if depth == 0 or a.op != "call_function" or b.op != "call_function" or a.target is not b.target:
        return False
    if a.target not in _PURE or set(a.kwargs) != set(b.kwargs):
        return False
    return same_value(list(a.args), list(b.args), depth - 1) and all(
        same_value(a.kwargs[k], b.kwargs[k], depth - 1) for k in a.kwargs
    )


def _chunked(t):
    """The generated templates read A and B in 16-byte chunks (8 bf16/f16 elements): every
    stepped stride but the unit one a multiple of 8. A pair the templates cannot run is left
    as two GEMM groups: the daemon's sibling cuBLASLt plan (two matmuls and one epilogue
    kernel) would be its only candidate, no better than each GEMM served apart."""
    for size, stride in zip(t.shape, t.stride()):
        if not is_plain_int(stride):
            return False
        if is_plain_int(size) and int(size) == 1 or stride == 1:
            continue
        if stride % 8:
            return False
    return True


def why_not_pair(p, q):
    """None when products p and q (mm/addmm FX nodes, each the start of a GEMM group) can be
    one sibling fragment's two products; else the reason they stay apart."""
    if p.target not in PRODUCT_OPS or q.target not in PRODUCT_OPS:
        return "only mm/addmm products pair as siblings"
    a1, b1, a2, b2 = p.args[-2], p.args[-1], q.args[-2], q.args[-1]
    if not same_value(a1, a2):
        return "the products read different A's"
    if same_value(b1, b2):
        return "the products read the same B (one product would do)"
    if any(same_value(b, a1) for b in (b1, b2)):
        return "a B is the products' A"
    ta, t1, t2 = (x.meta.get("val") for x in (a1, b1, b2))
    if not all(isinstance(t, torch.Tensor) for t in (ta, t1, t2)):
        return "no tensor metadata"
    if t1.dtype != t2.dtype or list(t1.shape) != list(t2.shape):
        return "the B's differ in shape or dtype"
    if list(t1.stride()) != list(t2.stride()):
        # the kernel loads both B's with one addressing (the daemon answers "the sibling B's
        # differ in layout"): apart, each group can still be served
        return "the B's differ in layout"
    if p.meta["val"].dtype != q.meta["val"].dtype:
        return "the products differ in dtype"
    k = ta.shape[-1]
    if not is_plain_int(k) or int(k) % 8 or not all(_chunked(t) for t in (ta, t1)):
        return "K or a leading dimension is not a multiple of 8 (no template runs the pair)"
    return None


def why_not_groups(g, h, node):
    """None when GEMM groups g and h can be one sibling group that `node` (a pointwise op
    reading both) joins, by what their products and epilogues compute and read; else why
    not. The graph's side (no cycle, no mutation in between) is the partitioner's."""
    if g.kind != "gemm" or h.kind != "gemm":
        return "not two GEMM groups"
    pg, ph = products(g.members), products(h.members)
    if len(pg) != 1 or len(ph) != 1:
        return "a GEMM group holds two products at most"
    why = why_not_pair(pg[0], ph[0])
    if why:
        return why
    if not same_known_shape(g.shape, h.shape):
        return "the groups run over different shapes"
    # the epilogue never reads a product's operands (streamed, not addressable per element)
    operands = {x for p in (pg[0], ph[0]) for x in p.args[-2:]}
    if any(b in operands for n in g.members + h.members + [node] if n not in (pg[0], ph[0]) for b in n.all_input_nodes):
        return "an epilogue op reads a product's operand"
    return None


def share_a(p, q):
    """Points the later of products p, q at the earlier one's A node (same_value has proved
    them one value), so the sibling group has one A input. Graph surgery that changes no
    value; the owning module is recompiled so its code says what its graph says."""
    order = {n: i for i, n in enumerate(p.graph.nodes)}
    first, second = sorted((p, q), key=order.__getitem__)
    a, other = first.args[-2], second.args[-2]
    if a is other:
        return
    second.args = tuple(second.args[:-2]) + (a, second.args[-1])
    gm = second.graph.owning_module
    if gm is not None:
        graph_code.edited(gm)
