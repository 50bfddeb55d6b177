"""GPU check of sibling GEMM groups (run on the device machine, not by pytest): Llama-style MLP
blocks down(act(gate(x)) * up(x)) — SwiGLU and GeGLU (tanh and erf), with and without biases —
in bf16 and fp16, compiled with backend="fuseml" against a real fusemld in GPU mode (tuned
kernels only), each at two batch sizes in one M bucket:
- outputs against an fp32 copy of the model by ||out - ref|| / ||ref|| (NaN fails; the limit
  is 1e-2, or no worse than 1.5x eager's own error against fp32 + 1e-3; bf16 lands around
  1e-3..1e-2), with eager's error for scale; one training case's gradients (x and every
  weight) after backward, judged the same way;
- the gate/up pair found as ONE sibling group and served a tuned generated kernel that ran
  (FUSEML_ROUTE=kernel unless set: the comparison must be of the kernel, not of ATen chosen
  by measured routing), never bypassed or eager;
- the second batch size (a static recompile, the same M bucket) served from the store: the
  sibling group comes back with origin "hit";
- eager and fuseml step times at M = 2048, d_model = 1024, d_ff = 4096, bf16 (SwiGLU, no
  bias, inference): CUDA events around each step, each step synchronised, the median of 40
  after a warm-up, the two interleaved (order alternating), inputs rotated over 4 buffers.

The daemon: FUSEML_SOCKET if one answers there (bench/device/siblings starts one), else a
private fusemld started here from FUSEMLD_BIN or build-gpu/ or build/ (device_bmm.py's helper).
FM_SIBLINGS_DEVICE=cpu: a dry run of this script's own logic without a GPU (every group then
runs eagerly and the checks that want kernels fail, as they should).
Usage: python3 tests/python/device_siblings.py OUT_DIR   (writes OUT_DIR/device_siblings.json)"""

import copy
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
os.environ.setdefault("FUSEML_ROUTE", "kernel")

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

try:
    import fuseml  # noqa: E402
except ImportError:  # not installed: the source tree (the ctypes launch path)
    sys.path.insert(0, os.path.join(ROOT, "client", "python"))
    import fuseml  # noqa: E402
from fuseml import runtime, transport  # noqa: E402
from device_bmm import daemon_stats, start_daemon, stop_daemon  # noqa: E402
from helpers import rel_err  # noqa: E402

LIMIT = 1e-2
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
DEVICE = os.environ.get("FM_SIBLINGS_DEVICE", "cuda")
D_MODEL, D_FF, SEQ = 512, 1408, 128
BATCHES = (4, 3)  # M = 512 and 384: one M bucket (512)
TIME_SHAPE = (4, 512, 1024, 4096)  # B, S, d_model, d_ff: M = 2048


class GLU(nn.Module):
    """down(act(gate(x)) * up(x)): act "silu" (SwiGLU, Llama), "gelu" (erf) or "gelu_tanh"."""

    def __init__(self, act, bias, d, ff):
        super().__init__()
        self.act = act
        self.gate_proj = nn.Linear(d, ff, bias=bias)
        self.up_proj = nn.Linear(d, ff, bias=bias)
        self.down_proj = nn.Linear(ff, d, bias=bias)

    def forward(self, x):
        g = self.gate_proj(x)
        g = F.silu(g) if self.act == "silu" else F.gelu(g, approximate="tanh" if self.act == "gelu_tanh" else "none")
        return self.down_proj(g * self.up_proj(x))


# (name, act, bias, train)
CASES = [
    ("swiglu", "silu", False, False),
    ("swiglu_bias", "silu", True, False),
    ("geglu_tanh", "gelu_tanh", False, False),
    ("geglu_bias", "gelu", True, False),
]
TRAIN_CASE = ("swiglu_train", "silu", False, True)  # bf16 only: gradients after backward


def _sync():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def make_model(act, bias, dtype, d=D_MODEL, ff=D_FF):
    """The model in `dtype` and an fp32 copy of the same (rounded) weights: the reference."""
    torch.manual_seed(0)
    model = GLU(act, bias, d, ff).to(DEVICE, dtype)
    return model, copy.deepcopy(model).float()


def run_step(fn, model, x, train):
    """[output] without autograd; [output, dx, d(each weight)] of a training step."""
    if not train:
        with torch.no_grad():
            return [fn(x)]
    model.zero_grad(set_to_none=True)
    xi = x.detach().requires_grad_(True)
    y = fn(xi)
    y.float().square().mean().backward()
    return [y.detach(), xi.grad] + [p.grad for p in model.parameters()]


