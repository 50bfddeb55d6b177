"""CUDA graphs for compiled graphs (torch.compile(..., mode="reduce-overhead")): what was asked
(mode, options, FuseMLCompiler(cudagraphs=...), FUSEML_CUDAGRAPHS) and the wrapping of each
compiled ATen graph in torch's own CUDA-graph machinery, the cudagraph trees that Inductor's
reduce-overhead and the "cudagraphs" dynamo backend use, for training graphs; inference graphs
are replayed by fuseml itself (graph_replay.py), at a fraction of the trees' host cost. The
trees warm each graph up once
(eagerly, where fuseml's measured routing and module loads happen) before recording it, keep
parameters in place (static inputs, by index) and copy the other inputs into graph-owned
buffers, pair forward and backward recordings, and re-record for new shapes.

The trees are torch-private: every piece used is looked up in _api() and its call checked
against the installed signatures; anything missing makes the graph run without CUDA graphs
(one warning), never fails the job. The one entry point is wrap()."""
import inspect
import os
import types

import torch

from . import graph_replay
from ._log import log, warn_once

# torch.compile's modes: which ones record CUDA graphs
MODES = {None: False, "default": False, "reduce-overhead": True, "max-autotune": True,
         "max-autotune-no-cudagraphs": False}
OPTIONS = ("cudagraphs",)


def wanted(mode=None, options=None, default=None):
    """Whether to record CUDA graphs: options {"cudagraphs": bool} first, then torch.compile's
    mode, then `default` (FuseMLCompiler(cudagraphs=...)), then FUSEML_CUDAGRAPHS=1."""
    if mode not in MODES:
        allowed = ", ".join(repr(m) for m in MODES)
        raise ValueError(f"fuseml: mode must be one of {allowed}, not {mode!r}")
    options = dict(options or {})
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ValueError(f"fuseml: unknown options {unknown}; fuseml takes {list(OPTIONS)}")
    if "cudagraphs" in options:
        return bool(options["cudagraphs"])
    if mode is not None:
        return MODES[mode]
    if default is not None:
        return bool(default)
    return os.environ.get("FUSEML_CUDAGRAPHS") == "1"


class State:
    """What the forward and backward graphs of one dynamo graph share: whether the forward
    was recorded (a backward is recorded only after a recorded forward, as the trees pair
    them), its device, which forward inputs are static (to classify saved ones), and how many
    outputs the model itself has."""

    def __init__(self, gm, example_inputs):
        self.n_dynamo_inputs = len(example_inputs)
        self.n_user_outputs = len(_outputs(gm))   # the model's own outputs (not saved values)
        self.recorded = True
        self.device_index = None
        self.fw_static = ()


def _outputs(gm):
    """The values of gm's output node (flat in dynamo's and aot_autograd's graphs)."""
    out = [n for n in gm.graph.nodes if n.op == "output"]
    vals = out[0].args[0] if out and out[0].args else ()
    return list(vals) if isinstance(vals, (list, tuple)) else [vals]


def _api():
    """The torch-private pieces used, or raises (ImportError, AttributeError, TypeError)."""
    from torch._dynamo.backends import cudagraphs as backend
    from torch._inductor import cudagraph_trees as trees
    from torch._inductor import cudagraph_utils as utils
    api = types.SimpleNamespace(
        cudagraphify_impl=trees.cudagraphify_impl, get_manager=trees.get_manager,
        check_for_skip=backend.check_for_skip, find_input_mutations=backend.find_input_mutations,
        get_stack_traces=backend.get_stack_traces, get_placeholder_info=utils.get_placeholder_info,
        tracing_context=torch._guards.TracingContext.try_get)
    # Newer trees clone the model's own outputs still alive when the next step starts (so a
    # kept output stays right) if told which they are; older ones let the next replay
    # overwrite them (keep one with .clone())
    clone = getattr(utils, "cudagraph_trees_clone_live_user_visible_outputs", None)
    api.user_visible = ("user_visible_output_idxs" in inspect.signature(
        trees.cudagraphify).parameters and clone is not None and clone())
    # cudagraphify_impl passes our keywords through to cudagraphify at the first call: a
    # torch that renamed one would fail there, mid-step, so check it now
    inspect.signature(trees.cudagraphify).bind(
        None, [], (), device_index=0, is_backward=False, is_inference=False, stack_traces=None,
        placeholders=(), mutated_input_idxs=())
    return api


def _cuda_index(gm):
    """The CUDA device of the graph's tensors (None when there is none)."""
    for n in gm.graph.nodes:
        v = n.meta.get("val")
        if isinstance(v, torch.Tensor) and v.device.type == "cuda":
            return v.device.index if v.device.index is not None else 0
    return None


def _fw_static(api, n_inputs, state):
    """Forward inputs at fixed addresses: parameters and buffers, as aot_autograd marked them
    (its fw_metadata), else the ones it lifted ahead of dynamo's inputs."""
    ctx = api.tracing_context()
    idxs = getattr(getattr(ctx, "fw_metadata", None), "static_input_indices", None)
    if idxs is None:
        idxs = range(max(0, n_inputs - state.n_dynamo_inputs))
    return tuple(idxs)


