"""The fuseml benchmark table: every workload x preset in bf16, columns eager,
Inductor (torch.compile default), Inductor max-autotune-no-cudagraphs and fuseml (with CUDA
graphs, mode="reduce-overhead", unless --fuseml-graphs off), in one process, timed
interleaved; beside them, reported but not counted among the peers (eager and the two
Inductor columns above), Inductor with CUDA graphs (mode="reduce-overhead") and fuseml
without graphs, so what the graphs alone are worth is in the same run. Writes
OUT/<device>-<date>.json (rows merged into what the file already holds) and the .md table
beside it. See README.md in this folder.

    python3 bench/table/table.py [--workloads mlp,heavy] [--presets small,medium] [--part 1/3]
                                 [--out bench/results] [--reps 30] [--budget-s 480]
    python3 bench/table/table.py --smoke --out /tmp/t      # CPU, tiny shapes, a few reps
    python3 bench/table/table.py --merge A.json B.json --out DIR   # merge runs, rewrite .md"""

import argparse
import collections
import copy
import datetime
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
os.environ.setdefault("FUSEML_NO_AUTOSTART", "1")  # only the private daemons started here

import torch  # noqa: E402

import daemon as D  # noqa: E402
import measure  # noqa: E402
import report  # noqa: E402
import workloads as W  # noqa: E402

try:
    import fuseml
    from fuseml import plan_view as fm_explain
except ImportError as e:  # the table still runs its peers; the fuseml column says why not
    fuseml, fm_explain, _FUSEML_ERR = None, None, repr(e)

PEERS = ["eager", "inductor", "inductor_max_autotune"]
# Measured beside the peers and fuseml: the fair partner of fuseml's CUDA graphs, and fuseml
# without them.
EXTRA = ["inductor_cudagraphs", "fuseml_nographs"]
COLUMNS = PEERS + EXTRA + ["fuseml"]
GRAPH_COLUMNS = {"inductor_cudagraphs", "fuseml"}  # their first calls are warm-up only


def _recording_compiler():
    """A FuseMLCompiler that also keeps each ATen graph it compiled (before the rewrite), for
    the HBM model; plans and graphs are appended in the same order."""

    class Recording(fuseml.FuseMLCompiler):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            self.graphs = []

        def compile_graph(self, gm, example_inputs, which, inductor=None):
            self.graphs.append(gm)
            return super().compile_graph(gm, example_inputs, which, inductor)

    return Recording


def device_slug(dev):
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    return name, "-".join(name.lower().replace("_", " ").split())


def select_rows(args):
    presets = args.presets.split(",") if args.presets else (["tiny"] if args.smoke else W.TABLE_PRESETS)
    wls = args.workloads.split(",") if args.workloads else W.WORKLOADS
    for p in presets:
        if p not in W.PRESETS:
            sys.exit(f"unknown preset {p}; known: {', '.join(W.PRESETS)}")
    for w in wls:
        if w not in W.WORKLOADS:
            sys.exit(f"unknown workload {w}; known: {', '.join(W.WORKLOADS)}")
    # Preset-major: the rows of one preset share GEMM shapes, so Inductor's autotuning
    # results (kept in-process) serve the later rows of the preset.
    rows = [(w, p) for p in presets for w in wls]
    if args.part:
        i, n = (int(v) for v in args.part.split("/"))
        if not 1 <= i <= n:
            sys.exit("--part i/n with 1 <= i <= n")
        per = math.ceil(len(rows) / n)
        rows = rows[(i - 1) * per : i * per]
    return rows


