"""The range of integer index values the graph fixes, and the masks it decides: a rewrite of
the Dynamo graph, before aot_autograd traces it.

The indices topk, sort and argsort give along a dim of static size n lie in [0, n - 1], and so
do the values that follow from them by views, gathers, a sort and exact casts. A comparison
of such a value with a number is often decided by that range for every element. Hugging
Face's grouped-GEMM experts mark their expert-parallel sentinels `expert_ids >= num_experts`
on every call, parallel or not, and clear the rows it marks with masked_fill three times
forward and three times backward; their ids come from topk over the experts, so the mask is
all false. ATen runs the comparison and each fill as kernels (Inductor fuses them, still
reading the mask), eight launches a layer of a training step.

Rewritten here:
- a masked_fill (in place or not) whose mask the range decides all false is its operand;
- a clamp_ that the range shows changes nothing is its operand.
Anything the range does not decide is left. A value the graph writes in place (other than by a
clamp_ taken here) has no range, nor has anything viewing its storage. A masked_fill whose
value the graph returns, or whose operand or value is written in place later, is left as it
was (its operand would be returned or written through in its place).

`ranges(gm)` is the analysis alone, for other rewrites (sorted_counts.py)."""

import operator

import torch

from . import graph_code
from ._log import log
from .fake_meta import tensor_val
from .shapes import is_plain_int

# Index producers: target -> (the output item holding the indices, or None for the value
# itself; the position of the dim argument; its default)
_INDICES = {
    torch.topk: (1, 2, -1),
    "topk": (1, 2, -1),
    torch.sort: (1, 1, -1),
    "sort": (1, 1, -1),
    torch.argsort: (None, 1, -1),
    "argsort": (None, 1, -1),
}
# The sorted values of a ranged value keep its range
_SORTS = {torch.sort, "sort"}
# Ops whose value is some of their first operand's elements, rearranged: views, copies, gathers
_SAME_VALUES = {
    torch.reshape,
    torch.flatten,
    torch.unsqueeze,
    torch.squeeze,
    torch.clone,
    torch.t,
    torch.transpose,
    torch.permute,
    operator.getitem,
    "reshape",
    "view",
    "flatten",
    "unsqueeze",
    "squeeze",
    "contiguous",
    "clone",
    "t",
    "transpose",
    "permute",
    "expand",
    "detach",
}
# Casts: target -> the dtype it casts to (None: read from the arguments)
_CASTS = {"int": torch.int32, "long": torch.int64, "float": torch.float32, "double": torch.float64, "to": None}
# The largest magnitude each dtype holds every integer up to
EXACT = {
    torch.int32: 2**31 - 1,
    torch.int64: 2**63 - 1,
    torch.float32: 2**24,
    torch.float64: 2**53,
    torch.bfloat16: 2**8,
    torch.float16: 2**11,
}
# Comparisons with a number c: op -> (all true, all false) over a value in [lo, hi]
_COMPARES = {
    "ge": (lambda lo, hi, c: lo >= c, lambda lo, hi, c: hi < c),
    "gt": (lambda lo, hi, c: lo > c, lambda lo, hi, c: hi <= c),
    "le": (lambda lo, hi, c: hi <= c, lambda lo, hi, c: lo > c),
    "lt": (lambda lo, hi, c: hi < c, lambda lo, hi, c: lo >= c),
    "eq": (lambda lo, hi, c: lo == hi == c, lambda lo, hi, c: c < lo or c > hi),
    "ne": (lambda lo, hi, c: c < lo or c > hi, lambda lo, hi, c: lo == hi == c),
}
_COMPARE_OPS = {getattr(operator, k): k for k in _COMPARES} | {getattr(torch, k): k for k in _COMPARES}
_COMPARE_OPS |= {k: k for k in _COMPARES}
_MASKED_FILLS = {torch.masked_fill, "masked_fill", "masked_fill_"}
# Python's augmented assignments, which Dynamo records as these and which write a tensor in place
_IN_PLACE_OPERATORS = {
    operator.iadd,
    operator.isub,
    operator.imul,
    operator.itruediv,
    operator.ifloordiv,
    operator.imod,
    operator.ipow,
    operator.iand,
    operator.ior,
    operator.ixor,
    operator.ilshift,
    operator.irshift,
}


def target_of(node):
    """The op of a call node (a function, or a method's name); None for any other node."""
    return node.target if node.op in ("call_function", "call_method") else None


def _mutates(node, x):
    """Whether node writes x in place (a method ending in `_`, an item or augmented assignment)."""
    t = target_of(node)
    if t is operator.setitem:
        return bool(node.args) and node.args[0] is x
    in_place = t in _IN_PLACE_OPERATORS
    in_place |= isinstance(t, str) and t.endswith("_") and not t.startswith("__")
    in_place |= not isinstance(t, str) and getattr(t, "__name__", "").endswith("_")
    return in_place and bool(node.args) and node.args[0] is x


def _views_of(node):
    """node and every value reached from it by _SAME_VALUES ops that may share its storage."""
    seen, todo = {node}, [node]
    while todo:
        for u in todo.pop().users:
            if target_of(u) in _SAME_VALUES and u.args and u.args[0] in seen and u not in seen:
                seen.add(u)
                todo.append(u)
    return seen


