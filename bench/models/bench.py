"""The whole-model benchmark: every model of the set, one process each (run_model.py), then the
merged JSON, the Markdown report and the charts.

    python3 bench.py run [--models llama:small,gpt2:small | --part 2/4] --out DIR
                         [--budget-s 540] [--modes ...] [--phases ...] [--reps 21] [--smoke]
    python3 bench.py merge PART.json ... --out DIR      (parts from several device calls)

`run` writes DIR/<model>-<size>.json per model, then DIR/<device>-<date>.json (all rows) and
.md. A model whose process fails or runs out of time still gets a row per mode and phase,
with the reason in "error". `merge` combines documents (a later row for the same model,
size, mode and phase replaces an earlier one), writes <device>-<date>.json and .md in DIR,
and draws the charts when matplotlib is there."""

import argparse
import datetime
import glob
import json
import os
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import model_report as report  # noqa: E402

# The set, in the order a full run takes it: (model, size)
DEFAULT = [
    ("llama", "small"),
    ("llama", "large"),
    ("gqa", "small"),
    ("gpt2", "small"),
    ("bert", "small"),
    ("t5", "small"),
    ("vit", "small"),
    ("convnet", "small"),
    ("moe", "small"),
    ("gemma2", "small"),
]
MODE_NAMES = ("eager", "inductor", "inductor_graphs", "fuseml", "fuseml_graphs", "fuseml_inductor")


def parse_models(spec, smoke):
    """'llama:small,gpt2' -> [(llama, small), (gpt2, small or tiny)]; names are checked by
    run_model.py's own table, here only the shape of the spec."""
    if not spec:
        return [(m, "tiny") for m, s in DEFAULT if s == "small"] if smoke else list(DEFAULT)
    out = []
    for item in spec.split(","):
        name, _, size = item.strip().partition(":")
        out.append((name, size or ("tiny" if smoke else "small")))
    return out


def part_of(items, part):
    try:
        i, n = (int(x) for x in part.split("/"))
    except ValueError:
        raise ValueError(f"--part {part}: want i/n") from None
    if not 1 <= i <= n:
        raise ValueError(f"--part {part}: want i/n with 1 <= i <= n")
    per = -(-len(items) // n)
    return items[(i - 1) * per : i * per]


def failed_rows(model, size, modes, phases, why):
    names = modes.split(",") if modes else list(MODE_NAMES)
    return [{"model": model, "size": size, "mode": m, "phase": p, "error": why} for p in phases for m in names]


def cmd_run(args):
    t0 = time.monotonic()
    items = parse_models(args.models, args.smoke)
    if args.part:
        items = part_of(items, args.part)
    phases = args.phases.split(",")
    os.makedirs(args.out, exist_ok=True)
    import torch

    # what a model that never finished is filed under: this machine, today
    head = {"device": report.device_slug(), "date": datetime.date.today().isoformat(), "torch": torch.__version__}
    docs = []
    for model, size in items:
        left = args.budget_s - (time.monotonic() - t0)
        path = os.path.join(args.out, f"{model}-{size}.json")
        if os.path.exists(path):
            os.remove(path)  # a file left by an earlier run is not this run's result
        if left < args.min_model_s:
            why = f"not run: {left:.0f} s of the run's budget left (a model needs {args.min_model_s:.0f} s)"
            print(f"bench: {model}/{size}: {why}", flush=True)
            docs.append({**head, "rows": failed_rows(model, size, args.modes, phases, why)})
            continue
        cmd = [
            sys.executable,
            os.path.join(HERE, "run_model.py"),
            "--model",
            model,
            "--size",
            size,
            "--out",
            args.out,
            "--phases",
            args.phases,
            "--reps",
            str(args.reps),
            "--budget-s",
            str(left - 15),
        ]
        if args.modes:
            cmd += ["--modes", args.modes]
        if args.smoke:
            cmd += ["--target-ms", "2", "--profile-steps", "1"]
        if args.no_warm:
            cmd += ["--no-warm"]
        print(f"bench: {model}/{size} ({left:.0f} s left)", flush=True)
        # each model in a fresh process: its own empty compile caches, and no state from the last
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "FUSEML_ROUTE_CACHE")
        }
        # its own process group: a process stopped at the budget takes its fusemld with it
        proc = subprocess.Popen(cmd, env=env, start_new_session=True)
        try:
            rc = proc.wait(timeout=left)
            why = None if rc == 0 else f"the model's process exited {rc}"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            why = f"the model's process ran past the run's budget ({left:.0f} s left when it started)"
        if not os.path.exists(path):
            why = why or "the model's process wrote no result"
        # a process stopped early still leaves the phases it finished (run_model.py saves after each)
        doc = json.load(open(path)) if os.path.exists(path) else {**head, "rows": []}
        if why:
            have = {(r["mode"], r["phase"]) for r in doc["rows"]}
            doc["rows"] += [
                r for r in failed_rows(model, size, args.modes, phases, why) if (r["mode"], r["phase"]) not in have
            ]
        docs.append(doc)
    merged = report.merge(docs)
    report.write(merged, args.out, charts=not args.smoke)
    print(f"bench: {len(items)} models, {len(merged['rows'])} rows, {time.monotonic() - t0:.0f} s", flush=True)
    return 0


def cmd_merge(args):
    paths = [p for pat in args.parts for p in sorted(glob.glob(pat))]
    if not paths:
        raise SystemExit("bench merge: no input files")
    merged = report.merge([json.load(open(p)) for p in paths])
    report.write(merged, args.out, charts=True)
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="measure models, one process each")
    r.add_argument("--models", default="", help="model[:size],... (default: the whole set)")
    r.add_argument("--part", default="", help="i/n: the i-th of n slices of the selection")
    r.add_argument("--out", required=True)
    r.add_argument("--budget-s", type=float, default=540.0)
    r.add_argument("--min-model-s", type=float, default=90.0, help="start no model with less left")
    r.add_argument("--modes", default="")
    r.add_argument("--phases", default="fwd,train")
    r.add_argument("--reps", type=int, default=21)
    r.add_argument("--no-warm", action="store_true")
    r.add_argument("--smoke", action="store_true", help="tiny sizes, few reps: the CPU check")
    m = sub.add_parser("merge", help="merge documents from several runs; write the report and charts")
    m.add_argument("parts", nargs="+")
    m.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    if args.cmd == "run":
        import model_zoo

        try:
            items = parse_models(args.models, args.smoke)
            if args.part:
                part_of(items, args.part)
        except ValueError as e:
            ap.error(str(e))
        for name, size in items:
            if name not in model_zoo.MODELS:
                ap.error(f"unknown model {name!r}; known: {', '.join(model_zoo.MODELS)}")
            if size not in model_zoo.MODELS[name][1] + ("tiny",):
                ap.error(f"model {name} has no size {size}")
        if args.smoke:
            args.reps = min(args.reps, 3)
            args.min_model_s = min(args.min_model_s, 5)
        return cmd_run(args)
    return cmd_merge(args)


if __name__ == "__main__":
    sys.exit(main())
