"""A graph rewrite before partitioning: a dtype cast (or another pointwise op of one tensor
operand, a scale by a constant) read only through a chain of views moves past the views, next
to the pointwise op that reads them, so that the two fuse.

SDPA's math path (T5's attention) casts q, k and v to fp32 and the result back, each through
views that a group cannot look through (a transpose, a view of the heads):
  k32 = _to_copy(k); kt = transpose(k32); mul(kt, scale) ...    -> the cast alone is a kernel
  o16 = _to_copy(o32); clone(transpose(view(o16)))              -> so is the cast, and the clone
Rewritten as transpose(k) -> _to_copy -> mul, and view -> transpose -> _to_copy -> clone, each
cast joins the group of the op after it (the backward's scales by 1.0 likewise). Exact: the
op is elementwise, a view only re-indexes the same elements (the views now read the operand,
whose strides are the op's result's).
The reader may also be a row reduction: Hugging Face's causal-LM loss upcasts the logits and
flattens them for cross-entropy, log_softmax(view(_to_copy(logits), [-1, V])), and the cast
joins log_softmax's rows group once it reads the view.

The other direction (rise_casts): a cast after a reshape of a fused value, whose readers
nothing fuses with (cross-entropy's backward: _to_copy(view(log_softmax_backward(...))) into
the graph's gradient output), moves above the reshape and joins the group that makes the
value: view(_to_copy(y)). Each direction leaves the cast next to a fusible op and a reshape
between it and nothing fusible, so neither undoes the other.
Nothing else changes: a graph without these patterns is left as it was."""

import torch
from torch._guards import detect_fake_mode

from . import fake_meta, graph_code, ops
from ._log import log
from .fake_meta import same_layout
from .partition import SMALL_BROADCAST
from .shapes import is_plain_int, same_plain_shape

aten = torch.ops.aten
VIEWS = {
    aten.transpose.int,
    aten.permute.default,
    aten.t.default,
    aten.unsqueeze.default,
    aten.squeeze.dim,
    aten.squeeze.default,
    aten.view.default,
    aten._unsafe_view.default,
    aten.expand.default,
}
_MAX_PASSES = 4


def _is_view(node):
    if (
        node.op != "call_function"
        or node.target not in VIEWS
        or node.kwargs
        or any(isinstance(a, torch.fx.Node) for a in node.args[1:])
    ):
        return False
    # an expand that broadcasts would have the op computed once per copy
    return node.target is not aten.expand.default or same_plain_shape(
        node.args[0].meta["val"].shape, node.meta["val"].shape
    )


def _movable(node):
    """A pointwise op of one tensor operand (a cast, a scale by a constant)."""
    if node.op != "call_function" or node.target in ops.ALIASES or ops.why_not_pointwise(node):
        return False
    return isinstance(node.args[0], torch.fx.Node) and len(node.all_input_nodes) == 1


def _joins_producer(cast):
    """Is cast's operand made by a pointwise op or a cat of the cast's shape? Then the cast
    already fuses with what makes its operand, and moving it pays only where it then fuses
    with its readers instead (_chain)."""
    x = cast.args[0]
    if x.op != "call_function" or x.target in ops.ALIASES:
        return False
    if ops.why_not_pointwise(x) is not None and ops.cat_dim(x) is None:
        return False
    return same_plain_shape(x.meta["val"].shape, cast.meta["val"].shape)


def _chain(cast):
    """The views cast's value goes through to reach pointwise ops (each read only by the
    next), or None when it is not such an op."""
    if not _movable(cast):
        return None
    x = cast.args[0]
    src, val = x.meta.get("val"), cast.meta.get("val")
    if not isinstance(src, torch.Tensor) or not isinstance(val, torch.Tensor):
        return None
    strides = list(src.stride()) + list(val.stride())
    # layouts are compared without a guard on a symbolic stride: those are left as they are
    # (the operand may be laid out otherwise than the op's result, a padded GEMM output cast
    # to fp32: _sink checks that the moved op's result has the old result's layout)
    if not all(is_plain_int(s) for s in strides):
        return None
    chain, node = [], cast
    while len(node.users) == 1 and _is_view(next(iter(node.users))):
        node = next(iter(node.users))
        chain.append(node)
    if not chain or not all(ops.fusible(u) for u in node.users):
        return None
    # A large value read by several groups joins none of them (each would compute it again
    # per element; a small one, a batch norm's per-channel statistics, they do compute again):
    # moved, it would only leave the group that makes its operand. Rotary embeddings'
    # cos(cat(freqs, freqs)) cast to bf16, read through an unsqueeze by every layer's q and k
    # groups, is one kernel where it stands and three moved.
    if _joins_producer(cast) and len(node.users) > 1 and node.meta["val"].numel() > SMALL_BROADCAST:
        return None
    return chain


def sink_casts(gm):
    """Rewrites gm in place (above); returns whether anything changed."""
    if not any(_movable(n) for n in gm.graph.nodes):
        return False
    fake_mode = detect_fake_mode([n.meta.get("val") for n in gm.graph.nodes])
    if fake_mode is None:
        return False
    changed = False
    # a pass moves each op past its views; an op moved next to one that moves later (a scale
    # before a cast, both behind views) follows it in the next pass
    for _ in range(_MAX_PASSES):
        if not _sink(gm, fake_mode):
            break
        changed = True
    changed |= _rise(gm, fake_mode)
    if changed:
        gm.graph.lint()
        graph_code.edited(gm)
    return changed


