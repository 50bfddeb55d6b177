"""A graph rewrite before partitioning: a copy of a view that the graph computes twice, from the
same tensor through the same views, is made once.

aot_autograd's partitioner moves what the backward recomputes from the forward's inputs into
the forward, as a value it saves; it does not check whether the forward computes that value
already. A ViT's patch embedding (patch_conv.py) unfolds the image into rows for its product,
and the weight's gradient unfolds it again: the forward then copies the 19 MB image twice (an
H200's ~15 us each at batch 64). Views and contiguous copies are pure and deterministic, so
two such nodes with the same operands are the same value; the second reads the first."""

import torch

from . import graph_code, ops
from ._log import log

aten = torch.ops.aten
# views (and detach, alias): their result depends on their operands alone
VIEWS = ops.VIEW_OPS | ops.RESHAPE_OPS


def _key(node, keys):
    """What node computes, as a hashable value: its target and arguments, a view argument by
    its own key (two views of one tensor alike are one value), any other node by itself; None
    for what is not compared by value (a symbolic size)."""

    def plain(a):
        if isinstance(a, (list, tuple)):
            return tuple(plain(x) for x in a)
        if isinstance(a, torch.fx.Node):
            return keys.get(a) or ("node", a)
        if isinstance(a, (int, float, bool, str, type(None), torch.memory_format, torch.dtype)):
            return a
        raise TypeError(type(a))

    try:
        return node.target, plain(node.args), tuple(sorted((k, plain(v)) for k, v in node.kwargs.items()))
    except TypeError:
        return None


def _mutates(node):
    schema = getattr(node.target, "_schema", None) if node.op == "call_function" else None
    return schema is not None and schema.is_mutable


def drop_twin_copies(gm):
    """Replaces each clone equal to an earlier one (the same tensor through alike views) by
    that one; the views themselves stay, each with its readers (passes after this one move a
    view to its reader). Returns how many clones it dropped."""
    keys, seen, dropped = {}, {}, 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function":
            continue
        if node.target in VIEWS:
            key = _key(node, keys)
            if key is not None:
                keys[node] = key
            continue
        if node.target is not aten.clone.default or any(_mutates(u) for u in node.users):
            continue  # a copy written in place afterwards is a buffer of its own
        key = _key(node, keys)
        if key is None:
            continue
        twin = seen.setdefault(key, node)
        if twin is not node:
            node.replace_all_uses_with(twin)
            gm.graph.erase_node(node)
            dropped += 1
    if dropped:
        gm.graph.eliminate_dead_code()
        graph_code.edited(gm)
        log.debug("fuseml: %d copy(ies) the graph made twice made once", dropped)
    return dropped
