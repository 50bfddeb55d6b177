"""Max pooling as window ops (vocabulary 7): torch.nn.functional.max_pool2d becomes
fuseml::max_pool2d, which gives each window's argmax as an f16 tap index that its gradient
reads instead of int64 indices; each is a group of its own in the forward and the backward
graph, results as eager's (here without a daemon: the ops' ATen forms), the fragments spelled
with their windows and accepted by a real fusemld (compile-only here); calls that cannot be
taken stay torch's."""

import pytest
import torch

from helpers import plan

import fuseml
from fuseml import max_pool

F = torch.nn.functional
CL = torch.channels_last


class Stem(torch.nn.Module):
    """ResNet's stem: conv, batch norm, ReLU, then the pooling under test, then a conv."""

    def __init__(self, **pool):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.pool = pool
        self.head = torch.nn.Conv2d(8, 4, 1)

    def forward(self, x):
        return self.head(F.max_pool2d(F.relu(self.bn(self.conv(x))), **self.pool))


WINDOWS = [
    dict(kernel_size=3, stride=2, padding=1),  # ResNet's
    dict(kernel_size=2),
    dict(kernel_size=(2, 3), stride=(1, 2), padding=(1, 0)),
    dict(kernel_size=3, stride=2, ceil_mode=True),
    dict(kernel_size=2, stride=1, dilation=2),
]


def step(model, x, backend=None):
    torch.manual_seed(1)
    fn = torch.compile(model, backend=backend) if backend is not None else model
    for p in model.parameters():
        p.grad = None
    xi = x.clone().requires_grad_()
    y = fn(xi)
    w = torch.linspace(-1, 1, y.numel()).view(y.shape)
    (y * w).sum().backward()
    return [y.detach(), xi.grad] + [p.grad for p in model.parameters()]


def window_groups(c, which):
    return [g for g in plan(c, which).groups if g.kind == "window"]


@pytest.mark.parametrize("pool", WINDOWS)
@pytest.mark.parametrize("layout", [torch.contiguous_format, CL])
def test_forward_and_backward_as_eager(dead_socket, pool, layout):
    torch.manual_seed(0)
    model = Stem(**pool)
    x = torch.randn(2, 3, 13, 11).to(memory_format=layout)
    want = step(model, x)
    c = fuseml.FuseMLCompiler()
    got = step(model, x, c)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)
    for which in ("forward", "backward"):
        (g,) = window_groups(c, which)
        assert g.route == "kernel", g.describe()
        wire = g.built.wire
        assert wire["vocab"] == 7
        names = [op["op"] for op in wire["ops"]]
        if which == "forward":  # the max and the argmax's taps, stored as f16
            assert names == ["max_pool2d", "max_pool2d_argmax", "cast"], names
            assert g.describe() == f"group {g.gid} [window] max_pool2d: kernel", g.describe()
            assert [o["dtype"] for o in wire["outputs"]] == ["f32", "f16"]
        else:  # from the output gradient and the taps
            assert names == ["max_pool2d_backward"], names
            assert [i["dtype"] for i in wire["inputs"]] == ["f32", "f16"]
        op = wire["ops"][0]
        k, s = pool["kernel_size"], pool.get("stride", pool["kernel_size"])
        k, s = (k, k) if isinstance(k, int) else k, (s, s) if isinstance(s, int) else s
        p, d = pool.get("padding", 0), pool.get("dilation", 1)
        p, d = (p, p) if isinstance(p, int) else p, (d, d)
        assert op["window"] == [k[0], k[1], s[0], s[1], p[0], p[1], d[0], d[1]]
        assert op["ceil_mode"] == pool.get("ceil_mode", False)


def test_no_indices_are_computed_or_saved(dead_socket, partitioned):
    """Neither graph computes int64 indices: the backward reads the output gradient and the
    forward's f16 taps, never the pooled input."""
    c = fuseml.FuseMLCompiler()
    step(Stem(kernel_size=3, stride=2, padding=1), torch.randn(2, 3, 16, 16), c)
    assert len(partitioned) == 2
    for gm, _ in partitioned:
        targets = {n.target for n in gm.graph.nodes}
        assert torch.ops.aten.max_pool2d_with_indices.default not in targets
        assert torch.ops.aten.max_pool2d_with_indices_backward.default not in targets
    (g,) = window_groups(c, "backward")
    assert [list(i.meta["val"].shape) for i in g.inputs] == [[2, 8, 8, 8], [2, 8, 8, 8]]
    assert [i.meta["val"].dtype for i in g.inputs] == [torch.float32, torch.float16]


