"""A large head output (a language model's logits) given its gradient by an autograd node of its
own, so that a training step that never differentiates it allocates no zeros for it.

Hugging Face's causal and masked LMs return the logits beside the loss, and a trainer reads
only the loss. The compiled graph is one autograd node (aot_autograd's function) with the loss
and the logits among its outputs, and the autograd engine hands its backward a gradient for
every output: for the logits nobody differentiated, a tensor of zeros the logits' size (Llama's
4096 x 32000 in bf16: 262 MB, held for the whole backward, and a fill kernel). Inductor's steps
pay it too.

A rewrite of the Dynamo graph, before aot_autograd traces it. For a graph output
O = linear(h, W[, b]) much larger than h (RATIO) and large (MIN_BYTES):

    the output becomes detach(O), and h is appended to the graph's outputs;

and the compiled callable is wrapped: it takes the appended h values off its outputs and puts
back in O's place Reattach(O, h, W[, b]), whose backward runs only when a gradient reaches the
logits: dh = g W, dW = g^T h, db = the sum of g. So the loss's gradient flows inside the compiled
backward as before, a gradient through the logits reaches h, W and b through the new node (and
h's into the compiled backward, which adds it to what the loss gives h), and a step that never
differentiates the logits has the engine make zeros for h instead (16 MB for Llama d2048).

An output computed from the linear by elementwise ops of it alone and numbers (Gemma 2's
soft cap, tanh(O / 30) * 30: SOFTCAP_OPS) is taken the same way: Reattach's backward computes
the linear and those ops again from h, W and b (only when a gradient reaches the returned
value) and differentiates them.

Taken in a graph compiled with gradients on, for an output that is the result of a linear whose
input or weight requires grad, returned once, with static sizes and a width that is a multiple
of 8 or read by the graph itself too (its own loss: pad_gemm.py pads the GEMMs of such a head,
and Reattach's are not); the weight and bias are the graph's own inputs (Dynamo lifts a
module's parameters into them). Anything else is left as it was."""

import functools
import operator

import torch

from . import graph_code
from ._log import log
from .fake_meta import tensor_val
from .shapes import is_plain_int

_LINEARS = (torch._C._nn.linear, torch.nn.functional.linear)
RATIO = 4  # the output's last dim against its input's: a head, not a projection
MIN_BYTES = 32 << 20  # an output smaller than this costs its zeros little
# Elementwise ops of one tensor (the others numbers) an output may apply to the linear's value:
# a soft cap's, and a cast; Dynamo spells them as Python operators, torch functions or methods.
SOFTCAP_OPS = {
    operator.truediv,
    operator.mul,
    operator.add,
    operator.sub,
    operator.neg,
    torch.tanh,
    torch.mul,
    torch.div,
    torch.add,
    torch.sub,
    "tanh",
    "mul",
    "div",
    "add",
    "sub",
    "float",
}
_VALUE = object()  # in a recorded step, where the value computed so far goes


class _Reattach(torch.autograd.Function):
    """out (no autograd history) given the history of steps(linear(h, weight, bias)), steps
    the recorded elementwise ops after the linear (none for a plain head)."""

    @staticmethod
    def forward(ctx, out, h, weight, bias, steps):
        ctx.save_for_backward(h, weight, bias)
        ctx.steps = steps
        return out.view_as(out)

    @staticmethod
    def backward(ctx, grad):
        h, weight, bias = ctx.saved_tensors
        need = ctx.needs_input_grad[1:4]
        if ctx.steps:  # the ops after the linear computed again and differentiated
            xs = [x.detach().requires_grad_(n) if x is not None else None for x, n in zip((h, weight, bias), need)]
            with torch.enable_grad():
                out = _replay(torch.nn.functional.linear(*xs), ctx.steps)
                wrt = [x for x, n in zip(xs, need) if x is not None and n]
                got = iter(torch.autograd.grad(out, wrt, grad))
            return (None, *(next(got) if x is not None and n else None for x, n in zip(xs, need)), None)
        g = grad.reshape(-1, grad.shape[-1])
        dh = (g @ weight).view(h.shape) if need[0] else None
        dw = g.t() @ h.reshape(-1, h.shape[-1]) if need[1] else None
        db = g.sum(0) if bias is not None and need[2] else None
        return None, dh, dw, db, None


def _replay(value, steps):
    """value through the recorded steps: (kind, target, args, kwargs), _VALUE in args where the
    value so far goes (kind "call_method": a method of the value)."""
    for kind, target, args, kwargs in steps:
        args = [value if a is _VALUE else a for a in args]
        value = getattr(args[0], target)(*args[1:], **kwargs) if kind == "call_method" else target(*args, **kwargs)
    return value


def _softcap_chain(out):
    """(the linear node, the recorded steps from it to graph output `out`) when `out` is the
    linear's value through SOFTCAP_OPS alone (no steps for the linear itself), else None."""
    steps, node = [], out
    while linear_operands(node) is None:
        if node.op not in ("call_function", "call_method") or node.target not in SOFTCAP_OPS:
            return None
        tensors = [a for a in node.args if isinstance(a, torch.fx.Node)]
        others = [a for a in node.args if not isinstance(a, torch.fx.Node)]
        if len(tensors) != 1 or any(not isinstance(a, (int, float)) for a in others) or node.kwargs:
            return None
        steps.append((node.op, node.target, tuple(_VALUE if a is tensors[0] else a for a in node.args), {}))
        node = tensors[0]
    return node, tuple(reversed(steps))


