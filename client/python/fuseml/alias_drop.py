"""A graph rewrite before partitioning: an alias (what detach decomposes to) that only ops of
the graph read is dropped, its readers reading its operand. No group takes a view, so an alias
between two pointwise ops cut them into two kernels, the first writing its whole value for the
second: T5's and GPT-2's tanh recomputed in the backward, read by tanh_backward through the
alias of autograd's saved output. Exact: an alias is its operand, same storage, same layout.
An alias the graph returns stays (aot_autograd may rely on the output being a distinct
tensor that aliases its input)."""

import torch

from . import graph_code

aten = torch.ops.aten


def drop_aliases(gm):
    """Rewrites gm in place (above); returns how many aliases were dropped."""
    dropped = 0
    for n in list(gm.graph.nodes):
        if n.op != "call_function" or n.target is not aten.alias.default or not isinstance(n.args[0], torch.fx.Node):
            continue
        if any(u.op == "output" for u in n.users):
            continue
        n.replace_all_uses_with(n.args[0])
        gm.graph.erase_node(n)
        dropped += 1
    if dropped:
        graph_code.edited(gm)
    return dropped
