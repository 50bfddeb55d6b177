"""Row groups (vocabulary 2): RMSNorm as Llama writes it, softmax and its backward, found as
one group each with their pointwise prologue/epilogue; per-row statistics saved for backward
become [M, 1] outputs; a real fusemld (compile-only here) accepts every such fragment."""

import torch
import torch.nn as nn
import torch.nn.functional as F

from helpers import Fn, close_bf16, compile_run, fp32_step, plan

import fuseml

BF16 = torch.bfloat16


class RMSNorm(nn.Module):
    """Hugging Face LlamaRMSNorm: fp32 statistics, scaled in the input dtype."""

    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d) + 0.1 * torch.randn(d))
        self.eps = eps

    def forward(self, x):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def rows(p):
    return [g for g in p.groups if g.kind == "rows"]


def test_rmsnorm_is_one_rows_group(dead_socket):
    c, got, want = compile_run(RMSNorm(64).to(BF16), torch.randn(16, 64, dtype=BF16))
    close_bf16(got, want)
    fw = plan(c, "forward")
    (g,) = rows(fw)
    assert g.route == "kernel"
    assert "mean" in g.op_names and "rsqrt" in g.op_names
    w = g.built.wire
    assert w["vocab"] == 2
    red = [op for op in w["ops"] if op["op"] == "mean"]
    assert red == [dict(red[0], dim=-1, keepdim=True)]
    # the rstd that backward needs leaves as a per-row [M, 1] output next to the row outputs
    shapes = sorted(o["shape"] for o in w["outputs"])
    assert [16, 1] in shapes and [16, 64] in shapes
    # the backward's row sum (d rstd) is a rows group too
    assert any("sum" in g.op_names for g in rows(plan(c, "backward")))


def test_softmax_decomposes_into_one_rows_group(dead_socket):
    f = lambda x: torch.softmax(x.float() * 2.0, -1).to(BF16)  # noqa: E731
    c, got, want = compile_run(Fn(f), torch.randn(8, 64, dtype=BF16), train=False)
    (p,) = c.plans
    (g,) = rows(p)
    assert [op for op in g.op_names if op in ("amax", "sum", "exp")] == ["amax", "exp", "sum"]
    assert len(p.kernels()) == 1
    torch.testing.assert_close(got[0], want[0])


def test_reductions_rows_cannot_take_stay_aten(dead_socket):
    # over dim 0 (a bias gradient), and without keepdim
    f = lambda x: (x * 2).sum(0) + (x * 3).sum(-1).sum(0)  # noqa: E731
    c, got, want = compile_run(Fn(f), torch.randn(8, 64), train=False)
    (p,) = c.plans
    assert not rows(p)
    torch.testing.assert_close(got[0], want[0])


def test_daemon_accepts_rows_fragments(daemon):
    torch.manual_seed(0)
    c, got, want = compile_run(RMSNorm(64).to(BF16), torch.randn(12, 64, dtype=BF16))
    close_bf16(got, want)
    ks = [g for p in c.plans for g in p.kernels() if g.kind == "rows"]
    assert len(ks) >= 2
    assert all(g.key and g.state in ("untuned", "tuned") for g in ks), [g.describe() for g in ks]
    torch._dynamo.reset()
    f = lambda x: torch.softmax(x.float(), -1).to(BF16)  # noqa: E731
    c, got, want = compile_run(Fn(f), torch.randn(8, 64, dtype=BF16), fuseml.FuseMLCompiler(), train=False)
    (g,) = [g for p in c.plans for g in p.kernels()]
    assert g.key, g.describe()


def test_layer_norm_forward_is_one_rows_group(dead_socket):
    """nn.LayerNorm: var and mean (var_mean split in two), rsqrt, scale and shift in one rows
    kernel; the mean and rstd backward needs leave as per-row outputs; backward matches."""
    torch.manual_seed(0)
    ln = nn.LayerNorm(64).to(BF16)
    with torch.no_grad():
        ln.weight.add_(0.1 * torch.randn(64, dtype=BF16))
        ln.bias.add_(0.1 * torch.randn(64, dtype=BF16))
    x = torch.randn(16, 64, dtype=BF16)
    c, got, want = compile_run(ln, x)
    close_bf16(got, want, fp32_step(ln, x))
    (g,) = rows(plan(c, "forward"))
    assert g.route == "kernel"
    assert {"var", "mean", "rsqrt"} <= set(g.op_names)
    w = g.built.wire
    assert [op["op"] for op in w["ops"] if op["op"] in ("var", "mean")] == ["var", "mean"]
    assert [op.get("correction") for op in w["ops"] if op["op"] == "var"] == [0]
    assert sorted(o["shape"] for o in w["outputs"]).count([16, 1]) == 2  # mean, rstd


def test_daemon_accepts_layer_norm(daemon):
    ln, x = nn.LayerNorm(64).to(BF16), torch.randn(12, 64, dtype=BF16)
    c, got, want = compile_run(ln, x)
    close_bf16(got, want, fp32_step(ln, x))
    (g,) = rows(plan(c, "forward"))
    assert g.key and g.state in ("untuned", "tuned"), g.describe()


