"""Many ranks, one node: N processes under torchrun train one bench/models workload with DDP
and AdamW, each rank on its own GPU, compiled either with backend="fuseml" (every rank asks
the one fusemld on FUSEML_SOCKET) or with Inductor (each rank compiles for itself).

    torchrun --standalone --nproc_per_node N bench/models/ranks.py --model llama --size small \\
        --mode fuseml --out run.json [--seconds 90]
    python3 bench/models/ranks.py --report DIR      # the runs' JSON files in DIR as a table

A step is the loss forward and backward, the optimizer step and zero_grad, as a training
loop runs it (torch.compile(DDP(model)), the DDP optimizer splitting the graph at its
buckets). Every rank trains on the same inputs (only time is measured, not convergence).

Rank 0 writes --out: the time to the first step (from the first call of the compiled model
to the end of the first optimizer step, on the slowest rank), every step's time, the step
while fusemld still tunes in the background and once every kernel is tuned, each rank's
peak memory, the first step's loss against eager's on the same weights, and (fuseml) how
each rank's kernels were served. The steps go on until every rank holds only tuned kernels
and 30 more steps ran (200 steps at the least), or --seconds pass."""

import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import fuseml_state  # noqa: E402

STEADY_STEPS = 30  # steps timed once every kernel is tuned (the last ones of a run)
MIN_STEPS = 200  # a run's steps at the least: the steady ones come after the warm-up


def train(args):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    import model_zoo as models

    cuda = torch.cuda.is_available()  # without a GPU: gloo on the CPU (a smoke test)
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    local = int(os.environ.get("LOCAL_RANK", rank))
    if cuda:
        torch.cuda.set_device(local)
    dev = torch.device("cuda", local) if cuda else torch.device("cpu")

    def sync():
        if cuda:
            torch.cuda.synchronize(dev)

    work = models.build(args.model, args.size, dev)
    with torch.no_grad():
        eager_loss = work.loss(work.model, work.inputs).float().item()

    ddp = DDP(work.model, device_ids=[local] if cuda else None)
    opt = torch.optim.AdamW([p for p in ddp.parameters() if p.requires_grad], lr=1e-5)
    if args.mode == "fuseml":
        compiled = torch.compile(ddp, backend="fuseml")
    else:
        compiled = torch.compile(ddp)

    def step():
        loss = work.loss(compiled, work.inputs)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    def flag(*values):  # the ranks agree (sum) between steps: not inside a timed step
        t = torch.tensor(values, dtype=torch.float64, device=dev)
        dist.all_reduce(t)
        return t.tolist()

    dist.barrier()
    sync()
    if cuda:
        torch.cuda.reset_peak_memory_stats(dev)
    t0 = time.perf_counter()
    first_loss = step().float().item()
    sync()
    first_s = time.perf_counter() - t0
    firsts = [None] * world
    dist.all_gather_object(firsts, first_s)

    series = []  # (ms, verified kernels left on all ranks when it ran)
    start = time.monotonic()
    steady_left = STEADY_STEPS
    left = flag(fuseml_state.verified_left() if args.mode == "fuseml" else 0)[0]
    while True:
        sync()
        t = time.perf_counter()
        step()
        sync()
        series.append(((time.perf_counter() - t) * 1e3, left))
        if len(series) % 10 == 0:
            verified = fuseml_state.verified_left() if args.mode == "fuseml" else 0
            timeout = 1.0 if time.monotonic() - start > args.seconds else 0.0
            left, timeout = flag(verified, timeout)
            if timeout:
                break
        if left == 0:
            steady_left -= 1
            if steady_left <= 0 and len(series) >= MIN_STEPS:
                break

    tuning = [ms for ms, v in series if v > 0]
    steady = [ms for ms, v in series[-STEADY_STEPS:] if v == 0]
    mine = {
        "rank": rank,
        "first_step_s": first_s,
        "peak_gb": torch.cuda.max_memory_allocated(dev) / 1e9 if cuda else 0.0,
        "kernels": fuseml_state.kernel_states() if args.mode == "fuseml" else None,
        "paths": fuseml_state.paths(fuseml_state.plans()) if args.mode == "fuseml" else None,
    }
    ranks = [None] * world
    dist.all_gather_object(ranks, mine)
    if rank == 0:
        out = {
            "model": args.model,
            "size": args.size,
            "describe": work.describe,
            "mode": args.mode,
            "ranks": world,
            "device": torch.cuda.get_device_name(dev) if cuda else "cpu",
            "torch": torch.__version__,
            "first_step_s": max(firsts),
            "eager_loss": eager_loss,
            "first_loss": first_loss,
            "loss_rel_diff": abs(first_loss - eager_loss) / max(abs(eager_loss), 1e-12),
            "steps": len(series),
            "step_ms_tuning": statistics.median(tuning) if tuning else None,
            "tuning_steps": len(tuning),
            "step_ms_steady": statistics.median(steady) if steady else None,
            "seconds_to_tuned": None,
            "series_ms": [round(ms, 3) for ms, _ in series],
            "per_rank": ranks,
        }
        if tuning and steady:
            out["seconds_to_tuned"] = round(sum(tuning) / 1e3, 2)
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)
        print(json.dumps({k: v for k, v in out.items() if k not in ("series_ms", "per_rank")}))
    dist.barrier()
    dist.destroy_process_group()


