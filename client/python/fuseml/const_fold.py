"""Values of a graph that depend on no input, computed once when the graph is compiled.

Hugging Face decoders build their causal mask and position ids from the sequence length
alone: `arange`, `cumsum`, `index`, comparisons, `new_ones`, `where` over `scalar_tensor`s,
twenty-odd ATen ops (GPT-2's forward: 25 ops, 15 kernels) that each step runs again to get
the same tensors, each a launch and a dispatch on the host. Such a value is a constant of the
compiled graph: it is computed here once, on the graph's device, and the graph reads it as a
tensor attribute.

A node folds when it is a call of a deterministic, non-mutating op whose every tensor operand
folds, with plain (not symbolic) sizes and arguments. A graph input, a parameter, a random op,
or a mutating op never folds; `new_ones`/`new_zeros`/`new_full` read only the dtype and
device of their first operand, so that operand need not fold. The values kept are those a
node that does not fold reads; a view of a folded value stays a view (it costs no kernel), its
base is what is kept. A value larger than MAX_BYTES (a constant expanded to a large shape)
is not kept: its inputs are, where they fit. The folded values are computed with real
tensors outside any fake mode, once per compiled graph; the nodes they replace go."""

import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily

from . import fake_meta, graph_code
from ._log import log
from .fake_meta import tensor_val
from .shapes import is_plain_int

aten = torch.ops.aten
MAX_BYTES = 64 << 20  # one kept constant
MAX_TOTAL_BYTES = 256 << 20  # every constant of one graph
# ops that read only the dtype and device of their first operand
TEMPLATES = {aten.new_ones.default, aten.new_zeros.default, aten.new_full.default}
VIEWS = {
    aten.view.default,
    aten._unsafe_view.default,
    aten.expand.default,
    aten.unsqueeze.default,
    aten.squeeze.dim,
    aten.squeeze.default,
    aten.slice.Tensor,
    aten.permute.default,
    aten.transpose.int,
    aten.t.default,
    aten.alias.default,
    aten.select.int,
}
NEVER = {
    aten.empty.memory_format,
    aten.empty_strided.default,
    aten.empty_like.default,
    aten.new_empty.default,
    aten.new_empty_strided.default,
}


def _op_folds(node):
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        return False
    if node.target in NEVER:
        return False
    schema = node.target._schema
    if schema.is_mutable or torch.Tag.nondeterministic_seeded in node.target.tags:
        return False
    v = tensor_val(node)
    return v is not None and all(is_plain_int(d) for d in v.shape) and all(is_plain_int(s) for s in v.stride())


def constant(gm, node):
    """The tensor a get_attr node reads, unless it is a parameter (what training updates)."""
    obj = gm
    for part in node.target.split("."):
        obj = getattr(obj, part, None)
    return obj if isinstance(obj, torch.Tensor) and not isinstance(obj, torch.nn.Parameter) else None


def is_arange(gm, node, n):
    """Whether node is arange(n): a call of arange or a constant const_fold made of one."""
    if not isinstance(node, torch.fx.Node):
        return False
    if node.op == "call_function" and node.target is aten.arange.default:
        return node.args[0] == n
    if node.op == "call_function" and node.target is aten.arange.start_step:
        return tuple(node.args[:3]) == (0, n, 1)
    t = constant(gm, node) if node.op == "get_attr" else None
    if t is None or t.dim() != 1 or t.shape[0] != n or t.dtype not in (torch.int32, torch.int64):
        return False
    with unset_fake_temporarily():  # a real comparison, once per compiled graph
        return bool(torch.equal(t, torch.arange(n, device=t.device, dtype=t.dtype)))


def _plain(a):
    """No symbolic value among a's leaves (nodes aside): the same on every call."""
    ok = [True]

    def leaf(x):
        if isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            ok[0] = False
        return x

    torch.fx.node.map_aggregate(a, leaf)
    return ok[0]


