"""Where a compiled step's host time goes: one model, the given modes and phases, each step's
wall time beside its GPU time, then cProfile over a few steps (the Python frames the host
spends its time in, heaviest first).

    python3 host_profile.py --model llama --size small --modes inductor,fuseml --phases fwd,train
                            [--steps 20] [--top 35] [--out DIR] [--kernels]

With --out, each fuseml graph's generated straight-line code is written beside the report
(sources/<model>-<phase>-<n>.py, the graph and its groups beside it): what a step's host runs, line by line.
With --kernels, each report also lists one step's kernels in the order they ran, with their
times. fuseml's steps are measured once the daemon's background tunes have arrived. Every mode
is compiled before any is timed, and the wall times of one phase are taken interleaved (the
order rotated each repetition), so that they compare.

A diagnostic for the default call path (bench/NOTES.md, "Host time per kernel"); the figures
that count are bench.py's."""

import argparse
import collections
import cProfile
import gc
import io
import os
import pstats
import re
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.append(os.path.join(os.path.dirname(HERE), "table"))  # daemon.py
import compile_modes as modes_mod  # noqa: E402
import model_zoo as models  # noqa: E402
import run_model  # noqa: E402
import step_measure as measure  # noqa: E402


def profile_steps(step, dev, steps, top):
    prof = cProfile.Profile()
    measure.sync(dev)
    prof.enable()
    for _ in range(steps):
        step()
    measure.sync(dev)
    prof.disable()
    text = io.StringIO()
    stats = pstats.Stats(prof, stream=text)
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)
    return text.getvalue()


def op_table(step, dev, steps, top):
    """Host time by ATen op and CUDA runtime call (torch.profiler, CPU side), heaviest first:
    what cProfile shows only as calls of torch's op dispatcher."""
    from torch.profiler import ProfilerActivity, profile

    measure.sync(dev)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        measure.sync(dev)
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=top)


def _callers(event, depth=4):
    """The op that issued a kernel and the ops it ran inside, innermost first: an ATen copy
    reads as `aten::copy_ < aten::clone < aten::contiguous < <the op that needed it>`."""
    names = []
    while event is not None and len(names) < depth:
        names.append(event.name)
        event = getattr(event, "cpu_parent", None)
    return names


def kernel_trace(step, dev):
    """One step's GPU work in the order it ran: each kernel, memcpy and memset with its time
    and the ATen op or fuseml launch that issued it (where the profiler links them). Read
    beside the generated code (--out) to tell which group each kernel is."""
    from torch.profiler import ProfilerActivity, profile

    step()
    measure.sync(dev)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step()
        measure.sync(dev)
    # the profiler links each CPU op to the kernels it launched by name only; a stream runs
    # kernels in launch order, so the n-th kernel of a name is the n-th launch of that name
    issuers = collections.defaultdict(collections.deque)
    cpu = sorted(
        (e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CPU and getattr(e, "kernels", None)),
        key=lambda e: e.time_range.start,
    )
    for e in cpu:
        for k in e.kernels:
            issuers[k.name].append(" < ".join(_callers(e)))
    rows = ["| # | start us | us | kernel | issued by (innermost op first) |", "|---|---|---|---|---|"]
    gpu = sorted(
        (e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA), key=lambda e: e.time_range.start
    )
    t0 = gpu[0].time_range.start if gpu else 0
    for i, e in enumerate(gpu):
        by = issuers[e.name].popleft() if issuers[e.name] else ""
        rows.append(
            f"| {i} | {e.time_range.start - t0:.0f} | {e.time_range.elapsed_us():.1f} | {e.name[:90]} | {by[:200]} |"
        )
    return "\n".join(rows)


