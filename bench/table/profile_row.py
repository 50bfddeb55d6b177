"""Where a row's step time goes, host against GPU (to find host overhead to cut): for each
column, the host time of issuing one step (perf_counter over steps issued back to back, one
sync at the end: the GPU queue never fills at these sizes), the GPU time of one step (CUDA
events around a step whose launches were queued behind a spin kernel, so host issue time is
hidden), the step time the table would report (max of the two, roughly; and the same on one
input buffer, where every step replays one recording), the kernels of the fuseml step with
their GPU times (torch.profiler, after every timing), and the top of a cProfile of the
fuseml step.

    python3 bench/table/profile_row.py --workloads mlp,heavy --presets small,memory_bound OUT.json
(run by bench/table/run-profile on the device: a private fusemld per row, like table.py)"""

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
os.environ.setdefault("FUSEML_NO_AUTOSTART", "1")
import daemon as D  # noqa: E402
import measure  # noqa: E402
import workloads as W  # noqa: E402
import fuseml  # noqa: E402


def host_ms(step, x, n=50):
    """Host milliseconds to issue one step: n steps back to back, one sync after the clock."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        step(x)
    t = (time.perf_counter() - t0) * 1e3 / n
    torch.cuda.synchronize()
    return t


def gpu_ms(step, x, n=20):
    """GPU milliseconds of one step: its launches queue behind a ~5 ms spin (torch.cuda._sleep),
    so the events time the kernels back to back, not the host issuing them."""
    out = []
    for _ in range(n):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        torch.cuda._sleep(5_000_000)
        a.record()
        step(x)
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b))
    return statistics.median(out)


def table_ms(step, xs, n=50):
    """The table's measure (measure.Clock): n steps issued back to back over the input buffers."""
    torch.cuda.synchronize()
    return measure.Clock(torch.device("cuda")).time_ms(lambda i: step(xs[i % len(xs)]), n)


def kernels(step, x, steps=5):
    from torch.profiler import ProfilerActivity, profile

    step(x)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step(x)
        torch.cuda.synchronize()
    per = {}
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        k = per.setdefault(e.name[:90], [0, 0.0])
        k[0] += 1
        k[1] += e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
    return sorted(([n, c / steps, us / steps] for n, (c, us) in per.items()), key=lambda r: -r[2])


def host_profile(step, x, n=200):
    pr = cProfile.Profile()
    step(x)
    torch.cuda.synchronize()
    pr.enable()
    for _ in range(n):
        step(x)
    pr.disable()
    torch.cuda.synchronize()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(22)
    return s.getvalue()


def _dynamo_only(gm, example_inputs):
    out_node = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    outs = [
        torch.empty(v.shape, dtype=v.dtype, device=v.device) if isinstance(v, torch.Tensor) else v
        for v in (n.meta.get("example_value") for n in out_node.all_input_nodes)
    ]
    return lambda *args: outs


def profile_row(w, p, exe):
    M, d, di = W.PRESETS[p]
    dev = torch.device("cuda")
    torch._dynamo.reset()
    model = W.make_model(w, d, di, dev, torch.bfloat16)
    xs, gy = W.make_inputs(w, M, d, dev, torch.bfloat16, 4)
    dmn = D.Daemon(exe, f"{w}-{p}")
    direct = fuseml.FuseMLCompiler(socket=dmn.socket)
    wrapped = fuseml.FuseMLCompiler(socket=dmn.socket, direct=False)
    try:
        cols = {
            "eager": model,
            "inductor_cudagraphs": torch.compile(model, mode="reduce-overhead"),
            "fuseml_nographs": torch.compile(model, backend=fuseml.FuseMLCompiler(socket=dmn.socket)),
            "fuseml": torch.compile(model, backend=direct, mode="reduce-overhead"),
            # the same with aot_autograd's runtime wrappers kept (direct_call.py)
            "fuseml_wrapped": torch.compile(model, backend=wrapped, mode="reduce-overhead"),
        }
        if not W.is_train(w):
            # dynamo's own path: a backend whose graph returns a tensor made at compile time,
            # no GPU work (the host floor of any torch.compile backend; no backward to run)
            cols["dynamo_only"] = torch.compile(model, backend=_dynamo_only)
        steps = {c: W.make_step(w, fn, model, gy) for c, fn in cols.items()}
        for s in steps.values():  # compile, tune, warm up, record (fuseml's replay: each
            for i in range(2 * len(xs)):  # input buffer is recorded at its second call)
                s(xs[i % len(xs)])
        torch.cuda.synchronize()
        row = {"workload": w, "preset": p, "columns": {}}
        host, table, same = {c: [] for c in steps}, {c: [] for c in steps}, {c: [] for c in steps}
        for _ in range(7):  # the columns interleaved, so a drifting host shifts them all
            for c, s in steps.items():
                host[c].append(host_ms(s, xs[0]))
                table[c].append(table_ms(s, xs))
                same[c].append(table_ms(s, xs[:1]))  # the table's measure on one input buffer
        for c, s in steps.items():
            row["columns"][c] = {
                "host_ms": statistics.median(host[c]),
                "gpu_ms": gpu_ms(s, xs[0]),
                "table_ms": statistics.median(table[c]),
                "table_one_input_ms": statistics.median(same[c]),
            }
        row["fuseml_graphs"] = {
            c: [p.describe().splitlines()[0] for p in comp.plans]
            for c, comp in (("fuseml", direct), ("fuseml_wrapped", wrapped))
        }
        row["fuseml_host_profile"] = host_profile(steps["fuseml"], xs[0])
        row["fuseml_nographs_host_profile"] = host_profile(steps["fuseml_nographs"], xs[0])
        for c in ("eager", "fuseml_nographs", "fuseml"):  # profiler last: it slows launches
            row["columns"][c]["kernels"] = kernels(steps[c], xs[0])
        return row
    finally:
        dmn.stop()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--workloads", default="mlp")
    ap.add_argument("--presets", default="small,memory_bound")
    args = ap.parse_args()
    exe = D.find_fusemld()
    torch._dynamo.config.cache_size_limit = 64
    rows = []
    for p in args.presets.split(","):
        for w in args.workloads.split(","):
            try:
                rows.append(profile_row(w, p, exe))
            except Exception as e:  # one row must not hide the others
                rows.append({"workload": w, "preset": p, "error": repr(e)[:500]})
            r = rows[-1]
            print(f"== {w}/{p}", flush=True)
            if "error" in r:
                print("  error:", r["error"])
                continue
            for c, v in r["columns"].items():
                print(
                    f"  {c:20s} host {v['host_ms']:.4f}  gpu {v['gpu_ms']:.4f}  table {v['table_ms']:.4f}"
                    f"  (one input {v['table_one_input_ms']:.4f}) ms"
                )
            for c, heads in r["fuseml_graphs"].items():
                print(f"  {c}: {' | '.join(heads)}")
            for c in ("eager", "fuseml"):
                for name, cnt, us in r["columns"][c]["kernels"][:16]:
                    print(f"    {c:7s} {us:8.1f} us x{cnt:.1f} {name}")
            with open(args.out, "w") as f:
                json.dump(rows, f, indent=1)
    for r in rows[:2]:
        if "fuseml_host_profile" in r:
            print(f"== host profile fuseml (graphs) {r['workload']}/{r['preset']}")
            print("\n".join(r["fuseml_host_profile"].splitlines()[:40]))
            print(f"== host profile fuseml (no graphs) {r['workload']}/{r['preset']}")
            print("\n".join(r["fuseml_nographs_host_profile"].splitlines()[:40]))


if __name__ == "__main__":
    main()
