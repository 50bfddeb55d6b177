"""fuseml's own CUDA-graph replay for inference graphs (mode="reduce-overhead" with no
autograd). torch's cudagraph trees cost ~50 us of host time per call on the H100 machine's
host (bench/NOTES.md, "Host time per step"): more than eager spends on a whole MLP block, so
a host-bound step got slower under them. An inference graph needs none of what the trees add
(forward/backward pairing, checkpointed pools, liveness tracking of outputs kept across
steps), so it is replayed here at the cost of one dict lookup, one graph launch and a copy of
each output:

- Each distinct set of inputs (address, size, stride and offset of every tensor, value of
  every other argument) is run eagerly once (the warm-up: fuseml's measured routing and
  module loads happen there, never in a capture), then recorded reading the caller's
  tensors where they are, so a replay copies no input. Up to MAX_DIRECT such graphs; the
  caching allocator hands a loop the same few addresses, so a handful covers a loop.
- Past that, one graph per layout reads graph-owned copies of the non-static inputs (the
  trees' scheme: one device copy per input and call).
- Outputs are copied out of the graph's memory before they are returned, so an output kept
  across steps stays right (no later replay can overwrite it). The graphs share one memory
  pool: any one's outputs are dead once copied, so the replays may come in any order.
- A capture that fails (an op that synchronises, a CPU tensor) turns graphs off for this
  graph with one warning; it then runs as it would without them."""
import torch

from ._log import log, warn_once

MAX_DIRECT = 8     # graphs keyed by input addresses, per compiled graph
MAX_WARM = 64      # keys remembered as warmed up but not yet recorded


def _direct_key(args):
    return tuple((a.data_ptr(), a.shape, a.stride(), a.storage_offset())
                 if isinstance(a, torch.Tensor) else a for a in args)


def _layout_key(args, static):
    return tuple(((a.data_ptr() if i in static else None), a.shape, a.stride(), a.storage_offset())
                 if isinstance(a, torch.Tensor) else a for i, a in enumerate(args))


class _Recorded:
    """One captured graph, its input buffers (the caller's tensors or graph-owned copies) and
    its outputs in the pool."""

    def __init__(self, graph, inputs, outputs, copy_idx):
        self.graph, self.inputs, self.outputs, self.copy_idx = graph, inputs, outputs, copy_idx

    def replay(self, args):
        for i in self.copy_idx:
            self.inputs[i].copy_(args[i])
        self.graph.replay()
        out = [o.clone() if isinstance(o, torch.Tensor) else o for o in self.outputs]
        return tuple(out) if isinstance(self.outputs, tuple) else out


class InferenceGraphs:
    """The boxed callable of one compiled inference graph under CUDA graphs (see the module
    docstring). fn: the boxed callable it replaces; static: indices of inputs at fixed
    addresses (parameters and buffers); device_index: the graph's CUDA device."""

    _boxed_call = True   # aot_autograd calls it with the list of inputs

    def __init__(self, fn, static, device_index):
        self.fn = fn
        self.static = frozenset(static)
        self.device_index = device_index
        self.pool = None
        self.direct = {}      # direct key -> _Recorded
        self.by_layout = {}   # layout key -> _Recorded (graph-owned input copies)
        self.warm = set()     # keys run once eagerly, recorded on their next call
        self.off = None       # why graphs were turned off for this graph
        self.recordings = 0
        self.replays = 0

    def __call__(self, args):
        if self.off is not None:
            return self.fn(args)
        key = _direct_key(args)
        rec = self.direct.get(key)
        if rec is None:
            rec = self._miss(args, key)
            if rec is None:            # a warm-up, or graphs just turned off
                return self.fn(args)
        self.replays += 1
        if torch.cuda.current_device() != self.device_index:
            with torch.cuda.device(self.device_index):
                return rec.replay(args)
        return rec.replay(args)

    def _miss(self, args, key):
        if len(self.direct) < MAX_DIRECT:
            if self._first_time(key):
                return None
            rec = self._record(args, copy=False)
            if rec is not None:
                self.direct[key] = rec
            return rec
        layout = _layout_key(args, self.static)
        rec = self.by_layout.get(layout)
        if rec is None and not self._first_time(layout):
            rec = self._record(args, copy=True)
            if rec is not None:
                self.by_layout[layout] = rec
        return rec

    def _first_time(self, key):
        if key in self.warm:
            self.warm.discard(key)
            return False
        if len(self.warm) >= MAX_WARM:
            self.warm.clear()
        self.warm.add(key)
        return True

    def _record(self, args, copy):
        copy_idx = tuple(i for i, a in enumerate(args)
                         if copy and i not in self.static and isinstance(a, torch.Tensor))
        inputs = list(args)
        for i in copy_idx:
            a = args[i]
            inputs[i] = torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device=a.device)
            inputs[i].copy_(a)
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.device(self.device_index):
                with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
                    outputs = self.fn(list(inputs))
        except Exception as e:  # never a failed job: this graph runs without CUDA graphs
            self.off = f"{type(e).__name__}: {e}"
            self.direct.clear()
            self.by_layout.clear()
            warn_once("cudagraphs-capture", "an inference graph could not be recorded as a CUDA "
                      "graph (%s); it runs without CUDA graphs", self.off.splitlines()[0][:200],
                      suffix="")
            return None
        self.recordings += 1
        log.debug("fuseml: inference graph recorded (%s inputs copied per replay; %d recorded)",
                  len(copy_idx), self.recordings)
        return _Recorded(graph, inputs, outputs, copy_idx)
