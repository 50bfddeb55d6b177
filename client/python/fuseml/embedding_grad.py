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
    slot_table(indices, num_weights) -> Tensor        # each id's row in a table of the batch's ids
    without_id(table, padding_idx, empty) -> Tensor   # the table with padding_idx's row the empty one

A 16-bit gradient that goes straight out of the graph, of a table larger than the batch (a
language model's vocabulary: 4096 tokens into 32000 rows of 1024), is summed in a table of the
batch's size instead: the fp32 [V, D] table and its cast moved 330 MB a step on Llama, ~80 us
of fill and cast on an H200 for 16 MB of sums. Each id's slot is the position of one token
with it, T for an id no token has (slot_table: positions scattered into a [V] table of T);
the tokens' gradients are added at their ids' slots into a zeroed fp32 [T + 1, D] table
(embedding_grad_fp32 over the slots: the scatter group), whose last row no token reaches; and
the gradient is that table's row at each id's slot, cast to the gradient's dtype: one take_rows
group writing every row of the [V, D] result, zeros included. Before, the rows were read back
at each token's slot and written at its id into a zeroed table of the gradient's dtype: the
zeros a fill of their own (20 us on Llama's 65 MB) and the rows a scatter (15 us).

Where a fusible op reads the gradient, the graph gets the fp32 sums (embedding_grad_fp32) and
an `aten._to_copy` node that casts them, so that the cast joins its reader: GPT-2's tied
weight adds the lm_head's gradient to the embedding's, one kernel reading the fp32 sums where
it was a cast and an add.

The sums are in fp32 as ATen's are, in whatever order the atomics land: the result may differ
from ATen's in the last bits of fp32 before the cast and is not bitwise reproducible. So the
rewrite is not made when `torch.use_deterministic_algorithms(True)` is in force when the graph
is compiled, and the function itself calls ATen's op when it is in force at the call. A
gradient scaled by frequency (`scale_grad_by_freq`) stays ATen's, and so does a table read by
many ids a row (MAX_IDS_PER_ROW) in a large batch (FEW_IDS), unless the table is small enough
for the daemon's scatter kernel to sum it in each block's shared memory (TABLE_BYTES: T5's
relative position bias, 8192 ids a row into 32 rows of 12 heads): the gradient of such a table
is always the fp32 sums and a cast, so that the sums are that kernel (a scatter group) and not
this module's call. Rows at `padding_idx` get no gradient, as ATen's: that row is zeroed after
the adds (only its own tokens reach it), or read from the sums' empty row."""

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
# ...or the fp32 table fits this many bytes: the daemon's scatter template then sums it in
# shared memory, a copy a block (codegen/fm_codegen_scatter.c, SCATTER_TABLE_BYTES), where a
# row's many ids no longer wait on each other.
TABLE_BYTES = 16 << 10


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


def slot_table(indices, num_weights):
    """[num_weights] int64: for each id the position, in indices read flat, of one token with
    it (which one is immaterial: the sums at a slot are the same), T = indices.numel() for an
    id no token has. Each token writes its position at its id: a plain scatter, where a
    scatter by minimum (the first token's) took 11 us of atomics on an H200."""
    idx = indices.reshape(-1).long()
    table = torch.full((num_weights,), idx.numel(), dtype=torch.int64, device=idx.device)
    return table.scatter_(0, idx, torch.arange(idx.numel(), device=idx.device))


def without_id(table, padding_idx, empty):
    """slot_table's table with id padding_idx at slot `empty` (a row no token adds to): the
    padding row's gradient is zero, as ATen's."""
    table = table.clone()
    table[padding_idx] = empty
    return table


def _compact(node):
    """Whether embedding gradient node, which no fusible op reads (the caller's test), is
    summed in a table of the batch's size (above): a 16-bit gradient of a table with more rows
    than the batch has tokens."""
    grad, indices = tensor_val(node.args[0]), tensor_val(node.args[1])
    return grad.dtype in (torch.bfloat16, torch.float16) and indices.numel() < node.args[2]


def _in_table(node):
    """Whether embedding gradient node has more ids a row than MAX_IDS_PER_ROW and an fp32
    table that fits the daemon kernel's shared table (TABLE_BYTES), with ids it reads (int64)."""
    grad, indices = tensor_val(node.args[0]), tensor_val(node.args[1])
    rows, width, ids = node.args[2], grad.shape[-1], indices.numel()
    if not all(isinstance(n, int) for n in (rows, width, ids)) or indices.dtype != torch.int64:
        return False
    return ids > MAX_IDS_PER_ROW * rows and rows * width * 4 <= TABLE_BYTES


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
        and (indices.numel() <= MAX_IDS_PER_ROW * num_weights or indices.numel() <= FEW_IDS or _in_table(node))
    )


def _compact_nodes(gm, mode, node, made):
    """The nodes of a gradient summed in a table of the batch's size (above); returns the last."""
    grad, indices, num_weights, padding_idx = node.args[:4]
    tokens = tensor_val(indices).numel()
    table = fake_meta.call(gm, mode, slot_table, (indices, num_weights), made=made)
    slots = fake_meta.call(gm, mode, aten.index.Tensor, (table, [indices]), made=made)  # indices' shape
    sums = fake_meta.call(gm, mode, embedding_grad_fp32, (grad, slots, tokens + 1, -1, False), made=made)
    if padding_idx >= 0:
        table = fake_meta.call(gm, mode, without_id, (table, padding_idx, tokens), made=made)
    rows = fake_meta.call(gm, mode, aten.index.Tensor, (sums, [table]), made=made)
    return fake_meta.call(gm, mode, aten._to_copy.default, (rows,), {"dtype": node.meta["val"].dtype}, made)


def rewrite_embedding_grads(gm):
    """Each embedding_dense_backward node of gm that can be (above) becomes embedding_grad_fp32
    and a cast to its dtype where a fusible op reads it or its table fits a shared one (the
    cast's value is the old node's), the sums in a table of the batch's size where that is
    smaller (_compact), else one call of embedding_grad. Returns how many were rewritten."""
    if torch.are_deterministic_algorithms_enabled():
        return 0
    mode, found = fake_meta.matches(gm, lambda node: True if _rewritable(node) else None)
    n = 0
    for node, _ in found:
        read = any(ops.fusible(u) for u in node.users) or _in_table(node)
        if not read and not _compact(node):  # a gradient no kernel reads: one call
            node.target = embedding_grad
            n += 1
            continue
        made = []
        try:
            with gm.graph.inserting_before(node):
                if read:
                    sums = fake_meta.call(gm, mode, embedding_grad_fp32, node.args, made=made)
                    cast = fake_meta.call(
                        gm, mode, aten._to_copy.default, (sums,), {"dtype": node.meta["val"].dtype}, made
                    )
                else:
                    cast = _compact_nodes(gm, mode, node, made)
        except Exception as e:  # leave ATen's op
            log.debug("fuseml: %s stays ATen's: %s", node.name, e)
            fake_meta.discard(gm, made)
            continue
        n += fake_meta.substitute(gm, node, cast, made)  # not in another layout than the traced one
    if n:
        graph_code.edited(gm)
        log.debug("fuseml: %d embedding gradient(s) as fp32 scatter-adds", n)
    return n
