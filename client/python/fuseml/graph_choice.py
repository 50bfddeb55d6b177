"""One graph compiled two ways, the faster kept by measuring the graph's own calls.

rest="inductor" compiles each graph twice: by Inductor alone, and by Inductor with fuseml's
served groups in it as extern kernels. Which is faster is not knowable ahead: a group runs
through the dispatcher and the runner's Python (~20-30 us of host a group, against a few us
for a Triton launch from Inductor's wrapper), and it takes its ops away from the fusions
Inductor would have made around them; on a GPU-bound graph its kernel may still win. So the
graph's first calls alternate between the two forms, each call run once as the caller asked
(a graph that updates its inputs, batch norm's running statistics, must never run twice for
one call):

- WARM untimed calls of each form first, the groups' form first (module loads, the groups'
  own measured routing, Inductor's first-call work);
- then TIMED calls of each form, each between two device synchronisations, so that a
  host-bound form's launch time counts as well as its kernels;
- the groups' form is kept only when its median is at most MARGIN of Inductor's alone: a
  tie goes to Inductor, so the choice never keeps a form that measured slower.

After the choice a call costs one attribute read. reset() measures again (tuned kernels
swapped into the groups can turn the result). A call of the groups' form that raises while
measuring (a group's output not in the layout Inductor compiled for, say) settles the choice
on Inductor alone for good (reset() does not measure it again), with one warning, and the
call runs that form on its own arguments: the failure is before any of the graph's in-place
updates in every case seen, which are its last ops. A call inside a CUDA-graph capture, where
synchronising is impossible, runs the chosen form, or Inductor's alone before any choice.
"""

import statistics
import time

import torch

from ._log import log, warn_once

WARM = 1  # untimed calls of each form before timing
TIMED = 3  # timed calls of each form, medians compared
MARGIN = 0.99  # the groups' form must take at most this share of Inductor alone's time

NAMES = ("Inductor alone", "Inductor with fuseml's groups")


class Choice:
    """A boxed callable over two boxed forms of one graph: forms[0] Inductor alone, forms[1]
    with fuseml's groups. `chosen` is the index kept once measured (None before); `times`
    the timed calls' milliseconds of each form; `form` names the one kept ("measuring"
    before); `why` says what was kept and why."""

    def __init__(self, alone, grouped, name="graph"):
        self._boxed_call = True
        self.forms = (alone, grouped)
        self.name = name
        self.failed = False  # the groups' form raised once: never measured again (reset())
        self.reset()

    def reset(self):
        if self.failed:
            return
        self.calls = 0
        self.times = ([], [])
        self.chosen = None
        self.form = "measuring"
        self.why = "measuring: " + " against ".join(NAMES)

    def __call__(self, args):
        if self.chosen is not None:
            return self.forms[self.chosen](args)
        if torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing():
            return self.forms[0](args)
        which = 1 - self.calls % 2  # the groups' form first
        self.calls += 1
        if self.calls <= 2 * WARM:
            return self._run(which, args)
        sync = _synchronizer(args)
        sync()
        start = time.perf_counter()
        out = self._run(which, args)
        if self.chosen is not None:  # the groups' form failed: nothing to time
            return out
        sync()
        self.times[which].append((time.perf_counter() - start) * 1e3)
        if len(self.times[0]) >= TIMED and len(self.times[1]) >= TIMED:
            self._decide()
        return out

    def _run(self, which, args):
        if which == 0:
            return self.forms[0](args)
        kept = list(args)  # a boxed form empties args
        try:
            return self.forms[1](args)
        except Exception as e:  # never the user's failure: Inductor alone from now on
            self.failed, self.chosen, self.form = True, 0, NAMES[0]
            self.why = f"{NAMES[0]}: with fuseml's groups the graph failed ({type(e).__name__}: {e})"
            warn_once("graph_choice", "%s graph runs as %s", self.name, self.why, suffix="")
            args[:] = kept
            return self.forms[0](args)

    def _decide(self):
        alone, grouped = (statistics.median(t) for t in self.times)
        self.chosen = 1 if grouped <= MARGIN * alone else 0
        self.form = NAMES[self.chosen]
        self.why = f"{NAMES[self.chosen]}: {grouped:.3f} ms with the groups, {alone:.3f} ms without (median of {TIMED})"
        log.info("fuseml: %s graph runs as %s", self.name, self.why)


class Fixed:
    """A choice made without measuring (one form only could run): what explain() shows."""

    def __init__(self, chosen, why):
        self.chosen, self.form, self.why = chosen, NAMES[chosen], why


def _synchronizer(args):
    """Waits for the device of the call's CUDA tensors (nothing for a CPU graph). Read before
    the call: a boxed form empties the argument list."""
    for a in args:
        if isinstance(a, torch.Tensor) and a.is_cuda:
            device = a.device
            return lambda: torch.cuda.synchronize(device)
    return lambda: None
