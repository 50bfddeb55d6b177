"""A matrix product over an inner dimension of 1 spelled as the multiply it is, so that it
fuses with the pointwise ops around it.

Rotary embeddings (Hugging Face's Llama, Mistral, Mixtral, Qwen) compute their angles as
`inv_freq[None, :, None] @ position_ids[:, None, :]`: a bmm of [B, D/2, 1] by [B, 1, S], in
fp32. Left a GEMM it is a cuBLAS call of its own (a SIMT kernel: fp32 GEMMs are no fragment's),
and the `cat`, `cos` and `sin` after it stay single ATen ops, five host dispatches a step
(~0.2 ms of host on an H200's host; bench/NOTES.md, "A training step's host time") for a few
microseconds of GPU work. As `mul(a, b)` with a broadcast it is one pointwise op, and the
angles, their cat, cos and sin become one fused group.

Exact: with one term per output element, a product over K = 1 is the rounded product of two
elements, which is what the multiply computes (in fp32 for bf16/f16 operands, then rounded,
as the GEMM's epilogue rounds). Only static shapes, operands of one floating dtype."""

import torch

from . import fake_meta, graph_code
from ._log import log
from .fake_meta import tensor_val

aten = torch.ops.aten
FLOATS = (torch.float32, torch.bfloat16, torch.float16)


def _outer(node):
    """The (a, b) operands of a mm/bmm node whose inner dimension is 1, else None."""
    if node.op != "call_function" or node.target not in (aten.mm.default, aten.bmm.default) or node.kwargs:
        return None
    a, b = node.args[:2]
    va, vb, out = tensor_val(a), tensor_val(b), tensor_val(node)
    if va is None or vb is None or out is None:
        return None
    if any(not isinstance(d, int) for t in (va, vb) for d in t.shape):
        return None
    if va.dtype != vb.dtype or va.dtype not in FLOATS or va.shape[-1] != 1:
        return None
    return a, b


def spell_outer_products(gm):
    """Rewrites gm in place (above); returns how many products became multiplies."""
    mode, found = fake_meta.matches(gm, _outer)
    n = 0
    for node, (a, b) in found:
        made = []
        with gm.graph.inserting_before(node):
            mul = fake_meta.call(gm, mode, aten.mul.Tensor, (a, b), made=made)
        n += fake_meta.substitute(gm, node, mul, made)
    if n:
        graph_code.edited(gm)
        log.debug("fuseml: %d product(s) over an inner dimension of 1 as multiplies", n)
    return n
