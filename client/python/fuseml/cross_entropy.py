"""Cross-entropy without the fp32 log-probabilities: a rewrite of the Dynamo graph, before
aot_autograd traces it, that replaces each `torch.nn.functional.cross_entropy` call it can take
with one whose forward keeps two numbers per row and whose backward is one pointwise pass.

What aot_autograd makes of `cross_entropy(x, target)` is `log_softmax` then `nll_loss`: the
forward writes the log-probabilities [N, C] in fp32 and saves them for the backward, whose
`nll_loss_backward` scatters into a zeroed fp32 [N, C] tensor that `_log_softmax_backward_data`
reads next to them. For GPT-2's vocabulary over 4096 tokens that is 0.82 GB saved and about
3 GB moved per step that Inductor does not move (it saves the logits and two per-row numbers).
Written instead, per row i, with t_i its target and w_i its weight in the loss:

    forward:  lse_i = log(sum_j exp(x_ij))  (as max + log-sum-exp of the shifted row)
              picked_i = sum_j where(j == t_i, x_ij, 0)
              loss_i = lse_i - picked_i  (0 where t_i == ignore_index), then reduced
    backward: dx_ij = (exp(x_ij - lse_i) - [j == t_i]) * w_i

the forward is one rows kernel (two row reductions of one row) that writes [N, 1] values, and
the backward one pointwise kernel that reads the logits once and writes their gradient once.
The column index j is a [C] fp32 vector (torch.arange) and t_i an fp32 copy of the target:
exact below 2^24, where every class index is (a row holds at most 2^20 elements), and an
ignored or out-of-range target never equals a column. A target out of range fails a device-side
assert, as torch's CUDA kernel does.

An upcast before the call (`logits.float().view(-1, V)`, Hugging Face's loss) is looked
through: the function takes the bf16 logits and computes in fp32, so the fp32 copy is neither
written nor saved; the gradient it returns is the downcast autograd would have made.

Taken: a 2-D input [N, C] of a floating dtype, an int64 target [N], no class weights, no label
smoothing, reduction "mean", "sum" or "none", no deprecated size_average/reduce. Anything else
is left to torch's own cross_entropy (and so to the partitioner as before)."""

import inspect

import torch

from . import graph_code
from .fake_meta import tensor_val
from ._log import log

CROSS_ENTROPY = torch.nn.functional.cross_entropy
_REDUCTIONS = ("mean", "sum", "none")
_UPCASTS = ("float",)  # call_method names that cast to fp32
_VIEWS = ("view", "reshape")
_SIGNATURE = inspect.signature(CROSS_ENTROPY)


def row_loss(x, target, ignore_index, reduction):
    """cross_entropy(x.float(), target) of a 2-D x [N, C] as above: (loss in fp32, and what
    its gradient reads: lse [N, 1], t [N, 1] the target as fp32 (-1 where ignored), valid [N],
    count the number of valid rows)."""
    classes = x.shape[-1]
    x32 = x.float()
    top = x32.amax(-1, keepdim=True)
    lse = (x32 - top).exp().sum(-1, keepdim=True).log() + top
    valid = target != ignore_index
    torch._assert_async(((target >= 0) & (target < classes) | ~valid).all(), "cross_entropy: target out of bounds")
    t = torch.where(valid, target, -1).to(torch.float32).unsqueeze(-1)
    cols = torch.arange(classes, device=x.device, dtype=torch.float32)
    picked = torch.where(cols == t, x32, 0.0).sum(-1, keepdim=True)
    nll = torch.where(valid, (lse - picked).squeeze(-1), 0.0)
    count = valid.sum().to(torch.float32)
    if reduction == "mean":
        loss = nll.sum() / count
    elif reduction == "sum":
        loss = nll.sum()
    else:
        loss = nll
    return loss, lse, t, valid, count


def row_weights(grad, valid, count, reduction):
    """Each row's weight in the loss [N, 1] (fp32), from the loss's gradient."""
    grad = grad.float()
    if reduction == "mean":
        grad = grad / count
    return torch.where(valid, grad, 0.0).unsqueeze(-1)  # a scalar grad broadcasts


def logit_grad(x, lse, t, w, first=0):
    """The fp32 gradient of the loss for logits x [N, c], the columns first..first+c of the
    rows: (softmax - one-hot of the target) * the row's weight."""
    cols = torch.arange(first, first + x.shape[-1], device=x.device, dtype=torch.float32)
    p = (x.float() - lse).exp()
    return torch.where(cols == t, p - 1.0, p) * w


