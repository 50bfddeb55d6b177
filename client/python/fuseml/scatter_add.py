"""An accumulating index_put over rows as one scatter-add, where ATen sorts.

What aot_autograd writes for the gradient of a gather of rows, `x[idx]` (a mixture-of-experts
layer sending each token to its experts and gathering their outputs back), is

    index_put(zeros, [idx], grad, accumulate=True)

ATen's CUDA `index_put_` with accumulate sorts the indices (a radix sort, copies, a masked fill)
and reduces each run of equal ones. On the MoE decoder (Mixtral 8x top-2, d1024, 4096 tokens,
H200) that was 16 calls a training step: 0.50 ms of `_index_put_impl_`, 0.48 ms of
`masked_fill_`, twice Inductor's radix-sort kernels (bench/NOTES.md, "The logits' zeros").
Inductor makes of it atomic adds into the buffer, and so does this rewrite:

    index_put_add(x, idx, values) = fp32 copy of x, index_add_(0, idx, values.float()), cast to x's dtype

the sums in fp32, as ATen's are (for a bf16 or f16 x the graph gets the fp32 sums and a cast
node, which joins the op that reads it: the MoE layer's residual add), in whatever order the atomics land: not bitwise reproducible,
so, as for embedding gradients (embedding_grad.py), the rewrite is not made when
`torch.use_deterministic_algorithms(True)` is in force when the graph is compiled, and the
function calls ATen's op when it is in force at the call. A buffer whose rows each take more
than MAX_IDS_PER_ROW indices on average stays ATen's (atomic adds to one row serialise).

Taken: accumulate=True, one 1-D int32/int64 index over dim 0, values of shape
[len(idx), *x.shape[1:]] and x's dtype (bf16, f16 or fp32), static sizes."""

import torch

from . import fake_meta, graph_code
from ._log import log
from .embedding_grad import FEW_IDS, MAX_IDS_PER_ROW
from .fake_meta import tensor_val
from .shapes import is_plain_int

aten = torch.ops.aten
DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def index_put_add(x, idx, values):
    """aten.index_put(x, [idx], values, accumulate=True) over dim 0, by scatter-add (above)."""
    return index_put_add_fp32(x, idx, values).to(x.dtype)


def index_put_add_fp32(x, idx, values):
    """index_put_add's value before its cast: the sums in fp32."""
    if torch.are_deterministic_algorithms_enabled():
        return aten.index_put.default(x, [idx], values, True).float()
    # one fp32 copy of x, added into in place (x.float() then an out-of-place index_add
    # would copy it twice)
    return x.to(torch.float32, copy=True).index_add_(0, idx, values.float())


def _operands(node):
    """(x, idx, values) of an index_put node this rewrite takes, else None."""
    if node.op != "call_function" or node.target is not aten.index_put.default or node.kwargs:
        return None
    args = list(node.args) + [False] * (4 - len(node.args))
    x, indices, values, accumulate = args[:4]
    if accumulate is not True or not isinstance(indices, (list, tuple)) or len(indices) != 1:
        return None
    idx = indices[0]
    vx, vi, vv = (tensor_val(n) if isinstance(n, torch.fx.Node) else None for n in (x, idx, values))
    if vx is None or vi is None or vv is None:
        return None
    if vx.dtype not in DTYPES or vv.dtype != vx.dtype or vi.dtype not in (torch.int32, torch.int64) or vi.dim() != 1:
        return None
    if vx.dim() < 1 or not all(is_plain_int(s) for s in (*vx.shape, *vi.shape, *vv.shape)):
        return None
    if tuple(vv.shape) != (vi.shape[0], *vx.shape[1:]):
        return None
    if vi.shape[0] > MAX_IDS_PER_ROW * vx.shape[0] and vi.shape[0] > FEW_IDS:
        return None
    return x, idx, values


def rewrite_index_put_adds(gm):
    """Each accumulating index_put of gm over rows that can be (above) becomes
    index_put_add_fp32, and a cast to its dtype where that is not fp32 (the cast's value is the
    old node's). Returns how many were rewritten."""
    if torch.are_deterministic_algorithms_enabled():
        return 0
    mode, found = fake_meta.matches(gm, _operands)
    n = 0
    for node, operands in found:
        made = []
        try:
            with gm.graph.inserting_before(node):
                add = fake_meta.call(gm, mode, index_put_add_fp32, operands, made=made)
                dtype = node.meta["val"].dtype
                if dtype != torch.float32:
                    add = fake_meta.call(gm, mode, aten._to_copy.default, (add,), {"dtype": dtype}, made)
        except Exception as e:  # leave ATen's op
            log.debug("fuseml: %s stays ATen's: %s", node.name, e)
            for m in reversed(made):
                gm.graph.erase_node(m)
            continue
        n += fake_meta.substitute(gm, node, add, made)
    if n:
        graph_code.edited(gm)
        log.debug("fuseml: %d accumulating index_put(s) as scatter-adds", n)
    return n
