"""Every FUSEML_* environment variable the client reads, and only here (the table in
client/python/README.md says the same for users). Each is read when it is used, so a test or
a long-lived process that changes one sees the change, except FUSEML_LOG and
FUSEML_NO_FAST_LAUNCH, which take effect when fuseml is imported."""

import os

# Seconds an autostarted daemon waits with no client and no compile before it exits.
DEFAULT_IDLE_EXIT_S = 600
# Seconds between two re-asks for the kernels a running graph holds "verified" (upgrade.py).
DEFAULT_UPGRADE_S = 10.0


def _get(name):
    return os.environ.get(name)


def socket():
    """FUSEML_SOCKET: the daemon's socket; None: the per-user default (transport.py)."""
    return _get("FUSEML_SOCKET") or None


def autostart():
    """FUSEML_NO_AUTOSTART=1: never start a daemon when none answers."""
    return _get("FUSEML_NO_AUTOSTART") != "1"


def daemon():
    """FUSEML_DAEMON: the fusemld to start; None: found (autostart.py)."""
    return _get("FUSEML_DAEMON") or None


def idle_exit_s():
    """FUSEML_IDLE_EXIT: seconds an autostarted daemon stays up with no client and no compile
    (default 600; 0: until stopped). A value that is not a whole number >= 0 is the default."""
    value = _get("FUSEML_IDLE_EXIT")
    if value is not None and value.strip().isdigit():
        return int(value)
    return DEFAULT_IDLE_EXIT_S


def library():
    """FUSEML_LIB: libfusemld.so; None: found beside the daemon or on the linker path."""
    return _get("FUSEML_LIB") or None


def log_level():
    """FUSEML_LOG: debug, info, warning or error (any case); None when unset or another word."""
    level = (_get("FUSEML_LOG") or "").lower()
    return level if level in ("debug", "info", "warning", "error") else None


def allow_untuned():
    """FUSEML_ALLOW_UNTUNED=1, a testing aid only: launch kernels not verified on a GPU."""
    return _get("FUSEML_ALLOW_UNTUNED") == "1"


def request_cpu_graphs():
    """FUSEML_REQUEST_CPU_GRAPHS=1, a testing aid only: a graph with no CUDA tensor is
    partitioned and its fragments sent to the daemon anyway (compile-only checks on a machine
    without a GPU); its groups still run as ATen."""
    return _get("FUSEML_REQUEST_CPU_GRAPHS") == "1"


def route():
    """FUSEML_ROUTE: "measure" (the default, also for any other value: the first launch of each
    group times the kernel against the group's ATen ops and keeps the faster) or "kernel"."""
    mode = _get("FUSEML_ROUTE") or "measure"
    return mode if mode in ("measure", "kernel") else "measure"


def route_cache():
    """FUSEML_ROUTE_CACHE: the file where measured routing is remembered across processes
    (routes.py); "off": not remembered. Default $XDG_CACHE_HOME/fuseml/routes.db, else
    ~/.cache/fuseml/routes.db. None when off."""
    value = _get("FUSEML_ROUTE_CACHE")
    if value == "off":
        return None
    if value:
        return value
    base = _get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "fuseml", "routes.db")


def chains():
    """FUSEML_CHAINS=0: no back-to-back GEMM chains (on by default)."""
    return _get("FUSEML_CHAINS") != "0"


def pad_gemm():
    """FUSEML_PAD_GEMM: "auto" (the default, also for any other value: bf16/f16 GEMMs of CUDA
    graphs with a dimension not a multiple of 8 are padded where large enough to gain,
    pad_gemm.py), "all" (every such GEMM, whatever its size) or "0" (none)."""
    mode = (_get("FUSEML_PAD_GEMM") or "auto").lower()
    return {"0": "off", "off": "off", "all": "all"}.get(mode, "auto")


def channels_last():
    """FUSEML_CHANNELS_LAST: "auto" (the default, also for any other value: bf16/f16 2-D
    convolutions of CUDA graphs run on channels-last values, channels_last.py), "on" (any
    2-D convolution, the CPU's too) or "0" (none)."""
    mode = (_get("FUSEML_CHANNELS_LAST") or "auto").lower()
    return {"0": "off", "off": "off", "on": "on", "1": "on"}.get(mode, "auto")


def batch_norm():
    """FUSEML_BATCH_NORM: "auto" (the default, also for any other value: batch norm is
    decomposed into fused kernels, inference and training, in graphs whose convolutions run
    channels-last) or "aten" (ATen's batch norm kernels everywhere)."""
    mode = (_get("FUSEML_BATCH_NORM") or "auto").lower()
    return "aten" if mode == "aten" else "auto"


def cudagraphs():
    """FUSEML_CUDAGRAPHS=1: record compiled graphs as CUDA graphs."""
    return _get("FUSEML_CUDAGRAPHS") == "1"


def direct():
    """FUSEML_DIRECT=0: keep aot_autograd's wrappers around inference graphs (on by default)."""
    return _get("FUSEML_DIRECT") != "0"


def aot_cache():
    """FUSEML_AOT_CACHE=0: keep no aot_autograd output in torch's compile cache (aot_cache.py; on
    by default: a second process skips aot_autograd's trace)."""
    return _get("FUSEML_AOT_CACHE") != "0"


def recompute():
    """A training graph's forward saves the inputs of cheap pointwise chains and the backward
    recomputes them (the min-cut partition Inductor uses): peak memory at Inductor's on the
    decoders and T5, for 1-3% more GPU time (bench/NOTES.md, "Recompute by default").
    FUSEML_RECOMPUTE=0 saves every intermediate the backward reads instead (aot_autograd's
    default partition)."""
    return _get("FUSEML_RECOMPUTE") != "0"


def logits():
    """FUSEML_LOGITS: how the backward of a language model's head and loss
    (linear_cross_entropy.py) gets the logits' gradient: "whole" (the default, also for any
    other value: written whole, cross_entropy.py), "blocks" (walked in column blocks of the
    saved logits: the gradient never held whole) or "recompute" (the blocks computed again
    from the head's input: no [tokens, vocabulary] value held from the forward to the
    backward, for one more GEMM over the vocabulary)."""
    value = (_get("FUSEML_LOGITS") or "").lower()
    return value if value in ("blocks", "recompute") else "whole"


def straight_line():
    """FUSEML_STRAIGHT_LINE=0: run compiled graphs as FX graphs, never as generated code (on by
    default)."""
    return _get("FUSEML_STRAIGHT_LINE") != "0"


def graph_memory_mb():
    """FUSEML_GRAPH_MEMORY_MB, as written (graph_replay.memory_budget checks it); None: unset."""
    return _get("FUSEML_GRAPH_MEMORY_MB") or None


def upgrade_s():
    """FUSEML_UPGRADE_S: seconds between two re-asks for a graph's kernels the daemon is still
    tuning in the background (upgrade.py); 0: never (keep the verified kernels)."""
    try:
        return max(0.0, float(_get("FUSEML_UPGRADE_S") or DEFAULT_UPGRADE_S))
    except ValueError:
        return DEFAULT_UPGRADE_S


def fast_launch():
    """FUSEML_NO_FAST_LAUNCH=1: launch through ctypes, not the C extension fuseml._launch."""
    return _get("FUSEML_NO_FAST_LAUNCH") != "1"
