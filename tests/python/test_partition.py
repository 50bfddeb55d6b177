"""Fusion discovery on the ATen graphs aot_autograd gives for the reference models."""

import pytest
import torch

from helpers import compile_run, plan
from models import ActivationHeavyMLP, LlamaMLP, StackedTransformerMLP, TransformerMLP

import fuseml


def x2d():
    return torch.randn(8, 32)


def kinds(p, kind):
    return [g for g in p.groups if g.kind == kind]


def test_mlp_block_fp32_gemms_bypass_and_single_ops_left(dead_socket):
    c, _, _ = compile_run(TransformerMLP(), x2d())
    fw = plan(c, "forward")
    gemms = kinds(fw, "gemm")
    assert [g.op_names for g in gemms] == [["addmm"], ["addmm"]]
    # fp32 GEMMs stay with cuBLAS (bf16/f16 GEMM groups: test_gemm_groups.py)
    assert all(g.route == "bypass" and "template takes bf16/f16" in g.reason for g in gemms)
    # gelu and the residual add are single ops: one kernel each either way.
    pw = kinds(fw, "pointwise")
    assert [g.op_names for g in pw] == [["gelu"], ["add"]]
    assert all(g.route == "bypass" and "single op" in g.reason for g in pw)
    # min_ops=1 sends them too.
    torch._dynamo.reset()
    c1, _, _ = compile_run(TransformerMLP(), x2d(), fuseml.FuseMLCompiler(min_ops=1))
    assert [g.op_names for g in plan(c1, "forward").kernels()] == [["gelu"], ["add"]]


def test_activation_heavy_chain_is_one_group(dead_socket):
    c, _, _ = compile_run(ActivationHeavyMLP(), x2d())
    fw = plan(c, "forward")
    (k,) = fw.kernels()
    assert k.op_names == ["gelu", "mul", "add"]
    assert k.escapes == []  # gelu's output is not needed by backward
    assert len(k.inputs) == 1 and k.inputs[0].target == torch.ops.aten.addmm.default
    assert k.built.wire["outputs"][0]["shape"] == [8, 64]
    assert len(kinds(fw, "gemm")) == 2
    bw = plan(c, "backward")
    # mul(0.5)'s backward and gelu_backward (spelled with erf) join one pointwise group;
    # the fp32 GEMMs stay ATen; the bias-gradient sums are column groups of their own.
    (pw,) = [g for g in bw.kernels() if "gelu_backward" in g.op_names]
    assert pw.kind == "pointwise" and "mul" in pw.op_names
    assert all(g.route == "bypass" for g in kinds(bw, "gemm"))
    assert not kinds(bw, "reduction")
    assert [g.op_names for g in kinds(bw, "columns")] == [["sum"], ["sum"]]


def test_stacked_mlp_four_blocks(dead_socket):
    c, _, _ = compile_run(StackedTransformerMLP(), x2d(), fuseml.FuseMLCompiler(min_ops=1))
    fw = plan(c, "forward")
    assert len(kinds(fw, "gemm")) == 8
    assert [g.op_names for g in fw.kernels()] == [["gelu"], ["add"]] * 4


@pytest.mark.usefixtures("saves_every_intermediate")
def test_llama_swiglu_escape_for_backward(dead_socket):
    c, _, _ = compile_run(LlamaMLP(), x2d())
    fw = plan(c, "forward")
    (k,) = fw.kernels()
    assert k.op_names == ["silu", "mul"]
    # mul's backward needs silu(gate): it leaves the kernel as an extra output.
    assert [n.target for n in k.escapes] == [torch.ops.aten.silu.default]
    assert len(k.built.wire["outputs"]) == 2
    assert [g.op_names for g in kinds(fw, "gemm")] == [["mm"]] * 3
    bw = plan(c, "backward")
    assert any("silu_backward" in g.op_names and g.route == "kernel" for g in bw.groups)


def test_llama_inference_has_no_escape(dead_socket):
    c, _, _ = compile_run(LlamaMLP(), x2d(), train=False)
    inf = plan(c, "inference")
    (k,) = inf.kernels()
    assert k.op_names == ["silu", "mul"] and k.escapes == []


def test_dynamic_batch_is_symbolic_dim0(dead_socket):
    c, _, _ = compile_run(ActivationHeavyMLP(), torch.randn(2, 5, 32), dynamic=True)
    (k,) = plan(c, "forward").kernels()
    w = k.built.wire
    # [s0, s1, 64] collapses to one symbolic dim 0: [-1, 64], dense strides.
    assert w["inputs"][0]["shape"] == [-1, 64] and w["inputs"][0]["strides"] == [64, 1]
    assert w["outputs"][0]["shape"] == [-1, 64]


def test_escape_used_between_members():
    """An intermediate read by a node that sits between the group's members (here a GEMM
    whose result the chain then uses) forces neither a cycle nor a wrong order."""

    def f(x, w):
        a = torch.sigmoid(x)
        m = a @ w
        return torch.relu(a * 2.0) + m

    gm = torch.fx.experimental.proxy_tensor.make_fx(f)(torch.randn(4, 4), torch.randn(4, 4))
    groups = fuseml.find_groups(gm)
    pw = [g for g in groups if g.kind == "pointwise"]
    # add needs mm, which needs sigmoid: add may join sigmoid's group only if mm does not
    # depend on that group. It does, so add starts its own group.
    first = pw[0]
    assert first.op_names[0] == "sigmoid"
    assert "add" not in first.op_names
    assert first.members[0] in first.outputs
