"""GPU check of the Python client (run on the device machine, not by pytest): models with
pointwise chains on CUDA through a real fusemld in GPU mode, outputs and gradients against
eager, three batch sizes without a new kernel compile, and the host time of one launch.
Usage: FUSEML_SOCKET=... FUSEML_LIB=... FUSEML_ALLOW_UNTUNED=1 python3 device_check.py OUT.json"""

import json
import sys
import time

import torch

from models import MODELS

import fuseml
from fuseml import runtime


def run_model(name, dtype, dim=256, batch=64):
    torch.manual_seed(0)
    model = MODELS[name](dim, 4 * dim).cuda().to(dtype)
    x = torch.randn(batch, dim, device="cuda", dtype=dtype)
    c = fuseml.FuseMLCompiler(min_ops=1)
    compiled = torch.compile(model, backend=c)

    def step(fn):
        model.zero_grad(set_to_none=True)
        xi = x.clone().requires_grad_(True)
        y = fn(xi)
        (y.float() * torch.linspace(-1, 1, y.numel(), device="cuda").view(y.shape)).sum().backward()
        return [y.detach()] + [p.grad for p in model.parameters()] + [xi.grad]

    want = step(model)
    before = dict(runtime.counters)
    got = step(compiled)
    launched = runtime.counters["launches"] - before["launches"]
    eager = runtime.counters["eager"] - before["eager"]
    errs = [((a.float() - b.float()).abs().max() / (b.float().abs().max() + 1e-6)).item() for a, b in zip(got, want)]
    kernels = [g for p in c.plans for g in p.kernels()]
    return {
        "model": name,
        "dtype": str(dtype),
        "max_rel_err": max(errs),
        "out_rel_err": errs[0],
        "groups_fused": len(kernels),
        "launches": launched,
        "eager_group_runs": eager,
        "states": sorted({g.state for g in kernels if g.state}),
        "origins": sorted({g.origin for g in kernels if g.origin}),
    }


def dynamic_batches():
    torch.manual_seed(0)
    model = MODELS["llama_mlp"](256, 1024).cuda()
    c = fuseml.FuseMLCompiler()
    compiled = torch.compile(model, backend=c, dynamic=True)
    out = []
    for b in (17, 64, 301):
        x = torch.randn(b, 256, device="cuda")
        n = len(c.plans)
        before = runtime.counters["launches"]
        err = (compiled(x) - model(x)).abs().max().item()
        out.append(
            {
                "batch": b,
                "max_abs_err": err,
                "new_graphs": len(c.plans) - n,
                "launches": runtime.counters["launches"] - before,
            }
        )
    return out


def launch_overhead(n=5000):
    """Host time per launch of a tiny fused op (x * 2 + 1 over 1024 floats): the launch itself
    (ctypes into fm_module_launch), the runner (checks + output allocation + launch), the
    custom op through the dispatcher, and eager's two ATen kernels for scale."""

    def f(x):
        return x * 2.0 + 1.0

    c = fuseml.FuseMLCompiler()
    x = torch.randn(1, 1024, device="cuda")
    compiled = torch.compile(f, backend=c)
    y = compiled(x)
    torch.testing.assert_close(y, f(x))
    (k,) = [g for p in c.plans for g in p.kernels()]
    runner = next(r for r in runtime._registry.values() if r.built is k.built)
    mod = next(iter(m for (key, _), m in runtime._modules.items() if key == k.key))
    out = torch.empty_like(x)
    stream = torch.cuda.current_stream().cuda_stream
    res = {}

    def timeit(name, fn):
        for _ in range(200):
            fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        res[name + "_us"] = (t1 - t0) / n * 1e6

    timeit("fm_module_launch_ctypes", lambda: mod.launch([x.data_ptr()], [out.data_ptr()], -1, stream))
    timeit("runner_run", lambda: runner.run([x]))
    timeit("custom_op", lambda: torch.ops.fuseml.group.default(runner.gid, [x]))
    timeit("compiled_graph_call", lambda: compiled(x))
    timeit("eager_two_aten_kernels", lambda: f(x))
    return res


def main():
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    out["models"] = []
    for name in sorted(MODELS):
        for dtype in (torch.float32, torch.bfloat16):
            try:
                out["models"].append(run_model(name, dtype))
            except Exception as e:  # report and go on: one model must not hide the others
                out["models"].append({"model": name, "dtype": str(dtype), "error": repr(e)})
    out["dynamic"] = dynamic_batches()
    out["launch_overhead"] = launch_overhead()
    out["counters"] = dict(runtime.counters)
    text = json.dumps(out, indent=1)
    print(text)
    with open(sys.argv[1], "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
