"""GPU check of cuBLASLt plans through the Python client (run on the device machine, not by
pytest), against a fusemld started with `--tune-only cublaslt`, so every GEMM group is served
a plan: the reference models in bf16, inference and a training step against eager (relative
errors), with the kernels forced on (FUSEML_ROUTE=kernel) so the plans really run, every
served GEMM kernel of kind "cublaslt" (both forms seen), a second batch size served by the
same plan (libfusemld re-checks the algorithm at the new M), and the MLP block under
mode="reduce-overhead" (each plan's scratch comes from torch's allocator inside the capture).
Usage: FUSEML_SOCKET=... FUSEML_LIB=... FUSEML_ROUTE=kernel python3 device_blas.py OUT.json"""

import json
import sys

import torch

from helpers import rel_err
from models import MODELS

import fuseml
from fuseml import runtime


def served_kinds():
    kinds = {}
    for r in list(runtime._registry.values()):
        if r.kernel is not None and r.group.kind == "gemm":
            meta = r.kernel[3]
            form = meta.get("blas", {}).get("form") if meta.get("kind") == "cublaslt" else None
            kinds[r.name] = (meta.get("kind"), form)
    return kinds


def check(name, m, d, di, train, mode=None):
    torch.manual_seed(0)
    model = MODELS[name](d, di).cuda().to(torch.bfloat16)
    params = list(model.parameters())
    compiled = (
        torch.compile(model, backend=fuseml.FuseMLCompiler(), mode=mode)
        if mode
        else torch.compile(model, backend=fuseml.FuseMLCompiler())
    )
    out = {"model": name, "train": train, "M": m, "mode": mode, "errors": {}}
    for rows in (m, m // 2 + 3):  # the second M: a new batch size, the same plans
        x = torch.randn(rows, d, device="cuda", dtype=torch.bfloat16)

        def step(fn):
            for p in params:
                p.grad = None
            if not train:
                with torch.no_grad():
                    return [fn(x).clone()]
            xi = x.detach().requires_grad_(True)
            y = fn(xi)
            y.float().square().mean().backward()
            return [y.detach()] + [p.grad for p in params] + [xi.grad]

        before = runtime.counters["launches"]
        for _ in range(3 if mode else 1):  # graphs: warm-up, record, replay
            got = step(compiled)
        torch.cuda.synchronize()
        want = step(model)
        out["errors"][rows] = max(rel_err(a, b) for a, b in zip(got, want))
        out.setdefault("launches", {})[rows] = runtime.counters["launches"] - before
    return out


def main():
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": []}
    cases = [
        ("mlp", 2048, 1024, 4096, False, None),
        ("mlp", 2048, 1024, 4096, True, None),
        ("activation_heavy", 4096, 256, 1024, True, None),
        ("llama_mlp", 512, 1024, 2816, True, None),
        ("mlp", 1024, 512, 2048, False, "reduce-overhead"),
    ]
    ok = True
    for case in cases:
        try:
            row = check(*case)
        except Exception as e:  # report and go on
            row = {"model": case[0], "error": f"{type(e).__name__}: {e}"}
            ok = False
        print(json.dumps(row), flush=True)
        res["rows"].append(row)
        errs = row.get("errors", {})
        if not errs or any(not (0 < e <= 2e-2) for e in errs.values()):
            ok = False
    kinds = served_kinds()
    res["served"] = {k: list(v) for k, v in kinds.items()}
    forms = {v[1] for v in kinds.values()}
    print(
        json.dumps(
            {
                "served_gemm_kernels": len(kinds),
                "kinds": sorted({v[0] for v in kinds.values()}),
                "forms": sorted(f for f in forms if f),
            }
        )
    )
    if not kinds or any(v[0] != "cublaslt" for v in kinds.values()) or not {"direct", "split"} <= forms:
        ok = False
    res["ok"] = ok
    with open(sys.argv[1], "w") as f:
        json.dump(res, f, indent=1)
    print("device_blas:", "PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
