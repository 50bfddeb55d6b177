"""Inference graphs called directly, without aot_autograd's runtime wrappers, to cut host
time. An inference step of a small model is host-bound: on the H100 machines a compiled MLP
block spends ~0.05 ms of host time per call for ~0.04 ms of GPU time, and under cProfile
about a third of the compiled call went through aot_autograd's layers around the graph
(its argument list, the runtime wrapper, a grad-mode switch, a second dynamo-disable
frame), none of which does anything for a plain inference graph.

Those layers exist for what a graph may do that its ATen trace cannot: mutate an input
(the mutation is applied back after the call), return an alias of an input or of an
intermediate (regenerated as a view), take a tensor subclass, the same tensor twice, lifted
parameters, effect tokens, functionalised RNG state, autocast at trace time. The inference
compiler records the graph it compiled and aot_autograd's metadata for it; when none of
those applies, the function handed to dynamo calls the compiled graph with dynamo's
arguments as they come. Anything this module cannot read (a torch without the metadata, a
field renamed) keeps the wrapped callable: slower, never wrong.

    capture = direct_call.Capture(gm, example_inputs)  # before aot_autograd
    ... inference_compiler: fn = ...; capture.note(graph, fn)
    return capture.callable(wrapped)                   # after: direct, or `wrapped`"""

import torch

from . import settings
from ._log import log


def wanted(default=None):
    """Whether inference graphs are called directly: FuseMLCompiler(direct=...), else
    FUSEML_DIRECT (default on; FUSEML_DIRECT=0 keeps aot_autograd's wrappers)."""
    if default is not None:
        return bool(default)
    return settings.direct()


def _autocast_on():
    probe = getattr(torch._C, "_is_any_autocast_enabled", None)
    if probe is not None:
        return probe()
    return torch.is_autocast_enabled() or torch.is_autocast_cpu_enabled()


def _is_subclass(t):
    try:
        from torch.utils._python_dispatch import is_traceable_wrapper_subclass
    except ImportError:
        return True  # cannot tell: assume the worst
    return is_traceable_wrapper_subclass(t)


def _metadata_says_plain(meta):
    """None when aot_autograd's runtime wrapper would hand the graph's outputs through
    unchanged, else why not. A missing mutation field counts as a mutation; the other
    fields are newer than some torch versions, which then lack what they describe."""
    from torch._functorch._aot_autograd.schemas import OutputType

    for info in meta.input_info:
        if (
            getattr(info, "mutates_data", True)
            or getattr(info, "mutates_metadata", True)
            or getattr(info, "mutates_storage_metadata", False)
        ):
            return "an input is mutated"
    if any(o.output_type != OutputType.non_alias for o in meta.output_info):
        return "an output aliases an input or an intermediate"
    # fields a torch may lack (then it lacks the feature too); each must be empty or false
    for field, why in (
        ("num_intermediate_bases", "intermediate bases"),
        ("unsafe_view_out_indices", "unsafe views among the outputs"),
        ("tokens", "effect tokens"),
        ("is_rng_op_functionalized", "functionalised RNG"),
        ("dynamic_outputs", "outputs marked dynamic"),
        ("act_input_paths", "async collective inputs"),
    ):
        if getattr(meta, field, None):
            return why
    if getattr(meta, "grad_enabled_mutation", None) is not None:
        return "the graph switches grad mode"
    subclass_meta = getattr(meta, "subclass_inp_meta", None) or []
    if any(type(m).__name__ == "SubclassCreationMeta" for m in subclass_meta):
        return "a tensor subclass input"
    return None


def metadata_verdict(meta):
    """(None when aot_autograd's runtime wrapper would hand the outputs through unchanged, else
    why not; how many outputs the wrapper hands back), from aot_autograd's metadata."""
    if meta is None:
        return "aot_autograd metadata unreadable (no tracing context)", None
    try:
        return _metadata_says_plain(meta), len(meta.output_info)
    except Exception as e:  # a torch whose internals differ: keep the wrappers
        return f"aot_autograd metadata unreadable ({type(e).__name__}: {e})", None


class Capture:
    """One dynamo graph's trip through aot_autograd: what the inference compiler compiled and
    whether it may be called directly."""

    def __init__(self, gm, example_inputs, enabled=True):
        self.fn = None
        self.why_not = None if enabled else "not asked for"
        self.example_inputs = example_inputs
        self.grad_enabled = torch.is_grad_enabled()  # dynamo guards it: the same at every call
        if self.why_not is None:
            self.why_not = self._why_not_module(gm, example_inputs)

    @staticmethod
    def _why_not_module(gm, example_inputs):
        utils = getattr(torch._dynamo, "utils", None)
        if utils is not None and isinstance(gm, getattr(utils, "GmWrapper", ())):
            return "boxed dynamo inputs"
        if any(True for _ in gm.parameters()) or any(True for _ in gm.buffers()):
            return "lifted parameters"  # aot_autograd prepends them to every call
        tensors = [a for a in example_inputs if isinstance(a, torch.Tensor)]
        if len({id(a) for a in tensors}) != len(tensors):
            return "a tensor passed twice"  # aot_autograd dedupes: the graph takes fewer
        if any(_is_subclass(a) for a in tensors):
            return "a tensor subclass input"
        if _autocast_on():
            return "autocast"  # the wrapper runs the graph with autocast off
        return None

    def note(self, graph, fn, verdict=None):
        """Called by the inference compiler with the ATen graph and what it compiled to.
        `verdict`: metadata_verdict as read when the graph was first compiled (a graph kept by
        aot_cache.py, whose tracing context now holds no metadata); else read now."""
        if self.why_not is not None:
            return
        if verdict is None:
            tc = torch._guards.TracingContext.try_get()
            verdict = metadata_verdict(tc.fw_metadata if tc is not None else None)
        self.why_not, n_outputs = verdict
        try:
            placeholders = [n for n in graph.graph.nodes if n.op == "placeholder"]
            outputs = next(n for n in reversed(graph.graph.nodes) if n.op == "output").args[0]
        except Exception as e:  # a graph of another shape: keep the wrappers
            self.why_not = f"graph unreadable ({type(e).__name__}: {e})"
        if self.why_not is None and len(placeholders) != len(self.example_inputs):
            self.why_not = "the graph's inputs are not dynamo's"
        elif self.why_not is None and len(outputs) != n_outputs:
            self.why_not = "the graph returns more than the user's outputs"
        if self.why_not is None:
            self.fn = fn

    def callable(self, wrapped):
        """The function for dynamo: the compiled graph called directly, or `wrapped`."""
        if self.fn is None:
            if self.why_not is None:
                self.why_not = "no inference graph compiled"
            log.debug("fuseml: aot_autograd's wrappers kept: %s", self.why_not)
            return wrapped
        fn = self.fn
        boxed = getattr(fn, "_boxed_call", False)
        if not self.grad_enabled:

            def direct(*args):
                return fn(list(args)) if boxed else fn(*args)
        else:
            # an inference graph compiled with grad on (no input needed it): aot_autograd
            # runs it with grad off, so an ATen op left in it records no autograd history
            set_grad = torch._C._set_grad_enabled

            def direct(*args):
                set_grad(False)
                try:
                    return fn(list(args)) if boxed else fn(*args)
                finally:
                    set_grad(True)

        return direct
