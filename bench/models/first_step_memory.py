"""Where the first (compiling) training step's peak memory goes: the step runs with the CUDA
caching allocator's history recorded, the history is replayed to the moment of the peak, and
the blocks alive then are summed by the Python frames that allocated them.

    python3 first_step_memory.py --model llama --size small --modes fuseml,inductor [--top 8]

Prints, per mode: the peaks of the first four steps above what was allocated before each
(under fuseml the next two follow the pickup of its background tunes, as in bench/models:
the FX graph runs once more, then the generated code's checked variant), then the largest
groups of blocks alive at the first step's peak (with --later, at the larger of the next
two's and at the fourth's too, and the largest blocks). A mode's first step compiles (and, under fuseml,
measures each group's kernel against its ATen ops), so its peak can differ from a steady
step's, which is what bench/models reports."""

import argparse
import collections
import os
import sys
import tempfile
import time

os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="fm-first-memory-"))

import torch  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import compile_modes  # noqa: E402
import fuseml_state  # noqa: E402
import model_zoo as models  # noqa: E402
from run_model import _wait_tuned, start_daemon  # noqa: E402   (a private fusemld for the fuseml modes)


def _where(frames, depth=3):
    """The innermost frames of an allocation outside torch's own files: who asked for it."""

    def asked(name):  # our code or the model's, not torch's internals
        return "/fuseml/" in name or (name.endswith(".py") and "/torch/" not in name)

    mine = [f for f in frames if asked(f.get("filename", ""))]
    return " < ".join(f"{os.path.basename(f['filename'])}:{f['line']} {f['name']}" for f in mine[:depth]) or "?"


def peak_blocks(snapshot, device):
    """(peak bytes above the start, {where: bytes} alive at that moment) from the history."""
    live, total, peak, at_peak = {}, 0, 0, {}
    for e in snapshot["device_traces"][device]:
        action = e["action"]
        if action == "alloc":
            live[e["addr"]] = (e["size"], e.get("frames", []))
            total += e["size"]
            if total > peak:
                peak, at_peak = total, dict(live)
        elif action in ("free_requested", "free") and e["addr"] in live:
            total -= live.pop(e["addr"])[0]
    groups = collections.Counter()
    for size, frames in at_peak.values():
        groups[_where(frames)] += size
    return peak, groups, sorted(at_peak.values(), key=lambda b: -b[0])


def _anywhere(frames, depth=2):
    """The innermost frames of an allocation, torch's own included (for blocks no model or
    fuseml frame asked for: the autograd engine's, aot_autograd's)."""
    return " < ".join(f"{os.path.basename(f['filename'])}:{f['line']} {f['name']}" for f in frames[:depth]) or "C++"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="llama")
    ap.add_argument("--size", default="small")
    ap.add_argument("--modes", default="fuseml,inductor")
    ap.add_argument("--top", type=int, default=8)
    ap.add_argument("--later", action="store_true", help="also break down the larger of the next two steps' peaks")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("first_step_memory: no GPU (torch.cuda.is_available() is False): nothing to measure")
    try:
        selected = compile_modes.select(args.modes)
    except ValueError as e:
        raise SystemExit(f"first_step_memory: {e}")
    dev = torch.device("cuda")
    compile_modes.allow_many_graphs()
    work = models.build(args.model, args.size, dev)
    params = [p for p in work.model.parameters() if p.requires_grad]
    daemon = start_daemon(selected, dev)
    for mode in selected:
        fn = mode.make(work.model)

        def step():
            for p in params:
                p.grad = None
            work.loss(fn, work.inputs).backward()
            torch.cuda.synchronize(dev)

        def measured_step(record):
            """(peak above the start, the allocator's history or None) of one step."""
            for p in params:
                p.grad = None
            torch.cuda.synchronize(dev)
            base = torch.cuda.memory_allocated(dev)
            torch.cuda.reset_peak_memory_stats(dev)
            if record:
                torch.cuda.memory._record_memory_history(max_entries=2_000_000)
            step()
            snapshot = torch.cuda.memory._snapshot() if record else None
            if record:
                torch.cuda.memory._record_memory_history(enabled=None)
            return torch.cuda.max_memory_allocated(dev) - base, snapshot

        steps = [measured_step(True)]
        if mode.family == "fuseml":  # as bench/models does: the next calls run the tuned kernels
            _wait_tuned(time.monotonic() + 180)
        for _ in range(3):
            if args.later:
                for plan in fuseml_state.plans():
                    c = getattr(plan, "compiled", None)
                    first = getattr(c, "first", None)
                    if first is not None:  # the generated code's checked variant runs next
                        print(
                            f"   step {len(steps) + 1}: {plan.which}: first call keeps its arguments: {first.keeps_args}"
                        )
            steps.append(measured_step(args.later))
        peaks = ", ".join(f"{p / 1e9:.2f}" for p, _ in steps)
        print(f"== {mode.name}: {work.describe}: the first four steps' peaks {peaks} GB")
        shown = [0] + ([max((1, 2), key=lambda i: steps[i][0]), 3] if args.later else [])
        for i in shown:  # the first step's, the larger of the next two's, the fourth's
            peak, groups, blocks = peak_blocks(steps[i][1], dev.index or 0)
            print(f"   step {i + 1}'s peak (history: {peak / 1e9:.2f} GB):")
            for where, size in groups.most_common(args.top):
                print(f"   {size / 1e9:7.3f} GB  {where}")
            if args.later:
                print(f"   its {args.top} largest blocks:")
                for size, frames in blocks[: args.top]:
                    print(f"   {size / 1e6:9.1f} MB  {_where(frames)} | {_anywhere(frames)}")
        torch._dynamo.reset()
    if daemon is not None:
        daemon.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