def spread_small_casts(gm):
    """A small cast of a value nothing fusible makes, read directly by a pointwise op and
    through a view by another (a column group's 2-D view), becomes one cast per view reader,
    moved past its view (_sink) so that it joins that reader's group, the other readers keeping
    the original. Batch norm's backward casts each saved mean to fp32 for the pointwise kernel
    of the input gradient and, through the [1, C] view spell_columns makes, for the column
    kernel of its two sums; shared, the cast joined neither and ran alone, an ATen kernel and
    its launch per batch norm (53 a ResNet-50 step). A reader computes at most SMALL_BROADCAST
    casts again; the values are the same. Run after spell_columns; returns whether anything
    changed."""
    fake_mode = None
    split = False
    for cast in [n for n in gm.graph.nodes if _movable(n) and len(n.users) > 1]:
        val, src = cast.meta.get("val"), cast.args[0].meta.get("val")
        viewers = [u for u in cast.users if _is_view(u)]
        if (
            not viewers
            or not isinstance(val, torch.Tensor)
            or not isinstance(src, torch.Tensor)
            or not all(is_plain_int(d) for d in val.shape)
            or val.numel() > SMALL_BROADCAST
            or _joins_producer(cast)  # it fuses where it is made: one kernel computes it
            or not all(ops.fusible(u) or _is_view(u) for u in cast.users)
        ):
            continue
        fake_mode = fake_mode or detect_fake_mode([val])
        if fake_mode is None:
            return False
        for user in viewers[1:] if len(viewers) == len(cast.users) else viewers:
            with gm.graph.inserting_before(user):
                copy = gm.graph.call_function(cast.target, tuple(cast.args), dict(cast.kwargs))
            copy.meta["val"] = fake_meta.run(fake_mode, cast.target, (src,) + tuple(cast.args[1:]), dict(cast.kwargs))
            user.replace_input_with(cast, copy)
        split = True
    if not split:
        return False
    for _ in range(_MAX_PASSES):
        if not _sink(gm, fake_mode):
            break
    gm.graph.lint()
    graph_code.edited(gm)
    return True


def _sink(gm, fake_mode):
    changed = False
    for cast in [n for n in gm.graph.nodes if _movable(n)]:
        chain = _chain(cast)
        if chain is None:
            continue
        last, new = chain[-1], []
        try:
            with gm.graph.inserting_before(last):
                value = cast.args[0]
                for v in chain:
                    w = gm.graph.call_function(v.target, (value,) + tuple(v.args[1:]))
                    w.meta["val"] = fake_meta.run(fake_mode, v.target, (value.meta["val"],) + tuple(v.args[1:]), {})
                    new.append(w)
                    value = w
                moved = gm.graph.call_function(cast.target, (value,) + tuple(cast.args[1:]), dict(cast.kwargs))
                new.append(moved)
                moved.meta["val"] = fake_meta.run(
                    fake_mode, cast.target, (value.meta["val"],) + tuple(cast.args[1:]), dict(cast.kwargs)
                )
            # its readers were traced (and their fragments are built) for the old layout
            if not same_layout(moved.meta["val"], last.meta.get("val")):
                raise ValueError("the moved op's result would be laid out otherwise")
        except Exception as e:  # a view the uncast layout cannot take: leave the chain as it was
            log.debug("fuseml: %s stays before its views: %s", cast.name, e)
            fake_meta.discard(gm, new)
            continue
        last.replace_all_uses_with(moved)
        for v in reversed([cast] + chain):
            gm.graph.erase_node(v)
        changed = True
    return changed


RESHAPES = {aten.view.default, aten._unsafe_view.default}


def _rise(gm, fake_mode):
    """cast(reshape(y)) -> reshape(cast(y)) where y is a fused value, the reshape is read only
    by the cast, and no reader of the cast is fusible (see the module's docstring)."""
    changed = False
    for view in [n for n in gm.graph.nodes if n.op == "call_function" and n.target in RESHAPES]:
        y = view.args[0]
        if len(view.users) != 1 or not ops.fusible(y):
            continue
        (cast,) = view.users
        if not _movable(cast) or cast.args[0] is not view or any(ops.fusible(r) for r in cast.users):
            continue
        new = []
        try:
            with gm.graph.inserting_before(cast):
                moved = gm.graph.call_function(cast.target, (y,) + tuple(cast.args[1:]), dict(cast.kwargs))
                new.append(moved)
                moved.meta["val"] = fake_meta.run(
                    fake_mode, cast.target, (y.meta["val"],) + tuple(cast.args[1:]), dict(cast.kwargs)
                )
                w = gm.graph.call_function(view.target, (moved,) + tuple(view.args[1:]))
                new.append(w)
                w.meta["val"] = fake_meta.run(fake_mode, view.target, (moved.meta["val"],) + tuple(view.args[1:]), {})
            if not same_layout(w.meta["val"], cast.meta["val"]):
                raise ValueError("the result would change layout")
        except Exception as e:  # no view of the cast value, or another layout: leave the pair
            log.debug("fuseml: %s stays after its reshape: %s", cast.name, e)
            fake_meta.discard(gm, new)
            continue
        cast.replace_all_uses_with(w)
        gm.graph.erase_node(cast)
        gm.graph.erase_node(view)
        changed = True
    return changed
