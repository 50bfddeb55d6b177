"""A language model's head and its loss in one function whose backward walks the vocabulary in
column blocks, so that the logits' gradient is never held whole: a rewrite of the Dynamo graph,
before aot_autograd traces it, of

    logits = linear(h, W)                       h [..., D], W [V, D], no bias
    loss = cross_entropy(logits.float().view(-1, V), target, ...)   (cross_entropy.py's forms)

What the loss alone (cross_entropy.py) makes of it: the backward writes the logits' gradient dx
[N, V] whole (bf16: 262 MB for Llama's 32000 words over 4096 tokens), then two GEMMs read it,
dh = dx W and dW = dx^T h. Here, for each block c of columns,

    dx_c = (exp(x_c - lse) - onehot_c) * w + tangent_c    (tangent: the logits' own gradient)
    dh  += dx_c W_c   (in fp32, rounded once at the end)     dW_c = dx_c^T h

so the backward holds one block of dx (2^25 values or so, 64 MB in bf16) where it held V
columns. dW's blocks
are its rows in order, joined once. The forward still writes the logits whole: a Hugging Face
decoder returns them beside the loss.

Whether and how is a setting (FUSEML_LOGITS, or FuseMLCompiler's logits): "whole" (the
default) leaves the head to cross_entropy.py; "blocks" keeps the logits for the backward, as
the loss alone does, and walks them; "recompute" keeps only h and W and computes each block
again in the backward (x_c = h W_c^T, one GEMM over the vocabulary more) so that no [N, V]
value is held from the forward to the backward at all. Neither is the default: on an H200
(bench/NOTES.md, "A language model's head in vocabulary blocks" and "The logits' zeros")
"blocks" took a decoder's training step's peak 0-9% lower for 0-3% more GPU time, "recompute"
9-27% lower for 5-9% more.

Taken: a call that cross_entropy.py takes, whose input is, through an upcast and a flattening
view, the output of a bias-free linear of a 2-D weight, static sizes, a vocabulary that is a
multiple of 8 (every block's rows then start 16-byte aligned for the GEMMs) and long enough for
two blocks. Anything else is left to cross_entropy.py."""

import operator

import torch

from . import cross_entropy, graph_code, head_output, settings
from ._log import log
from .fake_meta import tensor_val
from .shapes import is_plain_int

BLOCK_VALUES = 1 << 25  # values of one block of the logits' gradient (64 MB in bf16)
MIN_BLOCK = 256  # columns: narrower blocks make GEMMs too thin to run at speed
ALIGN = 8  # columns: a block's start a multiple of 16 bytes in bf16


