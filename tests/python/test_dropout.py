"""Training with dropout on: the dropout's backward (grad * mask * scale) is a pointwise op that
joins the ops around it; the forward's dropout stays ATen's, so a step draws the same mask as
eager's and its gradients match eager's."""

import torch
import torch.nn.functional as F

from helpers import plan

import fuseml

aten = torch.ops.aten


class DropoutBlock(torch.nn.Module):
    """A transformer block's output path: projection, dropout, residual add, LayerNorm."""

    def __init__(self, d=64):
        super().__init__()
        self.proj = torch.nn.Linear(d, d)
        self.norm = torch.nn.LayerNorm(d)

    def forward(self, x):
        return self.norm(x + F.dropout(self.proj(x), 0.1, self.training))


def test_dropout_backward_fuses_and_gradients_match_eager(dead_socket):
    torch.manual_seed(0)
    model = DropoutBlock()
    x = torch.randn(32, 64, requires_grad=True)
    torch.manual_seed(1)
    want = model(x).square().sum()
    want_grads = torch.autograd.grad(want, [x, *model.parameters()])
    c = fuseml.FuseMLCompiler()
    compiled = torch.compile(model, backend=c)
    torch.manual_seed(1)
    got = compiled(x).square().sum()
    got_grads = torch.autograd.grad(got, [x, *model.parameters()])
    torch.testing.assert_close(got, want)
    for a, b in zip(got_grads, want_grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    bw = plan(c, "backward")
    (g,) = [g for g in bw.groups if "native_dropout_backward" in g.op_names]
    assert g.route == "kernel" and len(g.op_names) > 1, g.describe()
