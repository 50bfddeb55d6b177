"""An index_put into a buffer made for it, written in place (fresh_buffers.py): the inverse of
a permutation (`inv[perm] = arange`, Hugging Face's experts) leaves the graph as index_put_ on
its empty buffer with eager's values; an index_put into a buffer someone else reads too, into
an input, or accumulating stays ATen's functional one."""

import torch

from helpers import plan

import fuseml
from fuseml import fresh_buffers

aten = torch.ops.aten


def _inverse(perm):
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(perm.numel())
    return inv * 1


def _shared(perm):
    inv = torch.zeros_like(perm)
    before = inv + 1  # the buffer's zeros read too: writing it in place would change this
    inv[perm] = torch.arange(perm.numel())
    return inv, before


def _into_input(x, perm):
    y = x.clone()
    x[perm] = torch.arange(perm.numel())
    return x + y


def _targets(c):
    return [n.target for n in plan(c, "inference").compiled.gm.graph.nodes if n.op == "call_function"]


def test_an_inverse_permutation_is_written_in_place(dead_socket):
    perm = torch.randperm(37)
    c = fuseml.FuseMLCompiler()
    got = torch.compile(_inverse, backend=c)(perm)
    assert torch.equal(got, _inverse(perm))
    targets = _targets(c)
    assert fresh_buffers.index_put_into in targets and aten.index_put.default not in targets


def test_a_buffer_read_elsewhere_or_an_input_stays(dead_socket):
    perm = torch.randperm(37)
    c = fuseml.FuseMLCompiler()
    got = torch.compile(_shared, backend=c)(perm)
    want = _shared(perm)
    assert all(torch.equal(g, w) for g, w in zip(got, want))
    assert fresh_buffers.index_put_into not in _targets(c)

    x = torch.zeros(37, dtype=torch.int64)
    c = fuseml.FuseMLCompiler()
    got = torch.compile(_into_input, backend=c)(x.clone(), perm)
    assert torch.equal(got, _into_input(x.clone(), perm))
    assert fresh_buffers.index_put_into not in _targets(c)


def test_accumulating_stays():
    from torch.fx.experimental.proxy_tensor import make_fx

    def add(i, v):
        return aten.index_put.default(torch.empty(5), [i], v, True)

    gm = make_fx(add, tracing_mode="fake")(torch.tensor([0, 1]), torch.ones(2))
    assert fresh_buffers.rewrite(gm) == 0
