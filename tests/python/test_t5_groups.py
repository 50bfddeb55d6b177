"""A tiny Hugging Face T5 (bench/models' "t5" config at its tiny size, bf16, SDPA attention):
its attention runs SDPA's math path (the relative-position bias is learned), whose masked
softmax (aten._safe_softmax: softmax, the -inf test of each row, the all-reduction, the fill)
must end up in fused rows groups, forward and backward, with results as eager's."""

import sys

import pytest
import torch

from graph_coverage import elementwise_left, zoo_model
from helpers import rel_err

import fuseml
from fuseml import ops

aten = torch.ops.aten

# the ops of the mask path that must not be left to ATen
MASK_OPS = {
    aten._safe_softmax.default,
    aten._softmax.default,
    aten._softmax_backward_data.default,
    aten.isneginf.default,
    aten.isposinf.default,
    aten.isinf.default,
    aten.isnan.default,
    aten.all.dim,
    aten.any.dim,
    aten.all.dims,
    aten.any.dims,
    aten.masked_fill.Scalar,
    aten.masked_fill.Tensor,
    aten.logical_not.default,
    aten.logical_and.default,
    aten.logical_or.default,
}


def t5_tiny():
    return zoo_model("t5")


def left_to_aten(gm, groups):
    """The mask-path nodes of gm outside every group routed to a kernel (of float or bool
    values: the labels' int64 masked_fill(-100 -> pad) is no fragment's)."""
    fused = {n for g in groups if g.route == "kernel" for n in g.members}
    return [
        n.format_node()
        for n in gm.graph.nodes
        if n.op == "call_function"
        and n.target in MASK_OPS
        and n not in fused
        and getattr(n.meta.get("val"), "dtype", None) in ops.DTYPES
    ]


def masked_softmax_groups(groups):
    return [g for g in groups if g.kind == "rows" and {"all", "amax", "exp", "masked_fill"} <= set(g.op_names)]


def test_t5_forward_mask_path_is_fused(dead_socket, partitioned):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    w = t5_tiny()
    c = fuseml.FuseMLCompiler()
    # without gradients the CPU picks its flash kernel for every attention: the math path is
    # asked for here, as a GPU takes it for T5 (bench/NOTES.md)
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH):
        want = w.forward(w.model, w.inputs)
        got = w.forward(torch.compile(w.model, backend=c), w.inputs)
    assert rel_err(got, want) < 1e-2
    ((gm, groups),) = partitioned
    assert not left_to_aten(gm, groups)
    # every attention (self and cross, encoder and decoder) runs the math path: one group each
    n_math = sum(n.target is aten.all.dim for n in gm.graph.nodes)
    assert n_math == 6
    gs = masked_softmax_groups(groups)
    assert len(gs) == n_math and all(g.route == "kernel" for g in gs), [g.describe() for g in groups]
    assert all(g.built is not None and g.built.wire["vocab"] == 2 for g in gs)
    # the learned bias is added inside the softmax's group
    assert all(g.op_names[0] == "add" for g in gs)
    # q, k and v cast to fp32, scaled and copied for the bmms, the result cast back and its
    # heads merged: all in groups; left is the copy of the bias gathered from its embedding
    # ([1, H, S, S] permuted to contiguous), made once for the encoder's layers, which each
    # copied it (twin_copies.py)
    left = elementwise_left(gm, groups)
    assert [n.target for n in left] == [aten.clone.default], [n.format_node() for n in left]


@pytest.mark.usefixtures("saves_every_intermediate")
def test_t5_training_step_mask_path_is_fused(dead_socket, partitioned):
    w = t5_tiny()
    params = [p for p in w.model.parameters() if p.requires_grad]

    def step(fn):
        for p in params:
            p.grad = None
        loss = w.loss(fn, w.inputs)
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in params]

    want = step(w.model)
    c = fuseml.FuseMLCompiler()
    got = step(torch.compile(w.model, backend=c))
    assert abs(got[0].item() - want[0].item()) < 2e-2 * abs(want[0].item())
    # bf16 gradients through 2 + 2 layers: the compiled graph (decomposed softmaxes, RMSNorms)
    # rounds apart from eager's kernels by up to 1.4% (the same before the mask path was
    # fused: it is ATen here either way, the daemon being absent)
    for a, b in zip(got[1], want[1]):
        err = rel_err(a, b)
        assert err == err and err < 3e-2, err
    whiches = [p.which for p in c.plans]
    assert whiches == ["forward", "backward"], whiches
    (fw, fw_groups), (bw, bw_groups) = partitioned
    assert not left_to_aten(fw, fw_groups)
    assert not left_to_aten(bw, bw_groups)
    assert len(masked_softmax_groups(fw_groups)) >= 2
    # left: the bias's one copy, and the loss's tail over one value per token (cross_entropy.py:
    # the masked sum of per-token losses, the count, the target bounds check), never a row set
    left = elementwise_left(fw, fw_groups)
    tokens = w.inputs["labels"].numel()
    rows_left = [n for n in left if n.meta["val"].numel() > tokens]
    assert [n.target for n in rows_left] == [aten.clone.default], [n.format_node() for n in left]
    # backward: nothing over a row set (the loss's per-token weights aside); the weight
    # gradients' sums over batch and tokens ([B, S, D] -> D, and the bias's [B, H, S, S] ->
    # [H, S, S]) are column groups
    left = elementwise_left(bw, bw_groups)
    assert not [n for n in left if n.meta["val"].numel() > tokens], [n.format_node() for n in left]
    assert len([g for g in bw_groups if g.kind == "columns" and g.route == "kernel"]) >= 12
    # softmax's backward, out * (g - sum(out * g)), is a rows group in the backward graph
    back = [
        g
        for g in bw_groups
        if g.kind == "rows" and g.route == "kernel" and "sum" in g.op_names and "bmm" not in g.op_names
    ]
    assert back, [g.describe() for g in bw_groups]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
