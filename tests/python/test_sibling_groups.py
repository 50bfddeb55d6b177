"""Sibling GEMM groups: two products of one A (SwiGLU's gate and up projections of x) fused
with the epilogue that combines them. What the partitioner merges (and what it must keep
apart), the two-product vocabulary-3 fragment, the escapes autograd saves, the rewritten
graph against eager (forward and gradients), the launch layout, and round trips through a
real fusemld (compile-only here), including a daemon that predates siblings."""

import io
import logging

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from helpers import compile_run, plan, rel_err
from models import LlamaMLP
from test_runtime import _runners, standin  # noqa: F401  (the stand-in launch fixture)

import fuseml
from fuseml import transport

BF16 = torch.bfloat16
aten = torch.ops.aten
D, FF = 32, 64


class GLU(nn.Module):
    """down(act(gate(x)) * up(x)): SwiGLU (act "silu"), GeGLU ("gelu": erf, "gelu_tanh")."""

    def __init__(self, act="silu", bias=False, d=D, ff=FF):
        super().__init__()
        self.act = act
        self.gate_proj = nn.Linear(d, ff, bias=bias)
        self.up_proj = nn.Linear(d, ff, bias=bias)
        self.down_proj = nn.Linear(ff, d, bias=bias)

    def forward(self, x):
        g = self.gate_proj(x)
        if self.act == "silu":
            g = F.silu(g)
        else:
            g = F.gelu(g, approximate="tanh" if self.act == "gelu_tanh" else "none")
        return self.down_proj(g * self.up_proj(x))


def x3d(b=2, s=8, d=D, seed=0):
    return torch.randn(b, s, d, generator=torch.Generator().manual_seed(seed)).to(BF16)


def model(cls=LlamaMLP, *a, seed=0, **kw):
    torch.manual_seed(seed)
    return cls(*a, **kw).to(BF16)


def gemm_groups(p):
    return [g for g in p.groups if g.kind == "gemm"]


def sibling_groups(p):
    return [g for g in p.groups if g.siblings]


def products(wire):
    return [op for op in wire["ops"] if op["op"] in ("mm", "addmm")]


def exact(got, want):
    """The rewritten graph runs the same ATen ops as eager on CPU: equal results."""
    (y, grads), (y0, grads0) = got, want
    torch.testing.assert_close(y, y0, rtol=0, atol=0)
    assert len(grads) == len(grads0)
    for g, g0 in zip(grads, grads0):
        torch.testing.assert_close(g, g0, rtol=0, atol=0)


# -- partitioning and the fragment --------------------------------------------------------


def test_swiglu_inference_is_one_sibling_group(dead_socket):
    c, got, want = compile_run(model(), x3d(), train=False)
    exact(got, want)
    p = plan(c, "inference")
    (sib,) = sibling_groups(p)
    assert sib.route == "kernel" and not sib.escapes
    assert sib.op_names == ["mm", "_unsafe_view", "silu", "mm", "_unsafe_view", "mul"]
    gate, up = (n for n in sib.members if n.target is aten.mm.default)
    assert gate.args[0] is up.args[0]  # the two views of x are one A now
    # the down projection: a group of its own (a lone GEMM: cuBLAS)
    (down,) = [g for g in gemm_groups(p) if g is not sib]
    assert down.op_names[0] == "mm" and down.route == "bypass" and "lone GEMM" in down.reason
    assert len(gemm_groups(p)) == 2
    w = sib.built.wire
    assert w["vocab"] == 3 and w["m_hint"] == 16
    a, b, b2 = w["inputs"]
    assert a == {"id": 0, "dtype": "bf16", "shape": [-1, D], "strides": [D, 1], "align": 16}
    # two nn.Linear weights .t(): K-major, one leading dim
    assert b == {"id": 1, "dtype": "bf16", "shape": [D, FF], "strides": [1, D], "align": 16}
    assert b2 == {"id": 2, "dtype": "bf16", "shape": [D, FF], "strides": [1, D], "align": 16}
    assert w["ops"] == [
        {"op": "mm", "out": 3, "args": [0, 1]},
        {"op": "mm", "out": 4, "args": [0, 2]},
        {"op": "silu", "out": 5, "args": [3]},
        {"op": "mul", "out": 6, "args": [5, 4]},
    ]
    assert w["outputs"] == [{"id": 6, "dtype": "bf16", "shape": [-1, FF], "strides": [FF, 1], "align": 16}]
    assert sib.built.siblings and sib.built.out_views == [(2, 8, FF)]
    assert sib.built.layout.k == 1 and sib.built.full_input == 0


