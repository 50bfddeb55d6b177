"""GPU check of CUDA graphs (mode="reduce-overhead"; run on the device machine, not by pytest):
the reference models in bf16 through a real fusemld in GPU mode, each as eager, fuseml and
fuseml under CUDA graphs: relative error against an fp32 eager copy (outputs, and gradients for
the training step), median step times (CUDA events, interleaved, the order rotating), the
groups still served as kernels and whether their routing was measured in the warm-up (never in
a capture), launches in the warm-up/recording calls and in replays (none: Python does not run),
how many graphs fuseml's replay (graph_replay.py) warmed up, recorded and replayed (inference,
and a training step's forward and backward), and what happens to an output kept across the
next step.
Rows are written as they finish (FM_GRAPHS_BUDGET_S bounds the whole run).
Usage: FUSEML_SOCKET=... FUSEML_LIB=... python3 device_graphs.py OUT.json"""

import copy
import json
import os
import sys
import time

import torch

from helpers import median_ms, rel_err
from models import MODELS

import fuseml
from fuseml import runtime

SHAPES = {"small": (128, 256, 1024), "memory_bound": (16384, 256, 1024)}
MODEL_NAMES = {"mlp": "mlp", "heavy": "activation_heavy", "stacked": "stacked", "llama_mlp": "llama_mlp"}
T0 = time.monotonic()
BUDGET_S = float(os.environ.get("FM_GRAPHS_BUDGET_S", "150"))

from fuseml import graph_replay  # noqa: E402


def _replay_counts():
    """fuseml's replay counters summed over every live compiled graph (graph_replay.stats)."""
    return graph_replay.stats()


def make_step(model, x, train):
    params = list(model.parameters())

    def step(fn, xin=None):
        xin = x if xin is None else xin
        if not train:
            with torch.no_grad():
                return [fn(xin)]
        for p in params:
            p.grad = None
        xi = xin.detach().requires_grad_(True)
        y = fn(xi)
        y.float().square().mean().backward()
        return [y] + [p.grad for p in params] + [xi.grad]

    return step


def check(label, preset, train, rest="aten"):
    torch._dynamo.reset()
    m, d, di = SHAPES[preset]
    torch.manual_seed(0)
    ref = MODELS[MODEL_NAMES[label]](d, di).cuda()
    model = copy.deepcopy(ref).to(torch.bfloat16)
    x = torch.randn(m, d, device="cuda", dtype=torch.bfloat16)
    x2 = torch.randn(m, d, device="cuda", dtype=torch.bfloat16)
    c_plain, c_graphs = fuseml.FuseMLCompiler(rest=rest), fuseml.FuseMLCompiler(rest=rest)
    plain = torch.compile(model, backend=c_plain)
    graphs = torch.compile(model, backend=c_graphs, mode="reduce-overhead")
    step = make_step(model, x, train)
    want = make_step(ref, x.float(), train)(ref)
    want2 = make_step(ref, x2.float(), train)(ref)[0]

    row = {"model": label, "preset": preset, "M": m, "d_model": d, "d_intermediate": di, "train": train, "rest": rest}
    t = time.perf_counter()
    got_plain = [g.detach().clone() for g in step(plain)]
    torch.cuda.synchronize()
    row["first_call_s"] = round(time.perf_counter() - t, 2)
    replay0, launches0 = _replay_counts(), runtime.counters["launches"]
    first = [g.detach().clone() for g in step(graphs)]  # warm-up (routing measured here)
    second = [g.detach().clone() for g in step(graphs)]  # recording
    torch.cuda.synchronize()
    launches1 = runtime.counters["launches"]
    third = [g.detach().clone() for g in step(graphs)]  # replay
    torch.cuda.synchronize()
    row["launches_warmup_and_record"] = launches1 - launches0
    row["launches_in_replay"] = runtime.counters["launches"] - launches1
    replay1 = _replay_counts()
    row["graph_warmups"] = replay1.get("warmups", 0) - replay0.get("warmups", 0)
    row["graph_recordings"] = replay1.get("recordings", 0) - replay0.get("recordings", 0)
    row["graph_replays"] = replay1.get("replays", 0) - replay0.get("replays", 0)
    row["n_params"] = len(list(model.parameters()))
    eager = step(model)
    row["rel_err_eager_bf16"] = max(rel_err(a, b) for a, b in zip(eager, want))
    row["rel_err_fuseml"] = max(rel_err(a, b) for a, b in zip(got_plain, want))
    row["rel_err_graphs"] = [max(rel_err(a, b) for a, b in zip(o, want)) for o in (first, second, third)]
    mine = {id(g) for p in c_graphs.plans for g in p.groups}
    runners = [r for r in runtime._registry.values() if id(r.group) in mine]
    row["graph_plans"] = [f"{p.which}: {p.graphs}" for p in c_graphs.plans]
    row["kernel_groups"] = sum(1 for r in runners if r.use_kernel)
    row["aten_groups"] = sum(1 for r in runners if r.use_kernel is False)
    row["routing_timed_in_warmup"] = sum(1 for r in runners if r.timing is not None)
    row["undecided_groups"] = sum(1 for r in runners if r.kernel is not None and r.use_kernel is None)
    row["states"] = sorted({g.state for p in c_graphs.plans for g in p.groups if g.state})

    # an output kept across the next step: still right, or torch's documented error
    kept = step(graphs)[0]
    step(graphs, x2)
    try:
        err = rel_err(kept, want[0])
        row["kept_output"] = {"outcome": "valid" if err < 2e-2 else "overwritten (silently)", "rel_err": err}
    except RuntimeError as e:
        row["kept_output"] = {"outcome": "raised", "error": str(e).splitlines()[0][:200]}
    row["rel_err_graphs_x2"] = rel_err(step(graphs, x2)[0], want2)
    if not train:
        # the same input buffer with new values while the last output is kept: fuseml's
        # replay must use a second recording (outputs are aliases of graph memory)
        kept = step(graphs)[0]
        before, saved = kept.clone(), x.clone()
        x.copy_(x2)
        new = step(graphs)[0]
        row["kept_same_input"] = {"kept_unchanged": bool(torch.equal(kept, before)), "rel_err_new": rel_err(new, want2)}
        x.copy_(saved)
        del kept, new

    ms = median_ms([lambda: step(model), lambda: step(plain), lambda: step(graphs)], reps=40)
    row["eager_ms"], row["fuseml_ms"], row["fuseml_graphs_ms"] = ms
    row["graphs_speedup_vs_eager"] = ms[0] / ms[2]
    row["graphs_speedup_vs_fuseml"] = ms[1] / ms[2]
    end = _replay_counts()
    row["graph_totals"] = {k: end.get(k, 0) - replay0.get(k, 0) for k in end}
    return row


