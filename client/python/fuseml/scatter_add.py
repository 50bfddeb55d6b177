"""An accumulating index_put over rows as one scatter-add, where ATen sorts.

What aot_autograd writes for the gradient of a gather of rows, `x[idx]` (a mixture-of-experts
layer sending each token to its experts and gathering their outputs back), is

    index_put(zeros, [idx], grad, accumulate=True)

ATen's CUDA `index_put_` with accumulate sorts the indices (a radix sort, copies, a masked fill)
and reduces each run of equal ones. On the MoE decoder (Mixtral 8x top-2, d1024, 4096 tokens,
H200) that was 16 calls a training step: 0.50 ms of `_index_put_impl_`, 0.48 ms of
`masked_fill_`, twice Inductor's radix-sort kernels (bench/NOTES.md, "The logits' zeros").
Inductor makes of it atomic adds into the buffer, and so does this rewrite:

    index_put_add(x, idx, values) = fp32 copy of x, values.float() added at idx (row_adds.py),
                                    cast to x's dtype

the sums in fp32, as ATen's are (for a bf16 or f16 x the graph gets the fp32 sums and a cast
node, which joins the op that reads it: the MoE layer's residual add), in whatever order the
atomics land: not bitwise reproducible, so, as for embedding gradients (embedding_grad.py), the rewrite is not made when
`torch.use_deterministic_algorithms(True)` is in force when the graph is compiled, and the
function calls ATen's op when it is in force at the call. A buffer whose rows each take more
than MAX_IDS_PER_ROW indices on average stays ATen's (atomic adds to one row serialise).

A buffer that is a constant of zeros (aot_autograd's `new_zeros`, folded by const_fold.py) is
not copied: the fp32 sums start from a fresh zeroed buffer of its shape
(index_add_to_zeros_fp32). With an int64 index that call is a scatter group, one kernel of
atomic adds reading the values in their own dtype (scatter_fragment.py), and its ATen form
casts them inside. Otherwise the values' cast to fp32 is a node of the graph, so that it joins
the op that makes them (the MoE layer's zeroed padding rows: one kernel writes the fp32 values
where ATen's copy read the bf16 ones back).

Taken: accumulate=True, one 1-D int32/int64 index over dim 0, values of shape
[len(idx), *x.shape[1:]] and x's dtype (bf16, f16 or fp32), static sizes."""

import torch
from torch._subclasses.fake_tensor import FakeTensor

from . import fake_meta, graph_code
from .const_fold import constant
from ._log import log
from .embedding_grad import FEW_IDS, MAX_IDS_PER_ROW
from .fake_meta import tensor_val
from .row_adds import add_rows_
from .shapes import is_plain_int

aten = torch.ops.aten
DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def index_put_add(x, idx, values):
    """aten.index_put(x, [idx], values, accumulate=True) over dim 0, by scatter-add (above)."""
    return index_put_add_fp32(x, idx, values).to(x.dtype)


def index_put_add_fp32(x, idx, values):
    """index_put_add's value before its cast: the sums in fp32 (values of any float dtype)."""
    # one fp32 copy of x, added into in place (x.float() then an out-of-place index_add
    # would copy it twice)
    return _add_into(x.to(torch.float32, copy=True), idx, values)


def index_add_to_zeros_fp32(idx, values, shape):
    """index_put_add_fp32 of a buffer of zeros of `shape`: the sums in fp32, from a fresh
    zeroed buffer (a memset where a copy would read the zeros)."""
    return _add_into(values.new_zeros(shape, dtype=torch.float32), idx, values)


def _add_into(buffer, idx, values):
    """buffer (fp32, this call's own) with values' rows added at idx, in place."""
    if torch.are_deterministic_algorithms_enabled():  # ATen's sorted, reproducible sums
        return aten.index_put_.default(buffer, [idx], values.float(), True)
    return add_rows_(buffer, idx, values.float())


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
        x, idx, values = operands
        try:
            zeros = _zeros(gm, x)
            # a scatter group reads the values in their own dtype (above)
            group = zeros and tensor_val(idx).dtype == torch.int64
            with gm.graph.inserting_before(node):
                if tensor_val(values).dtype != torch.float32 and not group:  # joins the op that makes the values
                    values = fake_meta.call(gm, mode, aten._to_copy.default, (values,), {"dtype": torch.float32}, made)
                if zeros:
                    shape = list(tensor_val(x).shape)
                    add = fake_meta.call(gm, mode, index_add_to_zeros_fp32, (idx, values, shape), made=made)
                else:
                    add = fake_meta.call(gm, mode, index_put_add_fp32, (x, idx, values), made=made)
                dtype = node.meta["val"].dtype
                if dtype != torch.float32:
                    add = fake_meta.call(gm, mode, aten._to_copy.default, (add,), {"dtype": dtype}, made)
        except Exception as e:  # leave ATen's op
            log.debug("fuseml: %s stays ATen's: %s", node.name, e)
            fake_meta.discard(gm, made)
            continue
        n += fake_meta.substitute(gm, node, add, made)
        _drop_unread_constant(gm, x)
    if n:
        graph_code.edited(gm)
        log.debug("fuseml: %d accumulating index_put(s) as scatter-adds", n)
    return n


def _zeros(gm, node):
    """Whether node is a tensor of zeros: a zeros op, or a constant (computed once when the
    graph compiled, const_fold.py) whose every element is 0."""
    if isinstance(node, torch.fx.Node) and node.target in (aten.new_zeros.default, aten.zeros.default):
        return True
    t = constant(gm, node) if isinstance(node, torch.fx.Node) and node.op == "get_attr" else None
    return t is not None and not isinstance(t, FakeTensor) and not bool(t.any())


def _drop_unread_constant(gm, node):
    """A get_attr node no one reads any more goes, and its tensor with it when no other node
    reads that attribute (a zeros buffer the scatter-add no longer copies would hold its memory
    for the graph's life)."""
    if not isinstance(node, torch.fx.Node) or node.op != "get_attr" or node.users:
        return
    target = node.target
    gm.graph.erase_node(node)
    if "." not in target and not any(n.op == "get_attr" and n.target == target for n in gm.graph.nodes):
        delattr(gm, target)
