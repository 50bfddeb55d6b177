"""GEMM + epilogue groups: what the partitioner finds in bf16 models (forward and backward),
the vocabulary-3 fragments it builds (symbolic M with an M bucket), the reasons GEMMs stay
with cuBLAS, and round trips of those fragments through a real fusemld (compile-only here)."""

import pytest
import torch
import torch.nn as nn

from helpers import close_bf16, compile_run, plan
from models import ActivationHeavyMLP, LlamaMLP, StackedTransformerMLP, TransformerMLP

import fuseml
from fuseml import transport

BF16 = torch.bfloat16


def x_bf16(m=16, d=32):
    return torch.randn(m, d, dtype=BF16)


def gemms(p):
    return [g for g in p.groups if g.kind == "gemm"]


def test_mlp_forward_epilogues(dead_socket):
    c, got, want = compile_run(TransformerMLP().to(BF16), x_bf16())
    close_bf16(got, want)  # no daemon: every group ran its ATen ops
    fw = plan(c, "forward")
    g1, g2 = fw.kernels()
    assert g1.kind == g2.kind == "gemm"
    assert g1.op_names == ["addmm", "gelu"] and g2.op_names == ["addmm", "add"]
    # the pre-activation is saved for gelu_backward: an extra output of the GEMM kernel
    assert [n.name for n in g1.escapes] == ["addmm"]
    w = g1.built.wire
    assert w["vocab"] == 3 and w["m_hint"] == 16
    a, b, bias = (w["inputs"][i] for i in (1, 2, 0))
    assert a["shape"] == [-1, 32] and a["strides"] == [32, 1]  # x, row-major, M symbolic
    assert b["shape"] == [32, 64] and b["strides"] == [1, 32]  # weight.t(): column-major
    assert bias["shape"] == [1, 64] and bias["strides"] == [0, 1]
    assert [o["shape"] for o in w["outputs"]] == [[-1, 64], [-1, 64]]
    assert [op["op"] for op in w["ops"]] == ["addmm", "gelu"]
    # the residual is an [M, N] input of the second GEMM's epilogue
    assert [op["op"] for op in g2.built.wire["ops"]] == ["addmm", "add"]
    assert g2.built.wire["inputs"][3]["shape"] == [-1, 32]


def test_backward_mm_with_residual_gradient(dead_socket):
    c, got, want = compile_run(TransformerMLP().to(BF16), x_bf16())
    close_bf16(got, want)
    bw = plan(c, "backward")
    fused = [g for g in gemms(bw) if g.route == "kernel"]
    # d(pre-activation) = gelu_backward(dy @ W2, addmm) in the GEMM's epilogue;
    # dx = dh @ W1 + dy (the residual's gradient)
    assert [g.op_names for g in fused] == [["mm", "gelu_backward"], ["mm", "add"]]
    lone = [g for g in gemms(bw) if g.route == "bypass"]
    assert lone and all("lone GEMM" in g.reason for g in lone)


@pytest.mark.usefixtures("saves_every_intermediate")
def test_llama_gate_and_up_are_one_sibling_group(dead_socket):
    """gate and up read one x: one group with both products (test_sibling_groups.py)."""
    c, got, want = compile_run(LlamaMLP().to(BF16), x_bf16())
    close_bf16(got, want)
    fw = plan(c, "forward")
    (g,) = fw.kernels()
    assert g.siblings and g.op_names == ["mm", "silu", "mm", "mul"]
    assert sorted(n.name for n in g.escapes) == ["mm", "mm_1", "silu"]  # saved for backward
    assert not any(n.target == torch.ops.aten.mm.default for n in g.inputs)


