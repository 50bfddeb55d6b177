"""An accumulating index_put over rows as a scatter-add (scatter_add.py): the function matches
ATen's index_put with accumulate (repeated indices, a non-zero buffer, fp32 and bf16); the
backward of a gather of rows and a mixture-of-experts decoder's training step keep no
accumulating index_put and match eager; what it does not take stays ATen's, and nothing is
rewritten under deterministic algorithms."""

import pytest
import torch

from graph_coverage import zoo_model
from helpers import plan, rel_err

import fuseml
from fuseml import scatter_add

aten = torch.ops.aten


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_function_matches_aten(dtype):
    torch.manual_seed(0)
    x = torch.randn(10, 6).to(dtype)
    idx = torch.tensor([3, 1, 3, 9, 0, 3, 1])  # repeated rows take several adds
    values = torch.randn(7, 6).to(dtype)
    want = aten.index_put.default(x, [idx], values, True)
    got = scatter_add.index_put_add(x, idx, values)
    assert got.dtype == dtype and got.shape == want.shape
    assert rel_err(got.float(), want.float()) < (1e-6 if dtype == torch.float32 else 1e-2)


def _gather_loss(x, idx, w):
    """Rows of x gathered (each twice: a top-2 router's dispatch), weighted and summed."""
    return (x[idx].float() * w).sum()


def _graphs(fn, *args):
    graphs = []

    def grab(gm, ex):
        graphs.append(gm)
        return gm

    torch.compile(fn, backend=grab)(*args)
    return graphs[-1]


def test_gather_backward_is_a_scatter_add(dead_socket):
    torch.manual_seed(0)
    x = torch.randn(16, 8, dtype=torch.bfloat16)
    idx = torch.randperm(16).repeat(2)
    w = torch.randn(32, 8)
    want = torch.autograd.grad(_gather_loss(x.requires_grad_(True), idx, w), x)[0]
    c = fuseml.FuseMLCompiler()
    xi = x.detach().requires_grad_(True)
    got = torch.autograd.grad(torch.compile(_gather_loss, backend=c)(xi, idx, w), xi)[0]
    assert got.dtype == want.dtype and rel_err(got.float(), want.float()) < 1e-2
    targets = [n.target for n in plan(c, "backward").compiled.gm.graph.nodes if n.op == "call_function"]
    assert set(targets) & ADDS and aten.index_put.default not in targets


ADDS = {scatter_add.index_put_add_fp32, scatter_add.index_add_to_zeros_fp32}


@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
def test_the_values_cast_and_zeros_not_copied(index_dtype):
    """A buffer of zeros (new_zeros) is not read: the sums start from a fresh zeroed buffer, and
    the result is ATen's. bf16 values are read as they are with an int64 index (the call is a
    scatter group, scatter_fragment.py, whose ATen form casts them inside); with an int32 one
    their fp32 cast is a node of the graph (it joins the op that makes them). A buffer that is
    not zeros is copied and added into."""
    from torch.fx.experimental.proxy_tensor import make_fx

    torch.manual_seed(0)
    i = torch.tensor([0, 3, 3, 1, 0], dtype=index_dtype)
    v = torch.randn(5, 6).to(torch.bfloat16)

    def from_zeros(i, v):
        return aten.index_put.default(v.new_zeros(4, 6), [i], v * 2, True)

    def into(x, i, v):
        return aten.index_put.default(x, [i], v * 2, True)

    gm = make_fx(from_zeros, tracing_mode="fake")(i, v)
    assert scatter_add.rewrite_index_put_adds(gm) == 1
    (add,) = [n for n in gm.graph.nodes if n.target in ADDS]
    assert add.target is scatter_add.index_add_to_zeros_fp32
    (values,) = [a for a in add.args if isinstance(a, torch.fx.Node) and a.meta["val"].dim() == 2]
    if index_dtype == torch.int64:
        assert values.target is aten.mul.Tensor and values.meta["val"].dtype == torch.bfloat16
    else:
        assert values.target is aten._to_copy.default and values.kwargs["dtype"] == torch.float32
    gm.recompile()
    torch.testing.assert_close(gm(i, v).float(), from_zeros(i, v).float(), rtol=1e-2, atol=1e-2)

    x = torch.randn(4, 6).to(torch.bfloat16)
    gm = make_fx(into, tracing_mode="fake")(x, i, v)
    assert scatter_add.rewrite_index_put_adds(gm) == 1
    (add,) = [n for n in gm.graph.nodes if n.target in ADDS]
    assert add.target is scatter_add.index_put_add_fp32
    gm.recompile()
    torch.testing.assert_close(gm(x, i, v).float(), into(x, i, v).float(), rtol=1e-2, atol=1e-2)