def compile_times(rows, sockets, dev, workdir, budget_left):
    """{(workload, preset): (cold_s, warm_s, error)} from two child processes: the first on
    the empty caches of the rows' daemons, the second on the caches the first filled."""
    spec = {
        "device": str(dev),
        "rows": [
            {
                "workload": w,
                "preset": p,
                "M": W.PRESETS[p][0],
                "d_model": W.PRESETS[p][1],
                "d_intermediate": W.PRESETS[p][2],
                "socket": sockets[(w, p)],
            }
            for w, p in rows
        ],
    }
    path = os.path.join(workdir, "spec.json")
    with open(path, "w") as f:
        json.dump(spec, f)
    res = {}
    for phase, share in (("cold", 0.35), ("warm", 0.3)):
        timeout = max(60.0, budget_left() * share)  # the rows' timing needs the rest
        out = os.path.join(workdir, f"{phase}.json")
        log = os.path.join(workdir, f"{phase}.log")
        try:
            with open(log, "wb") as lf:
                subprocess.run(
                    [sys.executable, os.path.join(HERE, "compile_time.py"), path, out],
                    timeout=timeout,
                    check=True,
                    stdout=lf,
                    stderr=subprocess.STDOUT,
                    env=dict(os.environ, FUSEML_NO_AUTOSTART="1"),
                )
            got = json.load(open(out))
        except (subprocess.SubprocessError, OSError, ValueError) as e:
            tail = open(log, errors="replace").read()[-300:] if os.path.exists(log) else ""
            got = [
                {"workload": w, "preset": p, "s": None, "error": f"{phase} run: {e!r}: {tail}"[-500:]} for w, p in rows
            ]
        for g in got:
            k = (g["workload"], g["preset"])
            cur = res.setdefault(k, {"cold": None, "warm": None, "error": None})
            cur[phase] = g.get("s")
            if g.get("error"):
                cur["error"] = g["error"]
    return res


def _replay_stats():
    try:
        from fuseml import graph_replay
    except ImportError:
        return None
    return graph_replay.stats()


def _strategy(groups):
    """One cell: the groups' strategies, counted ('2x bypass gemm: no kernel template yet')."""
    c = collections.Counter(g["strategy"] for g in groups)
    return "; ".join(f"{n}x {s}" if n > 1 else s for s, n in c.items())


