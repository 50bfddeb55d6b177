"""cross_entropy without fp32 log-probabilities (cross_entropy.py): every variant it takes
matches torch's cross_entropy, loss and gradient, forward as one rows kernel and backward as
one pointwise kernel, with no [N, C] fp32 value saved; the variants it does not take stay
torch's; a target out of range fails as torch's does."""

import pytest
import torch
import torch.nn.functional as F

from helpers import plan, rel_err

import fuseml
from fuseml import cross_entropy

BF16 = torch.bfloat16
N, C = 24, 96


def _logits_and_targets(dtype=BF16, ignored=(3, 7), classes=C):
    torch.manual_seed(0)
    x = (torch.randn(2, N // 2, classes) * 3).to(dtype)
    t = torch.randint(0, classes, (2, N // 2))
    for i in ignored:
        t.view(-1)[i] = -100
    return x, t


def _hf_loss(x, t, **kw):
    """Hugging Face's causal-LM loss: upcast, flatten, cross_entropy."""
    return F.cross_entropy(x.float().view(-1, x.shape[-1]), t.view(-1), **kw)


def _run(f, x, t, compiler=None):
    """(loss, gradient of x) of f, eager and compiled."""
    out = []
    for fn in (f, torch.compile(f, backend=compiler or fuseml.FuseMLCompiler())):
        xi = x.detach().clone().requires_grad_(True)
        loss = fn(xi, t)
        loss.float().sum().backward() if loss.dim() else loss.backward()
        out.append((loss.detach(), xi.grad))
    return out


def _close(got, want):
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and a.shape == b.shape
        err = rel_err(a, b)
        assert err == err and err < 1e-2, err  # NaN never passes


@pytest.mark.parametrize("kw", [{}, {"reduction": "sum"}, {"reduction": "none"}, {"ignore_index": 5}])
def test_hugging_face_loss_matches_torch(dead_socket, kw):
    """The upcast is looked through (the function reads the bf16 logits); loss in fp32 and a
    bf16 gradient, as torch's; ignored targets add nothing."""
    x, t = _logits_and_targets()
    if "ignore_index" in kw:
        t[t == -100] = 5
    c = fuseml.FuseMLCompiler()
    (want, want_g), (got, got_g) = _run(lambda x, t: _hf_loss(x, t, **kw), x, t, c)
    _close([got, got_g], [want, want_g])
    fw, bw = plan(c, "forward"), plan(c, "backward")
    names = [str(n.target) for p in (fw, bw) for n in p.compiled.gm.graph.nodes if n.op == "call_function"]
    assert names and not [n for n in names if "nll_loss" in n or "log_softmax" in n]
    # the softmax's rows (the loss's masked sum and count are a rows group of one row)
    (rows,) = [g for g in fw.groups if g.kind == "rows" and "amax" in g.op_names]
    assert rows.route == "kernel" and {"amax", "eq", "where"} <= set(rows.op_names), fw.describe()
    # the input it reads is the bf16 logits: no fp32 copy of them is made
    assert {n.meta["val"].dtype for n in rows.inputs if n.meta["val"].dim() == 2 and n.meta["val"].shape[-1] == C} == {
        BF16
    }
    (bwd,) = [g for g in bw.groups if g.kind == "pointwise" and "exp" in g.op_names]
    assert bwd.route == "kernel" and "eq" in bwd.op_names, bw.describe()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_direct_input_matches_torch(dead_socket, dtype):
    """A 2-D input given as it is (fp32, or f16 without an upcast: torch computes it in
    fp32 internally and returns the loss in f16)."""
    x, t = _logits_and_targets(dtype)
    (want, want_g), (got, got_g) = _run(lambda x, t: F.cross_entropy(x.view(-1, C), t.view(-1)), x, t)
    _close([got, got_g], [want, want_g])


def test_every_target_ignored_gives_nan_as_torch(dead_socket):
    x, t = _logits_and_targets(ignored=range(N))
    (want, _), (got, got_g) = _run(_hf_loss, x, t)
    assert torch.isnan(want) and torch.isnan(got)


def test_no_fp32_row_set_is_saved(dead_socket):
    """The forward saves for the backward nothing [N, C] in fp32 (torch's saves the
    log-probabilities): the backward's inputs are the bf16 logits and [N]/[N, 1] values."""
    x, t = _logits_and_targets()
    c = fuseml.FuseMLCompiler()
    _run(_hf_loss, x, t, c)
    bw = plan(c, "backward")
    saved = [n.meta["val"] for n in bw.compiled.gm.graph.nodes if n.op == "placeholder"]
    big = [v for v in saved if isinstance(v, torch.Tensor) and v.numel() >= N * C]
    assert big and all(v.dtype == BF16 for v in big), [(v.shape, v.dtype) for v in saved]


@pytest.mark.parametrize(
    "f",
    [
        lambda x, t: F.cross_entropy(x.float().view(-1, C), t.view(-1), label_smoothing=0.1),
        lambda x, t: F.cross_entropy(x.float().view(-1, C), t.view(-1), weight=torch.linspace(0.5, 2, C)),
        lambda x, t: F.cross_entropy(x.float().transpose(1, 2), t),  # [B, C, S]
        lambda x, t: F.cross_entropy(x.float().view(-1, C), F.one_hot(t.view(-1).clamp(min=0), C).float()),
    ],
)
def test_variants_not_taken_stay_torch(dead_socket, f):
    """Label smoothing, class weights, a class dim that is not the last of a 2-D input,
    probability targets: torch's cross_entropy runs (nll_loss in the graph), results as eager."""
    x, t = _logits_and_targets()
    t = t.clamp(min=0)
    c = fuseml.FuseMLCompiler()
    (want, want_g), (got, got_g) = _run(f, x, t, c)
    _close([got, got_g], [want, want_g])
    fw = plan(c, "forward")
    assert not [g for g in fw.groups if "eq" in g.op_names and "amax" in g.op_names], fw.describe()


def test_target_out_of_range_fails(dead_socket):
    """As torch's: an error, never a silent loss (a device-side assert on CUDA)."""
    x, t = _logits_and_targets()
    t[0, 0] = C
    with pytest.raises(Exception, match="out of bounds"):
        torch.compile(_hf_loss, backend=fuseml.FuseMLCompiler())(x, t)


def test_rewrite_counts_and_leaves_other_graphs(dead_socket):
    """rewrite() on Dynamo's graph: one call replaced, the upcast and view it looked through
    gone; a graph without cross_entropy is left as it was."""
    graphs = []

    def grab(gm, ex):
        graphs.append(gm)
        return gm

    x, t = _logits_and_targets()
    torch.compile(_hf_loss, backend=grab)(x, t)
    gm = graphs[-1]
    assert cross_entropy.rewrite(gm) == 1
    calls = [n for n in gm.graph.nodes if n.op in ("call_function", "call_method")]
    assert [n.target for n in calls if n.target is cross_entropy.fused_cross_entropy]
    assert not [n for n in calls if n.target == "float"]
    torch.testing.assert_close(gm(x, t)[0], _hf_loss(x, t))
    torch.compile(lambda x: x * 2, backend=grab)(x)
    assert cross_entropy.rewrite(graphs[-1]) == 0


@pytest.mark.parametrize("classes", [C, 40000])
def test_daemon_accepts_the_fragments(daemon, classes):
    """A real fusemld (compile-only here) accepts the forward rows fragment (streamed over a
    vocabulary longer than registers hold) and the backward pointwise fragment."""
    x, t = _logits_and_targets(classes=classes)
    c = fuseml.FuseMLCompiler()
    _run(_hf_loss, x, t, c)
    ks = [g for p in (plan(c, "forward"), plan(c, "backward")) for g in p.kernels()]
    assert ks and all(g.key and g.state in ("untuned", "tuned") for g in ks), [
        (g.describe(), g.reason) for g in ks if not g.key
    ]
