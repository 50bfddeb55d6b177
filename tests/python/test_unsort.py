"""Rows gathered through a permutation and back through its inverse are the rows themselves
(unsort.py): the mixture-of-experts layer's routing weights, gathered in expert order and put
back in token order, are read where they lie. Results as eager's (exactly: the gathers move
values, they compute nothing); what is not provably a round trip stays."""

import torch

import fuseml
from fuseml import unsort

aten = torch.ops.aten
BF16 = torch.bfloat16
TOKENS, K, D, EXPERTS = 32, 2, 64, 8


def route(logits, down, residual, values=None, accumulate=False):
    """Hugging Face's grouped-GEMM experts around the down projection: the picks sorted by
    expert, the weights gathered in that order, the inverse permutation built by scattering
    arange, the scaled rows put back in token order and each token's picks summed."""
    weight, expert = torch.topk(logits.softmax(-1), K, dim=-1)
    order = expert.view(-1).sort().indices
    sorted_weight = weight.view(-1)[order]
    arange = torch.arange(TOKENS * K) if values is None else values
    inverse = torch.empty_like(order).index_put_((order,), arange, accumulate=accumulate)
    rows = down[inverse].view(TOKENS, K, D)
    scale = sorted_weight[:, None][inverse].view(TOKENS, K, 1)
    return residual + (rows[:, 0] * scale[:, 0] + rows[:, 1] * scale[:, 1]).to(BF16)


def inputs():
    g = torch.Generator().manual_seed(7)
    logits = torch.randn(TOKENS, EXPERTS, generator=g)
    down = torch.randn(TOKENS * K, D, generator=g).to(BF16)
    residual = torch.randn(TOKENS, D, generator=g).to(BF16)
    return logits, down, residual


def gathers(gm):
    return sorted(
        tuple(n.meta["val"].shape) for n in gm.graph.nodes if n.op == "call_function" and n.target is aten.index.Tensor
    )


def test_the_weights_are_read_in_token_order_without_a_gather(dead_socket, partitioned):
    args = inputs()
    got = torch.compile(route, backend=fuseml.FuseMLCompiler(), dynamic=False)(*args)
    torch.testing.assert_close(got, route(*args), rtol=0, atol=0)
    ((gm, groups),) = partitioned
    # the product's, each pick at its own rows (gather_picks); the weights' two are gone
    assert gathers(gm) == [(TOKENS, D), (TOKENS, D)]
    (g,) = [g for g in groups if g.kind == "pointwise" and g.route == "kernel" and "mul" in g.op_names]
    assert sorted(g.op_names).count("mul") == 2 and sorted(g.op_names).count("index") == 2, g.describe()


def trace(fn, *args):
    return torch.fx.experimental.proxy_tensor.make_fx(fn, tracing_mode="fake")(*args)


def round_trips(fn, *args):
    gm = trace(fn, *args)
    return [n for n in gm.graph.nodes if unsort._round_trip(gm)(n) is not None]


def test_an_accumulating_scatter_is_no_inverse():
    def summed(w, ids):
        order = ids.sort().indices
        inverse = torch.zeros_like(order).index_put_((order,), torch.arange(16), accumulate=True)
        return w[order][inverse]

    assert round_trips(summed, torch.randn(16), torch.randint(0, 4, (16,))) == []


def test_a_permutation_not_made_by_a_sort_is_not_trusted():
    """An index given as an input may repeat a row: its 'inverse' leaves elements unwritten."""

    def given(w, order):
        inverse = torch.empty_like(order).index_put_((order,), torch.arange(16))
        return w[order][inverse]

    assert round_trips(given, torch.randn(16), torch.randperm(16)) == []


def test_values_other_than_arange_are_no_inverse():
    def shifted(w, ids):
        order = ids.sort().indices
        inverse = torch.empty_like(order).index_put_((order,), torch.arange(16).flip(0))
        return w[order][inverse]

    assert round_trips(shifted, torch.randn(16), torch.randint(0, 4, (16,))) == []


def test_a_new_leading_dim_between_the_gathers_stays():
    def leading(w, ids):
        order = ids.sort().indices
        inverse = torch.empty_like(order).index_put_((order,), torch.arange(16))
        return w[order].unsqueeze(0)[inverse]

    w, ids = torch.randn(16), torch.randint(0, 4, (16,))
    assert round_trips(leading, w, ids) == []


def test_the_round_trip_with_an_unsqueeze_between_is_found():
    def trip(w, ids):
        order = ids.sort().indices
        inverse = torch.empty_like(order).index_put_((order,), torch.arange(16))
        return w[order][:, None][inverse]

    assert len(round_trips(trip, torch.randn(16), torch.randint(0, 4, (16,)))) == 1
