"""GPU checks of the client's GEMM padding and of CUDA graphs on T5 (run by ./run, which builds
fusemld and installs the client first). Parts, in order, any subset:

  gemm  cuBLAS alone at GPT-2's lm_head shapes: N (or K, or M) 50257, padded to 50264 (a
        multiple of 8) and to 50304 (64: what pad_gemm.py uses from 4096 up), forward and
        the backward's two GEMMs; ms per GEMM, median of CUDA events.
  gpt2  GPT-2 small (bench/models: d 768, 4 layers, vocabulary 50257, 8 x 512 tokens):
        eager, Inductor, fuseml with padding off (FuseMLCompiler(pad_gemm="off")) and on
        ("auto", the default), forward and training step: wall and GPU ms per step, error against the fp32
        copy, and which GEMMs each fuseml graph padded. Exits 1 when the padded run's error
        is above 2x eager bf16's (and 1e-2) or no lm_head GEMM was padded.
  t5    CUDA graphs on T5: a tiny T5's training step under torch.compile(backend="fuseml",
        mode="reduce-overhead") for 8 steps, loss and gradients against eager's each step,
        every forward and backward graph recorded (its plan note, replays counted); then T5
        small (bench/models) training with and without graphs, wall and GPU ms. Exits 1 when
        a graph is not recorded or a step's loss or gradients differ.

    python3 check.py [gemm] [gpt2] [t5]      (all three when none is named)
    python3 check.py --cpu gpt2 t5          (a dry run of the code on the CPU, tiny models:
                                             nothing is padded or recorded there, so it FAILs)"""

import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = os.path.join(HERE, "..", "..", "models")
sys.path.insert(0, MODELS)
sys.path.append(os.path.join(MODELS, "..", "table"))  # daemon.py
import compile_modes as modes_mod  # noqa: E402
import model_zoo as models  # noqa: E402
import run_model  # noqa: E402
import step_measure as measure  # noqa: E402

import fuseml  # noqa: E402
from fuseml import graph_replay  # noqa: E402

DEV = torch.device("cuda")
SIZE = "small"
failures = []


def _ms(x):
    return f"{x:8.3f}" if x is not None else f"{'-':>8}"