def _bw_static(gm, state):
    """(static indices, saved count) of a backward graph: its saved tensors lead, the tangents
    follow; all saved are at fixed addresses (the forward's outputs live in the trees' pool,
    or are parameters) except a saved forward input not static there (a user input, fresh
    every step: primals_<i+1> by aot_autograd's naming, or stamped is_static_input=False)."""
    out, saved = [], 0
    for i, n in enumerate(p for p in gm.graph.nodes if p.op == "placeholder"):
        if "tangents" in n.name or n.name.startswith("bwd_"):
            break
        saved += 1
        if n.meta.get("is_static_input") is False:
            continue
        if n.name.startswith("primals_") and n.name[8:].isdigit() and \
                int(n.name[8:]) - 1 not in state.fw_static:
            continue
        out.append(i)
    return tuple(out), saved


def _stealing(fn):
    """The trees hand a boxed callable its inputs list and expect it emptied (they free
    inputs early); our callables take the list and keep what they need."""
    def run(args):
        xs = list(args)
        args.clear()
        return fn(xs)
    run._boxed_call = True
    return run


def _backward_unrecorded(api, fn, device_index):
    """A backward left eager after a recorded forward must still tell the trees it runs, so
    the forward's outputs it reads stay valid (what torch's cudagraphs backend does)."""
    def run(args):
        manager = api.get_manager(device_index, create_if_none_exists=False)
        if manager is not None:
            manager.set_to_running_backward()
        return fn(args)
    run._boxed_call = True
    return run


def _unavailable(state, e):
    state.recorded = False
    warn_once("cudagraphs-api", "CUDA graphs unavailable with torch %s (%s: %s); compiled "
              "graphs run without them", torch.__version__, type(e).__name__, e, suffix="")
    return "no CUDA graphs: torch API missing"


def _user_visible(api, gm, which, state):
    """Indices of the graph's outputs that are the model's own (Inductor's rule: aot_autograd
    puts mutated inputs first in a training forward, then the model's outputs, then the saved
    values); the backward's outputs are gradients, which the trees never clone."""
    ctx = api.tracing_context()
    meta = getattr(ctx, "fw_metadata", None)
    start = getattr(meta, "num_mutated_inp_runtime_indices", 0) if which == "forward" else 0
    outs = _outputs(gm)
    end = min(len(outs), start + state.n_user_outputs)
    return tuple(i for i in range(start, end) if isinstance(outs[i], torch.fx.Node))


def _plan(api, gm, example_inputs, which, state):
    """(device index, static input indices, skip reason or None) of graph gm."""
    dev = _cuda_index(gm)
    if which == "backward":
        static, fixed = _bw_static(gm, state)
    else:
        static = state.fw_static = _fw_static(api, len(example_inputs), state)
        fixed = max(0, len(example_inputs) - state.n_dynamo_inputs)   # as torch's backend
    if dev is None:
        return None, static, "no CUDA tensors"
    skip = api.check_for_skip(gm, fixed)
    return dev, static, skip and str(skip).replace("skipping cudagraphs due to ", "")


def wrap(gm, example_inputs, which, state, compile_fn):
    """compile_fn() -> the boxed callable of ATen graph gm; returns (callable, note): the
    callable under CUDA-graph trees where possible, else compile_fn's own; the note says
    which, for Plan. gm is looked at before compile_fn runs (Inductor rewrites it)."""
    is_backward = which == "backward"
    if is_backward and not state.recorded:
        return compile_fn(), "no CUDA graphs: forward not recorded"
    try:
        api = _api()
        dev, static, skip = _plan(api, gm, example_inputs, which, state)
        if not skip:
            traces = api.get_stack_traces(gm)
            info = (api.get_placeholder_info(gm.graph), api.find_input_mutations(gm.graph))
            extra = {}
            if api.user_visible and not is_backward:
                extra["user_visible_output_idxs"] = _user_visible(api, gm, which, state)
    except Exception as e:  # a torch whose private API moved: no graphs, never a failed job
        note = _unavailable(state, e)
        fn = compile_fn()
        return fn, note
    fn = compile_fn()
    if skip:
        if is_backward:   # the recorded forward's outputs stay valid for it
            return _backward_unrecorded(api, fn, state.device_index), "no CUDA graphs: " + skip
        state.recorded = False
        warn_once("cudagraphs-skip", "%s graph not recorded as a CUDA graph: %s", which,
                  skip.splitlines()[0], suffix="")
        return fn, "no CUDA graphs: " + skip
    if which == "inference":   # no autograd: fuseml's own replay, cheaper than the trees'
        state.device_index = dev
        log.debug("fuseml: inference graph under fuseml's CUDA-graph replay (device %d, static "
                  "inputs %s)", dev, list(static))
        return (graph_replay.InferenceGraphs(fn, static, dev),
                f"CUDA graphs (fuseml replay; static inputs {list(static)})")
    try:
        out = api.cudagraphify_impl(
            _stealing(fn), list(example_inputs), static, device_index=dev,
            is_backward=is_backward, is_inference=which == "inference", stack_traces=traces,
            placeholders=info[0], mutated_input_idxs=info[1], **extra)
    except Exception as e:
        note = _unavailable(state, e)
        if is_backward:
            return _backward_unrecorded(api, fn, state.device_index), note
        return fn, note
    if not is_backward:
        state.device_index = dev
    out._boxed_call = True
    log.debug("fuseml: %s graph under CUDA graphs (device %d, static inputs %s)", which, dev,
              list(static))
    return out, f"CUDA graphs (static inputs {list(static)})"
