"""The map from ATen ops to the fragment vocabulary (protocol/PROTOCOL.md, vocab 1), and the
kinds of the ops that later kernel templates will take (GEMMs, reductions).

Each pointwise entry is a function emit(e, node) that spells the node with the emitter's
primitives (fragment.Emitter): e.arg(x) for a tensor or scalar operand, e.op(name, *ids),
e.const(v), e.cast(id, dtype)."""

import torch

from . import max_pool
from .shapes import is_finite_plain_real, is_plain_int, is_plain_real, known_true, plain_equal, same_plain_shape

aten = torch.ops.aten
prims = torch.ops.prims

DTYPES = {torch.bool: "bool", torch.float16: "f16", torch.bfloat16: "bf16", torch.float32: "f32"}
INT_CONST_MAX = 1 << 24  # FM_MAX_INT_CONST: an integer scalar meeting an int64 tensor, exact in f32


def dtype_name(dtype):
    """The wire's name of a tensor dtype: DTYPES', and i64 for an index (take_rows', vocabulary
    9) or an integer value (vocabulary 10)."""
    return "i64" if dtype == torch.int64 else DTYPES[dtype]


GEMM_OPS = {aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default}
REDUCTION_OPS = {
    aten.sum.dim_IntList,
    aten.sum.default,
    aten.mean.dim,
    aten.mean.default,
    aten.amax.default,
    aten.var.correction,
    aten._softmax.default,
    aten._log_softmax.default,
    aten.native_layer_norm.default,
    aten._softmax_backward_data.default,
    aten.native_layer_norm_backward.default,
}
# Metadata-only ops: they never join a group (a group's inputs are whatever tensors reach it,
# with the strides these views gave them), so they run as ATen at no cost.
VIEW_OPS = {
    aten.view.default,
    aten._unsafe_view.default,
    aten.expand.default,
    aten.unsqueeze.default,
    aten.squeeze.dim,
    aten.squeeze.default,
    aten.permute.default,
    aten.t.default,
    aten.transpose.int,
    aten.slice.Tensor,
    aten.detach.default,
    aten.alias.default,
}


def _unary(name):
    return lambda e, n: e.op(name, e.arg(n.args[0]))


def _binary(name):
    return lambda e, n: e.op(name, e.arg(n.args[0]), e.arg(n.args[1]))


def _add_like(name):
    def emit(e, n):
        b = e.arg(n.args[1])
        alpha = n.kwargs.get("alpha", 1)
        if alpha != 1:
            b = e.op("mul", b, e.const(alpha))
        return e.op(name, e.arg(n.args[0]), b)

    return emit


def _rsub(e, n):
    b = e.arg(n.args[0])
    alpha = n.kwargs.get("alpha", 1)
    if alpha != 1:
        b = e.op("mul", b, e.const(alpha))
    return e.op("sub", e.arg(n.args[1]), b)


def _gelu(e, n):
    approx = n.kwargs.get("approximate", n.args[1] if len(n.args) > 1 else "none")
    return e.op("gelu_tanh" if approx == "tanh" else "gelu", e.arg(n.args[0]))


def _cast(e, n):
    return e.cast(e.arg(n.args[0]), dtype_name(n.meta["val"].dtype))


def _threshold_backward(e, n):
    # threshold_backward(grad, x, t) = where(x <= t, 0, grad): relu's backward.
    grad, x, t = n.args
    return e.op("where", e.op("le", e.arg(x), e.const(t)), e.const(0.0), e.arg(grad))


def _sigmoid_backward(e, n):
    # sigmoid_backward(grad, y) = grad * y * (1 - y), y the forward's output.
    g, y = e.arg(n.args[0]), e.arg(n.args[1])
    return e.op("mul", e.op("mul", g, y), e.op("sub", e.const(1.0), y))


def _tanh_backward(e, n):
    # tanh_backward(grad, y) = grad * (1 - y * y).
    g, y = e.arg(n.args[0]), e.arg(n.args[1])
    return e.op("mul", g, e.op("sub", e.const(1.0), e.op("mul", y, y)))


