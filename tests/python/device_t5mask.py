"""GPU check of the attention-mask vocabulary (run on the device machine, not by pytest):
1. the spellings on CUDA tensors with ±inf, NaN, ±0 and rows all true / all false, compiled
   with fuseml against eager: isneginf/isposinf/isinf/isfinite/isnan, logical and bitwise ops
   on bool, all/any over the last dim, masked_fill by a 0-dim tensor, aten._safe_softmax
   (fp32 and bf16 scores, rows entirely -inf): results exactly eager's for bool results, within
   fp32/bf16 rounding for the softmax, each group served a verified kernel;
2. bench/models' T5 ("t5", small, bf16) forward and one training step: errors against the
   fp32 copy no worse than eager bf16's (x1.25 + 1e-3), the GPU time per step and the ATen ops
   still running with device time (torch.profiler), which must not include the mask path
   (_safe_softmax, _softmax and its backward, isneginf, all); with
   FM_T5_INDUCTOR=1 (default) Inductor's GPU time beside it.
Usage: FUSEML_SOCKET=... FUSEML_NO_AUTOSTART=1 python3 device_t5mask.py OUT_DIR
(FM_T5_DEVICE=cpu FM_T5_SIZE=tiny FUSEML_REQUEST_CPU_GRAPHS=1: the same flow on the CPU, where
fuseml runs eager: a dry run, whose kernel checks fail by design.)"""

import json
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench", "models"))

import fuseml  # noqa: E402
from fuseml import plan_view  # noqa: E402

aten = torch.ops.aten
DEV = torch.device(os.environ.get("FM_T5_DEVICE", "cuda"))  # cpu: a dry run of the flow
SIZE = os.environ.get("FM_T5_SIZE", "small")
INF, NAN = float("inf"), float("nan")
# the mask path's own ops (where and masked_fill also run on T5's int64 bucket and label
# arithmetic, which no fragment holds: they are listed, not checked)
MASK_ATEN = (
    "aten::_safe_softmax",
    "aten::_softmax",
    "aten::_softmax_backward_data",
    "aten::isneginf",
    "aten::all",
    "aten::any",
    "aten::isnan",
    "aten::isinf",
)
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        failures.append(what)