@pytest.mark.usefixtures("saves_every_intermediate")
def test_swiglu_training_forward_saves_what_backward_needs(dead_socket):
    c, got, want = compile_run(model(), x3d())
    exact(got, want)
    fw = plan(c, "forward")
    (sib,) = sibling_groups(fw)
    assert sib.op_names == ["mm", "_unsafe_view", "silu", "mm", "_unsafe_view", "mul"]
    # autograd saves the gate product (silu's backward), silu(gate) and the up product (mul's
    # backward): extra outputs; mul goes on to the down projection
    assert [n.name for n in sib.escapes] == ["_unsafe_view", "silu", "_unsafe_view_1"]
    w = sib.built.wire
    gate, up = (op["out"] for op in products(w))
    silu = next(op["out"] for op in w["ops"] if op["op"] == "silu")
    mul = next(op["out"] for op in w["ops"] if op["op"] == "mul")
    assert [o["id"] for o in w["outputs"]] == [gate, silu, up, mul]
    assert all(o["shape"] == [-1, FF] and o["strides"] == [FF, 1] for o in w["outputs"])
    assert sib.built.out_views == [(2, 8, FF)] * 4
    # the backward graph's GEMMs are other shapes: no siblings there
    bw = plan(c, "backward")
    assert not sibling_groups(bw)
    assert any("silu_backward" in g.op_names and g.route == "kernel" for g in bw.groups)


@pytest.mark.usefixtures("saves_every_intermediate")
def test_two_d_input_escapes_the_products_themselves(dead_socket):
    c, got, want = compile_run(model(), torch.randn(16, D).to(BF16))
    exact(got, want)
    (sib,) = sibling_groups(plan(c, "forward"))
    assert sib.op_names == ["mm", "silu", "mm", "mul"]
    assert [n.name for n in sib.escapes] == ["mm", "silu", "mm_1"]
    assert sib.built.out_views is None


@pytest.mark.parametrize(
    "act,bias,op", [("gelu_tanh", False, "gelu_tanh"), ("gelu", True, "gelu"), ("silu", True, "silu")]
)
def test_geglu_and_biased_projections(dead_socket, act, bias, op):
    c, got, want = compile_run(model(GLU, act, bias), x3d(), train=False)
    exact(got, want)
    (sib,) = sibling_groups(plan(c, "inference"))
    w = sib.built.wire
    prods = products(w)
    assert [p["op"] for p in prods] == (["addmm", "addmm"] if bias else ["mm", "mm"])
    a_ids = {p["args"][-2] for p in prods}
    b_ids = [p["args"][-1] for p in prods]
    assert len(a_ids) == 1 and len(set(b_ids)) == 2
    (a,) = a_ids
    assert w["inputs"][a]["shape"] == [-1, D]
    assert all(w["inputs"][b]["shape"] == [D, FF] for b in b_ids)
    assert [o["op"] for o in w["ops"][2:]] == [op, "mul"]
    if bias:  # each bias an epilogue operand broadcast over the rows
        biases = [w["inputs"][p["args"][0]] for p in prods]
        assert all(x["shape"] == [1, FF] and x["strides"] == [0, 1] for x in biases)
        assert len({p["args"][0] for p in prods}) == 2


def test_geglu_training_gradients(served):
    c, got, want = compile_run(model(GLU, "gelu_tanh", True), x3d())
    exact(got, want)
    (sib,) = sibling_groups(plan(c, "forward"))
    assert sib.key and sib.escapes


# -- what must stay apart -----------------------------------------------------------------


class TwoInputs(nn.Module):
    """silu(gate(x1)) * up(x2): the products read different A's."""

    def __init__(self):
        super().__init__()
        self.gate = nn.Linear(D, FF, bias=False)
        self.up = nn.Linear(D, FF, bias=False)

    def forward(self, x1, x2):
        return F.silu(self.gate(x1)) * self.up(x2)


class UpReadsGate(nn.Module):
    """The up group also computes u + cumsum(silu(g)): it reads the gate group through an op
    outside both. Merged, the group would wait on its own result."""

    def __init__(self):
        super().__init__()
        self.gate = nn.Linear(D, FF, bias=False)
        self.up = nn.Linear(D, FF, bias=False)

    def forward(self, x):
        s = F.silu(self.gate(x))
        u = self.up(x)
        u2 = u + torch.cumsum(s, -1)
        return s * u, u2