def event_ms(fn, reps=50):
    for _ in range(5):
        fn()
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        times.append((s, e))
    torch.cuda.synchronize()
    t = sorted(s.elapsed_time(e) for s, e in times)
    return t[len(t) // 2]


def part_gemm():
    print("== gemm: cuBLAS at GPT-2's lm_head shapes (bf16, 4096 tokens, d 768), ms per GEMM")
    t, d = 4096, 768
    print(f"{'GEMM':<34} {'50257':>8} {'50264':>8} {'50304':>8}")
    for name, shapes in (
        ("fwd  h[t,d] @ w[v,d].t()", lambda v: ((t, d), (v, d), "nt")),
        ("bwd  g[t,v] @ w[v,d]      (K=v)", lambda v: ((t, v), (v, d), "nn")),
        ("bwd  g[t,v].t() @ h[t,d]  (M=v)", lambda v: ((t, v), (t, d), "tn")),
    ):
        row = []
        for v in (50257, 50264, 50304):
            sa, sb, form = shapes(v)
            a = torch.randn(sa, device=DEV, dtype=torch.bfloat16)
            b = torch.randn(sb, device=DEV, dtype=torch.bfloat16)
            fn = {"nt": lambda: a @ b.t(), "nn": lambda: a @ b, "tn": lambda: a.t() @ b}[form]
            row.append(event_ms(fn))
        print(f"{name:<34} " + " ".join(f"{x:8.3f}" for x in row))


def _measure(work, phase, fn, want, graphs=False):
    ph = run_model.Phase(work, phase)
    work.model.train(phase == "train")
    t0 = time.perf_counter()
    ph.step(fn, graphs)
    measure.sync(DEV)
    first = time.perf_counter() - t0
    for _ in range(3):
        ph.step(fn, graphs)
    got = ph.result(ph.step(fn, graphs))
    err, _ = run_model.errors(got, want, phase)
    del got
    step = lambda: ph.step(fn, graphs)  # noqa: E731
    wall = measure.wall_ms({"s": step}, DEV, 11)["s"]["ms"]
    prof = measure.profile(step, DEV)
    ph.clear()
    return {
        "first_s": first,
        "wall_ms": wall,
        "gpu_ms": prof["gpu_ms"],
        "kernels": prof["kernels"],
        "err": err,
        "top": prof["top_kernels"][:3],
    }


def _fuseml(pad):
    c = fuseml.FuseMLCompiler(pad_gemm=pad)
    return c, lambda model: torch.compile(model, backend=c)


def part_gpt2():
    work = models.build("gpt2", SIZE, DEV)
    print(f"== gpt2: {work.describe}")
    off, make_off = _fuseml("off")
    auto, make_auto = _fuseml("auto")
    variants = [
        ("eager", lambda m: m),
        ("inductor", torch.compile),
        ("fuseml pad off", make_off),
        ("fuseml pad auto", make_auto),
    ]
    made = {name: make(work.model) for name, make in variants}
    for phase in ("fwd", "train"):
        work.model.train(phase == "train")
        want = run_model.reference(work, phase)
        res = {}
        for name, _ in variants:
            try:
                res[name] = _measure(work, phase, made[name], want)
            except Exception as e:  # one variant's failure must not hide the others
                failures.append(f"gpt2 {phase} {name}: {type(e).__name__}: {str(e)[:300]}")
                print(f"  {phase} {name}: FAILED {type(e).__name__}: {str(e)[:300]}")
        print(f"-- {phase}: {'variant':<16} {'wall ms':>8} {'GPU ms':>8} {'kernels':>8} {'rel err':>9} {'first s':>8}")
        for name, r in res.items():
            print(
                f"   {'':<5}{name:<16} {_ms(r['wall_ms'])} {_ms(r['gpu_ms'])} {r['kernels'] or 0:8.0f} "
                f"{r['err']:9.2e} {r['first_s']:8.1f}"
            )
        for name in ("fuseml pad off", "fuseml pad auto"):
            if name in res:
                print(
                    f"   {name} costliest kernels: "
                    + "; ".join(f"{k['kernel'][:70]} {k['ms']:.3f} ms" for k in res[name]["top"])
                )
        eager, padded = res.get("eager"), res.get("fuseml pad auto")
        if padded and eager and padded["err"] > max(2 * eager["err"], 1e-2):
            failures.append(f"gpt2 {phase}: padded error {padded['err']:.2e} against eager's {eager['err']:.2e}")
    for name, c in (("fuseml pad off", off), ("fuseml pad auto", auto)):
        for p in c.plans:
            print(f"   {name} {p.which} graph padded: {p.padded or 'nothing'}")
    if not any("50257 -> 50304" in d for p in auto.plans for d in p.padded):
        failures.append("gpt2: no GEMM of vocabulary 50257 was padded")


def _t5_steps(work, compiled, steps):
    params = [p for p in work.model.parameters() if p.requires_grad]
    work.model.train()
    worst = 0.0
    for i in range(steps):
        got = []
        for fn in (work.model, compiled):
            for p in params:
                p.grad = None
            loss = work.loss(fn, work.inputs)
            loss.backward()
            got.append([loss.detach().float()] + [p.grad.float() for p in params])
        err = measure.rel_err(got[1], got[0])
        worst = max(worst, err)
    return worst


def part_t5():
    work = models.build("t5", "tiny", DEV)
    print(f"== t5: CUDA graphs on a {work.describe}, training, fuseml mode=\"reduce-overhead\"")
    c = fuseml.FuseMLCompiler()
    compiled = torch.compile(work.model, backend=c, mode="reduce-overhead")
    before = graph_replay.stats()
    worst = _t5_steps(work, compiled, 8)
    after = graph_replay.stats()
    for p in c.plans:
        print(f"   {p.which} graph: {p.graphs}")
    replays = after.get("replays", 0) - before.get("replays", 0)
    print(
        f"   worst rel err of loss and gradients against eager over 8 steps: {worst:.2e}; "
        f"replays {replays}, recordings {after.get('recordings', 0) - before.get('recordings', 0)}"
    )
    if worst > 2e-2:
        failures.append(f"t5 tiny: loss/gradients differ from eager's (rel err {worst:.2e})")
    unrecorded = [p for p in c.plans if not (p.graphs or "").startswith("CUDA graphs")]
    if unrecorded or replays == 0:
        failures.append("t5 tiny: graphs not recorded: " + "; ".join(f"{p.which}: {p.graphs}" for p in unrecorded))

    work = models.build("t5", SIZE, DEV)
    print(f"-- {work.describe}, training step, fuseml without and with CUDA graphs")
    want = run_model.reference(work, "train")
    for graphs in (False, True):
        c = fuseml.FuseMLCompiler()
        fn = torch.compile(work.model, backend=c, mode="reduce-overhead" if graphs else None)
        try:
            r = _measure(work, "train", fn, want, graphs)
        except Exception as e:
            failures.append(f"t5 small graphs={graphs}: {type(e).__name__}: {str(e)[:300]}")
            continue
        notes = sorted({p.graphs or "no graphs asked" for p in c.plans})
        print(
            f"   graphs={graphs!s:<5} wall {_ms(r['wall_ms'])} ms, GPU {_ms(r['gpu_ms'])} ms, "
            f"rel err {r['err']:.2e}, first call {r['first_s']:.1f} s; graphs: {notes}"
        )
        if graphs and any(not n.startswith("CUDA graphs") for n in notes):
            failures.append(f"t5 small: a graph not recorded: {notes}")


def main(argv):
    global DEV, SIZE
    if argv[:1] == ["--cpu"]:
        argv, DEV, SIZE = argv[1:], torch.device("cpu"), "tiny"
    parts = argv or ["gemm", "gpt2", "t5"]
    modes_mod.allow_many_graphs()
    daemon = run_model.start_daemon(modes_mod.select("fuseml"), DEV) if set(parts) - {"gemm"} else None
    try:
        for part in parts:
            {"gemm": part_gemm, "gpt2": part_gpt2, "t5": part_t5}[part]()
    finally:
        if daemon is not None:
            out = os.environ.get("OUT")
            daemon.stop(keep_log_to=out and os.path.join(out, "fusemld.log"))
    print("FAILED: " + " | ".join(failures) if failures else "OK")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
