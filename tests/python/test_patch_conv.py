"""A convolution over non-overlapping patches (a ViT's patch embedding) runs as a matrix product
over the unfolded image, forward and backward (patch_conv.py): results and gradients as
eager's, no convolution left in either graph, the output channels-last so that the tokens'
flatten and transpose are views. Overlapping, padded, dilated, grouped, transposed and 1 x 1
convolutions stay convolutions. A copy the forward makes twice (the image unfolded for the
product and for the weight's gradient) is made once (twin_copies.py)."""

import pytest
import torch
import torch.nn.functional as F

from graph_coverage import zoo_model
from helpers import rel_err

import fuseml
from fuseml import patch_conv, twin_copies

aten = torch.ops.aten
CONVS = {aten.convolution.default, aten.convolution_backward.default}


def _convs(partitioned):
    return [n for gm, _ in partitioned for n in gm.graph.nodes if n.target in CONVS]


def _patches(x, w, b):
    """timm's PatchEmbed: the convolution, then its pixels flattened into tokens."""
    return F.conv2d(x, w, b, stride=w.shape[-2:]).flatten(2).transpose(1, 2)


def _step(fn, x, w, b):
    y = fn(x, w, b)
    (y * torch.linspace(-1, 1, y.shape[-1])).sum().backward()
    return y


@pytest.mark.parametrize("bias,input_grad", [(True, False), (False, True)])
def test_patches_are_a_product_forward_and_backward(dead_socket, partitioned, bias, input_grad):
    g = torch.Generator().manual_seed(4)
    make = lambda *s, grad=True: torch.randn(*s, generator=g).requires_grad_(grad)  # noqa: E731
    x, w = make(2, 3, 16, 24, grad=input_grad), make(32, 3, 4, 4)
    b = make(32) if bias else None
    xe, we, be = (t.detach().clone().requires_grad_(t.requires_grad) if t is not None else None for t in (x, w, b))
    want = _step(_patches, xe, we, be)
    got = _step(torch.compile(_patches, backend=fuseml.FuseMLCompiler(), dynamic=False), x, w, b)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert got.is_contiguous()  # the product's rows are the tokens
    for t, e in ((x, xe), (w, we), (b, be)):
        if t is not None and t.requires_grad:
            torch.testing.assert_close(t.grad, e.grad, rtol=1e-4, atol=1e-4)
    assert len(partitioned) == 2 and not _convs(partitioned)
    fwd = [n.target for n in partitioned[0][0].graph.nodes]
    assert (aten.addmm.default if bias else aten.mm.default) in fwd
    # the image unfolded once, for the product and for the weight's gradient (twin_copies.py)
    assert fwd.count(aten.clone.default) == 1, partitioned[0][0].code


def test_a_copy_made_twice_is_made_once():
    """Two clones of the same view are one; a random op's twins, a clone of another view and
    a clone written in place stay apart."""
    g = torch.fx.Graph()
    x = g.placeholder("x")
    ups = [g.call_function(aten.permute.default, (x, [1, 0])) for _ in range(3)]
    copies = [g.call_function(aten.clone.default, (u,), {"memory_format": torch.contiguous_format}) for u in ups[:2]]
    other = g.call_function(aten.clone.default, (x,))
    noise = [g.call_function(aten.rand_like.default, (x,)) for _ in range(2)]
    # two more copies of x's transpose, one written in place after: each a buffer of its own
    ts = [g.call_function(aten.t.default, (x,)) for _ in range(2)]
    written = [g.call_function(aten.clone.default, (t,)) for t in ts]
    g.call_function(aten.add_.Tensor, (written[1], 1.0))
    g.output((*copies, ups[2], other, *noise, *written))
    gm = torch.fx.GraphModule(torch.nn.Module(), g)
    assert twin_copies.drop_twin_copies(gm) == 1
    targets = [n.target for n in gm.graph.nodes]
    # the dropped clone's view goes with it; the others stay, each with its readers
    assert targets.count(aten.clone.default) == 4 and targets.count(aten.permute.default) == 2
    assert targets.count(aten.rand_like.default) == 2


def test_other_convolutions_stay_convolutions():
    """The decompositions decline (NotImplemented): aten's convolution runs."""
    x, w = torch.randn(1, 3, 16, 16), torch.randn(8, 3, 4, 4)
    declined = [
        ((1, 1), (0, 0), (1, 1), False, 1),  # overlapping patches
        ((4, 4), (1, 1), (1, 1), False, 1),  # padded
        ((4, 4), (0, 0), (2, 2), False, 1),  # dilated
        ((4, 4), (0, 0), (1, 1), True, 1),  # transposed
    ]
    for stride, padding, dilation, transposed, groups in declined:
        assert (
            patch_conv.convolution(x, w, None, stride, padding, dilation, transposed, (0, 0), groups) is NotImplemented
        )
    assert (
        patch_conv.convolution(x, torch.randn(6, 1, 4, 4), None, (4, 4), (0, 0), (1, 1), False, (0, 0), 3)
        is NotImplemented
    )
    one = torch.randn(8, 3, 1, 1)  # ResNet's 1 x 1: channels_last.py lays it out instead
    assert patch_conv.convolution(x, one, None, (1, 1), (0, 0), (1, 1), False, (0, 0), 1) is NotImplemented
    ragged = torch.randn(1, 3, 18, 16)  # not a whole number of patches
    assert patch_conv.convolution(ragged, w, None, (4, 4), (0, 0), (1, 1), False, (0, 0), 1) is NotImplemented
    y = patch_conv.convolution(x, w, None, (4, 4), (0, 0), (1, 1), False, (0, 0), 1)
    torch.testing.assert_close(y, F.conv2d(x, w, stride=4), rtol=1e-5, atol=1e-5)


def test_an_overlapping_convolution_is_left_to_aten(dead_socket, partitioned):
    x, w = torch.randn(2, 3, 16, 16), torch.randn(8, 3, 3, 3)
    f = lambda x, w: F.conv2d(x, w, stride=1, padding=1)  # noqa: E731
    torch.testing.assert_close(torch.compile(f, backend=fuseml.FuseMLCompiler())(x, w), f(x, w))
    assert _convs(partitioned)


def test_a_vit_embeds_its_patches_with_a_product(dead_socket, partitioned):
    """timm's ViT at its tiny size: a training step's loss and patch-embedding gradients as
    eager's, and neither graph holds a convolution."""
    w = zoo_model("vit")
    w.model.train()
    torch.manual_seed(0)
    want = w.loss(w.model, w.inputs)
    want.backward()
    grads = {n: p.grad.clone() for n, p in w.model.named_parameters() if "patch_embed" in n}
    w.model.zero_grad()
    torch.manual_seed(0)
    got = w.loss(torch.compile(w.model, backend=fuseml.FuseMLCompiler()), w.inputs)
    got.backward()
    assert abs(got.item() - want.item()) < 2e-2 * abs(want.item())
    for n, p in w.model.named_parameters():
        if n in grads:
            assert rel_err(p.grad, grads[n]) < 2e-2, n
    assert not _convs(partitioned)