def _silu_backward(e, n):
    # silu_backward(grad, x) = grad * s * (1 + x * (1 - s)), s = sigmoid(x).
    g, x = e.arg(n.args[0]), e.arg(n.args[1])
    s = e.op("sigmoid", x)
    t = e.op("add", e.const(1.0), e.op("mul", x, e.op("sub", e.const(1.0), s)))
    return e.op("mul", e.op("mul", g, s), t)


def _gelu_backward(e, n):
    # d/dx gelu: exact Phi(x) + x * phi(x); tanh form: the derivative of 0.5 x (1 + tanh(u)),
    # u = sqrt(2/pi) (x + 0.044715 x^3). Spelled here so an unfused group stays one ATen op.
    g, x = e.arg(n.args[0]), e.arg(n.args[1])
    approx = n.kwargs.get("approximate", n.args[2] if len(n.args) > 2 else "none")
    c = e.const
    if approx == "tanh":
        k = 0.7978845608028654
        x2 = e.op("mul", x, x)
        u = e.op("mul", c(k), e.op("add", x, e.op("mul", c(0.044715), e.op("mul", x2, x))))
        t = e.op("tanh", u)
        left = e.op("mul", c(0.5), e.op("add", c(1.0), t))
        du = e.op("mul", c(k), e.op("add", c(1.0), e.op("mul", c(3 * 0.044715), x2)))
        right = e.op("mul", e.op("mul", e.op("mul", c(0.5), x), e.op("sub", c(1.0), e.op("mul", t, t))), du)
        return e.op("mul", g, e.op("add", left, right))
    cdf = e.op("mul", c(0.5), e.op("add", c(1.0), e.op("erf", e.op("mul", x, c(0.7071067811865476)))))
    pdf = e.op("mul", c(0.3989422804014327), e.op("exp", e.op("mul", c(-0.5), e.op("mul", x, x))))
    return e.op("mul", g, e.op("add", cdf, e.op("mul", x, pdf)))


def _dropout_backward(e, n):
    # native_dropout_backward(grad, mask, scale) = grad * mask * scale, mask the forward's kept
    # elements (bool): with dropout on, every residual branch's gradient passes through one
    return e.op("mul", e.op("mul", e.arg(n.args[0]), e.arg(n.args[1])), e.const(n.args[2]))


def _where(e, n):
    return e.op("where", e.arg(n.args[0]), e.arg(n.args[1]), e.arg(n.args[2]))


def _masked_fill(e, n):
    # masked_fill(x, mask, v) = where(mask, v, x): attention's `scores.masked_fill(m, -inf)`
    return e.op("where", e.arg(n.args[1]), e.arg(n.args[2]), e.arg(n.args[0]))


def _is_value(target):
    """isneginf(x) = x == -inf and isposinf(x) = x == inf (NaN compares false, as torch)."""
    return lambda e, n: e.op("eq", e.arg(n.args[0]), e.const(target))


def _isinf(e, n):
    return e.op("eq", e.op("abs", e.arg(n.args[0])), e.const(float("inf")))


def _isfinite(e, n):
    # |x| < inf: false for ±inf and for NaN (a NaN compares false)
    return e.op("lt", e.op("abs", e.arg(n.args[0])), e.const(float("inf")))


def _isnan(e, n):
    x = e.arg(n.args[0])
    return e.op("ne", x, x)


def _truth(e, x):
    """x as torch's truth value: x != 0, NaN true (the protocol's cast to bool)."""
    return e.cast(e.arg(x), "bool")


def _logical_not(e, n):
    return e.op("eq", _truth(e, n.args[0]), e.const(0.0))


def _logical(name):
    # and: a * b, or: max(a, b) over 0/1 (cast back to bool by emit_node); xor: a != b
    return lambda e, n: e.op(name, _truth(e, n.args[0]), _truth(e, n.args[1]))


