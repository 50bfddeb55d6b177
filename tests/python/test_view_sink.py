"""A reshape or a broadcast between two pointwise ops moves below the second, so that the two
fuse (view_sink.py): cross-entropy's gradient reshaped to [B, S, V], cast and added to the
logits' own gradient in one pass; the backward of an RMSNorm, whose per-row sum is expanded to
its rows before it is scaled, in one rows kernel. Results as eager's; what cannot move (a
GEMM's product, a value laid out otherwise) stays."""

import torch

from helpers import Fn, compile_run

from fuseml import view_sink

aten = torch.ops.aten
BF16 = torch.bfloat16


def kernels(groups):
    return [g for g in groups if g.route == "kernel"]


class _GradPlusTangent(torch.nn.Module):
    """The logits' gradient as cross-entropy's backward leaves it: rows of [N, V] in fp32,
    reshaped to [B, S, V], cast, and added to a [B, S, V] tensor from outside the graph."""

    def __init__(self):
        super().__init__()
        self.register_buffer("tangent", torch.randn(2, 4, 32, dtype=BF16))

    def forward(self, x):
        x32 = x.float()
        g = torch.exp(x32 - x32[:, :1]) * 0.5  # [N, V] fp32, per-row shift
        return self.tangent + g.view(2, 4, 32).to(BF16)


def test_reshaped_gradient_is_cast_and_added_in_one_pass(dead_socket, partitioned):
    """[N, V] fp32 rows -> view [B, S, V] -> bf16 -> + the logits' gradient: one group."""
    x = torch.randn(8, 32, dtype=BF16)
    c, got, want = compile_run(_GradPlusTangent(), x, train=False)
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=0)
    ((gm, groups),) = partitioned
    (k,) = kernels(groups)
    assert {"sub", "exp", "_to_copy", "add"} <= set(k.op_names), [g.describe() for g in groups]
    # one output, bf16: nothing fp32 of [N, V] is written
    assert [n.meta["val"].dtype for n in k.outputs] == [BF16]


def test_broadcast_per_row_value_joins_the_rows_group(dead_socket, partitioned):
    """An RMSNorm-style backward: s = sum(x * y) per row, expanded to the rows, then scaled
    and combined with x: one rows group, no ATen expand between two kernels."""

    def f(x):
        y = x * 1.5
        s = (x * y).sum(-1, keepdim=True) * -0.5
        e = s.expand(2, 4, 32)
        return e / 32 * (x * 2.0) + y

    x = torch.randn(2, 4, 32)
    c, got, want = compile_run(Fn(f), x, train=False)
    torch.testing.assert_close(got[0], want[0])
    ((gm, groups),) = partitioned
    (k,) = kernels(groups)
    assert k.kind == "rows" and "div" in k.op_names and "sum" in k.op_names, [g.describe() for g in groups]
    assert not [n for n in gm.graph.nodes if n.op == "call_function" and n.target is aten.expand.default]


def test_gemm_view_stays_for_its_group(dead_socket, partitioned):
    """mm -> view -> add: the GEMM group looks through its own view; nothing moves."""
    w = torch.randn(32, 16, dtype=BF16)

    def f(x):
        return (x.view(8, 32) @ w).view(2, 4, 16) + 1.0

    x = torch.randn(2, 4, 32, dtype=BF16)
    compile_run(Fn(f), x, train=False)
    ((gm, groups),) = partitioned
    (g,) = [g for g in groups if g.kind == "gemm"]
    assert any(n.target in view_sink.RESHAPES for n in g.members)


def test_strided_values_are_left_as_they_were(dead_socket, partitioned):
    """A transposed operand has no view to the reshape's source shape: the pair stays, and the
    result is eager's."""

    def f(x):
        g = torch.exp(x - x[:, :1]) * 0.5  # [8, 32]
        return g.view(2, 4, 32) + x.view(4, 2, 32).transpose(0, 1)

    x = torch.randn(8, 32)
    c, got, want = compile_run(Fn(f), x, train=False)
    torch.testing.assert_close(got[0], want[0])


def test_a_chain_of_reshapes_collapses_and_the_reader_joins(dead_socket, partitioned):
    """tanh's value read through reshapes of reshapes ([B, S, V] -> [N, V] -> [B, S, V] ...,
    as the moves leave Gemma 2's logits' softcap gradient) by a division: the chain collapses
    to one reshape, which moves below the division, and the two ops are one group."""

    def softcap_chain(x):
        t = torch.tanh(x)  # [N, V]
        return t.view(2, 4, 32).view(8, 32).view(2, 4, 32) / 30.0

    x = torch.randn(8, 32, dtype=BF16)
    c, got, want = compile_run(Fn(softcap_chain), x, train=False)
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=0)
    ((gm, groups),) = partitioned
    reshapes = [n for n in gm.graph.nodes if n.op == "call_function" and n.target in view_sink.RESHAPES]
    assert all(n.args[0].target not in view_sink.RESHAPES for n in reshapes if hasattr(n.args[0], "target"))
    (g,) = kernels(groups)
    assert sorted(g.op_names) == ["div", "tanh"], g.describe()