def test_heavy_and_stacked_one_kernel_per_linear(dead_socket):
    c, got, want = compile_run(ActivationHeavyMLP().to(BF16), x_bf16(), train=False)
    close_bf16(got, want)
    (p,) = [p for p in c.plans if p.which == "inference"]
    assert [g.op_names for g in p.kernels()] == [["addmm", "gelu", "mul", "add"], ["addmm", "add"]]
    torch._dynamo.reset()
    c, got, want = compile_run(StackedTransformerMLP().to(BF16), x_bf16(), train=False)
    close_bf16(got, want)
    (p,) = [p for p in c.plans if p.which == "inference"]
    assert len(p.kernels()) == 8 and all(g.kind == "gemm" for g in p.kernels())
    # inference saves nothing: no escapes
    assert all(not g.escapes for g in p.kernels())


def test_reasons_gemms_stay_with_cublas(dead_socket):
    # fp32: the template takes bf16/f16
    c, _, _ = compile_run(TransformerMLP(), torch.randn(8, 32), train=False)
    (p,) = [p for p in c.plans if p.which == "inference"]
    assert all("template takes bf16/f16" in g.reason for g in gemms(p))
    # K not a multiple of 8: no longer a reason (the daemon serves a cuBLASLt plan), the
    # GEMMs group with their epilogues; without a daemon they run eager, correctly
    torch._dynamo.reset()
    c, got, want = compile_run(TransformerMLP(d_model=20, d_intermediate=64).to(BF16), x_bf16(8, 20), train=False)
    close_bf16(got, want)
    (p,) = [p for p in c.plans if p.which == "inference"]
    assert not any("multiple of 8" in (g.reason or "") for g in gemms(p))
    assert any(g.kind == "gemm" for g in p.groups)