def edge(shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g) * 3
    flat = x.view(-1)
    idx = torch.randperm(flat.numel(), generator=g)[: flat.numel() // 3]
    flat[idx] = torch.tensor([INF, -INF, NAN, 0.0, -0.0, 1.0]).repeat(len(idx) // 6 + 1)[: len(idx)]
    x[0] = -INF  # a row of -inf: all() true, softmax's row zeroed
    x[1] = 0.0  # a row of zeros: all() of its truth false, any() false
    return x.to(DEV)


def step_measure_sync():
    if DEV.type == "cuda":
        torch.cuda.synchronize()


def served(compiler):
    rows = plan_view.groups(compiler)
    return [r for r in rows if r["route"] == "kernel"], rows


def same(got, want):
    if want.dtype == torch.bool:
        return torch.equal(got, want)
    low = want.dtype == torch.bfloat16
    return torch.equal(torch.isnan(got), torch.isnan(want)) and torch.allclose(
        got.float().nan_to_num(), want.float().nan_to_num(), rtol=1e-2 if low else 1e-5, atol=1e-3 if low else 1e-6
    )


def op_checks():
    x, y = edge((64, 96), 1), edge((64, 96), 2)
    bias = torch.randn(1, 96, device=DEV)
    cases = {
        "isneginf | isnan -> where": lambda x, y: torch.where(torch.isneginf(x) | torch.isnan(x), 0.0, x * 2),
        "isposinf, isinf, isfinite": lambda x, y: (torch.isposinf(x) ^ torch.isinf(y)) & torch.isfinite(x + y),
        "logical and/or/not": lambda x, y: torch.logical_and(x, y).logical_or(torch.logical_not(x + 1)),
        "all/any over rows": lambda x, y: torch.cat(
            [(x * 2).isneginf().all(-1, keepdim=True), (y + 1).eq(0).any(-1, keepdim=True)], -1
        ),
        "masked_fill by a 0-dim tensor": lambda x, y: (x * 3).masked_fill(y > 0, torch.tensor(-INF, device=DEV)),
        # a clone's value is its operand's: stored twice, or an input stored as an output
        "clones escaping": lambda x, y: (lambda c: (c, c * 2, (x * 3).clone()))(y.nan_to_num().clone()),
        "safe softmax fp32": lambda x, y: aten._safe_softmax(x.nan_to_num(nan=1.0) + bias, -1),
        "safe softmax bf16 scores": lambda x, y: aten._safe_softmax(
            x.nan_to_num(nan=1.0).to(torch.bfloat16).float() + bias, -1
        ).to(torch.bfloat16),
    }
    out = {}
    for name, f in cases.items():
        torch._dynamo.reset()
        c = fuseml.FuseMLCompiler()
        want = f(x, y)
        got = torch.compile(f, backend=c)(x, y)
        step_measure_sync()
        ok = all(same(a, b) for a, b in zip(got, want)) if isinstance(want, tuple) else same(got, want)
        ks, rows = served(c)
        good = [r for r in ks if r["strategy"].startswith("kernel")]
        check(ok, f"{name}: results as eager's")
        check(
            bool(ks) and len(good) == len(ks),
            f"{name}: every group served a verified kernel " f"({[r['strategy'] for r in rows]})",
        )
        out[name] = {"equal": bool(ok), "groups": [(r["ops"], r["strategy"]) for r in rows]}
    return out


def t5_checks():
    import model_zoo
    import step_measure

    w = model_zoo.build("t5", SIZE, DEV.type)
    ref, ref_inputs = w.fp32_copy()
    params = [p for p in w.model.parameters() if p.requires_grad]
    ref_params = [p for p in ref.parameters() if p.requires_grad]
    res = {}

    def fwd(fn, model=w.model, inputs=w.inputs):
        with torch.no_grad():
            return w.forward(fn, inputs)

    def train(fn, model_params=params, inputs=w.inputs):
        for p in model_params:
            p.grad = None
        loss = w.loss(fn, inputs)
        loss.backward()
        return [loss.detach()] + [p.grad for p in model_params]

    want_f = fwd(ref, inputs=ref_inputs)
    want_t = train(ref, ref_params, ref_inputs)
    eager_f, eager_t = fwd(w.model), train(w.model)
    err = {
        "eager_fwd": step_measure.rel_err([eager_f], [want_f]),
        "eager_grads": step_measure.rel_err(eager_t[1:], want_t[1:]),
    }
    modes = [("fuseml", lambda: torch.compile(w.model, backend=fuseml.FuseMLCompiler()))]
    if os.environ.get("FM_T5_INDUCTOR", "1") == "1":
        modes.append(("inductor", lambda: torch.compile(w.model)))
    for mode, make in modes:
        torch._dynamo.reset()
        fn = make()
        t0 = time.monotonic()
        got_f = fwd(fn)
        step_measure_sync()
        err[f"{mode}_fwd"] = step_measure.rel_err([got_f], [want_f])
        res[f"{mode}_fwd_first_s"] = time.monotonic() - t0
        res[f"{mode}_fwd"] = step_measure.profile(lambda: fwd(fn), DEV)
        torch._dynamo.reset()
        fn = make()
        got_t = train(fn)
        err[f"{mode}_grads"] = step_measure.rel_err(got_t[1:], want_t[1:])
        res[f"{mode}_train"] = step_measure.profile(lambda: train(fn), DEV)
    res["errors"] = err
    for phase in ("fwd", "grads"):
        check(
            err[f"fuseml_{phase}"] <= 1.25 * err[f"eager_{phase}"] + 1e-3,
            f"T5 {phase}: fuseml error {err[f'fuseml_{phase}']:.4g} against eager bf16's {err[f'eager_{phase}']:.4g}",
        )
    for phase in ("fwd", "train"):
        p = res[f"fuseml_{phase}"]
        left = [o for o in p["aten_ops"] if o["op"] in MASK_ATEN]
        check(not left, f"T5 {phase}: no mask-path ATen op with device time ({left})")
        if p["gpu_ms"] is not None:
            line = f"T5 {phase}: fuseml {p['gpu_ms']:.3f} ms GPU, {p['kernels']:.0f} kernels"
            if f"inductor_{phase}" in res:
                q = res[f"inductor_{phase}"]
                line += f"; Inductor {q['gpu_ms']:.3f} ms, {q['kernels']:.0f} kernels"
            print(line)
        print(
            "  ATen ops left:", ", ".join(f"{o['op']} x{o['calls']:.0f} {o['ms']:.3f} ms" for o in p["aten_ops"][:12])
        )
    return res


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else "."
    os.makedirs(out_dir, exist_ok=True)
    result = {"device": torch.cuda.get_device_name() if DEV.type == "cuda" else "cpu", "torch": torch.__version__}
    result["ops"] = op_checks()
    result["t5"] = t5_checks()
    result["failures"] = failures
    with open(os.path.join(out_dir, "device_t5mask.json"), "w") as f:
        json.dump(result, f, indent=1, default=str)
    print("device_t5mask:", "ok" if not failures else f"{len(failures)} FAILED")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