def _index_puts(gm):
    return [n for n in gm.graph.nodes if n.target is aten.index_put.default]


def test_what_is_not_taken_stays_aten():
    """Two index tensors, a value that is not [len(idx), *rows], an int buffer, more ids per row
    than MAX_IDS_PER_ROW in a large batch; and anything under deterministic algorithms."""
    from torch.fx.experimental.proxy_tensor import make_fx

    x, v = torch.zeros(4, 3), torch.ones(5, 3)
    i, j = torch.tensor([0, 1, 1, 2, 3]), torch.tensor([0, 2, 1, 1, 0])
    cases = [
        (lambda x, i, j, v: aten.index_put.default(x, [i, j], v[:, 0], True), (x, i, j, v)),
        (lambda x, i, j, v: aten.index_put.default(x, [i], v[:, :1], True), (x, i, j, v)),
        (lambda x, i, j, v: aten.index_put.default(x.long(), [i], v.long(), True), (x, i, j, v)),
        (
            lambda x, i, j, v: aten.index_put.default(x, [i], v, True),
            (torch.zeros(2, 3), torch.zeros(5000, dtype=torch.long), j, torch.ones(5000, 3)),
        ),
    ]
    for f, args in cases:
        gm = make_fx(f, tracing_mode="fake")(*args)
        assert scatter_add.rewrite_index_put_adds(gm) == 0 and _index_puts(gm)
    gm = make_fx(lambda x, i, v: aten.index_put.default(x, [i], v, True), tracing_mode="fake")(x, i, v)
    torch.use_deterministic_algorithms(True)
    try:
        assert scatter_add.rewrite_index_put_adds(gm) == 0
        got = scatter_add.index_put_add(x, i, v)  # ATen's own at the call
    finally:
        torch.use_deterministic_algorithms(False)
    torch.testing.assert_close(got, aten.index_put.default(x, [i], v, True))
    assert scatter_add.rewrite_index_put_adds(gm) == 1 and not _index_puts(gm)


def test_moe_decoder_step_has_no_accumulating_index_put(dead_socket, partitioned):
    """Hugging Face's Mixtral (grouped-GEMM experts, top-2), tiny, one training step: its loss
    is eager's, and no accumulating index_put is left in any graph; nor a histogram, a running
    sum (the experts' offsets: sorted_counts.py), an index_put copying its buffer (the inverse
    permutation: fresh_buffers.py) or a masked fill (the sentinel mask, where this version of
    transformers makes one: index_ranges.py)."""
    w = zoo_model("moe")
    w.model.train()
    torch.manual_seed(0)
    want = w.loss(w.model, w.inputs).item()
    c = fuseml.FuseMLCompiler()
    torch.manual_seed(0)
    loss = w.loss(torch.compile(w.model, backend=c), w.inputs)
    loss.backward()
    assert abs(loss.item() - want) < 2e-2 * abs(want)
    assert partitioned
    for gm, _ in partitioned:
        left = [n for n in _index_puts(gm) if len(n.args) > 3 and n.args[3] is True]
        assert not left, [n.format_node() for n in left]
        gone = {aten.histc.default, aten.cumsum.default, aten.index_put.default, aten.masked_fill.Scalar}
        left = [n for n in gm.graph.nodes if n.target in gone]
        assert not left, [n.format_node() for n in left]
    adds = [n.target for gm, _ in partitioned for n in gm.graph.nodes if n.target in ADDS]
    # the gradients' buffers are aot_autograd's new_zeros, folded to constants: none is copied
    assert adds and set(adds) == {scatter_add.index_add_to_zeros_fp32}, adds


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_rows_added_as_index_add_does(index_dtype):
    """row_adds.add_rows_ (scatter_add_ with the index broadcast along the rows) adds what
    index_add_ adds: repeated rows, rows of more than one dim, an int32 index."""
    from fuseml.row_adds import add_rows_

    torch.manual_seed(0)
    buf = torch.randn(6, 3, 4)
    idx = torch.tensor([5, 0, 5, 2, 5, 1, 0], dtype=index_dtype)
    rows = torch.randn(7, 3, 4)
    want = buf.clone().index_add_(0, idx, rows)
    got = buf.clone()
    assert add_rows_(got, idx, rows) is not None
    torch.testing.assert_close(got, want)