def sibling_runners(compiler, plan_from):
    """(group, runner) of each sibling group in compiler.plans[plan_from:]."""
    runners = {id(r.built): r for r in list(runtime._registry.values()) if r.built is not None}
    return [
        (g, runners.get(id(g.built)))
        for p in compiler.plans[plan_from:]
        for g in p.groups
        if getattr(g, "siblings", False)
    ]


def served_record(g, r):
    meta = r.kernel[3] if r is not None and r.kernel else {}
    return {
        "group": g.describe(),
        "key": (g.key or "")[:16],
        "state": g.state,
        "origin": g.origin,
        "route": g.route,
        "reason": g.reason,
        "kind": meta.get("kind"),
        "entry": meta.get("entry"),
        "use_kernel": r.use_kernel if r is not None else None,
        "why_eager": r.why_eager[0] if r is not None and r.why_eager else None,
    }


def judge(errs, f32, e32, names):
    """Problems with the errors: NaN, or above LIMIT and worse than eager's own (x1.5)."""
    out = []
    for name, err, f, e in zip(names, errs, f32, e32):
        if not (f == f and (f <= LIMIT or f <= 1.5 * e + 1e-3)):  # f == f: NaN never passes
            out.append(f"{name}: {f:.3g} from fp32 (eager's own {e:.3g}; {err:.3g} from eager)")
    return out


def check_case(name, act, bias, dtype_name, train, sock):
    dtype = DTYPES[dtype_name]
    torch._dynamo.reset()
    model, ref = make_model(act, bias, dtype)
    c = fuseml.FuseMLCompiler()
    # static shapes: each batch size compiles its own graph (the GEMM groups see through the
    # [B*S, N] -> [B, S, N] view only with static leading dims), the fragment's M is symbolic
    # with m_hint, so the second size in the bucket is a store hit
    compiled = torch.compile(model, backend=c, dynamic=False)
    names = ["output"] + (["dx"] + [f"d{n}" for n, _ in model.named_parameters()] if train else [])
    row = {"case": name, "act": act, "bias": bias, "dtype": dtype_name, "train": train, "batches": []}
    ok = True
    for i, b in enumerate(BATCHES):
        x = torch.randn(b, SEQ, D_MODEL, device=DEVICE, dtype=dtype)
        n_plans = len(c.plans)
        compiles0 = daemon_stats(sock).get("session", {}).get("compiles")
        launches0 = runtime.counters["launches"]
        got = run_step(compiled, model, x, train)
        _sync()
        launched = runtime.counters["launches"] - launches0
        compiles1 = daemon_stats(sock).get("session", {}).get("compiles")
        want = run_step(model, model, x, train)
        ref32 = run_step(ref, ref, x.float(), train)
        errs = [rel_err(a, w) for a, w in zip(got, want)]
        f32 = [rel_err(a, r) for a, r in zip(got, ref32)]
        e32 = [rel_err(w, r) for w, r in zip(want, ref32)]
        sibs = sibling_runners(c, n_plans)
        served = [served_record(g, r) for g, r in sibs]
        rec = {
            "batch": b,
            "M": b * SEQ,
            "rel_err_vs_eager": errs,
            "fuseml_vs_fp32": f32,
            "eager_vs_fp32": e32,
            "launches": launched,
            "daemon_compiles": (compiles1 - compiles0) if None not in (compiles0, compiles1) else None,
            "siblings": served,
            "groups": [
                f"{p.which}: {g.describe()}"
                for p in c.plans[n_plans:]
                for g in p.groups
                if g.route == "kernel" or g.kind == "gemm"
            ],
        }
        problems = judge(errs, f32, e32, names)
        if len(served) != 1:  # the forward (or inference) graph's; backward has none
            problems.append(f"{len(served)} sibling groups found, want 1 (gate/up + act + mul)")
        for s in served:
            if s["route"] != "kernel" or s["state"] != "tuned" or s["why_eager"] or not s["use_kernel"]:
                problems.append(f"sibling group not served a tuned kernel that ran: {s}")
            elif s["kind"] != "gemm":
                problems.append(f"sibling group served a {s['kind']} kernel, want a generated gemm")
            if i > 0 and s["origin"] != "hit":
                problems.append(f"second batch size compiled anew (origin {s['origin']})")
        if launched == 0:
            problems.append("nothing launched")
        rec["problems"] = problems
        ok = ok and not problems
        row["batches"].append(rec)
    row["ok"] = ok
    return row


