"""Reshapes moved off the seams of elementwise chains, so that the chain becomes one group.

A reshape (view, _unsafe_view) between two fusible ops splits them into two groups: a group
runs over one shape. The common case is a lone cast on one side of a reshape and a rows group
on the other: Hugging Face's loss upcasts the logits and flattens them for cross-entropy,

    log_softmax(view(_to_copy(logits, f32), [-1, V]))     forward
    _to_copy(view(log_softmax_backward(...), [B, S, V]), bf16)   backward

and the lone cast ran as an ATen copy of the whole fp32 logits each way. An elementwise op
commutes with a reshape (same elements, same order), so:

  - *hoist*: view(P(x)) -> P(view(x)) when P is a one-operand elementwise op that only the view
    reads and x is not itself a fusible op's value (P then has nothing to join above the view,
    and joins the group below it), nor a GEMM's product or a reshape (a GEMM group takes P into
    its epilogue through one reshape of its product);
  - *sink*: U(view(y)) -> view(U(y)) when U is a one-operand elementwise op that is the view's
    only reader, y is a fusible op's value and no reader of U is one (U, alone below the view,
    joins y's group above it).

The two conditions exclude each other for one view (hoisting leaves the view reading a
non-fusible value, sinking leaves it reading a fusible one), so the passes never undo each
other. A move is made only when the reshape is valid on its new operand (its strides allow the
view, checked on the fake values) and the value that leaves the moved pair has the layout it
had before (fake_meta.same_layout), so nothing downstream, nor the graph's outputs, changes."""
import torch

from . import fake_meta, ops

aten = torch.ops.aten

VIEWS = {aten.view.default, aten._unsafe_view.default}


def _unary(node):
    """The single tensor operand of an elementwise node (the chains' vocabulary), else None."""
    if node.op != "call_function" or ops.why_not_pointwise(node) is not None:
        return None
    tensors = [a for a in node.args if isinstance(a, torch.fx.Node)]
    tensors += [v for v in node.kwargs.values() if isinstance(v, torch.fx.Node)]
    if len(tensors) != 1 or not isinstance(node.args[0], torch.fx.Node):
        return None
    return tensors[0]


def _fusible(node):
    """Is node the value of an op a pointwise or rows group computes?"""
    return isinstance(node, torch.fx.Node) and node.op == "call_function" and (
        ops.why_not_pointwise(node) is None or ops.row_reduction(node) is not None)


def _fake(mode, node, args):
    """node's target on fake values with `args` in place of its args (Nodes -> their vals)."""
    vals = tuple(a.meta["val"] if isinstance(a, torch.fx.Node) else a for a in args)
    kwargs = {k: v.meta["val"] if isinstance(v, torch.fx.Node) else v for k, v in node.kwargs.items()}
    return fake_meta.run(mode, node.target, vals, kwargs)


def _exchange(gm, mode, inner, outer):
    """outer(inner(z, ...), ...) -> inner(outer(z, ...), ...): two one-operand ops that commute
    (an elementwise op and a reshape) swap places. Returns False, the graph unchanged, when a
    fake value cannot be computed (the reshape is no view of its new operand) or the pair's
    result would change layout."""
    graph = gm.graph
    z = inner.args[0]
    made = []
    try:
        with graph.inserting_before(outer):
            a = graph.call_function(outer.target, (z,) + tuple(outer.args[1:]), dict(outer.kwargs))
            made.append(a)
            a.meta["val"] = _fake(mode, outer, a.args)
            b = graph.call_function(inner.target, (a,) + tuple(inner.args[1:]), dict(inner.kwargs))
            made.append(b)
            b.meta["val"] = _fake(mode, inner, b.args)
        if not fake_meta.same_layout(b.meta["val"], outer.meta["val"]):
            raise ValueError("layout")
    except Exception:   # not a view of its new operand, or another layout: leave the pair
        for n in reversed(made):
            graph.erase_node(n)
        return False
    outer.replace_all_uses_with(b)
    graph.erase_node(outer)
    graph.erase_node(inner)
    return True


def _hoist(gm, mode, view):
    """view(P(x)) -> P(view(x)) when x is no fusible op's value and only the view reads P."""
    p = view.args[0]
    if not isinstance(p, torch.fx.Node) or len(p.users) != 1:
        return False
    x = _unary(p)
    if x is None or x is not p.args[0] or _fusible(x):
        return False
    # a GEMM group sees through one reshape of its product into its epilogue: a reshape
    # hoisted onto a product, or onto another reshape, would cut P off from that epilogue
    if x.op == "call_function" and (x.target in ops.RESHAPE_OPS or ops.kind_of(x) == "gemm"):
        return False
    return _exchange(gm, mode, p, view)


def _sink(gm, mode, view):
    """U(view(y)) -> view(U(y)) when y is a fusible op's value and U the view's only reader."""
    y = view.args[0]
    if len(view.users) != 1 or not _fusible(y):
        return False
    (u,) = view.users
    if _unary(u) is not view or u.args[0] is not view:
        return False
    # U would leave a group below the view that it joins now (a cast feeding an add)
    if any(_fusible(r) for r in u.users):
        return False
    return _exchange(gm, mode, view, u)


def move(gm):
    """Moves the graph's reshapes off elementwise seams (hoist, then sink); the number moved."""
    mode = fake_meta.mode_of(gm)
    if mode is None:
        return 0
    moved = 0
    for step in (_hoist, _sink):
        again = True
        while again:
            again = False
            for node in list(gm.graph.nodes):
                if node.op == "call_function" and node.target in VIEWS and step(gm, mode, node):
                    moved += 1
                    again = True
    if moved:
        gm.graph.lint()
        gm.recompile()
    return moved
