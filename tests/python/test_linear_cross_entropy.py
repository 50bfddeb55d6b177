"""A language model's head and loss whose backward walks the vocabulary in column blocks
(linear_cross_entropy.py): loss, logits and both gradients match torch's within eager bf16's
error against fp32, saved or recomputed logits, any reduction, ignored targets, a used logits
output; the backward holds no [tokens, vocabulary] value but the saved logits (none when
recomputed); what it does not take stays cross_entropy.py's."""

import pytest
import torch
import torch.nn.functional as F

from graph_coverage import is_view
from helpers import plan, rel_err

import fuseml
from fuseml import cross_entropy, linear_cross_entropy

BF16 = torch.bfloat16
B, S, D, V = 2, 20, 32, 200  # 40 tokens; 200 columns: blocks of 48 leave one of 8


def _inputs(dtype=BF16, ignored=(3, 11)):
    torch.manual_seed(0)
    h = torch.randn(B, S, D).to(dtype)
    w = (torch.randn(V, D) * 0.3).to(dtype)
    t = torch.randint(0, V, (B * S,))
    for i in ignored:
        t[i] = -100
    return h, w, t


def _step(f, h, w, t, logits_weight):
    """(logits, loss, dh, dw) of f, the loss and (when logits_weight) the logits both read by
    what is differentiated."""
    h, w = h.clone().requires_grad_(True), w.clone().requires_grad_(True)
    logits, loss = f(h, w, t)
    total = loss.float().sum()
    if logits_weight:
        total = total + (logits.float() * logits_weight).sum()
    total.backward()
    return logits.detach(), loss.detach(), h.grad, w.grad


def _torch_head(reduction="mean", ignore_index=-100):
    def f(h, w, t):
        logits = F.linear(h, w)
        return logits, F.cross_entropy(logits.float().view(-1, V), t, ignore_index=ignore_index, reduction=reduction)

    return f


def _within_eager_error(got, eager, exact):
    """Each value no further from fp32's than eager bf16's, give or take a rounding; never NaN."""
    for g, e, x in zip(got, eager, exact):
        assert g.shape == e.shape and g.dtype == e.dtype
        err, bar = rel_err(g.float(), x.float()), rel_err(e.float(), x.float())
        assert err == err and err <= 1.25 * bar + 1e-3, (err, bar)


@pytest.mark.parametrize("keep", [True, False], ids=["saved", "recomputed"])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("block", [48, 40])  # an uneven last block; equal blocks
def test_blocks_match_torch(keep, reduction, block):
    h, w, t = _inputs()
    fused = lambda h, w, t: linear_cross_entropy.fused_linear_cross_entropy(  # noqa: E731
        h, w, t, reduction=reduction, out_dtype=torch.float32, block=block, keep_logits=keep
    )
    for logits_weight in (0.0, 0.01):
        eager = _step(_torch_head(reduction), h, w, t, logits_weight)
        exact = _step(_torch_head(reduction), h.float(), w.float(), t, logits_weight)
        got = _step(fused, h, w, t, logits_weight)
        _within_eager_error(got, eager, [x.to(e.dtype) for x, e in zip(exact, eager)])


@pytest.mark.parametrize("block", [-8, 2.5, "8"])
def test_a_block_that_is_no_column_count_is_refused(block):
    """A clear error, not an empty walk over the vocabulary."""
    h, w, t = _inputs()
    with pytest.raises(ValueError, match="block must be a positive number of columns"):
        linear_cross_entropy.fused_linear_cross_entropy(h, w, t, block=block)


