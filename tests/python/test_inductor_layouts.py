"""rest="inductor": Inductor compiles a graph against the strides each fuseml::group call's
fake returns and asserts them at every call. A group given to Inductor returns its kernel's
layout from its fake and from every call, whichever route runs (its ATen ops are copied into
that layout where theirs differ): Gemma 2's training step under rest="inductor" failed on a
group whose call returned other strides than its fake."""

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from helpers import rel_err

import fuseml
from fuseml import runtime


class TransposedRead(torch.nn.Module):
    """A pointwise result of a transposed read: ATen's ops keep the read's strides."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(24))

    def forward(self, x):
        return torch.tanh(x.transpose(1, 2)) * self.w[:, None]  # [B, 24, 16], strides (384, 1, 24)


def _given_to_inductor(c):
    """The runners of c's groups that Inductor's code calls."""
    groups = {id(g) for p in c.plans for g in p.kernels()}
    return [r for r in list(runtime._registry.values()) if id(r.group) in groups and r.fixed_layout]


def _inputs(runner):
    return [
        torch.randn(n.meta["val"].shape).as_strided(n.meta["val"].shape, n.meta["val"].stride())
        for n in runner.group.inputs
    ]


def test_groups_given_to_inductor_train_as_eager(served):
    torch.manual_seed(0)
    m, ref = TransposedRead(), TransposedRead()
    ref.load_state_dict(m.state_dict())
    x = torch.randn(2, 16, 24)
    c = fuseml.FuseMLCompiler(rest="inductor")
    for _ in range(3):
        m.w.grad = ref.w.grad = None
        got = torch.compile(m, backend=c)(x)
        want = ref(x)
        got.square().sum().backward()
        want.square().sum().backward()
        assert rel_err(got, want) < 1e-5 and rel_err(m.w.grad, ref.w.grad) < 1e-5
    assert {r.name.split(" (")[1] for r in _given_to_inductor(c)} == {"tanh -> mul)"}


def test_a_group_returns_its_kernels_layout_from_its_fake_and_every_call(served):
    """The forward's group as a kernel writing its output row-major would declare it (its
    built layout set so): the fake says row-major, and a call that runs the ATen ops (no GPU
    here), whose result is transposed, returns the same values row-major."""
    c = fuseml.FuseMLCompiler(rest="inductor")
    torch.compile(TransposedRead(), backend=c)(torch.randn(2, 16, 24))
    runner = _given_to_inductor(c)[0]
    xs = _inputs(runner)
    (aten_out,) = runner.eager(xs)
    assert aten_out.stride() == (384, 1, 24)
    runner.built.out_fixed = [([2, 24, 16], [384, 16, 1])]
    (out,) = runner.run(xs)
    assert out.stride() == (384, 16, 1) and torch.equal(out, aten_out)
    with FakeTensorMode() as mode:
        (fake,) = runner.fake([mode.from_tensor(x) for x in xs])
    assert fake.stride() == (384, 16, 1) and fake.shape == out.shape
    runner.fixed_layout = False  # a group only fuseml runs returns what its route makes
    assert runner.run(xs)[0].stride() == (384, 1, 24)