def block_columns(rows, classes):
    """Columns of one block for logits [rows, classes]: about BLOCK_VALUES values, at least
    MIN_BLOCK, a multiple of ALIGN, and where one is near, a divisor of classes (equal blocks:
    one GEMM shape each)."""
    cols = max(MIN_BLOCK, BLOCK_VALUES // max(rows, 1)) // ALIGN * ALIGN
    if cols >= classes:
        return classes
    for c in range(cols, cols // 2, -ALIGN):
        if classes % c == 0:
            return c
    return cols


class _LinearCrossEntropy(torch.autograd.Function):
    """(logits, loss) of linear(h, weight) and cross_entropy(logits.float().view(-1, V),
    target); the backward in blocks of `block` columns."""

    @staticmethod
    def forward(ctx, h, weight, target, ignore_index, reduction, out_dtype, block, keep_logits):
        logits = torch.nn.functional.linear(h, weight)
        x = logits.view(-1, weight.shape[0])
        loss, lse, t, valid, count = cross_entropy.row_loss(x, target, ignore_index, reduction)
        ctx.save_for_backward(h, weight, lse, t, valid, count, x if keep_logits else None)
        ctx.reduction, ctx.block = reduction, block
        # the logits' gradient stays None when none reaches them (head_output.py detaches a
        # returned head): no zeros of their size are made, and none is added to the blocks
        ctx.set_materialize_grads(False)
        return logits, loss.to(out_dtype)

    @staticmethod
    def backward(ctx, grad_logits, grad_loss):
        h, weight, lse, t, valid, count, x = ctx.saved_tensors
        if grad_loss is None:  # only the logits were differentiated
            grad_loss = torch.zeros((), device=h.device)
        need_h, need_w = ctx.needs_input_grad[:2]
        hr = h.reshape(-1, h.shape[-1])
        classes = weight.shape[0]
        w = cross_entropy.row_weights(grad_loss, valid, count, ctx.reduction)
        tangent = None if grad_logits is None else grad_logits.reshape(-1, classes)
        dh, dw = None, []
        for first in range(0, classes, ctx.block):
            last = min(first + ctx.block, classes)
            wc = weight[first:last]
            xc = x[:, first:last] if x is not None else torch.mm(hr, wc.t())
            dx = cross_entropy.logit_grad(xc, lse, t, w, first)
            if tangent is not None:
                dx = dx + tangent[:, first:last].float()
            dx = dx.to(h.dtype)
            if need_h:
                # the block's product first: the sum joins its GEMM's epilogue (the
                # partitioner fuses into the first operand's group), so each block adds to
                # the running sum as it ends and no block's product waits for the last
                part = torch.mm(dx, wc).float()
                dh = part if dh is None else part + dh
            if need_w:
                dw.append(torch.mm(dx.t(), hr))
        dh = dh.to(h.dtype).view(h.shape) if need_h else None
        dw = torch.cat(dw) if need_w else None
        return dh, dw, None, None, None, None, None, None


def fused_linear_cross_entropy(
    h, weight, target, ignore_index=-100, reduction="mean", out_dtype=None, block=None, keep_logits=True
):
    """(linear(h, weight), cross_entropy(that.float().view(-1, V), target, ...)) as above; the
    loss in out_dtype (default h's dtype); block: the backward's columns (default
    block_columns)."""
    if block is not None and (not isinstance(block, int) or block < 1):
        raise ValueError(f"fused_linear_cross_entropy: block must be a positive number of columns, not {block!r}")
    rows = h.numel() // h.shape[-1]
    block = block or block_columns(rows, weight.shape[0])
    out_dtype = out_dtype or h.dtype
    return _LinearCrossEntropy.apply(h, weight, target, ignore_index, reduction, out_dtype, block, keep_logits)


def _linear_of(node):
    """(h, weight) when node is a bias-free linear with a 2-D weight, else None."""
    operands = head_output.linear_operands(node)
    if operands is None or operands[2] is not None:
        return None
    wv = tensor_val(operands[1], "example_value")
    return operands[:2] if wv is not None and wv.dim() == 2 else None


def _read_after(low, up, at):
    """Whether every reader of the head's output low but its upcast up comes after the loss
    `at` (the fused call, placed at the loss, must come before what it feeds)."""
    order = {n: i for i, n in enumerate(low.graph.nodes)}
    return all(order[u] > order[at] for u in low.users if u is not up)


def _why_not(linear, view):
    """None when the head `linear` (h, weight) flattened by `view` is one this rewrite takes."""
    h, weight = (tensor_val(n, "example_value") for n in linear)
    if h is None or not all(is_plain_int(s) for s in (*h.shape, *weight.shape)):
        return "symbolic or unknown sizes"
    classes = weight.shape[0]
    if h.dtype not in (torch.bfloat16, torch.float16) or weight.dtype != h.dtype:
        return f"{h.dtype} x {weight.dtype}: a bf16/f16 head is taken"
    if classes % ALIGN:
        return f"a vocabulary of {classes}, not a multiple of {ALIGN}"
    flat = tensor_val(view, "example_value")
    if flat is None or tuple(flat.shape) != (h.numel() // h.shape[-1], classes):
        return "a view that does not flatten the head's rows"
    if block_columns(flat.shape[0], classes) >= classes:
        return "one block holds every column"
    return None


def rewrite(gm, mode=None):
    """Replaces in Dynamo's graph gm, in place, each cross_entropy call on a language model's
    head that this rewrite takes (above); returns how many. mode: "whole" (nothing replaced),
    "blocks" or "recompute" (default FUSEML_LOGITS)."""
    mode = mode or settings.logits()
    if mode == "whole":
        return 0
    keep = mode == "blocks"
    done = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not cross_entropy.CROSS_ENTROPY:
            continue
        given = cross_entropy.arguments(node)
        if given is None or cross_entropy.why_not(given) is not None:
            continue  # cross_entropy.py says why
        low, view = cross_entropy.source(given["input"])
        linear = _linear_of(low) if view is not None else None
        if linear is None:
            continue
        why = _why_not(linear, view)
        if why is None and not _read_after(low, view.args[0], node):
            why = "the logits are read before the loss"
        if why is not None:
            log.debug("fuseml: %s's head stays unfused: %s", node.name, why)
            continue
        h, weight = linear
        flat = tensor_val(view, "example_value")
        block = block_columns(flat.shape[0], flat.shape[1])
        with gm.graph.inserting_before(node):
            fused = gm.graph.call_function(
                fused_linear_cross_entropy,
                (h, weight, given["target"]),
                {
                    "ignore_index": given["ignore_index"],
                    "reduction": given["reduction"],
                    "out_dtype": flat.dtype,
                    "block": block,
                    "keep_logits": keep,
                },
            )
            logits = gm.graph.call_function(operator.getitem, (fused, 0))
            loss = gm.graph.call_function(operator.getitem, (fused, 1))
        logits.meta.update(low.meta)
        cross_entropy.replace_loss(gm, node, loss, view)
        low.replace_all_uses_with(logits)
        gm.graph.erase_node(low)
        done += 1
    if done:
        gm.graph.lint()
        graph_code.edited(gm)
    return done