def _line_kind(text, scope):
    """What one line of generated code does, for the line table."""
    t = text.strip()
    m = re.match(r"[\w, ]+= (f\d+)\(", t)
    if m:
        target = scope.get(m.group(1))
        return f"ATen {getattr(target, '__name__', None) or str(target)}"
    for key, kind in (
        ("& 15", "launch with its alignment test"),
        ("check(", "input check"),
        ("reinterpret(", "view (reinterpret)"),
        ("empty(", "output allocation"),
        ("launch_", "kernel launch (ours)"),
        (".eager(", "group's ATen ops"),
        (".data_ptr()", "pointer read"),
        ("del ", "del"),
    ):
        if key in t:
            return kind
    return "other"


def _timed_source(source):
    """The generated function with a clock read before each statement of its body (a block
    of the body, an `if` with its branches, counts as one statement), and the kinds of those
    statements: (source, kinds); segment i is kinds[i]'s time."""
    out, kinds, inside = [], [], False
    for line in source.split("\n"):
        # the body proper: after the entry checks (whose `return slow(args)` never runs)
        inside = inside or line.startswith(("    with ", "    if True:"))
        body = inside and line.startswith("        ") and not line.startswith("         ")
        if body and not line.strip().startswith(("else", "elif", "except")):
            out.append("        _T.append(_clock())")
            kinds.append(line)
        out.append(line)
    return "\n".join(out), kinds


def issue_time(step, dev, steps=3):
    """Host seconds per step: a few steps queued without a sync between them (few enough that
    the launch queue does not fill)."""
    measure.sync(dev)
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    issue = (time.perf_counter() - t0) / steps
    measure.sync(dev)
    return issue


def line_table(step, dev, plans, steps):
    """Host time of each kind of statement of the generated code, from clock reads compiled
    in between them (~0.1 us each), beside the step's issue time without a sync: what the
    straight-line code costs by kind, and what the step spends outside it."""
    timed = []
    for plan in plans:
        c = plan.compiled
        fast = getattr(c, "fast", None) if c is not None else None
        if fast is None or not getattr(fast, "source", None):
            continue
        src, kinds = _timed_source(fast.source)
        scope = dict(fast.__globals__)
        stamps = []
        scope.update(_T=stamps, _clock=time.perf_counter)
        exec(compile(src, "<fuseml straight line, timed>", "exec"), scope)
        timed.append((c, fast, scope["call"], kinds, stamps, fast.__globals__))
    if not timed:
        return "no generated code to time"
    issue = issue_time(step, dev)
    gc.disable()
    try:
        issue_no_gc = issue_time(step, dev)
    finally:
        gc.enable()
    totals, counts = collections.defaultdict(float), collections.Counter()
    for c, fast, timed_call, kinds, stamps, scope in timed:
        c.fast = timed_call
    try:
        for _ in range(steps):
            for *_, stamps, _scope in timed:
                stamps.clear()
            step()
            measure.sync(dev)
            for c, fast, timed_call, kinds, stamps, scope in timed:
                for i in range(min(len(stamps), len(kinds)) - 1):
                    kind = _line_kind(kinds[i], scope)
                    totals[kind] += stamps[i + 1] - stamps[i]
                    counts[kind] += 1
    finally:
        for c, fast, *_ in timed:
            c.fast = fast
    rows = [
        f"issue time per step, no sync between steps: {issue * 1e3:.3f} ms "
        f"({issue_no_gc * 1e3:.3f} ms with the garbage collector off)",
        "",
        "| statement kind | us per step | statements per step | us each |",
        "|---|---|---|---|",
    ]
    traced = 0.0
    for kind, sec in sorted(totals.items(), key=lambda kv: -kv[1]):
        per_step = sec * 1e6 / steps
        traced += per_step
        n = counts[kind] / steps
        rows.append(f"| {kind} | {per_step:.0f} | {n:.0f} | {per_step / max(n, 1):.2f} |")
    rows.append(f"| all statements | {traced:.0f} | {sum(counts.values()) / steps:.0f} | |")
    return "\n".join(rows)


