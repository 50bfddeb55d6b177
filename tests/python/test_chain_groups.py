"""Chain groups: back-to-back GEMMs (an MLP block's fc1 -> gelu -> fc2 -> + x) fused into one
vocabulary-3 fragment with two products in sequence (PROTOCOL.md, GEMM fragments, "Chains").
What the partitioner merges and what it must keep apart, the fragment, the rewritten graph
against eager, the launch layout, explain, and round trips through a real fusemld
(compile-only here): a chain the daemon refuses runs as its two GEMM groups, never as ATen
whole."""

import io
import logging

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from helpers import compile_run, plan
from models import ActivationHeavyMLP, StackedTransformerMLP, TransformerMLP
from test_runtime import _runners, standin  # noqa: F401  (the stand-in launch fixture)

import fuseml
from fuseml import chains as chain_rules
from fuseml import transport

BF16 = torch.bfloat16
aten = torch.ops.aten
D, FF = 256, 1024  # bench's memory_bound shape (M = 16384 there; 64 rows here)
ROWS = 64


@pytest.fixture(autouse=True)
def chains_on(monkeypatch):
    """Chains are on by default (FUSEML_CHAINS=0 turns them off); these tests are about what
    they do when on, whatever the environment running them says. The client forms
    them from MIN_ROWS rows (8192: the kernel's break-even, where the daemon serves them);
    these tests run 64 rows on a CPU, so the floor is lowered here (test_few_rows_stay_apart
    checks the real one; a real daemon answers such a chain bypass and it runs apart)."""
    monkeypatch.setenv("FUSEML_CHAINS", "1")
    monkeypatch.setattr(chain_rules, "MIN_ROWS", 1)


def test_few_rows_stay_apart(dead_socket, caplog, monkeypatch):
    monkeypatch.setattr(chain_rules, "MIN_ROWS", 8192)
    caplog.set_level(logging.DEBUG, logger="fuseml")
    c, got, want = compile_run(mlp(), x2d(), train=False)
    exact(got, want)
    p = plan(c, "inference")
    assert not chains(p) and len(gemm_groups(p)) == 2
    assert "M = 64 (the chain kernel pays from 8192 rows" in caplog.text
    torch._dynamo.reset()
    c, got, want = compile_run(mlp(), x2d(rows=8192), train=False)
    exact(got, want)
    assert len(chains(plan(c, "inference"))) == 1


def mlp(cls=TransformerMLP, d=D, ff=FF, seed=0):
    torch.manual_seed(seed)
    return cls(d, ff).to(BF16)


def x2d(rows=ROWS, d=D, seed=1):
    return torch.randn(rows, d, generator=torch.Generator().manual_seed(seed)).to(BF16)


def chains(p):
    return [g for g in p.groups if g.chain]


def gemm_groups(p):
    return [g for g in p.groups if g.kind == "gemm"]


def exact(got, want):
    (y, grads), (y0, grads0) = got, want
    torch.testing.assert_close(y, y0, rtol=0, atol=0)
    for g, g0 in zip(grads, grads0):
        torch.testing.assert_close(g, g0, rtol=0, atol=0)


def products(wire):
    return [op for op in wire["ops"] if op["op"] in ("mm", "addmm")]


# -- partitioning and the fragment --------------------------------------------------------


