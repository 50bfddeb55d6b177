"""A large head output given its gradient outside the compiled graph (head_output.py): a step
that differentiates only the loss makes no zeros of the logits' size (the backward graph takes no
tangent for them) and matches eager; a step that differentiates the logits too gets their
gradient into h, W and b; the logits returned equal eager's and carry autograd history; graphs
it does not take are left as they were."""

import pytest
import torch
import torch.nn.functional as F

from helpers import fake_cuda, plan, rel_err  # noqa: F401  (the fixture)
from test_cudagraphs import on_cuda  # noqa: F401  (the fixture)

import fuseml
from fuseml import head_output

BF16 = torch.bfloat16
B, S, D, V = 2, 20, 16, 96  # the head's output 6x its input's width


class _Decoder(torch.nn.Module):
    """A trunk, its head (with or without a bias) and the loss; the logits returned beside it,
    as Hugging Face's causal LMs do."""

    def __init__(self, bias=False, classes=V, softcap=None):
        super().__init__()
        self.trunk = torch.nn.Linear(D, D)
        self.lm_head = torch.nn.Linear(D, classes, bias=bias)
        self.softcap = softcap

    def forward(self, x, labels):
        logits = self.lm_head(torch.tanh(self.trunk(x)))
        if self.softcap is not None:  # Gemma 2's final soft cap, as Hugging Face writes it
            logits = logits / self.softcap
            logits = torch.tanh(logits)
            logits = logits * self.softcap
        loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), labels.view(-1))
        return loss, logits


@pytest.fixture
def small_heads(monkeypatch):
    """The tests' outputs are kilobytes; a real head's zeros are hundreds of megabytes."""
    monkeypatch.setattr(head_output, "MIN_BYTES", 0)


def _inputs(dtype=BF16):
    torch.manual_seed(0)
    return torch.randn(B, S, D).to(dtype), torch.randint(0, V, (B, S))


def _step(model, fn, x, labels, aux=0.0):
    """(loss, logits, the parameters' and x's gradients) of one step; with aux, a loss on the
    logits themselves is added (a distillation term), so their gradient flows too."""
    model.zero_grad(set_to_none=True)
    x = x.clone().requires_grad_(True)
    loss, logits = fn(x, labels)
    total = loss + aux * logits.float().pow(2).mean() if aux else loss
    total.backward()
    return [loss.detach(), logits.detach(), x.grad] + [p.grad for p in model.parameters()]


@pytest.mark.parametrize("bias,softcap", [(False, None), (True, None), (True, 3.0)])
@pytest.mark.parametrize("aux", [0.0, 0.5])
def test_steps_match_eager(dead_socket, small_heads, bias, softcap, aux):
    """softcap: the returned logits are tanh(linear / c) * c, whose gradient (aux) goes through
    the soft cap computed again in the reattached node's backward."""
    x, labels = _inputs()
    torch.manual_seed(1)
    model = _Decoder(bias=bias, softcap=softcap).to(BF16)
    want = _step(model, model, x, labels, aux)
    c = fuseml.FuseMLCompiler()
    fn = torch.compile(model, backend=c)
    got = _step(model, fn, x, labels, aux)
    for g, w in zip(got, want):
        assert g is not None and g.shape == w.shape and g.dtype == w.dtype
        err = rel_err(g.float(), w.float())
        assert err == err and err < 2e-2, err
    _, logits = fn(x.requires_grad_(True), labels)
    assert logits.requires_grad and type(logits.grad_fn).__name__.startswith("_Reattach")


@pytest.mark.parametrize("softcap", [None, 30.0])
def test_backward_takes_no_tangent_for_the_logits(dead_socket, small_heads, softcap):
    """Without the rewrite the backward graph's inputs hold a [tokens, vocabulary] tangent
    (the engine's zeros at run time); with it, only the head's input's [tokens, D] one."""
    x, labels = _inputs()
    model = _Decoder(softcap=softcap).to(BF16)
    sizes = {}
    for taken, min_bytes in (("no", 1 << 40), ("yes", 0)):
        head_output.MIN_BYTES = min_bytes
        c = fuseml.FuseMLCompiler()
        torch._dynamo.reset()
        _step(model, torch.compile(model, backend=c), x, labels)
        graph = plan(c, "backward").compiled.gm.graph
        tangents = [n for n in graph.nodes if n.op == "placeholder" and "tangent" in n.name]
        sizes[taken] = sorted(n.meta["val"].numel() for n in tangents)
    assert B * S * V in sizes["no"], sizes
    assert B * S * V not in sizes["yes"] and B * S * D in sizes["yes"], sizes


@pytest.mark.parametrize("aux", [0.0, 0.5])
def test_a_padded_head_with_its_loss_in_the_graph(dead_socket, small_heads, aux):
    """A vocabulary not a multiple of 8 whose loss the graph computes (BERT's masked LM:
    pad_gemm.py pads the head's GEMMs) is taken: no tangent of the logits' size, the loss's
    gradient through the padded GEMMs in the compiled backward, a gradient of the logits
    themselves (aux) through the reattached node; every value as eager's."""
    x, labels = _inputs()
    torch.manual_seed(1)
    model = _Decoder(bias=True, classes=V + 2).to(BF16)
    want = _step(model, model, x, labels, aux)
    c = fuseml.FuseMLCompiler(pad_gemm="all")
    got = _step(model, torch.compile(model, backend=c), x, labels, aux)
    for g, w in zip(got, want):
        assert g is not None and g.shape == w.shape
        err = rel_err(g.float(), w.float())
        assert err == err and err < 2e-2, err
    bw = plan(c, "backward")
    tangents = [
        n.meta["val"].numel() for n in bw.compiled.gm.graph.nodes if n.op == "placeholder" and "tangent" in n.name
    ]
    assert B * S * (V + 2) not in tangents and B * S * D in tangents, tangents
    assert any("M 98 -> 104" in d for d in bw.padded) and any("K 98 -> 104" in d for d in bw.padded), bw.padded


