"""A sum over a short inner dim is the fp32 sum of that dim's slices (short_sums.py), a
pointwise op that fuses with its neighbours: grouped-query attention's key and value
gradients, summed over the repeated heads, are computed in the rotation's backward and in
the copy to the projection's layout instead of by ATen's reduction. Numerics as ATen's
(fp32 accumulation, rounded once); sums the rewrite must leave alone stay reductions."""

import pytest
import torch

from helpers import close_bf16, plan

import fuseml

aten = torch.ops.aten
BF16 = torch.bfloat16


def repeat_kv(x, rep):
    """transformers.models.llama.modeling_llama.repeat_kv"""
    b, kv, s, d = x.shape
    return x[:, :, None, :, :].expand(b, kv, rep, s, d).reshape(b, kv * rep, s, d)


def value_heads(x, rep=4, kv=2):
    """A [B, S, KV*D] projection read as KV heads and repeated to KV*R: the backward sums
    the heads' gradients over R and copies the sum to [B, S, KV, D]."""
    b, s, kvd = x.shape
    v = x.view(b, s, kv, kvd // kv).transpose(1, 2)
    return repeat_kv(v, rep) * 2


def step(fn, x):
    xi = x.clone().requires_grad_(True)
    y = fn(xi)
    (y.float() * torch.linspace(-1, 1, y.numel()).view(y.shape)).sum().backward()
    return y.detach(), [xi.grad]


def test_repeated_heads_gradient_is_summed_where_it_is_copied(dead_socket, partitioned):
    torch.manual_seed(0)
    x = torch.randn(2, 8, 2 * 16, dtype=BF16)
    c = fuseml.FuseMLCompiler()
    got = step(torch.compile(value_heads, backend=c), x)
    want = step(value_heads, x)
    close_bf16(got, want)
    (gm, groups) = partitioned[-1]
    assert aten.sum.dim_IntList not in {n.target for n in gm.graph.nodes}, gm.code
    (g,) = [g for g in plan(c, "backward").groups if "clone" in g.op_names]
    assert g.route == "kernel" and g.op_names.count("add") == 3, g.describe()
    assert g.op_names[-1] == "clone"
    # four slices of the repeated gradient in, one [B, S, KV, D] gradient out
    w = g.built.wire
    assert len(w["inputs"]) == 4 and [o["shape"] for o in w["outputs"]] == [[2, 8, 2, 16]]


def test_short_sums_accumulate_in_fp32_as_aten(dead_socket):
    """bf16 terms whose bf16 running sum would lose the small ones: fp32 accumulation keeps
    them, as ATen's sum does."""
    big = torch.full((2, 3, 4, 8), 256.0, dtype=BF16)
    small = torch.rand(2, 3, 4, 8, dtype=BF16)
    x = torch.stack([big, small, small, -big], 2)  # [2, 3, 4 terms, 4, 8], summed over the terms

    def f(x):
        return x.sum(2) * 1

    got = torch.compile(f, backend=fuseml.FuseMLCompiler())(x)
    torch.testing.assert_close(got, f(x), rtol=0, atol=0)
    x32 = torch.randn(3, 5, 7, 6)
    g32 = torch.compile(lambda x: x.sum(1, keepdim=True) + 1, backend=fuseml.FuseMLCompiler())(x32)
    torch.testing.assert_close(g32, x32.sum(1, keepdim=True) + 1)


@pytest.mark.parametrize(
    "f",
    [
        lambda x: x.sum(2) * 2,  # 9 terms: more than MAX_TERMS, a reduction's work
        lambda x: x.sum(0) * 2,  # the first dim: a column sum
        lambda x: x.sum(-1) * 2,  # the last dim: a row sum
        lambda x: x.sum(1, dtype=torch.float32) * 2,  # into another dtype
    ],
)
def test_sums_that_are_not_short_inner_sums_stay(dead_socket, partitioned, f):
    x = torch.randn(4, 3, 9, 5)
    torch.testing.assert_close(torch.compile(f, backend=fuseml.FuseMLCompiler())(x), f(x))
    ((gm, _),) = partitioned
    assert aten.sum.dim_IntList in {n.target for n in gm.graph.nodes}, gm.code


def test_daemon_accepts_the_summed_copy(daemon):
    torch.manual_seed(0)
    x = torch.randn(2, 8, 2 * 16, dtype=BF16)
    c = fuseml.FuseMLCompiler()
    close_bf16(step(torch.compile(value_heads, backend=c), x), step(value_heads, x))
    (g,) = [g for g in plan(c, "backward").groups if "clone" in g.op_names]
    assert g.key and g.state in ("untuned", "tuned"), g.describe()
