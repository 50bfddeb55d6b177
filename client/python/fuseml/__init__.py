"""fuseml: a torch.compile backend whose fused kernels are served by fusemld.

    torch.compile(model, backend="fuseml")              # by name (entry point)
    torch.compile(model, backend=fuseml.FuseMLCompiler(min_ops=2))

Environment: the FUSEML_* variables, all read in fuseml/settings.py (client/python/README.md
has their table); FUSEML_LOG=debug prints what was fused and why anything runs eager.
fuseml.explain(model, *inputs) prints the groups found and what each runs as."""

from . import graph_breaks
from .backend import FuseMLCompiler, Plan, fuseml_backend, pick_up_tuned, rewrite
from .plan_view import explain
from .fragment import Unfusable, build
from .partition import Group, find_groups

__all__ = [
    "FuseMLCompiler",
    "Plan",
    "fuseml_backend",
    "pick_up_tuned",
    "rewrite",
    "Unfusable",
    "build",
    "Group",
    "find_groups",
    "explain",
]
__version__ = "0.1.0"

graph_breaks.avoid()  # the logging calls a model compiled from here on would break its graph at
