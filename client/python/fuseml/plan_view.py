"""A read-only view of what a FuseMLCompiler made of the graphs it compiled, for benchmarks and
tools: one dict per group, with the strategy it runs under. Nothing here changes a plan."""


def groups(compiler):
    """One dict per group of every graph `compiler` (a FuseMLCompiler) compiled, in compile
    order: which graph, group id, kind, ops, route, reason, the daemon's key/state/origin, the
    served kernel's template kind and entry symbol, and `strategy`, a short label:
    "kernel <kind> (<state>)" for a group served a kernel verified on the GPU (tuned, or verified
    and waiting for its background tune; launched on CUDA), "cublaslt
    plan (<state>): ..." for a GEMM group the tuner served a cuBLASLt plan (direct: cuBLASLt's
    own epilogue; split: cuBLASLt + one generated epilogue kernel), "aten
    <kind>: ..." for one whose kernel the runtime measured slower than ATen and dropped,
    "eager <kind>: <why>" for one routed to a kernel but not served, "bypass <kind>: <reason>"
    for one the partitioner left to ATen; `plan`: the cuBLASLt plan's form ("direct" or
    "split") when one was served; `siblings`: a GEMM group with two products sharing A
    (SwiGLU's gate and up, siblings.py); `chain`: a GEMM group of two back-to-back products
    (an MLP's fc1 -> act -> fc2, chains.py); a combined group the daemon refused (or the
    client could not spell) has strategy "apart <kind>: <why>" and is followed by its two
    GEMM groups, each with `apart_of` its gid. Fields a plan lacks are None."""
    from . import runtime

    runners = {id(r.built): r for r in list(runtime._registry.values()) if getattr(r, "built", None) is not None}
    out = []
    for plan in list(getattr(compiler, "plans", ())):
        for g in plan.groups:
            r = runners.get(id(g.built)) if getattr(g, "built", None) is not None else None
            kernel = getattr(r, "kernel", None) if r is not None else None
            meta = kernel[3] if kernel and len(kernel) > 3 and isinstance(kernel[3], dict) else {}
            route, kind = getattr(g, "route", None), getattr(g, "kind", None)
            state = getattr(g, "state", None)
            use = getattr(r, "use_kernel", None) if r is not None else None
            if route == "apart":
                strategy = f"apart {kind}: {getattr(g, 'reason', '')}; " "its two GEMM groups run as separate fragments"
            elif route == "kernel" and kernel is not None and state in runtime.VERIFIED_STATES and use is False:
                strategy = f"aten {kind}: measured slower than its ATen ops"
            elif route == "kernel" and kernel is not None and state in runtime.VERIFIED_STATES and meta.get("blas"):
                # the tuner found cuBLASLt faster: its own epilogue, or + one epilogue kernel
                form = meta["blas"].get("form")
                strategy = f"cublaslt plan ({state}): " + (
                    "cuBLASLt with its own epilogue" if form == "direct" else "cuBLASLt + a generated epilogue kernel"
                )
            elif route == "kernel" and kernel is not None and state in runtime.VERIFIED_STATES:
                strategy = f"kernel {meta.get('kind', kind)} ({state})"
            elif route == "kernel":
                why = getattr(r, "why_eager", None) if r is not None else None
                why = why[0] if why else (f"state {state}" if state else getattr(g, "reason", ""))
                strategy = f"eager {kind}: {why}"
            else:
                strategy = f"bypass {kind}: {getattr(g, 'reason', '')}"
            out.append(
                {
                    "graph": plan.which,
                    "gid": g.gid,
                    "kind": kind,
                    "ops": list(g.op_names),
                    "route": route,
                    "reason": getattr(g, "reason", None),
                    "key": getattr(g, "key", None),
                    "state": state,
                    "origin": getattr(g, "origin", None),
                    "template": meta.get("kind"),
                    "entry": meta.get("entry"),
                    "use_kernel": use,
                    "strategy": strategy,
                    "plan": (meta.get("blas") or {}).get("form"),
                    "siblings": bool(getattr(g, "siblings", False)),
                    "chain": bool(getattr(g, "chain", False)),
                    "apart_of": getattr(getattr(g, "apart_of", None), "gid", None),
                }
            )
    return out


def explain(model, *inputs, compiler=None, file=None, **compile_kwargs):
    """Compiles `model` with fuseml, runs it once on `inputs` (a training model: forward
    only; its backward graph is compiled when backward runs) and prints, per graph, every
    group found: its ops, the strategy it runs under, the kernels it launches, the measured
    kernel and ATen times where routing measured them, and why anything was not fused.
    Returns the list of group dicts (groups())."""
    import sys

    import torch

    from .backend import FuseMLCompiler

    compiler = compiler or FuseMLCompiler()
    out = torch.compile(model, backend=compiler, **compile_kwargs)(*inputs)
    if isinstance(out, torch.Tensor) and out.is_cuda:
        torch.cuda.synchronize()
    rows = groups(compiler)
    file = file or sys.stdout
    fused = [r for r in rows if r["strategy"].startswith(("kernel", "cublaslt"))]
    launches = sum(2 if r["plan"] == "split" else 1 for r in fused)  # split: cuBLASLt + a kernel
    print(
        f"fuseml: {len(rows)} groups, {len(fused)} run as fused kernels " f"({launches} launches per call for them)",
        file=file,
    )
    for plan in compiler.plans:
        if plan.skipped:
            print(plan.describe(), file=file)
    by_gid, heads = {}, {}
    for plan in compiler.plans:
        heads[plan.which] = plan.describe().splitlines()[0]  # with its CUDA graphs and call notes
        for g in plan.groups:
            by_gid[(plan.which, g.gid)] = g
    last = None
    for r in rows:
        if r["graph"] != last:
            print(heads.get(r["graph"], f"{r['graph']} graph:"), file=file)
            last = r["graph"]
        g = by_gid.get((r["graph"], r["gid"]))
        timing = ""
        if g is not None and g.route_measured and g.route_measured[1] is None:
            timing = "; kernel, ATen not timed (its ops would write far more)"
        elif g is not None and g.route_measured:
            timing = f"; measured kernel {g.route_measured[1]:.4f} ms vs ATen {g.route_measured[2]:.4f} ms"
        kind = r["kind"] + (" siblings" if r["siblings"] else " chain" if r["chain"] else "")
        indent = "    " if r["apart_of"] is not None else "  "  # under the group it split from
        print(f"{indent}[{kind}] {' -> '.join(r['ops'])}: {r['strategy']}{timing}", file=file)
    return rows
