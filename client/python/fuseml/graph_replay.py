"""fuseml's own CUDA-graph replay (mode="reduce-overhead") of every compiled graph: inference,
and a training step's forward and backward. torch's cudagraph trees cost ~50 us of host time
per call on the H100 machine's host (bench/NOTES.md, "Host time per step"): more than eager
spends on a whole MLP block, so a host-bound step got slower under them. A graph is replayed
here at the cost of one dict lookup, a use-count check and one graph launch; the trees'
forward/backward pairing is not needed: a training forward's saved values are outputs like
any other (autograd holds them until the backward, so the recording is not replayed over
them), and the backward reads them where its forward's recording keeps them:

- Each distinct set of inputs (address, size, stride and offset of every tensor, value of
  every other argument) is run eagerly once (the warm-up: fuseml's measured routing and
  module loads happen there, never in a capture), then recorded reading the caller's
  tensors where they are, so a replay copies no input. Up to MAX_DIRECT such graphs; the
  caching allocator hands a loop the same few addresses, so a handful covers a loop.
- A small non-static input (SMALL_INPUT_BYTES: a backward's tangents, a batch's ids) seen
  at a second address is copied into a graph-owned buffer at every replay from then on,
  whatever its address: one copy kernel, where each new address would cost a call without
  graphs and a capture. One that stays where it is is read there, with no copy.
- Past that, or once MAX_FRESH input sets of one layout were warmed up without coming back
  (inputs at a new address every call: a backward's tangents, where the loss is not computed
  the same way each step), one graph per layout reads graph-owned copies of the non-static
  inputs (the trees' scheme: one device copy per input and call); the MAX_LAYOUTS most recently used
  layouts are kept (every recording holds a pool of activations: a server seeing many
  batch sizes must not keep one per size for ever).
- Outputs are returned as aliases of the graph's memory, not copies. An input set may have
  up to MAX_COPIES recordings, each with outputs of its own; a call replays one whose
  outputs nobody holds any more (the storages' use counts are back to what the recording
  itself holds), so an output kept across steps stays right: `y = model(x)` in a loop
  alternates between two. When the caller holds the outputs of every recording, the call
  runs without graphs (right, only slower). Each recording has a memory pool of its own: in
  a shared one a later recording's outputs may sit where an earlier one keeps its
  intermediates, and replaying that one would overwrite outputs the caller holds. Without
  torch's use-count query, outputs are copied out instead.
- The recordings of one compiled graph hold at most FUSEML_GRAPH_MEMORY_MB of pool memory
  (default a tenth of the device's memory; measured as the growth of torch's reserved
  memory across each capture): past it the least recently used recordings whose outputs
  nobody holds are dropped first, and if that is not enough the call runs as compiled.
- Tuned kernels the daemon finishes after a graph was recorded (upgrade.py) are asked for
  by the replay too (the compiled graph's poll_kernels(), a counter check per call): when
  they arrive every recording is dropped, and each input set is warmed up and recorded
  again with them. Outputs the caller still holds stay valid (their memory is freed only
  when they are).
- A capture that fails (an op that synchronises, a CPU tensor) turns graphs off for this
  graph with one warning; it then runs as it would without them."""

import collections
import itertools
import weakref

import torch

from . import settings
from ._log import log, warn_once

MAX_DIRECT = 8  # input sets keyed by addresses, per compiled graph
MAX_COPIES = 2  # recordings per input set (outputs the caller still holds)
MAX_LAYOUTS = 8  # layouts with graph-owned input copies, least recently used dropped
MAX_WARM = 64  # keys remembered as warmed up but not yet recorded
MAX_FRESH = 16  # input sets of one layout warmed up, not seen again: addresses churn
# A non-static input this small, once seen at a second address, is copied into the
# recording's own buffer (one copy kernel of a few us) and keys the recording by its layout:
# a training backward's tangents, allocated fresh each step, and a batch's ids and labels would
# otherwise make each step a new input set, run without graphs (a warm-up) before it is recorded.
SMALL_INPUT_BYTES = 256 << 10
_use_count = getattr(torch._C, "_storage_Use_Count", None)
_clock = itertools.count()  # recency of recordings, for dropping the least recently used
instances = weakref.WeakSet()  # every live GraphReplay, for stats()