def test_a_round_trip_through_pointwise_ops_goes(dead_socket, partitioned):
    """Gemma 2's logits: the product [N, V] seen as [B, S, V], softcapped (returned), cast to
    fp32 and seen as [N, V] again for the loss's rows. The round trip goes: the softcap runs
    over [N, V], the returned logits are a reshape of it, the product runs alone on cuBLAS and
    the softcap joins the rows group of the log-sum-exp."""
    w = torch.randn(16, 32, dtype=BF16)

    def head(h):
        logits = (h.view(8, 16) @ w).view(2, 4, 32)
        capped = torch.tanh(logits / 30.0) * 30.0
        flat = capped.float().view(8, 32)
        m = flat.amax(-1, keepdim=True)
        return capped, torch.log(torch.exp(flat - m).sum(-1, keepdim=True)) + m

    h = torch.randn(2, 4, 16, dtype=BF16)
    c, got, want = compile_run(Fn(head), h, train=False)
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=0)
    torch.testing.assert_close(got[1], want[1])
    ((gm, groups),) = partitioned
    (gemm,) = [g for g in groups if g.kind == "gemm"]
    assert gemm.route == "bypass" and gemm.op_names == ["mm"], [g.describe() for g in groups]
    (rows,) = [g for g in groups if g.kind == "rows"]
    assert {"div", "tanh", "mul", "_to_copy"} <= set(rows.op_names), rows.describe()
    # the returned logits: a reshape of the rows group's softcap, in the traced layout
    out = next(n for n in gm.graph.nodes if n.op == "output").args[0][0]
    assert out.target in view_sink.RESHAPES and out.args[0] in rows.members


def test_a_round_trip_with_two_reshaped_operands_goes(dead_socket, partitioned):
    """Gemma 2's soft-capped logits' gradient: the loss's gradient g and the saved product p,
    each [N, V] seen as [B, S, V] where the softcap's backward reads them, the result seen as
    [N, V] again for the head's GEMMs. The round trip goes: the backward runs over [N, V] and
    joins g's group, one kernel over the logits where there were two."""

    p = torch.randn(8, 32, dtype=BF16)

    def softcap_backward(x):
        g = torch.exp(x.float()) * 2.0  # the loss's gradient, computed over [N, V]
        t = torch.tanh(p.view(2, 4, 32) / 30.0)
        d = torch.ops.aten.tanh_backward(g.view(2, 4, 32).to(BF16) * 30.0, t) / 30.0
        return d.view(8, 32)

    x = torch.randn(8, 32, dtype=BF16)
    c, got, want = compile_run(Fn(softcap_backward), x, train=False)
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=0)
    ((gm, groups),) = partitioned
    assert not [n for n in gm.graph.nodes if n.op == "call_function" and n.target in view_sink.RESHAPES]
    (g,) = kernels(groups)
    assert {"exp", "tanh", "tanh_backward", "div"} <= set(g.op_names), g.describe()


def test_siblings_products_keep_their_views():
    """Two products of the graph seen as [B, S, F], combined and seen as [N, F] again (SwiGLU
    before its down projection): the views stay, the form a sibling GEMM group reads."""

    def swiglu(x, w1, w2):
        a, b = (x @ w1).view(2, 4, 16), (x @ w2).view(2, 4, 16)
        return (torch.nn.functional.silu(a) * b).view(8, 16)

    gm = torch.fx.experimental.proxy_tensor.make_fx(swiglu, tracing_mode="fake")(
        torch.randn(8, 32), torch.randn(32, 16), torch.randn(32, 16)
    )
    r = [n for n in gm.graph.nodes if n.op == "call_function" and n.target in view_sink.RESHAPES][-1]
    assert view_sink._round_trip(r) is None


def test_a_round_trip_of_another_shape_stays():
    """A reshape to a shape other than the first reshape's source is no round trip."""

    def f(x):
        y = torch.tanh(x.view(2, 4, 32)) * 2.0
        return y.view(4, 64)

    gm = torch.fx.experimental.proxy_tensor.make_fx(f, tracing_mode="fake")(torch.randn(8, 32))
    r = [n for n in gm.graph.nodes if n.op == "call_function" and n.target in view_sink.RESHAPES][-1]
    assert view_sink._round_trip(r) is None
