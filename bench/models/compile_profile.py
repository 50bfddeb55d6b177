"""Where the first step's time goes: one model, one mode, its first call cold (empty caches)
and then in a second process on the caches the first one filled (the warm compile), each
broken down by wall clock into dynamo's and aot_autograd's stages (their own dynamo_timed
metrics) and fuseml's (the backend's compile of each graph, its requests, its generated code,
the first call's module loads and measured routing).

    python3 compile_profile.py --model llama --size small --mode fuseml --phase train
                               [--out DIR] [--cprofile [--top 40]] [--device cuda]

--mode takes bench/models' modes (compile_modes.py) or any torch.compile backend's name.

A diagnostic for the time to the first step (bench/NOTES.md, "The warm compile"); the figures
that count are bench.py's (cold s, warm s)."""

import argparse
import cProfile
import io
import json
import os
import pstats
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.append(os.path.join(os.path.dirname(HERE), "table"))  # daemon.py
# first: it gives this process (and the warm child, which inherits them) empty compile caches
# before torch is imported
import run_model  # noqa: E402

import torch  # noqa: E402

import compile_modes as modes_mod  # noqa: E402
import model_zoo as models  # noqa: E402
import step_measure as measure  # noqa: E402

# fuseml's stages of a first call, each timed by wall clock around one function (module,
# owner class or None, name): dynamo's and aot_autograd's own come from dynamo_timed
# (torch._dynamo.utils.compile_times). Nested stages include their children.
STAGES = (
    ("fuseml: backend entry (aot_autograd, every graph compiled)", "fuseml.backend", "FuseMLCompiler", "__call__"),
    ("fuseml: one graph compiled (passes, requests, code)", "fuseml.backend", "FuseMLCompiler", "compile_graph"),
    ("fuseml: fragments asked of fusemld", "fuseml.backend", "FuseMLCompiler", "_request"),
    ("fuseml: straight-line code generated", "fuseml.straight_line", None, "generate"),
    ("fuseml: kernels loaded (cuModuleLoadData)", "fuseml.launcher", "Module", "__init__"),
    ("fuseml: measured routing (kernel timed against ATen)", "fuseml.runtime", "GroupRunner", "_decide"),
    ("fuseml: a kept graph compiled again (AOTAutogradCache hit)", "fuseml.aot_cache", "KeptGraph", "post_compile"),
)


class StageClock:
    """Wall-clock totals of the STAGES' functions, wrapped in place for one first call (no
    profiler: cProfile doubles a compile's time and dynamo's frames confuse its tree)."""

    def __init__(self):
        self.totals, self.calls, self.undo = {}, {}, []

    def __enter__(self):
        import importlib

        for label, module, owner, name in STAGES:
            try:
                holder = importlib.import_module(module)
            except ImportError:
                continue
            holder = getattr(holder, owner) if owner else holder
            orig = getattr(holder, name)
            setattr(holder, name, self._timed(label, orig))
            self.undo.append((holder, name, orig))
        return self

    def _timed(self, label, fn):
        def timed(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                self.totals[label] = self.totals.get(label, 0.0) + time.perf_counter() - t0
                self.calls[label] = self.calls.get(label, 0) + 1

        return timed

    def __exit__(self, *exc):
        for holder, name, orig in reversed(self.undo):
            setattr(holder, name, orig)

    def table(self):
        rows = ["| stage | calls | seconds |", "|---|---|---|"]
        for label, *_ in STAGES:
            if label in self.calls:
                rows.append(f"| {label} | {self.calls[label]} | {self.totals[label]:.3f} |")
        return "\n".join(rows)


def _mode(name):
    """A bench mode by name, or any other torch.compile backend by its name (aot_eager: the
    floor of a backend that runs aot_autograd and compiles nothing)."""
    if name in modes_mod.MODES:
        return modes_mod.MODES[name]
    return modes_mod.Mode(name, name, False, lambda model: torch.compile(model, backend=name))


def first_call(args, dev, profile):
    """One process: build the model, compile with the mode, time its first step by stage
    (and under cProfile when asked)."""
    from torch._dynamo import utils as dynamo_utils

    mode = _mode(args.mode)
    run_model.warm_up_process(dev)
    dynamo_utils.compilation_time_metrics.clear()
    work = models.build(args.model, args.size, dev)
    ph = run_model.Phase(work, args.phase)
    work.model.train(args.phase == "train")
    fn = mode.make(work.model)
    prof = cProfile.Profile() if profile else None
    measure.sync(dev)
    with StageClock() as clock:
        t0 = time.perf_counter()
        if prof:
            prof.enable()
        ph.step(fn, graphs=mode.graphs)
        measure.sync(dev)
        if prof:
            prof.disable()
        seconds = time.perf_counter() - t0
    text = clock.table() + "\n\n" + dynamo_utils.compile_times(repr="str", aggregate=True)
    text += "\n\naot_autograd's cache: " + json.dumps(dict(dynamo_utils.counters["aot_autograd"]))
    if mode.family == "fuseml":
        from fuseml import runtime

        text += "\n\nfuseml counters after the first call: " + json.dumps(runtime.counters)
    if prof:
        out = io.StringIO()
        stats = pstats.Stats(prof, stream=out)
        stats.sort_stats("cumulative").print_stats(args.top)
        stats.sort_stats("tottime").print_stats(args.top)
        text += "\n\n" + out.getvalue()
    if mode.family == "fuseml":
        run_model._wait_tuned(time.monotonic() + 300)  # the warm child finds tuned kernels
    return seconds, text


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--size", default="small")
    p.add_argument("--mode", default="fuseml")
    p.add_argument("--phase", default="train", choices=("fwd", "train"))
    p.add_argument("--top", type=int, default=40)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--out", default=None)
    p.add_argument("--cprofile", action="store_true", help="also cProfile each first call (slows it ~2x)")
    p.add_argument("--warm-child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    dev = torch.device(args.device)
    modes_mod.allow_many_graphs()
    if args.warm_child:
        seconds, text = first_call(args, dev, args.cprofile)
        print("WARM " + json.dumps({"seconds": seconds, "text": text}))
        return
    daemon = run_model.start_daemon([_mode(args.mode)], dev)
    try:
        cold = first_call(args, dev, args.cprofile)
        child = subprocess.run(
            [sys.executable, os.path.abspath(__file__), "--warm-child"] + (argv if argv is not None else sys.argv[1:]),
            capture_output=True,
            text=True,
            env=dict(os.environ),
        )
    finally:
        if daemon is not None:
            daemon.stop()
    warm = None
    for line in child.stdout.splitlines():
        if line.startswith("WARM "):
            w = json.loads(line[5:])
            warm = (w["seconds"], w["text"])
    tag = f"{args.model}/{args.size} {args.phase} {args.mode}"
    report = [f"== {tag}: first call cold {cold[0]:.2f} s", cold[1], ""]
    if warm is None:
        report.append(f"warm child failed (exit {child.returncode}): {child.stderr[-2000:]}")
    else:
        report += [f"== {tag}: first call warm (second process) {warm[0]:.2f} s", warm[1]]
    text = "\n".join(report)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        name = f"compile-{args.model}-{args.size}-{args.phase}-{args.mode}.txt"
        with open(os.path.join(args.out, name), "w") as f:
            f.write(text)
    print(text)


if __name__ == "__main__":
    main()
