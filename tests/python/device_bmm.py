"""GPU check of batched GEMM groups (run on the device machine, not by pytest): attention scores
((q @ k^T) * scale + mask in fp32, and a causal masked_fill form: under a softmax the
epilogue would run in the softmax's rows group, the product on cuBLAS) and bmm + bias + GELU,
in bf16 and fp16, compiled with backend="fuseml" against a real fusemld in GPU mode (tuned
kernels only), each at two batch sizes in one M bucket:
- outputs against eager by ||out - ref|| / ||ref|| (NaN fails; the limit is 1e-2, bf16
  lands around 1e-3..1e-2), with the errors of eager and of fuseml against fp32 for scale;
  one training case's gradients (where two bf16 runs can differ by
  ~1e-2) pass within 1e-2 of eager or no worse than 1.5x eager's own error against fp32;
- every bmm group served a tuned kernel and launched (FUSEML_ROUTE=kernel unless set: the
  comparison must be of the kernel, not of ATen chosen by measured routing);
- the second batch size (a recompile with the batch symbolic) served from the store: its bmm
  groups come back with origin "hit" and the daemon's compile count is reported;
- eager and fuseml step times (CUDA events, medians, interleaved), for information.

The daemon: FUSEML_SOCKET if one answers there (bench/device/python starts one), else a
private fusemld started here from FUSEMLD_BIN or build-gpu/ or build/ (with its tuner worker
and libfusemld beside it), its log in OUT.
Usage: python3 tests/python/device_bmm.py OUT_DIR      (writes OUT_DIR/device_bmm.json)"""

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
os.environ.setdefault("FUSEML_ROUTE", "kernel")

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

try:
    import fuseml  # noqa: E402
except ImportError:  # not installed: the source tree (the ctypes launch path)
    sys.path.insert(0, os.path.join(ROOT, "client", "python"))
    import fuseml  # noqa: E402
from fuseml import runtime, transport  # noqa: E402
from helpers import median_ms, rel_err  # noqa: E402

LIMIT = 1e-2
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
# FM_BMM_DEVICE=cpu: a dry run of this script's own logic on a machine without a GPU (every
# group then runs eagerly and the checks that want kernels fail, as they should)
DEVICE = os.environ.get("FM_BMM_DEVICE", "cuda")


def _sync():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


# -- models -------------------------------------------------------------------------------


class Scores(nn.Module):
    """(q @ k^T) * scale + mask in fp32 on [B, H, S, D], the mask [1, 1, S, S]."""

    def forward(self, q, k, mask):
        s = (q @ k.transpose(-2, -1)) * (1 / math.sqrt(q.shape[-1])) + mask
        return s.float()


class CausalScores(nn.Module):
    """masked_fill((q @ k^T) / sqrt(d), future, -1e4) in fp32 (a finite fill: the error
    measure compares finite values)."""

    def forward(self, q, k, future):
        s = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
        return s.masked_fill(future, -1e4).float()


