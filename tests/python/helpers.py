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


def rel_err(a, b):
    """||a - b|| / ||b||, in fp32."""
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm()).item()


def close_bf16(got, want):
    """bf16 outputs and gradients: ||got - want|| / ||want|| below 1e-2 each, never NaN."""
    (y, grads), (y0, grads0) = got, want
    for a, b in zip([y] + grads, [y0] + grads0):
        err = rel_err(a, b)
        assert err == err and err < 1e-2, err   # err == err: NaN never passes


def median_ms(fns, reps=30):
    """Interleaved CUDA-event medians of each fn in fns (the order rotates every rep); for the
    device scripts."""
    times = [[] for _ in fns]
    for r in range(reps):
        order = list(range(len(fns)))
        order = order[r % len(order):] + order[:r % len(order)]
        for i in order:
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fns[i]()
            e.record()
            times[i].append((s, e))
    torch.cuda.synchronize()
    return [sorted(s.elapsed_time(e) for s, e in t)[len(t) // 2] for t in times]


def plan(compiler, which):
    plans = [p for p in compiler.plans if p.which == which]
    assert plans, f"no {which} graph compiled"
    return plans[-1]