class _TransformerLayer(nn.Module):
    """Pre-norm attention + MLP on [B, S, D]: LayerNorms, QKV, softmax attention (bmm), GELU."""

    def __init__(self, d=64, heads=4, di=128):
        super().__init__()
        self.h = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.o = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, di), nn.Linear(di, d)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, -1)
        q, k, v = [t.view(b, s, self.h, d // self.h).transpose(1, 2) for t in (q, k, v)]
        a = torch.softmax(q @ k.transpose(-1, -2) / (d // self.h) ** 0.5, -1) @ v
        x = x + self.o(a.transpose(1, 2).reshape(b, s, d))
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln2(x))))


def test_small_transformer_layer(dead_socket):
    """Both LayerNorms and the attention softmax become row groups; fc1 carries GELU (the
    [B, S, N] view there and back between them goes, so GELU reads the product) and fc2 its
    residual add; the out-proj's residual add feeds the second LayerNorm and runs in its rows
    group, the product on cuBLAS; the scores' scale and cast run in the softmax's rows group,
    both bmm's on cuBLAS (an epilogue feeding a rows group moves into it); outputs and
    gradients match eager."""
    torch.manual_seed(0)
    layer, x = _TransformerLayer().to(BF16), torch.randn(2, 8, 64, dtype=BF16)
    c, got, want = compile_run(layer, x)
    close_bf16(got, want, fp32_step(layer, x))
    fw = plan(c, "forward")
    rg = rows(fw)
    assert len(rg) == 3 and all(g.route == "kernel" for g in rg)
    assert sum("amax" in g.op_names for g in rg) == 1  # the softmax
    assert sum("var" in g.op_names for g in rg) == 2  # the LayerNorms
    fused = [g.op_names for g in fw.kernels() if g.kind == "gemm" and "bmm" not in g.op_names]
    assert ["addmm", "gelu"] in fused
    assert sum(ops[-1] in ("add", "_to_copy") for ops in fused) == 1  # fc2's residual
    ln2 = [g for g in rg if "var" in g.op_names][1]
    assert ln2.op_names[0] == "add" and ln2.members[0] in ln2.escapes  # the residual stream
    lone = [g for g in fw.groups if g.kind == "gemm" and g.route == "bypass" and "bmm" not in g.op_names]
    assert len(lone) == 2 and all("lone GEMM" in g.reason for g in lone)  # QKV, out-proj
    fc1 = next(g for g in fw.kernels() if "gelu" in g.op_names)
    assert fc1.built.wire["outputs"][0]["shape"] == [-1, 128]
    scores, pv = [g for g in fw.groups if g.kind == "gemm" and "bmm" in g.op_names]
    assert all(g.route == "bypass" and "lone GEMM" in g.reason for g in (scores, pv))
    (softmax,) = [g for g in rg if "amax" in g.op_names]
    assert softmax.op_names[:2] == ["div", "_to_copy"], softmax.describe()


def test_daemon_accepts_every_transformer_layer_group(daemon):
    torch.manual_seed(0)
    layer, x = _TransformerLayer().to(BF16), torch.randn(2, 8, 64, dtype=BF16)
    c, got, want = compile_run(layer, x)
    close_bf16(got, want, fp32_step(layer, x))
    ks = [g for p in c.plans for g in p.kernels()]
    assert len(ks) >= 7  # 3 row groups and 4 GEMM epilogues forward, more in backward
    assert all(g.key and g.state in ("untuned", "tuned") for g in ks), [
        (g.describe(), g.reason) for g in ks if not g.key
    ]


def test_softmax_backwards_are_rows_groups(dead_socket):
    """Cross-entropy's backward (_log_softmax_backward_data) and softmax's (_softmax_backward_data)
    are decomposed into one rows group each, not left to ATen's softmax-backward kernels."""
    for f, reduce_with in (
        (lambda x: torch.log_softmax(x.float(), -1).to(BF16), "exp"),
        (lambda x: torch.softmax(x.float(), -1).to(BF16), "sum"),
    ):
        c, got, want = compile_run(Fn(f), torch.randn(8, 64, dtype=BF16))
        close_bf16(got, want)
        bw = plan(c, "backward")
        groups = rows(bw)
        assert groups and all(g.route == "kernel" for g in groups), bw.describe()
        assert any("sum" in g.op_names and reduce_with in g.op_names for g in groups), bw.describe()
        unfused = [n.target for n in bw.groups[0].members[0].graph.nodes if "softmax_backward" in str(n.target)]
        assert not unfused, unfused


def test_cross_entropy_over_a_long_vocabulary(daemon):
    """Rows longer than registers hold (a vocabulary of 40 000 > 32 768) are streamed: the
    log_softmax forward and its backward are rows groups, and a real fusemld accepts both
    fragments; the var of a LayerNorm over such rows stays ATen."""
    torch.manual_seed(0)
    vocab = 40000
    labels = torch.randint(0, vocab, (6,))
    # log_softmax and nll_loss spelled out: cross_entropy itself keeps no log-probabilities
    # (cross_entropy.py; its long-vocabulary case is in test_cross_entropy.py)
    f = lambda x: F.nll_loss(F.log_softmax(x.float(), -1), labels)  # noqa: E731
    c, got, want = compile_run(Fn(f), torch.randn(6, vocab, dtype=BF16), fuseml.FuseMLCompiler())
    torch.testing.assert_close(got[0], want[0], rtol=1e-4, atol=1e-4)
    for phase, reduce_with in (("forward", "amax"), ("backward", "exp")):
        groups = rows(plan(c, phase))
        assert any(reduce_with in g.op_names for g in groups), plan(c, phase).describe()
        for g in groups:
            assert g.key and g.state in ("untuned", "tuned"), g.describe()
            assert [vocab] == sorted({o["shape"][-1] for o in g.built.wire["outputs"]} - {1})
    torch._dynamo.reset()
    ln = nn.LayerNorm(vocab).to(BF16)
    c, got, want = compile_run(ln, torch.randn(2, vocab, dtype=BF16), train=False)
    (p,) = c.plans
    assert not any("var" in g.op_names for g in rows(p)), p.describe()
