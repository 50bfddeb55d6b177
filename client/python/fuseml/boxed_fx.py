"""An FX graph run in the boxed calling convention, so that its inputs die at their last use.

aot_autograd hands a backward its saved activations in one list. Called as `gm(*args)`, the
list and the argument tuples of every frame between it and the graph's code keep each of them
alive until the graph returns: a training step's backward then holds every activation to its
end, and a step peaks far above one that frees them as it goes (a Llama training step on an
H200: 2.66 GB against 1.97). The boxed form takes the list, empties it after reading it, and
FX's own code drops each value after its last use, as Inductor's generated code does.

    gm = boxed_module(root, graph)   # a module of a graph built for it (its code written once)
    gm = boxed_module(root, graph, lazy=True)   # ... its code written at its first call
    run = runner(gm)                 # run(args) clears args
    run = boxed(gm)                  # for a module someone else also calls: a boxed copy
"""

import copy

import torch
from functorch.compile import make_boxed_func

from . import graph_code

# torch's code generator for the boxed form (used by compiled autograd); a torch without it
# runs the graph unboxed, holding its inputs to the end as before
_BOXED_CODEGEN = getattr(torch.fx.graph, "_BoxedCodeGen", None)


def boxed_module(root, graph, lazy=False):
    """A GraphModule of graph (taken over, not copied) whose code takes the argument list and
    clears it, where torch can write it so; lazy: its code written at its first call (where
    torch can defer it), for a module that may only ever be interpreted or read."""
    if _BOXED_CODEGEN is not None:
        graph.set_codegen(_BOXED_CODEGEN())
    return graph_code.lazy_module(root, graph) if lazy else torch.fx.GraphModule(root, graph)


def runner(gm):
    """A callable of one list that runs gm: gm itself when its code is boxed (its _boxed_call,
    a property of the codegen's, tells aot_autograd so too), else a wrapper."""
    return gm if getattr(gm, "_boxed_call", False) else make_boxed_func(gm)


def boxed(gm):
    """A callable of one list that runs gm and clears the list once it has read it; gm itself
    is left as it was."""
    if _BOXED_CODEGEN is None:
        return make_boxed_func(gm)
    return runner(boxed_module(gm, copy.deepcopy(gm.graph)))  # node meta shared, not copied
