"""GPU check of GEMM + epilogue and row groups (run on the device machine, not by pytest): row
groups (RMSNorm, LayerNorm, softmax) against eager; rest="inductor"; the reference models in
bf16 at benchmark-like shapes through a real fusemld in GPU mode (tuned kernels
only), inference and a training step against eager (relative error), the routing each group
got from its measured timings, and eager vs fuseml step times (CUDA events, medians,
interleaved). Usage: FUSEML_SOCKET=... FUSEML_LIB=... python3 device_gemm.py OUT.json"""

import json
import sys
import time

import torch

from helpers import median_ms, rel_err
from models import MODELS

import fuseml
from fuseml import runtime

SHAPES = [(16384, 256, 1024), (2048, 1024, 4096)]


def check(name, m, d, di, train):
    torch.manual_seed(0)
    model = MODELS[name](d, di).cuda().to(torch.bfloat16)
    x = torch.randn(m, d, device="cuda", dtype=torch.bfloat16)
    c = fuseml.FuseMLCompiler()
    compiled = torch.compile(model, backend=c)
    params = list(model.parameters())

    def step(fn):
        for p in params:
            p.grad = None
        if not train:
            with torch.no_grad():
                return [fn(x)]
        xi = x.detach().requires_grad_(True)
        y = fn(xi)
        y.float().square().mean().backward()
        return [y.detach()] + [p.grad for p in params] + [xi.grad]

    t0 = time.perf_counter()
    got = step(compiled)
    torch.cuda.synchronize()
    first_s = time.perf_counter() - t0
    want = step(model)
    errs = [rel_err(a, b) for a, b in zip(got, want)]
    before = dict(runtime.counters)
    step(compiled)
    torch.cuda.synchronize()
    eager_ms, fuseml_ms = median_ms([lambda: step(model), lambda: step(compiled)])
    groups = [g for p in c.plans for g in p.groups]
    return {
        "model": name,
        "train": train,
        "M": m,
        "d_model": d,
        "d_intermediate": di,
        "rel_err_max": max(errs),
        "rel_err_out": errs[0],
        "first_call_s": first_s,
        "eager_ms": eager_ms,
        "fuseml_ms": fuseml_ms,
        "speedup": eager_ms / fuseml_ms,
        "launches_per_step": runtime.counters["launches"] - before["launches"],
        "eager_group_runs_per_step": runtime.counters["eager"] - before["eager"],
        "groups": [g.describe() for g in groups if g.route == "kernel" or g.kind == "gemm"],
        "states": sorted({g.state for g in groups if g.state}),
    }


class _Norms(torch.nn.Module):
    """RMSNorm (Llama's), LayerNorm and softmax on one input: three row groups."""

    def __init__(self, d):
        super().__init__()
        self.ln = torch.nn.LayerNorm(d)
        self.w = torch.nn.Parameter(torch.ones(d) + 0.1 * torch.randn(d))

    def forward(self, x):
        h = x.float()
        rms = self.w * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype)
        return rms, self.ln(x), torch.softmax(x.float(), -1).to(x.dtype)


def check_rows(m=16384, d=4096, rest="aten"):
    torch.manual_seed(0)
    model = _Norms(d).cuda().to(torch.bfloat16)
    x = torch.randn(m, d, device="cuda", dtype=torch.bfloat16)
    c = fuseml.FuseMLCompiler(rest=rest)
    compiled = torch.compile(model, backend=c)
    with torch.no_grad():
        got, want = compiled(x), model(x)
        errs = [rel_err(a, b) for a, b in zip(got, want)]
        eager_ms, fuseml_ms = median_ms([lambda: model(x), lambda: compiled(x)])
    groups = [g for p in c.plans for g in p.groups]
    return {
        "model": "norms",
        "rest": rest,
        "M": m,
        "d_model": d,
        "rel_err": errs,
        "eager_ms": eager_ms,
        "fuseml_ms": fuseml_ms,
        "speedup": eager_ms / fuseml_ms,
        "groups": [g.describe() for g in groups if g.kind == "rows"],
    }


def check_inductor_rest(m=16384, d=256, di=1024):
    torch.manual_seed(0)
    model = MODELS["activation_heavy"](d, di).cuda().to(torch.bfloat16)
    x = torch.randn(m, d, device="cuda", dtype=torch.bfloat16)
    c = fuseml.FuseMLCompiler(rest="inductor")
    compiled = torch.compile(model, backend=c)
    with torch.no_grad():
        err = rel_err(compiled(x), model(x))
        eager_ms, fuseml_ms = median_ms([lambda: model(x), lambda: compiled(x)])
    return {
        "model": "activation_heavy",
        "rest": "inductor",
        "M": m,
        "rel_err_out": err,
        "eager_ms": eager_ms,
        "fuseml_ms": fuseml_ms,
        "groups": [g.describe() for p in c.plans for g in p.groups if g.route == "kernel"],
    }


def main():
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": []}
    for fn in (check_rows, check_inductor_rest):
        try:
            row = fn()
        except Exception as e:  # report and go on
            row = {"check": fn.__name__, "error": repr(e)}
        out["rows"].append(row)
        print(json.dumps(row), flush=True)
    for m, d, di in SHAPES:
        for name in ("mlp", "activation_heavy", "stacked", "llama_mlp"):
            for train in (False, True):
                if train and name != "mlp":
                    continue
                try:
                    row = check(name, m, d, di, train)
                except Exception as e:  # report and go on: one model must not hide the others
                    row = {"model": name, "train": train, "M": m, "error": repr(e)}
                out["rows"].append(row)
                print(json.dumps(row), flush=True)
    with open(sys.argv[1], "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
