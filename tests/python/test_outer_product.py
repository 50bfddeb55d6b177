"""Rotary angles as Hugging Face computes them (`inv_freq[None, :, None] @ position_ids[:,
None, :]`, a product over K = 1, in fp32) become a multiply (fuseml/outer_product.py), so that
the angles, their cat, cos and sin are one fused group (cos and sin are elementwise ops of the
fragment vocabulary); the values are eager's; a product over K > 1 stays a GEMM; a real
fusemld (compile-only here) accepts the fragment with cos and sin."""

import torch

from helpers import rel_err

import fuseml
from fuseml.outer_product import spell_outer_products

aten = torch.ops.aten


class Rotary(torch.nn.Module):
    """transformers' LlamaRotaryEmbedding.forward, its default rope type."""

    def __init__(self, dim=16, base=10000.0):
        super().__init__()
        inv = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
        self.register_buffer("inv_freq", inv, persistent=False)

    def forward(self, x, position_ids):
        inv = self.inv_freq[None, :, None].float().expand(position_ids.shape[0], -1, 1)
        pos = position_ids[:, None, :].float()
        freqs = (inv @ pos).transpose(1, 2)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


class Angles(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.rotary = Rotary()

    def forward(self, x, position_ids):
        cos, sin = self.rotary(x, position_ids)
        return x * cos + x.flip(-1) * sin


def _inputs(s=64):
    torch.manual_seed(0)
    x = torch.randn(2, s, 16, dtype=torch.bfloat16)
    pos = torch.arange(1000, 1000 + s)[None].expand(2, s)  # large angles: range reduction
    return x, pos


def test_rotary_angles_fuse(served, partitioned):
    m = Angles()
    x, pos = _inputs()
    c = fuseml.FuseMLCompiler()
    got = torch.compile(m, backend=c)(x, pos)
    want = m(x, pos)
    assert rel_err(got.float(), want.float()) < 1e-2
    ((gm, groups),) = partitioned
    fused = {n for g in groups if g.route == "kernel" for n in g.members}
    left = [n.target for n in gm.graph.nodes if n.op == "call_function" and n not in fused]
    for op in (aten.bmm.default, aten.cos.default, aten.sin.default, aten.cat.default):
        assert op not in left, f"{op} left to ATen: {left}"
    assert any({"cos", "sin", "cat"} <= set(g.op_names) for g in groups if g.route == "kernel")


def test_rewrite_exact_and_only_for_k1():
    torch.manual_seed(0)
    from torch.fx.experimental.proxy_tensor import make_fx

    a1, b1 = torch.randn(3, 5, 1), torch.randn(3, 1, 7)
    a2, b2 = torch.randn(3, 5, 2), torch.randn(3, 2, 7)
    gm = make_fx(lambda a, b, c, d: (torch.bmm(a, b), torch.bmm(c, d), torch.mm(a[0], b[0])), tracing_mode="fake")(
        a1, b1, a2, b2
    )
    assert spell_outer_products(gm) == 2  # the two K = 1 products
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert targets.count(aten.bmm.default) == 1 and targets.count(aten.mul.Tensor) == 2
    got = gm(a1, b1, a2, b2)
    assert torch.equal(got[0], torch.bmm(a1, b1))  # one product per element: exact
    assert torch.equal(got[2], torch.mm(a1[0], b1[0]))
    assert torch.equal(got[1], torch.bmm(a2, b2))


def test_daemon_accepts_cos_and_sin(daemon):
    """A real fusemld (compile-only on this machine) compiles the fragment with cos and sin."""
    m = Angles()
    x, pos = _inputs()
    c = fuseml.FuseMLCompiler()
    torch.compile(m, backend=c)(x, pos)
    gs = [g for p in c.plans for g in p.kernels() if {"cos", "sin"} <= set(g.op_names)]
    assert gs, [p.describe() for p in c.plans]
    assert all(g.key and g.state in ("untuned", "tuned") for g in gs), [g.describe() for g in gs]
