"""Embeddings read in the kernel that sums them (take_rows, vocabulary 9, at ids of rank 2): a
BERT's word, token-type and position embeddings and their sum are one pointwise kernel, each
table read as [V, 1, D] where its ids point (the token types' ids broadcast over the batch, the
positions' one row of ids for every sequence), in front of the LayerNorm's rows kernel. A lone
embedding (a Llama's, read by its RMSNorm) stays ATen's: a kernel of its own either way. A real
fusemld accepts the fragment."""

import torch
import torch.nn.functional as F

from graph_coverage import zoo_model
from helpers import rel_err

import fuseml

aten = torch.ops.aten
BF16 = torch.bfloat16
B, S, D, V = 2, 16, 64, 101


def bert_embeddings(ids, word, types, pos, weight, bias):
    """BertEmbeddings' forward: the token types a buffer of zeros gathered and broadcast over
    the batch, the positions a buffer's first S entries."""
    type_ids = torch.zeros(1, 64, dtype=torch.long)[:, : ids.shape[1]].expand(ids.shape[0], -1)
    pos_ids = torch.arange(64)[None, : ids.shape[1]]
    x = F.embedding(ids, word) + F.embedding(type_ids, types) + F.embedding(pos_ids, pos)
    return F.layer_norm(x.float(), (x.shape[-1],), weight, bias).to(x.dtype)


def llama_embedding(ids, word, weight):
    x = F.embedding(ids, word).float()
    return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * weight).to(BF16)


def gemma_embedding(ids, word, weight):
    """Gemma's: the embedding scaled, the scaled rows normed and kept for the residual add."""
    h = F.embedding(ids, word) * 8.0
    x = h.float()
    normed = (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * weight).to(BF16)
    return h + normed.sin()


def _tables(g=None):
    g = g or torch.Generator().manual_seed(3)
    ids = torch.randint(0, V, (B, S), generator=g)
    word, types, pos = (torch.randn(n, D, generator=g).to(BF16) for n in (V, 2, 64))
    return ids, word, types, pos, torch.rand(D, generator=g) + 0.5, torch.randn(D, generator=g)


def _embeddings_left(partitioned):
    grouped = {n for _, groups in partitioned for g in groups if g.route == "kernel" for n in g.members}
    return [
        n for gm, _ in partitioned for n in gm.graph.nodes if n.target is aten.embedding.default and n not in grouped
    ]


def test_three_embeddings_and_their_sum_are_one_kernel(dead_socket, partitioned):
    args = _tables()
    got = torch.compile(bert_embeddings, backend=fuseml.FuseMLCompiler(), dynamic=False)(*args)
    torch.testing.assert_close(got, bert_embeddings(*args))
    assert not _embeddings_left(partitioned)
    ((gm, groups),) = partitioned
    (g,) = [g for g in groups if g.route == "kernel" and "embedding" in g.op_names]
    assert g.kind == "pointwise" and g.op_names.count("embedding") == 3, g.describe()
    wire = g.built.wire
    assert wire["vocab"] == 9
    by_id = {i["id"]: i for i in wire["inputs"]}
    takes = [(by_id[op["args"][0]], by_id[op["args"][1]]) for op in wire["ops"] if op["op"] == "take_rows"]
    assert sorted(src["shape"][0] for src, _ in takes) == [2, 64, V]
    for src, index in takes:  # each table [rows, 1, D]; each index [.., S, 1]
        assert src["shape"][1:] == [1, D] and src["strides"][1] == 0, src
        assert index["dtype"] == "i64" and index["shape"][1:] == [S, 1], index
    shapes = sorted((index["shape"][0], index["strides"][0]) for _, index in takes)
    assert shapes[0][0] == 1 or shapes[0][1] == 0  # the shared ids read once for the batch
    (rows,) = [h for h in groups if h.kind == "rows" and h.route == "kernel"]
    assert "var" in rows.op_names or "var_mean" in rows.op_names, rows.describe()
    # the sum's cast to f32 runs in the norm's kernel: the embeddings' kernel writes bf16
    assert "_to_copy" not in g.op_names and rows.op_names[0] == "_to_copy", (g.describe(), rows.describe())
    assert wire["outputs"][0]["dtype"] == "bf16"


def test_a_lone_embedding_stays_atens(dead_socket, partitioned):
    """A gather whose ops end in a norm (a Llama's embedding cast and squared; Gemma's scaled
    first, the scaled rows read by the residual too) is ATen's gather; its ops run in the
    norm's rows kernel, which reads the bf16 rows."""
    ids, word, _, _, weight, _ = _tables()
    for f in (llama_embedding, gemma_embedding):
        got = torch.compile(f, backend=fuseml.FuseMLCompiler(), dynamic=False)(ids, word, weight)
        torch.testing.assert_close(got, f(ids, word, weight))
    assert len(_embeddings_left(partitioned)) == 2
    for _, groups in partitioned:
        (rows,) = [g for g in groups if g.kind == "rows" and g.route == "kernel"]
        assert {"_to_copy", "pow", "mean"} <= set(rows.op_names), rows.describe()
        assert not [g for g in groups if g.route == "kernel" and "embedding" in g.op_names]


def test_bert_reads_its_embeddings_and_mask_in_kernels(dead_socket, partitioned):
    """A tiny Hugging Face BERT given a padded batch, in inference: its three embeddings are
    read by one kernel, and its padding mask, read at whole aranges (arange_index.py), is cast
    from int64 in the kernel writing the attention bias: no embedding or index is left."""
    w = zoo_model("bert")
    w.model.eval()
    fn = torch.compile(w.model, backend=fuseml.FuseMLCompiler())
    with torch.no_grad():
        want = w.forward(w.model, w.inputs)
        got = w.forward(fn, w.inputs)
    assert rel_err(got, want) < 2e-2
    assert not _embeddings_left(partitioned)
    ((gm, groups),) = partitioned
    assert not [n for n in gm.graph.nodes if n.target is aten.index.Tensor]
    (g,) = [g for g in groups if g.route == "kernel" and "where" in g.op_names]
    assert "_to_copy" in g.op_names and any(i["dtype"] == "i64" for i in g.built.wire["inputs"]), g.describe()


def test_daemon_accepts_the_embeddings_kernel(daemon):
    args = _tables()
    c = fuseml.FuseMLCompiler()
    got = torch.compile(bert_embeddings, backend=c, dynamic=False)(*args)
    torch.testing.assert_close(got, bert_embeddings(*args))
    (g,) = [g for p in c.plans for g in p.kernels() if "embedding" in g.op_names]
    assert g.key and g.state in ("untuned", "tuned"), g.describe()