def stats():
    """Counters summed over the live replays: recordings, replays, calls run as compiled
    (outputs held, over budget), recordings dropped, replays turned off, pool bytes."""
    out = collections.Counter()
    for g in list(instances):
        out.update(
            recordings=g.recordings,
            replays=g.replays,
            held_runs=g.held_runs,
            over_budget=g.over_budget,
            dropped=g.dropped,
            off=g.off is not None,
            pool_bytes=g.pool_bytes,
            warmups=g.warmups,
            upgrades=g.upgrades,
        )
    return dict(out)


def memory_budget(device_index):
    """Bytes of pool memory the recordings of one compiled graph may hold."""
    mb = settings.graph_memory_mb()
    if mb:
        try:
            value = float(mb)
            if 0 <= value < float("inf"):
                return int(value * (1 << 20))
        except ValueError:
            pass
    default = torch.cuda.get_device_properties(device_index).total_memory // 10
    if mb:
        warn_once(
            "graph-memory",
            "FUSEML_GRAPH_MEMORY_MB=%r is not a size in MiB (a number >= 0); " "using %d MiB",
            mb,
            default >> 20,
            suffix="",
        )
    return default


def _small(a):
    """Whether tensor a is small enough to be copied into a recording (SMALL_INPUT_BYTES)."""
    return a.numel() * a.element_size() <= SMALL_INPUT_BYTES


def _direct_key(args, static, copied):
    """Every tensor's address and layout; a static input's address alone (its shape is fixed
    by dynamo's guards: a new shape is a new compiled graph); a copied one's layout alone."""
    return tuple(
        (
            a.data_ptr()
            if i in static
            else ((None if i in copied else a.data_ptr()), a.shape, a.stride(), a.storage_offset())
        )
        if isinstance(a, torch.Tensor)
        else a
        for i, a in enumerate(args)
    )


def _layout_key(args, static):
    return tuple(
        ((a.data_ptr() if i in static else None), a.shape, a.stride(), a.storage_offset())
        if isinstance(a, torch.Tensor)
        else a
        for i, a in enumerate(args)
    )


def _output_spec(outputs, inputs):
    """How each output of a recording is handed out: ("graph", t) an alias of the graph's
    memory; ("input", i) the caller's i-th argument itself, or ("view", i, size, stride,
    offset) a view of it: an output that was an input at capture (a training forward returns
    the saved inputs) is rebuilt from this call's argument, so the recording never holds the
    caller's tensors (their memory stays free to hold the next step's inputs) and never
    hands out a graph-owned copy of an input; ("value", v) anything else."""
    ident = {id(a): i for i, a in enumerate(inputs) if isinstance(a, torch.Tensor)}
    storage = {
        a.untyped_storage().data_ptr(): i
        for i, a in enumerate(inputs)
        if isinstance(a, torch.Tensor) and a.untyped_storage().nbytes()
    }
    spec = []
    for o in outputs:
        if not isinstance(o, torch.Tensor):
            spec.append(("value", o))
        elif id(o) in ident:
            spec.append(("input", ident[id(o)]))
        elif o.untyped_storage().nbytes() and o.untyped_storage().data_ptr() in storage:
            spec.append(
                ("view", storage[o.untyped_storage().data_ptr()], tuple(o.shape), o.stride(), o.storage_offset())
            )
        else:
            spec.append(("graph", o))
    return spec


class _Recorded:
    """One captured graph, the graph-owned copies of inputs it reads (copy_idx -> buffer),
    how it hands out each output, and the use counts of its outputs' storages that it holds
    itself (so a held output can be told from a free one)."""

    def __init__(self, graph, outputs, inputs, buffers, nbytes=0):
        self.graph, self.buffers, self.nbytes = graph, buffers, nbytes
        self.used = next(_clock)
        self.tuple = isinstance(outputs, tuple)
        self.spec = _output_spec(outputs, inputs)
        self.mine = [e[1] for e in self.spec if e[0] == "graph"]
        self.only_mine = len(self.mine) == len(self.spec)  # replay's common case
        # the outputs' storages by address (this recording keeps them alive through self.mine),
        # so a call reads their use counts without making a Python storage object each
        self.storages = [t.untyped_storage()._cdata for t in self.mine] if _use_count else None
        self.held = [_use_count(c) for c in self.storages] if _use_count else None

    def free(self):
        """Whether no output of the last replay is held outside (then it may be overwritten)."""
        if self.held is None:
            return True
        for c, h in zip(self.storages, self.held):
            if _use_count(c) > h:
                return False
        return True

    def replay(self, args):
        self.used = next(_clock)
        for i, buf in self.buffers.items():
            buf.copy_(args[i])
        self.graph.replay()
        if self.only_mine and self.held is not None:
            out = [t.detach() for t in self.mine]
            return tuple(out) if self.tuple else out
        out = []
        for e in self.spec:
            kind = e[0]
            if kind == "graph":
                out.append(e[1].detach() if self.held is not None else e[1].clone())
            elif kind == "input":
                out.append(args[e[1]])
            elif kind == "view":
                out.append(args[e[1]].as_strided(e[2], e[3], e[4]))
            else:
                out.append(e[1])
        return tuple(out) if self.tuple else out


