"""CUDA graphs for compiled graphs (torch.compile(..., mode="reduce-overhead")): what was asked
(mode, options, FuseMLCompiler(cudagraphs=...), FUSEML_CUDAGRAPHS) and the wrapping of each
compiled ATen graph (inference, training forward, training backward) in fuseml's own replay
(graph_replay.py). torch's cudagraph trees, which Inductor's reduce-overhead uses, cost a
training step ~0.2 ms of host time on the H100 machine (their Python bookkeeping and a copy of
every non-static input per call: bench/NOTES.md, "Training graphs under fuseml's replay"),
more than the GPU time of a small step; the replay reads inputs where they are and hands
outputs out as aliases of graph memory, with a second recording while the caller (or
autograd, holding the forward's saved values until the backward) still holds the first one's.

Which graphs can be recorded is torch's own rule (the cudagraphs backend's check_for_skip:
CPU tensors, ops that synchronise) with fuseml's for mutated inputs (an input at a fixed
address, batch norm's running statistics, is updated inside the recording; any other
mutated input refuses it), after CPU constants that only reach the GPU were moved to it
(device_constants.py: T5's KV cache leaves some), and which inputs sit at fixed addresses
(parameters, and in a backward the saved values the forward's recording owns) comes from
aot_autograd. Those two pieces are torch-private: they are looked up in _api(); anything
missing makes the graph run without CUDA graphs (one warning), never fails the job. The one
entry point is wrap()."""

import re
import types

import torch

from . import device_constants, graph_replay, settings
from ._log import log, warn_once

# torch.compile's modes: which ones record CUDA graphs
MODES = {
    None: False,
    "default": False,
    "reduce-overhead": True,
    "max-autotune": True,
    "max-autotune-no-cudagraphs": False,
}
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
    return settings.cudagraphs()


class State:
    """What the forward and backward graphs of one dynamo graph share: whether the forward
    is recorded (a backward is recorded only then: an unrecorded forward leaves its saved
    values at fresh addresses each step, so the backward would never see one input set
    twice) and which forward inputs are static (to classify the saved ones)."""

    def __init__(self, example_inputs):
        self.n_dynamo_inputs = len(example_inputs)
        self.recorded = True
        self.fw_static = ()


def _api():
    """The torch-private pieces used, or raises (ImportError, AttributeError)."""
    from torch._dynamo.backends import cudagraphs as backend

    return types.SimpleNamespace(
        check_for_skip=backend.check_for_skip,
        find_input_mutations=backend.find_input_mutations,
        mutations_allowed=lambda: torch._dynamo.config.patch(cudagraph_backend_support_input_mutation=True),
        tracing_context=torch._guards.TracingContext.try_get,
    )


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
    follow; all saved are at fixed addresses (the forward's outputs live in its recording's
    pool, or are parameters) except a saved forward input not static there (a user input, fresh
    every step: primals_<i+1> by aot_autograd's naming, or stamped is_static_input=False)."""
    out, saved = [], 0
    for i, n in enumerate(p for p in gm.graph.nodes if p.op == "placeholder"):
        if "tangents" in n.name or n.name.startswith("bwd_"):
            break
        saved += 1
        if n.meta.get("is_static_input") is False:
            continue
        if n.name.startswith("primals_") and n.name[8:].isdigit() and int(n.name[8:]) - 1 not in state.fw_static:
            continue
        out.append(i)
    return tuple(out), saved


def _unavailable(state, e):
    state.recorded = False
    warn_once(
        "cudagraphs-api",
        "CUDA graphs unavailable with torch %s (%s: %s); compiled " "graphs run without them",
        torch.__version__,
        type(e).__name__,
        e,
        suffix="",
    )
    return "no CUDA graphs: torch API missing"


def _plan(api, gm, example_inputs, which, state):
    """(device index, static input indices, skip reason or None, CPU constants moved to the
    device) of graph gm."""
    dev = _cuda_index(gm)
    if which == "backward":
        static, fixed = _bw_static(gm, state)
    else:
        static = state.fw_static = _fw_static(api, len(example_inputs), state)
        fixed = max(0, len(example_inputs) - state.n_dynamo_inputs)  # as torch's backend
    if dev is None:
        return None, static, "no CUDA tensors", []
    try:
        moved, kept = device_constants.move(gm, torch.device("cuda", dev))
    except Exception as e:  # a constant that cannot move: the graph is judged as it is
        log.debug("fuseml: CPU constants of a %s graph not moved: %s: %s", which, type(e).__name__, e)
        moved, kept = [], {}
    with api.mutations_allowed():  # judged below, against the static inputs
        skip = api.check_for_skip(gm, fixed)
    if not skip:
        skip = _mutates_moving_input(api, gm, static)
    skip = skip and str(skip).replace("skipping cudagraphs due to ", "")
    cpu = skip and re.match(r"cpu device \((\w+)\)", skip)
    if cpu and cpu.group(1) in kept:  # why the CPU value torch names stays there
        skip = f"{cpu.group(0)}: {kept[cpu.group(1)]}"
    return dev, static, skip, moved


def _mutates_moving_input(api, gm, static):
    """Why graph gm cannot be recorded for the inputs it updates, or None. An input at a fixed
    address (batch norm's running statistics, a buffer) may be updated inside the recording:
    each replay writes it where it is, as the graph itself would, with no copy after the call.
    torch's own rule counts only a prefix of the inputs as fixed, which under dynamo's lifted
    parameters and buffers is none of them."""
    moving = api.find_input_mutations(gm.graph) - set(static)
    return f"mutated inputs ({len(moving)} not at fixed addresses)" if moving else None


def wrap(gm, example_inputs, which, state, compile_fn):
    """compile_fn() -> the boxed callable of ATen graph gm; returns (callable, note): the
    callable under fuseml's CUDA-graph replay where possible, else compile_fn's own; the note
    says which, for Plan. gm is looked at before compile_fn runs (Inductor rewrites it)."""
    if which == "backward" and not state.recorded:
        return compile_fn(), "no CUDA graphs: forward not recorded"
    try:
        api = _api()
        dev, static, skip, moved = _plan(api, gm, example_inputs, which, state)
    except Exception as e:  # a torch whose private API moved: no graphs, never a failed job
        note = _unavailable(state, e)
        return compile_fn(), note
    fn = compile_fn()
    if skip:
        if which != "backward":
            state.recorded = False
            warn_once(
                "cudagraphs-skip", "%s graph not recorded as a CUDA graph: %s", which, skip.splitlines()[0], suffix=""
            )
        return fn, "no CUDA graphs: " + skip
    log.debug(
        "fuseml: %s graph under fuseml's CUDA-graph replay (device %d, static inputs %s)", which, dev, list(static)
    )
    consts = f"; CPU constants moved to the device: {', '.join(moved)}" if moved else ""
    return (
        _boxed(graph_replay.GraphReplay(fn, static, dev, which)),
        f"CUDA graphs (fuseml replay; static inputs {list(static)}{consts})",
    )


def _boxed(replay):
    """replay as a plain function marked boxed: aot_autograd wraps a backward in dynamo's
    disable(), which copies a function's attributes (the mark) but not a class's."""

    def run(args):
        return replay(args)

    run._boxed_call = True
    run.replay = replay
    return run