def measure_row(w, p, dev, args, ceil, socket, budget_left):
    M, d, di = W.PRESETS[p]
    dtype = torch.bfloat16
    torch._dynamo.reset()
    row = {"workload": w, "preset": p, "M": M, "d_model": d, "d_intermediate": di, "dtype": "bf16"}
    notes = {}
    model = W.make_model(w, d, di, dev, dtype)
    x_bytes = M * d * 2
    nbuf = 2 if args.smoke else max(1, min(8, math.ceil((64 << 20) / x_bytes)))
    xs, gy = W.make_inputs(w, M, d, dev, dtype, nbuf)

    # The fp32 eager reference on the first input buffer.
    ref_model = copy.deepcopy(model).float()
    x_ref = xs[0].detach().float().requires_grad_(W.is_train(w))
    ref = W.make_step(w, ref_model, ref_model, gy.float() if gy is not None else None)(x_ref)
    ref = [t.detach().clone() if t is not None else None for t in ref]
    del ref_model, x_ref

    steps, compile_s = {}, {}
    fm_compiler = None
    cols = list(COLUMNS)
    graphs = args.fuseml_graphs == "on"
    for col in cols:
        fn = None
        if col == "eager":
            fn = model
        elif col == "inductor":
            fn = torch.compile(model)
        elif col == "inductor_max_autotune":
            if args.max_autotune == "off":
                notes[col] = "skipped (--max-autotune off)"
            elif budget_left() < args.max_autotune_reserve_s:
                notes[col] = (
                    f"skipped: under {args.max_autotune_reserve_s:.0f} s of the part's "
                    "time budget left (max-autotune compiles are slow); run this row "
                    "in a part of its own"
                )
            else:
                fn = torch.compile(model, mode="max-autotune-no-cudagraphs")
        elif col == "inductor_cudagraphs":
            if args.inductor_cudagraphs == "off" or dev.type != "cuda":
                notes[col] = "skipped (--inductor-cudagraphs off, or no CUDA device)"
            else:
                fn = torch.compile(model, mode="reduce-overhead")
        elif col == "fuseml_nographs":
            if fuseml is not None and graphs:
                fn = torch.compile(model, backend=fuseml.FuseMLCompiler(socket=socket))
        elif col == "fuseml":
            if fuseml is None:
                notes[col] = f"fuseml not importable: {_FUSEML_ERR}"
            else:
                fm_compiler = _recording_compiler()(socket=socket)
                fn = (
                    torch.compile(model, backend=fm_compiler, mode="reduce-overhead")
                    if graphs
                    else torch.compile(model, backend=fm_compiler)
                )
        if fn is None:
            continue
        step = W.make_step(w, fn, model, gy)
        try:
            t0 = time.perf_counter()
            got = step(xs[0])
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            compile_s[col] = time.perf_counter() - t0
            # The error of what the timed steps run: with CUDA graphs the first calls are
            # warm-up and recording, so the third call (a replay) is the one compared.
            for _ in range(2 if col in GRAPH_COLUMNS else 0):
                got = step(xs[0])
            row[f"{col}_rel_err"] = measure.rel_err(got, ref)
            del got
            steps[col] = step
        except Exception as e:  # a column that cannot run is a null cell with its reason
            notes[col] = f"failed: {e!r}"[:300]
            row[f"{col}_rel_err"] = None
    del ref

    replay0 = _replay_stats()
    timed = measure.time_columns(steps, xs, dev, args.reps)
    if replay0 is not None:  # what fuseml's CUDA-graph replay did while the columns were timed
        after = _replay_stats()
        row["fuseml_replay"] = {k: after.get(k, 0) - replay0.get(k, 0) for k in after}
    for col in cols:
        t = timed.get(col)
        row[f"{col}_ms"] = t["ms"] if t else None
        row[f"{col}_iqr_ms"] = t["iqr_ms"] if t else None
        row[f"kernels_{col}"] = None  # counted after every row is timed: count_kernels()
        row[f"{col}_first_call_s"] = compile_s.get(col)

    peers = {c: row[f"{c}_ms"] for c in PEERS if row.get(f"{c}_ms") is not None}
    best = min(peers, key=peers.get) if peers else None
    fm = row.get("fuseml_ms")
    row["best_peer"] = best
    row["speedup_vs_eager"] = row["eager_ms"] / fm if fm and row.get("eager_ms") else None
    row["speedup_vs_best_peer"] = peers[best] / fm if fm and best else None
    ro = row.get("inductor_cudagraphs_ms")
    row["speedup_vs_inductor_cudagraphs"] = ro / fm if fm and ro else None
    row["fuseml_cudagraphs"] = graphs and fuseml is not None

    flops = W.step_flops(w, M, d, di)
    nbytes = W.step_min_bytes(w, model, M, d)
    row["floor_bytes"] = nbytes
    row["flops"] = flops
    fb = nbytes / ceil["copy_bytes_per_s"] * 1e3
    ff = flops / ceil["bf16_gemm_flops_per_s"] * 1e3
    row["floor_ms"] = max(fb, ff)
    row["floor_bound"] = "memory" if fb >= ff else "compute"

    row["hbm_bytes_eager"] = row["hbm_bytes_fused"] = row["hbm_saved"] = None
    row["groups"], row["strategy"] = [], None
    if fm_compiler is not None and "fuseml" in steps:
        groups = fm_explain.groups(fm_compiler)
        row["groups"] = groups
        row["strategy"] = _strategy(groups)
        # plan_view.groups lists the plans' groups in order: a group counts as fused when its
        # strategy is a launched kernel (served tuned, not dropped by the runtime).
        labels = iter(groups)
        served = [
            [g for g in plan.groups if next(labels)["strategy"].startswith("kernel ")] for plan in fm_compiler.plans
        ]
        if len(fm_compiler.graphs) == len(fm_compiler.plans):
            e, f = measure.hbm_bytes(fm_compiler.graphs, served)
            row["hbm_bytes_eager"], row["hbm_bytes_fused"] = e, f
            row["hbm_saved"] = 1 - f / e if e else None
        else:
            notes["hbm"] = "graphs and plans of the fuseml compiler do not line up"
        if not any(served):
            row["why_slower"] = "no group ran as a fused kernel (see strategy)"
    row["notes"] = notes
    return row


