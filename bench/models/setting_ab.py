"""One model under fuseml with an environment setting at two or more values, in one process:
each value's first step (compile), wall time interleaved with the others', GPU time and its
breakdown by kernel class, the costliest kernels, and the error against the fp32 copy beside
eager bf16's. A setting is read when a graph is compiled, so each value gets its own compiled
model; one process keeps the comparison inside one host's drift.

    python3 setting_ab.py --model convnet --phase train --env FUSEML_BATCH_NORM=auto,aten [--out DIR]

A diagnostic for a choice not yet made (which default a setting should have); the figures
that count are bench.py's."""

import argparse
import json
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.append(os.path.join(os.path.dirname(HERE), "table"))  # daemon.py
import compile_modes as modes_mod  # noqa: E402
import fuseml_state  # noqa: E402
import model_zoo as models  # noqa: E402
import run_model  # noqa: E402
import step_measure as measure  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--size", default="small")
    p.add_argument("--phase", default="train", choices=("fwd", "train"))
    p.add_argument("--env", required=True, help="NAME=value,value,...")
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--tune-wait-s", type=float, default=240.0, help="most seconds to wait for tuned kernels, per value")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    name, _, values = args.env.partition("=")
    values = [v for v in values.split(",") if v]
    if not name.startswith("FUSEML_") or len(values) < 2:
        p.error(f"--env {args.env!r}: expected FUSEML_NAME=value,value[,...] (two values or more)")
    dev = torch.device("cuda")
    modes_mod.allow_many_graphs()
    selected = modes_mod.select("fuseml")
    daemon = run_model.start_daemon(selected, dev)
    work = models.build(args.model, args.size, dev)
    work.model.train(args.phase == "train")
    ph = run_model.Phase(work, args.phase)
    want = run_model.reference(work, args.phase)
    eager_err, _ = run_model.errors(ph.result(ph.step(work.model)), want, args.phase)
    import fuseml

    steps, rows, compilers = {}, {}, {}
    try:
        for v in values:
            os.environ[name] = v
            compilers[v] = fuseml.FuseMLCompiler()
            fn = torch.compile(work.model, backend=compilers[v])

            def step(fn=fn):
                return ph.step(fn)

            t0 = time.perf_counter()
            step()
            measure.sync(dev)
            first_s = time.perf_counter() - t0
            waited = run_model._wait_tuned(time.monotonic() + 3600, args.tune_wait_s)
            for _ in range(3):
                step()
            err, parts = run_model.errors(ph.result(step()), want, args.phase)
            steps[v] = step
            left = fuseml_state.verified_left()
            rows[v] = {"first_step_s": first_s, "tune_wait_s": waited, "untuned_left": left, "rel_err": err}
            rows[v]["err_parts"] = parts
            print(
                f"{name}={v}: first step {first_s:.1f} s, waited {waited:.0f} s for tuned kernels "
                f"({left} not yet tuned), error {err:.4f}",
                flush=True,
            )
        wall = measure.wall_ms(steps, dev, args.reps)
        for v, step in steps.items():
            prof = measure.profile(step, dev)
            rows[v].update(
                wall_ms=wall[v]["ms"],
                wall_iqr_ms=wall[v]["iqr_ms"],
                gpu_ms=prof["gpu_ms"],
                kernels=prof["kernels"],
                breakdown_ms=prof["breakdown_ms"],
                top_kernels=prof["top_kernels"][:12],
                aten_ops=prof["aten_ops"][:12],
                strategies=strategies(compilers[v]),
            )
    finally:
        if daemon is not None:
            daemon.stop()
    device = torch.cuda.get_device_name(dev)
    lines = [f"{args.model}/{args.size} {args.phase} on {device}; eager bf16 error against fp32 {eager_err:.4f}"]
    for v, r in rows.items():
        lines.append(
            f"{name}={v}: wall {r['wall_ms']:.3f} ms (IQR {r['wall_iqr_ms']:.3f}), GPU {r['gpu_ms']:.3f} ms, "
            f"{r['kernels']:.0f} kernels, first step {r['first_step_s']:.1f} s, error {r['rel_err']:.4f}"
        )
        lines.append("   by class: " + ", ".join(f"{c} {ms:.2f}" for c, ms in r["breakdown_ms"].items()))
        for k in r["top_kernels"][:8]:
            lines.append(f"     {k['ms']:.3f} ms {k['calls']:.0f}x {k['class']}: {k['kernel'][:90]}")
        lines.append("   groups by strategy: " + "; ".join(f"{n} {s}" for s, n in r["strategies"].items()))
    print("\n".join(lines), flush=True)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, f"ab-{args.model}-{args.phase}-{name}.json"), "w") as f:
            json.dump({"device": device, "eager_err": eager_err, "rows": rows}, f, indent=1)


def strategies(compiler):
    """How many groups of the compiled graphs run under each strategy (fuseml.explain's
    labels, without their details after the colon): which groups measured routing gave
    back to ATen, which still wait for a kernel."""
    from collections import Counter

    from fuseml import plan_view

    counts = Counter(g["strategy"].split(":")[0] for g in plan_view.groups(compiler))
    return dict(counts.most_common())


if __name__ == "__main__":
    main()
