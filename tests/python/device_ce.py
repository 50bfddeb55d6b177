"""GPU check of cross-entropy over a language model's vocabulary (run on the device machine by
bench/device/cross-entropy/run, not by pytest): Hugging Face's loss, cross_entropy of the
upcast bf16 logits [4096, V] against int64 targets (some ignored, -100), forward + backward,
compiled with torch.compile(backend="fuseml") against a real fusemld in GPU mode (tuned
kernels only), for Llama's vocabulary (32000) and GPT-2's (50257):
- the loss and the logits' gradient against an fp32 eager copy: ||got - fp32|| / ||fp32|| no
  worse than eager bf16's own error (+ 1e-4), NaN never;
- the forward's rows kernel and the backward's pointwise kernel are tuned fuseml kernels;
- times (CUDA events, median of 30, interleaved) of forward + backward under eager, Inductor
  and fuseml, and each backend's kernels of one step (torch.profiler), with the bandwidth
  of the two largest against the bytes they must move.
Usage: python3 tests/python/device_ce.py OUT_DIR   (writes OUT_DIR/device_ce.json)"""

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
TOKENS = 4096
VOCABS = {"llama": 32000, "gpt2": 50257}
BACKEND = "fuseml" if "fuseml" in torch._dynamo.list_backends(exclude_tags=()) else fuseml.fuseml_backend


def loss_fn(logits, target):
    return F.cross_entropy(logits.float(), target, ignore_index=-100)


def inputs(vocab):
    g = torch.Generator(device="cuda").manual_seed(0)
    logits = torch.randn(TOKENS, vocab, device="cuda", dtype=torch.bfloat16, generator=g) * 2
    target = torch.randint(0, vocab, (TOKENS,), device="cuda", generator=g)
    target[::17] = -100  # padding tokens, ignored
    return logits, target


def step(fn, logits, target):
    x = logits.detach().requires_grad_(True)
    loss = fn(x, target)
    (dx,) = torch.autograd.grad(loss, x)
    return [loss.detach(), dx]


def kernels(fn, logits, target):
    """[(name, us)] of one forward + backward, in the order they ran."""
    from torch.profiler import ProfilerActivity, profile

    step(fn, logits, target)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step(fn, logits, target)
        torch.cuda.synchronize()
    gpu = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    gpu.sort(key=lambda e: e.time_range.start)
    return [(e.name[:70], e.time_range.elapsed_us()) for e in gpu]


def one_vocab(name, vocab, res, problems):
    logits, target = inputs(vocab)
    torch._dynamo.reset()
    c = fuseml.FuseMLCompiler()  # this vocabulary's graphs only
    fused = torch.compile(loss_fn, backend=c, dynamic=False)
    got = step(fused, logits, target)
    got = step(fused, logits, target)
    torch.cuda.synchronize()
    want = step(loss_fn, logits, target)
    ref = step(loss_fn, logits.float(), target)
    r = res[name] = {"vocab": vocab, "errors": {}}
    for n, a, w, f32 in zip(("loss", "dlogits"), got, want, ref):
        f, e = rel_err(a, f32), rel_err(w, f32)
        r["errors"][n] = {"fuseml_vs_fp32": f, "eager_vs_fp32": e}
        print(f"{name} {n:8s} fuseml {f:.3g}  eager bf16 {e:.3g}  (vs fp32)")
        if not (f == f and f <= e + 1e-4):
            problems.append(f"{name} {n}: {f:.3g} from fp32, eager bf16 {e:.3g}")
    groups = [(p.which, g) for p in c.plans for g in p.groups]
    r["groups"] = [f"{w}: {g.describe()} state={g.state}" for w, g in groups]
    for line in r["groups"]:
        print(" ", line)
    for w, g in groups:
        if g.route == "kernel" and g.state != "tuned":
            problems.append(f"{name} {w}: {g.describe()} not tuned ({g.state})")

    torch._dynamo.reset()
    ind = torch.compile(loss_fn, dynamic=False)
    fus = torch.compile(loss_fn, backend=BACKEND, dynamic=False)
    for fn in (ind, fus):
        step(fn, logits, target)
    ms = median_ms([lambda f=f: step(f, logits, target) for f in (loss_fn, ind, fus)], reps=30)
    r["ms"] = dict(zip(("eager", "inductor", "fuseml"), ms))
    print(f"{name} forward + backward ms (median of 30): eager {ms[0]:.4f}  inductor {ms[1]:.4f}  fuseml {ms[2]:.4f}")
    moved_fwd = logits.numel() * 2
    for backend, fn in (("inductor", ind), ("fuseml", fus)):
        ks = kernels(fn, logits, target)
        r[f"kernels_{backend}"] = ks
        total = sum(us for _, us in ks)
        print(f"  {backend}: {len(ks)} kernels, {total:.1f} us")
        for k, us in ks:
            if us >= 5:
                print(f"    {us:8.1f} us  {k}")
        big = sorted(ks, key=lambda k: -k[1])[:2]
        for k, us in big:
            print(f"    {k[:40]}: {moved_fwd / us / 1e3:.0f} GB/s per pass over the bf16 logits")


def main(out):
    os.makedirs(out, exist_ok=True)
    sock, proc = start_daemon(out)
    res = {"tokens": TOKENS, "device": torch.cuda.get_device_name(), "problems": []}
    problems = res["problems"]
    try:
        for name, vocab in VOCABS.items():
            one_vocab(name, vocab, res, problems)
    finally:
        stop_daemon(proc)
    res["ok"] = not problems
    with open(os.path.join(out, "device_ce.json"), "w") as f:
        json.dump(res, f, indent=1)
    for p in problems:
        print("FAIL", p)
    print("device_ce:", "ok" if not problems else f"{len(problems)} problems")
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else os.environ.get("OUT", "/tmp/fm-device-out")))