class MixedLayouts(nn.Module):
    """x @ Wg.t() (B K-major) beside x @ Wu (B row-major): one kernel cannot load both."""

    def __init__(self):
        super().__init__()
        self.wg = nn.Parameter(torch.randn(FF, D) / D**0.5)
        self.wu = nn.Parameter(torch.randn(D, FF) / D**0.5)

    def forward(self, x):
        return F.silu(x @ self.wg.t()) * (x @ self.wu)


def _apart(p):
    """Two GEMM groups, the first taking the combining op as its epilogue (today's shape)."""
    assert not sibling_groups(p)
    kernels = [g for g in gemm_groups(p) if g.route == "kernel"]
    assert any(g.op_names[-1] == "mul" for g in kernels), [g.describe() for g in p.groups]
    return kernels


def test_different_a_stays_apart(dead_socket):
    m = TwoInputs().to(BF16)
    x1, x2 = torch.randn(16, D).to(BF16), torch.randn(16, D).to(BF16)
    c = fuseml.FuseMLCompiler()
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(m, backend=c)(x1, x2), m(x1, x2), rtol=0, atol=0)
    (g,) = _apart(plan(c, "inference"))
    assert g.op_names == ["mm", "silu", "mul"]


def test_a_cycle_through_another_op_stays_apart(served):
    torch.manual_seed(0)
    m = UpReadsGate().to(BF16)
    x = torch.randn(16, D).to(BF16)
    c = fuseml.FuseMLCompiler()
    with torch.no_grad():
        got, want = torch.compile(m, backend=c)(x), m(x)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    p = plan(c, "inference")
    kernels = _apart(p)
    # the up group reads the gate group (through cumsum), so the combining mul cannot join
    # the gate group either: the up group takes it
    assert sorted(g.op_names for g in kernels) == [["mm", "add", "mul"], ["mm", "silu"]]


@pytest.mark.parametrize(
    "make,x",
    [
        (lambda: MixedLayouts(), torch.randn(16, D)),
        # K = 20: no generated template runs it, and siblings have no cuBLASLt plan; apart, each
        # group can still be served one
        (lambda: LlamaMLP(20, FF), torch.randn(16, 20)),
    ],
)
def test_pairs_the_templates_cannot_run_stay_apart(dead_socket, make, x):
    torch.manual_seed(0)
    m = make().to(BF16)
    c, got, want = compile_run(m, x.to(BF16), train=False)
    exact(got, want)
    _apart(plan(c, "inference"))


def test_a_third_product_is_not_taken(dead_socket):
    """silu(g(x)) * u(x) * v(x): one sibling pair; the third product keeps its own group."""

    class Three(nn.Module):
        def __init__(self):
            super().__init__()
            self.g, self.u, self.v = (nn.Linear(D, FF, bias=False) for _ in range(3))

        def forward(self, x):
            return F.silu(self.g(x)) * self.u(x) * self.v(x)

    torch.manual_seed(0)
    c, got, want = compile_run(Three().to(BF16), torch.randn(16, D).to(BF16), train=False)
    exact(got, want)
    p = plan(c, "inference")
    (sib,) = sibling_groups(p)
    assert sib.op_names == ["mm", "silu", "mm", "mul", "mul"]
    assert len(products(sib.built.wire)) == 2
    (v,) = [g for g in gemm_groups(p) if g is not sib]
    assert v.op_names == ["mm"] and v.outputs[0] in sib.inputs


def test_batched_products_are_not_siblings(dead_socket):
    x = torch.randn(3, 16, D).to(BF16)
    w1, w2 = torch.randn(3, D, FF).to(BF16), torch.randn(3, D, FF).to(BF16)
    c = fuseml.FuseMLCompiler()
    f = lambda x, a, b: F.silu(torch.bmm(x, a)) * torch.bmm(x, b)  # noqa: E731
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(f, backend=c)(x, w1, w2), f(x, w1, w2))
    p = plan(c, "inference")
    assert not sibling_groups(p) and len(gemm_groups(p)) == 2