POINTWISE = {
    aten.add.Tensor: _add_like("add"),
    aten.add.Scalar: _add_like("add"),
    aten.sub.Tensor: _add_like("sub"),
    aten.sub.Scalar: _add_like("sub"),
    aten.rsub.Scalar: _rsub,
    aten.rsub.Tensor: _rsub,
    aten.mul.Tensor: _binary("mul"),
    aten.mul.Scalar: _binary("mul"),
    aten.div.Tensor: _binary("div"),
    aten.div.Scalar: _binary("div"),
    aten.maximum.default: _binary("maximum"),
    aten.minimum.default: _binary("minimum"),
    aten.pow.Tensor_Scalar: _binary("pow"),
    aten.neg.default: _unary("neg"),
    aten.abs.default: _unary("abs"),
    aten.relu.default: _unary("relu"),
    aten.gelu.default: _gelu,
    aten.silu.default: _unary("silu"),
    aten.sigmoid.default: _unary("sigmoid"),
    aten.tanh.default: _unary("tanh"),
    aten.exp.default: _unary("exp"),
    aten.cos.default: _unary("cos"),
    aten.sin.default: _unary("sin"),
    aten.log.default: _unary("log"),
    aten.sqrt.default: _unary("sqrt"),
    aten.rsqrt.default: _unary("rsqrt"),
    aten.reciprocal.default: lambda e, n: e.op("div", e.const(1.0), e.arg(n.args[0])),
    aten.where.self: _where,
    aten.masked_fill.Scalar: _masked_fill,
    aten._to_copy.default: _cast,
    prims.convert_element_type.default: _cast,
    aten.threshold_backward.default: _threshold_backward,
    aten.sigmoid_backward.default: _sigmoid_backward,
    aten.tanh_backward.default: _tanh_backward,
    aten.silu_backward.default: _silu_backward,
    aten.gelu_backward.default: _gelu_backward,
    aten.native_dropout_backward.default: _dropout_backward,
    aten.erf.default: _unary("erf"),
    aten.masked_fill.Tensor: _masked_fill,  # the value a 0-dim tensor, broadcast
    aten.isneginf.default: _is_value(float("-inf")),
    aten.isposinf.default: _is_value(float("inf")),
    aten.isinf.default: _isinf,
    aten.isfinite.default: _isfinite,
    aten.isnan.default: _isnan,
    aten.logical_not.default: _logical_not,
    aten.logical_and.default: _logical("mul"),
    aten.logical_or.default: _logical("maximum"),
    aten.logical_xor.default: _logical("ne"),
}
# bitwise ops on bool tensors are the logical ones (on integers, which no fragment holds, the
# dtype check of why_not_pointwise keeps them out)
BOOL_ONLY = {
    aten.bitwise_not.default: _logical_not,
    aten.bitwise_and.Tensor: _logical("mul"),
    aten.bitwise_or.Tensor: _logical("maximum"),
    aten.bitwise_xor.Tensor: _logical("ne"),
}
POINTWISE.update(BOOL_ONLY)


def _same_elements(e, n):
    # clone, and an expand to the operand's own shape: the same value, stored with the
    # node's strides when it leaves the group (SDPA's math path: cast, scale, expand, clone)
    return e.arg(n.args[0])


ALIASES = {aten.clone.default: _same_elements, aten.expand.default: _same_elements}
POINTWISE.update(ALIASES)
for _name in ("gt", "ge", "lt", "le", "eq", "ne"):
    POINTWISE[getattr(aten, _name).Tensor] = _binary(_name)
    POINTWISE[getattr(aten, _name).Scalar] = _binary(_name)
POINTWISE[aten.floor_divide.default] = _binary("floor_div")

# Integer values (vocabulary 10): the ops that may read or make an int64 tensor, when every
# tensor operand is int64 or bool and every scalar an integer of at most INT_CONST_MAX (a
# language model's labels: the ignore_index test, the range check, the labels as f32 for the
# loss; a router's token numbers). A float meeting an int64 value is torch's promotion to
# float, which the daemon wants spelled as a cast: such a node stays out.
INTEGER_OPS = {
    aten.add.Tensor,
    aten.add.Scalar,
    aten.sub.Tensor,
    aten.sub.Scalar,
    aten.mul.Tensor,
    aten.mul.Scalar,
    aten.neg.default,
    aten.where.self,
    aten._to_copy.default,
    prims.convert_element_type.default,
    aten.floor_divide.default,
    *ALIASES,
    *(getattr(aten, name).Tensor for name in ("gt", "ge", "lt", "le", "eq", "ne")),
    *(getattr(aten, name).Scalar for name in ("gt", "ge", "lt", "le", "eq", "ne")),
}

# kwargs an entry may carry; anything else (out=, rounding_mode=...) keeps the node out of a
# group; memory_format on a clone or cast only (its output strides are the node's). layout/device
# only on a _to_copy that is a dtype conversion (checked below: strided, same device).
_ALLOWED_KWARGS = {"alpha", "approximate", "dtype", "layout", "device", "memory_format"}

