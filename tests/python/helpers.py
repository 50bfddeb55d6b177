import torch

import fuseml


def compile_run(model, x, compiler=None, train=True, **kw):
    """Compiles model with a FuseMLCompiler, runs it (and backward when train), and returns
    (compiler, output, grads) next to eager's (output, grads)."""
    compiler = compiler or fuseml.FuseMLCompiler()
    params = list(model.parameters())

    def go(fn):
        for p in params:
            p.grad = None
        xi = x.detach().clone().requires_grad_(train)
        if train:
            y = fn(xi)
            (y.float() * torch.linspace(-1, 1, y.numel()).view(y.shape)).sum().backward()
            return y.detach(), [p.grad.clone() for p in params] + [xi.grad.clone()]
        with torch.no_grad():
            return fn(xi), []

    want = go(model)
    got = go(torch.compile(model, backend=compiler, **kw))
    return compiler, got, want


def assert_close(got, want, atol=1e-5, rtol=1e-5):
    (y, grads), (y0, grads0) = got, want
    torch.testing.assert_close(y, y0, atol=atol, rtol=rtol)
    assert len(grads) == len(grads0)
    for g, g0 in zip(grads, grads0):
        torch.testing.assert_close(g, g0, atol=atol, rtol=rtol)


def close_bf16(got, want):
    """bf16 outputs and gradients: ||got - want|| / ||want|| below 1e-2 each, never NaN."""
    (y, grads), (y0, grads0) = got, want
    for a, b in zip([y] + grads, [y0] + grads0):
        err = (a.float() - b.float()).norm() / b.float().norm()
        assert torch.isfinite(err) and err < 1e-2, err


def plan(compiler, which):
    plans = [p for p in compiler.plans if p.which == which]
    assert plans, f"no {which} graph compiled"
    return plans[-1]