def count_kernels(row, dev, socket):
    """Kernel launches per step of each column that was timed, in a pass after all rows are
    timed: a torch.profiler session can leave CUPTI hooks behind that slow every later
    launch in the process, so no profile may precede a timing. The columns are compiled
    again (Inductor from its caches, fuseml from the daemon's)."""
    w = row["workload"]
    torch._dynamo.reset()
    model = W.make_model(w, row["d_model"], row["d_intermediate"], dev, torch.bfloat16)
    xs, gy = W.make_inputs(w, row["M"], row["d_model"], dev, torch.bfloat16, 1)
    graphs = row.get("fuseml_cudagraphs")
    fns = {
        "eager": lambda: model,
        "inductor": lambda: torch.compile(model),
        "inductor_max_autotune": lambda: torch.compile(model, mode="max-autotune-no-cudagraphs"),
        "inductor_cudagraphs": lambda: torch.compile(model, mode="reduce-overhead"),
        "fuseml_nographs": lambda: torch.compile(model, backend=fuseml.FuseMLCompiler(socket=socket)),
        "fuseml": lambda: torch.compile(
            model, backend=fuseml.FuseMLCompiler(socket=socket), mode="reduce-overhead" if graphs else None
        ),
    }
    for col, make in fns.items():
        if row.get(f"{col}_ms") is None:
            continue
        try:
            row[f"kernels_{col}"] = measure.count_kernels(W.make_step(w, make(), model, gy), xs[0], dev)
        except Exception as e:  # the timing stands; the count is a null cell with its reason
            row["notes"][f"kernels_{col}"] = f"failed: {e!r}"[:300]


def _quiet_inductor():
    """Max-autotune prints every choice it benchmarked; the table log wants the rows."""
    cfg = torch._inductor.config
    for name, value in (("autotune_num_choices_displayed", 0), ("max_autotune_report_choices_stats", False)):
        if hasattr(cfg, name):
            setattr(cfg, name, value)
    warnings.filterwarnings("ignore", message=".*TypedStorage is deprecated.*")
    warnings.filterwarnings("ignore", message=".*Profiler clears events.*")


def measure_first_again(first, dev, args, ceil, socket, budget_left):
    """The first row timed again after the others, its compiles cached: the device hosts drift
    by tens of percent over a run, and the first row, timed right after the process's first
    compiles, was often caught slow (an H100, 2026-11-26: heavy at memory_bound first, fuseml
    0.070 ms, Inductor 0.177, max-autotune 0.128; second, 0.0445, 0.110 and 0.097; later
    three identical rows in one process, and the third was the slow one: bench/NOTES.md, "The
    first row", "Inference graphs called directly"). The second timing is kept; the first-call
    and compile times stay the first measurement's (this one's compiles were cached), and the
    first timing is a note."""
    t0 = time.monotonic()
    again = measure_row(first["workload"], first["preset"], dev, args, ceil, socket, budget_left)
    for k, v in first.items():
        if k not in again or k.endswith("_first_call_s"):
            again[k] = v
    again["notes"] = dict(first["notes"], **again["notes"])
    again["notes"]["first_row"] = (
        "timed again after the other rows (the first position ran slow); "
        "first timing: " + ", ".join(f"{c} {first.get(f'{c}_ms') or 0:.4f} ms" for c in COLUMNS)
    )
    again["row_s"] = first["row_s"] + time.monotonic() - t0
    print(
        f"{first['workload']}/{first['preset']} again: eager {again['eager_ms']} "
        f"fuseml {again['fuseml_ms']} ms; x{again['speedup_vs_best_peer'] or 0:.2f} vs best peer "
        f"(first: x{first['speedup_vs_best_peer'] or 0:.2f})",
        flush=True,
    )
    return again