# Row reductions over the last dim (vocabulary 2): ATen op -> fragment op.
ROW_REDUCTIONS = {
    aten.sum.dim_IntList: "sum",
    aten.mean.dim: "mean",
    aten.amax.default: "amax",
    aten.var.correction: "var",
    aten.all.dim: "all",
    aten.any.dim: "any",
    aten.all.dims: "all",
    aten.any.dims: "any",
}
# Truth reductions: of a bool or float operand (its truth value), into bool. Spelled with amax
# (Emitter.reduce): all(b) = amax(b ? 0 : 1) == 0, any(b) = amax(b ? 1 : 0) != 0.
LOGICAL_REDUCTIONS = {"all", "any"}
MAX_ROW = 1 << 20  # FM_MAX_ROW: longer rows than registers hold are streamed (logits)
MAX_ROW_HELD = 32768  # FM_MAX_ROW_HELD: var needs its row held in registers


def why_not_pointwise(node):
    """None when the node can join a pointwise group, else the reason it cannot."""
    if node.op != "call_function" or node.target not in POINTWISE:
        return "not in the pointwise vocabulary"
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        return "no tensor metadata"
    integer = is_integer_node(node)
    if integer:
        why = _why_not_integer(node, val)
        if why:
            return why
    elif val.dtype not in DTYPES:
        return f"dtype {val.dtype} not supported"
    elif node.target is aten.floor_divide.default:
        return "floor_divide of floats"
    if node.target in ALIASES:
        why = _why_not_alias(node, val)
        if why:
            return why
    if node.target in BOOL_ONLY and (
        val.dtype != torch.bool
        or any(
            isinstance(a, torch.fx.Node) and getattr(a.meta.get("val"), "dtype", None) != torch.bool for a in node.args
        )
    ):
        return "bitwise op on integers"
    if set(node.kwargs) - _ALLOWED_KWARGS:
        return f"unsupported arguments {sorted(set(node.kwargs) - _ALLOWED_KWARGS)}"
    if node.target in (aten._to_copy.default,):
        src = node.args[0].meta.get("val") if hasattr(node.args[0], "meta") else None
        if src is None or src.device != val.device or node.kwargs.get("dtype") is None:
            return "_to_copy that is not a dtype conversion"
        if node.kwargs.get("layout", torch.strided) != torch.strided:
            return "_to_copy to another layout"
        # LayerNorm's backward decomposition casts to contiguous fp32: as for a clone, the
        # output is written at the node's own strides
        if node.kwargs.get("memory_format", torch.preserve_format) not in (
            torch.contiguous_format,
            torch.preserve_format,
        ):
            return "_to_copy to another memory format"
    elif set(node.kwargs) & {"layout", "device"}:
        return "unsupported arguments ['device', 'layout']"
    elif "memory_format" in node.kwargs and node.target is not aten.clone.default:
        return "unsupported arguments ['memory_format']"
    args = node.args[:1] if node.target in ALIASES else node.args  # not an expand's sizes
    for a in list(args) + [v for k, v in node.kwargs.items() if k == "alpha"]:
        if isinstance(a, torch.fx.Node):
            t = a.meta.get("val")
            if not isinstance(t, torch.Tensor) or (t.dtype not in DTYPES and not (integer and t.dtype == torch.int64)):
                return "operand of unsupported dtype"
            if t.device != val.device:
                return "operand on another device"
        elif isinstance(a, (str, torch.dtype)):  # prims.convert_element_type(x, dtype)
            continue
        elif isinstance(a, float) and a != a:
            return "NaN constant"
        elif not is_plain_real(a):
            return f"non-static operand {type(a).__name__}"
    return None


def is_integer_node(node):
    """Whether the node reads or makes an int64 tensor (integer values, vocabulary 10)."""
    if node.op != "call_function":
        return False
    tensors = [node.meta.get("val")] + [a.meta.get("val") for a in node.all_input_nodes]
    return any(isinstance(t, torch.Tensor) and t.dtype == torch.int64 for t in tensors)


