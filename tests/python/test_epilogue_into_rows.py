"""A GEMM's pointwise epilogue (the residual add, casts, the square a norm reduces, an
activation, a softcap) runs in the rows group it feeds, the product on cuBLAS: the residual
stream + RMSNorm / LayerNorm as one rows kernel, as Inductor makes it; Gemma 2's softcapped
logits and the loss's softmax as another. Nothing moves where the rows group would then wait
on itself."""

import torch
import torch.nn as nn

from helpers import close_bf16, compile_run, fp32_step, plan

BF16 = torch.bfloat16


class _RMSNorm(nn.Module):
    """Hugging Face's Llama RMSNorm: fp32 statistics, bf16 out, then the weight."""

    def __init__(self, d):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d) + 0.1 * torch.randn(d))

    def forward(self, x):
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return self.weight * h.to(x.dtype)


class _ResidualNorm(nn.Module):
    """x = x + o(h); out = up(norm(x)) + x: the out-projection's residual feeds the norm."""

    def __init__(self, d=64, norm="rms"):
        super().__init__()
        self.o = nn.Linear(d, d, bias=False)
        self.up = nn.Linear(d, d, bias=False)
        self.norm = _RMSNorm(d) if norm == "rms" else nn.LayerNorm(d)

    def forward(self, x):
        x = x + self.o(torch.tanh(x))
        return self.up(self.norm(x)) + x


def _groups(p, kind):
    return [g for g in p.groups if g.kind == kind]


def test_residual_add_joins_the_rmsnorm(dead_socket):
    torch.manual_seed(0)
    c, got, want = compile_run(_ResidualNorm().to(BF16), torch.randn(2, 8, 64, dtype=BF16), train=False)
    close_bf16(got, want)
    (p,) = [p for p in c.plans if p.which == "inference"]
    (norm,) = _groups(p, "rows")
    assert norm.route == "kernel"
    assert norm.op_names[:3] == ["add", "_to_copy", "pow"] and "mean" in norm.op_names
    assert norm.members[0] in norm.escapes  # the residual stream leaves it too
    o_proj = next(g for g in _groups(p, "gemm") if g.members[-1] in norm.inputs)
    assert o_proj.route == "bypass" and "lone GEMM" in o_proj.reason


def test_residual_add_joins_the_layer_norm_in_training(dead_socket):
    torch.manual_seed(0)
    model, x = _ResidualNorm(norm="ln").to(BF16), torch.randn(2, 8, 64, dtype=BF16)
    c, got, want = compile_run(model, x)
    close_bf16(got, want, fp32_step(model, x))  # against eager, or nearer fp32 than eager
    fw = plan(c, "forward")
    (norm,) = [g for g in _groups(fw, "rows") if "var" in g.op_names]
    assert norm.op_names[0] == "add" and norm.route == "kernel"
    o_proj = next(g for g in _groups(fw, "gemm") if g.members[-1] in norm.inputs)
    assert o_proj.route == "bypass" and "add" not in o_proj.op_names


class _ActivationThenNorm(nn.Module):
    """layer_norm(gelu(fc(x))): the bias and GELU move into the norm's rows group."""

    def __init__(self, d=64):
        super().__init__()
        self.fc = nn.Linear(d, d)
        self.norm = nn.LayerNorm(d)

    def forward(self, x):
        return self.norm(torch.nn.functional.gelu(self.fc(x)))


def test_an_activation_moves_into_the_norm(dead_socket):
    torch.manual_seed(0)
    c, got, want = compile_run(_ActivationThenNorm().to(BF16), torch.randn(2, 8, 64, dtype=BF16), train=False)
    close_bf16(got, want)
    (p,) = [p for p in c.plans if p.which == "inference"]
    (fc,) = _groups(p, "gemm")
    assert fc.route == "bypass" and "gelu" not in fc.op_names
    (norm,) = _groups(p, "rows")
    assert "gelu" in norm.op_names and norm.route == "kernel"


class _NormReadsAFlip(nn.Module):
    """e = o(x) + x; out = layer_norm(e) * flip(e): the norm's rows group reads flip(e), an ATen
    op computed from the epilogue, so moving the add into the rows group would make it wait on
    itself; the add stays in the GEMM."""

    def __init__(self, d=64):
        super().__init__()
        self.o = nn.Linear(d, d, bias=False)
        self.norm = nn.LayerNorm(d)

    def forward(self, x):
        e = self.o(x) + x
        return self.norm(e) * torch.flip(e, [-1])


def test_nothing_moves_when_the_rows_group_would_wait_on_itself(dead_socket):
    torch.manual_seed(0)
    c, got, want = compile_run(_NormReadsAFlip().to(BF16), torch.randn(2, 8, 64, dtype=BF16), train=False)
    close_bf16(got, want)
    (p,) = [p for p in c.plans if p.which == "inference"]
    (o,) = _groups(p, "gemm")
    assert "add" in o.op_names and o.route == "kernel"
    (norm,) = _groups(p, "rows")
    assert norm.op_names[0] == "var"  # the add and the cast stayed in the GEMM
