"""fuseml: a torch.compile backend whose fused kernels are served by fusemld.

    torch.compile(model, backend="fuseml")              # by name (entry point)
    torch.compile(model, backend=fuseml.FuseMLCompiler(min_ops=2))

Environment: FUSEML_SOCKET (daemon socket), FUSEML_NO_AUTOSTART=1 (never start a daemon),
FUSEML_DAEMON (the fusemld to start), FUSEML_LIB (libfusemld.so), FUSEML_LOG=debug (detail),
FUSEML_ALLOW_UNTUNED=1 (a testing aid only: launch kernels not yet verified on a GPU),
FUSEML_ROUTE=kernel (skip measured routing: always launch served kernels), FUSEML_CHAINS=0
(no back-to-back GEMM chains; on by default).
fuseml.explain(model, *inputs) prints the groups found and what each runs as."""
from .backend import FuseMLCompiler, Plan, fuseml_backend, rewrite
from .plan_view import explain
from .fragment import Unfusable, build
from .partition import Group, find_groups

__all__ = ["FuseMLCompiler", "Plan", "fuseml_backend", "rewrite", "Unfusable", "build", "Group",
           "find_groups", "explain"]
__version__ = "0.1.0"