def _why_not_integer(node, val):
    """None when an integer node spells as the protocol's integer values, else why not."""
    if node.target not in INTEGER_OPS:
        return "integer op outside the integer vocabulary"
    if val.dtype not in DTYPES and val.dtype != torch.int64:
        return f"dtype {val.dtype} not supported"
    ints = (torch.int64, torch.bool)
    source = node.args[0].meta.get("val") if isinstance(node.args[0], torch.fx.Node) else None
    if node.target in (aten._to_copy.default, prims.convert_element_type.default):
        # to any dtype from an int64; to int64 from a bool (a float's truncation is not in the vocabulary)
        if val.dtype == torch.int64 and getattr(source, "dtype", None) not in ints:
            return "cast of a float to int64"
        return None
    if val.dtype not in ints:
        return "integer arithmetic with a float result"
    args = node.args[:1] if node.target in ALIASES else node.args
    for a in list(args) + [v for k, v in node.kwargs.items() if k == "alpha"]:
        if isinstance(a, torch.fx.Node):
            if getattr(a.meta.get("val"), "dtype", None) not in ints:
                return "an int64 value meeting a float (torch's promotion: a cast first)"
        elif isinstance(a, float) or not is_plain_int(a) or abs(int(a)) > INT_CONST_MAX:
            return "an int64 value meeting a float or a large scalar"
    if node.target is aten.floor_divide.default and (isinstance(node.args[1], torch.fx.Node) or node.args[1] == 0):
        return "floor_divide by a tensor or by zero"
    return None


def _why_not_alias(node, val):
    """None when a clone or expand node can join a group as the value it copies or views."""
    src = node.args[0].meta.get("val") if isinstance(node.args[0], torch.fx.Node) else None
    if not isinstance(src, torch.Tensor) or not same_plain_shape(src.shape, val.shape):
        return "expand that broadcasts"
    if node.target is aten.clone.default:
        if node.kwargs.get("memory_format", torch.preserve_format) not in (
            torch.contiguous_format,
            torch.preserve_format,
        ):
            return "clone to another memory format"
        return None
    # An expand to its own shape is a view: worth joining only where the ops reading it join
    # too (else the group would store a second copy of its operand), and only where its
    # strides describe a dense tensor a kernel can write.
    if node.kwargs or not all(
        u.op == "call_function" and u.target in POINTWISE and u.target is not aten.expand.default for u in node.users
    ):
        return "expand read by ops outside the pointwise vocabulary"
    if not _dense(val):
        return "expand of an overlapping or sparse layout"
    return None


def _dense(t):
    """Static sizes and strides that are a permutation of a contiguous layout."""
    dims = [(st, d) for d, st in zip(t.shape, t.stride()) if not (is_plain_int(d) and d == 1)]
    if not all(is_plain_int(d) and is_plain_int(st) for st, d in dims):
        return False
    expected = 1
    for st, d in sorted(dims):
        if st != expected:
            return False
        expected *= d
    return True


def _reduction(node, table):
    """(fragment op, operand's fake tensor, reduced dim) when node is an op of `table` that
    reduces one dim of a float tensor into its own dtype, else None: what row and column
    reductions have in common."""
    name = table.get(node.target) if node.op == "call_function" else None
    if name is None:
        return None
    x, val = node.args[0], node.meta.get("val")
    if not isinstance(x, torch.fx.Node) or not isinstance(val, torch.Tensor):
        return None
    t = x.meta.get("val")
    if not isinstance(t, torch.Tensor) or t.dtype not in DTYPES or t.dim() < 1:
        return None
    if name in LOGICAL_REDUCTIONS:
        if val.dtype != torch.bool:
            return None
    elif t.dtype == torch.bool or val.dtype != t.dtype:
        return None
    dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    if isinstance(dims, int):
        dims = [dims]
    if not isinstance(dims, (list, tuple)) or len(dims) != 1:
        return None
    return name, t, dims[0]


def row_reduction(node):
    """(fragment op, correction) when node reduces the last dim of a float tensor with
    keepdim (the forms a rows kernel computes), else None."""
    red = _reduction(node, ROW_REDUCTIONS)
    if red is None:
        return None
    name, t, dim = red
    n = t.shape[-1]
    if not is_plain_int(n) or not 1 < n <= MAX_ROW or dim not in (-1, t.dim() - 1):
        return None
    keepdim = node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False)
    if keepdim is not True or set(node.kwargs) - {"dim", "keepdim", "correction"}:
        return None
    correction = 0
    if name == "var":
        correction = node.kwargs.get("correction", 1)
        correction = 1 if correction is None else correction
        if correction not in (0, 1) or n > MAX_ROW_HELD:
            return None
    return name, int(correction)


