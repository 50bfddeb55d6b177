"""CPU constants of a CUDA graph moved onto its device when the graph is compiled, so that it
can be recorded as a CUDA graph (cudagraphs.py): torch refuses to record a graph holding any
CPU value. A traced model may carry CPU constants that only ever reach the GPU:

- transformers' KV cache starts each layer's cache as `torch.tensor([], device=...)`, which
  the trace keeps as an empty CPU constant copied to the device (`_tensor_constant0` ->
  lift_fresh_copy -> _to_copy(device=cuda)): a T5 training step with its cache on has them;
- a CPU scalar, `x * torch.tensor(2.0)`.

Such a constant moves to the device together with every CPU value computed from it, when all
of those values end in CUDA ones. The results do not change: an ATen op that mixes a CPU
tensor with CUDA ones either takes it as a 0-dim scalar (type promotion treats a 0-dim CUDA
tensor the same way) or copies it to the device first (now a device copy, which a CUDA graph
can hold). A CPU value the caller receives (a graph output), one read on the host (`item()`),
or one computed from a real CPU input or from a CUDA value stays, and so does the graph's
refusal; nothing moves then."""

import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.utils import _pytree as pytree

from . import fake_meta, graph_code


def _cpu(v):
    return isinstance(v, torch.Tensor) and v.device.type == "cpu"


def _val(node):
    return node.meta.get("val")


def _on_device(v):
    """Every tensor of v on a non-CPU device, and nothing but tensors (None aside)."""
    leaves = [x for x in pytree.tree_leaves(v) if x is not None]
    return bool(leaves) and all(isinstance(x, torch.Tensor) and x.device.type != "cpu" for x in leaves)


def _attr(gm, target):
    owner, _, name = target.rpartition(".")
    return getattr(gm.get_submodule(owner) if owner else gm, name)


def _why_not_source(gm, node):
    """None when the CPU node may move as far as it alone is concerned, else why not."""
    if node.op == "get_attr":
        return "a parameter" if isinstance(_attr(gm, node.target), torch.nn.Parameter) else None
    if node.op != "call_function":
        return "an input of the graph" if node.op == "placeholder" else f"a {node.op} node"
    if not isinstance(_val(node), torch.Tensor):
        return "not one tensor"
    for a in node.all_input_nodes:
        if isinstance(_val(a), torch.Tensor) and not _cpu(_val(a)):
            return f"copied to the host from {a.name}"
    device = node.kwargs.get("device")
    if device is not None and torch.device(device).type != "cpu":
        return "made on another device"
    return None


def plan(gm):
    """(movable, kept): the CPU nodes that move to the device (graph order), and why each other
    CPU node stays ({name: reason})."""
    cpu = [n for n in gm.graph.nodes if _cpu(_val(n))]
    kept = {}
    for n in cpu:
        why = _why_not_source(gm, n)
        if why:
            kept[n.name] = why
    movable = {n for n in cpu if n.name not in kept}
    changed = True
    while changed:  # until every CPU input and user of a movable node moves too, or is on the device
        changed = False
        for n in [n for n in cpu if n in movable]:
            why = None
            for a in n.all_input_nodes:
                if _cpu(_val(a)) and a not in movable:
                    why = f"computed from {a.name}, which stays on the CPU"
            for u in n.users:
                if u in movable:
                    continue
                if u.op == "output":
                    why = "a graph output"
                elif _cpu(_val(u)):
                    why = f"used by {u.name}, which stays on the CPU"
                elif not _on_device(_val(u)):
                    why = f"read on the host by {u.name}"
            if why:
                movable.discard(n)
                kept[n.name] = why
                changed = True
    return [n for n in cpu if n in movable], kept


def move(gm, device):
    """Moves gm's CPU constants to `device` (a torch.device) where plan() allows all of them;
    returns (names moved, {name: why kept}). With any CPU value kept nothing moves: the graph
    is refused either way. The new values are computed first and the graph changed only once
    all of them are known."""
    movable, kept = plan(gm)
    mode = fake_meta.mode_of(gm)
    if kept or not movable or mode is None:
        return [], kept
    vals, tensors, kwargs = {}, {}, {}
    for n in movable:
        if n.op == "get_attr":
            # a real copy even where the compiler is called under aot_autograd's fake mode (a
            # training graph's): made in that mode it would be a fake tensor the graph keeps
            with unset_fake_temporarily():
                tensors[n] = _attr(gm, n.target).to(device)
            vals[n] = mode.from_tensor(tensors[n])
            continue
        if "device" in n.kwargs:
            kwargs[n] = {**n.kwargs, "device": device}
        vals[n] = fake_meta.run(
            mode, n.target, *torch.fx.node.map_arg((n.args, kwargs.get(n, n.kwargs)), lambda a: vals.get(a, _val(a)))
        )
    for n, t in tensors.items():
        owner, _, name = n.target.rpartition(".")
        setattr(gm.get_submodule(owner) if owner else gm, name, t)
    for n, kw in kwargs.items():
        n.kwargs = kw
    for n, v in vals.items():
        n.meta["val"] = v
    graph_code.edited(gm)
    return [n.name for n in movable], {}
