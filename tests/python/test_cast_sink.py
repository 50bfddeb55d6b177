"""Casts and copies of SDPA's math path (T5's attention in bf16): a cast (or a scale) read
through views moves past them and fuses with the op that reads them (cast_sink.py); a clone,
and an expand to its own shape, join a group as the value they copy or view; a pointwise
group of per-row values joins the rows group that reads it. Results as eager's; what cannot
be moved or joined stays as it was."""

import torch

from helpers import Fn, close_bf16, compile_run, plan

import fuseml
from fuseml import cast_sink

aten = torch.ops.aten
BF16 = torch.bfloat16


def aten_ops(gm, groups, targets):
    """Nodes of `targets` in gm left outside every group routed to a kernel."""
    fused = {n for g in groups if g.route == "kernel" for n in g.members}
    return [n.name for n in gm.graph.nodes if n.op == "call_function" and n.target in targets and n not in fused]


COPIES = {aten._to_copy.default, aten.clone.default, aten.mul.Scalar, aten.mul.Tensor}


def test_key_cast_and_scale_fuse_with_the_copy(dead_socket, partitioned):
    """k.float(), transposed, scaled and made contiguous for the fp32 bmm: one kernel."""

    def f(k):
        return (k.float().transpose(-2, -1) * 1.0).contiguous() * 1

    k = torch.randn(2, 4, 8, 16, dtype=BF16)
    c, got, want = compile_run(Fn(f), k, train=False)
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=0)
    ((gm, groups),) = partitioned
    assert not aten_ops(gm, groups, COPIES), [g.describe() for g in groups]
    (g,) = [g for g in groups if g.route == "kernel"]
    assert {"_to_copy", "mul", "clone"} <= set(g.op_names), g.describe()
    # the group reads k itself, transposed in place
    assert all(n.meta["val"].dtype == BF16 for n in g.inputs)


def test_output_cast_and_head_merge_are_one_kernel(dead_socket, partitioned):
    """The attention output: fp32 scaled, back to bf16, heads moved next to each other."""

    def f(o):
        o = o * 2.0
        return o.to(BF16).view(2, -1, 8, 16).transpose(1, 2).contiguous().view(2, 8, 64)

    o = torch.randn(2, 4, 8, 16)
    c, got, want = compile_run(Fn(f), o)
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=0)
    torch.testing.assert_close(got[1], want[1], rtol=0, atol=0)
    gm, groups = partitioned[0]
    assert not aten_ops(gm, groups, COPIES), [g.describe() for g in groups]
    # the backward too: the gradient's cast to fp32 and its scale read through the views
    gm, groups = partitioned[1]
    assert not aten_ops(gm, groups, COPIES), [g.describe() for g in groups]


def test_casts_that_gain_nothing_stay_before_their_views(dead_socket, partitioned):
    """Read by a product through a view, or through an expand that broadcasts: unchanged."""
    w = torch.randn(16, 8)

    def f(x):
        a = x.float().t() @ w.t()  # a cast read by a GEMM
        b = x.float().expand(3, 8, 16) + torch.ones(3, 1, 1)  # would be cast 3 times
        return a, b

    x = torch.randn(8, 16, dtype=BF16)
    c, got, want = compile_run(Fn(f), x, train=False)
    for a, b in zip(got[0], want[0]):
        torch.testing.assert_close(a, b)
    ((gm, groups),) = partitioned
    casts = [n for n in gm.graph.nodes if n.target is aten._to_copy.default]
    assert casts and all(tuple(n.meta["val"].shape) == (8, 16) for n in casts), [n.format_node() for n in casts]


def test_sink_casts_leaves_other_graphs_alone():
    gm = torch.fx.symbolic_trace(lambda x: x * 2)
    assert not cast_sink.sink_casts(gm)


def test_clone_and_expand_join_as_aliases(dead_socket, partitioned):
    s = torch.randn(16)

    def f(q):
        x = q.float() * s  # two operands: stays where it is (no cast_sink)
        return x.expand(2, 4, 8, 16).contiguous()

    q = torch.randn(2, 4, 8, 16, dtype=BF16).transpose(1, 2).contiguous().transpose(1, 2)
    c, got, want = compile_run(Fn(f), q, train=False)
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=0)
    assert got[0].is_contiguous()
    ((gm, groups),) = partitioned
    (g,) = [g for g in groups if g.route == "kernel"]
    assert g.op_names == ["_to_copy", "mul", "expand", "clone"], g.describe()
    # one output (the clone's, contiguous), no second copy for the expand
    (out,) = g.built.wire["outputs"]
    assert out["strides"] == [512, 128, 16, 1]


