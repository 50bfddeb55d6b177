"""Reductions over the leading dims of a contiguous tensor (weight gradients over batch and
tokens: an RMSNorm weight's sum over [B, S], a learned attention bias's sum over B) run as
column groups of the tensor's 2-D view (column_rewrite.py); results as eager's; what the
rewrite cannot take stays as it was."""
import pytest
import torch

from helpers import Fn, compile_run

import fuseml

aten = torch.ops.aten


def columns(groups):
    return [g for g in groups if g.kind == "columns"]


@pytest.mark.parametrize("reduce", [
    lambda y: y.sum([0, 1], keepdim=True),
    lambda y: y.sum([-3, -2]),
    lambda y: y.mean([0, 1]),
    lambda y: y.amax([1, 0], keepdim=True),
    lambda y: y.sum([0]),
], ids=["sum_keepdim", "sum_negative_dims", "mean", "amax_unordered_dims", "sum_dim0_of_3d"])
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
    (inp,) = [i for i in col.built.wire["inputs"]]
    reduced = 16 if reduce(torch.zeros(2, 8, 64)).numel() == 64 else 2
    assert inp["shape"] == [reduced, 1024 // reduced * 1], inp


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
        a = x.transpose(0, 1).sum([0, 1])           # not contiguous
        b = (x * 2).sum([1])                        # not a leading dim
        c = (x * 3).sum([0, 1, 2])                  # every dim: no columns left
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