class BmmBiasGelu(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.b = nn.Parameter(torch.randn(n) * 0.1)

    def forward(self, x, w):
        return torch.nn.functional.gelu(torch.bmm(x, w) + self.b)


def attention_inputs(b, dtype, h=16, s=512, d=64, causal=False):
    q = torch.randn(b, h, s, d, device=DEVICE, dtype=dtype)
    k = torch.randn(b, h, s, d, device=DEVICE, dtype=dtype)
    if causal:
        m = torch.ones(s, s, device=DEVICE, dtype=torch.bool).triu(1)
    else:
        m = (torch.randn(1, 1, s, s, device=DEVICE) * 0.5).to(dtype)
    return [q, k, m]


def bmm_inputs(b, dtype, m=256, k=512, n=1024):
    x = torch.randn(b, m, k, device=DEVICE, dtype=dtype)
    w = torch.randn(b, k, n, device=DEVICE, dtype=dtype) / math.sqrt(k)
    return [x, w]


# (name, model factory, inputs(batch, dtype), the two batch sizes: one M bucket of B*H / Bt)
CASES = [
    ("attention_scores", Scores, attention_inputs, (4, 3)),  # 64, 48
    ("causal_scores", CausalScores, lambda b, dt: attention_inputs(b, dt, causal=True), (4, 3)),
    ("bmm_bias_gelu", lambda: BmmBiasGelu(1024), bmm_inputs, (32, 24)),
]


# -- the daemon ---------------------------------------------------------------------------


def _answers(path):
    try:
        transport.connect(path, timeout=5).close()
        return True
    except (transport.DaemonError, OSError):
        return False


def start_daemon(out):
    """(socket, process or None): the daemon at FUSEML_SOCKET, else a private one."""
    sock = os.environ.get("FUSEML_SOCKET")
    if sock and _answers(sock):
        return sock, None
    exe = os.environ.get("FUSEMLD_BIN")
    for build in ("build-gpu", "build"):
        cand = os.path.join(ROOT, build, "daemon", "fusemld")
        if not exe and os.path.exists(cand):
            exe = cand
    if not exe:
        raise RuntimeError("no fusemld: set FUSEML_SOCKET or FUSEMLD_BIN (or build build-gpu/)")
    tmp = tempfile.mkdtemp(prefix="fm-bmm-")
    sock = os.path.join(tmp, "fm.sock")
    log = open(os.path.join(out, "fusemld.log"), "ab")
    proc = subprocess.Popen(
        [
            exe,
            "--foreground",
            "--socket",
            sock,
            "--db",
            os.path.join(tmp, "kernels.db"),
            "--log-level",
            "info",
            "--tune",
            "eager",
        ],  # every kernel tuned in its first reply
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 30
    while not _answers(sock):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"fusemld did not start (see {log.name})")
        time.sleep(0.1)
    os.environ["FUSEML_SOCKET"] = sock
    os.environ["FUSEML_DAEMON"] = exe  # libfusemld is found beside it
    lib = os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(exe))), "client", "libfusemld.so")
    if "FUSEML_LIB" not in os.environ and os.path.exists(lib):
        os.environ["FUSEML_LIB"] = lib
    proc.tmp = tmp
    return sock, proc


def stop_daemon(proc):
    if proc is None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    shutil.rmtree(proc.tmp, ignore_errors=True)


def daemon_stats(sock):
    conn = transport.connect(sock, timeout=30)
    try:
        return conn.call({"op": "stats"})
    finally:
        conn.close()


# -- one case -----------------------------------------------------------------------------


def bmm_runners(compiler, plan_from):
    """The runners of the batched GEMM groups in compiler.plans[plan_from:]."""
    ids = {
        id(g.built)
        for p in compiler.plans[plan_from:]
        for g in p.groups
        if g.kind == "gemm" and g.built is not None and g.built.wire.get("vocab") == 4
    }
    return [r for r in list(runtime._registry.values()) if r.built is not None and id(r.built) in ids]


def _fp32(x):
    return x.float() if x.is_floating_point() else x  # a bool mask stays bool


def run_step(fn, model, xs, train):
    """[output] without autograd; [output, dq, dk] (or dx, dw) of a training step. `model`
    holds the parameters whose gradients are reset (None: fn is a fresh copy)."""
    if not train:
        with torch.no_grad():
            return [fn(*xs)]
    if model is not None:
        model.zero_grad(set_to_none=True)
    leaves = [x.detach().requires_grad_(True) if x.is_floating_point() else x for x in xs]
    y = fn(*leaves)
    y.float().square().mean().backward()
    return [y.detach()] + [x.grad for x in leaves[:2]]