def test_aliases_that_cannot_join_stay_out(dead_socket, partitioned):
    def f(x):
        y = x * 2
        e = y.expand(4, 8)  # read by a view: not worth joining
        z = (x + 1).contiguous(memory_format=torch.channels_last) if x.dim() == 4 else None
        return e.view(32) + 0, y.clone() * 3, z

    x = torch.randn(4, 8)
    c, got, want = compile_run(Fn(f), x, train=False)
    torch.testing.assert_close(got[0][0], want[0][0])
    torch.testing.assert_close(got[0][1], want[0][1])
    ((gm, groups),) = partitioned
    expands = [n for n in gm.graph.nodes if n.target is aten.expand.default]
    fused = {n for g in groups if g.route == "kernel" for n in g.members}
    assert expands and not any(n in fused for n in expands)
    # a clone is an ordinary member: y -> clone -> mul is one group
    assert any({"clone", "mul"} <= set(g.op_names) for g in groups if g.route == "kernel")
    c4 = lambda x: (x + 1).contiguous(memory_format=torch.channels_last) * 2  # noqa: E731
    torch._dynamo.reset()
    x4 = torch.randn(2, 3, 4, 5)
    c, got, want = compile_run(Fn(c4), x4, train=False)
    torch.testing.assert_close(got[0], want[0])
    assert got[0].stride() == want[0].stride()


def test_per_row_values_join_their_rows_group(dead_socket):
    """RMSNorm's backward raises the saved rstd to a power: a pointwise group of per-row
    values (it reads only an input) that the row sum's group takes in."""

    def f(x, r):
        return (x * x).sum(-1, keepdim=True) * r.pow(3) * -0.5 + x

    x, r = torch.randn(8, 64), torch.rand(8, 1) + 0.5
    c = fuseml.FuseMLCompiler()
    got = torch.compile(f, backend=c)(x, r)
    torch.testing.assert_close(got, f(x, r))
    (p,) = c.plans
    (g,) = p.groups
    assert g.kind == "rows" and g.route == "kernel" and "pow" in g.op_names, g.describe()


def test_dynamic_shapes_keep_results(dead_socket):
    """Symbolic sizes and strides: the rewrites leave what they cannot decide without a guard,
    and three batch sizes run through one compiled function with eager's results."""

    def f(k, g):
        return (
            (k.float().transpose(-2, -1) * 1.0).contiguous() * 2,
            (g * k.float()).sum([0, 1]),
            torch.isneginf(k).all(-1, keepdim=True),
        )

    cf = torch.compile(f, backend=fuseml.FuseMLCompiler(), dynamic=True)
    g = torch.randn(8, 8)
    for b in (2, 3, 5):
        k = torch.randn(b, 4, 8, 8, dtype=BF16)
        k[0, 0, 0] = float("-inf")
        for got, want in zip(cf(k, g), f(k, g)):
            torch.testing.assert_close(got, want)


# The causal-LM loss: a cast on either side of the flattening reshape joins the rows group.
def _loss(x, labels):
    # what transformers' ForCausalLMLoss does with [B, S, V] logits: upcast, flatten, and the
    # log_softmax + nll_loss that cross_entropy is (spelled out: cross_entropy itself is
    # rewritten before these casts are seen, cross_entropy.py)
    logp = torch.nn.functional.log_softmax(x.float().view(-1, x.shape[-1]), -1)
    return torch.nn.functional.nll_loss(logp, labels)


def test_loss_casts_join_the_rows_groups(dead_socket):
    torch.manual_seed(0)
    labels = torch.randint(0, 96, (2 * 8,))
    c, got, want = compile_run(Fn(lambda x: _loss(x, labels)), torch.randn(2, 8, 96, dtype=BF16))
    close_bf16(got, want)
    fw, bw = plan(c, "forward"), plan(c, "backward")
    # forward: the upcast runs inside log_softmax's rows group, not as a lone copy
    assert any({"_to_copy", "amax"} <= set(g.op_names) for g in fw.groups if g.kind == "rows"), fw.describe()
    assert not [g for g in fw.groups if g.op_names == ["_to_copy"]], fw.describe()
    # backward: the downcast of the gradient joins its rows group
    assert any({"_to_copy", "sum"} <= set(g.op_names) for g in bw.groups if g.kind == "rows"), bw.describe()
    assert not [g for g in bw.groups if g.op_names == ["_to_copy"]], bw.describe()