# Column reductions over dim 0 of a 2-D value (vocabulary 5): a bias gradient's grad.sum(0).
COLUMN_REDUCTIONS = {aten.sum.dim_IntList: "sum", aten.mean.dim: "mean", aten.amax.default: "amax"}


def computes_pointwise(node):
    """Is node a pointwise op of the vocabulary that computes a value (not a clone or an
    expand, which only alias one), with operands a fragment takes?"""
    return node.op == "call_function" and node.target not in ALIASES and why_not_pointwise(node) is None


def fusible(node):
    """Is node an op a pointwise or rows group computes (a node next to it may join it)?"""
    return (
        isinstance(node, torch.fx.Node)
        and node.op == "call_function"
        and ((node.target in POINTWISE and why_not_pointwise(node) is None) or row_reduction(node) is not None)
    )


def column_reduction(node):
    """The fragment op when node reduces dim 0 of a 2-D float tensor with a static dim 1
    (keepdim or not; what a column kernel computes), else None."""
    red = _reduction(node, COLUMN_REDUCTIONS)
    if red is None:
        return None
    name, t, dim = red
    if t.dim() != 2 or not is_plain_int(t.shape[1]) or dim not in (0, -2):
        return None
    if set(node.kwargs) - {"dim", "keepdim"}:
        return None
    return name


# Concatenation (vocabulary 6): aten.cat of 2 to MAX_CAT tensors of one rank along a dim
# whose sizes are static; a cat group's other dims may be symbolic (leading dims only).
MAX_CAT = 8


def cat_dim(node):
    """The non-negative dim of an aten.cat node a fragment can spell (vocabulary 6), else
    None: 2 to MAX_CAT float or bool tensor operands of the result's rank, device and a
    static size along dim."""
    if node.op != "call_function" or node.target is not aten.cat.default or node.kwargs.keys() - {"dim"}:
        return None
    xs = node.args[0]
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
    val = node.meta.get("val")
    if not isinstance(xs, (list, tuple)) or not 2 <= len(xs) <= MAX_CAT or not isinstance(dim, int):
        return None
    if not isinstance(val, torch.Tensor) or val.dtype not in DTYPES or not -val.dim() <= dim < val.dim():
        return None
    dim %= val.dim()
    for x in xs:
        t = x.meta.get("val") if isinstance(x, torch.fx.Node) else None
        if (
            not isinstance(t, torch.Tensor)
            or t.dtype not in DTYPES
            or t.dim() != val.dim()
            or t.device != val.device
            or not is_plain_int(t.shape[dim])
        ):
            return None
    return dim


# Rows read at an index (vocabulary 9): ATen's index with one int64 index tensor, x[idx], or an
# embedding (weight[ids]), where x is a group's input (the kernel loads it where the index
# points); static sizes. An index of rank k gives a value of idx's dims then x's after its
# first: the fragment reads x as [S, 1 (k - 1 times), ...] (fragment.Layout's rows source).
def take_rows(node):
    """(x, idx) of an aten.index or aten.embedding node a fragment spells as take_rows
    (vocabulary 9): one int64 index of x's dim 0, of rank >= 1 (an embedding's ids [B, S]),
    x a float or bool tensor of rank >= 1 on the index's device, static sizes; else None.
    An embedding's padding_idx, scale_grad_by_freq and sparse only change its backward. Ids
    outside [-V, V) trap in the kernel as in ATen's; a negative id in [-V, 0), which ATen's
    embedding asserts on, reads row V + id there (x[idx]'s reading)."""
    if node.op != "call_function" or node.kwargs:
        return None
    if node.target is aten.embedding.default and len(node.args) >= 2:
        x, idx = node.args[:2]
    elif node.target is aten.index.Tensor and len(node.args) == 2:
        x, idxs = node.args
        if not isinstance(idxs, (list, tuple)) or len(idxs) != 1:
            return None
        idx = idxs[0]
    else:
        return None
    if not isinstance(x, torch.fx.Node):
        return None
    tx = x.meta.get("val")
    ti = idx.meta.get("val") if isinstance(idx, torch.fx.Node) else None
    val = node.meta.get("val")
    if not all(isinstance(t, torch.Tensor) for t in (tx, ti, val)):
        return None
    if ti.dtype != torch.int64 or ti.dim() < 1 or tx.dim() < 1 or tx.dtype not in DTYPES:
        return None
    if node.target is aten.embedding.default and tx.dim() != 2:
        return None
    if len({tx.device, ti.device, val.device}) != 1:
        return None
    sizes = (*tx.shape, *tx.stride(), *ti.shape, *ti.stride())
    if not all(is_plain_int(s) for s in sizes) or 0 in (*tx.shape, *ti.shape):
        return None
    return x, idx