def write_sources(plans, out, tag):
    """Each compiled graph's generated code (the function's `source`), one file a graph."""
    out = os.path.join(out, "sources")
    os.makedirs(out, exist_ok=True)
    for i, plan in enumerate(plans):
        fast = getattr(plan.compiled, "fast", None) if plan.compiled is not None else None
        src = getattr(fast, "source", None)
        if src:
            with open(os.path.join(out, f"{tag}-{i}.py"), "w") as f:
                f.write(src)
            with open(os.path.join(out, f"{tag}-{i}-graph.txt"), "w") as f:
                f.write(plan.describe() + "\n\n" + plan.compiled.gm.code)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--size", default="small")
    p.add_argument("--modes", default="inductor,fuseml")
    p.add_argument("--phases", default="fwd,train")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--top", type=int, default=35)
    p.add_argument("--out", default=None)
    p.add_argument("--kernels", action="store_true", help="list one step's kernels in order")
    args = p.parse_args(argv)
    dev = torch.device("cuda")
    modes_mod.allow_many_graphs()
    selected = modes_mod.select(args.modes)
    daemon = run_model.start_daemon(selected, dev)
    work = models.build(args.model, args.size, dev)
    run_model.same_graphs_for_every_mode()
    report = []
    phases = args.phases.split(",")
    try:
        # every mode compiled first, so that the wall times below are taken interleaved in one
        # process state: timed one mode after another, the host drifted by up to a third
        # between them (bench/NOTES.md, "Host figures taken one mode after another")
        runs = []  # (mode, phase, step, first-call seconds)
        for mode in selected:
            fn = mode.make(work.model)
            for phase in phases:
                ph = run_model.Phase(work, phase)
                work.model.train(phase == "train")

                def step(ph=ph, fn=fn, graphs=mode.graphs):
                    return ph.step(fn, graphs=graphs)

                t0 = time.perf_counter()
                step()
                measure.sync(dev)
                compile_s = time.perf_counter() - t0
                if mode.family == "fuseml":
                    run_model._wait_tuned(time.monotonic() + 400)  # the steady step runs tuned kernels
                for _ in range(3):
                    step()
                runs.append((mode, phase, step, compile_s))
        for phase in phases:
            work.model.train(phase == "train")
            here = [r for r in runs if r[1] == phase]
            walls = measure.wall_ms({mode.name: step for mode, _, step, _ in here}, dev, 21)
            for mode, _, step, compile_s in here:
                wall = walls[mode.name]["ms"]
                prof = measure.profile(step, dev)
                head = (
                    f"== {args.model}/{args.size} {phase} {mode.name}: wall {wall:.3f} ms, "
                    f"GPU {prof['gpu_ms']:.3f} ms, {prof['kernels']} kernels, "
                    f"host/kernel {(wall - prof['gpu_ms']) * 1e3 / max(1, prof['kernels']):.1f} us, "
                    f"first call {compile_s:.1f} s"
                )
                print(head, flush=True)
                report.append(head)
                if mode.family == "fuseml":
                    from fuseml import backend

                    plans = backend._default.plans if backend._default else []
                    ways = collections.Counter(p.compiled.path if p.compiled else str(p.skipped) for p in plans)
                    for way, n in ways.most_common():
                        line = f"   {n} graph(s) run as {way}"
                        print(line, flush=True)
                        report.append(line)
                    if args.out:
                        write_sources(plans, args.out, f"{args.model}-{phase}")
                    table = line_table(step, dev, plans, args.steps)
                    print(table, flush=True)
                    report.append(table)
                if args.kernels and mode.family != "eager":
                    report.append(f"kernels of one step, {mode.name} {phase}:\n" + kernel_trace(step, dev))
                if mode.family != "eager":
                    report.append(profile_steps(step, dev, args.steps, args.top))
                    report.append(op_table(step, dev, args.steps, args.top))
    finally:
        if daemon is not None:
            daemon.stop()
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, f"host-{args.model}-{args.size}.txt"), "w") as f:
            f.write("\n".join(report))
    else:
        print("\n".join(report))


if __name__ == "__main__":
    main()
