"""GPU check of column fragments with an M bucket (run on the device machine, not by pytest):
a bf16 MLP block's training step (its bias gradients, grad.sum(0), are column groups) at two
batch sizes, compiled with backend="fuseml" against a real fusemld in GPU mode (tuned kernels
only). The second batch size recompiles with M symbolic, so its column fragments carry
`m_hint` and the tuner times their candidates at that M's bucket:
- every gradient against eager by ||out - ref|| / ||ref|| (<= 1e-2, never NaN);
- every column group served a tuned kernel that ran (FUSEML_ROUTE=kernel unless set);
- the symbolic step's column fragments carried the hint (the batch size at hand).

The daemon: as tests/python/device_bmm.py (FUSEML_SOCKET, else a private fusemld).
Usage: python3 tests/python/device_cols.py OUT_DIR      (writes OUT_DIR/device_cols.json)"""

import json
import os
import sys

from device_bmm import LIMIT, start_daemon, stop_daemon  # noqa: E402  (sets FUSEML_ROUTE)

import torch  # noqa: E402

import fuseml  # noqa: E402
from fuseml import runtime  # noqa: E402
from helpers import rel_err  # noqa: E402
from models import MODELS  # noqa: E402

BATCHES = (4096, 3000)  # the second: M symbolic, bucket 4096


def column_runners(compiler, plan_from):
    ids = {
        id(g.built) for p in compiler.plans[plan_from:] for g in p.groups if g.kind == "columns" and g.built is not None
    }
    return [r for r in list(runtime._registry.values()) if r.built is not None and id(r.built) in ids]


def step(fn, model, x):
    for p in model.parameters():
        p.grad = None
    x = x.detach().requires_grad_(True)
    fn(x).float().square().mean().backward()
    return [x.grad] + [p.grad.clone() for p in model.parameters()]


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    sock, proc = start_daemon(out)
    res = {"device": torch.cuda.get_device_name(), "batches": []}
    ok = True
    try:
        torch.manual_seed(0)
        model = MODELS["mlp"](256, 1024).cuda().to(torch.bfloat16)
        c = fuseml.FuseMLCompiler()
        compiled = torch.compile(model, backend=c)
        for b in BATCHES:
            x = torch.randn(b, 256, device="cuda", dtype=torch.bfloat16)
            n_plans = len(c.plans)
            got = step(compiled, model, x)
            want = step(model, model, x)
            errs = [rel_err(a, w) for a, w in zip(got, want)]
            runners = column_runners(c, n_plans)
            served = [
                {
                    "group": r.name,
                    "state": r.group.state,
                    "use_kernel": r.use_kernel,
                    "m_hint": r.built.wire.get("m_hint"),
                    "m": r.built.wire["inputs"][0]["shape"][0],
                }
                for r in runners
            ]
            problems = [f"gradient {j}: {e}" for j, e in enumerate(errs) if not e <= LIMIT]
            if not runners:
                problems.append("no column group was fused")
            for s in served:
                if s["state"] != "tuned" or not s["use_kernel"]:
                    problems.append(f"{s['group']}: not served a tuned kernel that ran ({s})")
                if s["m"] == -1 and s["m_hint"] != b:
                    problems.append(f"{s['group']}: symbolic M without the hint {b} ({s})")
            rec = {"batch": b, "rel_err": errs, "columns": served, "problems": problems}
            ok = ok and not problems
            res["batches"].append(rec)
            print(json.dumps(rec), flush=True)
    finally:
        stop_daemon(proc)
    res["ok"] = ok
    with open(os.path.join(out, "device_cols.json"), "w") as f:
        json.dump(res, f, indent=1)
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
