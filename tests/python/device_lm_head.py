"""GPU check of a language model's head and loss walked in column blocks (linear_cross_entropy.py;
run on the device machine by bench/device/cross-entropy/run, not by pytest): a Llama decoder's
last RMSNorm, its head over 32000 words and Hugging Face's loss, 4 x 1024 tokens of width 2048,
bf16, one training step compiled with torch.compile(backend=FuseMLCompiler(logits=...)) against
a real fusemld in GPU mode (tuned kernels only), logits saved ("blocks") and recomputed:
- the loss and the gradients of the hidden states, the norm's weight and the head's weight
  against an fp32 eager copy: ||got - fp32|| / ||fp32|| no worse than eager bf16's own error
  (x 1.25 + 1e-3), NaN never;
- every group routed to a kernel served tuned; a group the daemon refused is listed with
  `fusectl show` of its key (why each candidate failed);
- peak memory of the step above the model and its inputs, and GPU time (CUDA events, median
  of 20, interleaved), against eager and Inductor.
Usage: python3 tests/python/device_lm_head.py OUT_DIR   (writes OUT_DIR/device_lm_head.json)"""

import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

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
BATCH, SEQ, WIDTH, VOCAB = 4, 1024, 2048, 32000


class Head(torch.nn.Module):
    """A Llama decoder's end: RMSNorm (fp32 inside), the head, Hugging Face's causal-LM loss;
    the logits returned beside the loss, as transformers does."""

    def __init__(self):
        super().__init__()
        self.norm = torch.nn.Parameter(torch.ones(WIDTH) + 0.1 * torch.randn(WIDTH))
        self.lm_head = torch.nn.Linear(WIDTH, VOCAB, bias=False)

    def forward(self, x, labels):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        logits = self.lm_head(self.norm * h.to(x.dtype))
        labels = F.pad(labels, (0, 1), value=-100)[..., 1:].contiguous()
        loss = F.cross_entropy(logits.float().view(-1, VOCAB), labels.view(-1), ignore_index=-100)
        return loss, logits


def inputs():
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(BATCH, SEQ, WIDTH, device="cuda", generator=g).to(torch.bfloat16)
    labels = torch.randint(0, VOCAB, (BATCH, SEQ), device="cuda", generator=g)
    labels[:, ::29] = -100  # padding, ignored
    return x, labels


def step(model, fn, x, labels):
    """(loss, dx, the parameters' gradients) of one training step; the logits dropped as a
    trainer that reads only the loss drops them."""
    model.zero_grad(set_to_none=True)
    xi = x.detach().requires_grad_(True)
    loss = fn(xi, labels)[0]
    loss.backward()
    return [loss.detach(), xi.grad] + [p.grad for p in model.parameters()]


def peak_gb(model, fn, x, labels):
    """Peak memory of a step above what is held before it (model, inputs), GB."""
    step(model, fn, x, labels)
    model.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step(model, fn, x, labels)
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 1e9


def refused(c, sock):
    """`fusectl show` of each kernel group the daemon did not serve tuned."""
    fusectl = os.path.join(ROOT, "build-gpu", "client", "fusectl")
    out = []
    for p in c.plans:
        for g in p.groups:
            if g.route == "kernel" and g.state == "tuned":
                continue
            if not g.key and g.route != "kernel" and "refused" not in str(g.reason):
                continue
            show = ""
            if g.key and os.path.exists(fusectl):
                show = subprocess.run([fusectl, "--socket", sock, "show", g.key], capture_output=True, text=True).stdout
            out.append(f"{p.which}: {g.describe()} state={g.state} reason={g.reason}\n{show}")
    return out


def main(out):
    os.makedirs(out, exist_ok=True)
    sock, proc = start_daemon(out)
    res = {"device": torch.cuda.get_device_name(), "problems": []}
    problems = res["problems"]
    try:
        torch.manual_seed(0)
        model = Head().cuda().to(torch.bfloat16)
        exact = Head().cuda()
        exact.load_state_dict({k: v.float() for k, v in model.state_dict().items()})
        x, labels = inputs()
        want = step(model, model, x, labels)
        ref = step(exact, exact, x.float(), labels)
        fns = {"eager": model, "inductor": torch.compile(model)}
        for mode in ("blocks", "recompute"):
            torch._dynamo.reset()
            c = fuseml.FuseMLCompiler(logits=mode)
            fn = fns[f"fuseml_{mode}"] = torch.compile(model, backend=c)
            step(model, fn, x, labels)
            got = step(model, fn, x, labels)
            torch.cuda.synchronize()
            r = res[mode] = {"errors": {}}
            for n, a, w, f32 in zip(("loss", "dx", "dnorm", "dhead"), got, want, ref):
                f, e = rel_err(a, f32), rel_err(w, f32)
                r["errors"][n] = {"fuseml_vs_fp32": f, "eager_vs_fp32": e}
                print(f"{mode:9s} {n:6s} fuseml {f:.3g}  eager bf16 {e:.3g}  (vs fp32)")
                if not (f == f and f <= 1.25 * e + 1e-3):
                    problems.append(f"{mode} {n}: {f:.3g} from fp32, eager bf16 {e:.3g}")
            r["plans"] = [p.describe() for p in c.plans]
            print("\n".join(r["plans"]))
            r["refused"] = refused(c, sock)
            for line in r["refused"]:
                print("NOT TUNED", line)
                problems.append(f"{mode}: a group not served tuned: {line.splitlines()[0]}")
        for fn in fns.values():
            step(model, fn, x, labels)
        res["peak_gb"] = {name: peak_gb(model, fn, x, labels) for name, fn in fns.items()}
        ms = median_ms([lambda f=f: step(model, f, x, labels) for f in fns.values()], reps=20)
        res["ms"] = dict(zip(fns, ms))
        for name in fns:
            print(f"{name:16s} step {res['ms'][name]:.3f} ms  peak {res['peak_gb'][name]:.3f} GB above the model")
    finally:
        stop_daemon(proc)
    res["ok"] = not problems
    with open(os.path.join(out, "device_lm_head.json"), "w") as f:
        json.dump(res, f, indent=1)
    for p in problems:
        print("FAIL", p)
    print("device_lm_head:", "ok" if not problems else f"{len(problems)} problems")
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else os.environ.get("OUT", "/tmp/fm-device-out")))