class GraphReplay:
    """One compiled graph under CUDA graphs, called with its inputs list (see the module docstring).
    fn: the boxed callable it replaces; static: indices of inputs at fixed addresses
    (parameters and buffers; a backward's saved values); device_index: the graph's CUDA
    device; which: "inference", "forward" or "backward" (for messages)."""

    def __init__(self, fn, static, device_index, which="inference"):
        self.fn = fn
        self.which = which
        self.static = frozenset(static)
        self.device_index = device_index
        self.direct = {}  # direct key -> _Recorded
        self.by_layout = collections.OrderedDict()  # layout key -> recordings, LRU order
        self.warm = set()  # keys run once eagerly, recorded on their next call
        self.fresh = collections.Counter()  # layout -> its keys in warm (not seen again yet)
        self.off = None  # why graphs were turned off for this graph
        self.recordings = 0
        self.replays = 0
        self.held_runs = 0  # calls run without graphs: every recording's outputs held
        self.budget = None  # bytes of pool memory (memory_budget), read at the first capture
        self.pool_bytes = 0  # what the recordings hold now
        self.last_bytes = 0  # the last capture's, the estimate of the next one's
        self.dropped = 0  # recordings dropped to stay within the budget
        self.over_budget = 0  # captures not made: nothing free to drop
        self.warmups = 0  # calls run as compiled: a new input set's first
        self.poll = getattr(fn, "poll_kernels", None)  # the compiled graph's kernel version
        self.version = getattr(fn, "kernels_version", None)
        self.upgrades = 0  # times every recording was dropped for tuned kernels
        self.watched = None  # small non-static inputs -> the address first seen
        self.copied = set()  # small inputs seen at a second address: always copied
        instances.add(self)

    def __call__(self, args):
        if self.off is not None:
            return self.fn(args)
        if self.poll is not None and self.poll() != self.version:
            self._forget()
        if self.watched is None:
            self.watched = {
                i: a.data_ptr()
                for i, a in enumerate(args)
                if i not in self.static and isinstance(a, torch.Tensor) and _small(a)
            }
        elif self.watched:
            self._note_moves(args)
        key = _direct_key(args, self.static, self.copied)
        recs = self.direct.get(key)
        if recs is None:
            recs = self._miss(args, key)
            if recs is None:  # a warm-up, or graphs just turned off
                self.warmups += 1
                return self.fn(args)
        rec = self._free(recs, args)
        if rec is None:  # every recording's outputs still held: run as compiled
            self.held_runs += 1
            return self.fn(args)
        self.replays += 1
        if torch.cuda.current_device() != self.device_index:
            with torch.cuda.device(self.device_index):
                return rec.replay(args)
        return rec.replay(args)

    def _note_moves(self, args):
        """A small input at another address than first seen is copied from now on; the
        recordings keyed by its address are dropped (no call will find them again)."""
        moved = [
            i for i, ptr in self.watched.items() if not isinstance(args[i], torch.Tensor) or args[i].data_ptr() != ptr
        ]
        for i in moved:  # nearly always none: a check of each watched address per call
            del self.watched[i]
            if isinstance(args[i], torch.Tensor) and _small(args[i]):
                self.copied.add(i)
                self.pool_bytes -= sum(r.nbytes for recs in self.direct.values() for r in recs)
                self.direct.clear()

    def _forget(self):
        """The compiled graph's kernels changed: every recording and warm-up is dropped, so
        the next call of each input set runs as compiled (loading the tuned modules, measuring
        the groups given back for it) and the one after records it again."""
        self.version = self.fn.kernels_version
        self.direct.clear()
        self.by_layout.clear()
        self.warm.clear()
        self.fresh.clear()
        self.pool_bytes = 0
        self.upgrades += 1
        log.debug("fuseml: %s graph's kernels upgraded: recorded again", self.which)

    def _free(self, recs, args):
        for rec in recs:
            if rec.free():
                return rec
        if len(recs) >= MAX_COPIES or self.off is not None:
            return None
        rec = self._record(args, recs[0] if recs[0].buffers else None)
        if rec is not None:
            recs.append(rec)
        return rec

    def _miss(self, args, key):
        """The recordings for a new input set: none on its first call (the warm-up)."""
        layout = _layout_key(args, self.static)
        if len(self.direct) < MAX_DIRECT and self.fresh[layout] < MAX_FRESH:
            if key in self.warm:
                self.fresh[layout] -= 1
            if self._first_time(key):
                self.fresh[layout] += 1
                return None
            rec = self._record(args)
            if rec is None:
                return None
            recs = self.direct[key] = [rec]
            return recs
        recs = self.by_layout.get(layout)
        if recs is not None:
            self.by_layout.move_to_end(layout)
        elif not self._first_time(layout):
            rec = self._record(args, copy=True)
            if rec is not None:
                recs = self.by_layout[layout] = [rec]
                if len(self.by_layout) > MAX_LAYOUTS:  # its graphs and pools go with it
                    _, gone = self.by_layout.popitem(last=False)
                    self.pool_bytes -= sum(r.nbytes for r in gone)
        return recs

    def _first_time(self, key):
        if key in self.warm:
            self.warm.discard(key)
            return False
        if len(self.warm) >= MAX_WARM:
            self.warm.clear()
            self.fresh.clear()
        self.warm.add(key)
        return True

    def _recordings(self):
        for table in (self.direct, self.by_layout):
            for key, recs in table.items():
                for rec in recs:
                    yield table, key, recs, rec

    def _make_room(self):
        """Drops the least recently used free recordings until the next capture (estimated as
        large as the last) fits the budget; False when it cannot."""
        if self.budget is None:
            self.budget = memory_budget(self.device_index)
        while self.pool_bytes + self.last_bytes > self.budget:
            free = [r for r in self._recordings() if r[3].free()]
            if not free:
                return False
            table, key, recs, rec = min(free, key=lambda r: r[3].used)
            recs.remove(rec)
            if not recs:
                del table[key]
            self.pool_bytes -= rec.nbytes
            self.dropped += 1
        return True

    def _record(self, args, like=None, copy=False):
        """A new recording for args: reading them where they are, or (copy, or like: another
        recording of this layout, whose input buffers it shares) graph-owned copies; the
        small inputs seen moving (self.copied) are copied always. None when the capture
        failed (graphs off) or does not fit the memory budget."""
        if not self._make_room():
            self.over_budget += 1
            return None
        reserved = torch.cuda.memory_reserved(self.device_index)
        if like is not None:
            buffers = like.buffers
        else:
            buffers = {
                i: torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device=a.device)
                for i, a in enumerate(args)
                if i not in self.static and isinstance(a, torch.Tensor) and (copy or i in self.copied)
            }
        inputs = list(args)
        for i, buf in buffers.items():
            buf.copy_(args[i])
            inputs[i] = buf
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.device(self.device_index):
                with torch.cuda.graph(graph, pool=torch.cuda.graph_pool_handle(), capture_error_mode="thread_local"):
                    outputs = self.fn(list(inputs))
        except Exception as e:  # never a failed job: this graph runs without CUDA graphs
            self.off = f"{type(e).__name__}: {e}"
            self.direct.clear()
            self.by_layout.clear()
            warn_once(
                "cudagraphs-capture",
                "a%s %s graph could not be recorded as a CUDA " "graph (%s); it runs without CUDA graphs",
                "n" if self.which[0] == "i" else "",
                self.which,
                self.off.splitlines()[0][:200],
                suffix="",
            )
            return None
        self.recordings += 1
        nbytes = max(0, torch.cuda.memory_reserved(self.device_index) - reserved)
        self.pool_bytes += nbytes
        self.last_bytes = nbytes
        log.debug(
            "fuseml: %s graph recorded (%s inputs copied per replay; %d recorded, " "%d bytes)",
            self.which,
            len(buffers),
            self.recordings,
            nbytes,
        )
        return _Recorded(graph, outputs, inputs, buffers, nbytes)
