"""A contiguous copy of a transposed pointwise value computes the value in the copy's layout
(transpose_rewrite.py): the copy joins the group that computes the value, which reads its
operands through permuted views. Rotary embeddings' backward, whose gradients the projection
reads as [B, S, H, D], is the case that matters. Results as eager's (exact in fp32); what the
rewrite must leave alone stays as it was; a real fusemld (compile-only here) accepts the
fragments."""

import torch

from helpers import close_bf16, plan

import fuseml

aten = torch.ops.aten
BF16 = torch.bfloat16


def rotate_half(x):
    """transformers.models.llama.modeling_llama.rotate_half"""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def project_and_rotate(x, cos, sin, heads=4):
    """A [B, S, H*D] projection read as heads, rotated (Hugging Face's attention): the
    backward copies the rotation's gradient from [B, H, S, D] back to [B, S, H, D]."""
    b, s, hd = x.shape
    q = x.view(b, s, heads, hd // heads).transpose(1, 2)
    return q * cos[:, None] + rotate_half(q) * sin[:, None]


def rope_inputs(b=2, s=8, heads=4, d=16, dtype=BF16):
    torch.manual_seed(0)
    x = torch.randn(b, s, heads * d, dtype=dtype)
    pos = torch.arange(s, dtype=torch.float32)
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    emb = torch.cat((pos[:, None] * inv[None], pos[:, None] * inv[None]), -1)
    return x, emb.cos()[None].expand(b, s, d).to(dtype), emb.sin()[None].expand(b, s, d).to(dtype)


def step(fn, x, cos, sin):
    xi = x.clone().requires_grad_(True)
    y = fn(xi, cos, sin)
    (y.float() * torch.linspace(-1, 1, y.numel()).view(y.shape)).sum().backward()
    return y.detach(), [xi.grad]


def copies(gm):
    return [n for n in gm.graph.nodes if n.target is aten.clone.default]


def test_rope_backward_writes_the_projection_layout(dead_socket, partitioned):
    c = fuseml.FuseMLCompiler()
    x, cos, sin = rope_inputs()
    got = step(torch.compile(project_and_rotate, backend=c), x, cos, sin)
    want = step(project_and_rotate, x, cos, sin)
    close_bf16(got, want)
    assert got[1][0].is_contiguous()
    bw = plan(c, "backward")
    (rope,) = [g for g in bw.groups if "cat" in g.op_names]
    assert rope.route == "kernel" and rope.op_names[-1] == "clone", bw.describe()
    assert {"neg", "cat", "mul", "add"} <= set(rope.op_names)
    # no copy is left outside a group: the transposed one is the group's output
    (gm, groups) = partitioned[-1]
    members = {n for g in groups for n in g.members}
    assert copies(gm) and all(n in members for n in copies(gm)), gm.code
    w = rope.built.wire
    (out,) = w["outputs"]
    assert out["shape"] == [2, 8, 4, 16]  # [B, S, H, D]: what the projection's gradient reads
    # the cat runs along D, the last dim either way
    (cat,) = [op for op in w["ops"] if op["op"] == "cat"]
    assert cat["dim"] == 3


def test_rope_backward_exact_in_f32(dead_socket):
    x, cos, sin = rope_inputs(dtype=torch.float32)
    got = step(torch.compile(project_and_rotate, backend=fuseml.FuseMLCompiler()), x, cos, sin)
    want = step(project_and_rotate, x, cos, sin)
    for a, b in zip([got[0]] + got[1], [want[0]] + want[1]):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def scaled_heads_copy(a, scale, bias):
    """A pointwise value copied transposed: the copy is the group's output; bias is of lower
    rank (broadcast from the left), scale a 0-d tensor."""
    return ((a * scale + bias) * 2).permute(0, 2, 1, 3).contiguous()


def test_pointwise_value_copied_transposed_is_one_group(dead_socket, partitioned):
    torch.manual_seed(1)
    a, scale, bias = torch.randn(2, 3, 5, 8), torch.tensor(1.5), torch.randn(8)
    got = torch.compile(scaled_heads_copy, backend=fuseml.FuseMLCompiler())(a, scale, bias)
    want = scaled_heads_copy(a, scale, bias)
    assert got.is_contiguous() and got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    ((gm, groups),) = partitioned
    (g,) = [g for g in groups if g.route == "kernel"]
    assert g.op_names == ["mul", "add", "mul", "clone"], g.describe()
    assert g.shape == (2, 5, 3, 8)
    # the operands are read through permuted views: a's strides are not its contiguous ones
    strides = [i["strides"] for i in g.built.wire["inputs"]]
    assert [120, 8, 40, 1] in strides, strides


def test_values_read_elsewhere_stay_where_they_are(dead_socket, partitioned):
    """The value is also returned: moving the copy would compute it twice, so the graph is
    left as it was. A copy of a view of an input (no op to move) stays too."""

    def also_returned(a):
        v = a * 2 + 1
        return v.transpose(1, 2).contiguous(), v

    def copy_of_input(a):
        return a.transpose(1, 2).contiguous() * 3

    a = torch.randn(2, 3, 5, 8)
    for f in (also_returned, copy_of_input):
        got = torch.compile(f, backend=fuseml.FuseMLCompiler())(a)
        want = f(a)
        for x, y in zip(got if isinstance(got, tuple) else [got], want if isinstance(want, tuple) else [want]):
            torch.testing.assert_close(x, y, rtol=0, atol=0)
            assert x.stride() == y.stride()
    (gm0, groups0), (gm1, _) = partitioned
    (clone,) = copies(gm0)
    assert clone.args[0].target is aten.transpose.int  # the copy of v's transpose is still there
    (g,) = [g for g in groups0 if g.route == "kernel"]
    assert "clone" not in g.op_names, g.describe()


def test_daemon_accepts_the_rotation_in_the_copy_layout(daemon):
    c = fuseml.FuseMLCompiler()
    x, cos, sin = rope_inputs()
    got = step(torch.compile(project_and_rotate, backend=c), x, cos, sin)
    close_bf16(got, step(project_and_rotate, x, cos, sin))
    (rope,) = [g for g in plan(c, "backward").groups if "cat" in g.op_names]
    assert rope.op_names[-1] == "clone"
    # the daemon answered ok with a kernel (compile-only here: not yet tuned on a GPU)
    assert rope.key and rope.state in ("untuned", "tuned"), rope.describe()


def test_a_clone_of_an_input_or_a_constant_is_left_alone():
    """A clone whose operand has no arguments (a graph input; a constant folded at compile
    time, as T5's position bias is on a GPU) is no transposed copy: the rewrite passes it by."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from fuseml.transpose_rewrite import compute_in_copy_layout

    gm = make_fx(lambda x, y: (x.clone(), y.t().contiguous() * 2), tracing_mode="fake")(
        torch.randn(4, 6), torch.randn(3, 5)
    )
    assert not compute_in_copy_layout(gm)
    x, y = torch.randn(4, 6), torch.randn(3, 5)
    got = gm(x, y)
    torch.testing.assert_close(got[0], x)


def repeat_kv(v, rep=4):
    """Hugging Face's repeat_kv of a GQA decoder's values, read as heads: [B, S, kv, D] ->
    [B, kv * rep, S, D], each head repeated rep times and copied."""
    v = v.transpose(1, 2)
    b, kv, s, d = v.shape
    return v[:, :, None, :, :].expand(b, kv, rep, s, d).reshape(b, kv * rep, s, d)


def test_a_large_copy_of_a_repeated_view_is_a_kernel(dead_socket, partitioned):
    """The copy repeat_kv makes (a lone clone of a broadcast, transposed view, at least
    partition.LARGE_CAT elements) is a kernel of its own: the fragment reads the view at its
    strides (0 along the repeat) and has no ops. A small one, or a copy of a contiguous value,
    stays ATen's."""
    x = torch.randn(2, 256, 2, 64, dtype=BF16)
    torch.testing.assert_close(
        torch.compile(repeat_kv, backend=fuseml.FuseMLCompiler(), dynamic=False)(x), repeat_kv(x)
    )
    small = torch.randn(1, 8, 2, 16, dtype=BF16)
    torch.testing.assert_close(
        torch.compile(repeat_kv, backend=fuseml.FuseMLCompiler(), dynamic=False)(small), repeat_kv(small)
    )
    (_, groups), (_, groups_small) = partitioned
    (g,) = groups
    assert g.route == "kernel" and g.op_names == ["clone"], g.describe()
    w = g.built.wire
    assert w["ops"] == [] and w["outputs"][0]["id"] == w["inputs"][0]["id"]
    assert w["inputs"][0]["strides"][2] == 0 and w["outputs"][0]["shape"] == [2, 2, 4, 256, 64]
    (h,) = groups_small
    assert h.route == "bypass", h.describe()


def test_daemon_accepts_the_repeated_copy(daemon):
    x = torch.randn(2, 256, 2, 64, dtype=BF16)
    c = fuseml.FuseMLCompiler()
    torch.testing.assert_close(torch.compile(repeat_kv, backend=c, dynamic=False)(x), repeat_kv(x))
    (g,) = [g for p in c.plans for g in p.kernels()]
    assert g.op_names == ["clone"] and g.key and g.state in ("untuned", "tuned"), g.describe()
