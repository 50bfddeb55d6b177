"""A column group -> a column fragment (vocabulary 5, protocol/PROTOCOL.md "Column
fragments"): reductions over dim 0 of a 2-D value, the bias gradient grad.sum(0) that
autograd computes for every nn.Linear with a bias, or a LayerNorm's weight and bias gradients
from g, x and the per-row statistics, with a cast of each result. Its outputs are per column
([1, N], or [N] without keepdim) whatever M is, so the runtime allocates them at the nodes'
own static shapes (Built.out_fixed) while `outer` (M) still comes from the input. With M symbolic, `m_hint`
is the M at hand: the daemon tunes for its power-of-two bucket, as for GEMM fragments."""

import math

from .fragment import VOCAB_COLUMNS, Built, Emitter, Layout, Unfusable, wire_inputs
from .gemm_fragment import _hint
from .ops import DTYPES, column_reduction


def build_columns(members, in_nodes, out_nodes):
    """members in graph order: the column reductions over one [M, N] space, the pointwise ops
    before them over that space (their prologue) and the per-column ops after them (a cast of
    a sum); out_nodes: the per-column members read outside the group."""
    reductions = [n for n in members if column_reduction(n)]
    if not reductions:
        raise Unfusable("a column group reduces over dim 0")
    layout = Layout(reductions[0].args[0].meta["val"].shape)
    e = Emitter(in_nodes)
    for node in members:
        e.emit_node(node)
    inputs, full_input, in_align = wire_inputs(layout, in_nodes)
    n = int(layout.shape[-1])
    outputs, fixed = [], []
    for node in out_nodes:
        val = node.meta["val"]
        shape, strides = [int(d) for d in val.shape], [int(s) for s in val.stride()]
        if shape not in ([n], [1, n]):
            raise Unfusable(f"output {node.name} is not one value per column")
        outputs.append({"id": e.ids[node], "dtype": DTYPES[val.dtype], "shape": shape, "strides": strides, "align": 16})
        fixed.append((shape, strides))
    wire = {"vocab": VOCAB_COLUMNS, "inputs": inputs, "ops": e.ops, "outputs": outputs}
    if layout.k:  # M: the symbolic leading dims, collapsed into fragment dim 0
        wire["m_hint"] = max(1, math.prod(_hint(d) for d in layout.shape[: layout.k]))
    built = Built(wire, layout, in_nodes, out_nodes, full_input, [s for _, s in fixed], in_align)
    built.out_fixed = fixed
    return built
