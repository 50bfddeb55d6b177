"""An embedding's weight gradient as an fp32 scatter-add (fuseml/embedding_grad.py): the same
values as ATen's embedding_dense_backward (repeated ids, padding_idx, 2-D ids, bf16 and fp32),
ATen's own op where the gradient is scaled by frequency or deterministic algorithms are on, and
a compiled training step of a model with two embeddings (GPT-2's token and position tables)
whose graph calls it, with eager's gradients."""

import pytest
import torch

from helpers import rel_err

import fuseml
from fuseml import embedding_grad as eg

aten = torch.ops.aten


def _aten(grad, idx, num, pad):
    return aten.embedding_dense_backward.default(grad, idx, num, pad, False)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("pad", [-1, 3])
def test_values_match_aten(dtype, pad):
    g = torch.Generator().manual_seed(0)
    num, d = 50, 24
    idx = torch.randint(0, 10, (4, 33), generator=g)  # ids repeat: rows sum many tokens
    idx[0, :5] = 3
    grad = torch.randn(4, 33, d, generator=g).to(dtype)
    got = eg.embedding_grad(grad, idx, num, pad, False)
    want = _aten(grad, idx, num, pad)
    assert got.dtype == want.dtype and got.shape == want.shape
    exact = _aten(grad.double(), idx, num, pad)  # fp64 sums
    # fp32 sums rounded once: as close to the exact sums as ATen's, to within a bf16 rounding
    assert rel_err(got.double(), exact) <= max(rel_err(want.double(), exact), 1e-7) + (
        1e-6 if dtype == torch.float32 else 4e-3
    )
    if dtype == torch.float32:
        assert rel_err(got, want) < 1e-6
    if pad >= 0:
        assert not got[pad].any()
    assert not got[10:].any()  # ids no token has get no gradient


def test_scaled_by_frequency_and_deterministic_stay_aten(monkeypatch):
    calls = []
    real = aten.embedding_dense_backward.default

    class Spy:
        default = staticmethod(lambda *a: calls.append(a) or real(*a))

    monkeypatch.setattr(eg, "aten", type("A", (), {"embedding_dense_backward": Spy}))
    grad, idx = torch.randn(8, 4), torch.randint(0, 5, (8,))
    eg.embedding_grad(grad, idx, 5, -1, True)
    assert len(calls) == 1
    torch.use_deterministic_algorithms(True)
    try:
        eg.embedding_grad(grad, idx, 5, -1, False)
    finally:
        torch.use_deterministic_algorithms(False)
    assert len(calls) == 2


