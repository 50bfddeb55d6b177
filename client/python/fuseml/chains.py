"""Back-to-back GEMM chains: two matrix products where the second's A is computed from the
first. The MLP block fc2(gelu(fc1(x))) + x reaches the ATen graph as addmm -> gelu -> addmm
-> add: two GEMM groups, the first's only value feeding the second's product as A. Merged,
they are one vocabulary-3 fragment with two products (protocol/PROTOCOL.md, GEMM fragments,
"Chains"): the daemon's `b2b` kernel keeps the [M, N1] intermediate on chip instead of
writing it to memory and reading it back. gemm_fragment.build_chain spells it.

This module decides, for the partitioner, whether two GEMM groups *can* be a chain by what
they compute and read: the shapes, dtypes and layouts the generated kernel runs (a chain it
cannot run would only be answered bypass, and then sent again as two fragments), and an
intermediate that escapes nowhere. Whether the merge is legal in the graph (no cycle, no
mutation in between) is the partitioner's to check: it holds the dependency state.

aot_autograd writes nn.Linear on a [B, S, D] input with a view of the first group's
[B, S, N1] value back to [B*S, N1] before the second product; `link` finds that view (or the
value itself on a 2-D input), which joins the chain group as an alias of the same elements."""

import torch

from .fragment import _align_of
from .ops import RESHAPE_OPS, aten, products
from .shapes import is_plain_int, same_known_shape, size_at_hand

# Vocabulary 3's products; a bmm chain is not a chain shape.
PRODUCT_OPS = {aten.mm.default, aten.addmm.default}

# The b2b template's limits (PROTOCOL.md, Chains): K1 and N2 whole in shared memory/registers,
# and at least MIN_ROWS rows (M, or the M at hand when it is symbolic): with fewer the GPU is
# mostly idle and the two GEMM kernels win, so the daemon answers bypass (bench/NOTES.md).
MAX_K1, MAX_N2, MIN_ROWS = 256, 256, 8192


def link(p2):
    """(value node, link node) when the A of product p2 is computed by some node `value`
    (directly, or through one reshape `link`: [B, S, N1] seen as [B*S, N1]); else None. The
    link node is p2's A itself when there is no view."""
    a = p2.args[-2]
    if not isinstance(a, torch.fx.Node) or a.op != "call_function":
        return None
    if a.target in RESHAPE_OPS and isinstance(a.args[0], torch.fx.Node):
        return a.args[0], a
    return a, a


def why_not_link(view, p1):
    """None when `view` (a reshape between the first group's value and the second product)
    shows the same elements as an [M, N1] matrix; else why not."""
    val, src = view.meta.get("val"), view.args[0].meta.get("val")
    if not isinstance(val, torch.Tensor) or not isinstance(src, torch.Tensor):
        return "no tensor metadata"
    size = view.args[1] if len(view.args) > 1 else None
    if not isinstance(size, (list, tuple)) or not all(is_plain_int(d) for d in size):
        # a symbolic size names a SymInt node the group would have to take as an input
        return "the view between the products has symbolic sizes"
    if not same_known_shape(val.shape, p1.meta["val"].shape) or not src.is_contiguous():
        return "the view between the products is not the first product's [M, N1]"
    return None


def _k_major(t):
    """B [K, N] as nn.Linear's weight.t(): K contiguous, the leading dim a multiple of 8."""
    st = t.stride()
    return all(is_plain_int(s) for s in st) and st[0] == 1 and st[1] % 8 == 0


def why_not_pair(p1, p2, value):
    """None when products p1 (the first group's) and p2 (the second's, whose A is computed
    from `value`, p1's group's value) can be one chain fragment that the b2b kernel runs;
    else the reason they stay two groups."""
    if p1.target not in PRODUCT_OPS or p2.target not in PRODUCT_OPS:
        return "only mm/addmm products chain"
    x, w1, a2, w2 = p1.args[-2], p1.args[-1], p2.args[-2], p2.args[-1]
    if any(a is a2 for a in (p2.args[:-2] + (w2,))):
        return "the second product reads its A twice"
    tx, t1, t2 = (n.meta.get("val") for n in (x, w1, w2))
    if not all(isinstance(t, torch.Tensor) for t in (tx, t1, t2)):
        return "no tensor metadata"
    dt = p1.meta["val"].dtype
    if dt not in (torch.bfloat16, torch.float16):
        return f"{dt} products: the chain kernel takes bf16/f16"
    if any(t.dtype != dt for t in (tx, t1, t2, p2.meta["val"], value.meta["val"])):
        # the intermediate is rounded to the first product's dtype before the second product
        return "the products, their operands and the intermediate differ in dtype"
    k1, n1, n1b, n2 = tx.shape[1], t1.shape[1], t2.shape[0], t2.shape[1]
    if not all(is_plain_int(d) for d in (k1, n1, n2)):
        return "symbolic K1, N1 or N2"
    if n1b != n1:
        return "the second product's K is not the first's N"
    k1, n1, n2 = int(k1), int(n1), int(n2)
    if k1 % 64 or k1 > MAX_K1:
        return f"K1 = {k1} (the chain kernel takes a multiple of 64 up to {MAX_K1})"
    if n1 % 64:
        return f"N1 = {n1} (the chain kernel takes a multiple of 64)"
    if n2 % 16 or n2 > MAX_N2:
        return f"N2 = {n2} (the chain kernel takes a multiple of 16 up to {MAX_N2})"
    rows = size_at_hand(tx.shape[0])  # the M at hand: a symbolic M's hint
    if rows is not None and rows < MIN_ROWS:
        return f"M = {rows} (the chain kernel pays from {MIN_ROWS} rows; below, the two GEMMs win)"
    sx = tx.stride()
    if not all(is_plain_int(s) for s in sx) or sx[1] != 1 or sx[0] % 8:
        return "x is not row-major with a leading dim that is a multiple of 8"
    if not (_k_major(t1) and _k_major(t2)):
        return "a weight is not K-major (nn.Linear's weight.t())"
    if any(_align_of(t) < 16 for t in (tx, t1, t2)):
        return "an operand is not 16-byte aligned"
    return None


