"""The modes a model runs under, as a user would write them. Each mode is one
`torch.compile` wrapper (or none), made once and used for both phases (an inference step
under no_grad recompiles for itself, as it would for a user).

fuseml's modes talk to the fusemld on FUSEML_SOCKET (run_model.py starts a private one);
`backend="fuseml"` is the name a user types and reads that variable."""

import dataclasses

import torch


@dataclasses.dataclass(frozen=True)
class Mode:
    name: str
    family: str  # the caches it shares with other modes: "eager", "inductor" or "fuseml"
    graphs: bool  # replays CUDA graphs (memory is taken at capture, not per step)
    make: object  # model -> the callable a step calls
    by_default: bool = True  # in a run that names no modes


def _fuseml_inductor(model):
    import fuseml

    import fuseml_state

    compiler = fuseml.FuseMLCompiler(rest="inductor")
    fuseml_state.compilers.append(compiler)  # its plans are reported with the default's
    return torch.compile(model, backend=compiler)


def _fuseml_with(**options):
    """A mode's callable: the model compiled by a FuseMLCompiler of its own with `options`."""

    def make(model):
        import fuseml

        return torch.compile(model, backend=fuseml.FuseMLCompiler(**options))

    return make


MODES = {
    m.name: m
    for m in (
        Mode("eager", "eager", False, lambda model: model),
        Mode("inductor", "inductor", False, lambda model: torch.compile(model)),
        Mode("inductor_graphs", "inductor", True, lambda model: torch.compile(model, mode="reduce-overhead")),
        Mode("fuseml", "fuseml", False, lambda model: torch.compile(model, backend="fuseml")),
        Mode(
            "fuseml_graphs",
            "fuseml",
            True,
            lambda model: torch.compile(model, backend="fuseml", mode="reduce-overhead"),
        ),
        Mode("fuseml_inductor", "fuseml", False, _fuseml_inductor),
        # training graphs split by aot_autograd's default partition (every intermediate the
        # backward reads saved, none recomputed; fuseml recomputes by default): asked by name
        Mode("fuseml_saved", "fuseml", False, _fuseml_with(recompute=False), by_default=False),
        # a language model's head and loss whose backward walks the saved logits in column blocks,
        # or computes them again block by block (linear_cross_entropy.py): asked by name
        Mode("fuseml_blocks", "fuseml", False, _fuseml_with(logits="blocks"), by_default=False),
        Mode("fuseml_lean", "fuseml", False, _fuseml_with(logits="recompute"), by_default=False),
    )
}


def select(names):
    """The modes named in a comma-separated string (those run by default when empty), in the
    table's order. An unknown name is a ValueError."""
    if not names:
        return [m for m in MODES.values() if m.by_default]
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in wanted if n not in MODES]
    if unknown:
        raise ValueError(f"unknown mode(s) {', '.join(unknown)}; known: {', '.join(MODES)}")
    return [m for m in MODES.values() if m.name in wanted]


def allow_many_graphs():
    """Every mode compiles the same forward code once per phase: 10 compiled entries on one
    code object, past Dynamo's default limit of 8, after which it would silently run eager."""
    import torch._dynamo.config as cfg

    for key in ("recompile_limit", "cache_size_limit"):
        if hasattr(cfg, key):
            setattr(cfg, key, 64)
    if hasattr(cfg, "accumulated_recompile_limit"):
        cfg.accumulated_recompile_limit = 4096
    elif hasattr(cfg, "accumulated_cache_size_limit"):
        cfg.accumulated_cache_size_limit = 4096
    # Dynamo's automatic dynamic shapes remember, per code object, the sizes and strides each
    # compile saw: the loss function's logits at Inductor's padded stride (50264) and then at
    # another backend's (50304, or contiguous) would make the later backend's graph dynamic,
    # which no user of one backend sees. Every mode compiles static graphs for its own layouts.
    cfg.automatic_dynamic_shapes = False
