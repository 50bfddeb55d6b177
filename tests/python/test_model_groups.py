"""Whole models through the backend at their tiny sizes (bench/models' Llama, GPT-2, BERT, ViT
and Gemma 2 configurations: Hugging Face `transformers` and timm, bf16, on the CPU): every op
of the forward and training graphs ends up in a fused group, but library calls (matrix
products, convolutions, attention, embeddings, the loss's gather), views, and these few, where
a fused kernel would add a launch and save no traffic:

- a training backward's `cat` of attention's three gradients into the packed q/k/v
  projection's gradient (GPT-2's c_attn, ViT's qkv): a copy as ATen or as a kernel;
- ViT's `select_backward` of its class token (one token a sequence), and its image unfolded
  into patch rows for the patch embedding's product (patch_conv.py: a copy, a kernel of its
  own at real sizes);
- Gemma 2's copies of its key/value heads repeated over the query heads and of its attention
  output read back as [B, S, H, D] (kernels of their own at real sizes, not at these).

Values smaller than one activation (tokens x hidden) are not counted: the loss's tail over one
value a token, per-channel vectors (a bias's or a class token's gradient summed over the batch,
rotary frequencies cast once). A new op a model's graph leaves outside every group over an
activation's worth of values fails here by name."""

import os

import pytest
import torch

from graph_coverage import elementwise_left, zoo_model
from helpers import rel_err

import fuseml

aten = torch.ops.aten

LEFT_BY_DESIGN = {
    ("llama", "fwd"): set(),
    ("llama", "train"): set(),
    ("gpt2", "fwd"): set(),
    ("gpt2", "train"): {aten.cat.default},
    ("bert", "fwd"): set(),
    ("bert", "train"): set(),
    ("vit", "fwd"): {aten.clone.default},
    ("vit", "train"): {aten.select_backward.default, aten.cat.default, aten.clone.default},
    # the key/value heads repeated over the query heads (repeat_kv) and the attention output
    # read back as [B, S, H, D]: copies, kernels of their own from partition.LARGE_CAT up
    ("gemma2", "fwd"): {aten.clone.default},
    ("gemma2", "train"): {aten.clone.default},
}


# tokens a step of each tiny workload runs (batch x sequence; ViT: 2 images of 4 patches and a
# class token each), and their hidden size
TOKENS = {"llama": 32, "gpt2": 32, "bert": 32, "vit": 10, "gemma2": 32}
HIDDEN = 64


def _train_step_matches_eager(w, fn):
    """One training step of workload w through fn (loss forward and backward): its loss is
    eager's on the same inputs."""
    w.model.train()
    torch.manual_seed(0)
    want = w.loss(w.model, w.inputs).item()
    torch.manual_seed(0)
    loss = w.loss(fn, w.inputs)
    loss.backward()
    assert abs(loss.item() - want) < 2e-2 * abs(want)


@pytest.mark.parametrize("model,phase", sorted(LEFT_BY_DESIGN))
def test_every_op_of_a_real_model_is_fused(dead_socket, partitioned, model, phase):
    w = zoo_model(model)
    c = fuseml.FuseMLCompiler()
    fn = torch.compile(w.model, backend=c)
    if phase == "fwd":
        w.model.eval()
        with torch.no_grad():
            want = w.forward(w.model, w.inputs)
            got = w.forward(fn, w.inputs)
        assert rel_err(got, want) < 2e-2
    else:
        _train_step_matches_eager(w, fn)
        assert [p.which for p in c.plans][-1] == "backward"
    assert partitioned and all(groups for _, groups in partitioned)
    left = [
        n
        for gm, groups in partitioned
        for n in elementwise_left(gm, groups)
        if n.meta["val"].numel() >= TOKENS[model] * HIDDEN
    ]
    unexpected = [n.format_node() for n in left if n.target not in LEFT_BY_DESIGN[(model, phase)]]
    assert not unexpected, unexpected


def test_an_activation_autograd_saves_is_recomputed_like_inductor(dead_socket, partitioned):
    """T5's gated GELU (tanh form, written out in Python): autograd saves tanh's output for its
    backward, which reaches the joint graph through detach. Decomposed to alias (a view, as
    Inductor's table does), the min-cut partitioner recomputes it from the values it saves
    anyway, so the forward saves no tanh (it saved one a layer, 6% of T5's step peak)."""
    w = zoo_model("t5")
    c = fuseml.FuseMLCompiler()
    _train_step_matches_eager(w, torch.compile(w.model, backend=c))
    forward = [gm for gm, _ in partitioned][0]
    assert any(n.target is aten.tanh.default for n in forward.graph.nodes)
    (out,) = [n for n in forward.graph.nodes if n.op == "output"]
    saved = [a for a in out.args[0] if isinstance(a, torch.fx.Node)]
    assert saved and not [a for a in saved if a.target is aten.tanh.default]