def test_mlp_block_inference_is_one_chain_group(dead_socket):
    c, got, want = compile_run(mlp(), x2d(), train=False)
    exact(got, want)
    p = plan(c, "inference")
    (ch,) = chains(p)
    assert len(gemm_groups(p)) == 1 and not ch.siblings
    assert ch.route == "kernel" and ch.op_names == ["addmm", "gelu", "addmm", "add"]
    assert not ch.escapes and [n.name for n in ch.outputs] == ["add"]
    p1, _, p2, add = ch.members
    x, w1t, w2t = p1.args[1], p1.args[2], p2.args[2]
    assert p2.args[1] is ch.members[1]  # the second product's A is gelu(p1)
    assert add.args[1] is x  # the residual is x itself
    # the group is called with x twice: once the first product's A, once the residual
    assert ch.inputs == [p1.args[0], x, w1t, p2.args[0], w2t, x]
    assert ch.parts == [[p1, ch.members[1]], [p2, add]]
    w = ch.built.wire
    assert w["vocab"] == 3 and w["m_hint"] == ROWS and ch.built.chain
    assert w["inputs"] == [
        {"id": 0, "dtype": "bf16", "shape": [1, FF], "strides": [0, 1], "align": 16},  # b1
        {"id": 1, "dtype": "bf16", "shape": [-1, D], "strides": [D, 1], "align": 16},  # x
        {"id": 2, "dtype": "bf16", "shape": [D, FF], "strides": [1, D], "align": 16},  # W1.t()
        {"id": 3, "dtype": "bf16", "shape": [1, D], "strides": [0, 1], "align": 16},  # b2
        {"id": 4, "dtype": "bf16", "shape": [FF, D], "strides": [1, FF], "align": 16},  # W2.t()
        {"id": 5, "dtype": "bf16", "shape": [-1, D], "strides": [D, 1], "align": 16},
    ]  # x again
    assert w["ops"] == [
        {"op": "addmm", "out": 6, "args": [0, 1, 2]},
        {"op": "gelu", "out": 7, "args": [6]},
        {"op": "addmm", "out": 8, "args": [3, 7, 4]},
        {"op": "add", "out": 9, "args": [8, 5]},
    ]
    assert w["outputs"] == [{"id": 9, "dtype": "bf16", "shape": [-1, D], "strides": [D, 1], "align": 16}]
    assert ch.built.layout.k == 1 and ch.built.full_input == 1 and ch.built.out_views is None