def test_wire_follows_channels_last_strides(dead_socket):
    c = fuseml.FuseMLCompiler()
    step(Stem(kernel_size=3, stride=2, padding=1), torch.randn(2, 3, 16, 16).to(memory_format=CL), c)
    (g,) = window_groups(c, "forward")
    x, y = g.built.wire["inputs"][0], g.built.wire["outputs"][0]
    assert x["shape"] == [2, 8, 16, 16] and x["strides"] == [2048, 1, 128, 8]
    assert y["shape"] == [2, 8, 8, 8] and y["strides"] == [512, 1, 64, 8]


def test_inference_graph(dead_socket):
    torch.manual_seed(0)
    model = Stem(kernel_size=3, stride=2, padding=1).eval()
    x = torch.randn(2, 3, 12, 12)
    c = fuseml.FuseMLCompiler()
    with torch.no_grad():
        want = model(x)
        got = torch.compile(model, backend=c)(x)
    torch.testing.assert_close(got, want)
    (g,) = window_groups(c, "inference")
    # the max alone is stored (the canonical form drops the unread argmax)
    assert len(g.built.wire["outputs"]) == 1 and g.built.wire["ops"][0]["op"] == "max_pool2d"


@pytest.mark.parametrize(
    "call",
    [
        lambda x: F.max_pool2d(x, 2, return_indices=True)[0],  # the indices are the user's
        lambda x: F.max_pool1d(x.flatten(2), 2),  # 1-D pooling
        lambda x: F.avg_pool2d(x, 2),
    ],
)
def test_calls_not_taken_stay_torch(dead_socket, call):
    x = torch.randn(2, 3, 8, 8)
    c = fuseml.FuseMLCompiler()
    torch.testing.assert_close(torch.compile(call, backend=c)(x), call(x))
    assert not window_groups(c, "inference")


def test_rewrite_needs_cuda_unless_asked(monkeypatch, dead_socket):
    """A CPU graph keeps torch's max_pool2d: its groups run as ATen, where the backward's
    second forward would cost time for nothing."""
    monkeypatch.delenv("FUSEML_REQUEST_CPU_GRAPHS")
    seen = []
    rewrite = max_pool.rewrite
    monkeypatch.setattr(max_pool, "rewrite", lambda gm: seen.append(rewrite(gm)) or seen[-1])
    x = torch.randn(2, 3, 8, 8)
    fn = torch.compile(lambda x: F.max_pool2d(x, 2) * 2, backend=fuseml.FuseMLCompiler())
    torch.testing.assert_close(fn(x), F.max_pool2d(x, 2) * 2)
    assert seen == [0]


def test_ops_run_as_aten_with_nan_and_ties():
    """The ops' ATen forms (what runs without a daemon) are torch's max_pool2d and its
    gradient, NaN and ties included; the taps name each window's argmax."""
    x = torch.randn(2, 3, 9, 9)
    x[0, 0, 2, 2] = float("nan")
    x[1, 1, :4, :4] = 0.5  # ties: the first tap of a window wins
    window = ([3, 3], [2, 2], [1, 1], [1, 1], False)
    xi, xj = x.clone().requires_grad_(), x.clone().requires_grad_()
    y, taps = torch.ops.fuseml.max_pool2d(xi, *window)
    ref, indices = F.max_pool2d(xj, 3, 2, 1, return_indices=True)
    torch.testing.assert_close(y, ref, equal_nan=True)
    assert taps.dtype == torch.float16 and 0 <= taps.min() and taps.max() < 9
    oh, ow = torch.arange(5).view(-1, 1), torch.arange(5)
    h, w = oh * 2 - 1 + taps.long() // 3, ow * 2 - 1 + taps.long() % 3
    assert torch.equal(h * 9 + w, indices)
    g = torch.randn_like(y)
    (gx,) = torch.autograd.grad(y, xi, g)
    (gr,) = torch.autograd.grad(ref, xj, g)
    torch.testing.assert_close(gx, gr, equal_nan=True)


def test_daemon_accepts_the_fragments(daemon):
    c = fuseml.FuseMLCompiler()
    step(Stem(kernel_size=3, stride=2, padding=1), torch.randn(2, 3, 16, 16).to(memory_format=CL), c)
    gs = window_groups(c, "forward") + window_groups(c, "backward")
    assert len(gs) == 2
    # the daemon answered ok with a kernel (compile-only here: not yet tuned on a GPU)
    assert all(g.key and g.state in ("untuned", "tuned") for g in gs), [g.describe() for g in gs]
