"""One model, every mode and phase, in one process (bench.py runs one of these per model).

    python3 run_model.py --model llama --size small --out DIR [--modes ...] [--phases fwd,train]
                   [--reps 21] [--device cuda] [--budget-s 540] [--no-warm]

Writes DIR/<model>-<size>.json: {"device", "date", "torch", "rows": [...], "models": {...}}.
The process starts with empty compile caches (its own Inductor and Triton cache directories,
and its own fusemld on a fresh database when a fuseml mode runs), so each mode's first call
is a cold compile; the caches shared by modes of one family are named in `cold_after`. Then
a second process on the filled caches (run_model.py --warm-child) times each first call again:
the warm compile.

A training step is the loss forward and backward, gradients set to None before it; no
optimizer step. An inference step runs under no_grad with the model in eval mode."""

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time

# Empty compile caches for this process (and its warm child, which is handed the same ones):
# set before torch is imported, which reads them.
_CACHE = os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="fm-models-inductor-"))
os.environ.setdefault("TRITON_CACHE_DIR", os.path.join(_CACHE, "triton"))
os.environ.setdefault("FUSEML_ROUTE_CACHE", os.path.join(_CACHE, "fuseml-routes.db"))

import torch  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.append(os.path.join(os.path.dirname(HERE), "table"))  # daemon.py
import step_measure as measure  # noqa: E402
import model_zoo as models  # noqa: E402
import compile_modes as modes_mod  # noqa: E402
import fuseml_state  # noqa: E402
import model_report as report  # noqa: E402

PHASES = ("fwd", "train")


class Phase:
    """The steps of one phase of one workload: `step(fn)` runs one (returns what the error
    is measured on), `clear()` drops what a step leaves behind (gradients) so that memory
    before a step is the model and its inputs alone."""

    def __init__(self, work, phase):
        self.work, self.phase = work, phase
        self.params = [p for p in work.model.parameters() if p.requires_grad]

    def clear(self):
        for p in self.params:
            p.grad = None

    def step(self, fn, graphs=False):
        if graphs:
            torch.compiler.cudagraph_mark_step_begin()
        if self.phase == "fwd":
            with torch.no_grad():
                return [self.work.forward(fn, self.work.inputs)]
        self.clear()
        loss = self.work.loss(fn, self.work.inputs)
        loss.backward()
        return [loss]

    def result(self, out):
        """The tensors the error is measured on: the output, or the loss and every gradient."""
        if self.phase == "fwd":
            return out
        return out + [p.grad for p in self.params]


def reference(work, phase):
    """The fp32 eager copy's output (or loss and gradients) for this phase."""
    ref, inputs = work.fp32_copy()
    ref.train(phase == "train")
    if phase == "fwd":
        with torch.no_grad():
            got = [work.forward(ref, inputs)]
        return got
    loss = work.loss(ref, inputs)
    loss.backward()
    return [loss] + [p.grad for p in ref.parameters() if p.requires_grad]


def errors(got, want, phase):
    """rel_err of a step (the worst of the output, or of the loss and of all gradients
    together), with its parts."""
    if phase == "fwd":
        parts = {"output": measure.rel_err(got, want)}
    else:
        parts = {"loss": measure.rel_err(got[:1], want[:1]), "grads": measure.rel_err(got[1:], want[1:])}
    worst = max(parts.values())
    return worst, parts


def _finite(x):
    return None if x is None or x != x or x in (float("inf"), float("-inf")) else x


def warm_up_process(dev):
    """Pay process-wide one-time costs (Dynamo's first use, Inductor's worker pool) on a
    throwaway function, so they do not land on the first mode's compile."""
    try:
        f = torch.compile(lambda x: (x * 2).sin() + 1)
        f(torch.randn(64, device=dev))
        measure.sync(dev)
    except Exception as e:  # the modes say for themselves whether they compile
        print(f"run: process warm-up compile failed: {e!r}", file=sys.stderr)


def same_graphs_for_every_mode():
    """The graph breaks fuseml avoids (fuseml/graph_breaks.py: Hugging Face's logger calls in a
    forward pass) avoided before any mode compiles: the registration is process-wide, and
    every mode of this process then compiles the same graphs, whichever runs first."""
    try:
        from fuseml import graph_breaks
    except ImportError:
        return
    graph_breaks.avoid()


