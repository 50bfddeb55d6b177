"""Index ranges and the masks they decide (index_ranges.py): a mixture-of-experts' sentinel
mask over ids that topk gives is all false, so its masked fills leave the forward and backward
graphs, with values and gradients as eager's; a comparison the range does not decide, a value
written in place, a fill whose value is returned and a clamp that can change something are
left as they were."""

import operator

import torch

from helpers import plan, rel_err

import fuseml
from fuseml import index_ranges

aten = torch.ops.aten
E, T, D = 8, 12, 16


def _experts(x, router, w, bound=E, clamp_to=E - 1, write=False, augmented=False):
    """Hugging Face's grouped experts' routing, reduced: top-2 ids sorted, the rows they pick
    masked where `ids >= bound` (the sentinels), ids clamped to `clamp_to`."""
    ids = torch.topk(x @ router, 2, dim=-1)[1].reshape(-1)
    ids_g, perm = torch.sort(ids)
    if write:
        ids_g.add_(1)  # written in place: its range no longer holds, and some ids reach the bound
    if augmented:
        view = ids_g
        ids_g += 1  # the same, as an augmented assignment (operator.iadd), read through a view
        ids_g = view
    mask = (ids_g >= bound).unsqueeze(-1)
    ids_g.clamp_(max=clamp_to)
    rows = x[perm // 2]
    rows.masked_fill_(mask, 0.0)
    out = torch.tanh(rows @ w).masked_fill(mask, 0.0)
    return out.sum() + ids_g.float().sum()


def _graph_targets(c, which):
    return [n.target for n in plan(c, which).compiled.gm.graph.nodes if n.op == "call_function"]


def _inputs():
    torch.manual_seed(0)
    return torch.randn(T, D), torch.randn(D, E), torch.randn(D, D)


def _run(fn, args, **kw):
    x, router, w = (a.clone().requires_grad_(a is not args[1]) for a in args)
    loss = fn(x, router, w, **kw)
    loss.backward()
    return loss.detach(), x.grad, w.grad


def test_the_sentinel_mask_leaves_forward_and_backward(dead_socket):
    args = _inputs()
    want = _run(_experts, args)
    c = fuseml.FuseMLCompiler()
    got = _run(torch.compile(_experts, backend=c), args)
    for g, e in zip(got, want):
        assert rel_err(g, e) < 1e-5
    for which in ("forward", "backward"):
        targets = _graph_targets(c, which)
        assert aten.masked_fill.Scalar not in targets and aten.ge.Scalar not in targets
        assert aten.where.self not in targets and aten.clamp.default not in targets


def _dynamo_graph(fn, *args, **kw):
    graphs = []

    def grab(gm, ex):
        graphs.append(gm)
        return gm

    torch.compile(lambda *a: fn(*a, **kw), backend=grab)(*args)
    return graphs[-1]


def _calls(gm, names):
    return [n for n in gm.graph.nodes if index_ranges.target_of(n) in names]


def test_the_ranges_the_graph_fixes():
    gm = _dynamo_graph(_experts, *_inputs())
    found = index_ranges.ranges(gm)
    (ge,) = _calls(gm, {operator.ge, torch.ge, "ge"})
    assert found[ge] == (0, 0)
    (sort,) = _calls(gm, {torch.sort, "sort"})
    ids = [u for u in sort.users if u.args[1] == 0][0]
    assert found[ids] == (0, E - 1)
    assert index_ranges.rewrite(gm) == 3  # the two fills and the clamp
    assert not _calls(gm, {"masked_fill", "masked_fill_", "clamp_"})


def test_what_the_range_does_not_decide_is_left():
    args = _inputs()
    # a bound inside the range: some ids are marked
    gm = _dynamo_graph(_experts, *args, bound=E - 2)
    assert index_ranges.rewrite(gm) == 1  # the clamp to E - 1 alone
    assert len(_calls(gm, {"masked_fill", "masked_fill_"})) == 2
    # a clamp below the range's top writes ids: they have no range, and nothing is decided
    gm = _dynamo_graph(_experts, *args, clamp_to=E - 3)
    assert index_ranges.rewrite(gm) == 0 and _calls(gm, {"clamp_"})
    # ids written in place before the comparison: no range
    gm = _dynamo_graph(_experts, *args, write=True)
    assert index_ranges.rewrite(gm) == 0
    gm = _dynamo_graph(_experts, *args, augmented=True)
    assert index_ranges.rewrite(gm) == 0
    # and the results stay eager's
    for kw in ({"bound": E - 2}, {"clamp_to": E - 3}, {"write": True}, {"augmented": True}):
        want = _run(_experts, args, **kw)
        got = _run(torch.compile(_experts, backend=fuseml.FuseMLCompiler()), args, **kw)
        for g, e in zip(got, want):
            assert rel_err(g, e) < 1e-5, kw


def _returned_fill(x, router):
    ids = torch.topk(x @ router, 2, dim=-1)[1]
    return x.masked_fill(ids[:, :1] < 0, 1.0)  # all false, but returned: x itself would be


def test_a_returned_fill_is_left(dead_socket):
    torch.manual_seed(0)
    x, router = torch.randn(T, D), torch.randn(D, E)
    gm = _dynamo_graph(_returned_fill, x, router)
    assert index_ranges.ranges(gm)[_calls(gm, {operator.lt, torch.lt, "lt"})[0]] == (0, 0)
    assert index_ranges.rewrite(gm) == 0
    got = torch.compile(_returned_fill, backend=fuseml.FuseMLCompiler())(x, router)
    assert torch.equal(got, x) and got is not x
