"""A pointwise op read by a row gather moves below it, and one whose row groups are picked
below the picks (gather_sink.py): the mixture-of-experts layer's expert rows scaled by their
routing weights, put back in token order and summed into the residual become one kernel
reading the gathered bf16 product. Results as eager's (exact: elementwise ops commute with
row gathers and picks); what the rewrite must leave alone stays as it was."""

import torch

import fuseml
from fuseml import gather_sink

aten = torch.ops.aten
BF16 = torch.bfloat16
TOKENS, K, D = 32, 2, 64


def combine(down, weight, inverse, residual):
    """Hugging Face's grouped-GEMM experts after the down projection: each picked row scaled
    by its routing weight (fp32), put back in token order, the k picks of a token summed."""
    scaled = down * weight[:, None]
    picked = scaled[inverse].view(TOKENS, K, D)
    return residual + (picked[:, 0] + picked[:, 1]).to(BF16)


def inputs():
    g = torch.Generator().manual_seed(5)
    down = torch.randn(TOKENS * K, D, generator=g).to(BF16)
    weight = torch.rand(TOKENS * K, generator=g)
    inverse = torch.randperm(TOKENS * K, generator=g)
    residual = torch.randn(TOKENS, D, generator=g).to(BF16)
    return down, weight, inverse, residual


def nodes(gm, target):
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target == target]


def test_the_scaling_and_the_picks_sum_are_one_kernel_after_the_gather(dead_socket, partitioned):
    args = inputs()
    got = torch.compile(combine, backend=fuseml.FuseMLCompiler(), dynamic=False)(*args)
    torch.testing.assert_close(got, combine(*args), rtol=0, atol=0)
    ((gm, groups),) = partitioned
    gathers = nodes(gm, aten.index.Tensor)
    # the bf16 product and the weights are gathered, each pick at its own rows (gather_picks);
    # nothing fp32 of the product's size is
    assert sorted(str(tuple(n.meta["val"].shape)) + str(n.meta["val"].dtype) for n in gathers) == [
        f"({TOKENS}, 1)torch.float32",
        f"({TOKENS}, 1)torch.float32",
        f"({TOKENS}, {D})torch.bfloat16",
        f"({TOKENS}, {D})torch.bfloat16",
    ]
    # one kernel reads them all, the weights' [T, 1] picks loaded where they are read
    # (partition: rows read at an index alone run inside their reader)
    (g,) = [g for g in groups if g.kind == "pointwise" and g.route == "kernel"]
    assert sorted(g.op_names) == ["_to_copy", "add", "add"] + ["index"] * 4 + ["mul", "mul"], g.describe()


