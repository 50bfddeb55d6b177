"""What a partitioned graph leaves to ATen: the ops over float or bool values computed from
float or bool operands that no group routed to a kernel holds, library calls and views aside.
Shared by the tests that take real models' graphs through the backend."""

import importlib.util
import os

import pytest
import torch

from fuseml import embedding_grad, ops

aten = torch.ops.aten
BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "models")

# library calls and what feeds them (token ids, integer bucket arithmetic): not fuseml's
LIBRARY = {
    aten.mm.default,
    aten.addmm.default,
    aten.bmm.default,
    aten.convolution.default,
    aten.convolution_backward.default,
    aten.embedding.default,
    aten.embedding_dense_backward.default,
    aten.nll_loss_forward.default,
    aten.nll_loss_backward.default,
    aten._scaled_dot_product_flash_attention_for_cpu.default,
    aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
    embedding_grad.embedding_grad,  # embedding_dense_backward as a scatter-add
    embedding_grad.embedding_grad_fp32,
}


def is_view(target):
    """An op whose result aliases its input (its schema says so): no kernel runs."""
    schema = getattr(target, "_schema", None)
    return schema is not None and bool(schema.returns) and schema.returns[0].alias_info is not None


def zoo_model(name, size="tiny"):
    """bench/models' workload `name` at `size` on the CPU (its model, inputs, forward, loss)."""
    pytest.importorskip("timm" if name in ("vit", "convnet") else "transformers")
    spec = importlib.util.spec_from_file_location(f"bench_models_zoo_{name}", os.path.join(BENCH, "model_zoo.py"))
    zoo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(zoo)
    return zoo.build(name, size, "cpu")


def elementwise_left(gm, groups):
    """Ops over float or bool values computed from float or bool operands, outside every
    group routed to a kernel: what still runs as one ATen kernel each."""
    fused = {n for g in groups if g.route == "kernel" for n in g.members}
    left = []
    for n in gm.graph.nodes:
        if (
            n.op != "call_function"
            or n in fused
            or n.target in LIBRARY
            or n.target in ops.VIEW_OPS
            or n.target in ops.RESHAPE_OPS
            or is_view(n.target)
        ):
            continue
        val = n.meta.get("val")
        if getattr(val, "dtype", None) not in ops.DTYPES or not n.all_input_nodes:
            continue
        if all(getattr(a.meta.get("val"), "dtype", None) in ops.DTYPES for a in n.all_input_nodes):
            left.append(n)
    return left
