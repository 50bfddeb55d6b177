"""Concatenation (vocabulary 6): rotary position embeddings as Hugging Face writes them
(rotate_half's cat of slices, cos and sin broadcast over the heads) become one pointwise
group in the forward graph and one in the backward (autograd's slice_backward pair is
spelled as a cat), results as eager's, in a tiny Hugging Face Llama too; what cannot be
spelled stays ATen; a real fusemld (compile-only here) accepts the fragments, and its kernels
for heads of 64 read whole vectors; explain() shows the groups."""

import io
import os
import subprocess

import pytest
import torch

from helpers import close_bf16, plan

import fuseml
from fuseml import ops

BF16 = torch.bfloat16
aten = torch.ops.aten


def rotate_half(x):
    """transformers.models.llama.modeling_llama.rotate_half"""
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    """transformers.models.llama.modeling_llama.apply_rotary_pos_emb"""
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    q_embed = (q * cos) + (rotate_half(q) * sin)
    k_embed = (k * cos) + (rotate_half(k) * sin)
    return q_embed, k_embed


def rope_inputs(b=2, h=4, kv=2, s=8, d=16, dtype=BF16):
    torch.manual_seed(0)
    q = torch.randn(b, h, s, d, dtype=dtype)
    k = torch.randn(b, kv, s, d, dtype=dtype)
    pos = torch.arange(s, dtype=torch.float32)
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    emb = torch.cat((pos[:, None] * inv[None], pos[:, None] * inv[None]), -1)
    cos, sin = emb.cos()[None].expand(b, s, d).to(dtype), emb.sin()[None].expand(b, s, d).to(dtype)
    return q, k, cos.contiguous(), sin.contiguous()


def run(compiler, train=True, **shape):
    """(outputs, grads of q and k) of the compiled RoPE and of eager's."""
    q, k, cos, sin = rope_inputs(**shape)

    def go(fn):
        qi, ki = q.clone().requires_grad_(train), k.clone().requires_grad_(train)
        a, b = fn(qi, ki, cos, sin)
        if not train:
            return [a.detach(), b.detach()]
        w = torch.linspace(-1, 1, a.numel()).view(a.shape)
        ((a.float() * w).sum() + (b.float() * b.float()).sum()).backward()
        return [a.detach(), b.detach(), qi.grad, ki.grad]

    want = go(apply_rotary_pos_emb)
    got = go(torch.compile(apply_rotary_pos_emb, backend=compiler))
    return got, want


def cat_groups(p):
    return [g for g in p.groups if "cat" in g.op_names]


def test_rope_forward_and_backward_are_one_group_each(dead_socket):
    c = fuseml.FuseMLCompiler()
    got, want = run(c)
    close_bf16((got[0], got[1:]), (want[0], want[1:]))
    for which in ("forward", "backward"):
        gs = cat_groups(plan(c, which))
        assert len(gs) == 2, plan(c, which).describe()  # q and k (other head counts)
        for g in gs:
            assert g.route == "kernel" and g.kind == "pointwise", g.describe()
            # nothing of the rotation is left to ATen but the views it reads through
            assert {"neg", "cat", "mul", "add"} <= set(g.op_names), g.describe()
            w = g.built.wire
            assert w["vocab"] == 6
            (cat,) = [op for op in w["ops"] if op["op"] == "cat"]
            assert cat["dim"] == 3 and len(cat["args"]) == 2
            # the halves are read in place: inputs of half the size, the outputs full
            assert any(i["shape"][-1] == 8 for i in w["inputs"])
            assert all(o["shape"][-1] == 16 for o in w["outputs"])
    # the backward's slice_backward pair is gone: spelled as the cat above
    bw = plan(c, "backward")
    assert not any("slice_backward" in g.op_names for g in bw.groups)


def test_rope_exact_in_f32(dead_socket):
    got, want = run(fuseml.FuseMLCompiler(), dtype=torch.float32)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)


def test_rope_inference_graph(dead_socket):
    c = fuseml.FuseMLCompiler()
    got, want = run(c, train=False)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)
    (p,) = c.plans
    assert len(cat_groups(p)) == 2 and all(g.route == "kernel" for g in cat_groups(p))


