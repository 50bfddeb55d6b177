"""Max pooling whose backward needs no int64 indices: a rewrite of the Dynamo graph, before
aot_autograd traces it, that replaces each `torch.nn.functional.max_pool2d` call it can take
with `fuseml::max_pool2d`, which gives each window's maximum and its argmax as a tap index,
and whose gradient is `fuseml::max_pool2d_backward(grad, taps)`.

What aot_autograd makes of max_pool2d is `max_pool2d_with_indices`: the forward writes an
int64 index into the plane per output element and saves it for
`max_pool2d_with_indices_backward`. For ResNet-50's stem (64 x 64 x 112 x 112 bf16 in, a
quarter of that out) that is 103 MB written, saved and read again, and both ATen kernels ran
at a fraction of the bandwidth (0.22 ms forward, 0.46 ms backward on an H200, where the
values alone take 0.04). Written instead, as Inductor does:

    forward:  y = the max of each window, taps = its argmax's tap index i * kw + j (f16)
    backward: dx[p] = the sum of dy[w] over the windows w covering p whose taps[w] names p

three window ops of the fragment IR (vocabulary 7): one kernel for the forward's two outputs
(an inference graph stores y alone), one for the backward, which reads 2 bytes a window and
never x. The argmax follows PyTorch's CUDA kernels: the first tap holding the window's
maximum, a NaN always winning (the last one), padding never. Without fusemld the ops run as
ATen: the forward's indices converted to taps, the backward's back.

Taken: a 3-D or 4-D floating input, integer (not symbolic) window parameters of at most 2049
taps, no return_indices. Anything else is left to torch's own max_pool2d. Graphs without a
CUDA tensor keep theirs (their groups run as ATen: the conversions would cost time for
nothing), unless FUSEML_REQUEST_CPU_GRAPHS asks for them (a testing aid)."""

import operator

import torch
from torch import Tensor

from . import graph_code, settings
from .fake_meta import tensor_val
from ._log import log

aten = torch.ops.aten
_MAX_POOL2D = torch.nn.functional.max_pool2d
_PARAMS = ("input", "kernel_size", "stride", "padding", "dilation", "ceil_mode", "return_indices")
_DEFAULTS = {"stride": None, "padding": 0, "dilation": 1, "ceil_mode": False, "return_indices": False}


# A window's argmax as its tap index i * kw + j: f16 holds every index of a window of up to
# 2049 taps exactly (the daemon refuses a narrower dtype); 2 bytes a window saved for the
# backward where ATen saves an int64 index into the plane
TAPS = torch.float16
MAX_TAPS = 2049


def _grid(t):
    """Each element's (oh, ow) of a pooled tensor t, broadcastable to it."""
    oh = torch.arange(t.shape[-2], device=t.device).view(-1, 1)
    return oh, torch.arange(t.shape[-1], device=t.device)