def start_daemon(selected, dev):
    """A private fusemld on a fresh database for the fuseml modes, when one is built; the
    fuseml backend finds it through FUSEML_SOCKET. None when no fuseml mode runs or no
    fusemld is found (fuseml then runs eager, with its warning: the smoke test's case)."""
    if not any(m.family == "fuseml" for m in selected) or os.environ.get("FUSEML_SOCKET"):
        return None
    from daemon import Daemon, find_fusemld

    exe = find_fusemld()
    if not exe:
        print("run: no fusemld built; the fuseml modes run without a daemon", file=sys.stderr)
        return None
    d = Daemon(exe, tag="models")
    os.environ["FUSEML_SOCKET"] = d.socket
    os.environ["FUSEML_NO_AUTOSTART"] = "1"
    return d


def _wait_tuned(deadline, limit_s=240.0):
    """fusemld answers first with a verified kernel and tunes in the background: the steady
    step is measured once every compiled graph holds its tuned kernels. Swaps them in as the
    daemon finishes (fuseml.backend.pick_up_tuned) until none is left verified or limit_s
    passes; returns the seconds waited (what a job runs on verified kernels)."""
    try:
        from fuseml import backend
    except ImportError:
        return 0.0
    t0 = time.monotonic()
    end = min(t0 + limit_s, deadline - 60)
    while True:
        backend.pick_up_tuned()
        if not fuseml_state.verified_left() or time.monotonic() > end:
            return time.monotonic() - t0
        time.sleep(1.0)