def test_a_mutation_between_the_products_keeps_them_apart():
    """Graphs with in-place ops (not functionalized): nothing is merged across one."""

    def f(x, wg, wu, y):
        g = x @ wg
        y.add_(1)
        return F.silu(g) * (x @ wu)

    args = [torch.randn(16, D).to(BF16), torch.randn(D, FF).to(BF16), torch.randn(D, FF).to(BF16), torch.randn(4)]
    gm = torch.fx.experimental.proxy_tensor.make_fx(f)(*args)
    assert any(n.target is aten.add_.Tensor for n in gm.graph.nodes)
    groups = fuseml.find_groups(gm)
    assert not any(g.siblings for g in groups)
    assert len([g for g in groups if g.kind == "gemm"]) == 2
    # the same graph without the mutation pairs
    gm = torch.fx.experimental.proxy_tensor.make_fx(lambda x, wg, wu: F.silu(x @ wg) * (x @ wu))(*args[:3])
    assert [g.op_names for g in fuseml.find_groups(gm) if g.siblings] == [["mm", "silu", "mm", "mul"]]


# -- the rewritten graph, the launch layout, explain ---------------------------------------


@pytest.mark.usefixtures("saves_every_intermediate")
def test_rewritten_graph_matches_eager_forward_and_gradients(served, caplog):
    """The sibling group as one fuseml::group call in the forward graph (its saved values
    handed to backward as its extra outputs): outputs and every gradient as eager."""
    caplog.set_level(logging.WARNING, logger="fuseml")
    c, got, want = compile_run(model(), x3d())
    exact(got, want)
    fw = plan(c, "forward")
    (sib,) = sibling_groups(fw)
    assert sib.key and len(sib.outputs) == 4
    assert "kernels run on CUDA only" in caplog.text  # CPU tensors: the runner's ATen ops
    torch._dynamo.reset()
    c, got, want = compile_run(model(GLU, "gelu", True), x3d(), train=False)
    exact(got, want)


def test_dynamic_m_shares_the_fragment(dead_socket):
    c = fuseml.FuseMLCompiler()
    m = model()
    f = torch.compile(m, backend=c)
    wires = []
    for rows in (16, 24):
        x = torch.randn(rows, D).to(BF16)
        with torch.no_grad():
            torch.testing.assert_close(f(x), m(x), rtol=0, atol=0)
        (sib,) = sibling_groups(c.plans[-1])
        wires.append(sib.built.wire)
    assert [w["m_hint"] for w in wires] == [16, 24]
    assert [{k: v for k, v in w.items() if k != "m_hint"} for w in wires][0] == {
        k: v for k, v in wires[1].items() if k != "m_hint"
    }


def test_launch_outer_is_m(dead_socket, standin):  # noqa: F811
    c, _, _ = compile_run(model(), x3d(), train=False)
    (r,) = [r for r in _runners(c) if r.built.siblings]
    xs = [torch.randn(16, D).to(BF16), torch.randn(FF, D).to(BF16).t(), torch.randn(FF, D).to(BF16).t()]
    r.kernel = ("k" * 64, "tuned", b"", {})
    got = r._launch(xs, torch.device("cpu"), r.kernel[0], b"", {})
    want = r.eager(xs)
    assert [(o.shape, o.stride(), o.dtype) for o in got] == [(o.shape, o.stride(), o.dtype) for o in want]
    assert standin.calls == [(3, 1, 16)]
    # a B2 of another layout than traced: the kernel cannot read it, the group runs ATen
    xs[2] = torch.randn(D, FF).to(BF16)
    with pytest.raises(fuseml.runtime._Layout, match="stride"):
        r._launch(xs, torch.device("cpu"), r.kernel[0], b"", {})


def test_explain_shows_the_sibling_group(dead_socket):
    buf = io.StringIO()
    rows = fuseml.explain(model(), x3d(), file=buf)
    text = buf.getvalue()
    assert "[gemm siblings] mm -> _unsafe_view -> silu -> mm -> _unsafe_view -> mul" in text
    (r,) = [r for r in rows if r["siblings"]]
    assert r["kind"] == "gemm" and r["ops"].count("mm") == 2
    assert r["strategy"].startswith("eager gemm")  # no daemon here


# -- a real fusemld (compile-only without a GPU) --------------------------------------------


