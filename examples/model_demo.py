#!/usr/bin/env python3
"""fuseml on a small model: the MLP half of a pre-LayerNorm transformer block
(x + fc2(gelu(fc1(layer_norm(x)))), bf16), compiled with torch.compile(backend="fuseml").

Prints what was fused (fuseml.explain). With a GPU: runs inference and a training step and
prints the step times (median, synchronized) of eager, torch.compile (Inductor) and fuseml,
and fuseml's relative error against eager. Without one: the compile-only path: the fragments
still go to fusemld, which compiles and stores them (untuned: there is no GPU to verify and
time them on), and the model runs as its ATen ops on CPU.

    python3 examples/model_demo.py        # talks to FUSEML_SOCKET, else the per-user socket

scripts/quickstart runs it against the daemon it started. Exits 0 without torch (it says how
to install it), 1 if fuseml's result is not close to eager's."""

import logging
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOLERANCE = 2e-2  # ||fuseml - eager|| / ||eager||: bf16 rounding stays well below this
REPS = 50  # timed steps per variant on a GPU (the median is printed)
WARMUP = 3  # untimed steps first: compiles, the daemon's tuning, measured routing


def imports():
    """torch and fuseml, or None after saying how to install what is missing."""
    try:
        import torch
    except ImportError:
        print(
            "model demo skipped: torch is not installed (scripts/setup installs it, or "
            "`pip install torch`), then `pip install -e client/python`"
        )
        return None
    try:
        import fuseml
    except ImportError:
        sys.path.insert(0, os.path.join(ROOT, "client", "python"))  # run from a checkout
        try:
            import fuseml
        except ImportError:
            print("model demo skipped: the fuseml client is not installed: " "`pip install -e client/python`")
            return None
    return torch, fuseml


def block_class(torch):
    class MLPBlock(torch.nn.Module):
        """x + fc2(gelu(fc1(layer_norm(x)))): the MLP half of a pre-LN transformer block."""

        def __init__(self, d_model, d_ff):
            super().__init__()
            self.norm = torch.nn.LayerNorm(d_model)
            self.fc1 = torch.nn.Linear(d_model, d_ff)
            self.act = torch.nn.GELU()
            self.fc2 = torch.nn.Linear(d_ff, d_model)

        def forward(self, x):
            return x + self.fc2(self.act(self.fc1(self.norm(x))))

    return MLPBlock


def rel_err(got, want):
    got, want = got.float(), want.float()
    return ((got - want).norm() / want.norm()).item()


def fuseml_backend(torch, fuseml):
    """ "fuseml" as torch.compile knows it (the package's entry point); the same function when
    the package runs from the checkout uninstalled, without its entry point."""
    return "fuseml" if "fuseml" in torch._dynamo.list_backends() else fuseml.fuseml_backend


class QuietCpuNote(logging.Filter):
    """The runtime's warning that CPU tensors run as ATen: this demo's no-GPU line says it."""

    def filter(self, record):
        return "kernels run on CUDA only" not in record.getMessage()


def compile_only(torch, fuseml, model, x):
    """No GPU: send the fragments anyway, list the groups, check the result on CPU."""
    os.environ["FUSEML_REQUEST_CPU_GRAPHS"] = "1"  # a testing aid: CPU graphs go to fusemld too
    logging.getLogger("fuseml").addFilter(QuietCpuNote())
    with torch.no_grad():
        rows = fuseml.explain(model, x)
        compiled = torch.compile(model, backend=fuseml_backend(torch, fuseml))
        err = rel_err(compiled(x), model(x))
    keys = [r["key"][:12] for r in rows if r["key"]]
    states = ", ".join(sorted({r["state"] for r in rows if r["state"]}))
    if keys:
        print(
            f"fusemld compiled {len(keys)} of the {len(rows)} groups ({states}): "
            f"`fusectl ls` lists them, `fusectl show {keys[0]}` shows one"
        )
    else:
        print(f"fusemld compiled none of the {len(rows)} groups (see fuseml's warning)")
    print(f"result on CPU (ATen): relative error against eager {err:.1e}")
    return err


def step_ms(torch, step):
    """Median wall time of one step in ms, synchronized before and after each."""
    for _ in range(WARMUP):
        step()
    times = []
    for _ in range(REPS):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def on_gpu(torch, fuseml, model, x):
    """Explain, then time eager, Inductor and fuseml for inference and a training step."""
    print("compiling (the first time, fusemld tunes each kernel on this GPU: a minute or more)")
    with torch.no_grad():  # the daemon's replies wait for its tuning: a generous timeout
        fuseml.explain(model, x, compiler=fuseml.FuseMLCompiler(timeout_s=600))
    torch._dynamo.reset()
    params = list(model.parameters())
    grad_out = torch.randn_like(x)
    variants = {
        "eager": model,
        "inductor": torch.compile(model),
        "fuseml": torch.compile(model, backend=fuseml_backend(torch, fuseml)),
    }

    def infer(fn):
        with torch.no_grad():
            return fn(x)

    def train(fn):
        for p in params:
            p.grad = None
        xi = x.detach().requires_grad_(True)
        y = fn(xi)
        y.backward(grad_out)
        return [y.detach(), xi.grad] + [p.grad for p in params]

    print(f"{'step (median of %d, ms)' % REPS:<26}{'eager':>9}{'inductor':>10}{'fuseml':>9}" f"{'fuseml err':>12}")
    worst = 0.0
    for label, run in (("inference", infer), ("training step", train)):
        want = run(model)
        want = [t.clone() for t in want] if isinstance(want, list) else [want.clone()]
        ms = {name: step_ms(torch, lambda fn=fn: run(fn)) for name, fn in variants.items()}
        got = run(variants["fuseml"])
        got = got if isinstance(got, list) else [got]
        err = max(rel_err(a, b) for a, b in zip(got, want))
        worst = max(worst, err)
        print(f"{label:<26}{ms['eager']:>9.4f}{ms['inductor']:>10.4f}{ms['fuseml']:>9.4f}" f"{err:>12.1e}")
    print(
        "fuseml err: the largest ||fuseml - eager|| / ||eager|| over the output (and, for " "training, every gradient)"
    )
    return worst


def main():
    found = imports()
    if found is None:
        return 0
    torch, fuseml = found
    gpu = torch.cuda.is_available()
    rows = 16384 if gpu else 256  # on a GPU, a size where memory traffic dominates
    d_model, d_ff = 256, 1024
    torch.manual_seed(0)
    device = "cuda" if gpu else "cpu"
    model = block_class(torch)(d_model, d_ff).to(device, torch.bfloat16)
    x = torch.randn(rows // 128, 128, d_model, device=device, dtype=torch.bfloat16)
    print(
        f"torch.compile(model, backend=\"fuseml\"), model: x + fc2(gelu(fc1(layer_norm(x)))) "
        f"in bf16, x {list(x.shape)}, d_ff {d_ff}"
    )
    if gpu:
        print(f"GPU: {torch.cuda.get_device_name()}")
        err = on_gpu(torch, fuseml, model, x)
    else:
        print("no GPU (torch.cuda.is_available() is False): compile only; the model runs on " "CPU as ATen")
        err = compile_only(torch, fuseml, model, x)
    if not err <= TOLERANCE:  # NaN fails too
        print(f"model demo: fuseml's result is off (relative error {err:.1e} > {TOLERANCE})")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
