"""Convolution weights converted to channels-last once, not at every call of an inference graph.

A convolution that runs channels-last (channels_last.py) on an NCHW weight with a kernel
larger than 1x1 (a 1x1 kernel's NCHW and NHWC layouts are the same memory) has cuDNN convert
the weight at every call: in ResNet-50's inference on an H200, 17 ATen copies a call beside
the image's (bench/NOTES.md, "The graph modes' training rows"), where Inductor converts none.
In an inference graph whose weights are its inputs (the module's parameters), the converted
copy is kept beside the parameter and used again while the parameter is unchanged:

    keep_weight_layouts(gm) -> int       # pass: convolutions whose weight now goes through
    channels_last_weight(w) -> Tensor    # w channels-last: the kept copy, or a new one

The copy is kept per parameter object (weakly: it goes when the parameter goes) with what it
was made from: the storage's address, the shape, strides and dtype, and the version counter
that every in-place write (an optimizer step, `copy_` under no_grad) moves. Any difference
makes a new copy, so a model evaluated between training steps reads its current weights.
Inside a CUDA-graph capture the copy is always made, as part of the recording: a replay runs
no Python, and must read the weight as it is when replayed. Costs the memory of one copy of
each such weight (ResNet-50: its 3x3 and 7x7 kernels, ~11 M parameters)."""

import torch
from torch.utils.weak import WeakIdKeyDictionary

from . import fake_meta, graph_code
from ._log import log
from .fake_meta import tensor_val

aten = torch.ops.aten
CL = torch.channels_last

# parameter -> (what it was, its channels-last copy); keyed by identity (a tensor's == is
# elementwise), weakly: the copy goes with its parameter
_kept = WeakIdKeyDictionary()


def channels_last_weight(w):
    """w as a channels-last tensor: the copy kept for w while w is unchanged (above)."""
    if torch._subclasses.fake_tensor.is_fake(w) or w.requires_grad and torch.is_grad_enabled():
        return w.contiguous(memory_format=CL)
    if w.is_cuda and torch.cuda.is_current_stream_capturing():
        return w.contiguous(memory_format=CL)
    try:
        was = (w.data_ptr(), tuple(w.shape), w.stride(), w.dtype, w._version)
    except RuntimeError:  # an inference tensor has no version counter: nothing tells a change
        return w.contiguous(memory_format=CL)
    kept = _kept.get(w)
    if kept is not None and kept[0] == was:
        return kept[1]
    copy = w.contiguous(memory_format=CL)
    _kept[w] = (was, copy)
    return copy


def keep_weight_layouts(gm):
    """Each convolution of an inference graph whose input is channels-last and whose weight
    is a graph input with a kernel larger than 1x1 reads the weight through
    channels_last_weight. Returns how many."""
    fake = fake_meta.mode_of(gm)
    n = 0
    for conv in list(gm.graph.nodes):
        if conv.op != "call_function" or conv.target is not aten.convolution.default:
            continue
        x, w = conv.args[0], conv.args[1]
        xv, wv = tensor_val(x), tensor_val(w)
        if fake is None or xv is None or wv is None or w.op != "placeholder" or wv.dim() != 4:
            continue
        if not xv.is_contiguous(memory_format=CL) or wv.is_contiguous(memory_format=CL):
            continue
        with gm.graph.inserting_before(conv):
            cl = gm.graph.call_function(channels_last_weight, (w,))
        cl.meta["val"] = fake_meta.run(fake, aten.clone.default, (wv,), {"memory_format": CL})
        conv.args = (x, cl) + tuple(conv.args[2:])
        n += 1
    if n:
        graph_code.edited(gm)
        log.debug("fuseml: %d convolution weight(s) kept channels-last across calls", n)
    return n