def measure_model(args, dev, selected, deadline, save):
    """Every phase of every selected mode; save(describe, rows, breakdown) after each phase,
    so a process stopped later still leaves the phases it finished."""
    from torch._dynamo.utils import counters

    work = models.build(args.model, args.size, dev)
    same_graphs_for_every_mode()
    compiled = {}
    rows, breakdown = [], {}
    compiled_before = {}  # family -> ["mode/phase", ...] compiled earlier in this process
    for phase in args.phases:
        ph = Phase(work, phase)
        work.model.train(phase == "train")
        want = reference(work, phase)
        measure.sync(dev)
        ok = {}
        first = {}
        capture_peak = {}
        first_peak = {}  # mode -> GB above the step's inputs during the first calls (the graph modes': the first)
        cold_after = {}
        errs = {}
        fail = {}
        plans = {}  # mode -> the fuseml plans its first calls compiled (backend="fuseml")
        tune_wait = {}  # mode -> seconds until the daemon's background tunes were picked up
        untuned = {}  # mode -> kernels still served verified when the wait ended (cut by the deadline)
        cold_aot = {}  # mode -> what torch's AOTAutogradCache did in the first call (a save, a bypass)
        for mode in selected:
            if time.monotonic() > deadline:
                fail[mode.name] = "not run: the process's time budget was spent"
                continue
            try:
                if mode.name not in compiled:
                    compiled[mode.name] = mode.make(work.model)
                fn = compiled[mode.name]
                ph.clear()
                known = {id(p) for p in fuseml_state.plans()}
                measure.sync(dev)
                base = torch.cuda.memory_allocated(dev) if dev.type == "cuda" else 0
                if dev.type == "cuda":
                    torch.cuda.reset_peak_memory_stats(dev)
                before = dict(counters["aot_autograd"])
                first[mode.name] = measure.timed_call(lambda: ph.step(fn, mode.graphs), dev)
                cold_aot[mode.name] = _counted_since(before, counters["aot_autograd"])
                cold_after[mode.name] = list(compiled_before.get(mode.family, []))
                compiled_before.setdefault(mode.family, []).append(f"{mode.name}/{phase}")
                if mode.family == "fuseml":
                    tune_wait[mode.name] = _wait_tuned(deadline)
                    untuned[mode.name] = fuseml_state.verified_left()
                if dev.type == "cuda":
                    # the first call's own peak (compiling, measured routing: each group's kernel
                    # and ATen ops run side by side once) is reported apart; the graph modes'
                    # peak is that of the calls that record, not of the compile before them
                    measure.sync(dev)
                    first_peak[mode.name] = (torch.cuda.max_memory_allocated(dev) - base) / 1e9
                    torch.cuda.reset_peak_memory_stats(dev)
                for _ in range(3):  # the graph modes record on their second or third call
                    ph.step(fn, mode.graphs)
                measure.sync(dev)
                if dev.type == "cuda" and mode.graphs:
                    capture_peak[mode.name] = torch.cuda.max_memory_allocated(dev) - base
                elif dev.type == "cuda":  # the next calls (fuseml's generated code runs its first)
                    later = (torch.cuda.max_memory_allocated(dev) - base) / 1e9
                    first_peak[mode.name] = max(first_peak[mode.name], later)
                got = ph.result(ph.step(fn, mode.graphs))
                plans[mode.name] = [p for p in fuseml_state.plans() if id(p) not in known]
                errs[mode.name] = errors(got, want, phase)
                del got
                ok[mode.name] = mode
            except Exception as e:  # one mode's failure must not hide the others
                fail[mode.name] = f"{type(e).__name__}: {str(e)[:600]}"
                print(f"run: {args.model}/{args.size} {mode.name} {phase} failed: {fail[mode.name]}", file=sys.stderr)
        eager_err = errs.get("eager", (None, None))[0]
        steps = {name: (lambda fn=compiled[name], g=m.graphs: ph.step(fn, g)) for name, m in ok.items()}
        try:
            walls = measure.wall_ms(steps, dev, args.reps, target_ms=args.target_ms) if steps else {}
        except Exception as e:
            for name in list(ok):
                fail[name] = f"timing failed: {type(e).__name__}: {str(e)[:400]}"
            ok, walls = {}, {}
        for mode in selected:
            row = {"model": args.model, "size": args.size, "mode": mode.name, "phase": phase}
            if mode.name not in ok:
                rows.append({**row, "error": fail.get(mode.name, "not run")})
                continue
            step = steps[mode.name]
            try:
                ph.clear()
                peak = measure.peak_memory_gb(step, dev, capture_peak.get(mode.name, 0))
                prof = measure.profile(step, dev, steps=args.profile_steps)
            except Exception as e:
                rows.append({**row, "error": f"profiling failed: {type(e).__name__}: {str(e)[:400]}"})
                continue
            err, parts = errs[mode.name]
            rows.append(
                {
                    **row,
                    "wall_ms": walls[mode.name]["ms"],
                    "wall_iqr_ms": walls[mode.name]["iqr_ms"],
                    "gpu_ms": prof["gpu_ms"],
                    "kernels": prof["kernels"],
                    "peak_mem_gb": peak,
                    "first_call_peak_gb": first_peak.get(mode.name),
                    "first_call_s": first[mode.name],
                    # eager compiles nothing: its first call is not a compile time
                    "compile_cold_s": None if mode.family == "eager" else first[mode.name],
                    "cold_after": cold_after[mode.name] if mode.family != "eager" else [],
                    # no "autograd_cache_saved" here and a miss in the warm child: the entry
                    # could not be written (torch says why in a warning)
                    "compile_cold_aot": cold_aot.get(mode.name),
                    "compile_warm_s": None,
                    "rel_err": _finite(err),
                    "rel_err_parts": {k: _finite(v) for k, v in parts.items()},
                    "eager_bf16_rel_err": _finite(eager_err),
                    "nonfinite": err == float("inf"),
                }
            )
            if mode.name in tune_wait:
                rows[-1]["tune_wait_s"] = tune_wait[mode.name]
                rows[-1]["untuned_left"] = untuned[mode.name]
            if plans.get(mode.name):
                rows[-1]["graphs_run_as"] = fuseml_state.paths(plans[mode.name])
                rows[-1]["routed_to_aten"] = fuseml_state.routed_to_aten(plans[mode.name])
                if rows[-1]["routed_to_aten"]:
                    print(
                        f"run: {args.model}/{args.size} {mode.name} {phase}: "
                        f"{len(rows[-1]['routed_to_aten'])} group(s) measured slower than ATen: "
                        f"{rows[-1]['routed_to_aten'][:6]}",
                        file=sys.stderr,
                    )
                if fuseml_state.choices(plans[mode.name]):
                    rows[-1]["forms_chosen"] = fuseml_state.choices(plans[mode.name])
                    print(f"run: {mode.name} {phase}: {rows[-1]['forms_chosen']}", file=sys.stderr)
                print(
                    f"run: {args.model}/{args.size} {mode.name} {phase}: graphs run as " f"{rows[-1]['graphs_run_as']}",
                    file=sys.stderr,
                )
            breakdown.setdefault(mode.name, {})[phase] = prof
        ph.clear()
        del want
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        save(work.describe, rows, breakdown)
    return work.describe, rows, breakdown


def _counted_since(before, after):
    """The counters that moved since `before` (a copy of torch's aot_autograd counters)."""
    return {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}