class TwoTables(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = torch.nn.Embedding(64, 32, padding_idx=0)
        self.pos = torch.nn.Embedding(16, 32)
        self.out = torch.nn.Linear(32, 8)

    def forward(self, ids):
        pos = torch.arange(ids.shape[1])
        return self.out(torch.tanh(self.tok(ids) + self.pos(pos)))


def test_compiled_step_calls_it(served):
    torch.manual_seed(0)
    m = TwoTables()
    ref = TwoTables()
    ref.load_state_dict(m.state_dict())
    ids = torch.randint(0, 64, (4, 16))
    ids[:, -3:] = 0  # padding tokens
    c = fuseml.FuseMLCompiler()
    torch.compile(m, backend=c)(ids).square().sum().backward()
    ref(ids).square().sum().backward()
    backward = [p for p in c.plans if p.which == "backward"]
    assert backward, "no backward graph compiled"
    targets = [n.target for p in backward for n in p.compiled.gm.graph.nodes if p.compiled is not None]
    # each gradient goes straight out: one call each, the cast inside
    assert targets.count(eg.embedding_grad) == 2
    assert aten.embedding_dense_backward.default not in targets
    for a, b in ((m.tok.weight.grad, ref.tok.weight.grad), (m.pos.weight.grad, ref.pos.weight.grad)):
        assert rel_err(a, b) < 1e-5
    assert not m.tok.weight.grad[0].any()


class Bias(torch.nn.Module):
    """T5's relative position bias: every (query, key) pair reads one of a few buckets."""

    def __init__(self):
        super().__init__()
        self.table = torch.nn.Embedding(4, 2)

    def forward(self, x):
        i = torch.arange(x.shape[-1])
        buckets = (i[None, :] - i[:, None]).clamp(-2, 1) + 2  # 64 x 64 ids into 4 rows
        return (x + self.table(buckets).permute(2, 0, 1)).sum()


def test_a_table_many_ids_read_is_a_scatter_group(served):
    """96 x 96 ids into 4 rows (the bias above), 2304 a row, a table of 32 bytes: the fp32
    sums (a scatter group, which the daemon sums in shared memory) and a cast, with eager's
    gradient; a table over TABLE_BYTES with as many ids a row stays ATen's sort."""
    torch.manual_seed(0)
    m = Bias()
    x = torch.randn(2, 96, 96)
    c = fuseml.FuseMLCompiler()
    torch.compile(m, backend=c)(x).backward()
    ref = Bias()
    ref.load_state_dict(m.state_dict())
    ref(x).backward()
    targets = [n.target for p in c.plans if p.compiled is not None for n in p.compiled.gm.graph.nodes]
    assert aten.embedding_dense_backward.default not in targets and eg.embedding_grad not in targets
    assert any(g.kind == "scatter" for p in c.plans for g in p.groups)
    assert rel_err(m.table.weight.grad, ref.table.weight.grad) < 1e-5
    from torch.fx.experimental.proxy_tensor import make_fx  # noqa: PLC0415

    grad = aten.embedding_dense_backward.default
    ids = torch.randint(0, 4, (96, 96))
    for width, taken in ((1024, True), (1025, False)):  # 4 rows of fp32: 16 KB, and over it
        gm = make_fx(lambda g, i: grad(g, i, 4, -1, False), tracing_mode="fake")(torch.randn(96, 96, width), ids)
        assert eg.rewrite_embedding_grads(gm) == int(taken)


class TokenTypes(torch.nn.Module):
    """BERT's token-type table: 2 rows, every token reading one (most often row 0)."""

    def __init__(self):
        super().__init__()
        self.types = torch.nn.Embedding(2, 32)
        self.out = torch.nn.Linear(32, 4)

    def forward(self, x, types):
        return self.out(torch.tanh(x + self.types(types)))


def test_a_few_row_table_in_a_small_batch_is_a_scatter_add(served):
    """8 x 128 ids into 2 rows (512 a row, above MAX_IDS_PER_ROW) but no more than FEW_IDS in
    all: the scatter-add, not ATen's sort, with eager's gradient."""
    torch.manual_seed(0)
    m = TokenTypes()
    ref = TokenTypes()
    ref.load_state_dict(m.state_dict())
    x = torch.randn(8, 128, 32)
    types = torch.zeros(8, 128, dtype=torch.long)
    types[:, 100:] = 1
    assert types.numel() > eg.MAX_IDS_PER_ROW * 2 and types.numel() <= eg.FEW_IDS
    c = fuseml.FuseMLCompiler()
    torch.compile(m, backend=c)(x, types).square().sum().backward()
    ref(x, types).square().sum().backward()
    targets = [n.target for p in c.plans if p.compiled is not None for n in p.compiled.gm.graph.nodes]
    assert aten.embedding_dense_backward.default not in targets
    assert eg.embedding_grad in targets or eg.embedding_grad_fp32 in targets
    assert rel_err(m.types.weight.grad, ref.types.weight.grad) < 1e-5


class Tied(torch.nn.Module):
    """A language model's tied table: the embedding's gradient and the output projection's
    are added."""

    def __init__(self):
        super().__init__()
        self.tok = torch.nn.Embedding(64, 32)

    def forward(self, ids):
        h = torch.tanh(self.tok(ids))
        return h @ self.tok.weight.t()


def test_a_tied_table_adds_in_the_cast_kernel(served, partitioned):
    """The fp32 sums and their cast are two nodes where a fusible op (the tied weight's add)
    reads the gradient: the cast runs in the add's group."""
    torch.manual_seed(0)
    m, ref = Tied(), Tied()
    ref.load_state_dict(m.state_dict())
    ids = torch.randint(0, 64, (4, 16))
    torch.compile(m, backend=fuseml.FuseMLCompiler())(ids).square().sum().backward()
    ref(ids).square().sum().backward()
    assert rel_err(m.tok.weight.grad, ref.tok.weight.grad) < 1e-5
    gm, groups = partitioned[-1]
    (sums,) = [n for n in gm.graph.nodes if n.target is eg.embedding_grad_fp32]
    (cast,) = sums.users
    assert any(cast in g.members and "add" in g.op_names for g in groups), [g.describe() for g in groups]


@pytest.mark.parametrize("pad", [-1, 3])
def test_sums_in_a_table_of_the_batch_match_aten(pad):
    """slot_table, the sums at each token's id's slot, and the table's rows read at every id
    (what the compact rewrite's nodes compute, run eagerly): ATen's gradient, to within one
    bf16 rounding of the same fp32 sums, zero at ids no token has and at padding_idx."""
    g = torch.Generator().manual_seed(1)
    num, d = 500, 24
    idx = torch.randint(0, 40, (3, 17), generator=g)  # 51 tokens, ids repeated
    idx[1, :6] = 3
    grad = torch.randn(3, 17, d, generator=g).to(torch.bfloat16)
    table = eg.slot_table(idx, num)
    flat = idx.reshape(-1)
    assert table.shape == (num,)
    # each present id's slot is a position holding it; an absent id's is T
    for i, s in enumerate(table.tolist()):
        assert flat[s] == i if i in flat.tolist() else s == flat.numel()
    slots = table[idx]
    sums = eg.embedding_grad_fp32(grad, slots, idx.numel() + 1, -1, False)
    assert not sums[-1].any()  # no token adds to the last row
    if pad >= 0:
        table = eg.without_id(table, pad, idx.numel())
        assert table[pad] == idx.numel() and eg.slot_table(idx, num)[pad] != idx.numel()
    got = sums[table].to(torch.bfloat16)
    want = _aten(grad, idx, num, pad)
    exact = _aten(grad.double(), idx, num, pad)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert rel_err(got.double(), exact) <= rel_err(want.double(), exact) + 4e-3
    assert torch.equal(got, eg.embedding_grad(grad, idx, num, pad, False))  # the fp32 table's sums, cast
    if pad >= 0:
        assert not got[pad].any()
    assert not got[40:].any()


class Vocabulary(torch.nn.Module):
    """A language model's input embedding: a table of more rows than a batch has tokens, its
    bf16 gradient going straight out of the graph."""

    def __init__(self):
        super().__init__()
        self.tok = torch.nn.Embedding(256, 32).to(torch.bfloat16)
        self.out = torch.nn.Linear(32, 8).to(torch.bfloat16)

    def forward(self, ids):
        return self.out(torch.tanh(self.tok(ids)))


def test_a_vocabulary_gradient_sums_in_a_table_of_the_batch(served, partitioned):
    """4 x 16 tokens into 256 rows: the sums are a scatter group into [65, 32] fp32, read at
    every id's slot by a take_rows group that casts them and writes the whole [256, 32]
    gradient; no [256, 32] fp32 table. The gradient is eager's."""
    torch.manual_seed(0)
    m, ref = Vocabulary(), Vocabulary()
    ref.load_state_dict(m.state_dict())
    ids = torch.randint(0, 256, (4, 16))
    ids[0, :4] = 7
    torch.compile(m, backend=fuseml.FuseMLCompiler())(ids).float().square().sum().backward()
    ref(ids).float().square().sum().backward()
    assert rel_err(m.tok.weight.grad, ref.tok.weight.grad) < 1e-2
    gm, groups = partitioned[-1]
    targets = [n.target for n in gm.graph.nodes]
    assert eg.slot_table in targets and eg.embedding_grad not in targets
    (sums,) = [n for n in gm.graph.nodes if n.target is eg.embedding_grad_fp32]
    assert list(sums.meta["val"].shape) == [65, 32]
    assert any(g.kind == "scatter" and sums in g.members for g in groups), [g.describe() for g in groups]
    back = [g for g in groups if "index" in g.op_names and "_to_copy" in g.op_names]
    assert back and list(back[0].outputs[0].meta["val"].shape) == [256, 32], [g.describe() for g in groups]
