"""Fake-tensor metadata for nodes a graph pass adds or changes (pad_gemm.py,
device_constants.py). Partitioning and fragment building read every node's meta["val"] (its
shape, dtype, device and strides, which fragments bake in), so a pass that changes what a
node computes recomputes the value here, under the graph's own fake mode (its shape
environment, when sizes are symbolic), never leaving a stale one behind."""

import torch
from torch.utils import _pytree as pytree

from . import graph_code
from .shapes import provably_same_ints


def tensor_val(node, key="val"):
    """node's fake tensor value (key "example_value": in Dynamo's graph, before aot_autograd);
    None for a node of another value, or a non-node argument."""
    v = node.meta.get(key) if isinstance(node, torch.fx.Node) else None
    return v if isinstance(v, torch.Tensor) else None


def mode_of(gm):
    """The FakeTensorMode of gm's metadata; None when no node carries a fake tensor."""
    from torch._subclasses.fake_tensor import FakeTensor

    for node in gm.graph.nodes:
        for v in pytree.tree_leaves(node.meta.get("val")):
            if isinstance(v, FakeTensor):
                return v.fake_mode
    return None


def run(mode, target, args, kwargs=None):
    """target(*args, **kwargs) on fake values: the val of the node it would be."""
    with mode:
        return target(*args, **(kwargs or {}))


def call(gm, mode, target, args, kwargs=None, made=None):
    """A new node target(*args, **kwargs) at gm's insertion point with its fake value; appended
    to `made` when given, so that a rewrite that gives up can erase what it made."""
    kwargs = dict(kwargs or {})
    n = gm.graph.call_function(target, tuple(args), kwargs)
    if made is not None:
        made.append(n)
    vals, kvals = torch.fx.node.map_arg((tuple(args), kwargs), lambda a: a.meta["val"])
    n.meta["val"] = run(mode, target, vals, kvals)
    return n


def discard(gm, made):
    """Erases the nodes a rewrite that gives up made, the last made first (each reads only
    nodes made before it or nodes of the graph as it was)."""
    for m in reversed(made):
        gm.graph.erase_node(m)


def substitute(gm, node, value, made):
    """Replaces node by `value`, a node a rewrite made (`made`: every node it made), when value
    has node's traced layout, which node's readers were traced (and their fragments built)
    for; otherwise erases what was made and leaves node. Returns whether it replaced."""
    if not same_layout(value.meta["val"], node.meta["val"]):
        discard(gm, made)
        return False
    node.replace_all_uses_with(value)
    gm.graph.erase_node(node)
    return True


def replace(gm, done, dead=()):
    """Commits a rewrite that made every node it needed: each (old, new) of `done` has its
    readers read new and is erased, then the nodes of `dead` (readers first) it leaves unread."""
    for old, new in done:
        old.replace_all_uses_with(new)
        gm.graph.erase_node(old)
    for n in dead:
        gm.graph.erase_node(n)


def matches(gm, match):
    """(gm's fake mode, [(node, match(node))] for the nodes where match gives something): what
    a rewrite works on; (None, []) when nothing matches or gm has no fake values."""
    found = [(n, m) for n, m in ((n, match(n)) for n in gm.graph.nodes) if m is not None]
    mode = mode_of(gm) if found else None
    return (mode, found) if mode is not None else (None, [])


def require_same_value(new, old):
    """Raises ValueError unless node `new`'s value has node `old`'s shape and dtype: what a
    rewrite checks before one node takes another's readers."""
    got, want = new.meta.get("val"), tensor_val(old)
    if got is None or want is None or tuple(got.shape) != tuple(want.shape) or got.dtype != want.dtype:
        raise ValueError(f"{old.name} would change shape or dtype")


def same_layout(a, b):
    """Whether two values have the same shape, strides, offset, dtype and device (tensors,
    or anything else compared as it is)."""
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return (
            a.dtype == b.dtype
            and a.device == b.device
            and provably_same_ints(a.shape, b.shape)
            and provably_same_ints(a.stride(), b.stride())
            and provably_same_ints([a.storage_offset()], [b.storage_offset()])
        )
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same_layout(x, y) for x, y in zip(a, b))
    plain = (int, float, bool)
    if isinstance(a, plain) and isinstance(b, plain):
        return type(a) is type(b) and a == b
    return a is b  # symbolic values compared by identity: comparing them would add a guard


def adopt_input_layouts(gm, example_inputs):
    """Where an example input is laid out otherwise than its placeholder's traced value (a
    backward's saved logits, kept at a padded GEMM's row stride by the forward, which reported
    the strides so that aot_autograd restrides the backward's example inputs; the forward's
    channels-last values), every value of gm is recomputed from the examples; returns whether
    anything was. A view the graph takes of such an input that its new strides cannot give (a
    flatten the partitioner recomputes in the backward from a saved channels-last value) reads
    a copy of the input in its traced layout instead: first only the views, then, if the
    values still do not follow, every reader of those inputs. Raises when neither does."""
    phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(phs) != len(example_inputs):
        return False
    differ = [
        p
        for p, e in zip(phs, example_inputs)
        if isinstance(e, torch.Tensor)
        and isinstance(p.meta.get("val"), torch.Tensor)
        and not provably_same_ints(e.stride(), p.meta["val"].stride())
    ]
    mode = mode_of(gm)
    if not differ or mode is None:
        return False
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    traced = {n: n.meta.get("val") for n in gm.graph.nodes}
    copies, error = [], None
    for readers in (_NONE, _VIEWS, _ALL):  # which readers of those inputs read a traced copy
        for c in copies:  # the last try's
            c.replace_all_uses_with(c.args[0])
            gm.graph.erase_node(c)
        for n, v in traced.items():
            n.meta["val"] = v
        copies = _traced_copies(gm, differ, readers)
        if readers is not _NONE and not copies:
            continue
        try:
            FakeTensorProp(gm, mode).propagate_dont_convert_inputs(*example_inputs)
        except Exception as e:
            error = error or e
            continue
        if copies:
            graph_code.edited(gm)
        return True
    for c in copies:
        c.replace_all_uses_with(c.args[0])
        gm.graph.erase_node(c)
    for n, v in traced.items():
        n.meta["val"] = v
    raise error


_NONE, _VIEWS, _ALL = (), (torch.ops.aten.view.default, torch.ops.aten._unsafe_view.default), None


def _traced_copies(gm, inputs, readers):
    """For each of `inputs` traced contiguous, a contiguous copy that its readers of the ops
    `readers` (_ALL: every reader) read instead; the copies made."""
    made = []
    for p in inputs:
        if not p.meta["val"].is_contiguous():
            continue
        users = [u for u in p.users if readers is _ALL or u.target in readers]
        if not users:
            continue
        with gm.graph.inserting_after(p):
            c = gm.graph.call_function(torch.ops.aten.clone.default, (p,), {"memory_format": torch.contiguous_format})
        for u in users:
            u.replace_input_with(p, c)
        made.append(c)
    return made