def test_cats_that_cannot_be_spelled_stay_aten(dead_socket):
    c = fuseml.FuseMLCompiler()
    # nine operands (above ops.MAX_CAT), and a cat of ints
    f = lambda x: torch.cat([x * 2] * (ops.MAX_CAT + 1), -1) + 1  # noqa: E731
    x = torch.randn(4, 8)
    got = torch.compile(f, backend=c)(x)
    torch.testing.assert_close(got, f(x))
    assert not cat_groups(c.plans[-1])
    torch._dynamo.reset()
    c = fuseml.FuseMLCompiler()
    g = lambda x: torch.cat([x.long(), x.long() * 2], -1) * 3  # noqa: E731
    torch.testing.assert_close(torch.compile(g, backend=c)(x), g(x))
    assert not cat_groups(c.plans[-1])


def test_cat_of_an_escaping_operand_is_not_taken_in(dead_socket):
    """neg(x2) is also returned: it has the operand's shape, so its group cannot become the
    cat's (a group's outputs have the group's shape); the results stay right."""
    c = fuseml.FuseMLCompiler()

    def f(x):
        n = -(x[..., 8:] * 2)
        return torch.cat((n, x[..., :8]), -1) * 3, n

    x = torch.randn(2, 16)
    got = torch.compile(f, backend=c)(x)
    for a, b in zip(got, f(x)):
        torch.testing.assert_close(a, b)
    for g in c.plans[-1].groups:
        if "cat" in g.op_names:
            assert "neg" not in g.op_names, g.describe()


def test_daemon_accepts_rope_and_explain_shows_it(daemon):
    c = fuseml.FuseMLCompiler()
    got, want = run(c)
    close_bf16((got[0], got[1:]), (want[0], want[1:]))
    gs = [g for p in c.plans for g in cat_groups(p)]
    assert len(gs) == 4
    # the daemon answered ok with a kernel (compile-only here: not yet tuned on a GPU)
    assert all(g.key and g.state in ("untuned", "tuned") for g in gs), [g.describe() for g in gs]
    torch._dynamo.reset()
    buf = io.StringIO()
    q, k, cos, sin = rope_inputs()
    rows = fuseml.explain(apply_rotary_pos_emb, q, k, cos, sin, file=buf)
    text = buf.getvalue()
    assert "mul -> neg -> cat -> mul -> add" in text, text
    assert sum("cat" in r["ops"] for r in rows) == 2


def _fusectl(daemon):
    """The fusectl built beside the daemon under test, or None."""
    exe = os.path.join(os.path.dirname(os.path.dirname(daemon.exe)), "client", "fusectl")
    return exe if os.access(exe, os.X_OK) else None


def test_rope_kernels_read_whole_vectors(daemon):
    """Heads of 64 (Llama's) in bf16: the daemon's kernels for the rotary groups take each cat's
    branch once per 8-element unit and read every input as 16-byte vectors (codegen's unit form;
    element-by-element loads behind a branch each made these kernels load-latency bound)."""
    fusectl = _fusectl(daemon)
    if not fusectl:
        pytest.skip("no fusectl built beside fusemld")
    c = fuseml.FuseMLCompiler()
    got, want = run(c, d=64)
    close_bf16((got[0], got[1:]), (want[0], want[1:]))
    keys = {g.key for p in c.plans for g in cat_groups(p)}
    assert len(keys) >= 2 and all(keys), keys
    for key in keys:
        out = subprocess.run(
            [fusectl, "--socket", daemon.socket, "show", key, "--source"], capture_output=True, text=True, timeout=60
        )
        assert out.returncode == 0, out.stderr
        src = out.stdout
        assert "CAT path, vec 8" in src, src[:400]
        assert "const long long cl" not in src, "an element-by-element load"
        assert src.count("reinterpret_cast<const uint4 *>(in") >= 3


