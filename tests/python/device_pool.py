"""GPU check of max pooling as window ops (run on the device machine by bench/device/pool/run,
not by pytest): ResNet's stem pooling (3x3, stride 2, padding 1) on a channels-last bf16
[64, 64, 112, 112] value, compiled with torch.compile(backend="fuseml") against a real
fusemld in GPU mode (tuned kernels only):
- forward and backward of relu -> max_pool2d -> (weighted sum) against an fp32 eager copy:
  ||got - fp32|| / ||fp32|| no worse than eager bf16's own error (+ 1e-4), NaN never;
- the pooling and its gradient are one tuned window kernel each;
- times (CUDA events, median of 50, interleaved) of the pooling alone, forward without grad
  and forward + backward, under eager, Inductor (torch.compile default) and fuseml, and the
  bandwidth of fuseml's forward against what it must move.
Usage: python3 tests/python/device_pool.py OUT_DIR   (writes OUT_DIR/device_pool.json)"""

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
os.environ.setdefault("FUSEML_ROUTE", "kernel")

import torch  # noqa: E402

try:
    import fuseml  # noqa: E402
except ImportError:  # not installed: the source tree (the ctypes launch path)
    sys.path.insert(0, os.path.join(ROOT, "client", "python"))
    import fuseml  # noqa: E402
from device_bmm import start_daemon, stop_daemon  # noqa: E402
from device_rope import median_ms  # noqa: E402
from helpers import rel_err  # noqa: E402

F = torch.nn.functional
SHAPE = (64, 64, 112, 112)
BACKEND = "fuseml" if "fuseml" in torch._dynamo.list_backends(exclude_tags=()) else fuseml.fuseml_backend


def stem_pool(x):
    return F.max_pool2d(F.relu(x), 3, 2, 1)


def pool(x):
    return F.max_pool2d(x, 3, 2, 1)


def inputs(dtype):
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(SHAPE, device="cuda", dtype=dtype, generator=g).to(memory_format=torch.channels_last)
    gy = torch.randn(SHAPE[0], SHAPE[1], 56, 56, device="cuda", dtype=dtype, generator=g)
    return x, gy.to(memory_format=torch.channels_last)


def step(fn, x, gy):
    xi = x.detach().requires_grad_(True)
    y = fn(xi)
    (dx,) = torch.autograd.grad(y, xi, gy)
    return [y.detach(), dx]


def main(out):
    os.makedirs(out, exist_ok=True)
    sock, proc = start_daemon(out)
    res = {"shape": SHAPE, "device": torch.cuda.get_device_name(), "problems": []}
    problems = res["problems"]
    try:
        x, gy = inputs(torch.bfloat16)
        torch._dynamo.reset()
        fused = torch.compile(stem_pool, backend=BACKEND, dynamic=False)
        got = step(fused, x, gy)
        got = step(fused, x, gy)
        torch.cuda.synchronize()
        want = step(stem_pool, x, gy)
        ref = step(stem_pool, x.float(), gy.float())
        res["errors"] = {}
        for n, a, w, r in zip(("y", "dx"), got, want, ref):
            f, e = rel_err(a, r), rel_err(w, r)
            res["errors"][n] = {"fuseml_vs_fp32": f, "eager_vs_fp32": e, "fuseml_vs_eager": rel_err(a, w)}
            print(f"{n:3s} fuseml {f:.3g}  eager bf16 {e:.3g}  (vs fp32)  fuseml vs eager {rel_err(a, w):.3g}")
            if not (f == f and f <= e + 1e-4):
                problems.append(f"{n}: {f:.3g} from fp32, eager bf16 {e:.3g}")
        c = fuseml.backend._default
        groups = [(p.which, g) for p in c.plans for g in p.groups]
        res["groups"] = [f"{w}: {g.describe()} state={g.state}" for w, g in groups]
        for line in res["groups"]:
            print(" ", line)
        for which in ("forward", "backward"):
            ws = [g for w, g in groups if w == which and g.kind == "window"]
            if len(ws) != 1 or ws[0].state != "tuned" or ws[0].route != "kernel":
                problems.append(f"{which}: not one tuned window kernel: {[g.describe() for g in ws]}")

        torch._dynamo.reset()
        ind = torch.compile(pool, dynamic=False)
        fus = torch.compile(pool, backend=BACKEND, dynamic=False)
        with torch.no_grad():
            for fn in (ind, fus):
                fn(x)
            fwd = median_ms([lambda f=f: f(x) for f in (pool, ind, fus)])
        for fn in (ind, fus):
            step(fn, x, gy)
        both = median_ms([lambda f=f: step(f, x, gy) for f in (pool, ind, fus)])
        res["ms"] = {
            "forward": dict(zip(("eager", "inductor", "fuseml"), fwd)),
            "forward_backward": dict(zip(("eager", "inductor", "fuseml"), both)),
        }
        moved = (x.numel() + gy.numel()) * x.element_size()
        print(f"{'ms (median of 50)':28s} {'eager':>8s} {'inductor':>9s} {'fuseml':>8s}")
        for n, t in (("forward (no grad)", fwd), ("forward + backward", both)):
            print(f"{n:28s} {t[0]:8.4f} {t[1]:9.4f} {t[2]:8.4f}")
        print(f"forward: fuseml {moved / fwd[2] / 1e6:.0f} GB/s of the {moved / 1e6:.0f} MB it must move")
    finally:
        stop_daemon(proc)
    res["ok"] = not problems
    with open(os.path.join(out, "device_pool.json"), "w") as f:
        json.dump(res, f, indent=1)
    for p in problems:
        print("FAIL", p)
    print("device_pool:", "ok" if not problems else f"{len(problems)} problems")
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else os.environ.get("OUT", "/tmp/fm-device-out")))