def test_three_d_input_chains_through_the_views(dead_socket):
    """nn.Linear on [B, S, D]: the product seen as [B, S, N1], gelu, and seen as [B*S, N1]
    again is a round trip that goes (view_sink.py): gelu reads the product and the second
    product reads gelu; the [B, S, D] residual is a stage-2 input of its own."""
    x = x2d().view(2, ROWS // 2, D)
    c, got, want = compile_run(mlp(), x, train=False)
    exact(got, want)
    (ch,) = chains(plan(c, "inference"))
    assert ch.op_names == ["addmm", "gelu", "addmm", "_unsafe_view", "add"]
    w = ch.built.wire
    assert [o["op"] for o in w["ops"]] == ["addmm", "gelu", "addmm", "add"]
    first, second = products(w)
    assert second["args"][1] == w["ops"][1]["out"]  # p2's A: gelu's value, no view op
    assert w["inputs"][first["args"][1]]["shape"][1] == D
    assert w["inputs"][second["args"][2]]["shape"] == [FF, D]
    assert ch.built.out_views == [(2, ROWS // 2, D)]


def test_activation_heavy_stage_one_takes_every_op(dead_socket):
    c, got, want = compile_run(mlp(ActivationHeavyMLP), x2d(), train=False)
    exact(got, want)
    (ch,) = chains(plan(c, "inference"))
    assert ch.op_names == ["addmm", "gelu", "mul", "add", "addmm", "add"]
    ops = [o["op"] for o in ch.built.wire["ops"] if o["op"] != "const"]
    assert ops == ["addmm", "gelu", "mul", "add", "addmm", "add"]


def test_stacked_mlp_is_four_chains(served):
    c, got, want = compile_run(mlp(StackedTransformerMLP), x2d(), train=False)
    exact(got, want)
    p = plan(c, "inference")
    assert len(chains(p)) == 4 and len(gemm_groups(p)) == 4
    assert all(g.op_names == ["addmm", "gelu", "addmm", "add"] for g in chains(p))
    # one block's output is the next block's x and residual: read twice, so no chain across
    assert all(len(products(g.built.wire)) == 2 for g in chains(p))


def test_training_forward_saves_the_intermediate_no_chain(dead_socket):
    c, got, want = compile_run(mlp(), x2d())
    exact(got, want)
    fw = plan(c, "forward")
    assert not chains(fw)
    first, second = gemm_groups(fw)
    assert first.op_names == ["addmm", "gelu"] and second.op_names == ["addmm", "add"]
    # autograd saves gelu's input and output for backward: the intermediate escapes
    assert first.outputs and any(n.name == "addmm" for n in first.outputs)
    assert not chains(plan(c, "backward"))


@pytest.mark.parametrize("d,ff,why", [(1024, 1024, "K1 = 1024"), (256, 1000, "N1 = 1000"), (96, 1024, "K1 = 96")])
def test_shapes_the_chain_kernel_cannot_run_stay_two_groups(dead_socket, caplog, d, ff, why):
    caplog.set_level(logging.DEBUG, logger="fuseml")
    c, got, want = compile_run(mlp(d=d, ff=ff), x2d(d=d), train=False)
    exact(got, want)
    p = plan(c, "inference")
    assert not chains(p)
    assert [g.op_names for g in gemm_groups(p)] == [["addmm", "gelu"], ["addmm", "add"]]
    assert why in caplog.text


def test_chains_option_and_environment(dead_socket, monkeypatch):
    for compiler in (
        lambda: fuseml.FuseMLCompiler(chains=False),
        lambda: monkeypatch.setenv("FUSEML_CHAINS", "0") or fuseml.FuseMLCompiler(),
    ):
        torch._dynamo.reset()
        c, got, want = compile_run(mlp(), x2d(), compiler(), train=False)
        exact(got, want)
        p = plan(c, "inference")
        assert not chains(p) and len(gemm_groups(p)) == 2
    # the default: on
    monkeypatch.delenv("FUSEML_CHAINS")
    torch._dynamo.reset()
    c, got, want = compile_run(mlp(), x2d(), fuseml.FuseMLCompiler(), train=False)
    exact(got, want)
    assert len(chains(plan(c, "inference"))) == 1
    # an explicit chains=True wins over the environment
    torch._dynamo.reset()
    c, _, _ = compile_run(mlp(), x2d(), fuseml.FuseMLCompiler(chains=True), train=False)
    assert len(chains(plan(c, "inference"))) == 1


class Leaky(nn.Module):
    """The intermediate is also returned: it must be written, so no chain."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(D, FF), nn.Linear(FF, D)

    def forward(self, x):
        h = F.gelu(self.fc1(x))
        return self.fc2(h) + x, h


class RowMajorWeights(nn.Module):
    """x @ W1 with W1 [K, N] row-major: not the K-major weights the chain kernel reads."""

    def __init__(self):
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(D, FF) / D**0.5)
        self.w2 = nn.Parameter(torch.randn(FF, D) / FF**0.5)

    def forward(self, x):
        return F.relu(x @ self.w1) @ self.w2 + x


@pytest.mark.parametrize("make,why", [(Leaky, "other users"), (RowMajorWeights, "K-major")])
def test_what_stays_apart(dead_socket, caplog, make, why):
    caplog.set_level(logging.DEBUG, logger="fuseml")
    torch.manual_seed(0)
    m = make().to(BF16)
    c = fuseml.FuseMLCompiler()
    with torch.no_grad():
        got, want = torch.compile(m, backend=c)(x2d()), m(x2d())
    for a, b in zip(got if isinstance(got, tuple) else [got], want if isinstance(want, tuple) else [want]):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    p = plan(c, "inference")
    assert not chains(p) and len(gemm_groups(p)) == 2
    assert why in caplog.text


def test_a_mutation_between_the_groups_keeps_them_apart():
    def f(x, w1, w2, y):
        h = F.gelu(x @ w1)
        y.add_(1)
        return torch.relu(h @ w2)

    args = [x2d(), torch.randn(FF, D).to(BF16).t(), torch.randn(D, FF).to(BF16).t(), torch.randn(4)]
    gm = torch.fx.experimental.proxy_tensor.make_fx(f)(*args)
    groups = fuseml.find_groups(gm)
    assert not any(g.chain for g in groups) and len([g for g in groups if g.kind == "gemm"]) == 2
    gm = torch.fx.experimental.proxy_tensor.make_fx(lambda x, w1, w2: torch.relu(F.gelu(x @ w1) @ w2))(*args[:3])
    assert [g.op_names for g in fuseml.find_groups(gm) if g.chain] == [["mm", "gelu", "mm", "relu"]]
    assert not any(g.chain for g in fuseml.find_groups(gm, chains=False))


@pytest.mark.parametrize("n2,chained", [(192, True), (200, False), (512, False)])
def test_n2_limits(n2, chained):
    """N2 (the second product's columns) a multiple of 16 up to 256: the b2b kernel's rows."""
    args = [x2d(), torch.randn(FF, D).to(BF16).t(), torch.randn(n2, FF).to(BF16).t()]
    gm = torch.fx.experimental.proxy_tensor.make_fx(lambda x, w1, w2: torch.relu(F.gelu(x @ w1) @ w2))(*args)
    assert [g.chain for g in fuseml.find_groups(gm) if g.kind == "gemm"] == ([True] if chained else [False, False])


# -- the rewritten graph, the launch layout, explain ---------------------------------------


def test_rewritten_graph_matches_eager(served):
    """The chain group as one call in the rewritten graph; on CPU its runner runs the ATen
    nodes of both original groups: the result is eager's, bit for bit."""
    before = fuseml.runtime.counters["eager"]
    c, got, want = compile_run(mlp(), x2d(), train=False)
    exact(got, want)
    (ch,) = chains(plan(c, "inference"))
    assert ch.key and fuseml.runtime.counters["eager"] == before + 1
    (r,) = [r for r in _runners(c) if r.built.chain]
    # the ATen fallback: the two groups' nodes, nothing else
    assert [t for t, _, _ in r.steps] == [aten.addmm.default, aten.gelu.default, aten.addmm.default, aten.add.Tensor]
    assert len(served.rounds) == 1 and len(served.rounds[0]) == 1  # one fragment, one round
    torch._dynamo.reset()
    c, got, want = compile_run(mlp(), x2d().view(2, ROWS // 2, D), train=False)
    exact(got, want)


def test_dynamic_m_shares_the_fragment(dead_socket):
    """M symbolic (a second batch size recompiles with a dynamic dim 0): the chain forms with
    K1, N1, N2 static and the fragment differs only in m_hint."""
    c = fuseml.FuseMLCompiler()
    m = mlp()
    f = torch.compile(m, backend=c)
    wires = []
    for rows in (16, 24):
        with torch.no_grad():
            torch.testing.assert_close(f(x2d(rows)), m(x2d(rows)), rtol=0, atol=0)
        (ch,) = chains(c.plans[-1])
        wires.append(ch.built.wire)
    assert [w["m_hint"] for w in wires] == [16, 24]
    assert not isinstance(ch.members[0].meta["val"].shape[0], int)  # the second: symbolic
    assert [{k: v for k, v in w.items() if k != "m_hint"} for w in wires][0] == {
        k: v for k, v in wires[1].items() if k != "m_hint"
    }


def test_launch_passes_x_twice(dead_socket, standin):  # noqa: F811
    c, _, _ = compile_run(mlp(), x2d(), train=False)
    (r,) = [r for r in _runners(c) if r.built.chain]
    x = x2d()
    xs = [
        torch.randn(FF).to(BF16),
        x,
        torch.randn(FF, D).to(BF16).t(),
        torch.randn(D).to(BF16),
        torch.randn(D, FF).to(BF16).t(),
        x,
    ]
    r.kernel = ("k" * 64, "tuned", b"", {})
    got = r._launch(xs, torch.device("cpu"), r.kernel[0], b"", {})
    want = r.eager(xs)
    assert [(o.shape, o.stride(), o.dtype) for o in got] == [(o.shape, o.stride(), o.dtype) for o in want]
    assert standin.calls == [(6, 1, ROWS)]  # six inputs, one output, outer = M


def test_explain_shows_the_chain_group(dead_socket):
    buf = io.StringIO()
    with torch.no_grad():
        rows = fuseml.explain(mlp(), x2d(), file=buf)
    assert "[gemm chain] addmm -> gelu -> addmm -> add: eager gemm" in buf.getvalue()
    (r,) = [r for r in rows if r["chain"]]
    assert r["kind"] == "gemm" and not r["siblings"] and r["apart_of"] is None


# -- a real fusemld (compile-only without a GPU) --------------------------------------------


def _served_or_apart(ch, groups):
    """Chain group ch was answered with a kernel, or it was refused and its two GEMM groups
    (among `groups`) were requested apart, each answered on its own: never ATen for the whole
    chain. Returns "chain" or "apart"."""
    if ch.route == "kernel":
        assert ch.key and ch.state in ("untuned", "tuned"), ch.describe()
        assert not [g for g in groups if g.apart_of is ch]
        return "chain"
    assert ch.route == "apart" and ch.reason, ch.describe()
    parts = [g for g in groups if g.apart_of is ch]
    assert [g.op_names for g in parts] == [["addmm", "gelu"], ["addmm", "add"]]
    assert all(g.route == "kernel" and (g.key or g.reason) for g in parts), [g.describe() for g in parts]
    return "apart"


def test_daemon_serves_the_chain_or_runs_it_apart(daemon):
    keys = []
    for rows in (48, 60):  # one M bucket: the second is a store hit
        torch._dynamo.reset()
        c, got, want = compile_run(mlp(), x2d(rows), train=False)
        exact(got, want)
        p = plan(c, "inference")
        (ch,) = chains(p)
        how = _served_or_apart(ch, p.groups)
        keys.append(sorted((g.key, g.origin) for g in p.groups if g.key))
    assert [k for k, _ in keys[0]] == [k for k, _ in keys[1]]
    assert all(o == "hit" for _, o in keys[1])
    if how == "apart":  # an older daemon: both parts served (compile-only: untuned)
        assert len(keys[0]) == 2
    torch._dynamo.reset()
    c, got, want = compile_run(mlp(StackedTransformerMLP), x2d(), train=False)
    exact(got, want)
    p = plan(c, "inference")
    assert len(chains(p)) == 4 and all(_served_or_apart(ch, p.groups) == how for ch in chains(p))


def test_refused_chain_runs_as_its_two_groups(daemon, caplog, monkeypatch):
    """A daemon that refuses chains (an older one, a GPU without the b2b kernel; simulated:
    every fragment whose second product reads a computed A is answered as the old daemon
    answers it): the chain's two GEMM groups are requested in a second round and served
    apart; one warning says so, and the result is eager's."""
    caplog.set_level(logging.WARNING, logger="fuseml")
    real = transport.compile_all
    rounds = []

    def is_chain(w):
        inputs = {i["id"] for i in w["inputs"]}
        return any(p["args"][-2] not in inputs for p in products(w))

    def old_daemon(conn, wires, timeout):
        rounds.append([is_chain(w) for w in wires])
        mine = [w for w in wires if not is_chain(w)]
        got = iter(real(conn, mine, timeout) if mine else [])
        return [
            {
                "ok": False,
                "code": "unsupported",
                "message": "fragment not supported",
                "detail": "ops[2].args[1]: the matrix operands must be fragment inputs",
            }
            if is_chain(w)
            else next(got)
            for w in wires
        ]

    monkeypatch.setattr(fuseml.backend.transport, "compile_all", old_daemon)
    c, got, want = compile_run(mlp(StackedTransformerMLP), x2d(), train=False)
    exact(got, want)
    p = plan(c, "inference")
    assert rounds == [[True] * 4, [False] * 8]  # 4 chains, then their 8 groups in one round
    assert all(_served_or_apart(ch, p.groups) == "apart" for ch in chains(p))
    assert all("matrix operands must be fragment inputs" in ch.reason for ch in chains(p))
    parts = [g for g in p.groups if g.apart_of is not None]
    assert len(parts) == 8 and all(g.key and g.state in ("untuned", "tuned") for g in parts)
    assert len({g.gid for g in p.groups}) == len(p.groups)
    refused = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(refused) == 1 and "gemm chain group" in refused[0], refused
    # explain lists the refused chain and, under it, its two groups
    rows = fuseml.plan_view.groups(c)
    apart = [r for r in rows if r["route"] == "apart"]
    assert len(apart) == 4 and all(r["strategy"].startswith("apart gemm") for r in apart)
    assert sum(r["apart_of"] is not None for r in rows) == 8


def test_a_chain_spelled_wrong_is_split_before_sending(served, monkeypatch):
    """A chain the fragment builder cannot spell is split at once: its two groups go in the
    first round, and nothing runs as ATen whole."""

    def refuse(*a, **k):
        raise fuseml.Unfusable("simulated")

    monkeypatch.setattr(fuseml.backend, "build_chain", refuse)
    c, got, want = compile_run(mlp(), x2d(), train=False)
    exact(got, want)
    p = plan(c, "inference")
    (ch,) = chains(p)
    assert ch.route == "apart" and ch.reason == "simulated"
    assert [g.op_names for g in p.kernels()] == [["addmm", "gelu"], ["addmm", "add"]]
    assert len(served.rounds) == 1 and len(served.rounds[0]) == 2
