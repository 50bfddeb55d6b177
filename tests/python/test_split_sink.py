"""A pointwise op read by a split moves below it (split_sink.py), so that each piece's op joins
the piece's pointwise readers: the mixture-of-experts layer's zeroed padding rows before its
SwiGLU halves. And a lone masked_fill large enough is a kernel of its own (partition.py), as
ATen runs it as a clone and a fill. Results as eager's (exact: the ops move, none changes);
what the rewrite must leave alone stays as it was; a real fusemld accepts the fragments."""

import torch
import torch.nn.functional as F

import fuseml

aten = torch.ops.aten
BF16 = torch.bfloat16


def padded_swiglu(x, w, pad, half=48):
    """Hugging Face's grouped-GEMM experts: the gate/up product's padded rows zeroed, then split
    into SwiGLU's halves."""
    h = (x @ w).masked_fill(pad[:, None], 0.0)
    gate, up = h.split(half, -1)
    return F.silu(gate) * up


def inputs(rows=64, d=32, half=48, dtype=BF16):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(rows, d, generator=g).to(dtype)
    w = torch.randn(d, 2 * half, generator=g).to(dtype)
    pad = torch.arange(rows) >= rows - 5
    return x, w, pad


def nodes(gm, target):
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target == target]


def test_the_fill_moves_below_the_split_and_joins_swiglu(dead_socket, partitioned):
    x, w, pad = inputs()
    got = torch.compile(padded_swiglu, backend=fuseml.FuseMLCompiler(), dynamic=False)(x, w, pad)
    torch.testing.assert_close(got, padded_swiglu(x, w, pad), rtol=0, atol=0)
    ((gm, groups),) = partitioned
    (split,) = nodes(gm, aten.split.Tensor)
    assert split.args[0].target is aten.mm.default  # the product is split, the fill runs per half
    (g,) = [g for g in groups if g.kind == "pointwise"]
    assert sorted(g.op_names) == ["masked_fill", "masked_fill", "mul", "silu"], g.describe()
    assert g.route == "kernel", g.describe()
    assert got[-5:].abs().max() == 0 and got[:-5].abs().max() > 0


def test_a_piece_read_by_other_than_pointwise_ops_keeps_the_split(dead_socket, partitioned):
    def returns_a_piece(x, w, pad):
        gate, up = (x @ w).masked_fill(pad[:, None], 0.0).split(48, -1)
        return F.silu(gate) * up, up

    x, w, pad = inputs()
    got = torch.compile(returns_a_piece, backend=fuseml.FuseMLCompiler(), dynamic=False)(x, w, pad)
    for a, b in zip(got, returns_a_piece(x, w, pad)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    ((gm, _),) = partitioned
    assert len(nodes(gm, aten.split.Tensor)) == 1 and len(nodes(gm, aten.masked_fill.Scalar)) == 1


def test_an_operand_whole_along_the_split_keeps_it(dead_socket, partitioned):
    def adds_a_whole_row(x, w, bias):
        gate, up = ((x @ w) + bias).split(48, -1)  # bias is [2F]: not one element along the split
        return F.silu(gate) * up

    x, w, _ = inputs()
    bias = torch.randn(96).to(BF16)
    got = torch.compile(adds_a_whole_row, backend=fuseml.FuseMLCompiler(), dynamic=False)(x, w, bias)
    torch.testing.assert_close(got, adds_a_whole_row(x, w, bias), rtol=0, atol=0)
    ((gm, _),) = partitioned
    assert len(nodes(gm, aten.split.Tensor)) == 1


def test_a_large_lone_fill_is_a_kernel_a_small_one_stays_aten(dead_socket, partitioned):
    def gathers_and_fills(x, idx, pad):
        return x[idx].masked_fill(pad[:, None], 0.0) @ x.t()

    big, small = torch.randn(512, 256).to(BF16), torch.randn(16, 8).to(BF16)
    for x in (big, small):
        # an int32 index: the gather stays ATen's, the fill alone (an int64 one reads x's rows
        # inside the fill's kernel: take_rows, test_gather_sink.py)
        idx = torch.randperm(x.shape[0]).int()
        pad = torch.arange(x.shape[0]) % 7 == 0
        got = torch.compile(gathers_and_fills, backend=fuseml.FuseMLCompiler(), dynamic=False)(x, idx, pad)
        torch.testing.assert_close(got, gathers_and_fills(x, idx, pad))
    (_, groups), (_, groups_small) = partitioned
    (g,) = [g for g in groups if g.op_names == ["masked_fill"]]
    assert g.route == "kernel", g.describe()
    (h,) = [g for g in groups_small if g.op_names == ["masked_fill"]]
    assert h.route == "bypass" and "single op" in h.reason, h.describe()


def test_daemon_accepts_the_moved_fill(daemon):
    x, w, pad = inputs()
    c = fuseml.FuseMLCompiler()
    got = torch.compile(padded_swiglu, backend=c, dynamic=False)(x, w, pad)
    torch.testing.assert_close(got, padded_swiglu(x, w, pad), rtol=0, atol=0)
    (g,) = [g for p in c.plans for g in p.kernels() if "silu" in g.op_names]
    assert g.key and g.state in ("untuned", "tuned"), g.describe()