def check_case(name, factory, make_inputs, batches, dtype_name, sock, train=False):
    dtype = DTYPES[dtype_name]
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = factory().to(DEVICE, dtype)
    c = fuseml.FuseMLCompiler()
    compiled = torch.compile(model, backend=c)
    row = {"case": name, "dtype": dtype_name, "train": train, "batches": []}
    ok = True
    for i, b in enumerate(batches):
        xs = make_inputs(b, dtype)
        n_plans = len(c.plans)
        compiles0 = daemon_stats(sock).get("session", {}).get("compiles")
        launches0 = runtime.counters["launches"]
        got = run_step(compiled, model, xs, train)
        _sync()
        launched = runtime.counters["launches"] - launches0
        compiles1 = daemon_stats(sock).get("session", {}).get("compiles")
        want = run_step(model, model, xs, train)
        ref32 = run_step(_float_copy(factory, model), None, [_fp32(x) for x in xs], train)
        errs = [rel_err(a, b) for a, b in zip(got, want)]
        fuseml32 = [rel_err(a, r) for a, r in zip(got, ref32)]
        eager32 = [rel_err(a, r) for a, r in zip(want, ref32)]
        runners = bmm_runners(c, n_plans)
        served = [
            {
                "group": r.name,
                "key": (r.group.key or "")[:16],
                "state": r.group.state,
                "origin": r.group.origin,
                "use_kernel": r.use_kernel,
                "kind": r.kernel[3].get("kind") if r.kernel else None,
                "grid": (r.kernel[3].get("grid") or {}).get("rule") if r.kernel else None,
                "why_eager": r.why_eager[0] if r.why_eager else None,
            }
            for r in runners
        ]
        rec = {
            "batch": b,
            "rel_err": errs,
            "launches": launched,
            "daemon_compiles": (compiles1 - compiles0) if None not in (compiles0, compiles1) else None,
            "bmm_groups": served,
            "groups": [
                g.describe() for p in c.plans[n_plans:] for g in p.groups if g.route == "kernel" or g.kind == "gemm"
            ],
        }
        rec["fuseml_vs_fp32"], rec["eager_vs_fp32"] = fuseml32, eager32
        problems = []
        if not (errs[0] == errs[0] and errs[0] <= LIMIT):  # e == e: NaN never passes
            problems.append(f"output: relative error {errs[0]} against eager above {LIMIT} or NaN")
        # Gradients in bf16 can differ between any two bf16 runs by
        # ~1e-2 (cancellation), so they are judged against fp32: no worse than eager's own.
        for j in range(1, len(errs)):
            f32, e32 = fuseml32[j], eager32[j]
            if not (f32 == f32 and (errs[j] <= LIMIT or f32 <= 1.5 * e32 + 1e-3)):
                problems.append(f"gradient {j}: {errs[j]} from eager, {f32} from fp32 " f"(eager's own: {e32})")
        if not runners:
            problems.append("no bmm group was fused")
        for s in served:
            if s["state"] != "tuned" or s["why_eager"] or not s["use_kernel"]:
                problems.append(f"{s['group']}: not served a tuned kernel that ran ({s})")
            if i > 0 and s["origin"] != "hit":
                problems.append(f"{s['group']}: second batch size compiled anew (origin {s['origin']})")
        if launched == 0:
            problems.append("nothing launched")
        if not train and not problems and DEVICE == "cuda":
            with torch.no_grad():
                e_ms, f_ms = median_ms([lambda: model(*xs), lambda: compiled(*xs)])
            rec.update(eager_ms=e_ms, fuseml_ms=f_ms, speedup=e_ms / f_ms)
        rec["problems"] = problems
        ok = ok and not problems
        row["batches"].append(rec)
    row["ok"] = ok
    return row


def _float_copy(factory, model):
    """The model's parameters in fp32, for the fp32 reference."""
    torch.manual_seed(0)
    m = factory().to(DEVICE)
    m.load_state_dict({k: v.float() for k, v in model.state_dict().items()})
    return m


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
        for name, factory, make_inputs, batches in CASES:
            for dtype_name in DTYPES:
                for train in (False, True) if name == "attention_scores" and dtype_name == "bf16" else (False,):
                    try:
                        row = check_case(name, factory, make_inputs, batches, dtype_name, sock, train)
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
        res["stats_end"] = daemon_stats(sock).get("session")
    finally:
        stop_daemon(proc)
    res["counters"] = dict(runtime.counters)
    res["ok"] = ok
    with open(os.path.join(out, "device_bmm.json"), "w") as f:
        json.dump(res, f, indent=1)
    print("device_bmm:", "PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