@pytest.mark.parametrize("model", ["llama", "gpt2"])
def test_the_losss_labels_are_one_kernel(dead_socket, partitioned, model):
    """A causal language model's labels (int64) before its loss: the ignore_index test, the
    range check and the labels cast for the loss run as one pointwise group (vocabulary 10),
    where each was an ATen kernel; what stays out is the pad and its copy (the shift by one)."""
    w = zoo_model(model)
    fn = torch.compile(w.model, backend=fuseml.FuseMLCompiler())
    _train_step_matches_eager(w, fn)
    fused = {n: g for _, groups in partitioned for g in groups if g.route == "kernel" for n in g.members}
    label_ops = [
        n
        for gm, _ in partitioned
        for n in gm.graph.nodes
        if n.op == "call_function"
        and n.target in (aten.ne.Scalar, aten.ge.Scalar, aten.lt.Scalar, aten.where.self)
        and fuseml.ops.is_integer_node(n)
    ]
    assert len(label_ops) >= 4, [n.format_node() for n in label_ops]
    assert all(n in fused for n in label_ops), [n.format_node() for n in label_ops if n not in fused]
    (group,) = {id(fused[n]): fused[n] for n in label_ops}.values()
    assert group.kind == "pointwise" and group.built.wire["vocab"] == 10


def test_an_odd_vocabulary_writes_its_gradient_padded(dead_socket, partitioned, monkeypatch):
    """BERT's masked LM at a vocabulary not a multiple of 8 (30522 at full size; 1001 here),
    its head's GEMMs padded: the returned logits take no tangent of their size (its loss is in
    the graph, head_output.py), and the loss's backward writes the logits' gradient at the
    padded width itself (pad_gemm.py reads it through the padded copy), one kernel group."""
    import importlib.util

    from graph_coverage import BENCH

    pytest.importorskip("transformers")
    monkeypatch.setattr(fuseml.head_output, "MIN_BYTES", 0)  # the tiny logits are kilobytes
    spec = importlib.util.spec_from_file_location("bench_models_zoo_odd", os.path.join(BENCH, "model_zoo.py"))
    zoo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(zoo)
    d, inter, heads, layers, _, batch, seq = zoo._BERT["tiny"]
    zoo._BERT["tiny"] = (d, inter, heads, layers, 1001, batch, seq)
    w = zoo.build("bert", "tiny", "cpu")
    c = fuseml.FuseMLCompiler(pad_gemm="all")
    _train_step_matches_eager(w, torch.compile(w.model, backend=c))
    bw = [p for p in c.plans if p.which == "backward"][-1]
    assert any("1001 -> 1008" in d for d in bw.padded), bw.padded
    tokens = batch * seq
    tangents = [
        n.meta["val"].numel() for n in bw.compiled.gm.graph.nodes if n.op == "placeholder" and "tangent" in n.name
    ]
    assert tokens * 1001 not in tangents, tangents
    (grad,) = [g for g in bw.groups if "cat" in g.op_names and "exp" in g.op_names]
    assert grad.route == "kernel" and grad.shape[-1] == 1008, bw.describe()


@pytest.mark.parametrize("model", ["llama", "gpt2"])
def test_the_losss_column_index_is_computed(dead_socket, partitioned, model):
    """Cross-entropy's forward (the logit at the target column) and backward (the one-hot
    subtracted) compare each logit's column with the row's target: the column is the
    fragment's iota (vocabulary 11), computed in the kernel, and no arange is read."""
    w = zoo_model(model)
    fn = torch.compile(w.model, backend=fuseml.FuseMLCompiler())
    _train_step_matches_eager(w, fn)
    groups = [g for _, gs in partitioned for g in gs if g.route == "kernel" and g.built is not None]
    with_iota = [g for g in groups if any(op["op"] == "iota" for op in g.built.wire["ops"])]
    kinds = sorted(g.kind for g in with_iota)
    assert kinds == ["pointwise", "rows"], [(g.kind, g.op_names) for g in with_iota]
    for g in with_iota:
        assert g.built.wire["vocab"] == 11
        read = [g.inputs[j] for j in g.built.read]
        assert read == list(g.built.in_nodes) and len(read) < len(g.inputs)
