"""Where a fuseml step's GPU time goes, group by group: one model and phase compiled with
fuseml, its graphs run as FX graphs (FUSEML_STRAIGHT_LINE=0: each fused group is one call
there, which this wraps in a profiler range named after the group), one step profiled once the
daemon's background tunes have arrived. Prints the groups heaviest first (GPU time of the
kernels each launched, the bytes its inputs and outputs span and the rate that makes, its
graph, kind, ops and strategy), then the time of kernels outside every group (cuBLAS
products, ATen ops). A memory-bound group far under the device's copy rate (~4 TB/s on an
H200) is where a kernel, not the fusion, loses time.

    python3 group_profile.py --model gemma2 --size small --phase train [--top 40]

The bench's kernel table names a kernel by its entry symbol, the same for every group of a
template (fm_rows_v<codegen version>); this names the group. The figures that count are bench.py's: the FX
path's host time differs from the generated code's, its kernels do not."""

import argparse
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import fuseml_state  # noqa: E402
import model_zoo as models  # noqa: E402
import run_model  # noqa: E402

RANGE = "fuseml group|"  # the prefix of a group's profiler range


def tensor_bytes(values):
    """Distinct bytes a call's tensors span: each tensor once (by address and shape), counted as
    the smaller of its elements and its storage (a slice of a larger buffer reads its elements;
    an expanded view reads its storage once)."""
    seen, total = set(), 0
    for t in values:
        if not isinstance(t, torch.Tensor) or t.numel() == 0:
            continue
        key = (t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.dtype)
        if key in seen:
            continue
        seen.add(key)
        total += min(t.numel() * t.element_size(), t.untyped_storage().nbytes())
    return total


def ranged_groups(moved=None):
    """Wraps every fused group's call in a profiler range RANGE + its name (runtime.GroupRunner
    .run is the one place a group runs on the FX path); with a dict `moved`, each call records
    there, under the group's name, the bytes its inputs and outputs span (tensor_bytes), the
    traffic a memory-bound kernel cannot go below. Returns the function that undoes it."""
    from fuseml import runtime

    run = runtime.GroupRunner.run

    def in_range(self, xs):
        with torch.profiler.record_function(RANGE + self.name):
            out = run(self, xs)
        if moved is not None:
            outs = out if isinstance(out, (list, tuple)) else [out]
            moved[self.name] = tensor_bytes(list(xs) + list(outs))
        return out

    runtime.GroupRunner.run = in_range
    return lambda: setattr(runtime.GroupRunner, "run", run)


def group_times(events, on_gpu):
    """[(ms, name)] of the profiled step's group ranges, heaviest first, and the ms of all
    kernels (GPU) or all top-level ops (CPU, where groups run as ATen ops): GPU time of the
    kernels a range launched on CUDA, the range's own CPU time otherwise."""
    rows = []
    for e in events.key_averages():
        if e.key.startswith(RANGE):
            ms = (e.device_time_total if on_gpu else e.cpu_time_total) / 1e3
            rows.append((ms, e.key[len(RANGE) :]))
    if on_gpu:
        total = sum(
            e.self_device_time_total for e in events.events() if e.device_type == torch.autograd.DeviceType.CUDA
        )
    else:
        total = sum(e.cpu_time_total for e in events.events() if e.cpu_parent is None)
    return sorted(rows, reverse=True), total / 1e3


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--size", default="small")
    ap.add_argument("--phase", choices=run_model.PHASES, default="train")
    ap.add_argument("--top", type=int, default=40)
    args = ap.parse_args(argv)
    os.environ["FUSEML_STRAIGHT_LINE"] = "0"  # each group one call of the FX graph (above)
    import fuseml
    from fuseml import backend, plan_view

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    work = models.build(args.model, args.size, dev)
    phase = run_model.Phase(work, args.phase)
    moved = {}
    undo = ranged_groups(moved)
    try:
        compiler = fuseml.FuseMLCompiler()
        fn = torch.compile(work.model, backend=compiler)
        for _ in range(3):
            phase.step(fn)
        run_model._wait_tuned(deadline=float("inf"))
        backend.pick_up_tuned()
        for _ in range(3):
            phase.step(fn)
        activities = [torch.profiler.ProfilerActivity.CPU]
        if dev == "cuda":
            torch.cuda.synchronize()
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        with torch.profiler.profile(activities=activities) as prof:
            phase.step(fn)
            if dev == "cuda":
                torch.cuda.synchronize()
    finally:
        undo()
    rows, total = group_times(prof, dev == "cuda")
    by_name = {}
    for r in plan_view.groups(compiler):
        by_name.setdefault(f"group {r['gid']} ({' -> '.join(r['ops'])})", []).append(r)
    unit = "GPU" if dev == "cuda" else "CPU"
    grouped = sum(ms for ms, _ in rows)
    print(f"{args.model}/{args.size} {args.phase} on {dev}: {unit} {total:.3f} ms a step, {grouped:.3f} ms in groups")
    print(f"kernels outside every group (products on cuBLAS, ATen ops): {total - grouped:.3f} ms")
    print("    time   MB moved   GB/s  [graph] group  strategy")
    for ms, name in rows[: args.top]:
        plans = by_name.get(name, [])
        where = ", ".join(sorted({p["graph"] for p in plans})) or "?"
        strategy = plans[0]["strategy"] if plans else ""
        mb = moved.get(name, 0) / 1e6
        rate = f"{mb / ms:6.0f}" if ms > 0 and mb else "     -"
        print(f"{ms:8.4f} ms {mb:8.1f} {rate}  [{where}] {name[:150]}  {strategy[:60]}")
    print(f"untuned kernels when profiled: {fuseml_state.verified_left()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
