"""The attention-mask vocabulary: isneginf/isposinf/isinf/isfinite/isnan as comparisons,
logical and bitwise ops on bool tensors, masked_fill by a 0-dim tensor, all/any over the last
dim as row reductions, and SDPA's masked softmax (aten._safe_softmax, what its math path runs
for T5's biased attention) as one rows group. Each spelling is evaluated by an fp64
interpreter of the wire ops and compared with the ATen op on inputs with ±inf, NaN, ±0 and
rows that are all true or all false; a real fusemld (compile-only here) accepts the
fragments."""

import pytest
import torch

from helpers import Fn, compile_run, plan
from test_spellings import evaluate

from fuseml import ops
from fuseml.fragment import Emitter

aten = torch.ops.aten
INF, NAN = float("inf"), float("nan")


def evaluate_rows(ops_, values):
    """test_spellings.evaluate with the row reductions over the last dim (keepdim)."""
    reductions = {"amax": lambda x: x.amax(-1, keepdim=True), "sum": lambda x: x.sum(-1, keepdim=True)}
    for op in ops_:
        if op["op"] in reductions:
            values[op["out"]] = reductions[op["op"]](values[op["args"][0]])
        else:
            evaluate([op], values)
    return values


def edge_values(n=64, seed=0):
    """Random floats with ±inf, NaN, ±0 and 1 mixed in."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g, dtype=torch.float64) * 3
    specials = torch.tensor([INF, -INF, NAN, 0.0, -0.0, 1.0], dtype=torch.float64)
    k = min(24, n // 2)
    x[torch.randperm(n, generator=g)[:k]] = specials.repeat(4)[:k]
    return x


def spell(target, args, extra=()):
    """The fragment value of target(*args, *extra) (tensor args as graph inputs), evaluated in
    fp64, and torch's result."""
    g = torch.fx.Graph()
    phs = []
    for i, a in enumerate(args):
        p = g.placeholder(f"x{i}")
        p.meta["val"] = a if a.dtype == torch.bool else a.to(torch.float32)
        phs.append(p)
    n = g.call_function(target, tuple(phs) + tuple(extra))
    want = target(*[p.meta["val"] for p in phs], *extra)
    n.meta["val"] = want
    assert ops.why_not_pointwise(n) is None or ops.row_reduction(n), ops.why_not_pointwise(n)
    e = Emitter(phs)
    vid = e.emit_node(n)
    assert e.dtype[vid] == ops.DTYPES[want.dtype]
    values = evaluate_rows(e.ops, {i: a.to(torch.float64) if a.dtype != torch.bool else a for i, a in enumerate(args)})
    return values[vid], want


@pytest.mark.parametrize(
    "target",
    [
        aten.isneginf.default,
        aten.isposinf.default,
        aten.isinf.default,
        aten.isfinite.default,
        aten.isnan.default,
        aten.logical_not.default,
    ],
    ids=str,
)
def test_float_tests_are_comparisons(target):
    x = edge_values()
    got, want = spell(target, [x])
    assert want.dtype == torch.bool
    assert torch.equal(got.to(torch.bool), want), (x, got, want)


@pytest.mark.parametrize(
    "target", [aten.logical_and.default, aten.logical_or.default, aten.logical_xor.default], ids=str
)
def test_logical_ops_take_truth_values(target):
    # NaN is true, ±0 false, as torch
    a, b = edge_values(seed=1), edge_values(seed=2)
    got, want = spell(target, [a, b])
    assert torch.equal(got.to(torch.bool), want)
    got, want = spell(target, [a != 0, b > 0])
    assert torch.equal(got.to(torch.bool), want)


@pytest.mark.parametrize("target", [aten.bitwise_and.Tensor, aten.bitwise_or.Tensor, aten.bitwise_xor.Tensor], ids=str)
def test_bitwise_ops_on_bool(target):
    a, b = edge_values(seed=3) > 0, edge_values(seed=4) < 0
    got, want = spell(target, [a, b])
    assert torch.equal(got.to(torch.bool), want)
    got, want = spell(aten.bitwise_not.default, [a])
    assert torch.equal(got.to(torch.bool), want)


def test_bitwise_ops_on_integers_stay_out():
    g = torch.fx.Graph()
    a, b = g.placeholder("a"), g.placeholder("b")
    a.meta["val"] = b.meta["val"] = torch.tensor([3, 5], dtype=torch.int32)
    n = g.call_function(aten.bitwise_and.Tensor, (a, b))
    n.meta["val"] = torch.tensor([1, 1], dtype=torch.int32)
    assert ops.why_not_pointwise(n) is not None


def test_masked_fill_by_a_tensor():
    x, m = edge_values(seed=5), edge_values(seed=6) > 0
    got, want = spell(aten.masked_fill.Tensor, [x, m, torch.tensor(-INF)])
    torch.testing.assert_close(got, want.to(torch.float64), equal_nan=True)


