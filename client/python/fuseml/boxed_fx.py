"""An FX graph run in the boxed calling convention, so that its inputs die at their last use.

aot_autograd hands a backward its saved activations in one list. Called as `gm(*args)`, the
list and the argument tuples of every frame between it and the graph's code keep each of them
alive until the graph returns: a training step's backward then holds every activation to its
end, and a step peaks far above one that frees them as it goes (a Llama training step on an
H200: 2.66 GB against 1.97). The boxed form takes the list, empties it after reading it, and
FX's own code drops each value after its last use, as Inductor's generated code does.

    run = boxed(gm)    # run(args) clears args; gm itself is left as it was
"""

import copy

import torch
from functorch.compile import make_boxed_func

# torch's code generator for the boxed form (used by compiled autograd); a torch without it
# runs the graph unboxed, holding its inputs to the end as before
_BOXED_CODEGEN = getattr(torch.fx.graph, "_BoxedCodeGen", None)


def boxed(gm):
    """A callable of one list that runs gm and clears the list once it has read it."""
    if _BOXED_CODEGEN is None:
        return make_boxed_func(gm)
    graph = copy.deepcopy(gm.graph)  # nodes and codegen copied; node meta shared, not copied
    graph.set_codegen(_BOXED_CODEGEN())
    run = torch.fx.GraphModule(gm, graph)
    if not getattr(run, "_boxed_call", False):  # a property of the codegen's, where torch has it
        run._boxed_call = True  # how aot_autograd knows to pass the list
    return run