class _ReadsOwnOperand(nn.Module):
    """x @ W + x * 2: the epilogue would read A itself, which the template cannot."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(32, 32, dtype=BF16))

    def forward(self, x):
        return torch.mm(x, self.w) + x * 2


def test_epilogue_never_reads_the_gemm_operands(dead_socket):
    c, got, want = compile_run(_ReadsOwnOperand(), x_bf16(), train=False)
    close_bf16(got, want)
    (p,) = [p for p in c.plans if p.which == "inference"]
    for g in gemms(p):
        a, b = g.members[0].args[-2:]
        assert all(a not in n.all_input_nodes and b not in n.all_input_nodes for n in g.members[1:])


def test_m_bucket_shares_a_key_across_batch_sizes(daemon):
    """Batch sizes 48 and 60 share the bucket 64 (one key); 8 gets its own."""
    keys = {}
    for m in (48, 60, 8):
        torch._dynamo.reset()
        torch.manual_seed(0)
        model = TransformerMLP().to(BF16)
        c, got, want = compile_run(model, x_bf16(m), train=False)
        close_bf16(got, want)
        (p,) = [p for p in c.plans if p.which == "inference"]
        ks = p.kernels()
        assert len(ks) == 2 and all(g.key and g.state in ("untuned", "tuned") for g in ks), [g.describe() for g in ks]
        keys[m] = [g.key for g in ks]
    assert keys[48] == keys[60]
    assert keys[8] != keys[48]


def test_daemon_serves_a_plan_where_the_templates_cannot_run(daemon):
    """K = 12 (not 8-element chunks): the generated templates refuse it, so the daemon's
    default is a cuBLASLt plan (mm + relu: cuBLASLt's own epilogue, no kernel); an operand
    that is neither row- nor column-major comes back as a clear refusal (the group runs
    eager)."""
    conn = transport.connect(daemon.socket, timeout=30)
    try:
        frag = {
            "vocab": 3,
            "m_hint": 100,
            "inputs": [{"id": 0, "dtype": "bf16", "shape": [-1, 12]}, {"id": 1, "dtype": "bf16", "shape": [12, 16]}],
            "ops": [{"op": "mm", "out": 2, "args": [0, 1]}, {"op": "relu", "out": 3, "args": [2]}],
            "outputs": [{"id": 3, "dtype": "bf16", "shape": [-1, 16]}],
        }
        bad = {
            "vocab": 3,
            "inputs": [
                {"id": 0, "dtype": "bf16", "shape": [64, 16], "strides": [32, 2]},
                {"id": 1, "dtype": "bf16", "shape": [16, 16]},
            ],
            "ops": [{"op": "mm", "out": 2, "args": [0, 1]}],
            "outputs": [{"id": 2, "dtype": "bf16", "shape": [64, 16]}],
        }
        r, rb = transport.compile_all(conn, [frag, bad], 60)
    finally:
        conn.close()
    assert r.get("ok"), r
    meta = r["meta"]
    assert meta["kind"] == "cublaslt" and meta["grid"]["rule"] == "none"
    plan = meta["blas"]
    assert plan["form"] == "direct" and plan["act"] == "relu" and plan["k"] == 12 and plan["algo"] is None
    assert not rb.get("ok") and rb.get("code") == "unsupported", rb
    assert "neither row- nor column-major" in rb.get("detail", ""), rb


def test_explain_prints_every_group_and_why(dead_socket):
    import io

    buf = io.StringIO()
    rows = fuseml.explain(TransformerMLP().to(BF16), x_bf16(), file=buf)
    text = buf.getvalue()
    assert rows and "groups" in text.splitlines()[0]
    assert "addmm -> gelu" in text and "addmm -> add" in text
    # no daemon here: each group says why it is not a kernel
    assert all(not r["strategy"].startswith("kernel") for r in rows)
    assert all(r["strategy"].split(" ")[0] in ("eager", "bypass", "aten") for r in rows)


def test_a_dropped_gemm_group_runs_its_epilogue_as_one_kernel(daemon, monkeypatch):
    """When measured routing finds a GEMM group's fused kernel slower than its ATen ops, the
    product goes to cuBLAS and the epilogue is requested from the daemon as a pointwise group
    of its own (one kernel instead of one ATen kernel per op), shown in the plan as apart from
    the GEMM group; the result stays right."""
    monkeypatch.setenv("FUSEML_REQUEST_CPU_GRAPHS", "1")
    torch.manual_seed(0)
    lin = torch.nn.Linear(32, 64).to(torch.bfloat16)
    f = lambda x: torch.nn.functional.gelu(lin(x)) * 2.0 + 1.0  # noqa: E731
    x = torch.randn(16, 32, dtype=torch.bfloat16)
    c = fuseml.FuseMLCompiler()
    fn = torch.compile(f, backend=c)
    with torch.no_grad():
        fn(x)
        (p,) = c.plans
        (g,) = [g for g in p.kernels() if g.kind == "gemm"]
        comp = p.compiled
        comp.runners[g.gid].use_kernel = False  # what _decide does when ATen wins
        comp.pending = True
        out = fn(x)
    epilogues = [h for h in p.groups if h.apart_of is g]
    assert len(epilogues) == 1, p.describe()
    (h,) = epilogues
    assert h.kind == "pointwise" and h.route == "kernel" and h.key
    assert [op for op in h.op_names] == ["gelu", "mul", "add"]
    assert h in comp.kept and g not in comp.kept
    assert f"apart from group {g.gid}" in p.describe()
    torch.testing.assert_close(out, f(x))


def test_a_dropped_sibling_group_runs_silu_times_up_as_one_kernel(daemon, monkeypatch):
    """Siblings too: when SwiGLU's gate/up kernel loses to cuBLAS, both products go to cuBLAS
    and silu(gate) * up is one pointwise kernel, not an ATen silu and an ATen mul."""
    monkeypatch.setenv("FUSEML_REQUEST_CPU_GRAPHS", "1")
    torch.manual_seed(0)
    mlp = LlamaMLP().to(BF16)
    x = x_bf16()
    c = fuseml.FuseMLCompiler()
    fn = torch.compile(mlp, backend=c)
    with torch.no_grad():
        fn(x)
        (p,) = c.plans
        (g,) = [g for g in p.kernels() if g.siblings]
        comp = p.compiled
        comp.runners[g.gid].use_kernel = False  # what _decide does when ATen wins
        comp.pending = True
        out = fn(x)
    (h,) = [h for h in p.groups if h.apart_of is g]
    assert h.kind == "pointwise" and h.route == "kernel" and h.key
    assert h.op_names == ["silu", "mul"]
    assert h in comp.kept and g not in comp.kept
    torch.testing.assert_close(out, mlp(x))


class _GeluTanhMLP(nn.Module):
    """GPT-2's MLP with its GELU written out (transformers' NewGELUActivation): its backward
    computes 0.5 * x and 1 + tanh(u) from the forward's saved tensors before the gradient's
    GEMM is reached."""

    def __init__(self, d=32, di=128):
        super().__init__()
        self.fc, self.proj = nn.Linear(d, di), nn.Linear(di, d)

    def forward(self, x):
        h = self.fc(x)
        a = 0.5 * h * (1.0 + torch.tanh(0.7978845608028654 * (h + 0.044715 * torch.pow(h, 3.0))))
        return self.proj(a)


def _lone_pointwise(p):
    return [g for g in p.groups if g.kind == "pointwise" and g.route == "bypass"]


def test_pointwise_producers_join_the_gemm_epilogue(dead_socket):
    """The pointwise ops the epilogue reads, computed from tensors of its shape that are not
    the product's operands, join the GEMM group instead of running as kernels of their own."""
    torch.manual_seed(0)
    model, x = _GeluTanhMLP().to(BF16), torch.randn(2, 8, 32, dtype=BF16)
    c, got, want = compile_run(model, x)
    close_bf16(got, want)
    bw = plan(c, "backward")
    assert not _lone_pointwise(bw), bw.describe()
    (g,) = [g for g in gemms(bw) if "tanh_backward" in g.op_names]
    assert g.route == "kernel" and g.op_names.count("mul") >= 4, g.describe()