def test_graphs_not_taken(dead_socket):
    """At the real threshold these outputs are too small; a projection no wider than RATIO
    times its input, a vocabulary not a multiple of 8 (pad_gemm.py's) that no loss in the
    graph reads (GPT-2's, behind a graph break) and a graph compiled without gradients are
    left as they were."""
    x, labels = _inputs()
    graphs = []

    def grab(gm, ex):
        graphs.append(gm)
        return gm

    model = _Decoder().to(BF16)
    torch.compile(model, backend=grab)(x, labels)
    assert head_output.rewrite(graphs[-1]) is None  # 3 KB of logits
    head_output.MIN_BYTES, saved = 0, head_output.MIN_BYTES
    try:
        narrow = _Decoder(classes=2 * D).to(BF16)
        torch.compile(narrow, backend=grab)(x, labels.clamp(max=2 * D - 1))
        assert head_output.rewrite(graphs[-1]) is None

        class _LogitsOnly(_Decoder):  # the loss left to the caller
            def forward(self, x):
                return (self.lm_head(torch.tanh(self.trunk(x))),)

        torch.compile(_LogitsOnly(classes=V + 2).to(BF16), backend=grab)(x)
        assert head_output.rewrite(graphs[-1]) is None

        class _LogitsAndMetric(_Decoder):  # the graph reads the logits, for no loss of its own
            def forward(self, x):
                logits = self.lm_head(torch.tanh(self.trunk(x)))
                return logits, logits.argmax(-1)

        torch.compile(_LogitsAndMetric(classes=V + 2).to(BF16), backend=grab)(x)
        assert head_output.rewrite(graphs[-1]) is None
        torch.compile(_LogitsOnly().to(BF16), backend=grab)(x)
        assert head_output.rewrite(graphs[-1]) is not None  # a multiple of 8: taken alone too

        class _TwoTensorCap(_Decoder):  # an op of the logits and another tensor: not a soft cap
            def forward(self, x, labels):
                loss, logits = super().forward(x, labels)
                return loss, logits * x.sum(-1, keepdim=True)

        torch.compile(_TwoTensorCap().to(BF16), backend=grab)(x, labels)
        assert head_output.rewrite(graphs[-1]) is None
        with torch.no_grad():
            assert head_output.rewrite(graphs[0]) is None
        assert head_output.rewrite(graphs[0]) is not None  # the model's, now big enough
    finally:
        head_output.MIN_BYTES = saved


def test_blocks_mode_takes_no_tangent_either(dead_socket, small_heads, monkeypatch):
    """With the head's loss walked in blocks (linear_cross_entropy.py) the detached logits give
    its function no gradient to add: the backward's tangents are the loss's and h's only, and
    the step matches eager."""
    from fuseml import linear_cross_entropy

    monkeypatch.setattr(linear_cross_entropy, "BLOCK_VALUES", 32 * B * S)
    monkeypatch.setattr(linear_cross_entropy, "MIN_BLOCK", 16)
    x, labels = _inputs()
    model = _Decoder().to(BF16)
    want = _step(model, model, x, labels)
    c = fuseml.FuseMLCompiler(logits="blocks")
    got = _step(model, torch.compile(model, backend=c), x, labels)
    for g, w in zip(got, want):
        assert rel_err(g.float(), w.float()) < 2e-2
    graph = plan(c, "backward").compiled.gm.graph
    tangents = [n for n in graph.nodes if n.op == "placeholder" and "tangent" in n.name]
    assert sorted(n.meta["val"].numel() for n in tangents) == [1, B * S * D], [n.name for n in tangents]


def test_steps_under_fuseml_replay(dead_socket, small_heads, on_cuda):
    """Under CUDA graphs (fuseml's replay, CPU stand-in): each step's loss, logits and
    gradients match eager's, a distillation term on the logits included, while the previous
    step's outputs are still held (a training loop's variables)."""
    x, labels = _inputs(torch.float32)
    model = _Decoder().float()
    compiled = torch.compile(model, backend=fuseml.FuseMLCompiler(), mode="reduce-overhead")
    held = None
    for step in range(6):
        xi = x + step
        aux = 0.5 if step % 2 else 0.0
        want = _step(model, model, xi, labels, aux)
        got = _step(model, compiled, xi, labels, aux)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, atol=1e-4, rtol=1e-4)
        held = got  # noqa: F841  (kept across the next step, as a loop's variables are)
    assert on_cuda.made and all(r.off is None for r in on_cuda.made)
    # the forward replays; whether the backward does here depends on the CPU allocator, which
    # puts the engine's fresh tangents at new addresses where CUDA's caching allocator reuses
    # a few (test_cudagraphs.py's tests of the backward's replay hand it one fixed gradient)
    fw = [r for r in on_cuda.made if r.which == "forward"]
    assert fw and all(r.replays for r in fw), [(r.which, r.recordings, r.replays) for r in on_cuda.made]
    _, logits = compiled(x.clone().requires_grad_(True), labels)
    assert type(logits.grad_fn).__name__.startswith("_Reattach")