def _graph(f, *xs):
    """f's ATen graph with fake values (what the backend partitions)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    mode = FakeTensorMode()
    with mode:
        fakes = [mode.from_tensor(x) for x in xs]
        return make_fx(f)(*fakes)


def _targets(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def test_casts_move_to_a_rows_reader_or_producer_and_their_limits():
    # to the reader: view(cast(x)) read by a row reduction -> cast(view(x))
    gm = _graph(lambda x: x.float().view(-1, 16).amax(-1, keepdim=True), torch.randn(2, 4, 16, dtype=BF16))
    assert cast_sink.sink_casts(gm)
    ts = _targets(gm)
    assert ts.index(aten.view.default) < ts.index(aten._to_copy.default), ts
    x = torch.randn(2, 4, 16, dtype=BF16)
    torch.testing.assert_close(gm(x), x.float().view(-1, 16).amax(-1, keepdim=True))
    # to the producer: cast(view(a fused value)) read by nothing fused -> view(cast(...)); the
    # output keeps its layout
    f = lambda x: (x.float() - x.float().amax(-1, keepdim=True)).view(2, 4, 16).to(BF16)  # noqa: E731
    gm = _graph(f, torch.randn(8, 16, dtype=BF16))
    assert cast_sink.sink_casts(gm)
    ts = _targets(gm)
    assert ts[-1] == aten.view.default, ts
    x = torch.randn(8, 16, dtype=BF16)
    torch.testing.assert_close(gm(x), f(x))
    # not when the cast has a fusible reader: it fuses there already
    f2 = lambda x, t: (x.float() - x.float().amax(-1, keepdim=True)).view(2, 4, 16).to(BF16) + t  # noqa: E731
    gm = _graph(f2, torch.randn(8, 16, dtype=BF16), torch.randn(2, 4, 16, dtype=BF16))
    assert not cast_sink.sink_casts(gm)
    # no view of the new operand: the cast of a padded slice is contiguous, the slice is not,
    # so flattening it is no view: the pair stays
    g = lambda x: x[:, :16].float().view(-1).amax(-1, keepdim=True)  # noqa: E731
    gm = _graph(g, torch.randn(8, 20, dtype=BF16))
    assert not cast_sink.sink_casts(gm)
    x = torch.randn(8, 20, dtype=BF16)
    torch.testing.assert_close(gm(x), g(x))
    # an operand laid out otherwise than the cast's result (a padded GEMM output's rows, the
    # logits): the cast moves when the views take the padded layout and its result comes out
    # laid out as before (a flattening of whole rows) ...
    p = lambda x: x[..., :16].float().view(-1, 16).amax(-1, keepdim=True)  # noqa: E731
    gm = _graph(p, torch.randn(2, 4, 20, dtype=BF16))
    assert cast_sink.sink_casts(gm)
    ts = _targets(gm)
    assert ts.index(aten.view.default) < ts.index(aten._to_copy.default), ts
    x = torch.randn(2, 4, 20, dtype=BF16)
    torch.testing.assert_close(gm(x), p(x))
    # ... and stays where the moved cast's result would be laid out otherwise than the value
    # its readers were traced with (here that value's recorded layout is made column-major)
    gm = _graph(p, torch.randn(2, 4, 20, dtype=BF16))
    view = next(n for n in gm.graph.nodes if n.target is aten.view.default)
    traced = view.meta["val"]
    view.meta["val"] = traced.as_strided(traced.shape, (1, traced.shape[0]))
    assert not cast_sink.sink_casts(gm)
    assert _targets(gm).index(aten._to_copy.default) < _targets(gm).index(aten.view.default)

    # a cast read twice stays (moving it would compute it twice)
    def h(x):
        y = x.float()
        return y.view(-1, 16).amax(-1, keepdim=True), y

    gm = _graph(h, torch.randn(2, 4, 16, dtype=BF16))
    assert not cast_sink.sink_casts(gm)


def test_a_per_channel_cast_moves_past_the_views_memory_order_makes():
    """Batch norm's running variance cast to fp32, then seen per channel through the
    unsqueezes and the permute that memory order makes for a channels-last reader: the cast
    moves next to the reader (the backend runs sink_casts again after memory order)."""
    f = lambda x, v: x * v.float().unsqueeze(-1).unsqueeze(-1).unsqueeze(0).permute(0, 2, 3, 1)  # noqa: E731
    x, v = torch.randn(2, 5, 6, 8), torch.randn(8, dtype=BF16)
    gm = _graph(f, x, v)
    assert cast_sink.sink_casts(gm)
    ts = _targets(gm)
    assert ts.index(aten.permute.default) < ts.index(aten._to_copy.default), ts
    torch.testing.assert_close(gm(x, v), f(x, v))


def test_a_large_value_read_by_several_groups_stays_with_its_producer(dead_socket, partitioned):
    """Rotary angles at a real size ([512, 64] per position): cos and sin of the cat, cast to
    bf16, read through an unsqueeze by q's and k's groups. Moved past the unsqueeze, the casts
    and cos/sin would join neither reader (each would compute 32768 cosines again per head)
    and only leave the cat's group: they stay, one group for the angles."""

    def f(freqs, q, k):
        emb = torch.cat((freqs, freqs), -1)
        cos, sin = (emb.cos() * 1.0).to(BF16).unsqueeze(1), (emb.sin() * 1.0).to(BF16).unsqueeze(1)
        return q * cos + k * sin, k * cos - q * sin

    torch.manual_seed(0)
    freqs = torch.randn(1, 512, 32)
    q, k = torch.randn(1, 2, 512, 64, dtype=BF16), torch.randn(1, 2, 512, 64, dtype=BF16)
    c = fuseml.FuseMLCompiler()
    got = torch.compile(f, backend=c)(freqs, q, k)
    for a, b in zip(got, f(freqs, q, k)):
        torch.testing.assert_close(a, b)
    ((gm, groups),) = partitioned
    assert any({"cat", "cos", "sin", "_to_copy"} <= set(g.op_names) for g in groups), [g.describe() for g in groups]
