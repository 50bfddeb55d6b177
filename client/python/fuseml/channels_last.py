"""A graph rewrite before partitioning: 2-D convolutions run on channels-last values (what
Inductor's layout optimisation does; this is our own code). cuDNN's bf16/f16 convolutions
are NHWC kernels: handed NCHW values, it converts every input and output (a ResNet-50
training step spent 3.3 ms of an H200's time on those conversions), and ATen's NCHW batch
norm kernels are slower than its channels-last ones (bench/NOTES.md, "Whole models, first
run").

The first convolution's input is copied to channels-last once; every convolution, batch
norm, pooling and pointwise op after it keeps that layout (ATen's and the fake tensors'
rule: an op's output follows its input's memory format), so the copies stop there. The
values of the graph are recomputed on fake tensors after the change, since fragments bake
in their inputs' strides.

What leaves the graph keeps the layout it was traced with, unless the caller says an output
slot may not (`keeps_layout(position)`): a training forward's values saved for the
backward, whose strides are reported so that the backward is compiled for them (as the
padded GEMMs' logits are, pad_gemm.py). A saved value that a convolution's copy was made
from is saved as the copy: the same values, channels-last, so that the backward's
convolution reads its input in the layout of its gradient (a ResNet-50 step saved the image
as it came and its first convolution's backward converted the gradient and the image
between layouts: 0.57 ms of an H200's 11.4). Any other slot (the user's output, a gradient) is
copied back to its traced contiguous layout; a slot traced in another layout leaves the
graph as it was.

Which convolutions (mode "auto", FUSEML_CHANNELS_LAST): 2-D, bf16/f16, on CUDA, where the
NHWC kernels are; "on" converts any 2-D convolution (on the CPU too: a testing aid), "off"
none."""

import torch

from . import fake_meta, graph_code
from ._log import log
from .fake_meta import tensor_val

aten = torch.ops.aten
CL = torch.channels_last
DTYPES = (torch.bfloat16, torch.float16)


def _is_cl(t):
    return t.dim() == 4 and t.is_contiguous(memory_format=CL)


def _converts(node, mode):
    """Is node a convolution this rewrite gives a channels-last input?"""
    if node.op != "call_function" or node.target is not aten.convolution.default:
        return False
    x, y = tensor_val(node.args[0]), tensor_val(node)
    if x is None or y is None or x.dim() != 4 or node.args[6]:  # args[6]: transposed
        return False
    return mode == "on" or (x.dtype in DTYPES and x.device.type == "cuda")


def _output_slots(gm):
    output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    args = output.args[0]
    return output, list(args) if isinstance(args, (list, tuple)) else [args]


def convert(gm, mode, keeps_layout=lambda position: False):
    """Rewrites gm in place (mode "auto", "on" or "off"); returns the output positions left
    in the new layout (their strides differ from the traced ones), or None when nothing
    changed."""
    if mode == "off":
        return None
    convs = [n for n in gm.graph.nodes if _converts(n, mode)]
    fake = fake_meta.mode_of(gm) if convs else None
    if fake is None:
        return None
    before = {n: n.meta.get("val") for n in gm.graph.nodes}
    output, values = _output_slots(gm)
    traced_output_args = output.args
    copies, copy_of = [], {}
    for conv in convs:
        with gm.graph.inserting_before(conv):
            c = gm.graph.call_function(aten.clone.default, (conv.args[0],), {"memory_format": CL})
        copy_of.setdefault(conv.args[0], c)
        conv.args = (c,) + tuple(conv.args[1:])
        copies.append(c)
    _save_copies(gm, output, values, copy_of, keeps_layout, before)
    phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    try:
        from torch.fx.passes.fake_tensor_prop import FakeTensorProp

        FakeTensorProp(gm, fake).propagate_dont_convert_inputs(*[before[p] for p in phs])
        kept = _restore_outputs(gm, fake, before, keeps_layout)
    except Exception as e:  # an op that cannot take the layout: the graph as it was
        log.debug("fuseml: convolutions left in their layout: %s: %s", type(e).__name__, e)
        output.args = traced_output_args
        _undo(gm, copies, before)
        return None
    for c in copies:  # a copy of a value already channels-last (made so by an earlier one)
        if _is_cl(tensor_val(c.args[0])):
            c.replace_all_uses_with(c.args[0])
            gm.graph.erase_node(c)
    gm.graph.lint()
    graph_code.edited(gm)
    log.debug("fuseml: %d convolutions run channels-last; output slots kept so: %s", len(convs), kept)
    return kept


def _save_copies(gm, output, values, copy_of, keeps_layout, before):
    """A slot that may leave in another layout and holds a value some convolution's copy was
    made from holds the copy instead (the copy is made anyway; the first, where several
    convolutions read the value). The copy's traced value is the slot's, for
    _restore_outputs."""
    swapped = [
        copy_of[v] if isinstance(v, torch.fx.Node) and v in copy_of and keeps_layout(i) else v
        for i, v in enumerate(values)
    ]
    changed = [(a, b) for a, b in zip(swapped, values) if a is not b]
    for a, b in changed:
        before[a] = before[b]
    if changed:
        args = output.args[0]
        output.args = (type(args)(swapped) if isinstance(args, (list, tuple)) else swapped[0],)


def _restore_outputs(gm, fake, before, keeps_layout):
    """Copies each output slot whose layout changed back to its traced one, unless
    keeps_layout(slot); returns the slots kept. Raises when a changed slot was traced in a
    layout a contiguous copy would not give back."""
    output, values = _output_slots(gm)
    kept, copies = [], {}
    for i, v in enumerate(values):
        old, new = before.get(v) if isinstance(v, torch.fx.Node) else None, tensor_val(v)
        if not isinstance(old, torch.Tensor) or new is None or fake_meta.same_layout(old, new):
            continue
        if keeps_layout(i):
            kept.append(i)
            continue
        if not old.is_contiguous():
            raise ValueError(f"output {i} was traced neither contiguous nor as it is now")
        if v not in copies:
            with gm.graph.inserting_before(output):
                c = gm.graph.call_function(aten.clone.default, (v,), {"memory_format": torch.contiguous_format})
            c.meta["val"] = fake_meta.run(fake, aten.clone.default, (new,), {"memory_format": torch.contiguous_format})
            copies[v] = c
    if copies:
        output.args = torch.fx.node.map_arg(output.args, lambda y: copies.get(y, y))
    return kept


def _undo(gm, copies, before):
    for c in copies:
        c.replace_all_uses_with(c.args[0])
        gm.graph.erase_node(c)
    for n in gm.graph.nodes:
        if n in before:
            n.meta["val"] = before[n]