def _index_range(node):
    """[0, n - 1] for the indices node holds (an item of topk or sort, or argsort's value)."""
    src = node
    item = None
    if target_of(node) is operator.getitem and isinstance(node.args[1], int):
        src, item = node.args[0], node.args[1]
    spec = _INDICES.get(target_of(src)) if isinstance(src, torch.fx.Node) else None
    if spec is None or spec[0] != item:
        return None
    _, dim_at, default = spec
    x = tensor_val(src.args[0], "example_value") if src.args else None
    dim = src.args[dim_at] if len(src.args) > dim_at else src.kwargs.get("dim", default)
    if x is None or not isinstance(dim, int) or not -x.dim() <= dim < max(x.dim(), 1):
        return None
    n = x.shape[dim] if x.dim() else 1
    return (0, n - 1) if is_plain_int(n) and n > 0 else None


def cast_dtype(node):
    """The dtype a cast node (_CASTS) casts to; None for another node or one not known."""
    t = target_of(node)
    if t != "to":
        return _CASTS.get(t)
    given = [a for a in node.args[1:] if isinstance(a, torch.dtype)] + [node.kwargs.get("dtype")]
    return next((d for d in given if isinstance(d, torch.dtype)), None)


def _number(a):
    return a if type(a) in (int, float) else None


def ranges(gm):
    """{node: (lo, hi)} for the values of Dynamo's graph gm whose every element the graph puts
    in [lo, hi]; a bool value all false is (0, 0), all true (1, 1)."""
    first = _propagate(gm, set())
    # a value written in place may leave its range: neither it, nor anything viewing its
    # storage, nor anything computed from them has one
    written = set()
    for node in first:
        views = _views_of(node)
        if any(_mutates(u, v) and not _unchanging_clamp(u, first) for v in views for u in v.users):
            written |= views
    return _propagate(gm, written) if written else first


def _propagate(gm, written):
    """ranges(gm), the values in `written` given none."""
    found = {}
    for node in gm.graph.nodes:
        t = target_of(node)
        if t is None or node in written:
            continue
        arg = node.args[0] if node.args and isinstance(node.args[0], torch.fx.Node) else None
        r = _index_range(node)
        if r is None and arg in found:
            lo, hi = found[arg]
            if t in _SAME_VALUES:
                r = found[arg]
            elif t in _CASTS:
                dtype = cast_dtype(node)
                r = (lo, hi) if dtype in EXACT and max(-lo, hi) <= EXACT[dtype] else None
            elif t in _COMPARE_OPS and len(node.args) == 2 and _number(node.args[1]) is not None:
                always, never = _COMPARES[_COMPARE_OPS[t]]
                c = node.args[1]
                r = (1, 1) if always(lo, hi, c) else (0, 0) if never(lo, hi, c) else None
        if r is None and t is operator.getitem and node.args[1] == 0:
            src = node.args[0]  # a sort's values: the sorted operand's range
            if target_of(src) in _SORTS and src.args and src.args[0] in found:
                r = found[src.args[0]]
        if r is not None:
            found[node] = r
    return found


def _unchanging_clamp(node, found):
    """Whether node is a clamp_ of a ranged value that the range shows changes nothing."""
    if target_of(node) != "clamp_" or not node.args or node.args[0] not in found:
        return False
    lo, hi = found[node.args[0]]
    low = node.args[1] if len(node.args) > 1 else node.kwargs.get("min")
    high = node.args[2] if len(node.args) > 2 else node.kwargs.get("max")
    return (low is None or (_number(low) is not None and low <= lo)) and (
        high is None or (_number(high) is not None and high >= hi)
    )


def _fill_operand(node, found, outputs):
    """The operand of masked_fill node when its mask is all false, else None."""
    if target_of(node) not in _MASKED_FILLS or len(node.args) < 2:
        return None
    x, mask = node.args[0], node.args[1]
    if found.get(mask) != (0, 0) or not isinstance(x, torch.fx.Node) or node in outputs:
        return None
    if target_of(node) == "masked_fill_":
        return x  # in place: nothing written, x is what it returns
    # out of place: its readers get x itself, which must then never be written through
    if any(_mutates(u, v) for v in _views_of(x) | _views_of(node) for u in v.users):
        return None
    return x


def rewrite(gm):
    """Drops the masked fills and clamps of Dynamo's graph gm that the index ranges decide
    change nothing (above), in place; returns how many."""
    if not any(target_of(n) in _MASKED_FILLS or target_of(n) == "clamp_" for n in gm.graph.nodes):
        return 0  # nothing to decide: no analysis
    found = ranges(gm)
    out = next((n for n in gm.graph.nodes if n.op == "output"), None)
    outputs = set(out.all_input_nodes) if out is not None else set()
    done = 0
    for node in list(gm.graph.nodes):
        keep = _fill_operand(node, found, outputs)
        if keep is None and _unchanging_clamp(node, found) and node not in outputs:
            keep = node.args[0]
        if keep is None:
            continue
        log.debug("fuseml: %s changes nothing (index ranges): read as %s", node.name, keep.name)
        node.replace_all_uses_with(keep)
        gm.graph.erase_node(node)
        done += 1
    if done:
        _drop_unread(gm, found)
        gm.graph.lint()
        graph_code.edited(gm)
    return done


def _drop_unread(gm, found):
    """Erases the comparisons (and their views) no one reads any more."""
    for node in reversed(list(gm.graph.nodes)):
        if node in found and not node.users and (target_of(node) in _COMPARE_OPS or target_of(node) in _SAME_VALUES):
            gm.graph.erase_node(node)
