"""Where a compiled step's host time goes: one model, the given modes and phases, each step's
wall time beside its GPU time, then cProfile over a few steps (the Python frames the host
spends its time in, heaviest first).

    python3 host_profile.py --model llama --size small --modes inductor,fuseml --phases fwd,train
                            [--steps 20] [--top 35] [--out DIR]

A diagnostic for the default call path (bench/NOTES.md, "Host time per kernel"); the figures
that count are bench.py's."""

import argparse
import cProfile
import io
import os
import pstats
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


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--size", default="small")
    p.add_argument("--modes", default="inductor,fuseml")
    p.add_argument("--phases", default="fwd,train")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--top", type=int, default=35)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    dev = torch.device("cuda")
    modes_mod.allow_many_graphs()
    selected = modes_mod.select(args.modes)
    daemon = run_model.start_daemon(selected, dev)
    work = models.build(args.model, args.size, dev)
    report = []
    try:
        for mode in selected:
            fn = mode.make(work.model)
            for phase in args.phases.split(","):
                ph = run_model.Phase(work, phase)
                work.model.train(phase == "train")

                def step():
                    return ph.step(fn, graphs=mode.graphs)

                t0 = time.perf_counter()
                step()
                measure.sync(dev)
                compile_s = time.perf_counter() - t0
                for _ in range(3):
                    step()
                wall = measure.wall_ms({"s": step}, dev, 21)["s"]["ms"]
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
                    import collections
                    from fuseml import backend

                    plans = backend._default.plans if backend._default else []
                    ways = collections.Counter(p.compiled.path if p.compiled else str(p.skipped) for p in plans)
                    for way, n in ways.most_common():
                        line = f"   {n} graph(s) run as {way}"
                        print(line, flush=True)
                        report.append(line)
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
