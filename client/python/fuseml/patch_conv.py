"""A convolution over non-overlapping patches as a matrix product, forward and backward
(decompositions applied while aot_autograd traces the graph).

A vision transformer embeds its image with a convolution whose kernel is its stride (ViT-S/16:
3 -> 384 channels, 16 x 16 patches, no padding): every pixel is read once, by one patch, so the
convolution is a product of the image's patches unfolded into rows, [N * Ho * Wo, C * kh * kw],
with the weight as [O, C * kh * kw]. cuDNN runs it as a general implicit-GEMM convolution whose
3 input channels it first pads to 8: 0.29 ms forward and 0.19 ms backward of a ViT-S training
step of batch 64 on an H200, for 7.4 GFLOP each way (about 15 us apiece on the tensor cores).
Spelled here as the unfold (a copy of the image, its one read) and a product cuBLAS or a fused
kernel runs, with the bias in the product's epilogue.

The product's rows are the output's pixels, so its result is the output channels-last
([N, Ho, Wo, O] read as [N, O, Ho, Wo]): what a ViT then flattens and transposes into its
tokens, [N, Ho * Wo, O], with no copy. The backward gives the input's gradient (when asked) as
the product of the output's gradient with the weight folded back into the image, the weight's
as the product of the gradient's transpose with the unfolded image, the bias's as the
gradient's column sum.

Taken when the kernel covers more than one pixel and equals the stride, there is no padding or
dilation, one group, not transposed, and the image is a whole number of patches of static
sizes; a 1 x 1 convolution (ResNet's) stays a convolution, which channels_last.py lays out."""

import torch

from .shapes import is_plain_int

aten = torch.ops.aten


def _patches(x, w, stride, padding, dilation, transposed, groups):
    """(kh, kw) when the convolution of x by w reads x in non-overlapping patches (above)."""
    if transposed or groups != 1 or x.dim() != 4 or w.dim() != 4:
        return None
    if not all(is_plain_int(d) for d in (*x.shape, *w.shape)):
        return None
    kh, kw = int(w.shape[2]), int(w.shape[3])
    if kh * kw == 1 or list(stride) != [kh, kw] or any(p != 0 for p in padding) or any(d != 1 for d in dilation):
        return None
    if x.shape[2] % kh or x.shape[3] % kw:
        return None
    return kh, kw


def _unfold(x, kh, kw):
    """x [N, C, H, W] as its patches' rows, [N * Ho * Wo, C * kh * kw]."""
    n, c, h, w = x.shape
    return x.view(n, c, h // kh, kh, w // kw, kw).permute(0, 2, 4, 1, 3, 5).reshape(n * (h // kh) * (w // kw), -1)


def convolution(x, w, bias, stride, padding, dilation, transposed, output_padding, groups):
    k = _patches(x, w, stride, padding, dilation, transposed, groups)
    if k is None:
        return NotImplemented
    n, _, h, wd = x.shape
    o, (kh, kw) = w.shape[0], k
    rows = _unfold(x, kh, kw)
    weight = w.reshape(o, -1).t()
    y = torch.mm(rows, weight) if bias is None else torch.addmm(bias, rows, weight)
    return y.view(n, h // kh, wd // kw, o).permute(0, 3, 1, 2)


def convolution_backward(
    grad, x, w, bias_sizes, stride, padding, dilation, transposed, output_padding, groups, output_mask
):
    k = _patches(x, w, stride, padding, dilation, transposed, groups)
    if k is None:
        return NotImplemented
    n, c, h, wd = x.shape
    o, (kh, kw) = w.shape[0], k
    ho, wo = h // kh, wd // kw
    g = grad.permute(0, 2, 3, 1).reshape(n * ho * wo, o)  # a view of a channels-last gradient
    dx = dw = db = None
    if output_mask[0]:
        dx = torch.mm(g, w.reshape(o, -1)).view(n, ho, wo, c, kh, kw).permute(0, 3, 1, 4, 2, 5).reshape(n, c, h, wd)
    if output_mask[1]:
        dw = torch.mm(g.t(), _unfold(x, kh, kw)).view(w.shape)
    if output_mask[2]:
        db = g.sum(0)
    return dx, dw, db


DECOMPOSITIONS = {aten.convolution.default: convolution, aten.convolution_backward.default: convolution_backward}
