"""GPU check of rotary position embeddings (run on the device machine by bench/device/rope/run,
not by pytest): Hugging Face's apply_rotary_pos_emb / rotate_half (Llama, Mistral, Mixtral)
on q [B, H, S, D] and k [B, KV, S, D] laid out as the attention block makes them (the q/k
projections' [B, S, H*D] output viewed and transposed: not contiguous), cos and sin
[B, S, D] broadcast over the heads, bf16, compiled with torch.compile(backend="fuseml")
against a real fusemld in GPU mode (tuned kernels only):
- forward and backward (gradients of q and k for given output gradients) against an fp32
  eager copy: ||got - fp32|| / ||fp32|| no worse than eager bf16's own error (+ 1e-4);
- one fused kernel per rotated tensor and pass: the forward launches exactly 2 kernels (q
  and k), the backward 2, each a cat group served a tuned kernel (FUSEML_ROUTE=kernel unless
  set, so the comparison is of the kernel, not of ATen chosen by measured routing);
- times (CUDA events, median of 50, each call synchronised, interleaved) of the forward
  (no grad) and of forward + backward under eager, Inductor (torch.compile default) and
  fuseml, at Llama-3-8B's heads (32 q, 8 kv, D 128) over 4 x 2048 tokens.
Usage: python3 tests/python/device_rope.py OUT_DIR   (writes OUT_DIR/device_rope.json)"""

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
from fuseml import runtime  # noqa: E402
from device_bmm import start_daemon, stop_daemon  # noqa: E402
from helpers import rel_err  # noqa: E402
from test_cat_groups import apply_rotary_pos_emb  # noqa: E402

SHAPE = dict(b=4, s=2048, h=32, kv=8, d=128)
# by name where the package is installed (its entry point), else the same default compiler
BACKEND = "fuseml" if "fuseml" in torch._dynamo.list_backends(exclude_tags=()) else fuseml.fuseml_backend


