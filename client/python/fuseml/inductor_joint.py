"""Inductor's own compile steps for rest="inductor", where fuseml drives aot_autograd itself.

torch.compile's Inductor does more than its per-graph compiler (compile_fx_inner), and
without it "Inductor alone" would not be Inductor:
- passes over the joint graph (a training graph before it is split) and over an inference
  graph: padding GEMMs whose sizes are not multiples of the tensor cores' tile (pad_mm,
  measured on the GPU), constant folding, pattern replacements. GPT-2's lm_head (vocabulary
  50257) ran unpadded without them: 3.4x Inductor's GPU time in inference on an H200;
- its forward and backward compilers tell compile_fx_inner which inputs are parameters
  (static: never checked for alignment or copied at a call) and which outputs the user
  sees (their strides kept as traced).

partition_fn() is the partitioner aot_autograd is given: Inductor's, which runs the joint
passes and then the min-cut partition fuseml uses by default. Compiler(dynamo_gm) compiles
each graph aot_autograd hands over as Inductor's own compilers do, where this torch has them
as functions (compile_fx_forward, compile_fx_backward); elsewhere compile_fx_inner, an
inference graph given the joint passes first. `how` says which."""

import contextlib
import inspect

from ._log import warn_once


def partition_fn():
    from torch._inductor.compile_fx import partition_fn as inductor_partition

    return inductor_partition


def _own_compilers():
    """torch's forward and backward compilers and what they need, or None where this torch
    lacks them or their parameters are not the ones used here."""
    from torch._inductor import compile_fx

    names = ("compile_fx_forward", "compile_fx_backward", "create_compiler_config_extra", "get_num_model_outputs")
    if not all(hasattr(compile_fx, n) for n in names):
        return None
    forward = inspect.signature(compile_fx.compile_fx_forward).parameters
    backward = inspect.signature(compile_fx.compile_fx_backward).parameters
    want = {"num_orig_model_outputs", "num_example_inputs", "compiler_config_extra", "is_inference"}
    if not want <= set(forward) or "compiler_config_extra" not in backward:
        return None
    return compile_fx


def _config_extra(create, dynamo_gm):
    """What Inductor's forward and backward compilers share, made as this torch makes it: from
    the dynamo graph (its annotations), or, in torch 2.11, from Inductor's config module."""
    first = next(iter(inspect.signature(create).parameters))
    if first == "config":
        import torch._inductor.config

        return create(torch._inductor.config)
    return create(dynamo_gm)


class Compiler:
    """Inductor's compile of the graphs aot_autograd makes from one dynamo graph."""

    def __init__(self, dynamo_gm, dynamo_inputs):
        """dynamo_gm None: a graph compiled outside torch.compile's flow (no dynamo graph to
        count the user's outputs of): compile_fx_inner."""
        self.own = _own_compilers() if dynamo_gm is not None else None
        self.how = "Inductor's forward and backward compilers"
        try:
            if self.own is not None:
                self.outputs = self.own.get_num_model_outputs(dynamo_gm)
                self.inputs = len(dynamo_inputs)
                self.extra = _config_extra(self.own.create_compiler_config_extra, dynamo_gm)
        except (TypeError, AttributeError) as e:  # private functions: another torch's may differ
            self._without_own(e)
        if self.own is None:
            self.how = "compile_fx_inner"

    def _without_own(self, e):
        warn_once(
            "inductor-compilers",
            "Inductor's forward and backward compilers did not take their arguments (%s: %s); "
            "rest=\"inductor\" compiles with compile_fx_inner",
            type(e).__name__,
            e,
            suffix="",
        )
        self.own = None

    def prepare(self, gm, which):
        """The graph as Inductor's compiler for it would first make it: an inference graph's
        joint passes, where compile() will not run them (a training graph's ran before its
        split, in partition_fn)."""
        if which != "inference" or self.own is not None:
            return gm
        from torch._inductor import compile_fx

        record = getattr(compile_fx, "_recursive_record_original_output_strides", None)
        if record is not None:  # a padded GEMM's output must keep the strides it was traced with
            record(gm)
        passes = getattr(compile_fx, "_recursive_joint_graph_passes", None)
        if passes is None:
            from torch._inductor.fx_passes.joint_graph import joint_graph_passes as passes
        context = getattr(compile_fx, "get_cuda_device_context", None)
        with context(gm) if context is not None else contextlib.nullcontext():
            return passes(gm)

    def compile(self, gm, example_inputs, which):
        if self.own is None:
            from torch._inductor.compile_fx import compile_fx_inner

            return compile_fx_inner(gm, example_inputs)
        if which == "backward":
            return self.own.compile_fx_backward(gm, example_inputs, compiler_config_extra=self.extra)
        return self.own.compile_fx_forward(
            gm,
            example_inputs,
            num_orig_model_outputs=self.outputs,
            num_example_inputs=self.inputs,
            compiler_config_extra=self.extra,
            is_inference=which == "inference",
        )
