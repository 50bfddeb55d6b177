"""Column groups (vocabulary 5): the bias gradients of a training step's backward
(grad.sum(0) of an [M, N] value) found as one group each and spelled as column fragments
(one reduction over dim 0, a per-column [1, N] output at its own shape whatever M is); what is
not a column reduction stays as it was; the rewritten graph computes eager's gradients on the
CPU; a real fusemld (compile-only here) accepts the fragments and serves a columns kernel."""

import pytest
import torch

from helpers import Fn, close_bf16, compile_run, plan
from models import MODELS

import fuseml

BF16 = torch.bfloat16


def columns(p):
    return [g for g in p.groups if g.kind == "columns"]


def test_bias_gradients_are_column_groups(dead_socket):
    model = MODELS["mlp"]().to(BF16)
    c, got, want = compile_run(model, torch.randn(16, 32, dtype=BF16))
    close_bf16(got, want)
    bw = plan(c, "backward")
    gs = columns(bw)
    assert len(gs) == 2  # b1's and b2's gradients
    widths = sorted(g.members[0].args[0].meta["val"].shape[1] for g in gs)
    assert widths == [32, 64]
    for g in gs:
        assert g.route == "kernel" and g.op_names == ["sum"]
        w = g.built.wire
        assert w["vocab"] == 5
        [op] = w["ops"]
        assert (op["op"], op["dim"], op["keepdim"]) == ("sum", 0, True)
        [x] = w["inputs"]
        n = x["shape"][1]
        assert x["shape"] == [16, n] and x["dtype"] == "bf16"
        [o] = w["outputs"]
        assert o["shape"] == [1, n] and o["strides"] == [n, 1] and o["dtype"] == "bf16"
        assert g.built.out_fixed == [([1, n], [n, 1])]
    assert not any(g.kind == "reduction" for g in bw.groups)  # no bias sum left unplanned


def test_symbolic_m_keeps_the_output_per_column(dead_socket):
    """With M dynamic (dynamo makes dim 0 symbolic at the second batch size) the input's dim 0
    is the symbolic -1 and the output stays [1, N]: one kernel for every batch size."""
    f = lambda x: (x * 2.0).sum(0, keepdim=True)  # noqa: E731
    compiled = torch.compile(Fn(f), backend=(c := fuseml.FuseMLCompiler()))
    for m in (5, 9):
        x = torch.randn(m, 48)
        torch.testing.assert_close(compiled(x), f(x))
    g = [g for p in c.plans for g in columns(p)][-1]
    [x] = g.built.wire["inputs"]
    assert x["shape"] == [-1, 48] and g.built.wire["outputs"][0]["shape"] == [1, 48]
    # the M at hand travels as the hint (the daemon tunes for its bucket); a static M has none
    assert g.built.wire["m_hint"] == 9
    static = [g for p in c.plans for g in columns(p)][0]
    assert static.built.wire["inputs"][0]["shape"] == [5, 48] and "m_hint" not in static.built.wire


@pytest.mark.parametrize(
    "f",
    [
        lambda x: (x * 2).sum(-1, keepdim=True),  # the last dim: a rows group
        # dim 0 of a 3-D value not contiguous (a contiguous one is a column group of its 2-D
        # view: test_leading_columns.py)
        lambda x: (x * 2).view(2, 4, 16).transpose(1, 2).sum(0),
        lambda x: (x * 2).sum(0, dtype=torch.float32),  # another dtype
        lambda x: (x * 2).var(0),  # var over dim 0
    ],
    ids=["last-dim", "3-d-strided", "dtype", "var"],
)
def test_what_is_not_a_column_reduction_is_no_column_group(dead_socket, f):
    c, got, want = compile_run(Fn(f), torch.randn(8, 16), train=False)
    (p,) = c.plans
    assert not columns(p)
    torch.testing.assert_close(got[0], want[0])


@pytest.mark.parametrize("keepdim", [True, False])
def test_rewritten_graph_matches_eager(served, keepdim):
    """Served (a stand-in transport), the column groups run through their runners: the
    gradients and a keepdim=False mean are eager's."""
    model = MODELS["mlp"]()
    c, got, want = compile_run(model, torch.randn(12, 32))
    torch.testing.assert_close(got[0], want[0])
    for a, b in zip(got[1], want[1]):
        torch.testing.assert_close(a, b)
    assert len(columns(plan(c, "backward"))) == 2
    torch._dynamo.reset()
    f = lambda x: (x * 0.5).mean(0, keepdim=keepdim)  # noqa: E731
    c, got, want = compile_run(Fn(f), torch.randn(12, 24), train=False)
    torch.testing.assert_close(got[0], want[0])
    [g] = [g for g in c.plans[-1].groups if g.kind == "columns"]
    assert g.built.wire["outputs"][0]["shape"] == ([1, 24] if keepdim else [24])


def test_daemon_serves_column_fragments(daemon):
    """The real daemon (compile-only here) accepts both bias gradients of a bf16 training
    step: each answered with a columns kernel, not a bypass."""
    model = MODELS["mlp"]().to(BF16)
    c, got, want = compile_run(model, torch.randn(16, 32, dtype=BF16))
    close_bf16(got, want)
    gs = columns(plan(c, "backward"))
    assert len(gs) == 2
    for g in gs:
        assert g.key and g.state in ("untuned", "tuned"), g.describe()