def timed_steps(fns, steps=40, warmup=5, rotate=()):
    """Median ms of each fn(x): CUDA events around each step, every step synchronised, the fns
    interleaved with the order alternating; x taken in turn from `rotate`."""
    for fn in fns:
        for k in range(warmup):
            fn(rotate[k % len(rotate)])
    torch.cuda.synchronize()
    times = [[] for _ in fns]
    for s in range(steps):
        order = range(len(fns)) if s % 2 == 0 else reversed(range(len(fns)))
        for i in order:
            x = rotate[s % len(rotate)]
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            fns[i](x)
            end.record()
            torch.cuda.synchronize()
            times[i].append(start.elapsed_time(end))
    return [sorted(t)[len(t) // 2] for t in times], [(min(t), max(t)) for t in times]


def time_medium():
    """Eager vs fuseml at the medium shape, inference, bf16 SwiGLU without biases."""
    b, s, d, ff = TIME_SHAPE
    torch._dynamo.reset()
    model, _ = make_model("silu", False, torch.bfloat16, d, ff)
    c = fuseml.FuseMLCompiler()
    compiled = torch.compile(model, backend=c, dynamic=False)
    xs = [torch.randn(b, s, d, device=DEVICE, dtype=torch.bfloat16) for _ in range(4)]
    with torch.no_grad():
        compiled(xs[0])  # compile, tune, route
        _sync()
        served = [served_record(g, r) for g, r in sibling_runners(c, 0)]
        rec = {
            "shape": {"M": b * s, "d_model": d, "d_ff": ff, "dtype": "bf16"},
            "siblings": served,
            "groups": [g.describe() for p in c.plans for g in p.groups],
        }
        problems = []
        if len(served) != 1 or any(x["state"] != "tuned" or not x["use_kernel"] for x in served):
            problems.append(f"the sibling group did not run a tuned kernel: {served}")
        if DEVICE == "cuda":
            (e_ms, f_ms), spread = timed_steps([lambda x: model(x), lambda x: compiled(x)], rotate=xs)
            flops = 2 * b * s * d * ff * 3  # gate, up, down
            rec.update(
                eager_ms=e_ms,
                fuseml_ms=f_ms,
                speedup=e_ms / f_ms,
                eager_tflops=flops / e_ms / 1e9,
                fuseml_tflops=flops / f_ms / 1e9,
                eager_min_max_ms=spread[0],
                fuseml_min_max_ms=spread[1],
            )
            print(
                f"timing M={b * s} d_model={d} d_ff={ff} bf16: eager {e_ms:.4f} ms, "
                f"fuseml {f_ms:.4f} ms ({e_ms / f_ms:.2f}x)",
                flush=True,
            )
    rec["problems"] = problems
    rec["ok"] = not problems
    return rec


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    res = {
        "device": torch.cuda.get_device_name() if DEVICE == "cuda" else DEVICE,
        "torch": torch.__version__,
        "route": os.environ.get("FUSEML_ROUTE"),
        "rows": [],
    }
    sock, proc = start_daemon(out)
    ok = True
    try:
        res["hello"] = {
            k: v
            for k, v in transport.connect(sock, timeout=10).hello.items()
            if k in ("version", "mode", "device", "vocab", "codegen")
        }
        if res["hello"].get("mode") != "gpu":
            ok = False
            res["error"] = f"fusemld is in {res['hello'].get('mode')} mode: kernels are not tuned"
        runs = [(case, dt) for case in CASES for dt in DTYPES] + [(TRAIN_CASE, "bf16")]
        for (name, act, bias, train), dtype_name in runs:
            try:
                row = check_case(name, act, bias, dtype_name, train, sock)
            except Exception as e:  # report and go on: one case must not hide the others
                row = {
                    "case": name,
                    "dtype": dtype_name,
                    "train": train,
                    "ok": False,
                    "error": f"{type(e).__name__}: {e}",
                }
            ok = ok and row["ok"]
            res["rows"].append(row)
            print(json.dumps(row), flush=True)
        try:
            res["timing"] = time_medium()
        except Exception as e:
            res["timing"] = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        ok = ok and res["timing"]["ok"]
        print(json.dumps(res["timing"]), flush=True)
        res["stats_end"] = daemon_stats(sock).get("session")
    finally:
        stop_daemon(proc)
    res["counters"] = dict(runtime.counters)
    res["ok"] = ok
    with open(os.path.join(out, "device_siblings.json"), "w") as f:
        json.dump(res, f, indent=1)
    print("device_siblings:", "PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
