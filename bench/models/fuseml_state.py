"""What the fuseml backend of this process holds, for the benchmarks: its plans, how each
compiled graph runs, its kernels by state. Empty answers where fuseml is not installed or
not used yet."""


def _backend():
    try:
        from fuseml import backend
    except ImportError:
        return None
    return backend


compilers = []  # FuseMLCompiler instances a mode made itself (rest="inductor"), beside the default


def plans():
    """The plans of the compiler behind backend="fuseml" (none before its first use) and of
    the compilers in `compilers`."""
    backend = _backend()
    default = [backend._default] if backend is not None and backend._default is not None else []
    return [p for c in default + compilers for p in c.plans]


def paths(of_plans):
    """How each compiled graph runs (generated code, or the FX graph and why), counted."""
    out = {}
    for p in of_plans:
        if p.compiled is not None:
            way = p.compiled.path
        elif p.choice is not None:  # rest="inductor": the form its first calls measured faster
            way = p.choice.form
        else:
            way = p.skipped or "inductor"
        out[way] = out.get(way, 0) + 1
    return out


def verified_left():
    """Kernels the graphs launch that fusemld has served verified and not yet tuned (not those
    measured routing gave to ATen, which are never launched)."""
    backend = _backend()
    if backend is None:
        return 0
    return sum(
        1 for c in list(backend.live) for r in c.upgrader.runners if r.kernel is not None and r.kernel[1] == "verified"
    )


def kernel_states():
    """{state: count} over every fuseml group of this process: "tuned", "verified", "untuned",
    or "eager" (no kernel: the group runs its ATen ops)."""
    backend = _backend()
    out = {}
    for c in list(backend.live) if backend is not None else []:
        for r in c.runners.values():
            state = r.kernel[1] if r.kernel is not None else "eager"
            out[state] = out.get(state, 0) + 1
    return out


def choices(of_plans):
    """rest="inductor": each graph's form and why (its measured times), in compile order."""
    return [f"{p.which}: {p.choice.why}" for p in of_plans if p.choice is not None]


def routed_to_aten(of_plans):
    """The groups whose first call measured their ATen ops faster than the kernel on the GPU
    (measured routing), each as "ops: kernel ms, ATen ms": fused work the step does not get."""
    out = []
    for p in of_plans:
        for g in p.groups:
            m = g.route_measured
            if m and m[0] == "aten":
                out.append(f"{' -> '.join(g.op_names)}: kernel {m[1]:.4f} ms, ATen {m[2]:.4f} ms")
    return out