@pytest.mark.usefixtures("saves_every_intermediate")
def test_daemon_accepts_sibling_fragments(daemon):
    """SwiGLU (inference and training forward, with its four outputs) and biased GeGLU: the
    daemon answers each sibling fragment with a kernel; a second M in the bucket is a hit."""
    keys = []
    for rows in (48, 60):
        torch._dynamo.reset()
        c, got, want = compile_run(model(), torch.randn(rows, D).to(BF16), train=False)
        exact(got, want)
        (sib,) = sibling_groups(plan(c, "inference"))
        assert sib.key and sib.state in ("untuned", "tuned"), (sib.describe(), sib.reason)
        keys.append((sib.key, sib.origin))
    assert keys[0][0] == keys[1][0] and keys[1][1] == "hit"
    torch._dynamo.reset()
    c, got, want = compile_run(model(), x3d())
    exact(got, want)
    (sib,) = sibling_groups(plan(c, "forward"))
    assert len(sib.built.wire["outputs"]) == 4
    assert sib.key and sib.state in ("untuned", "tuned"), (sib.describe(), sib.reason)
    torch._dynamo.reset()
    c, got, want = compile_run(model(GLU, "gelu_tanh", True), x3d(), train=False)
    exact(got, want)
    (sib,) = sibling_groups(plan(c, "inference"))
    assert sib.key and sib.state in ("untuned", "tuned"), (sib.describe(), sib.reason)


class TwoBlocks(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = LlamaMLP(), GLU("gelu_tanh", True)

    def forward(self, x):
        x = x + self.a(x)
        return torch.relu(self.b(x)) + x


def test_daemon_without_siblings_runs_them_apart(daemon, caplog, monkeypatch):
    """A daemon that predates siblings (simulated: every fragment with two products is
    answered as the old daemon answers it): each refused sibling group is split back into
    its two GEMM groups, requested in a second round and served apart (the gate group with
    the combining op, as without siblings; a lone up product stays with cuBLAS), with one
    warning for the cause; the result is eager's."""
    caplog.set_level(logging.WARNING, logger="fuseml")
    real = transport.compile_all
    rounds = []

    def old_daemon(conn, wires, timeout):
        rounds.append([len(products(w)) for w in wires])
        mine = [w for w in wires if len(products(w)) < 2]
        got = iter(real(conn, mine, timeout) if mine else [])
        return [
            next(got)
            if len(products(w)) < 2
            else {
                "ok": False,
                "code": "unsupported",
                "message": "fragment not supported",
                "detail": "ops[1]: a GEMM fragment has exactly one matrix product (ops[0] is one)",
            }
            for w in wires
        ]

    monkeypatch.setattr(fuseml.backend.transport, "compile_all", old_daemon)
    torch.manual_seed(0)
    c, got, want = compile_run(TwoBlocks().to(BF16), x3d())
    exact(got, want)
    fw = plan(c, "forward")
    sibs = sibling_groups(fw)
    assert len(sibs) == 2
    assert all(g.route == "apart" and g.key is None and "exactly one matrix product" in g.reason for g in sibs)
    # the forward graph's second round: the parts worth a kernel, one-product fragments (a
    # third round is the backward graph's, which has no siblings: one-product fragments and
    # the bias gradients' column fragments, with none)
    assert rounds[0].count(2) == 2 and set(rounds[1]) == {1} and set(rounds[2]) - {0} == {1}
    for sib in sibs:
        gate, up = [g for g in fw.groups if g.apart_of is sib]
        assert gate.op_names[0] in ("mm", "addmm") and "mul" in gate.op_names and gate.route == "kernel"
        assert gate.key and gate.state in ("untuned", "tuned"), gate.describe()
        # LlamaMLP's up projection alone is a lone GEMM (cuBLAS); GeGLU's biased one is addmm
        assert up.route == "bypass" and "lone GEMM" in up.reason or up.key
    assert len(rounds[1]) == sum(g.route == "kernel" for g in fw.groups if g.apart_of is not None)
    served = [g for g in fw.kernels() if g.apart_of is None]
    assert served and all(g.key for g in served)
    refused = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(refused) == 1 and "its two GEMM groups are requested" in refused[0], refused


def test_rest_inductor_still_matches_eager(served):
    """rest="inductor": Inductor's decompositions spell silu as an fp32 chain around
    prims.convert_element_type(x, dtype) (whose dtype argument the pointwise check takes),
    neg, exp, add, div; the pair still forms one sibling group with that chain between the
    products, and forward and gradients match eager, the served groups running as
    fuseml::group extern calls."""
    before = fuseml.runtime.counters["eager"]
    c, (y, grads), (y0, grads0) = compile_run(model(), x3d(), fuseml.FuseMLCompiler(rest="inductor"))
    for a, b in zip([y] + grads, [y0] + grads0):
        assert rel_err(a, b) < 1e-2
    fw = plan(c, "forward")
    sibs = sibling_groups(fw)
    assert len(sibs) == 1 and fw.kernels()
    names = sibs[0].op_names
    assert names.count("mm") == 2 and "exp" in names and "mul" in names
    assert fuseml.runtime.counters["eager"] > before
