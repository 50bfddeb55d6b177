"""Convolution weights kept channels-last across an inference graph's calls
(weight_layout.py): one copy while the parameter is unchanged, a new one after any in-place
write or a new storage, none kept for a fake tensor, a parameter autograd tracks, an
inference tensor or inside a capture; the copy goes with its parameter; a compiled inference
graph reads its current weights after they change between calls."""

import gc

import torch

import fuseml
from fuseml import weight_layout
from fuseml.weight_layout import channels_last_weight

CL = torch.channels_last


def test_one_copy_while_the_weight_is_unchanged():
    w = torch.randn(8, 4, 3, 3)
    a, b = channels_last_weight(w), channels_last_weight(w)
    assert a is b and a.is_contiguous(memory_format=CL) and torch.equal(a, w)


def test_an_in_place_write_or_a_new_storage_makes_a_new_copy():
    w = torch.nn.Parameter(torch.randn(8, 4, 3, 3))
    with torch.no_grad():
        a = channels_last_weight(w)
        w.mul_(0.5)  # an optimizer step: same storage, the version moves
        b = channels_last_weight(w)
        assert b is not a and torch.equal(b, w)
        w.data = torch.randn(8, 4, 3, 3)  # a new storage under the same parameter
        c = channels_last_weight(w)
        assert c is not b and torch.equal(c, w)


def test_nothing_kept_where_a_change_could_not_be_seen():
    from torch._subclasses.fake_tensor import FakeTensorMode

    tracked = torch.nn.Parameter(torch.randn(8, 4, 3, 3))
    assert channels_last_weight(tracked) is not channels_last_weight(tracked)  # autograd sees it
    with torch.inference_mode():
        frozen = torch.randn(8, 4, 3, 3)
        assert channels_last_weight(frozen) is not channels_last_weight(frozen)  # no version counter
    with FakeTensorMode() as mode:
        fake = mode.from_tensor(torch.randn(8, 4, 3, 3))
        out = channels_last_weight(fake)
        assert out.is_contiguous(memory_format=CL) and fake not in weight_layout._kept


def test_the_copy_goes_with_its_parameter():
    before = len(weight_layout._kept)
    w = torch.randn(8, 4, 3, 3)
    channels_last_weight(w)
    assert len(weight_layout._kept) == before + 1
    del w
    gc.collect()
    assert len(weight_layout._kept) == before


class Stem(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.point = torch.nn.Conv2d(8, 8, 1)

    def forward(self, x):
        return self.point(torch.relu(self.conv(x))).mean((2, 3))


def test_an_inference_graph_reads_its_current_weights(dead_socket, monkeypatch):
    """A 3x3 convolution's weight goes through channels_last_weight (a 1x1 one's layouts are
    the same memory: it does not); between calls the weights change in place, as between an
    evaluation and a training step, and each call matches eager."""
    monkeypatch.setenv("FUSEML_CHANNELS_LAST", "on")
    torch.manual_seed(0)
    model = Stem().eval()
    c = fuseml.FuseMLCompiler()
    fn = torch.compile(model, backend=c)
    x = torch.randn(2, 3, 10, 10)
    with torch.no_grad():
        for step in range(4):
            torch.testing.assert_close(fn(x), model(x), atol=1e-5, rtol=1e-5)
            if step == 1:
                model.conv.weight.mul_(-0.5)
                model.point.weight.add_(0.25)
    (plan,) = c.plans
    assert plan.which == "inference"
    reads = [n for n in plan.compiled.gm.graph.nodes if n.target is channels_last_weight]
    assert len(reads) == 1
    assert model.conv.weight in weight_layout._kept and model.point.weight not in weight_layout._kept