def run(args):
    want_cuda = not args.smoke
    if want_cuda and not torch.cuda.is_available():
        sys.exit("no CUDA device: use --smoke for the CPU check")
    dev = torch.device("cuda" if want_cuda else "cpu")
    torch._dynamo.config.cache_size_limit = 64
    try:
        torch._dynamo.config.accumulated_cache_size_limit = 1024
    except AttributeError:
        pass
    if dev.type == "cuda":
        # Inductor compiles (max-autotune most of all) in as many threads as the host has.
        torch._inductor.config.compile_threads = os.cpu_count() or 1
    _quiet_inductor()
    rows = select_rows(args)
    name, slug = device_slug(dev)
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    os.makedirs(args.out, exist_ok=True)
    json_path = os.path.join(args.out, f"{slug}-{date}.json")
    start = time.monotonic()

    def budget_left():
        return args.budget_s - (time.monotonic() - start)

    ceil = measure.ceilings(dev, smoke=args.smoke)
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    print(
        f"{name}: copy {ceil['copy_bytes_per_s'] / 1e12:.2f} TB/s, bf16 mm "
        f"{ceil['bf16_gemm_flops_per_s'] / 1e12:.0f} TFLOP/s; rows: "
        f"{', '.join(f'{w}/{p}' for w, p in rows)}",
        flush=True,
    )

    exe = D.find_fusemld(args.fusemld)
    workdir = tempfile.mkdtemp(prefix="fm-table-")
    daemons, sockets, daemon_note = {}, {}, None
    for w, p in rows:
        if exe:
            try:
                daemons[(w, p)] = D.Daemon(exe, f"{w}-{p}")
                sockets[(w, p)] = daemons[(w, p)].socket
                continue
            except RuntimeError as e:
                daemon_note = str(e)
        else:
            daemon_note = "no fusemld binary found (FUSEMLD_BIN): fuseml ran eager"
        sockets[(w, p)] = os.path.join(workdir, "no-daemon.sock")
    try:
        ct = {}
        if not args.no_compile_time:
            ct = compile_times(rows, sockets, dev, workdir, budget_left)
        print(f"compile times measured ({time.monotonic() - start:.0f} s)", flush=True)
        longest = 0.0
        done = []
        for i, (w, p) in enumerate(rows):
            # Leave time for this row (as long as the longest so far) and for counting the
            # kernels of every row afterwards (a few seconds each: cached compiles).
            if i and budget_left() < longest * 1.2 + args.count_s * (len(done) + 1):
                left = rows[i:]
                print(
                    "NOT RUN (time budget): "
                    + ", ".join(f"{a}/{b}" for a, b in left)
                    + "; run them with --workloads/--presets",
                    flush=True,
                )
                break
            t0 = time.monotonic()
            row = measure_row(w, p, dev, args, ceil, sockets[(w, p)], budget_left)
            c = ct.get((w, p), {})
            row["compile_cold_s"], row["compile_warm_s"] = c.get("cold"), c.get("warm")
            if c.get("error"):
                row["notes"]["compile_time"] = c["error"]
            if args.no_compile_time:
                row["notes"]["compile_time"] = report.NOT_MEASURED
            if daemon_note:
                row["notes"]["fusemld"] = daemon_note
            row.update(
                {
                    "device": slug,
                    "device_name": name,
                    "date": date,
                    "torch": torch.__version__,
                    "ceilings": ceil,
                    "reps": args.reps,
                    "smoke": bool(args.smoke),
                    "row_s": time.monotonic() - t0,
                }
            )
            report.save(report.merge([report.load(json_path), [row]]), json_path)
            done.append(row)
            longest = max(longest, time.monotonic() - t0)
            print(
                f"{w}/{p}: eager {row['eager_ms']} inductor {row['inductor_ms']} "
                f"MA {row['inductor_max_autotune_ms']} inductor-RO {row['inductor_cudagraphs_ms']} "
                f"fuseml {row['fuseml_ms']} (no graphs {row['fuseml_nographs_ms']}) ms; "
                f"replay {row.get('fuseml_replay')}; "
                f"x{row['speedup_vs_best_peer'] or 0:.2f} vs best peer; "
                f"{row['row_s']:.0f} s",
                flush=True,
            )
        if dev.type == "cuda" and done and budget_left() >= longest * 1.2 + args.count_s * len(done):
            done[0] = measure_first_again(done[0], dev, args, ceil, sockets[rows[0]], budget_left)
            report.save(report.merge([report.load(json_path), done[:1]]), json_path)
        for row in done:
            if dev.type != "cuda":
                row["notes"]["kernels"] = "no CUDA device: kernel launches not counted"
            elif budget_left() < args.count_s:
                row["notes"]["kernels"] = "not counted: time budget"
            else:
                count_kernels(row, dev, sockets[(row["workload"], row["preset"])])
                print(
                    f"{row['workload']}/{row['preset']}: kernels "
                    + ", ".join(f"{c} {row[f'kernels_{c}']}" for c in COLUMNS),
                    flush=True,
                )
        if done:
            report.save(report.merge([report.load(json_path), done]), json_path)
    finally:
        for (w, p), dmn in daemons.items():
            dmn.stop(keep_log_to=os.path.join(args.out, f"fusemld-{w}-{p}.log") if args.keep_logs else None)
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"wrote {json_path} and .md ({time.monotonic() - start:.0f} s)")
    return json_path


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny shapes, few reps (the pytest check)")
    ap.add_argument("--workloads", help=f"comma list of {','.join(W.WORKLOADS)} (default all)")
    ap.add_argument("--presets", help=f"comma list of {','.join(W.PRESETS)} (default the table's six)")
    ap.add_argument("--part", help="i/n: the i-th of n contiguous slices of the selected rows")
    ap.add_argument("--out", default=os.path.join(D.ROOT, "bench", "results"))
    ap.add_argument("--reps", type=int, default=None, help="timed repetitions per column (default 30; smoke 3)")
    ap.add_argument(
        "--budget-s",
        type=float,
        default=480.0,
        help="stop starting rows (and max-autotune compiles) past this many seconds",
    )
    ap.add_argument("--max-autotune", choices=["on", "off"], default="on")
    ap.add_argument(
        "--fuseml-graphs",
        choices=["on", "off"],
        default="on",
        help="fuseml with CUDA graphs (mode=reduce-overhead); 'on' also times it without",
    )
    ap.add_argument(
        "--inductor-cudagraphs",
        choices=["on", "off"],
        default="on",
        help="also time Inductor with CUDA graphs (mode=reduce-overhead), beside the peers",
    )
    ap.add_argument(
        "--max-autotune-reserve-s",
        type=float,
        default=150.0,
        help="skip a max-autotune compile when less than this is left of the budget",
    )
    ap.add_argument(
        "--count-s", type=float, default=8.0, help="time reserved per row for counting its kernels after the timing"
    )
    ap.add_argument("--no-compile-time", action="store_true", help="skip the cold/warm compile runs")
    ap.add_argument("--fusemld", help="the fusemld binary (default $FUSEMLD_BIN or a build tree)")
    ap.add_argument("--keep-logs", action="store_true", help="copy each row's fusemld log to --out")
    ap.add_argument("--merge", nargs="+", metavar="JSON", help="merge these runs into --out/<device>-<date>.json")
    args = ap.parse_args(argv)
    if args.merge:
        rows = report.merge([report.load(p) for p in args.merge])
        if not rows:
            sys.exit("nothing to merge")
        r = max(rows, key=lambda r: r.get("date") or "")
        path = os.path.join(args.out, f"{r['device']}-{r['date']}.json")
        os.makedirs(args.out, exist_ok=True)
        report.save(report.merge([report.load(path), rows]), path)
        print(f"wrote {path} and .md ({len(rows)} rows merged)")
        return path
    if args.reps is None:
        args.reps = 3 if args.smoke else 30
    return run(args)


if __name__ == "__main__":
    main()
