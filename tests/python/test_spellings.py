"""The vocabulary spellings of ATen ops (ops.POINTWISE) compute what ATen computes: each op's
fragment is evaluated here by a small fp64 interpreter of the wire ops and compared with the
ATen op on random inputs (the C reference and the kernels are checked against each other by
the C and GPU suites; this checks the Python side's algebra)."""

import pytest
import torch

from fuseml.fragment import Emitter

aten = torch.ops.aten

_UNARY = {
    "neg": torch.neg,
    "abs": torch.abs,
    "relu": torch.relu,
    "exp": torch.exp,
    "log": torch.log,
    "sqrt": torch.sqrt,
    "rsqrt": torch.rsqrt,
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
    "erf": torch.erf,
    "silu": torch.nn.functional.silu,
    "gelu": torch.nn.functional.gelu,
    "gelu_tanh": lambda x: torch.nn.functional.gelu(x, approximate="tanh"),
}
_BINARY = {
    "add": torch.add,
    "sub": torch.sub,
    "mul": torch.mul,
    "div": torch.div,
    "maximum": torch.maximum,
    "minimum": torch.minimum,
    "le": torch.le,
    "lt": torch.lt,
    "ge": torch.ge,
    "gt": torch.gt,
    "eq": torch.eq,
    "ne": torch.ne,
}


def evaluate(ops, values):
    for op in ops:
        name, args = op["op"], [values[a] for a in op["args"]]
        if name == "const":
            out = torch.tensor(op["value"], dtype=torch.float64)
        elif name == "cast":
            out = args[0].to(torch.bool) if op["dtype"] == "bool" else args[0].to(torch.float64)
        elif name == "where":
            out = torch.where(args[0].to(torch.bool), args[1], args[2])
        elif name in _UNARY:
            out = _UNARY[name](args[0])
        else:
            out = _BINARY[name](*args).to(torch.float64)
        values[op["out"]] = out
    return values


def node_for(target, args, kwargs=None):
    """A one-op FX graph over placeholder inputs; returns (node, input nodes)."""
    g = torch.fx.Graph()
    phs = [g.placeholder(f"x{i}") for i in range(len(args))]
    for p, a in zip(phs, args):
        p.meta["val"] = a.to(torch.float32)
    n = g.call_function(target, tuple(phs) + tuple(kwargs.pop("extra", ())), kwargs or {})
    n.meta["val"] = target(*[a.float() for a in args], **{k: v for k, v in n.kwargs.items()})
    return n, phs


CASES = [
    (aten.gelu_backward.default, 2, {}),
    (aten.gelu_backward.default, 2, {"approximate": "tanh"}),
    (aten.silu_backward.default, 2, {}),
    (aten.sigmoid_backward.default, 2, {}),
    (aten.tanh_backward.default, 2, {}),
    (aten.erf.default, 1, {}),
]


@pytest.mark.parametrize("target,nargs,kwargs", CASES, ids=lambda c: str(c))
def test_spelling_matches_aten(target, nargs, kwargs):
    from fuseml.ops import POINTWISE

    torch.manual_seed(0)
    xs = [torch.randn(257, dtype=torch.float64) * 3 for _ in range(nargs)]
    if target in (aten.sigmoid_backward.default,):
        xs[1] = torch.sigmoid(xs[1])
    if target in (aten.tanh_backward.default,):
        xs[1] = torch.tanh(xs[1])
    node, phs = node_for(target, xs, dict(kwargs))
    e = Emitter(phs)
    vid = POINTWISE[target](e, node)
    values = evaluate(e.ops, {i: x for i, x in enumerate(xs)})
    got = values[vid]
    want = target(*xs, **kwargs)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)


def test_dropout_backward_spelling_matches_aten():
    """native_dropout_backward(grad, mask, scale): the kept elements' gradient scaled, the
    dropped ones' zero."""
    from fuseml.ops import POINTWISE

    torch.manual_seed(0)
    grad, mask = torch.randn(257, dtype=torch.float64), torch.rand(257) < 0.9
    g = torch.fx.Graph()
    phs = [g.placeholder("grad"), g.placeholder("mask")]
    phs[0].meta["val"], phs[1].meta["val"] = grad.float(), mask
    node = g.call_function(aten.native_dropout_backward.default, (phs[0], phs[1], 1 / 0.9))
    e = Emitter(phs)
    vid = POINTWISE[aten.native_dropout_backward.default](e, node)
    got = evaluate(e.ops, {0: grad, 1: mask.double()})[vid]
    torch.testing.assert_close(got, aten.native_dropout_backward.default(grad, mask, 1 / 0.9), rtol=1e-12, atol=0)