def test_hf_llama_rope_fuses_forward_and_backward(dead_socket, partitioned):
    """A tiny Hugging Face Llama (GQA: 4 heads, 2 kv heads), trained one step: the rotary
    embedding of q and of k is one group each in the forward and in the backward graph; the
    angles (a product over K = 1, outer_product.py), their cat, cos and sin are in groups, no
    bmm, cos or sin left outside one in either graph."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=1,
        vocab_size=128,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).to(BF16)
    ids = torch.randint(0, 128, (2, 16))
    c = fuseml.FuseMLCompiler()
    loss = torch.compile(model, backend=c)(input_ids=ids, labels=ids).loss
    loss.backward()
    want = model(input_ids=ids, labels=ids).loss
    assert abs(loss.item() - want.item()) < 2e-2
    for which in ("forward", "backward"):
        rope = [g for g in cat_groups(plan(c, which)) if "neg" in g.op_names]
        assert len(rope) == 2, plan(c, which).describe()
        assert all(g.route == "kernel" and {"cat", "mul", "add"} <= set(g.op_names) for g in rope)
    aten = torch.ops.aten
    for gm, groups in partitioned:
        grouped = {n for g in groups for n in g.members}
        left = {n.target for n in gm.graph.nodes if n.op == "call_function" and n not in grouped}
        assert not left & {aten.bmm.default, aten.cos.default, aten.sin.default}, left


def _qkv_gradient_layout(x):
    """What autograd writes for the backward of timm's q, k, v = qkv.permute(2, 0, 3, 1,
    4).unbind(0): the three [B, H, N, D] gradients stacked and copied into [B, N, 3, H, D]."""
    return torch.stack([x[0], x[1], x[2]], 0).permute(1, 3, 0, 2, 4).contiguous()


def test_stack_copied_into_a_transposed_layout_is_one_cat(dead_socket, partitioned):
    """stack + permute + contiguous is one cat of the permuted operands (cat_rewrite.py), a
    kernel of its own though it is one op (a copy of every byte: partition.LARGE_CAT)."""
    x = torch.randn(3, 2, 4, 128, 32)
    got = torch.compile(_qkv_gradient_layout, backend=fuseml.FuseMLCompiler())(x)
    want = _qkv_gradient_layout(x)
    assert got.is_contiguous() and got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    ((gm, groups),) = partitioned
    targets = {n.target for n in gm.graph.nodes}
    assert torch.ops.aten.stack.default not in targets and torch.ops.aten.clone.default not in targets
    (g,) = [g for g in groups if any(ops.cat_dim(n) is not None for n in g.members)]
    assert g.route == "kernel" and g.op_names == ["cat"], g.describe()
    w = g.built.wire
    assert w["vocab"] == 6 and len(w["inputs"]) == 3
    assert all(i["strides"] != sorted(i["strides"], reverse=True) for i in w["inputs"]), w["inputs"]  # read transposed


def test_small_or_unpermuted_stacks_stay_as_they_are(dead_socket, partitioned):
    """Below partition.LARGE_CAT a lone cat is launch-bound either way: ATen's; so is a large
    one of contiguous operands (ATen's cat kernel copies those at full speed); a stack not
    copied into a permuted layout is left as it was."""
    small = torch.randn(3, 2, 4, 8, 8)
    torch.testing.assert_close(
        torch.compile(_qkv_gradient_layout, backend=fuseml.FuseMLCompiler())(small), _qkv_gradient_layout(small)
    )
    f = lambda x: torch.stack([x[0] * 2, x[1]], 0)  # noqa: E731
    x = torch.randn(2, 4, 8)
    torch.testing.assert_close(torch.compile(f, backend=fuseml.FuseMLCompiler())(x), f(x))
    big = torch.randn(2, 256, 256)
    h = lambda x: torch.cat([x[0], x[1]], -1)  # noqa: E731
    torch.testing.assert_close(torch.compile(h, backend=fuseml.FuseMLCompiler())(big), h(big))
    (gm0, groups0), (gm1, _), (gm2, groups2) = partitioned
    for groups in (groups0, groups2):
        (g,) = [g for g in groups if any(ops.cat_dim(n) is not None for n in g.members)]
        assert g.route == "bypass", g.describe()
    assert torch.ops.aten.stack.default in {n.target for n in gm1.graph.nodes}


def test_a_cat_of_more_dims_than_aten_batches_is_a_kernel(dead_socket, partitioned):
    """A large cat of contiguous operands whose result has more dims than ATen's batched cat
    takes (partition.ATEN_CAT_MAX_DIMS: ATen copies each operand on its own, strided) is a
    kernel of its own: a ViT's q, k, v gradients as cuDNN writes them, [B, N, 1, H, D] each,
    catted into the QKV projection's [B, N, 3, H, D]. The same cat at rank 4 stays ATen's."""
    q, k, v = (torch.randn(2, 128, 1, 4, 64) for _ in range(3))
    cat5 = lambda q, k, v: torch.cat([q, k, v], 2)  # noqa: E731
    torch.testing.assert_close(torch.compile(cat5, backend=fuseml.FuseMLCompiler())(q, k, v), cat5(q, k, v))
    q4, k4, v4 = (t.flatten(0, 1) for t in (q, k, v))
    cat4 = lambda q, k, v: torch.cat([q, k, v], 1)  # noqa: E731
    torch.testing.assert_close(torch.compile(cat4, backend=fuseml.FuseMLCompiler())(q4, k4, v4), cat4(q4, k4, v4))
    (_, groups5), (_, groups4) = partitioned
    (g,) = [g for g in groups5 if any(ops.cat_dim(n) is not None for n in g.members)]
    assert g.route == "kernel" and g.op_names == ["cat"], g.describe()
    for i in g.built.wire["inputs"]:  # each operand read in its own (contiguous) order
        strides = [s for s, n in zip(i["strides"], i["shape"]) if n > 1]
        assert strides == sorted(strides, reverse=True), i
    (h,) = [g for g in groups4 if any(ops.cat_dim(n) is not None for n in g.members)]
    assert h.route == "bypass", h.describe()


def _pad_rows(x):
    """A gradient padded for a GEMM as pad_gemm spells it: cat with zeros along the last dim."""
    return torch.cat([x, torch.zeros(x.shape[0], 7, dtype=x.dtype)], -1)


def test_rows_padded_to_whole_vectors_are_a_kernel(dead_socket, partitioned):
    """A lone cat padding odd rows (257 bf16) to whole 16-byte vectors (264) is a kernel of its
    own (its stores are 16 bytes each, ATen's cat ran such a pad at 1.9 TB/s); one whose rows
    stay odd (260 -> 267 would not pad to vectors) is ATen's."""
    x = torch.randn(512, 257, dtype=BF16)
    pad = torch.compile(_pad_rows, backend=fuseml.FuseMLCompiler(), dynamic=False)
    torch.testing.assert_close(pad(x), _pad_rows(x))
    odd = torch.randn(512, 260, dtype=BF16)
    torch.testing.assert_close(pad(odd), _pad_rows(odd))
    (_, groups), (_, groups_odd) = partitioned
    (g,) = [g for g in groups if any(ops.cat_dim(n) is not None for n in g.members)]
    assert g.route == "kernel" and g.op_names == ["cat"], g.describe()
    assert g.built.wire["outputs"][0]["shape"][-1] == 264
    (h,) = [g for g in groups_odd if any(ops.cat_dim(n) is not None for n in g.members)]
    assert h.route == "bypass", h.describe()


def test_daemon_accepts_the_padded_rows(daemon):
    x = torch.randn(512, 257, dtype=BF16)
    c = fuseml.FuseMLCompiler()
    torch.testing.assert_close(torch.compile(_pad_rows, backend=c)(x), _pad_rows(x))
    (g,) = [g for p in c.plans for g in p.kernels()]
    assert g.op_names == ["cat"] and g.key and g.state in ("untuned", "tuned"), g.describe()


def test_daemon_accepts_the_transposed_stack(daemon):
    x = torch.randn(3, 2, 4, 128, 32, dtype=BF16)
    c = fuseml.FuseMLCompiler()
    torch.testing.assert_close(torch.compile(_qkv_gradient_layout, backend=c)(x), _qkv_gradient_layout(x))
    (g,) = [g for p in c.plans for g in p.kernels()]
    assert g.key and g.state in ("untuned", "tuned"), g.describe()


def _fused_qkv(x, w):
    """A fused QKV projection sliced into its three parts (Phi-3's qkv_proj): the backward sums
    three slice_backward of the parts' gradients into the projection's."""
    qkv = x @ w
    q, k, v = qkv[..., :8], qkv[..., 8:16], qkv[..., 16:]
    return (q * 2.0 + torch.sin(k) * v).sum()


def _rotated_whole(x):
    """Rotary embeddings with the whole head rotated (partial_rotary_factor 1.0): the
    pass-through slice concatenated after the rotation is empty."""
    rot, passed = x[..., :16] * 2.0 + 1.0, x[..., 16:]
    return torch.cat([rot, passed], -1).square().sum()


def _grads(f, *args):
    want = torch.autograd.grad(f(*args), args)
    got = torch.autograd.grad(torch.compile(f, backend=fuseml.FuseMLCompiler(), dynamic=False)(*args), args)
    return got, want


def test_three_slice_gradients_summed_are_one_cat(dead_socket, partitioned):
    torch.manual_seed(0)
    x, w = torch.randn(4, 8, 16, requires_grad=True), torch.randn(16, 24, requires_grad=True)
    got, want = _grads(_fused_qkv, x, w)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    bw = partitioned[-1][0]
    targets = [n.target for n in bw.graph.nodes if n.op == "call_function"]
    assert aten.slice_backward.default not in targets and targets.count(aten.cat.default) == 1


def test_empty_operands_change_nothing_and_go(dead_socket, partitioned):
    torch.manual_seed(0)
    x = torch.randn(2, 4, 16, requires_grad=True)
    got, want = _grads(_rotated_whole, x)
    torch.testing.assert_close(got[0], want[0], rtol=1e-6, atol=1e-6)
    for gm, _ in partitioned:
        targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
        assert aten.cat.default not in targets and aten.slice_backward.default not in targets, gm.code


def _partial_rotary(q, cos, sin, r=8):
    """GPT-NeoX's rotary embedding of the first r of each head's dims, the rest passed
    through: the rotated part, made with rotate_half's cat, concatenated with the rest."""
    rot, passed = q[..., :r], q[..., r:]
    return torch.cat([rot * cos + rotate_half(rot) * sin, passed], dim=-1)


def test_partial_rotary_is_one_cat_of_three_parts(dead_socket, partitioned):
    """The outer cat reads the rotation at rotate_half's boundary, so the rotation's cat
    goes: one cat of three parts, one group, forward and backward; gradients as eager's."""
    torch.manual_seed(0)
    q = torch.randn(2, 4, 8, 32, requires_grad=True)
    cos, sin = torch.randn(8, 8), torch.randn(8, 8)

    def loss(q):
        return (_partial_rotary(q, cos, sin) * torch.arange(32.0)).sum()

    (want,) = torch.autograd.grad(loss(q), q)
    (got,) = torch.autograd.grad(torch.compile(loss, backend=fuseml.FuseMLCompiler(), dynamic=False)(q), q)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    fw_gm, fw_groups = partitioned[0]
    cats = [n for n in fw_gm.graph.nodes if n.target is aten.cat.default]
    assert len(cats) == 1 and len(cats[0].args[0]) == 3, fw_gm.code
    (g,) = [g for g in fw_groups if cats[0] in g.members]
    assert g.route == "kernel" and {"mul", "neg", "add"} <= set(g.op_names), g.describe()


def test_daemon_accepts_the_partial_rotary_cat(daemon):
    q = torch.randn(2, 4, 8, 32, dtype=BF16)
    cos, sin = torch.randn(8, 8, dtype=BF16), torch.randn(8, 8, dtype=BF16)
    c = fuseml.FuseMLCompiler()
    got = torch.compile(_partial_rotary, backend=c, dynamic=False)(q, cos, sin)
    torch.testing.assert_close(got, _partial_rotary(q, cos, sin), rtol=0, atol=0)
    (g,) = [g for p in c.plans for g in p.kernels() if "cat" in g.op_names]
    assert g.key and g.state in ("untuned", "tuned"), g.describe()
