"""A graph rewrite before partitioning: a tensor indexed by aranges, each covering one of its
dims whole along an axis of its own, is a view of the tensor.

Hugging Face's padding mask (masking_utils, under BERT and any model given an attention mask)
reads the [B, S] mask at every (batch, key) position through two aranges that const_fold
computed once:
  mask.bool()[arange(B)[:, None, None, None], arange(S)[None, None, None, :]]    [B, 1, 1, S]
ATen runs that as an index kernel and two copies making the aranges contiguous (three
launches, ~0.1 ms of host a forward under the profiler), and the partitioner cannot put it in
the pointwise group that reads the result. It reads mask[b, s] at (b, 0, 0, s): the mask
itself, unsqueezed at 1 and 2, which the group reading it takes as a broadcast input.

Exact when index i (of k, the tensor's first k dims) is arange(n_i) with n_i the tensor's dim
i, laid along one axis a_i of its own shape (every other size 1), the axes increasing in i
once the index shapes are broadcast (right-aligned): each result element then reads the
tensor at its own coordinates along those axes, and the tensor's dims after k follow."""

import torch

from . import const_fold, fake_meta, graph_code, ops
from ._log import log
from .fake_meta import tensor_val
from .shapes import is_plain_int

aten = torch.ops.aten
# views that keep a 1-D value's elements in order when every size but one is 1
_VIEWS = ops.RESHAPE_OPS | {aten.unsqueeze.default}


def _arange_axis(gm, node):
    """(axis, n) when node is arange(n) (a call, or a constant const_fold made of one) through
    views to a shape whose sizes are all 1 but n's along `axis`; else None."""
    v = tensor_val(node)
    if v is None or not all(is_plain_int(d) for d in v.shape):
        return None
    axes = [i for i, d in enumerate(v.shape) if d != 1]
    if len(axes) != 1:
        return None
    base = node
    while base.op == "call_function" and base.target in _VIEWS:
        base = base.args[0]
        if not isinstance(base, torch.fx.Node):
            return None
    n = int(v.shape[axes[0]])
    return (axes[0], n) if const_fold.is_arange(gm, base, n) else None


def _unsqueezes(gm):
    def match(node):
        """The dims to unsqueeze node's tensor at, in order, when node indexes it by aranges
        over its first dims whole (above)."""
        if node.op != "call_function" or node.target is not aten.index.Tensor or node.kwargs or len(node.args) != 2:
            return None
        x, idxs = node.args
        xv, out = tensor_val(x), tensor_val(node)
        if xv is None or out is None or not isinstance(idxs, (list, tuple)) or not 1 <= len(idxs) <= xv.dim():
            return None
        if not all(isinstance(i, torch.fx.Node) and tensor_val(i) is not None for i in idxs):
            return None
        rank = max(tensor_val(i).dim() for i in idxs)  # the broadcast index shape's
        axes = []
        for i, dim in zip(idxs, xv.shape):
            found = _arange_axis(gm, i)
            if found is None or found[1] != dim:
                return None
            axes.append(found[0] + rank - tensor_val(i).dim())
        if any(b <= a for a, b in zip(axes, axes[1:])):
            return None
        return [p for p in range(rank) if p not in axes]

    return match


def spell_arange_indices(gm):
    """Replaces each index by whole aranges (above) by unsqueezes of the indexed tensor, where
    they give the index's layout. Returns how many it replaced."""
    mode, found = fake_meta.matches(gm, _unsqueezes(gm))
    done = 0
    for node, dims in found:
        made = []
        with gm.graph.inserting_before(node):
            new = node.args[0]
            for d in dims:
                new = fake_meta.call(gm, mode, aten.unsqueeze.default, (new, d), None, made)
        if made and fake_meta.substitute(gm, node, new, made):
            done += 1
    if done:
        gm.graph.eliminate_dead_code()
        graph_code.edited(gm)
        log.debug("fuseml: %d index(es) by whole aranges read as views", done)
    return done