def inputs(dtype, b, s, h, kv, d, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(b, s, h * d, device="cuda", dtype=dtype, generator=g).view(b, s, h, d).transpose(1, 2)
    k = torch.randn(b, s, kv * d, device="cuda", dtype=dtype, generator=g).view(b, s, kv, d).transpose(1, 2)
    pos = torch.arange(s, device="cuda", dtype=torch.float32)
    inv = 1.0 / (500000 ** (torch.arange(0, d, 2, device="cuda", dtype=torch.float32) / d))
    freqs = pos[:, None] * inv[None]
    emb = torch.cat((freqs, freqs), -1)
    cos = emb.cos()[None].expand(b, s, d).to(dtype).contiguous()
    sin = emb.sin()[None].expand(b, s, d).to(dtype).contiguous()
    gq = torch.randn(b, h, s, d, device="cuda", dtype=dtype, generator=g)
    gk = torch.randn(b, kv, s, d, device="cuda", dtype=dtype, generator=g)
    return q, k, cos, sin, gq, gk


def step(fn, q, k, cos, sin, gq, gk):
    """(q_embed, k_embed, dq, dk)"""
    qi, ki = q.detach().requires_grad_(True), k.detach().requires_grad_(True)
    a, b = fn(qi, ki, cos, sin)
    dq, dk = torch.autograd.grad((a, b), (qi, ki), (gq, gk))
    return [a.detach(), b.detach(), dq, dk]


def median_ms(fns, reps=50):
    for fn in fns:
        for _ in range(5):
            fn()
    torch.cuda.synchronize()
    times = [[] for _ in fns]
    for r in range(reps):
        order = range(len(fns)) if r % 2 == 0 else reversed(range(len(fns)))
        for i in order:
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            s.record()
            fns[i]()
            e.record()
            torch.cuda.synchronize()
            times[i].append(s.elapsed_time(e))
    return [sorted(t)[len(t) // 2] for t in times]


def main(out):
    os.makedirs(out, exist_ok=True)
    sock, proc = start_daemon(out)
    res = {"shape": SHAPE, "device": torch.cuda.get_device_name(), "problems": []}
    problems = res["problems"]
    try:
        dtype = torch.bfloat16
        args = inputs(dtype, **SHAPE)
        q, k, cos, sin, gq, gk = args
        torch._dynamo.reset()
        fused = torch.compile(apply_rotary_pos_emb, backend=BACKEND, dynamic=False)
        launches0 = runtime.counters["launches"]
        got = step(fused, *args)
        torch.cuda.synchronize()
        warm_launches = runtime.counters["launches"] - launches0
        launches0 = runtime.counters["launches"]
        got = step(fused, *args)
        torch.cuda.synchronize()
        launched = runtime.counters["launches"] - launches0
        c = fuseml.backend._default
        want = step(apply_rotary_pos_emb, *args)
        ref = step(apply_rotary_pos_emb, *[a.float() for a in args])
        names = ["q_embed", "k_embed", "dq", "dk"]
        res["errors"] = {}
        for n, a, w, r in zip(names, got, want, ref):
            f, e = rel_err(a, r), rel_err(w, r)
            res["errors"][n] = {"fuseml_vs_fp32": f, "eager_vs_fp32": e, "fuseml_vs_eager": rel_err(a, w)}
            print(f"{n:8s} fuseml {f:.3g}  eager bf16 {e:.3g}  (vs fp32)")
            if not (f == f and f <= e + 1e-4):
                problems.append(f"{n}: {f:.3g} from fp32, eager bf16 {e:.3g}")
        groups = [(p.which, g) for p in c.plans for g in p.groups]
        res["groups"] = [f"{w}: {g.describe()} state={g.state} origin={g.origin}" for w, g in groups]
        for line in res["groups"]:
            print(" ", line)
        cats = [(w, g) for w, g in groups if "cat" in g.op_names]
        for which in ("forward", "backward"):
            n = [g for w, g in cats if w == which]
            if len(n) != 2:
                problems.append(f"{which}: {len(n)} cat groups, want 2 (q and k)")
            for g in n:
                if g.route != "kernel" or g.state != "tuned" or not {"neg", "cat", "mul", "add"} <= set(g.op_names):
                    problems.append(f"{which}: not one tuned group of the whole rotation: {g.describe()} ({g.state})")
        others = [g for w, g in groups if g.route == "kernel" and "cat" not in g.op_names]
        if others:
            problems.append(f"other groups served: {[g.describe() for g in others]}")
        res["launches_per_step"] = launched
        res["launches_first_step"] = warm_launches
        print(f"fused kernel launches per forward + backward: {launched} (first step {warm_launches})")
        if launched != 4:
            problems.append(f"{launched} kernel launches per forward + backward, want 4 (q, k; forward, backward)")

        # times: the forward without grad, and forward + backward
        torch._dynamo.reset()
        ind = torch.compile(apply_rotary_pos_emb, dynamic=False)
        fus = torch.compile(apply_rotary_pos_emb, backend=BACKEND, dynamic=False)
        with torch.no_grad():
            for fn in (ind, fus):
                fn(q, k, cos, sin)
            fwd = median_ms([lambda f=f: f(q, k, cos, sin) for f in (apply_rotary_pos_emb, ind, fus)])
        for fn in (ind, fus):
            step(fn, *args)
        both = median_ms([lambda f=f: step(f, *args) for f in (apply_rotary_pos_emb, ind, fus)])
        res["ms"] = {
            "forward": dict(zip(("eager", "inductor", "fuseml"), fwd)),
            "forward_backward": dict(zip(("eager", "inductor", "fuseml"), both)),
        }
        moved = 2 * (q.numel() + k.numel()) * q.element_size() + 2 * cos.numel() * cos.element_size()
        print(f"{'ms (median of 50)':28s} {'eager':>8s} {'inductor':>9s} {'fuseml':>8s}")
        for n, t in (("forward (no grad)", fwd), ("forward + backward", both)):
            print(f"{n:28s} {t[0]:8.4f} {t[1]:9.4f} {t[2]:8.4f}")
        print(f"forward: fuseml {moved / fwd[2] / 1e6:.0f} GB/s of the {moved / 1e6:.0f} MB it must move")
    finally:
        stop_daemon(proc)
    res["ok"] = not problems
    with open(os.path.join(out, "device_rope.json"), "w") as f:
        json.dump(res, f, indent=1)
    for p in problems:
        print("FAIL", p)
    print("device_rope:", "ok" if not problems else f"{len(problems)} problems")
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else os.environ.get("OUT", "/tmp/fm-device-out")))
