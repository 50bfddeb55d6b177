"""A column group -> a column fragment (vocabulary 5, protocol/PROTOCOL.md "Column
fragments"): one reduction over dim 0 of a 2-D value, the bias gradient grad.sum(0) that
autograd computes for every nn.Linear with a bias. Its output is per column ([1, N], or [N]
without keepdim) whatever M is, so the runtime allocates it at the node's own static shape
(Built.out_fixed) while `outer` (M) still comes from the input. With M symbolic, `m_hint`
is the M at hand: the daemon tunes for its power-of-two bucket, as for GEMM fragments."""
import math

from .fragment import VOCAB_COLUMNS, Built, Emitter, Layout, Unfusable, wire_inputs
from .gemm_fragment import _hint
from .ops import DTYPES, column_reduction


def build_columns(members, in_nodes, out_nodes):
    if len(members) != 1 or column_reduction(members[0]) is None:
        raise Unfusable("a column group is one reduction over dim 0")
    node = members[0]
    layout = Layout(node.args[0].meta["val"].shape)
    e = Emitter(in_nodes)
    e.emit_node(node)
    inputs, full_input, in_align = wire_inputs(layout, in_nodes)
    val = node.meta["val"]
    shape, strides = [int(d) for d in val.shape], [int(s) for s in val.stride()]
    outputs = [{"id": e.ids[node], "dtype": DTYPES[val.dtype], "shape": shape,
                "strides": strides, "align": 16}]
    wire = {"vocab": VOCAB_COLUMNS, "inputs": inputs, "ops": e.ops, "outputs": outputs}
    if layout.k:   # M: the symbolic leading dims, collapsed into fragment dim 0
        wire["m_hint"] = max(1, math.prod(_hint(d) for d in layout.shape[: layout.k]))
    built = Built(wire, layout, in_nodes, out_nodes, full_input, [strides], in_align)
    built.out_fixed = [(shape, strides)]
    return built