def linear_operands(node):
    """(h, weight, bias or None) of a Dynamo graph's linear call node, else None."""
    if node.op != "call_function" or node.target not in _LINEARS:
        return None
    args = list(node.args)
    h = args[0] if args else node.kwargs.get("input")
    weight = args[1] if len(args) > 1 else node.kwargs.get("weight")
    bias = args[2] if len(args) > 2 else node.kwargs.get("bias")
    if not all(isinstance(n, torch.fx.Node) for n in (h, weight)) or not isinstance(bias, (torch.fx.Node, type(None))):
        return None
    return h, weight, bias


def _feeds_a_loss(out):
    """Whether the graph computes a loss from `out` itself: a one-element float value it
    returns, reached from `out` through the graph's ops (not an argmax or a metric of the
    logits, beside a loss computed outside)."""
    (output,) = [n for n in out.graph.nodes if n.op == "output"]
    losses = {
        n
        for n in output.all_input_nodes
        if (v := tensor_val(n, "example_value")) is not None and v.numel() == 1 and v.is_floating_point()
    }
    seen, todo = set(), [u for u in out.users if u.op != "output"]
    while todo:
        n = todo.pop()
        if n in losses:
            return True
        if n not in seen:
            seen.add(n)
            todo += [u for u in n.users if u.op != "output"]
    return False


def _why_not(out, linear, positions):
    """None when graph output `out`, the result of `linear` (h, weight, bias), is one this
    rewrite takes; `positions`: the graph inputs by node."""
    h, weight, bias = linear
    vo, vh, vw = (tensor_val(n, "example_value") for n in (out, h, weight))
    if vo is None or vh is None or vw is None:
        return "no example values"
    if not all(is_plain_int(s) for s in (*vo.shape, *vh.shape)):
        return "symbolic sizes"
    if not (vh.requires_grad or vw.requires_grad):
        return "nothing to differentiate"
    if vo.shape[-1] < RATIO * vh.shape[-1] or vo.numel() * vo.element_size() < MIN_BYTES:
        return f"{tuple(vo.shape)} from {tuple(vh.shape)}: not a large head"
    if vo.shape[-1] % 8 and not _feeds_a_loss(out):
        # pad_gemm.py pads such a head's GEMMs, reading the logits' gradient at the padded
        # stride. GPT-2's loss (50257) is a graph of its own behind a graph break: detached,
        # the loss's gradient reached the head through Reattach, whose two GEMMs ran unpadded,
        # 1.75x the step's GPU time (bench/NOTES.md, "The logits' zeros"). A loss the graph
        # computes itself (BERT's, 30522) differentiates the padded GEMMs in the compiled
        # backward, and only a second loss on the returned logits would reach Reattach.
        return f"a vocabulary of {vo.shape[-1]}, not a multiple of 8, that no loss in the graph reads"
    if weight not in positions or (bias is not None and bias not in positions):
        return "a weight that is not a graph input"
    return None


def rewrite(gm):
    """Detaches each large head output of Dynamo's graph gm (above), in place; returns the
    wrapper to put around the compiled callable (None when nothing was taken)."""
    if not isinstance(gm, torch.fx.GraphModule) or not torch.is_grad_enabled():
        return None
    graph = gm.graph
    (output,) = [n for n in graph.nodes if n.op == "output"]
    outs = output.args[0]
    if not isinstance(outs, (tuple, list)):
        return None
    positions = {n: i for i, n in enumerate(n for n in graph.nodes if n.op == "placeholder")}
    heads = []  # (output index, h's extra output index, weight input, bias input or None, steps)
    outs = list(outs)
    extra = []
    for i, out in enumerate(list(outs)):
        chain = _softcap_chain(out) if isinstance(out, torch.fx.Node) else None
        if chain is None or outs.count(out) != 1:
            continue
        linear, steps = linear_operands(chain[0]), chain[1]
        why = _why_not(out, linear, positions)
        if why is not None:
            log.debug("fuseml: output %s keeps its gradient in the graph: %s", out.name, why)
            continue
        h, weight, bias = linear
        with graph.inserting_before(output):
            detached = graph.call_function(torch.detach, (out,))  # a builtin: aot_cache.py keeps it
        detached.meta.update(out.meta)
        outs[i] = detached
        heads.append((i, len(outs) + len(extra), positions[weight], None if bias is None else positions[bias], steps))
        extra.append(h)
    if not heads:
        return None
    output.args = (type(output.args[0])(outs + extra),)
    graph.lint()
    graph_code.edited(gm)
    log.debug("fuseml: %d head output(s) given their gradient outside the compiled graph", len(heads))
    return functools.partial(_wrap, heads=tuple(heads), given=len(outs))


def _wrap(fn, heads, given):
    """fn, compiled from the rewritten graph, returning the graph's outputs as Dynamo expects
    them (`given` of them, each head reattached); Dynamo calls both with the graph's inputs as
    arguments."""

    def call(*args):
        params = [(args[w], None if b is None else args[b]) for _, _, w, b, _ in heads]
        got = fn(*args)
        outs = list(got)
        for (i, j, _, _, steps), (weight, bias) in zip(heads, params):
            outs[i] = _Reattach.apply(outs[i], outs[j], weight, bias, steps)
        outs = outs[:given]
        return tuple(outs) if isinstance(got, tuple) else outs

    # what aot_autograd hangs on its callable (zero_grad, named_parameters, ...), but a
    # `_boxed_call` it copied from the function inside: neither takes a boxed list
    call.__dict__.update({k: v for k, v in getattr(fn, "__dict__", {}).items() if k != "_boxed_call"})
    return call
