"""A graph rewrite before partitioning: rows gathered through a permutation and gathered back
through its inverse are the rows themselves.

Hugging Face's mixture-of-experts layer (grouped-GEMM experts) sorts its T*k picks by expert,
gathers each pick's routing weight in that order, and after the experts puts the picks back in
token order through the inverse permutation, which it builds by scattering `arange`:
  s = sort(expert_ids).indices                              [T*k], a permutation
  inverse = empty_like(s).index_put_([s], arange(T*k))       inverse[s[i]] = i
  w = weights.view(-1)[s]                                    the weights in expert order
  ... w[:, None][inverse]                                    (gather_sink.py moves it here)
The last gather reads w[s[inverse[j]]] = weights[j]: two ATen gathers a layer (two launches,
~10 us on an H200) that give back the weights as they were. Rewritten as weights.view(-1)[:, None],
which the fused kernel reading it takes as a strided input.

Exact when s is a permutation of 0..n-1 (the indices of a sort or argsort of a 1-D value of
length n) and inverse is index_put of arange(n) at s, without accumulation, into a tensor of
length n (every element written, each once); the gathers each take one 1-D index; what lies
between them is an unsqueeze after dim 0, which commutes with a row gather."""

import torch

from . import const_fold, fake_meta, graph_code
from ._log import log
from .fake_meta import tensor_val
from .shapes import is_plain_int

aten = torch.ops.aten
SORTS = {aten.sort.default, aten.sort.stable}


def _permutation(s):
    """Whether node s is the indices of a sort of a 1-D value (every position exactly once)."""
    if s.op == "call_function" and s.target is aten.argsort.default:
        src = s.args[0]
    elif s.op == "call_function" and s.target.__name__ == "getitem" and s.args[1] == 1:
        sort = s.args[0]
        if not isinstance(sort, torch.fx.Node) or sort.op != "call_function" or sort.target not in SORTS:
            return False
        src = sort.args[0]
    else:
        return False
    v = tensor_val(src) if isinstance(src, torch.fx.Node) else None
    return v is not None and v.dim() == 1 and is_plain_int(v.shape[0])


def _inverse_of(gm, inv):
    """s when node inv is the inverse of permutation s (index_put of arange at s), else None."""
    if inv.op != "call_function" or inv.target not in (aten.index_put.default, aten.index_put_.default):
        return None
    base, idxs, values = inv.args[:3]
    accumulate = inv.args[3] if len(inv.args) > 3 else inv.kwargs.get("accumulate", False)
    if accumulate or not isinstance(idxs, (list, tuple)) or len(idxs) != 1 or not isinstance(idxs[0], torch.fx.Node):
        return None
    s, vb = idxs[0], tensor_val(base)
    if not _permutation(s) or vb is None or vb.dim() != 1:
        return None
    n = tensor_val(s).shape[0]
    return s if vb.shape[0] == n and const_fold.is_arange(gm, values, n) else None


def _one_index(node):
    """(source, index) when node is ATen's index with one index tensor, else None."""
    if node.op != "call_function" or node.target is not aten.index.Tensor or len(node.args) != 2:
        return None
    src, idxs = node.args
    if not isinstance(idxs, (list, tuple)) or len(idxs) != 1 or not isinstance(idxs[0], torch.fx.Node):
        return None
    return src, idxs[0]


def _round_trip(gm):
    def match(g):
        """(the value before both gathers, the unsqueeze dims between them) when node g gathers
        back through the inverse of the permutation that gathered what it reads."""
        outer = _one_index(g)
        if outer is None:
            return None
        y, inv = outer
        s = _inverse_of(gm, inv)
        if s is None:
            return None
        dims = []
        while isinstance(y, torch.fx.Node) and y.op == "call_function" and y.target is aten.unsqueeze.default:
            d = y.args[1]
            if not isinstance(d, int) or d == 0 or (d < 0 and d + tensor_val(y).dim() == 0):
                return None  # a new dim 0 is not the gathered rows
            dims.insert(0, d)
            y = y.args[0]
        inner = _one_index(y) if isinstance(y, torch.fx.Node) else None
        if inner is None or inner[1] is not s:
            return None
        return inner[0], dims

    return match


def drop_round_trips(gm):
    """Replaces each gather back through a permutation's inverse of a gather through it by the
    value before both (above). Returns how many it replaced."""
    mode, found = fake_meta.matches(gm, _round_trip(gm))
    done = 0
    for g, (x, dims) in found:
        made = []
        with gm.graph.inserting_before(g):
            new = x
            for d in dims:
                new = fake_meta.call(gm, mode, aten.unsqueeze.default, (new, d), None, made)
        if fake_meta.substitute(gm, g, new, made):
            done += 1
    if done:
        gm.graph.eliminate_dead_code()
        graph_code.edited(gm)
        log.debug("fuseml: %d gather(s) back through a permutation's inverse dropped", done)
    return done
