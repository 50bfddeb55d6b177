"""The inputs a graph updates, written at once: a graph rewrite, the last before partitioning.

aot_autograd leaves the updates a graph makes to its inputs without autograd seeing them
(batch norm's running mean and variance, its `num_batches_tracked + 1`) in the graph, as
`copy_(input, value)` nodes at its end (backend.py asks it to). A ResNet-50 training step
has 159 of them, each an ATen call of its own and a one-kernel copy of a few hundred bytes,
and 53 `add(num_batches_tracked, 1)` besides. They are written instead as one call per kind:

    copy_(d1, v1) ... copy_(dn, vn)          -> _foreach_copy_([d1 .. dn], [v1 .. vn])
    copy_(d, add(d, s)), add read by nothing else -> _foreach_add_([d ..], s)   (per s)

one host call each (one multi-tensor kernel for a list of one dtype, where torch takes its
fast path), in place of the copies, at the last one's position. Run before partitioning:
an increment it takes leaves the graph, and no group may hold it. Taken only where the result
cannot differ: each destination is a graph input, each value a fresh result of the graph (no
view of an input, so no value is another copy's destination), shapes equal (no broadcast),
no input written twice, and no node between a copy and the batched call reads its
destination. Anything else keeps its copy_."""

import operator

import torch

from . import graph_code
from ._log import log

aten = torch.ops.aten
_FOREACH_COPY = getattr(torch, "_foreach_copy_", None)
_FOREACH_ADD = getattr(torch, "_foreach_add_", None)


def _fresh(node):
    """A value made by the graph that aliases no input: a call whose schema returns no alias,
    or a view (of a view ...) of one (the new running mean squeezed from its column shape)."""
    for _ in range(64):
        if not isinstance(node, torch.fx.Node) or node.op != "call_function":
            return False
        schema = getattr(node.target, "_schema", None)
        if schema is None:  # getitem of a multi-output op: fresh as the op is
            if node.target is not operator.getitem:
                return False
            node = node.args[0]
            continue
        if all(r.alias_info is None for r in schema.returns):
            return True
        node = node.args[0]  # a view: what it views
    return False


def _update(node):
    """(destination, value) when node is copy_(graph input, fresh value of its shape) whose
    result nothing reads, else None."""
    if node.op != "call_function" or node.target is not aten.copy_.default or node.users or node.kwargs:
        return None
    if len(node.args) != 2:
        return None
    dst, src = node.args
    if not isinstance(dst, torch.fx.Node) or dst.op != "placeholder" or not _fresh(src):
        return None
    d, s = dst.meta.get("val"), src.meta.get("val")
    if not isinstance(d, torch.Tensor) or not isinstance(s, torch.Tensor):
        return None
    if tuple(d.shape) != tuple(s.shape) or d.device != s.device:
        return None
    return dst, src


def _increment(dst, src):
    """The scalar s when src is add(dst, s) (a Python number, no alpha) read by the copy
    alone, else None."""
    if src.target is not aten.add.Tensor or len(src.users) != 1 or src.kwargs or len(src.args) != 2:
        return None
    if src.args[0] is not dst or not isinstance(src.args[1], (int, float)) or isinstance(src.args[1], bool):
        return None
    if src.meta["val"].dtype != dst.meta["val"].dtype:
        return None
    return src.args[1]


def batch_input_updates(gm):
    """Rewrites gm in place (above); returns how many copies were batched."""
    if _FOREACH_COPY is None or _FOREACH_ADD is None:
        return 0
    nodes = list(gm.graph.nodes)
    pos = {n: i for i, n in enumerate(nodes)}
    updates = [(n, u) for n in nodes if (u := _update(n)) is not None]
    if len(updates) < 2:
        return 0
    last = updates[-1][0]
    written = [dst for _, (dst, _) in updates]
    batched = []
    for copy, (dst, src) in updates:
        if written.count(dst) > 1:  # written twice: the order of the two copies decides
            continue
        # no reader of the destination between its copy and the batched call
        if any(copy is not r and pos[copy] < pos[r] <= pos[last] for r in dst.users):
            continue
        # the batched call sits at the last copy: every value is made by then
        if pos[src] > pos[last]:
            continue
        batched.append((copy, dst, src))
    if len(batched) < 2:
        return 0
    copies, adds = {}, {}
    for copy, dst, src in batched:
        step = _increment(dst, src)
        if step is not None:
            adds.setdefault((dst.meta["val"].dtype, type(step), step), []).append((copy, dst, src))
        else:
            copies.setdefault(dst.meta["val"].dtype, []).append((copy, dst, src))
    with gm.graph.inserting_after(last):
        for group in copies.values():
            gm.graph.call_function(_FOREACH_COPY, ([d for _, d, _ in group], [s for _, _, s in group]))
        for (_, _, step), group in adds.items():
            gm.graph.call_function(_FOREACH_ADD, ([d for _, d, _ in group], step))
    for copy, _, src in batched:
        gm.graph.erase_node(copy)
        if src.target is aten.add.Tensor and not src.users:  # an increment, now a foreach add's
            gm.graph.erase_node(src)
    gm.graph.lint()
    graph_code.edited(gm)
    log.debug("fuseml: %d input updates written by %d calls", len(batched), len(copies) + len(adds))
    return len(batched)