def reads_fit(stage_inputs, n1, n2):
    """None when every input an op of stage s reads (besides the matrix operands) can
    broadcast to [M, N_s]: its last dim N_s or 1 (rank 0 counts); else why not. The rows
    were already checked when each group formed."""
    for s, nodes in enumerate(stage_inputs):
        n = (n1, n2)[s]
        for b in nodes:
            t = b.meta.get("val")
            if not isinstance(t, torch.Tensor):
                return "a non-tensor operand"
            if t.dim() and not (is_plain_int(t.shape[-1]) and int(t.shape[-1]) in (1, n)):
                return f"stage {s + 1} reads {b.name}, which does not broadcast to [M, {n}]"
    return None


def stage_inputs(g1, g2, lnk):
    """What each stage of a chain of GEMM groups g1 -> g2 reads from outside both (the
    first's value `value` reaching the second product through the reshape `lnk`, or lnk is
    value), besides its product's matrix operands: two lists of nodes. The second stage may
    read x (the residual), sent as an input of its own (gemm_fragment.build_chain)."""
    (p1,), (p2,) = products(g1.members), products(g2.members)
    x, w1, w2 = p1.args[-2], p1.args[-1], p2.args[-1]
    both = set(g1.members) | set(g2.members) | {lnk}
    return [
        [b for n in g1.members for b in n.all_input_nodes if b not in both and not (n is p1 and b in (x, w1))],
        [b for n in g2.members for b in n.all_input_nodes if b not in both and not (n is p2 and b is w2)],
    ]


def why_not_groups(g1, g2, value, lnk):
    """None when GEMM group g1, whose value `value` is the A of g2's product (through the
    reshape `lnk`, or lnk is value), can be one chain group with g2 by what their products
    and epilogues compute and read; else why not. The graph's side (no cycle, no mutation in
    between, the view in no group) is the partitioner's."""
    if g1 is g2 or g1.kind != "gemm" or g2.kind != "gemm":
        return "not two GEMM groups"
    p1s, p2s = products(g1.members), products(g2.members)
    if len(p1s) != 1 or len(p2s) != 1:
        return "a chain holds two products, no siblings"
    (p1,), (p2,) = p1s, p2s
    why = why_not_pair(p1, p2, value)
    if why:
        return why
    if lnk is not value:
        why = why_not_link(lnk, p1)
        if why:
            return why
    # the intermediate stays on chip: nothing but the second product may read it (not
    # another op, not a graph output, not autograd's saved tensors, which are outputs)
    mset = set(g1.members)
    reader = p2 if lnk is value else lnk
    for n in g1.members:
        outside = set(n.users) - mset
        if n is value and outside != {reader}:
            return "the intermediate has other users (an output or saved for backward)"
        if n is not value and outside:
            return f"{n.name} of the first group is read outside it"
    if lnk is not value and set(lnk.users) != {p2}:
        return "the intermediate has other users (an output or saved for backward)"
    w1, w2 = p1.args[-1], p2.args[-1]
    # an epilogue never reads a weight (streamed through shared memory)
    if any(b is w2 for n in g1.members for b in n.all_input_nodes) or any(
        b in (w1, w2) for n in g2.members if n is not p2 for b in n.all_input_nodes
    ):
        return "an epilogue op reads a weight"
    why = reads_fit(stage_inputs(g1, g2, lnk), int(w1.meta["val"].shape[1]), int(w2.meta["val"].shape[1]))
    if why:
        return why
    if not same_known_shape(p1.meta["val"].shape[:1], p2.meta["val"].shape[:1]):
        return "the products have different M"
    return None
