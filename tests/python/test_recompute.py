"""A training graph is split by the min-cut partitioner (the default; FUSEML_RECOMPUTE=0 turns
it off), which saves the inputs of cheap pointwise chains for the backward and recomputes the
chains there, instead of saving every intermediate the backward reads. Gradients stay eager's;
fewer tensors are saved."""

import pytest
import torch

import fuseml


class Block(torch.nn.Module):
    def __init__(self, d=32):
        super().__init__()
        self.norm = torch.nn.LayerNorm(d)
        self.fc1 = torch.nn.Linear(d, 4 * d)
        self.fc2 = torch.nn.Linear(4 * d, d)

    def forward(self, x):
        h = torch.nn.functional.gelu(self.fc1(self.norm(x)))
        return x + self.fc2(torch.sigmoid(h) * h * 0.5)


def _saved_and_grads(monkeypatch, recompute):
    if recompute is None:
        monkeypatch.delenv("FUSEML_RECOMPUTE", raising=False)
    else:
        monkeypatch.setenv("FUSEML_RECOMPUTE", recompute)
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = Block()
    x = torch.randn(16, 32, requires_grad=True)
    c = fuseml.FuseMLCompiler()
    y = torch.compile(model, backend=c)(x)
    (y * torch.linspace(-1, 1, y.numel()).view(y.shape)).sum().backward()
    fw = next(p for p in c.plans if p.which == "forward")
    gm = fw.compiled.gm if fw.compiled else None
    out = next(n for n in reversed(gm.graph.nodes) if n.op == "output").args[0]
    grads = [x.grad] + [p.grad for p in model.parameters()]
    model.zero_grad()
    x.grad = None
    ref = model(x)
    (ref * torch.linspace(-1, 1, ref.numel()).view(ref.shape)).sum().backward()
    want = [x.grad] + [p.grad for p in model.parameters()]
    return len(out), grads, want, y.detach(), ref.detach()


@pytest.mark.parametrize("recompute", ["0", "1"])
def test_gradients_are_eager_either_way(recompute, dead_socket, monkeypatch):
    monkeypatch.setenv("FUSEML_REQUEST_CPU_GRAPHS", "1")
    _, grads, want, y, ref = _saved_and_grads(monkeypatch, recompute)
    torch.testing.assert_close(y, ref)
    for g, w in zip(grads, want):
        torch.testing.assert_close(g, w)


def test_recompute_saves_fewer_tensors(dead_socket, monkeypatch):
    monkeypatch.setenv("FUSEML_REQUEST_CPU_GRAPHS", "1")
    saved_default = _saved_and_grads(monkeypatch, "0")[0]
    saved_min_cut = _saved_and_grads(monkeypatch, "1")[0]
    assert saved_min_cut < saved_default, (saved_min_cut, saved_default)


def test_recompute_is_the_default(dead_socket, monkeypatch):
    monkeypatch.setenv("FUSEML_REQUEST_CPU_GRAPHS", "1")
    assert _saved_and_grads(monkeypatch, None)[0] == _saved_and_grads(monkeypatch, "1")[0]
