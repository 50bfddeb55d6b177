"""Max pooling whose backward needs no indices: a rewrite of the Dynamo graph, before
aot_autograd traces it, that replaces each `torch.nn.functional.max_pool2d` call it can take
with `fuseml::max_pool2d`, an op whose gradient is `fuseml::max_pool2d_backward(grad, x)`.

What aot_autograd makes of max_pool2d is `max_pool2d_with_indices`: the forward writes an
int64 index per output element and saves it for `max_pool2d_with_indices_backward`. For
ResNet-50's stem (64 x 64 x 112 x 112 bf16 in, a quarter of that out) that is 26 MB of
indices written, saved and read again, and both ATen kernels ran at a fraction of the
bandwidth (0.22 ms forward, 0.46 ms backward on an H200, where the values alone take 0.04).
Written instead:

    forward:  y = max over each window of x                      (no indices)
    backward: dx[p] = sum of dy[w] over the windows w whose argmax is p: the first tap of w
              equal to its maximum y[w], found from x and y, which the backward has anyway
              (ResNet saves x for the ReLU's gradient and y for the next convolution's)

both are window ops of the fragment IR (vocabulary 7), one kernel each. The argmax follows
PyTorch's CUDA kernels: the first tap holding the window's maximum, a NaN always winning
(the last one), padding never. Without fusemld the ops run as ATen: the forward as before,
the backward as the forward again (for its indices) and ATen's backward.

Taken: a 3-D or 4-D floating input, integer (not symbolic) window parameters, no
return_indices. Anything else is left to torch's own max_pool2d. Graphs without a CUDA
tensor keep theirs (their groups run as ATen: the backward's second forward would cost time
for nothing), unless FUSEML_REQUEST_CPU_GRAPHS asks for them (a testing aid)."""

import torch
from torch import Tensor

from . import graph_code, settings
from ._log import log

aten = torch.ops.aten
_MAX_POOL2D = torch.nn.functional.max_pool2d
_PARAMS = ("input", "kernel_size", "stride", "padding", "dilation", "ceil_mode", "return_indices")
_DEFAULTS = {"stride": None, "padding": 0, "dilation": 1, "ceil_mode": False, "return_indices": False}


def _pool(
    x: Tensor, kernel_size: list[int], stride: list[int], padding: list[int], dilation: list[int], ceil_mode: bool
) -> Tensor:
    """torch.nn.functional.max_pool2d(x, ...) with every parameter a pair."""
    return aten.max_pool2d_with_indices(x, kernel_size, stride, padding, dilation, ceil_mode)[0]


def _pool_backward(
    grad: Tensor,
    x: Tensor,
    y: Tensor,
    kernel_size: list[int],
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    ceil_mode: bool,
) -> Tensor:
    """The gradient of max_pool2d(x, ...) = y for `grad`. As ATen, the argmax is found by
    pooling x again (a kernel finds it from x and y: the first tap equal to its maximum)."""
    window = (kernel_size, stride, padding, dilation, ceil_mode)
    indices = aten.max_pool2d_with_indices(x, *window)[1]
    return aten.max_pool2d_with_indices_backward(grad, x, *window, indices)


max_pool2d = torch.library.custom_op("fuseml::max_pool2d", _pool, mutates_args=())
max_pool2d_backward = torch.library.custom_op("fuseml::max_pool2d_backward", _pool_backward, mutates_args=())
# ATen's meta functions give the fake values ATen's strides (channels-last stays so)
max_pool2d.register_fake(_pool)
max_pool2d_backward.register_fake(_pool_backward)


def _setup(ctx, inputs, output):
    x, *window = inputs
    ctx.save_for_backward(x, output)
    ctx.window = window


def _backward(ctx, grad):
    x, y = ctx.saved_tensors
    return (torch.ops.fuseml.max_pool2d_backward(grad, x, y, *ctx.window),) + (None,) * 5


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


def _example(node):
    val = node.meta.get("example_value") if isinstance(node, torch.fx.Node) else None
    return val if isinstance(val, torch.Tensor) else None


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
    x = _example(given["input"])
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
            new = gm.graph.call_function(FORWARD, (given["input"], *window))
        new.meta.update(node.meta)
        node.replace_all_uses_with(new)
        gm.graph.erase_node(node)
        done += 1
    if done:
        gm.graph.lint()
        graph_code.edited(gm)
    return done
