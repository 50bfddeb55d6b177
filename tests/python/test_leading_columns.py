"""Reductions over the leading dims of a contiguous tensor (weight gradients over batch and
tokens: an RMSNorm weight's sum over [B, S], a learned attention bias's sum over B) run as
column groups of the tensor's 2-D view (column_rewrite.py), with the pointwise ops that
compute the reduced value written again over 2-D views of their operands (LayerNorm's weight
gradient); results as eager's; what the rewrite cannot take stays as it was."""

import pytest
import torch

from helpers import Fn, close_bf16, compile_run, fp32_step, plan

import fuseml

aten = torch.ops.aten


def columns(groups):
    return [g for g in groups if g.kind == "columns"]


@pytest.mark.parametrize(
    "reduce",
    [
        lambda y: y.sum([0, 1], keepdim=True),
        lambda y: y.sum([-3, -2]),
        lambda y: y.mean([0, 1]),
        lambda y: y.amax([1, 0], keepdim=True),
        lambda y: y.sum([0]),
    ],
    ids=["sum_keepdim", "sum_negative_dims", "mean", "amax_unordered_dims", "sum_dim0_of_3d"],
)
def test_leading_dims_are_a_column_group(dead_socket, partitioned, reduce):
    g = torch.randn(2, 8, 64)

    def f(x):
        return reduce(g * x) * 2

    x = torch.randn(2, 8, 64)
    c, got, want = compile_run(Fn(f), x, train=False)
    torch.testing.assert_close(got[0], want[0])
    assert got[0].shape == want[0].shape
    ((gm, groups),) = partitioned
    (col,) = columns(groups)
    assert col.route == "kernel", col.describe()
    # the prologue g * x runs in the column kernel, which reads g and x as 2-D views
    assert "mul" in col.op_names, col.describe()
    reduced = 16 if reduce(torch.zeros(2, 8, 64)).numel() == 64 else 2
    ins = col.built.wire["inputs"]
    assert len(ins) == 2 and all(i["shape"] == [reduced, 1024 // reduced] for i in ins), ins


def test_attention_bias_gradient_over_the_batch(dead_socket, partitioned):
    """[B, H, S, S] summed over B: columns of the [B, H * S * S] view, bf16 in and out."""

    def f(s):
        return (s * 3).sum([0], keepdim=True).to(torch.bfloat16)

    s = torch.randn(2, 4, 8, 8, dtype=torch.float32)
    c, got, want = compile_run(Fn(f), s, train=False)
    torch.testing.assert_close(got[0], want[0])
    ((gm, groups),) = partitioned
    (col,) = columns(groups)
    assert col.built.wire["inputs"][0]["shape"] == [2, 256]


def test_what_the_rewrite_cannot_take_stays(dead_socket, partitioned):
    def f(x):
        a = x.transpose(0, 1).sum([0, 1])  # not contiguous
        b = (x * 2).sum([1])  # not a leading dim
        c = (x * 3).sum([0, 1, 2])  # every dim: no columns left
        return a, b, c

    x = torch.randn(2, 8, 64)
    c, got, want = compile_run(Fn(f), x, train=False)
    for a, b in zip(got[0], want[0]):
        torch.testing.assert_close(a, b)
    ((gm, groups),) = partitioned
    assert not columns(groups), [g.describe() for g in groups]


def test_daemon_accepts_leading_column_groups(daemon, partitioned):
    w = torch.randn(64)

    def f(x):
        return (x * w).sum([0, 1])

    x = torch.randn(2, 8, 64)
    c, got, want = compile_run(Fn(f), x, compiler=fuseml.FuseMLCompiler(), train=False)
    torch.testing.assert_close(got[0], want[0])
    ks = [g for p in c.plans for g in p.kernels()]
    assert any(g.kind == "columns" for g in ks)
    assert all(g.key and g.state in ("untuned", "tuned") for g in ks), [g.describe() for g in ks]


def _layer_norm_backward(c):
    bw = plan(c, "backward")
    return bw, [g for g in bw.groups if g.kind == "rows"], columns(bw.groups)


def test_layer_norm_backward_is_one_rows_and_one_column_group(dead_socket):
    """nn.LayerNorm's backward (decomposed): the input's gradient is one rows group (x_hat
    recomputed, both row sums, rstd / N and the weight's cast inside it), the weight's and
    bias's gradients one column group that computes g * x_hat itself from g, x and the per-row
    statistics and casts both sums: no fp32 [M, N] value is written for it, no lone ATen op is
    left; gradients no farther from fp32 than eager bf16's."""
    torch.manual_seed(0)
    ln = torch.nn.LayerNorm(64).to(torch.bfloat16)
    with torch.no_grad():
        ln.weight.add_(0.1 * torch.randn(64, dtype=torch.bfloat16))
    x = torch.randn(2, 8, 64, dtype=torch.bfloat16)
    c, got, want = compile_run(ln, x)
    close_bf16(got, want, fp32_step(ln, x))
    bw, rows, (col,) = _layer_norm_backward(c)
    (row,) = rows
    assert row.route == "kernel" and row.op_names.count("sum") == 2, bw.describe()
    assert all(g.route == "kernel" for g in bw.groups if g.kind in ("pointwise", "rows", "columns")), bw.describe()
    assert not [g for g in bw.groups if g.kind == "pointwise"], bw.describe()
    assert not row.escapes, row.describe()  # d_input alone leaves it
    assert col.route == "kernel" and col.op_names.count("sum") == 2 and "mul" in col.op_names
    outs = col.built.wire["outputs"]
    assert [(o["dtype"], o["shape"]) for o in outs] == [("bf16", [64]), ("bf16", [64])], outs
    ins = sorted(tuple(i["shape"]) for i in col.built.wire["inputs"])
    assert ins == [(16, 1), (16, 1), (16, 64), (16, 64)], ins  # mean, rstd, g, x


def test_daemon_accepts_layer_norm_backward(daemon):
    torch.manual_seed(0)
    ln, x = torch.nn.LayerNorm(64).to(torch.bfloat16), torch.randn(4, 8, 64, dtype=torch.bfloat16)
    c, got, want = compile_run(ln, x)
    close_bf16(got, want, fp32_step(ln, x))
    bw, rows, (col,) = _layer_norm_backward(c)
    for g in rows + [col]:
        assert g.key and g.state in ("untuned", "tuned"), g.describe()


def test_prologue_stops_where_an_operand_cannot_be_read_in_two_dims(dead_socket, partitioned):
    """A position embedding [1, S, D] broadcast over the batch is neither full, per row nor
    per column of the [B * S, D] view: the op reading it is read as a full 2-D operand, and
    what comes after it still runs in the column kernel."""
    pos = torch.randn(1, 8, 64)

    def f(x):
        return ((x + pos) * 3).sum([0, 1])

    x = torch.randn(2, 8, 64)
    c, got, want = compile_run(Fn(f), x, train=False)
    torch.testing.assert_close(got[0], want[0])
    ((gm, groups),) = partitioned
    (col,) = columns(groups)
    assert col.op_names == ["mul", "sum"], col.describe()
    assert [i["shape"] for i in col.built.wire["inputs"]] == [[16, 64]]


def test_sixteen_bit_value_read_elsewhere_is_not_computed_again(dead_socket, partitioned):
    """A bf16 value other ops read too is written for them anyway: the column group reads it
    rather than computing it again from its operands."""

    def f(x):
        y = x * 2  # bf16, read by the sum and by the output
        return y.sum([0, 1]), y + 1

    x = torch.randn(2, 8, 64, dtype=torch.bfloat16)
    c, got, want = compile_run(Fn(f), x, train=False)
    for a, b in zip(got[0], want[0]):
        torch.testing.assert_close(a, b)
    ((gm, groups),) = partitioned
    (col,) = columns(groups)
    assert col.op_names == ["sum"], col.describe()
