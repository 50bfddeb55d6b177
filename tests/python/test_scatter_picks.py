"""topk's backward, a scatter of a few picks a row into zeros, becomes compares and wheres
against a column iota: one pointwise kernel (vocabulary 10) where ATen ran a copy and a
scatter. The values are eager's (gradients through topk, a nonzero self, repeated picks,
other dims); more picks than MAX_PICKS, or an index of another dtype, stay a scatter."""

import torch

from helpers import Fn, compile_run

import fuseml
from fuseml import scatter_picks

aten = torch.ops.aten


def kernels(c):
    return [g for p in c.plans for g in p.groups if g.route == "kernel"]


def scatters_left(c, gms):
    return [n for gm, _ in gms for n in gm.graph.nodes if n.target is aten.scatter.src]


def router_weights(logits):
    """A top-2 router's weights: softmax over its picks, as Mixtral's router computes them."""
    w, i = logits.float().softmax(-1).topk(2, dim=-1)
    return (w / w.sum(-1, keepdim=True)).to(logits.dtype) * 3


def test_topks_backward_is_one_pointwise_kernel(served, partitioned):
    x = torch.randn(64, 8, generator=torch.Generator().manual_seed(0))
    c, (y, grads), (y0, grads0) = compile_run(Fn(router_weights), x)
    torch.testing.assert_close(y, y0)
    torch.testing.assert_close(grads[0], grads0[0])
    assert not scatters_left(c, partitioned)
    picks = [g for g in kernels(c) if g.op_names.count("eq") == 2 and g.op_names.count("where") == 2]
    assert len(picks) == 1, [g.describe() for p in c.plans for g in p.groups]
    assert picks[0].built.wire["vocab"] == 10


def rewrite_only(base, index, src, dim):
    """(rewrites made, the rewritten graph's value, None) for one scatter.src over these
    tensors, eager's scatter not run (an index it would refuse)."""
    gm = torch.fx.symbolic_trace(lambda b, i, s: aten.scatter.src(b, dim, i, s))
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode()
    for n, t in zip([n for n in gm.graph.nodes if n.op == "placeholder"], (base, index, src)):
        n.meta["val"] = mode.from_tensor(t)
    for n in gm.graph.nodes:
        if n.op == "call_function":
            n.meta["val"] = mode.from_tensor(torch.empty_like(base))
    done = scatter_picks.spell_pick_scatters(gm)
    gm.recompile()
    return done, gm(base, index, src), None


def rewrite(base, index, src, dim):
    """(rewrites made, the rewritten graph's value, scatter's) for one scatter.src."""
    done, got, _ = rewrite_only(base, index, src, dim)
    return done, got, base.scatter(dim, index, src)


def test_nonzero_self_other_dims_and_repeated_picks():
    g = torch.Generator().manual_seed(1)
    base = torch.randn(5, 7, 3, generator=g)
    for dim in (0, 1, 2, -1):
        size = base.shape[dim]
        shape = list(base.shape)
        shape[dim] = 2
        index = torch.stack([torch.randperm(size, generator=g)[:2] for _ in range(base.numel() // size)])
        index = index.view(*[s for j, s in enumerate(base.shape) if j != dim % 3], 2).movedim(-1, dim).contiguous()
        src = torch.randn(shape, generator=g)
        done, got, want = rewrite(base, index, src, dim)
        assert done == 1 and torch.equal(got, want), dim
    # a repeated pick: scatter leaves the winner unspecified; the rewrite takes the last
    index = torch.tensor([[3, 3], [0, 6]])
    src = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    done, got, _ = rewrite(torch.zeros(2, 7), index, src, 1)
    assert done == 1 and got[0, 3] == 2.0 and got[1, 0] == 3.0 and got[1, 6] == 4.0 and got.sum() == 9.0


def test_many_picks_or_int32_index_stay_a_scatter():
    base = torch.zeros(4, 32)
    index = torch.stack([torch.randperm(32)[: scatter_picks.MAX_PICKS + 1] for _ in range(4)])
    src = torch.randn(index.shape)
    done, got, want = rewrite(base, index, src, 1)
    assert done == 0 and torch.equal(got, want)
    done, got, want = rewrite(base, index[:, :2].int(), src[:, :2], 1)
    assert done == 0


def test_daemon_accepts_the_picks_kernel(daemon):
    x = torch.randn(32, 8, generator=torch.Generator().manual_seed(2))
    c, (y, grads), (y0, grads0) = compile_run(Fn(router_weights), x, compiler=fuseml.FuseMLCompiler())
    torch.testing.assert_close(grads[0], grads0[0])
    picks = [g for g in kernels(c) if "eq" in g.op_names and "where" in g.op_names]
    assert picks and all(g.key for g in picks), [(g.describe(), g.reason) for g in picks]


def test_an_index_outside_the_columns_selects_none():
    """ATen's scatter reports an index outside [0, E) as an error; the rewrite (documented in
    scatter_picks.py) writes nothing for it and never reads or writes out of bounds."""
    base = torch.full((2, 5), 7.0)
    index = torch.tensor([[1, 9], [-1, 4]])
    src = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    done, got, _ = rewrite_only(base, index, src, 1)
    assert done == 1
    assert torch.equal(got, torch.tensor([[7.0, 1.0, 7.0, 7.0, 7.0], [7.0, 7.0, 7.0, 7.0, 4.0]]))
