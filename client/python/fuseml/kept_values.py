"""The node values ("val": the fake tensors fuseml's passes read) of a graph kept by aot_cache.py,
written as plain data on a miss and made again on a hit.

On a miss, `described(gm)` writes every node's value as its layout (shape, strides, offset)
and the storage it lies in (an index, so that values sharing one storage, views and their
bases, share one again). On a hit, `restored(gm, described, inputs)` makes a fake storage per
index and each value a view of it: one fake call per value, where running the graph's ops on
fake tensors again costs each op's meta function (on a T5 backward, about as long as fuseml's
whole compile of it). A graph whose values are not all plain layouts (symbolic sizes, tensor
subclasses, values of two dtypes in one storage) is described as None and propagated through
its ops instead, as is one whose description fails to restore."""

import operator

import torch

from ._log import log


class _NotPlain(Exception):
    pass


def described(gm):
    """(storages, {node name: value form}) for gm's values, or None where one is not plain."""
    from torch._subclasses.fake_tensor import FakeTensor

    storages, index = [], {}  # [(nbytes, dtype, device)], StorageImpl address -> its index

    def form(v):
        if isinstance(v, torch.Tensor):
            if type(v) is not FakeTensor:
                raise _NotPlain(type(v).__name__)
            dims = (*v.shape, *v.stride(), v.storage_offset())
            storage = v.untyped_storage()
            nbytes = storage.nbytes()
            if not all(type(d) is int for d in (*dims, nbytes)):
                raise _NotPlain("symbolic sizes")
            at = index.setdefault(storage._cdata, len(storages))
            if at == len(storages):
                storages.append((nbytes, v.dtype, str(v.device)))
            elif storages[at][1] != v.dtype:
                raise _NotPlain("two dtypes in one storage")
            return ("tensor", at, tuple(v.shape), tuple(v.stride()), v.storage_offset())
        if isinstance(v, (list, tuple)):
            return ("list" if isinstance(v, list) else "tuple", [form(x) for x in v])
        if v is None or type(v) in (int, float, bool):
            return ("value", v)
        raise _NotPlain(type(v).__name__)

    try:
        values = {n.name: form(n.meta["val"]) for n in gm.graph.nodes if n.op != "get_attr" and "val" in n.meta}
    except _NotPlain as e:
        log.debug("fuseml: a kept graph's values will be propagated again (%s)", e)
        return None
    return storages, values


def restored(gm, kept, inputs):
    """Writes each node's value into gm's metas, from `kept` (what described wrote) or, where
    that is None or fails, by running the graph on fakes of its inputs (`inputs`: each a
    ("tensor", shape, stride, offset, dtype, device) or a ("value", v)); returns the inputs'
    values, in order."""
    mode = _fake_mode()
    if kept is not None:
        try:
            return _from_layouts(gm, kept, mode)
        except Exception:  # a description this torch cannot make again: the ops' way
            log.debug("fuseml: a kept graph's values propagated again", exc_info=True)
    return _propagated(gm, inputs, mode)


def _fake_mode():
    """dynamo's fake mode where there is one, as aot_autograd's graphs have (fuseml's passes
    find it through the tracing context and would not mix two)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    tc = torch._guards.TracingContext.try_get()
    return tc.fake_mode if tc is not None and tc.fake_mode is not None else FakeTensorMode()


def _from_layouts(gm, kept, mode):
    """Meta tensors made outside the fake mode (plain calls, no fake dispatch: about 20x
    cheaper a value than a fake as_strided), each wrapped as that mode's fake tensor on the
    value's device."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    storages, values = kept
    wrap = mode.fake_tensor_converter.from_meta_and_device
    with unset_fake_temporarily(), torch.no_grad():
        bases = [
            (torch.empty(nbytes // dtype.itemsize, dtype=dtype, device="meta"), torch.device(device))
            for nbytes, dtype, device in storages
        ]

        def made(f):
            kind, *rest = f
            if kind == "tensor":
                at, shape, stride, offset = rest
                base, device = bases[at]
                return wrap(mode, base.as_strided(shape, stride, offset), device)
            if kind == "value":
                return rest[0]
            items = [made(x) for x in rest[0]]
            return items if kind == "list" else tuple(items)

        vals = {name: made(f) for name, f in values.items()}
    fakes = []
    for n in gm.graph.nodes:
        if n.name in vals:
            n.meta["val"] = vals[n.name]
        elif n.op == "get_attr":
            value = operator.attrgetter(n.target)(gm)
            if isinstance(value, torch.Tensor):
                n.meta["val"] = mode.from_tensor(value, static_shapes=True)
        if n.op == "placeholder":
            fakes.append(vals[n.name])
    return fakes


def _propagated(gm, inputs, mode):
    fakes = []
    with mode:
        for d in inputs:
            if d[0] == "value":
                fakes.append(d[1])
                continue
            _, shape, stride, offset, dtype, device = d
            extent = offset + 1 + sum((s - 1) * st for s, st in zip(shape, stride)) if all(shape) else offset
            base = torch.empty(max(extent, 1), dtype=dtype, device=device)
            fakes.append(base.as_strided(shape, stride, offset))
        with torch.no_grad():
            _Values(gm, mode).run(*fakes)
    return fakes


class _Values(torch.fx.Interpreter):
    """Runs a graph on fake tensors, writing each node's value into its meta; a constant the
    graph holds (a real tensor) enters as a fake of it."""

    def __init__(self, gm, mode):
        super().__init__(gm)
        self.mode = mode

    def run_node(self, n):
        from torch._subclasses.fake_tensor import FakeTensor

        value = super().run_node(n)
        if n.op == "get_attr" and isinstance(value, torch.Tensor) and not isinstance(value, FakeTensor):
            value = self.mode.from_tensor(value, static_shapes=True)
        if n.op != "output":
            n.meta["val"] = value
        return value