def replay_paths():
    """fuseml's inference replay on the GPU past its limits: 12 input buffers (8 recorded
    where they are, the rest through one graph-owned copy per layout), outputs kept across
    calls, and a memory budget that forces recordings out; every output checked against
    eager, the runner's counters reported."""
    torch._dynamo.reset()
    m, d, di = SHAPES["memory_bound"]
    torch.manual_seed(0)
    model = MODELS["mlp"](d, di).cuda().to(torch.bfloat16)
    runners = []
    orig_init = graph_replay.GraphReplay.__init__

    def init(self, *a, **k):
        orig_init(self, *a, **k)
        runners.append(self)

    graph_replay.GraphReplay.__init__ = init
    res = {}
    try:
        for label, budget_mb in (("default", None), ("budget_100mb", "100")):
            if budget_mb:
                os.environ["FUSEML_GRAPH_MEMORY_MB"] = budget_mb
            torch._dynamo.reset()
            runners.clear()
            compiled = torch.compile(model, backend=fuseml.FuseMLCompiler(), mode="reduce-overhead")
            xs = [torch.randn(m, d, device="cuda", dtype=torch.bfloat16) for _ in range(12)]
            with torch.no_grad():
                want = [model(x) for x in xs]
                worst, kept = 0.0, []
                for rnd in range(3):
                    for i, x in enumerate(xs):
                        y = compiled(x)
                        if rnd == 2 and i % 3 == 0:
                            kept.append((y, want[i]))  # held across the later calls
                        worst = max(worst, rel_err(y, want[i]))
                worst_kept = max(rel_err(y, w) for y, w in kept)
            torch.cuda.synchronize()
            r = runners[-1] if runners else None
            res[label] = {
                "rel_err_max": worst,
                "rel_err_kept_max": worst_kept,
                "recordings": r and r.recordings,
                "replays": r and r.replays,
                "direct": r and len(r.direct),
                "layouts": r and len(r.by_layout),
                "dropped": r and r.dropped,
                "over_budget": r and r.over_budget,
                "held_runs": r and r.held_runs,
                "pool_mb": r and round(r.pool_bytes / 2**20, 1),
                "off": r and r.off,
            }
            del kept, want
    finally:
        graph_replay.GraphReplay.__init__ = orig_init
        os.environ.pop("FUSEML_GRAPH_MEMORY_MB", None)
    return res


def main():
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": []}
    try:
        out["replay_paths"] = replay_paths()
    except Exception as e:  # reported, and the rows below still run
        out["replay_paths"] = {"error": repr(e)[:2000]}
    print(json.dumps({"replay_paths": out["replay_paths"]}), flush=True)
    try:
        from fuseml import cudagraphs

        cudagraphs._api()
        out["cudagraph_api"] = "ok"
    except Exception as e:
        out["cudagraph_api"] = repr(e)
    # the small shape first: host time is what graphs remove
    plan = [
        ("mlp", "small", False),
        ("mlp", "small", True),
        ("mlp", "memory_bound", False),
        ("mlp", "memory_bound", True),
    ]
    plan += [(n, p, False) for p in ("small", "memory_bound") for n in ("heavy", "stacked", "llama_mlp")]
    plan += [("heavy", "small", False, "inductor")]
    for args in plan:
        if time.monotonic() - T0 > BUDGET_S:
            out["rows"].append({"skipped": list(args), "why": "time budget"})
            continue
        try:
            row = check(*args)
        except Exception as e:  # report and go on: one model must not hide the others
            row = {"check": list(args), "error": repr(e)[:2000]}
        row["t_s"] = round(time.monotonic() - T0, 1)
        out["rows"].append(row)
        print(json.dumps(row), flush=True)
        with open(sys.argv[1], "w") as f:
            json.dump(out, f, indent=1)
    with open(sys.argv[1], "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
