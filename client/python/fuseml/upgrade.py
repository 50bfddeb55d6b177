"""A running job picks up the kernels the daemon tunes in the background, without recompiling
its graph.

fusemld (--tune background, its default) answers a fragment's first request with a kernel in
state "verified": one candidate checked against the reference on the GPU, the others still
being timed. When that background tune ends, the store holds the tuned winner under the same
key. A runner holding a verified kernel (runtime.GroupRunner.kernel = (key, state, cubin,
meta)) asks for it again by key (`lookup`, a store read: no compile) and swaps it in:

    up = Upgrader(runners, socket)   # the runners of one compiled graph
    up.tick()                        # once per call of the graph, before it runs

tick() costs a counter increment. Every CHECK_CALLS calls it looks at the clock, and once
FUSEML_UPGRADE_S seconds (default 10; 0: never) have passed it starts one background thread
that asks for every kernel still verified, on one connection. The replies are swapped in by
the next tick(), on the calling thread, between two calls of the graph: never in the middle
of a launch, and never while a CUDA graph is captured (the swap waits for the next call).
The tuned CUBIN is loaded there, on every device the verified one was loaded on, so that a
capture that follows (which cannot load a module) launches it. The modules replaced are kept
loaded (`retired`): a CUDA graph recorded with the verified kernel still replays it until its
replay (graph_replay.py) sees the graph's kernels changed and records it again. A runner measured routing sent to
the kernel keeps it: the tuned kernel is at least as fast as the one measured. One it sent to
ATen is measured again (use_kernel back to None; the graph puts its group back, backend's
Compiled.rewrite_code): the verified kernel is the heuristic default, which can be many times
slower than the tuned one (a batch norm's statistics over [802816, 64]: 1.1 ms against 0.033,
where ATen's sum takes ~0.1). A GEMM group too: its epilogue, run apart since, gives its place
back and is measured again (a GEMM group of Gemma 2's training step: its verified kernel,
0.141 ms, lost to ATen; the tuned one, 0.111 ms, never ran, and each layer kept cuBLAS plus
an epilogue kernel, ~0.15 ms).
Once no runner is verified (all tuned, or the daemon refused one), tick() does nothing more."""

import threading
import time

import torch

from . import routes, runtime, settings, transport
from ._log import log
from .partition import served

CHECK_CALLS = 64  # calls between two looks at the clock
retired = []  # launcher.Modules replaced by an upgrade: kept loaded (CUDA graphs)


def refresh(runners, socket=None, timeout=5.0):
    """Asks the daemon, by key, for the kernel of every runner whose kernel is "verified".
    Returns {runner: (key, state, cubin, meta)} for those now tuned; never raises (a daemon
    that cannot be reached, or refuses, upgrades nothing)."""
    todo = [r for r in runners if r.kernel is not None and r.kernel[1] == "verified"]
    if not todo:
        return {}
    try:
        conn = transport.Connection(socket or transport.default_socket_path(), timeout)
    except (transport.DaemonError, OSError) as e:
        log.debug("fuseml: upgrade check: %s", e)
        return {}
    got = {}
    try:
        rids = {conn.send({"op": "lookup", "key": r.kernel[0]}): r for r in todo}
        for rid, reply in conn.gather(list(rids), timeout).items():
            r = rids[rid]
            if reply.get("ok") and reply.get("state") == "tuned" and reply.get("key") == r.kernel[0]:
                got[r] = (reply["key"], "tuned", reply["cubin"], reply["meta"])
            elif not reply.get("ok"):
                log.debug("fuseml: upgrade check of %s: %s", r.kernel[0][:12], reply.get("code"))
    except (transport.DaemonError, OSError) as e:
        log.debug("fuseml: upgrade check: %s", e)
    finally:
        conn.close()
    return got


def swap(upgrades):
    """Installs refresh()'s result: each runner's kernel replaced, its loaded modules retired
    and the tuned ones loaded in their place. Call between two launches (on the thread that
    launches), never during a CUDA-graph capture."""
    for r, kernel in upgrades.items():
        key = kernel[0]
        for k in [k for k in runtime._modules if k[0] == key]:
            retired.append(runtime._modules.pop(k))
            try:
                runtime.load_module(key, k[1], kernel[2], kernel[3])
            except Exception as e:  # loaded by the next launch outside a capture instead
                log.info("fuseml: tuned kernel %s not loaded yet: %s", key[:12], e)
        r.kernel = kernel
        group = getattr(r, "group", None)
        if group is not None:
            served(group, kernel).state = kernel[1]
        if getattr(r, "use_kernel", None) is False and group is not None:
            r.use_kernel, r.timing = None, None  # ATen won against the verified kernel: measure again
        elif getattr(r, "use_kernel", None) is True:
            _inherit_route(r, kernel)
        log.info("fuseml: %s: tuned kernel %s picked up", r.name, key[:12])
    return len(upgrades)


def _inherit_route(r, kernel):
    """A group that runs its verified kernel keeps running the tuned one, so the next process
    need not time the tuned kernel's bytes against ATen again: the decision is remembered for
    them with the verified kernel's times (the tuner chose the tuned configuration by timing it
    against its other candidates, the served default among them)."""
    if getattr(r, "decided_on", None) is None or r.timing is None:
        return
    k_ms, e_ms = r.timing
    routes.remember(routes.signature(kernel[2], r.steps, *r.decided_on), "kernel", k_ms, e_ms)


class Upgrader:
    """The re-ask of one compiled graph's verified kernels (module docstring)."""

    def __init__(self, runners, socket=None):
        self.runners = list(runners)
        self.socket = socket
        self.calls = 0
        self.last = time.monotonic()
        self.thread = None
        self.ready = None  # refresh()'s result, waiting for the next tick
        self.upgraded = 0
        self.done = not any(r.kernel is not None and r.kernel[1] == "verified" for r in self.runners)

    def add(self, runners):
        """More runners of the same graph (groups requested after its first call)."""
        self.runners += list(runners)
        self.done = self.done and not any(r.kernel is not None and r.kernel[1] == "verified" for r in runners)

    def tick(self):
        """Returns how many kernels were swapped in by this call (0 nearly always)."""
        if self.done:
            return 0
        self.calls += 1
        if self.ready is not None:
            if torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing():
                return 0  # modules are loaded by the swap: at the next call, after this capture
            n = swap(self.ready)
            self.upgraded += n
            self.ready = None
            self.done = not any(r.kernel is not None and r.kernel[1] == "verified" for r in self.runners)
            return n
        if self.calls % CHECK_CALLS or self.thread is not None:
            return 0
        every = settings.upgrade_s()
        now = time.monotonic()
        if every <= 0 or now - self.last < every:
            return 0
        self.last = now
        self.thread = threading.Thread(target=self._check, name="fuseml-upgrade", daemon=True)
        self.thread.start()
        return 0

    def _check(self):
        try:
            self.ready = refresh(self.runners, self.socket)
        finally:
            self.thread = None
