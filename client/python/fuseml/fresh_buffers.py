"""An index_put into a buffer the graph has just made for it, written in place.

aot_autograd makes every in-place write functional: `inv[perm] = arange(n)` on a fresh
`empty_like(perm)` (Hugging Face's experts putting their rows back in token order) becomes
`index_put(empty_like(perm), [perm], arange(n))`, which ATen runs as a copy of the buffer and
then the write: a launch and a pass over the buffer for nothing, since no one else reads it.
Here such an index_put (not accumulating) whose destination is a constructor (`_FRESH`) read by
it alone calls index_put_ on that buffer instead: one kernel, as Inductor writes it. A
constant computed once when the graph compiled (const_fold.py) is no constructor call and is
never written."""

import torch

from . import fake_meta, graph_code
from ._log import log

aten = torch.ops.aten

_FRESH = {
    aten.empty_like.default,
    aten.empty.memory_format,
    aten.new_empty.default,
    aten.empty_strided.default,
    aten.zeros.default,
    aten.zeros_like.default,
    aten.new_zeros.default,
    aten.full.default,
    aten.full_like.default,
}


def index_put_into(buffer, indices, values):
    """buffer (fresh, the caller's alone) with values written at indices, in place."""
    return aten.index_put_.default(buffer, indices, values)


def _destination(node):
    """The fresh buffer an index_put node this rewrite takes writes into, else None."""
    if node.op != "call_function" or node.target is not aten.index_put.default or node.kwargs:
        return None
    if len(node.args) == 4 and node.args[3] is not False:
        return None
    dest = node.args[0]
    if not isinstance(dest, torch.fx.Node) or dest.op != "call_function" or dest.target not in _FRESH:
        return None
    if len(dest.users) != 1 or dest.meta.get("val") is None or node.meta.get("val") is None:
        return None
    return dest if fake_meta.same_layout(dest.meta["val"], node.meta["val"]) else None


def rewrite(gm):
    """Each index_put of gm into a fresh buffer read by it alone (above) written in place;
    returns how many."""
    n = 0
    for node in list(gm.graph.nodes):
        dest = _destination(node)
        if dest is None:
            continue
        node.target = index_put_into
        node.args = node.args[:3]
        n += 1
    if n:
        graph_code.edited(gm)
        log.debug("fuseml: %d index_put(s) into fresh buffers written in place", n)
    return n
