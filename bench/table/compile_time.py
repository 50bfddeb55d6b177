"""Child process of table.py: the fuseml compile time of each row, measured in a fresh Python
process: torch.compile(model, backend=FuseMLCompiler(socket=the row's daemon)) up to the end
of the first step (Dynamo, aot_autograd, partitioning, the daemon's compile and tune, module
load, the step itself). table.py runs it twice: on empty daemon caches (cold), then again on
the filled ones (warm). Process-wide one-time costs (importing torch, Dynamo's first use) are
paid first by a throwaway compile of a tiny model against no daemon, so they do not land on
the first row.

    python3 compile_time.py SPEC.json OUT.json     (SPEC: {"device", "rows": [{workload,
                                                    preset, M, d_model, d_intermediate, socket}]})"""

import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import workloads as W  # noqa: E402
import fuseml  # noqa: E402


def one(row, dev, socket):
    torch._dynamo.reset()
    model = W.make_model(row["workload"], row["d_model"], row["d_intermediate"], dev, torch.bfloat16)
    xs, gy = W.make_inputs(row["workload"], row["M"], row["d_model"], dev, torch.bfloat16, 1)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    t0 = time.perf_counter()
    compiled = torch.compile(model, backend=fuseml.FuseMLCompiler(socket=socket))
    W.make_step(row["workload"], compiled, model, gy)(xs[0])
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    return time.perf_counter() - t0


def main():
    spec = json.load(open(sys.argv[1]))
    dev = torch.device(spec["device"])
    os.environ["FUSEML_NO_AUTOSTART"] = "1"
    warm = {"workload": "mlp", "M": 8, "d_model": 16, "d_intermediate": 32}
    try:
        one(warm, dev, os.path.join(os.path.dirname(sys.argv[2]), "no-daemon.sock"))
    except Exception as e:  # the rows below say for themselves whether they compile
        print(f"compile_time: warm-up compile failed: {e!r}", file=sys.stderr)
    out = []
    for row in spec["rows"]:
        try:
            out.append({"workload": row["workload"], "preset": row["preset"], "s": one(row, dev, row["socket"])})
        except Exception as e:  # one row must not hide the others
            out.append({"workload": row["workload"], "preset": row["preset"], "s": None, "error": repr(e)[:300]})
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    with open(sys.argv[2], "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