def truth_rows():
    """Rows all true, all false, mixed, and of NaN (true) and -0.0 (false)."""
    rows = torch.stack(
        [
            torch.ones(16),
            torch.zeros(16),
            edge_values(16, seed=7).float(),
            torch.full((16,), NAN),
            torch.full((16,), -0.0),
            torch.tensor([0.0] * 15 + [NAN]),
        ]
    )
    return rows


@pytest.mark.parametrize("target", [aten.all.dim, aten.any.dim], ids=str)
@pytest.mark.parametrize("as_bool", [True, False], ids=["bool", "float"])
def test_all_any_over_rows(target, as_bool):
    x = truth_rows()
    x = x != 0 if as_bool else x
    got, want = spell(target, [x], extra=(-1, True))
    assert want.shape == (6, 1)
    assert torch.equal(got.to(torch.bool), want), (got, want)


def test_all_any_without_keepdim_or_over_another_dim_stay_out():
    g = torch.fx.Graph()
    x = g.placeholder("x")
    x.meta["val"] = torch.zeros(4, 8, dtype=torch.bool)
    for args in ((x, -1, False), (x, 0, True)):
        n = g.call_function(aten.all.dim, args)
        n.meta["val"] = aten.all.dim(x.meta["val"], *args[1:])
        assert ops.row_reduction(n) is None


def masked_scores(b=2, h=3, s=8, seed=0):
    """Attention scores with some positions -inf, whole rows -inf, and a +inf."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, h, s, s, generator=g)
    x[0, 0, :, 5:] = -INF  # padding: some columns masked
    x[0, 1, 3] = -INF  # a row masked entirely: zeros, not NaN
    x[1, 2, 6] = -INF
    x[1, 0, 2, 4] = INF  # +inf: a NaN row, as torch
    return x


def test_safe_softmax_is_one_rows_group(dead_socket):
    bias = torch.randn(1, 3, 8, 8)
    f = lambda x: aten._safe_softmax(x + bias, -1)  # noqa: E731
    x = masked_scores()
    c, got, want = compile_run(Fn(f), x, train=False)
    torch.testing.assert_close(got[0], want[0], equal_nan=True)
    (p,) = c.plans
    (g,) = p.groups
    assert g.kind == "rows" and g.route == "kernel", g.describe()
    assert g.op_names == ["add", "amax", "sub", "exp", "sum", "div", "eq", "all", "masked_fill"]
    # the fragment itself computes _safe_softmax: rows of -inf give 0, a +inf gives NaN
    w = g.built.wire
    assert w["vocab"] == 2
    feeds = {i: (x if tuple(n.meta["val"].shape) == tuple(x.shape) else bias).double() for i, n in enumerate(g.inputs)}
    values = evaluate_rows(w["ops"], feeds)
    got = values[w["outputs"][0]["id"]]
    want = aten._safe_softmax(x + bias, -1).double()
    assert torch.equal(want[0, 1, 3], torch.zeros(8, dtype=torch.float64))
    torch.testing.assert_close(got, want, equal_nan=True)


def test_safe_softmax_forward_and_backward(dead_socket):
    def f(x):
        return aten._safe_softmax(x.float() * 2.0, -1).to(torch.bfloat16)

    x = masked_scores().to(torch.bfloat16)
    c, got, want = compile_run(Fn(f), x)
    for a, b in zip([got[0]] + got[1], [want[0]] + want[1]):
        torch.testing.assert_close(a, b, equal_nan=True)
    fw = plan(c, "forward")
    (g,) = fw.kernels()
    assert {"amax", "exp", "sum", "eq", "all", "masked_fill"} <= set(g.op_names)
    assert not any(g.route == "bypass" and g.kind in ("rows", "reduction") for g in fw.groups)
    # its backward (softmax's) is a rows group too
    assert any(g.kind == "rows" and g.route == "kernel" for g in plan(c, "backward").groups)


def test_daemon_accepts_mask_fragments(daemon):
    bias = torch.randn(1, 3, 8, 8)

    def f(x):
        m = torch.isneginf(x) | torch.isnan(x)
        y = torch.where(m.logical_not(), x * 2.0, torch.zeros(()))
        return aten._safe_softmax(x + bias, -1), y, torch.isinf(x) & (x > 0)

    x = masked_scores()
    c, got, want = compile_run(Fn(f), x, train=False)
    ks = [g for p in c.plans for g in p.kernels()]
    assert {g.kind for g in ks} == {"rows", "pointwise"}, [g.describe() for g in ks]
    assert all(g.key and g.state in ("untuned", "tuned") for g in ks), [
        (g.describe(), g.reason) for g in ks if not g.key
    ]
