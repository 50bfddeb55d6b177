"""A scatter group -> a scatter fragment (vocabulary 8, protocol/fm_fragment.h "Scatter
fragments"): rows of values added at rows idx[m] of a zeroed fp32 buffer, by atomic adds, one
kernel for the call that scatter_add.py (the gradient of a gather of rows) and embedding_grad.py
(an embedding's weight gradient) leave in the graph.

    scatter_operands(node) -> (values, idx, split) | None  # a call a scatter group takes
    build_scatter(members, in_nodes, out_nodes) -> Built   # a scatter group's fragment
    flat(shape, strides, split) -> (shape, strides) | None # a tensor as the kernel reads it

The fragment (values [*lead, *row] read as [M, D], idx [*lead] read as [M]):

    inputs  [{id 0, values' dtype, [M, D]}, {id 1, "i64", [M]}]   any strides, one a dim
    ops     [{"op": "index_add", "out": 2, "args": [0, 1]}]
    outputs [{id 2, "f32", [R, D], strides [D, 1]}]                the sums, [R, *row] viewed

index_add_to_zeros_fp32(idx, values, shape) has one leading dim (split 1), an embedding's
gradient embedding_grad_fp32(grad, ids, ...) one row dim (split = ids.dim()). The kernel adds
into its output, so every path that launches it allocates that output zeroed (Built.zeroed:
runtime.py, straight_line.py). The values are read in their own dtype: the call's ATen form,
what runs when the daemon refuses the fragment or measured routing finds ATen faster, casts
them inside. Its sums land in whatever order the atomics do, as the call's own (the rewrites
are not made under deterministic algorithms, and dynamo compiles a graph again when that
setting changes).

Taken: an int64 index (an int32 one stays the call's: the daemon reads i64), float values (bf16,
f16, f32) on the index's device, static sizes of at least one element; an embedding gradient
neither with a padding_idx (its row is zeroed after the adds) nor scaled by frequency."""

import math

import torch

from .embedding_grad import embedding_grad_fp32
from .fake_meta import tensor_val
from .fragment import VOCAB_SCATTER, Built, Layout, Unfusable, _align_of
from .ops import DTYPES
from .scatter_add import index_add_to_zeros_fp32
from .shapes import is_plain_int

VALUE_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def scatter_operands(node):
    """(values node, idx node, split: how many leading dims of values idx covers) of a call
    node a scatter group takes (above), else None."""
    if node.op != "call_function" or node.kwargs:
        return None
    if node.target is index_add_to_zeros_fp32 and len(node.args) == 3:
        idx, values, _ = node.args
        split = 1
    elif node.target is embedding_grad_fp32 and len(node.args) == 5:
        values, idx, _, padding_idx, scale_grad_by_freq = node.args
        if not (is_plain_int(padding_idx) and padding_idx < 0) or scale_grad_by_freq is not False:
            return None
        split = getattr(tensor_val(idx), "ndim", 0)
    else:
        return None
    vv, vi, out = tensor_val(values), tensor_val(idx), tensor_val(node)
    if vv is None or vi is None or out is None:
        return None
    if vi.dtype != torch.int64 or vv.dtype not in VALUE_DTYPES or out.dtype != torch.float32:
        return None
    if len({vv.device, vi.device, out.device}) != 1 or vi.dim() < 1:
        return None
    sizes = (*vv.shape, *vv.stride(), *vi.shape, *vi.stride(), *out.shape)
    if not all(is_plain_int(s) for s in sizes) or 0 in (*vv.shape, *out.shape):
        return None
    if tuple(vv.shape[:split]) != tuple(vi.shape) or vv.shape[split:] != out.shape[1:]:
        return None
    return values, idx, split


def flat(shape, strides, split=None):
    """([M, D], [stride of M, stride of D]) of a tensor whose dims before `split` are read as
    M and the others as D ([M] alone, all its dims, when split is None: the index), or None
    where a group of dims is not one stride apart (each dim of more than one element stepping
    over the whole of the next ones: a transposed or a sliced row)."""
    parts = (
        [(shape, strides)] if split is None else [(shape[:split], strides[:split]), (shape[split:], strides[split:])]
    )
    out_shape, out_strides = [], []
    for sizes, steps in parts:
        dims = [(int(n), int(s)) for n, s in zip(sizes, steps) if int(n) != 1]
        if any(s0 != s1 * n1 for (_, s0), (n1, s1) in zip(dims, dims[1:])):
            return None
        out_shape.append(math.prod(n for n, _ in dims))
        out_strides.append(dims[-1][1] if dims else 1)
    return out_shape, out_strides


def build_scatter(members, in_nodes, out_nodes):
    """The fragment of a scatter group (its one call node, members[0]). Its inputs are the
    values and the index in that order (the wire's), whatever order in_nodes has them in."""
    node = members[0]
    found = scatter_operands(node) if len(members) == 1 else None
    if found is None:
        raise Unfusable("a scatter group is one index_add_to_zeros_fp32 or embedding_grad_fp32 call")
    values, idx, split = found
    if list(out_nodes) != [node] or set(in_nodes) != {values, idx}:
        raise Unfusable(f"{node.name}: a scatter group reads its values and index and stores its sums")
    vv, vi, out = tensor_val(values), tensor_val(idx), tensor_val(node)
    src = flat(vv.shape, vv.stride(), split)
    index = flat(vi.shape, vi.stride())
    if src is None or index is None:
        raise Unfusable(f"{node.name}: its values or index are not read as [M, D] and [M] by one stride a dim")
    (_, d), r = src[0], int(out.shape[0])
    in_align = [_align_of(vv), _align_of(vi)]
    wire = {
        "vocab": VOCAB_SCATTER,
        "inputs": [
            {"id": 0, "dtype": DTYPES[vv.dtype], "shape": src[0], "strides": src[1], "align": in_align[0]},
            {"id": 1, "dtype": "i64", "shape": index[0], "strides": index[1], "align": in_align[1]},
        ],
        "ops": [{"op": "index_add", "out": 2, "args": [0, 1]}],
        "outputs": [{"id": 2, "dtype": "f32", "shape": [r, d], "strides": [d, 1], "align": 16}],
    }
    built = Built(wire, Layout([r, d]), [values, idx], [node], None, [[d, 1]], in_align)
    built.out_fixed = [([r, d], [d, 1])]
    if list(out.shape) != [r, d]:
        built.out_views = [list(out.shape)]  # [R, *row]
    built.zeroed = True
    built.in_splits = [split, None]
    return built