def _taps_of(indices, width, window):
    """ATen's indices (h * W + w into each plane) as the tap indices of their windows."""
    (_, kw), (sh, sw), (ph, pw), (dh, dw) = window[:4]
    oh, ow = _grid(indices)
    i = (indices // width - (oh * sh - ph)) // dh
    j = (indices % width - (ow * sw - pw)) // dw
    return torch.empty_like(indices, dtype=TAPS).copy_(i * kw + j)


def _indices_of(taps, width, window):
    """The tap indices of windows as ATen's indices into each plane."""
    (_, kw), (sh, sw), (ph, pw), (dh, dw) = window[:4]
    oh, ow = _grid(taps)
    t = taps.long()
    return (oh * sh - ph + t // kw * dh) * width + ow * sw - pw + t % kw * dw


def _pool(
    x: Tensor, kernel_size: list[int], stride: list[int], padding: list[int], dilation: list[int], ceil_mode: bool
) -> tuple[Tensor, Tensor]:
    """torch.nn.functional.max_pool2d(x, ...) with every parameter a pair, and each window's
    argmax as its tap index (TAPS)."""
    window = (kernel_size, stride, padding, dilation, ceil_mode)
    y, indices = aten.max_pool2d_with_indices(x, *window)
    return y, _taps_of(indices, x.shape[-1], window)


def _pool_fake(x, kernel_size, stride, padding, dilation, ceil_mode):
    y = aten.max_pool2d_with_indices(x, kernel_size, stride, padding, dilation, ceil_mode)[0]
    return y, torch.empty_like(y, dtype=TAPS)


def _like_input(grad, size):
    """An empty tensor of the pooled input's size [..., H, W], in grad's memory format (ATen's
    backward takes its layout from it)."""
    shape = list(grad.shape[:-2]) + list(size)
    cl = grad.dim() == 4 and not grad.is_contiguous() and grad.is_contiguous(memory_format=torch.channels_last)
    fmt = torch.channels_last if cl else torch.contiguous_format
    return torch.empty(shape, dtype=grad.dtype, device=grad.device, memory_format=fmt)


def _pool_backward(
    grad: Tensor,
    taps: Tensor,
    size: list[int],
    kernel_size: list[int],
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    ceil_mode: bool,
) -> Tensor:
    """The gradient of max_pool2d(x, ...) for `grad`, from each window's argmax tap index;
    size: x's [H, W]."""
    window = (kernel_size, stride, padding, dilation, ceil_mode)
    x = _like_input(grad, size)  # read for its size and layout only
    return aten.max_pool2d_with_indices_backward(grad, x, *window, _indices_of(taps, size[1], window))


def _pool_backward_fake(grad, taps, size, kernel_size, stride, padding, dilation, ceil_mode):
    return _like_input(grad, size)


max_pool2d = torch.library.custom_op("fuseml::max_pool2d", _pool, mutates_args=())
max_pool2d_backward = torch.library.custom_op("fuseml::max_pool2d_backward", _pool_backward, mutates_args=())
max_pool2d.register_fake(_pool_fake)
max_pool2d_backward.register_fake(_pool_backward_fake)


def _setup(ctx, inputs, output):
    x, *window = inputs
    ctx.save_for_backward(output[1])
    ctx.size = list(x.shape[-2:])
    ctx.window = window


def _backward(ctx, grad, _grad_taps):
    (taps,) = ctx.saved_tensors
    return (torch.ops.fuseml.max_pool2d_backward(grad, taps, ctx.size, *ctx.window),) + (None,) * 5


max_pool2d.register_autograd(_backward, setup_context=_setup)

FORWARD = torch.ops.fuseml.max_pool2d.default
BACKWARD = torch.ops.fuseml.max_pool2d_backward.default


def window_of(node):
    """(kernel, stride, padding, dilation) pairs and ceil_mode of a fuseml::max_pool2d or
    max_pool2d_backward node (its schema's defaults never apply: the rewrite passes all)."""
    args = node.args[1:] if node.target is FORWARD else node.args[3:]
    return [list(a) for a in args[:4]], bool(args[4])


def _pair(v, name):
    v = list(v) if isinstance(v, (list, tuple)) else [v, v]
    if len(v) == 1:
        v = v * 2
    if len(v) != 2 or not all(type(i) is int for i in v):
        raise ValueError(f"{name} {v!r} is not one or two integers")
    return v


def _arguments(node):
    """The call's arguments by name, defaults filled in (None when they do not bind)."""
    if len(node.args) > len(_PARAMS) or set(node.kwargs) - set(_PARAMS):
        return None
    given = dict(_DEFAULTS)
    given.update(zip(_PARAMS, node.args))
    given.update(node.kwargs)
    return given if "input" in given and "kernel_size" in given else None


def _window(given):
    """(the op's window arguments, None) for a call this rewrite takes, else (None, why)."""
    x = tensor_val(given["input"], "example_value")
    if x is None or x.dim() not in (3, 4) or not x.is_floating_point():
        return None, "not a 3-D or 4-D floating tensor"
    if given["return_indices"] is not False or type(given["ceil_mode"]) is not bool:
        return None, "return_indices, or a ceil_mode not known when compiled"
    if x.device.type != "cuda" and not settings.request_cpu_graphs():
        return None, "not on CUDA"
    try:
        kernel = _pair(given["kernel_size"], "kernel_size")
        stride = kernel if given["stride"] in (None, [], ()) else _pair(given["stride"], "stride")
        window = [kernel, stride, _pair(given["padding"], "padding"), _pair(given["dilation"], "dilation")]
    except ValueError as e:
        return None, str(e)
    if kernel[0] * kernel[1] > MAX_TAPS:
        return None, f"a window of {kernel[0] * kernel[1]} taps"
    return window + [given["ceil_mode"]], None


def rewrite(gm):
    """Replaces the max_pool2d calls of Dynamo's graph gm it can take (above), in place;
    returns how many."""
    done = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not _MAX_POOL2D:
            continue
        given = _arguments(node)
        window, why = (None, "arguments that do not bind") if given is None else _window(given)
        if window is None:
            log.debug("fuseml: %s stays torch's max_pool2d: %s", node.name, why)
            continue
        with gm.graph.inserting_before(node):
            pooled = gm.graph.call_function(FORWARD, (given["input"], *window))
            new = gm.graph.call_function(operator.getitem, (pooled, 0))
        new.meta.update(node.meta)
        node.replace_all_uses_with(new)
        gm.graph.erase_node(node)
        done += 1
    if done:
        gm.graph.lint()
        graph_code.edited(gm)
    return done