def _folding(gm):
    """The nodes that fold, in graph order. A graph output does not (the caller would get
    the one constant tensor on every call); what it is computed from may. A view that is an
    output stays in the graph, a view of the constant as it would be anyway, and its other
    readers fold: GPT-2's training forward returns its position ids (a view of an arange) for
    the backward, and the packed-sequence mask Hugging Face computes from them (sub, cat, ne,
    cumsum, two index, eq, le, two bitwise_and: ~0.45 ms of host a step) folds through it."""
    folds = set()
    for n in gm.graph.nodes:
        if n.op == "get_attr" and constant(gm, n) is not None:
            folds.add(n)  # a tensor the trace kept (`torch.tensor(0.0)`): already constant
            continue
        if not _op_folds(n) or (n.target not in VIEWS and any(u.op == "output" for u in n.users)):
            continue
        args = n.args[1:] if n.target in TEMPLATES else n.args
        operands = []
        torch.fx.node.map_arg((args, n.kwargs), operands.append)
        if all(a in folds for a in operands) and _plain((args, n.kwargs)):
            folds.add(n)
    return [n for n in gm.graph.nodes if n in folds]


def _kept(folds):
    """The folded values a node that does not fold reads, a view replaced by its base."""
    fold_set, kept = set(folds), []
    for n in folds:
        if all(u in fold_set for u in n.users):
            continue
        base = n
        while base.target in VIEWS and isinstance(base.args[0], torch.fx.Node) and base.args[0] in fold_set:
            base = base.args[0]
        if base not in kept:
            kept.append(base)
    return kept


def fold(gm):
    """Folds gm's constant values (above) in place; returns the names of the nodes replaced by
    constants. Nothing changes where nothing folds or the graph has no fake mode."""
    folds = _folding(gm)
    if not folds:
        return []
    kept = _kept(folds)
    kept = [
        n
        for n in kept
        if n.op == "call_function"
        and tensor_val(n) is not None
        and n.target not in VIEWS
        and tensor_val(n).numel() * tensor_val(n).element_size() <= MAX_BYTES
    ]
    mode = fake_meta.mode_of(gm)
    if not kept or mode is None:
        return []
    fold_set, need, stack = set(folds), set(), list(kept)
    while stack:  # what computing the kept values takes
        n = stack.pop()
        if n in need:
            continue
        need.add(n)
        stack.extend(a for a in n.all_input_nodes if a in fold_set)
    values = {}
    try:
        with unset_fake_temporarily():
            for n in [n for n in folds if n in need]:
                if n.op == "get_attr":
                    values[n] = constant(gm, n)
                    continue

                def real(a, n=n):
                    if a in values:
                        return values[a]
                    v = tensor_val(a)  # a template operand: only its dtype and device are read
                    return torch.empty(0, dtype=v.dtype, device=v.device)

                args, kwargs = torch.fx.node.map_arg((n.args, n.kwargs), real)
                values[n] = n.target(*args, **kwargs)
    except Exception as e:  # an op that cannot run here: nothing folds
        log.debug("fuseml: constant folding skipped: %s", e)
        return []
    total = 0
    replaced = []
    for i, n in enumerate(kept):
        want = tensor_val(n)
        value = values[n]
        if not isinstance(value, torch.Tensor) or value.shape != want.shape or value.dtype != want.dtype:
            continue
        if value.stride() != want.stride():  # the layout the graph was traced with
            value = torch.empty_strided(want.shape, want.stride(), dtype=want.dtype, device=want.device).copy_(value)
        total += value.untyped_storage().nbytes()
        if total > MAX_TOTAL_BYTES:
            break
        name = f"_fuseml_constant{i}"
        while hasattr(gm, name):
            name += "_"
        gm.register_buffer(name, value, persistent=False)
        with gm.graph.inserting_before(n):
            attr = gm.graph.get_attr(name)
        attr.meta["val"] = mode.from_tensor(value, static_shapes=True)
        n.replace_all_uses_with(attr)
        replaced.append(n.name)
    if replaced:
        for n in reversed(folds):
            if not n.users:
                gm.graph.erase_node(n)
        gm.graph.lint()
        graph_code.edited(gm)
    return replaced