# Window ops (vocabulary 7): max pooling over the last two dims with each window's argmax tap,
# and the gradient from those taps (max_pool.py), each a kernel of its own reading fragment
# inputs. The forward gives two values (its node's users are getitems).
WINDOW_OPS = {max_pool.FORWARD: "max_pool2d", max_pool.BACKWARD: "max_pool2d_backward"}


def window_op(node):
    """(wire op name, window [kh, kw, sh, sw, ph, pw, dh, dw], ceil_mode) of a window op
    node whose tensors a fragment can spell (float, one device, static pooled dims), else
    None."""
    if node.op != "call_function" or node.target not in WINDOW_OPS:
        return None
    val = node.meta.get("val")
    vals = list(val) if isinstance(val, (list, tuple)) else [val]
    vals += [a.meta.get("val") for a in node.args if isinstance(a, torch.fx.Node)]
    if not all(isinstance(v, torch.Tensor) and v.dtype in DTYPES and v.dtype is not torch.bool for v in vals):
        return None
    if any(v.device != vals[0].device or not all(is_plain_int(d) for d in v.shape[-2:]) for v in vals):
        return None
    pairs, ceil_mode = max_pool.window_of(node)
    return WINDOW_OPS[node.target], [p[i] for p in pairs for i in (0, 1)], ceil_mode


RESHAPE_OPS = {aten.view.default, aten._unsafe_view.default, aten.reshape.default}


def splits_rows(node, shape):
    """True when node reshapes a value of `shape` ([M, N], the GEMM's) into [d0, ..., N] with
    d0 * ... = M (nn.Linear on a [B, S, D] input): a view a GEMM group can look through,
    its epilogue then running over the same elements."""
    if node.op != "call_function" or node.target not in RESHAPE_OPS:
        return False
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor) or val.dim() < 3 or len(shape) != 2:
        return False
    lead = val.shape[:-1]
    if not all(is_plain_int(d) for d in lead) or not is_plain_int(shape[0]):
        return False  # symbolic leading dims: the runtime could not rebuild the shape
    m = 1
    for d in lead:
        m *= int(d)
    return m == int(shape[0]) and val.shape[-1] == shape[1] and val.is_contiguous()


def is_batched_gemm(node):
    """bmm or baddbmm: a GEMM group of vocabulary 4 (bmm_fragment.py)."""
    return node.op == "call_function" and node.target in (aten.bmm.default, aten.baddbmm.default)