def warm_child(args, dev, selected):
    """The warm compile: this process finds the caches the first one filled; the first call
    of each mode and phase, timed. Prints {"mode/phase": seconds or an error string} and, for
    each, {"mode/phase aot": what torch's AOTAutogradCache did in that call (its counters: a
    hit, a miss, a bypass)}."""
    from torch._dynamo.utils import counters

    warm_up_process(dev)
    work = models.build(args.model, args.size, dev)
    same_graphs_for_every_mode()
    out, compiled = {}, {}
    for phase in args.phases:
        ph = Phase(work, phase)
        work.model.train(phase == "train")
        for mode in selected:
            if mode.family == "eager":
                continue
            key = f"{mode.name}/{phase}"
            try:
                if mode.name not in compiled:
                    compiled[mode.name] = mode.make(work.model)
                fn = compiled[mode.name]
                ph.clear()
                before = dict(counters["aot_autograd"])
                out[key] = measure.timed_call(lambda: ph.step(fn, mode.graphs), dev)
                out[f"{key} aot"] = _counted_since(before, counters["aot_autograd"])
            except Exception as e:
                out[key] = f"{type(e).__name__}: {str(e)[:300]}"
    print("WARM " + json.dumps(out))


def run_warm_child(args, selected, timeout_s):
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--warm-child",
        "--model",
        args.model,
        "--size",
        args.size,
        "--device",
        args.device,
        "--modes",
        ",".join(m.name for m in selected),
        "--phases",
        ",".join(args.phases),
    ]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=max(1, timeout_s), env=dict(os.environ))
    except subprocess.TimeoutExpired:
        return None, f"warm compile not measured: the child ran past {timeout_s:.0f} s"
    for line in r.stdout.splitlines():
        if line.startswith("WARM "):
            return json.loads(line[5:]), None
    return None, f"warm compile child failed (exit {r.returncode}): {r.stderr[-400:]}"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, choices=list(models.MODELS))
    ap.add_argument("--size", default="small", choices=("small", "large", "tiny"))
    ap.add_argument("--modes", default="", help="comma-separated (default: all): " + ", ".join(modes_mod.MODES))
    ap.add_argument("--phases", default="fwd,train")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", help="directory for <model>-<size>.json")
    ap.add_argument("--reps", type=int, default=21)
    ap.add_argument("--target-ms", type=float, default=25.0)
    ap.add_argument("--profile-steps", type=int, default=3)
    ap.add_argument(
        "--budget-s", type=float, default=540.0, help="stop starting modes past this; the warm child gets what is left"
    )
    ap.add_argument("--no-warm", action="store_true", help="skip the warm-compile child")
    ap.add_argument("--warm-child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    args.phases = [p for p in args.phases.split(",") if p]
    bad = [p for p in args.phases if p not in PHASES]
    if bad:
        ap.error(f"unknown phase(s) {', '.join(bad)}; known: {', '.join(PHASES)}")
    try:
        selected = modes_mod.select(args.modes)
    except ValueError as e:
        ap.error(str(e))
    if args.size not in models.MODELS[args.model][1] + ("tiny",):
        ap.error(f"model {args.model} has no size {args.size}")
    dev = torch.device(args.device)
    modes_mod.allow_many_graphs()
    if args.warm_child:
        warm_child(args, dev, selected)
        return 0
    if not args.out:
        ap.error("--out is required")
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"{args.model}-{args.size}.json")

    def save(describe, rows, breakdown):
        doc = {
            "device": report.device_slug(dev),
            "date": datetime.date.today().isoformat(),
            "torch": torch.__version__,
            "rows": rows,
            "models": {f"{args.model}/{args.size}": {"describe": describe, "breakdown": breakdown}},
        }
        with open(path + ".tmp", "w") as f:
            json.dump(doc, f, indent=1)
        os.replace(path + ".tmp", path)

    daemon = start_daemon(selected, dev)
    try:
        warm_up_process(dev)
        # the warm child needs time too: measurement stops starting modes at 70% of the budget
        # (all of it when there is no warm child: the tune waits are cut at that deadline)
        share = 1.0 if args.no_warm else 0.7
        describe, rows, breakdown = measure_model(args, dev, selected, t0 + share * args.budget_s, save)
        if not args.no_warm:
            warm, why = run_warm_child(args, selected, args.budget_s - (time.monotonic() - t0) - 5)
            for row in rows:
                if "error" in row or row["mode"] == "eager":
                    continue
                v = (warm or {}).get(f"{row['mode']}/{row['phase']}")
                if isinstance(v, (int, float)):
                    row["compile_warm_s"] = v
                    row["compile_warm_aot"] = (warm or {}).get(f"{row['mode']}/{row['phase']} aot")
                else:
                    row["compile_warm_note"] = why or v or "not measured"
            save(describe, rows, breakdown)
    finally:
        if daemon:
            daemon.stop(keep_log_to=os.path.join(args.out, f"fusemld-{args.model}-{args.size}.log"))
    print(
        f"run: {args.model}/{args.size}: {len(rows)} rows, {sum('error' in r for r in rows)} errors, "
        f"{time.monotonic() - t0:.0f} s -> {path}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
