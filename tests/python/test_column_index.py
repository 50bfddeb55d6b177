"""The column index computed in the kernel (vocabulary 11, column_index.py): cross-entropy's
forward and backward groups spell `torch.arange(C)` along their last dim as the fragment's
`iota` and do not read it; an arange along another dim, of another length or a dtype that
would not hold it exactly stays an input; the rewritten graph (the group still handed the
arange, for its ATen ops) computes what eager does; a real fusemld accepts the fragments."""

import torch

from helpers import Fn, compile_run

from fuseml import column_index
from fuseml.cross_entropy import fused_cross_entropy

aten = torch.ops.aten


def loss_of(t):
    """Each row's cross-entropy against targets t (closed over: a constant of the graph)."""
    return Fn(lambda x: fused_cross_entropy(x, t, reduction="none"))


def logits_and_targets(rows=8, cols=37, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=g)
    t = torch.randint(0, cols, (rows,), generator=g)
    t[1] = -100  # ignored
    return x, t


def call(target, args, val, **kwargs):
    g = torch.fx.Graph()
    n = g.call_function(target, args, kwargs)
    n.meta["val"] = val
    return n


def test_which_aranges_are_columns():
    f32 = dict(dtype=torch.float32)
    # arange(C), arange(0, C), arange(s, s + C) of step 1: the column plus s
    assert column_index.column_start(call(aten.arange.default, (37,), torch.arange(37.0), **f32), (8, 37)) == 0
    assert column_index.column_start(call(aten.arange.start, (5, 42), torch.arange(5.0, 42.0)), (8, 37)) == 5
    ss = call(aten.arange.start_step, (0, 37, 1), torch.arange(37))
    assert column_index.column_start(ss, (2, 8, 37)) == 0
    # [1, C] is along the last dim too; [C, 1] is not, nor is another length or a step
    assert column_index.column_start(call(aten.arange.default, (37,), torch.arange(37.0).view(1, 37)), (8, 37)) == 0
    assert column_index.column_start(call(aten.arange.default, (8,), torch.arange(8.0).view(8, 1)), (8, 37)) is None
    assert column_index.column_start(call(aten.arange.default, (36,), torch.arange(36.0)), (8, 37)) is None
    assert column_index.column_start(call(aten.arange.start_step, (0, 74, 2), torch.arange(0, 74, 2)), (8, 37)) is None
    # bf16 holds no large column exactly; f32 none past 2^24
    assert (
        column_index.column_start(call(aten.arange.default, (37,), torch.arange(37, dtype=torch.bfloat16)), (8, 37))
        is None
    )
    big = 1 << 24
    far = call(aten.arange.start, (big, big + 4), torch.empty(4))
    assert column_index.column_start(far, (2, 4)) is None


def test_a_constant_arange_is_a_column():
    gm = torch.fx.GraphModule(torch.nn.Module(), torch.fx.Graph())
    gm.register_buffer("cols", torch.arange(3, 40, dtype=torch.int64))
    gm.register_buffer("other", torch.tensor([0, 2, 1]))
    n = gm.graph.get_attr("cols")
    n.meta["val"] = gm.cols
    assert column_index.column_start(n, (4, 37)) == 3
    m = gm.graph.get_attr("other")
    m.meta["val"] = gm.other
    assert column_index.column_start(m, (4, 3)) is None


def iota_groups(c):
    return [
        g
        for p in c.plans
        for g in p.groups
        if g.built is not None and any(op["op"] == "iota" for op in g.built.wire["ops"])
    ]


def test_cross_entropy_computes_its_columns(served):
    x, t = logits_and_targets()
    c, got, want = compile_run(loss_of(t), x)
    torch.testing.assert_close(got[0], want[0])
    torch.testing.assert_close(got[1][0], want[1][0])
    found = iota_groups(c)
    assert sorted(g.kind for g in found) == ["pointwise", "rows"], [g.describe() for p in c.plans for g in p.groups]
    for g in found:
        assert g.built.wire["vocab"] == 11
        assert g.built.read is not None and len(g.built.read) == len(g.built.wire["inputs"]) < len(g.inputs)
        assert [g.inputs[j] for j in g.built.read] == list(g.built.in_nodes)


def test_an_arange_across_rows_stays_an_input(served):
    def scaled(x):  # each row times its index: arange(R) along dim 0
        return x * torch.arange(x.shape[0], dtype=x.dtype).unsqueeze(-1) + 1.0

    x = torch.randn(8, 37)
    c, got, want = compile_run(Fn(scaled), x, train=False)
    torch.testing.assert_close(got[0], want[0])
    assert not iota_groups(c)


def test_daemon_accepts_iota_fragments(daemon):
    x, t = logits_and_targets(seed=1)
    c, got, want = compile_run(loss_of(t), x)
    torch.testing.assert_close(got[0], want[0])
    ks = [g for p in c.plans for g in p.kernels()]
    with_iota = [g for g in ks if any(op["op"] == "iota" for op in g.built.wire["ops"])]
    assert len(with_iota) == 2
    assert all(g.key and g.state in ("untuned", "tuned") for g in with_iota), [(g.describe(), g.reason) for g in ks]