def test_daemon_accepts_the_gemm_epilogue_with_producers(daemon):
    torch.manual_seed(0)
    model, x = _GeluTanhMLP().to(BF16), torch.randn(2, 8, 32, dtype=BF16)
    c, got, want = compile_run(model, x)
    close_bf16(got, want)
    (g,) = [g for g in gemms(plan(c, "backward")) if "tanh_backward" in g.op_names]
    assert g.key and g.state in ("untuned", "tuned"), g.describe()


def test_a_gemm_group_the_builder_refuses_keeps_its_epilogue_fused(dead_socket, monkeypatch):
    """A GEMM group whose fragment cannot be spelled (here every one, the builder made to
    refuse) runs its product on cuBLAS and its epilogue as one pointwise group, placed after
    it, not as one ATen kernel per op; results as eager's."""
    from fuseml import backend
    from fuseml.fragment import Unfusable

    def refuse(*a, **k):
        raise Unfusable("refused for the test")

    monkeypatch.setattr(backend, "build_gemm", refuse)
    c, got, want = compile_run(ActivationHeavyMLP().to(BF16), x_bf16(), train=False)
    close_bf16(got, want)
    p = c.plans[-1]
    refused = [g for g in gemms(p) if g.reason == "refused for the test"]
    assert len(refused) == 2 and all(g.route == "bypass" for g in refused)
    # linear1's epilogue (gelu, * 0.5, + 0.125) is one kernel; linear2's (the residual add
    # alone) is a single op, ATen's as any lone op is
    first = refused[0]
    (h,) = [h for h in p.groups if getattr(h, "apart_of", None) is first]
    assert h.kind == "pointwise" and h.route == "kernel" and h.op_names == ["gelu", "mul", "add"], h.describe()
    assert p.groups.index(h) == p.groups.index(first) + 1
    assert not [h for h in p.groups if getattr(h, "apart_of", None) is refused[1]]
