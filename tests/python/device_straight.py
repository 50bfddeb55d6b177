"""GPU check of generated straight-line code (run on the device machine, not by pytest): a
bf16 block (Linear + GELU, residual, LayerNorm; GEMM and row groups) compiled by fuseml runs
as generated code after its first call, gives the same outputs and gradients as the same
kernels run from the FX graph (FUSEML_STRAIGHT_LINE=0), runs a misaligned input through the
group's ATen ops, and costs less host time per call. A kernel reading views the code never
makes (a slice of the input at an offset, a parameter through unsqueezes: the launch takes
the root's pointer plus the view's offset) gives the FX graph's outputs.
Usage: FUSEML_SOCKET=... FUSEML_LIB=... python3 device_straight.py OUT.json"""

import json
import os
import sys
import time

import torch

import fuseml

os.environ["FUSEML_ROUTE"] = "kernel"  # the same kernels on both paths: outputs compare equal


class Block(torch.nn.Module):
    def __init__(self, d=512):
        super().__init__()
        self.fc1 = torch.nn.Linear(d, 4 * d)
        self.fc2 = torch.nn.Linear(4 * d, d)
        self.norm = torch.nn.LayerNorm(d)

    def forward(self, x):
        h = self.fc2(torch.nn.functional.gelu(self.fc1(self.norm(x))))
        return self.norm(x + h * 0.5)


class ViewsIntoKernels(torch.nn.Module):
    """A rows kernel reading a slice of its input one row in and a parameter through two
    unsqueezes: views the generated code never makes."""

    def __init__(self, d=512):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.rand(d) + 0.5)

    def forward(self, x):
        y = x[:, 1:, :]
        s = self.scale.unsqueeze(0).unsqueeze(0)
        return torch.nn.functional.layer_norm(y * s + 1.0, (y.shape[-1],))


def compiled(model, generated):
    os.environ["FUSEML_STRAIGHT_LINE"] = "1" if generated else "0"
    c = fuseml.FuseMLCompiler(chains=False)
    return torch.compile(model, backend=c), c


def paths(c):
    return sorted({(p.which, p.compiled.path if p.compiled else p.skipped) for p in c.plans})


def host_us(fn, x, n=300):
    for _ in range(5):
        fn(x)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn(x)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n * 1e6


def main(out_path):
    torch.manual_seed(0)
    model = Block().cuda().to(torch.bfloat16)
    x = torch.randn(8, 64, 512, device="cuda", dtype=torch.bfloat16)
    result, failures = {}, []

    # inference: each compile runs its first calls before the next is made (the setting is
    # read when a graph's code is generated, after its first call)
    big = torch.randn(8 * 64 * 512 + 1, device="cuda", dtype=torch.bfloat16)
    xm = big[1:].view(8, 64, 512)  # 2 bytes past an allocation: too little for the kernels
    runs = {}
    with torch.no_grad():
        for generated in (True, False):
            fn, c = compiled(model, generated)
            out = [fn(x) for _ in range(3)][-1]
            # the misaligned input: the GEMM group reads it through its ATen ops
            mis = [fn(xm) for _ in range(3)][-1]
            runs[generated] = (fn, c, out, mis)
        (gen, cg, a, am), (fx, cf, b, bm) = runs[True], runs[False]
        result["inference_paths"] = paths(cg)
        result["inference_fx_paths"] = paths(cf)
        result["inference_equal"] = bool(torch.equal(a, b))
        ref = Block().cuda()
        ref.load_state_dict({k: v.float() for k, v in model.state_dict().items()})
        want = ref(x.float())
        result["inference_rel_err"] = ((a.float() - want).norm() / want.norm()).item()
        result["misaligned_rel_err"] = ((am.float() - bm.float()).norm() / bm.float().norm()).item()
        result["host_us_generated"] = host_us(gen, x)
        result["host_us_fx"] = host_us(fx, x)
    if not any(p.startswith("generated") for _, p in result["inference_paths"]):
        failures.append("inference graph not generated")
    if not result["inference_equal"]:
        failures.append("inference outputs differ between generated code and the FX graph")
    if result["misaligned_rel_err"] > 1e-2:
        failures.append("misaligned input wrong")

    views_model = ViewsIntoKernels().cuda().to(torch.bfloat16)
    xv = torch.randn(8, 65, 512, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        outs = {}
        for generated in (True, False):
            fn, c = compiled(views_model, generated)
            outs[generated] = ([fn(xv) for _ in range(3)][-1], paths(c))
    result["views_paths"] = outs[True][1]
    result["views_equal"] = bool(torch.equal(outs[True][0], outs[False][0]))
    if not any(p.startswith("generated") for _, p in result["views_paths"]):
        failures.append("the views graph not generated")
    if not result["views_equal"]:
        failures.append("a kernel reading views never made differs from the FX graph")

    # training: loss forward and backward, gradients compared
    def grads(fn):
        model.zero_grad(set_to_none=True)
        xi = x.clone().requires_grad_(True)
        (fn(xi).float() ** 2).mean().backward()
        return [xi.grad] + [p.grad for p in model.parameters()]

    gen, cg = compiled(model, True)
    for _ in range(3):
        ga = grads(gen)
    fx, cf = compiled(model, False)
    for _ in range(3):
        gb = grads(fx)
    result["train_paths"] = paths(cg)
    result["train_equal"] = all(torch.equal(p, q) for p, q in zip(ga, gb))
    result["train_max_rel"] = max(((p.float() - q.float()).norm() / q.float().norm()).item() for p, q in zip(ga, gb))
    if sum(p.startswith("generated") for _, p in result["train_paths"]) < 2:
        failures.append("forward and backward graphs not both generated")
    if result["train_max_rel"] > 1e-3:
        failures.append("gradients differ between generated code and the FX graph")
    result["failures"] = failures
    print(json.dumps(result, indent=1))
    with open(out_path, "w") as f:
        json.dump(result, f, indent=1)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main(sys.argv[1])