def _fmt(x, spec):
    return "-" if x is None else format(x, spec)


def report(folder):
    """A markdown table of every run in folder (NAME.json from train, with stats-NAME.json,
    fusectl's counters, beside a fuseml run)."""
    if not os.path.isdir(folder):
        raise SystemExit(f"ranks: {folder} is not a directory of runs")
    rows = []
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".json"):
            continue
        with open(os.path.join(folder, name)) as f:
            r = json.load(f)
        if not isinstance(r, dict) or "per_rank" not in r:  # fusectl's stats and ls
            continue
        stats = os.path.join(folder, "stats-" + name)
        s = json.load(open(stats)) if os.path.exists(stats) else None
        rows.append((name, r, s))
    if not rows:
        return "no runs\n"
    r0 = rows[0][1]
    lines = [
        f"{r0['describe']}, DDP + AdamW, {r0['device']}, torch {r0['torch']}",
        "",
        "| run | ranks | first step s | step ms while tuning | steady step ms | peak GB (max rank) "
        "| first loss vs eager | kernels per rank | store entries | compiles | tunes | verified "
        "| joined in flight | requests |",
        "|" + "---|" * 14,
    ]
    for name, r, s in rows:
        per = r["per_rank"]
        kern = (
            "; ".join(",".join(f"{k} {v}" for k, v in sorted((p["kernels"] or {}).items())) for p in per)
            if r["mode"] == "fuseml"
            else "-"
        )
        sess = (s or {}).get("session", {})
        lines.append(
            f"| {name[:-5]} | {r['ranks']} | {r['first_step_s']:.1f} | {_fmt(r['step_ms_tuning'], '.2f')} "
            f"| {_fmt(r['step_ms_steady'], '.2f')} | {max(p['peak_gb'] for p in per):.2f} "
            f"| {r['loss_rel_diff']:.1e} | {kern} | {_fmt((s or {}).get('entries'), 'd')} "
            f"| {_fmt(sess.get('compiles'), 'd')} | {_fmt(sess.get('tunes'), 'd')} | {_fmt(sess.get('verified'), 'd')} "
            f"| {_fmt(sess.get('joined_inflight'), 'd')} | {_fmt(sess.get('requests'), 'd')} |"
        )
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="llama")
    ap.add_argument("--size", default="small")
    ap.add_argument("--mode", choices=("fuseml", "inductor"), default="fuseml")
    ap.add_argument(
        "--seconds",
        type=float,
        default=90.0,
        help="stop the steps after this long even if kernels are still being tuned",
    )
    ap.add_argument("--out", default="ranks.json")
    ap.add_argument("--report", metavar="DIR", help="print the runs in DIR as a table and exit")
    args = ap.parse_args(argv)
    if args.report:
        sys.stdout.write(report(args.report))
        return 0
    train(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