def test_block_columns():
    """About BLOCK_VALUES values, a multiple of 8, a divisor of the vocabulary when one is near,
    never under MIN_BLOCK, the whole row when it is short."""
    assert linear_cross_entropy.block_columns(4096, 32000) == 8000  # Llama: 4 equal blocks
    assert linear_cross_entropy.block_columns(4096, 128256) == 8016  # Llama 3: 16
    assert linear_cross_entropy.block_columns(4096, 8 * 5003) == 8192  # no divisor near: 8 + 7832
    assert linear_cross_entropy.block_columns(1 << 20, 32000) == linear_cross_entropy.MIN_BLOCK
    assert linear_cross_entropy.block_columns(64, 32000) == 32000


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks of 48 columns over the tests' 40 tokens (a real head's are 2^25 values)."""
    monkeypatch.setattr(linear_cross_entropy, "BLOCK_VALUES", 48 * B * S)
    monkeypatch.setattr(linear_cross_entropy, "MIN_BLOCK", 16)


class _Head(torch.nn.Module):
    """A decoder's last norm, its head and Hugging Face's loss; the logits returned beside it."""

    def __init__(self, bias=False, classes=V):
        super().__init__()
        self.norm = torch.nn.LayerNorm(D)
        self.lm_head = torch.nn.Linear(D, classes, bias=bias)

    def forward(self, x, labels, peek=False):
        logits = self.lm_head(self.norm(x))
        top = logits.argmax(-1) if peek else None  # read before the loss
        loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), labels)
        return (loss, logits) if top is None else (loss, logits, top)


def _train(model, x, t, compiler=None, **kw):
    """(loss, grads of every parameter and of x) of one step, eager or compiled."""
    model.zero_grad()
    x = x.clone().requires_grad_(True)
    fn = model if compiler is None else torch.compile(model, backend=compiler)
    loss = fn(x, t, **kw)[0]
    loss.backward()
    return [loss.detach(), x.grad] + [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("mode", ["blocks", "recompute"])
def test_compiled_head_matches_torch_and_holds_no_logits_gradient(dead_socket, small_blocks, monkeypatch, mode):
    """Through the backend: the rewrite takes the head, results as eager's; the backward's
    inputs hold one [tokens, vocabulary] value besides the logits' own gradient when saved,
    none when recomputed, and no value it computes is that large; each block's gradient is a
    fused group."""
    monkeypatch.setenv("FUSEML_LOGITS", mode)
    h, _, t = _inputs()
    torch.manual_seed(1)
    model = _Head().to(BF16)
    eager = _train(model, h, t)
    ref = _Head().float()
    ref.load_state_dict({k: v.float() for k, v in model.state_dict().items()})
    exact = [g.to(e.dtype) for g, e in zip(_train(ref, h.float(), t), eager)]
    c = fuseml.FuseMLCompiler()
    got = _train(model, h, t, c)
    _within_eager_error(got, eager, exact)
    bw = plan(c, "backward")
    graph = bw.compiled.gm.graph
    big = lambda n: isinstance(n.meta.get("val"), torch.Tensor) and n.meta["val"].numel() >= B * S * V  # noqa: E731
    inputs = [n for n in graph.nodes if n.op == "placeholder" and big(n)]
    assert len(inputs) == (2 if mode == "blocks" else 1), [n.name for n in inputs]
    made = [n for n in graph.nodes if n.op == "call_function" and big(n) and not is_view(n.target)]
    assert not made, bw.describe()
    blocks = [g for g in bw.groups if "exp" in g.op_names and "eq" in g.op_names]
    assert len(blocks) == -(-V // 48) and all(g.route == "kernel" for g in blocks), bw.describe()


def _fused_calls(model, x, t, mode="blocks", **kw):
    """How many fused head calls the rewrite (in `mode`) leaves in the Dynamo graph of
    model(x, t)."""
    graphs = []

    def grab(gm, ex):
        graphs.append(gm)
        return gm

    torch.compile(model, backend=grab)(x, t, **kw)
    (gm,) = graphs
    taken = linear_cross_entropy.rewrite(gm, mode)
    calls = [n for n in gm.graph.nodes if n.target is linear_cross_entropy.fused_linear_cross_entropy]
    assert len(calls) == taken
    return taken


@pytest.mark.parametrize(
    "model,kw",
    [
        (_Head(bias=True), {}),  # a bias
        (_Head(classes=V + 4), {}),  # a vocabulary not a multiple of 8
        (_Head(), {"peek": True}),  # the logits read before the loss
        (_Head().float(), {}),  # an fp32 head
    ],
    ids=["bias", "vocabulary", "peek", "fp32"],
)
def test_heads_not_taken_stay_cross_entropy(dead_socket, small_blocks, model, kw):
    """Left to cross_entropy.py, results as eager's."""
    dtype = next(model.parameters()).dtype
    model = model.to(dtype)
    h, _, t = _inputs(dtype)
    t = t.clamp(max=model.lm_head.out_features - 1)
    assert _fused_calls(model, h, t, **kw) == 0
    c = fuseml.FuseMLCompiler(logits="blocks")
    want, got = _train(model, h, t, **kw), _train(model, h, t, c, **kw)
    for g, e in zip(got, want):
        assert rel_err(g.float(), e.float()) < 2e-2
    assert [n for n in plan(c, "forward").compiled.gm.graph.nodes if "amax" in str(n.target)]


def test_taken_head_in_the_dynamo_graph(dead_socket, small_blocks, monkeypatch):
    """One call replaced in either mode; none by default ("whole"), nor for an unknown value."""
    model = _Head().to(BF16)
    h, _, t = _inputs()
    assert _fused_calls(model, h, t) == 1
    assert _fused_calls(model, h, t, mode="recompute") == 1
    for value in (None, "whole", "save"):
        if value is None:
            monkeypatch.delenv("FUSEML_LOGITS", raising=False)
        else:
            monkeypatch.setenv("FUSEML_LOGITS", value)
        assert _fused_calls(model, h, t, mode=None) == 0
    with pytest.raises(ValueError, match="logits"):
        fuseml.FuseMLCompiler(logits="save")


def test_a_short_vocabulary_is_one_block_and_not_taken(dead_socket):
    """At the real block size, 40 tokens of 200 columns are one block: nothing to walk."""
    h, _, t = _inputs()
    assert _fused_calls(_Head().to(BF16), h, t) == 0


def test_target_out_of_range_fails(dead_socket, small_blocks):
    h, _, t = _inputs()
    t[0] = V
    with pytest.raises(Exception, match="out of bounds"):
        torch.compile(_Head().to(BF16), backend=fuseml.FuseMLCompiler(logits="blocks"))(h, t)


def test_daemon_accepts_the_fragments(daemon, small_blocks, monkeypatch):
    """A real fusemld (compile-only here) accepts every fragment of the head's forward and of
    its backward's blocks, saved and recomputed."""
    h, _, t = _inputs()
    for mode in ("blocks", "recompute"):
        c = fuseml.FuseMLCompiler(logits=mode)
        _train(_Head().to(BF16), h, t, c)
        ks = [g for p in (plan(c, "forward"), plan(c, "backward")) for g in p.kernels()]
        assert ks and all(g.key and g.state in ("untuned", "tuned") for g in ks), [
            (g.describe(), g.reason) for g in ks if not g.key
        ]


def test_cross_entropy_alone_unchanged_by_the_split():
    """cross_entropy.py's pieces, shared with the head, still give torch's loss."""
    torch.manual_seed(0)
    x, t = torch.randn(8, 24), torch.randint(0, 24, (8,))
    loss, *_ = cross_entropy.row_loss(x, t, -100, "mean")
    torch.testing.assert_close(loss, F.cross_entropy(x, t))
