"""A tensor indexed by whole aranges (Hugging Face's padding mask read at every batch and key
position) is read as a view of it (arange_index.py): no ATen index is left, and the mask's
cast from int64 runs inside the pointwise kernel that builds the attention bias. Aranges that
permute, skip or reorder the dims stay ATen's index. A real fusemld accepts the fragment. (A
tiny Hugging Face BERT's graph: test_embedding_rows.py.)"""

import torch

import fuseml

aten = torch.ops.aten
BF16 = torch.bfloat16


def padding_bias(mask, scores):
    """masking_utils' padding mask for SDPA, as traced: the [B, S] int64 mask read at
    (arange(B), arange(S)) broadcast to [B, 1, 1, S], and'ed with an all-true [S, S] mask and
    turned into an additive bias on the scores."""
    b, s = mask.shape
    picked = mask.bool()[torch.arange(b)[:, None, None, None], torch.arange(s)[None, None, None, :]]
    allowed = torch.ones(s, s, dtype=torch.bool)[None, None] & picked
    return scores + torch.where(allowed, 0.0, torch.finfo(scores.dtype).min).to(scores.dtype)


def _mask_and_scores(b=2, s=16):
    mask = torch.ones(b, s, dtype=torch.long)
    mask[1, s - s // 4 :] = 0
    return mask, torch.randn(b, 4, s, s, dtype=BF16)


def _indexes(partitioned):
    return [n for gm, _ in partitioned for n in gm.graph.nodes if n.target is aten.index.Tensor]


def test_a_mask_read_at_whole_aranges_is_a_view(dead_socket, partitioned):
    mask, scores = _mask_and_scores()
    got = torch.compile(padding_bias, backend=fuseml.FuseMLCompiler(), dynamic=False)(mask, scores)
    torch.testing.assert_close(got, padding_bias(mask, scores), rtol=0, atol=0)
    assert not _indexes(partitioned)
    ((gm, groups),) = partitioned
    kernels = [g for g in groups if g.route == "kernel"]
    (g,) = [g for g in kernels if "_to_copy" in g.op_names]  # the int64 mask's cast inside it
    assert "where" in g.op_names and g.built.wire["vocab"] == 10, g.describe()
    (mask_in,) = [i for i in g.built.wire["inputs"] if i["dtype"] == "i64"]
    assert mask_in["shape"] == [2, 1, 1, 16] and mask_in["strides"] == [16, 0, 0, 1], mask_in


def test_aranges_that_reorder_or_skip_stay_an_index(dead_socket, partitioned):
    """Each of these reads other elements than the mask's own at the result's coordinates."""
    mask = torch.arange(32).view(4, 8)
    flipped = lambda m: m[torch.arange(3, -1, -1)[:, None], torch.arange(8)[None, :]] * 2  # noqa: E731
    crossed = lambda m: m[torch.arange(4)[None, :], torch.arange(8)[:, None]] * 2  # noqa: E731  [8, 4]
    short = lambda m: m[torch.arange(3)[:, None], torch.arange(8)[None, :]] * 2  # noqa: E731
    for f in (flipped, crossed, short):
        torch.testing.assert_close(torch.compile(f, backend=fuseml.FuseMLCompiler(), dynamic=False)(mask), f(mask))
    assert len(_indexes(partitioned)) == 3


def test_daemon_accepts_the_mask_kernel(daemon):
    mask, scores = _mask_and_scores()
    c = fuseml.FuseMLCompiler()
    got = torch.compile(padding_bias, backend=c, dynamic=False)(mask, scores)
    torch.testing.assert_close(got, padding_bias(mask, scores), rtol=0, atol=0)
    (g,) = [g for p in c.plans for g in p.kernels() if "_to_copy" in g.op_names]
    assert g.key and g.state in ("untuned", "tuned"), g.describe()