class _CrossEntropy(torch.autograd.Function):
    """cross_entropy(x.to(fp32), target) from x of any floating dtype; the loss in out_dtype."""

    @staticmethod
    def forward(ctx, x, target, ignore_index, reduction, out_dtype):
        loss, lse, t, valid, count = row_loss(x, target, ignore_index, reduction)
        ctx.save_for_backward(x, lse, t, valid, count)
        ctx.reduction = reduction
        return loss.to(out_dtype)

    @staticmethod
    def backward(ctx, grad):
        x, lse, t, valid, count = ctx.saved_tensors
        w = row_weights(grad, valid, count, ctx.reduction)
        return logit_grad(x, lse, t, w).to(x.dtype), None, None, None, None


def fused_cross_entropy(x, target, ignore_index=-100, reduction="mean", out_dtype=None):
    """torch.nn.functional.cross_entropy(x.float(), target, ignore_index=..., reduction=...)
    for a 2-D x, computed as above; the loss in out_dtype (default x's dtype)."""
    return _CrossEntropy.apply(x, target, ignore_index, reduction, out_dtype or x.dtype)


def arguments(node):
    """The call's arguments by name, defaults filled in (None when they do not bind)."""
    try:
        bound = _SIGNATURE.bind(*node.args, **node.kwargs)
    except TypeError:
        return None
    bound.apply_defaults()
    return bound.arguments


def why_not(given):
    """None when a cross_entropy call with these arguments is one this rewrite takes, else
    why not."""
    x, target = tensor_val(given["input"], "example_value"), tensor_val(given["target"], "example_value")
    if x is None or target is None:
        return "no example values"
    if x.dim() != 2 or not x.dtype.is_floating_point:
        return f"input {tuple(x.shape)} {x.dtype}: a 2-D floating input is taken"
    if target.dim() != 1 or target.dtype != torch.int64:
        return "class-probability or non-int64 targets"
    if any(given[k] is not None for k in ("weight", "size_average", "reduce")):
        return "class weights or deprecated arguments"
    if given["label_smoothing"] != 0.0:
        return "label smoothing"
    if given["reduction"] not in _REDUCTIONS:
        return f"reduction {given['reduction']!r}"
    if not isinstance(given["ignore_index"], int):
        return "a symbolic ignore_index"
    return None


def source(x):
    """(node to take, whether it is the pre-upcast value): through `float()` behind a
    view/reshape when the upcast is read by nothing else."""
    if x.op != "call_method" or x.target not in _VIEWS or len(x.args) < 2:
        return x, None
    up = x.args[0]
    if not (
        isinstance(up, torch.fx.Node)
        and up.op == "call_method"
        and up.target in _UPCASTS
        and len(up.users) == 1
        and len(up.args) == 1
        and not up.kwargs
    ):
        return x, None
    low = tensor_val(up.args[0], "example_value")
    if low is None or low.dtype not in (torch.float16, torch.bfloat16):
        return x, None
    return up.args[0], x


def replace_loss(gm, node, new, view):
    """Puts `new` in the place of the cross_entropy call `node` and erases it, then the
    flattening `view` and the upcast behind it (source()) where nothing else reads them."""
    new.meta.update(node.meta)
    node.replace_all_uses_with(new)
    gm.graph.erase_node(node)
    if view is not None and not view.users:
        up = view.args[0]
        gm.graph.erase_node(view)
        if not up.users:
            gm.graph.erase_node(up)


def rewrite(gm):
    """Replaces the cross_entropy calls of Dynamo's graph gm it can take (above), in place;
    returns how many."""
    done = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not CROSS_ENTROPY:
            continue
        given = arguments(node)
        why = "arguments that do not bind" if given is None else why_not(given)
        if why is not None:
            log.debug("fuseml: %s stays torch's cross_entropy: %s", node.name, why)
            continue
        x, target = given["input"], given["target"]
        ignore_index, reduction = given["ignore_index"], given["reduction"]
        out_dtype = tensor_val(x, "example_value").dtype
        low, view = source(x)
        with gm.graph.inserting_before(node):
            if view is not None:
                x = gm.graph.call_method("reshape", (low,) + tuple(view.args[1:]))
            new = gm.graph.call_function(
                fused_cross_entropy,
                (x, target),
                {"ignore_index": ignore_index, "reduction": reduction, "out_dtype": out_dtype},
            )
        replace_loss(gm, node, new, view)
        done += 1
    if done:
        gm.graph.lint()
        graph_code.edited(gm)
    return done
