"""The weight gradient of an embedding as one scatter-add into fp32, where ATen sorts.

ATen's `embedding_dense_backward` on CUDA sorts the token ids and reduces each run of equal
ids (a deterministic sum): a radix sort, segment offsets, partial sums and a scatter, a dozen
launches and allocations. On an H200's host it took 305-412 us of host time a step (Llama's
and GPT-2's training steps, bench/NOTES.md, "A training step's host time"), for ~0.13 ms of
GPU work; GPT-2 has two of them. Inductor makes of it what this module does: an fp32 buffer
of zeros, every token's gradient row added into its id's row (atomic adds), the buffer cast
to the gradient's dtype. Four launches and ~120 us of host.

    rewrite_embedding_grads(gm) -> int     # nodes rewritten (before partitioning)
    embedding_grad(grad, indices, num_weights, padding_idx, scale_grad_by_freq) -> Tensor

Where a fusible op reads the gradient, the graph gets the fp32 sums (embedding_grad_fp32) and
an `aten._to_copy` node that casts them, so that the cast joins its reader: GPT-2's tied
weight adds the lm_head's gradient to the embedding's, one kernel reading the fp32 sums where
it was a cast and an add.

The sums are in fp32 as ATen's are, in whatever order the atomics land: the result may differ
from ATen's in the last bits of fp32 before the cast and is not bitwise reproducible. So the
rewrite is not made when `torch.use_deterministic_algorithms(True)` is in force when the graph
is compiled, and the function itself calls ATen's op when it is in force at the call. A
gradient scaled by frequency (`scale_grad_by_freq`) stays ATen's, and so does a table read by
many ids a row (MAX_IDS_PER_ROW) in a large batch (FEW_IDS). Rows at `padding_idx` get no
gradient, as ATen's: that row is zeroed after the adds (only its own tokens reach it)."""

import torch

from . import fake_meta, graph_code, ops
from ._log import log
from .fake_meta import tensor_val
from .row_adds import add_rows_

aten = torch.ops.aten
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
# Atomic adds to one row serialise: T5's relative position bias (512 x 512 ids into 32 rows,
# 8192 a row) took 90 us a table as a scatter-add on an H200, where ATen's sort reduces each
# row's run at once. A table with more ids than this many per row on average stays ATen's;
# a vocabulary (4096 tokens into 32000 rows) is far below it.
MAX_IDS_PER_ROW = 16
# ...unless the whole batch is this few ids: then no row waits on more than that many adds
# (~45 us at T5's rate), where ATen's sort costs ~0.3 ms of host a call. BERT's token-type
# table (2 rows, 8 x 512 ids, usually all 0) was ATen's by the rule above: 227 kernels a
# training step, wall 1.08x Inductor's (bench/NOTES.md, "Cross-entropy's row read once").
FEW_IDS = 4096


def embedding_grad(grad, indices, num_weights, padding_idx, scale_grad_by_freq):
    """aten.embedding_dense_backward's value, by scatter-add (above)."""
    return embedding_grad_fp32(grad, indices, num_weights, padding_idx, scale_grad_by_freq).to(grad.dtype)


def embedding_grad_fp32(grad, indices, num_weights, padding_idx, scale_grad_by_freq):
    """embedding_grad's value before its cast: the sums in fp32."""
    if scale_grad_by_freq or torch.are_deterministic_algorithms_enabled():
        out = aten.embedding_dense_backward.default(grad, indices, num_weights, padding_idx, scale_grad_by_freq)
        return out.float()
    d = grad.shape[-1]
    out = torch.zeros((num_weights, d), dtype=torch.float32, device=grad.device)
    add_rows_(out, indices.reshape(-1), grad.reshape(-1, d).float())
    if padding_idx >= 0:
        out[padding_idx] = 0
    return out


def _rewritable(node):
    if node.op != "call_function" or node.target is not aten.embedding_dense_backward.default:
        return False
    grad, indices = tensor_val(node.args[0]), tensor_val(node.args[1])
    scale = node.args[4] if len(node.args) > 4 else node.kwargs.get("scale_grad_by_freq", False)
    num_weights = node.args[2]
    return (
        grad is not None
        and indices is not None
        and grad.dtype in DTYPES
        and indices.dtype in (torch.int32, torch.int64)
        and scale is False
        and not node.kwargs
        and isinstance(num_weights, int)
        and isinstance(indices.numel(), int)
        and (indices.numel() <= MAX_IDS_PER_ROW * num_weights or indices.numel() <= FEW_IDS)
    )


def rewrite_embedding_grads(gm):
    """Each embedding_dense_backward node of gm that can be (above) becomes embedding_grad_fp32
    and a cast to its dtype where a fusible op reads it (the cast's value is the old node's),
    else one call of embedding_grad. Returns how many were rewritten."""
    if torch.are_deterministic_algorithms_enabled():
        return 0
    mode, found = fake_meta.matches(gm, lambda node: True if _rewritable(node) else None)
    n = 0
    for node, _ in found:
        if not any(ops.fusible(u) for u in node.users):  # a gradient no kernel reads: one call
            node.target = embedding_grad
            n += 1
            continue
        made = []
        try:
            with gm.graph.inserting_before(node):
                sums = fake_meta.call(gm, mode, embedding_grad_fp32, node.args, made=made)
                cast = fake_meta.call(gm, mode, aten._to_copy.default, (sums,), {"dtype": node.meta["val"].dtype}, made)
        except Exception as e:  # leave ATen's op
            log.debug("fuseml: %s stays ATen's: %s", node.name, e)
            fake_meta.discard(gm, made)
            continue
        n += fake_meta.substitute(gm, node, cast, made)  # not in another layout than the traced one
    if n:
        graph_code.edited(gm)
        log.debug("fuseml: %d embedding gradient(s) as fp32 scatter-adds", n)
    return n