def why_not_gemm(node):
    """None when the mm/addmm/bmm/baddbmm node can start a GEMM group (PROTOCOL.md,
    vocabularies 3 and 4, and the gemm template's limits), else the reason it runs through
    cuBLAS instead."""
    batched = is_batched_gemm(node)
    if node.target in (aten.addmm.default,) and (
        any(k not in ("beta", "alpha") for k in node.kwargs)
        or node.kwargs.get("beta", 1) != 1
        or node.kwargs.get("alpha", 1) != 1
    ):
        return "addmm with beta/alpha"
    if node.target is aten.baddbmm.default:
        # spelled as bmm, * alpha, + beta * input (bmm_fragment.py): any finite static scalars
        alpha, beta = node.kwargs.get("alpha", 1), node.kwargs.get("beta", 1)
        if (
            any(k not in ("beta", "alpha") for k in node.kwargs)
            or not is_finite_plain_real(alpha)
            or not is_finite_plain_real(beta)
        ):
            return "baddbmm with non-static beta/alpha"
        if alpha == 0:
            return "baddbmm with alpha 0"  # torch skips the product (its NaNs) entirely
    a, b = node.args[-2], node.args[-1]
    if not all(isinstance(x, torch.fx.Node) for x in (a, b)):
        return "operands are not tensors"
    ta, tb = a.meta.get("val"), b.meta.get("val")
    if not isinstance(ta, torch.Tensor) or not isinstance(tb, torch.Tensor):
        return "no tensor metadata"
    if ta.dtype not in (torch.bfloat16, torch.float16) or tb.dtype != ta.dtype:
        return f"{ta.dtype} x {tb.dtype} GEMM: the template takes bf16/f16"
    rank = 3 if batched else 2
    if ta.dim() != rank or tb.dim() != rank:
        return "operands are not batches of matrices" if batched else "operands are not matrices"
    k, n = tb.shape[-2:]
    if not (is_plain_int(k) and is_plain_int(n)) or not is_plain_int(ta.shape[-1]):
        return "symbolic K or N"
    if batched and not is_plain_int(ta.shape[1]):
        return "symbolic M in a batched GEMM (only the batch may be symbolic)"
    for name, t in (("A", ta), ("B", tb)):
        st = t.stride()
        if not all(is_plain_int(x) for x in st):
            return f"{name} has symbolic strides"
        # any K and leading dim: where the generated templates need 8-element chunks, the
        # daemon serves a cuBLASLt plan instead; each batch's matrix (the last two dims) must
        # be row- or column-major, its batch stride is free (0: one matrix expanded)
        r, c = t.shape[-2:]
        if not (st[-1] == 1 or c == 1 or st[-2] == 1 or r == 1):
            return f"{name} is neither row- nor column-major"
    if node.target in (aten.addmm.default, aten.baddbmm.default):
        bias = node.args[0]
        if isinstance(bias, torch.fx.Node):
            tbias = bias.meta.get("val")
            if not isinstance(tbias, torch.Tensor) or tbias.dtype != ta.dtype:
                return "bias of another dtype"
        elif batched:
            return "baddbmm input is not a tensor"
    return None


def batched_view(node, shape):
    """For a batched GEMM group over `shape` ([Bt, M, N], the bmm's): the view shape [d0, ...,
    M, N] when node reshapes it with d0 * ... = Bt (torch.matmul on [B, H, S, D]: the bmm's
    [B*H, S, S] is viewed back as [B, H, S, S]), an epilogue that continues over the same
    elements; else None. The view must be row-major dense, which the bmm's result is."""
    if node.op != "call_function" or node.target not in RESHAPE_OPS or len(shape) != 3:
        return None
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor) or val.dim() < 3:
        return None
    size, stride = list(val.shape), list(val.stride())
    if not (plain_equal(size[-1], shape[2]) and plain_equal(size[-2], shape[1])):
        return None
    if sum(not is_plain_int(d) for d in size[:-2]) > 1:
        return None  # one symbolic batch dim at most: the runtime views the result with -1
    lead = 1
    for d in size[:-2]:
        lead = lead * d
    if not plain_equal(lead, shape[0]):
        return None
    # row-major dense, decided without guards on the symbolic batch dim (its stride is free)
    if not known_true(stride[-1] == 1):
        return None
    for i in range(len(size) - 2, 0, -1):
        if not known_true(stride[i] == stride[i + 1] * size[i + 1]):
            return None
    return size


def products(members):
    """The matrix products among a group's members: one, or two siblings (siblings.py)."""
    return [n for n in members if n.op == "call_function" and n.target in GEMM_OPS]


def kind_of(node):
    if node.op != "call_function":
        return None
    if node.target in GEMM_OPS:
        return "gemm"
    if node.target in REDUCTION_OPS:
        return "reduction"
    return None


def permutation(node):
    """The dims of node's input that node's dims are (a t, transpose or permute node)."""
    rank = node.meta["val"].dim()
    if node.target is aten.t.default:
        return [1, 0] if rank == 2 else list(range(rank))
    if node.target is aten.transpose.int:
        perm = list(range(rank))
        d0, d1 = (d % rank for d in node.args[1:3])
        perm[d0], perm[d1] = perm[d1], perm[d0]
        return perm
    return [d % rank for d in node.args[1]]