def test_an_op_read_by_more_than_the_gather_stays(dead_socket, partitioned):
    def also_returned(down, weight, inverse, residual):
        scaled = down * weight[:, None]
        return scaled[inverse] + 1.0, scaled

    args = inputs()
    got = torch.compile(also_returned, backend=fuseml.FuseMLCompiler(), dynamic=False)(*args)
    for a, b in zip(got, also_returned(*args)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    ((gm, _),) = partitioned
    (gather,) = nodes(gm, aten.index.Tensor)
    assert gather.args[0].target is aten.mul.Tensor


def test_a_narrowing_op_is_gathered_after_it():
    """An op whose operands' rows hold more bytes than its value's (a cast to bf16) keeps its
    gather after it: gathering the fp32 operand would move twice the bytes."""

    def narrowing(x, idx):
        return (x * 2.0).to(BF16)[idx]

    gm = torch.fx.experimental.proxy_tensor.make_fx(narrowing, tracing_mode="fake")(
        torch.randn(16, 8), torch.arange(16)
    )
    (index,) = nodes(gm, aten.index.Tensor)
    assert gather_sink._gathered(index) is None


def test_picks_read_by_other_than_pointwise_ops_stay():
    def picked_into_a_product(x, w):
        y = (x * 2.0).view(8, 2, 16)
        return y[:, 0] @ w

    gm = torch.fx.experimental.proxy_tensor.make_fx(picked_into_a_product, tracing_mode="fake")(
        torch.randn(16, 16), torch.randn(16, 4)
    )
    (view,) = nodes(gm, aten.view.default)
    assert gather_sink._picks(view) is None


def test_an_operand_given_by_keyword_keeps_the_gather():
    """The move replaces the op's direct operands; one passed by keyword would be read
    ungathered (a permutation keeps the shape, so only this check stops it)."""

    def add_then_gather(c, x, idx):
        return torch.add(c, x)[idx]  # [1, 8] fp32 + [16, 8] bf16: x's rows are gathered

    gm = torch.fx.experimental.proxy_tensor.make_fx(add_then_gather, tracing_mode="fake")(
        torch.randn(1, 8), torch.randn(16, 8).to(BF16), torch.randperm(16)
    )
    (index,) = nodes(gm, aten.index.Tensor)
    add = index.args[0]
    assert gather_sink._gathered(index) is not None  # positional: the move is exact
    c, x = add.args
    add.args, add.kwargs = (c,), {"other": x}
    assert gather_sink._gathered(index) is None


def combine_picked(down, weight, inverse, residual):
    """As combine, with the weights scaled after the gather (each pick read at its own
    rows): what gather_picks (and the fragment's take_rows) take."""
    picked = down[inverse].view(TOKENS, K, D)
    scale = weight[inverse].view(TOKENS, K)
    return residual + (picked[:, 0] * scale[:, 0, None] + picked[:, 1] * scale[:, 1, None]).to(BF16)


def _take_group(groups):
    (g,) = [g for g in groups if g.kind == "pointwise" and g.route == "kernel" and "index" in g.op_names]
    return g


def test_the_picks_read_the_product_at_their_own_rows(served, partitioned):
    """The product's gather moves below its picks: one pointwise group reads the bf16 product
    where each pick's index points (take_rows, vocabulary 9), the index a strided [T] view of
    the inverse read as [T, 1]; no gathered copy of the product is made."""
    args = inputs()
    got = torch.compile(combine, backend=fuseml.FuseMLCompiler(), dynamic=False)(*args)
    torch.testing.assert_close(got, combine(*args), rtol=0, atol=0)
    ((gm, groups),) = partitioned
    g = _take_group(groups)
    # the product's two picks, and the weights' two [T, 1] picks read where they are used
    assert sorted(g.op_names).count("index") == 4, g.describe()
    wire = g.built.wire
    assert wire["vocab"] == 9
    takes = [op for op in wire["ops"] if op["op"] == "take_rows"]
    assert len(takes) == 4
    by_id = {t["id"]: t for t in wire["inputs"]}
    rows, index = by_id[takes[0]["args"][0]], by_id[takes[0]["args"][1]]
    assert (rows["dtype"], rows["shape"], rows["strides"]) == ("bf16", [TOKENS * K, D], [D, 1])
    assert (index["dtype"], index["shape"], index["strides"]) == ("i64", [TOKENS, 1], [K, 0])
    assert {by_id[t["args"][1]]["shape"][0] for t in takes} == {TOKENS}
    # the product is gathered by no ATen index of its own size any more
    assert [n for n in nodes(gm, aten.index.Tensor) if tuple(n.meta["val"].shape) == (TOKENS * K, D)] == []


def test_rows_read_at_an_index_never_join_their_source(dead_socket, partitioned):
    """x's rows are loaded where the index points: the group computing x stays apart (its
    value must be in memory), and the result is eager's."""

    def computed_rows(x, idx):
        y = x * 2.0  # read twice: it stays above the gather
        return y[idx] + 1.0, y

    x, idx = torch.randn(16, 8), torch.randint(0, 16, (12,))
    got = torch.compile(computed_rows, backend=fuseml.FuseMLCompiler(min_ops=1), dynamic=False)(x, idx)
    for a, b in zip(got, computed_rows(x, idx)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    ((gm, groups),) = partitioned
    (mul,) = nodes(gm, aten.mul.Tensor)
    (index,) = nodes(gm, aten.index.Tensor)
    by_member = {n: g for g in groups for n in g.members}
    assert by_member.get(mul) is not by_member.get(index)


def test_daemon_accepts_the_take_rows_fragment(daemon, partitioned):
    """A fusemld of vocabulary 9 answers the group reading the product at its picks' rows with
    a kernel (compile-only here: not yet tuned on a GPU)."""
    args = inputs()
    got = torch.compile(combine, backend=fuseml.FuseMLCompiler(), dynamic=False)(*args)
    torch.testing.assert_close(got, combine(*args), rtol=0, atol=0)
    ((_, groups),) = partitioned
    g = _take_group(groups)
    assert g.key and g.state in ("untuned", "tuned"), g.describe()
