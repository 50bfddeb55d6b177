"""Batched GEMM groups (bmm, baddbmm + a pointwise epilogue): what the partitioner finds in
attention scores (torch.matmul on [B, H, S, D]: a bmm seen back through a [B, H, S, S] view)
and in plain bmm models, the vocabulary-4 fragments it builds (a symbolic batch with its
hint), the masks that cannot be spelled with one batch stride, the launch layout (outer = the
batch count), and round trips of those fragments through a real fusemld (compile-only here)."""

import logging
import math

import pytest
import torch
import torch.nn as nn

from helpers import close_bf16, rel_err
from test_runtime import _runners, standin  # noqa: F401  (the stand-in launch fixture)

import fuseml
from fuseml import runtime, transport

BF16 = torch.bfloat16
B, H, S, D = 2, 4, 16, 8


class Scores(nn.Module):
    """(q @ k^T) * scale + mask in fp32: the attention scores of a [B, H, S, D] model, read
    by no softmax (which would take the epilogue into its rows group, test_softmax_...)."""

    def forward(self, q, k, mask):
        s = (q @ k.transpose(-2, -1)) * (1 / math.sqrt(q.shape[-1])) + mask
        return s.float()


class Attention(nn.Module):
    """softmax((q @ k^T) * scale + mask): the scores' probabilities."""

    def forward(self, q, k, mask):
        s = (q @ k.transpose(-2, -1)) * (1 / math.sqrt(q.shape[-1])) + mask
        return torch.softmax(s, -1)


class MaskedScores(nn.Module):
    """(q @ k^T) / sqrt(d), masked_fill(-inf) where the mask says so."""

    def forward(self, q, k, mask):
        s = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
        return s.masked_fill(mask, float("-inf"))


class BmmBiasGelu(nn.Module):
    def __init__(self, bt=3, k=32, n=24):
        super().__init__()
        self.w = nn.Parameter(torch.randn(bt, k, n) / k**0.5)
        self.b = nn.Parameter(torch.randn(n) * 0.1)

    def forward(self, x):
        return torch.nn.functional.gelu(torch.bmm(x, self.w) + self.b)


class Escapes(nn.Module):
    """The product is used twice: by the epilogue and as a result of its own."""

    def forward(self, x, w):
        y = torch.bmm(x, w)
        return torch.relu(y) * 2, y


def qkm(b=B, h=H, mask_shape=(1, 1, S, S), dtype=BF16, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, S, D, generator=g).to(dtype)
    k = torch.randn(b, h, S, D, generator=g).to(dtype)
    mask = torch.randn(*mask_shape, generator=g).to(dtype)
    return q, k, mask


def run(model, *args, compiler=None, **kw):
    c = compiler or fuseml.FuseMLCompiler()
    with torch.no_grad():
        got = torch.compile(model, backend=c, **kw)(*args)
        want = model(*args)
    return c, got, want


def groups(c, which="inference"):
    return [g for p in c.plans if p.which == which for g in p.groups]


def bmm_groups(c, which="inference"):
    return [g for g in groups(c, which) if g.kind == "gemm" and g.op_names[0] in ("bmm", "baddbmm")]


def test_attention_scores_group_and_fragment(dead_socket):
    c, got, want = run(Scores(), *qkm())
    torch.testing.assert_close(got, want, rtol=0, atol=0)  # no daemon: the same ATen ops
    gs = groups(c)
    (g,) = bmm_groups(c)
    assert g.route == "kernel" and g.op_names == ["bmm", "view", "mul", "add", "_to_copy"]
    assert not g.escapes and len(gs) == 1
    w = g.built.wire
    assert w["vocab"] == 4 and w["m_hint"] == B * H
    a, b, mask = w["inputs"]
    assert a == {"id": 0, "dtype": "bf16", "shape": [-1, S, D], "strides": [S * D, D, 1], "align": 16}
    # k.transpose(-2, -1) viewed as [B*H, D, S]: column-major per batch
    assert b == {"id": 1, "dtype": "bf16", "shape": [-1, D, S], "strides": [S * D, 1, D], "align": 16}
    # the [1, 1, S, S] mask seen through the view: one [M, N] matrix for every batch
    assert mask["shape"] == [1, S, S] and mask["strides"] == [0, S, 1]
    assert [op["op"] for op in w["ops"]] == ["bmm", "const", "mul", "add", "cast"]
    assert w["ops"][1]["value"] == pytest.approx(1 / math.sqrt(D))
    # the epilogue ends with the upcast: an f32 [Bt, M, N] output, viewed back at launch
    assert w["outputs"] == [{"id": 7, "dtype": "f32", "shape": [-1, S, S], "strides": [S * S, S, 1], "align": 16}]
    assert g.built.out_views == [(B, H, S, S)]
    assert g.built.layout.k == 1 and g.built.full_input == 0


@pytest.mark.parametrize(
    "mask_shape,want",
    [
        ((S, S), ([1, S, S], [0, S, 1])),  # rank 2: right-aligned
        ((S,), ([1, 1, S], [0, 0, 1])),  # a per-key bias
        ((B, H, S, S), ([-1, S, S], [S * S, S, 1])),  # one per batch and head: dense
        ((1, H, 1, S), None),  # per head, not per batch (B > 1)
        ((B, 1, S, S), None),  # per batch, not per head (H > 1)
    ],
)
def test_epilogue_masks_map_onto_one_batch_stride(dead_socket, mask_shape, want):
    c, got, want_out = run(Scores(), *qkm(mask_shape=mask_shape))
    torch.testing.assert_close(got, want_out, rtol=0, atol=0)
    (g,) = bmm_groups(c)
    if want is None:
        # the mask's add cannot join the product's group: it starts a pointwise group (which
        # reads the mask at any strides), the product keeps its scale
        assert g.route == "kernel" and "add" not in g.op_names, g.describe()
        (p,) = [h for h in groups(c) if h.kind == "pointwise"]
        assert p.route == "kernel" and p.op_names[0] == "add", p.describe()
        return
    assert g.route == "kernel", g.reason
    mask = g.built.wire["inputs"][2]
    assert (mask["shape"], mask["strides"]) == want


def test_softmax_takes_the_scores_epilogue(dead_socket):
    """Scores read by a softmax: the scale and the mask run in the softmax's rows group, which
    reads the product once where it would have read what the epilogue wrote, and the product
    runs alone on cuBLAS (partition._epilogue_into_rows)."""
    for mask_shape in ((1, 1, S, S), (B, 1, S, S)):
        torch._dynamo.reset()
        c, got, want = run(Attention(), *qkm(mask_shape=mask_shape))
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        (g,) = bmm_groups(c)
        assert g.route == "bypass" and "lone GEMM" in g.reason, g.describe()
        (r,) = [h for h in groups(c) if h.kind == "rows"]
        assert r.route == "kernel" and r.op_names[:2] == ["mul", "add"] and "amax" in r.op_names, r.describe()


def test_per_batch_mask_is_exact_with_one_head(dead_socket):
    """[B, 1, S, S] beside [B, 1, S, S] scores: the batch is B itself, so one stride says it."""
    c, got, want = run(Scores(), *qkm(h=1, mask_shape=(B, 1, S, S)))
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    (g,) = bmm_groups(c)
    assert g.route == "kernel", g.reason
    assert g.built.wire["inputs"][2]["shape"] == [-1, S, S]
    assert g.built.wire["inputs"][2]["strides"] == [S * S, S, 1]


def test_masked_fill_joins_the_epilogue(dead_socket):
    q, k, _ = qkm()
    mask = torch.rand(1, 1, S, S, generator=torch.Generator().manual_seed(1)) > 0.7
    c, got, want = run(MaskedScores(), q, k, mask)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    (g,) = bmm_groups(c)
    assert g.route == "kernel" and g.op_names == ["bmm", "view", "div", "masked_fill"]
    w = g.built.wire
    ops = [op["op"] for op in w["ops"]]
    assert ops[-1] == "where" and w["inputs"][2]["dtype"] == "bool"
    assert any(op["op"] == "const" and op["value"] == float("-inf") for op in w["ops"])


@pytest.mark.usefixtures("saves_every_intermediate")
def test_bmm_bias_gelu_training(dead_socket):
    torch.manual_seed(0)
    model = BmmBiasGelu().to(BF16)
    x = torch.randn(3, 16, 32, dtype=BF16)
    c = fuseml.FuseMLCompiler()

    def step(fn):
        model.zero_grad(set_to_none=True)
        xi = x.clone().requires_grad_(True)
        y = fn(xi)
        (y.float() * torch.linspace(-1, 1, y.numel()).view(y.shape)).sum().backward()
        return y.detach(), [p.grad.clone() for p in model.parameters()] + [xi.grad.clone()]

    want = step(model)
    got = step(torch.compile(model, backend=c))
    close_bf16(got, want)
    (g,) = bmm_groups(c, "forward")
    assert g.route == "kernel" and g.op_names == ["bmm", "add", "gelu"]
    assert [n.name for n in g.escapes] == ["add"]  # saved for gelu_backward
    w = g.built.wire
    assert w["vocab"] == 4 and w["m_hint"] == 3
    by_shape = {tuple(i["shape"]): i for i in w["inputs"]}
    assert by_shape[(-1, 16, 32)]["strides"] == [512, 32, 1]  # x
    assert by_shape[(-1, 32, 24)]["strides"] == [768, 24, 1]  # w
    assert by_shape[(1, 1, 24)]["strides"] == [0, 0, 1]  # the bias [N]
    assert [o["shape"] for o in w["outputs"]] == [[-1, 16, 24], [-1, 16, 24]]
    assert g.built.out_views is None
    # the backward products have nothing after them: cuBLAS
    bw = bmm_groups(c, "backward")
    assert bw and all(x.route == "bypass" and "lone GEMM" in x.reason for x in bw)


def test_escaping_product_is_an_extra_output(dead_socket):
    g0 = torch.Generator().manual_seed(0)
    x = torch.randn(4, 16, 32, generator=g0).to(BF16)
    w = torch.randn(4, 32, 24, generator=g0).to(BF16)
    c, got, want = run(Escapes(), x, w)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    (g,) = bmm_groups(c)
    assert g.route == "kernel" and g.op_names == ["bmm", "relu", "mul"]
    assert [n.name for n in g.escapes] == ["bmm"]
    outs = g.built.wire["outputs"]
    assert len(outs) == 2 and all(o["shape"] == [-1, 16, 24] for o in outs)
    assert {o["id"] for o in outs} == {g.built.wire["ops"][0]["out"], g.built.wire["ops"][-1]["out"]}


def test_lone_bmm_stays_with_cublas(dead_socket):
    x, w = torch.randn(2, 8, 16, dtype=BF16), torch.randn(2, 16, 8, dtype=BF16)
    c, got, want = run(lambda a, b: torch.bmm(a, b), x, w)
    torch.testing.assert_close(got, want)
    (g,) = bmm_groups(c)
    assert g.route == "bypass" and "lone GEMM" in g.reason


def test_fp32_bmm_and_batch_inner_layouts(dead_socket):
    # fp32: the template takes bf16/f16
    x, w = torch.randn(2, 8, 16), torch.randn(2, 16, 8)
    c, _, _ = run(lambda a, b: torch.relu(torch.bmm(a, b)) + 1, x, w)
    (g,) = bmm_groups(c)
    assert g.route == "bypass" and "bf16/f16" in g.reason
    # A = a [M, Bt, K] tensor seen as [Bt, M, K]: its M stride is Bt * K, so the batch stays
    # static (no m_hint) and the kernel is for this batch count only
    torch._dynamo.reset()
    xt = torch.randn(8, 2, 16, dtype=BF16)
    c, got, want = run(lambda a, b: torch.relu(torch.bmm(a.transpose(0, 1), b)) + 1, xt, w.to(BF16))
    torch.testing.assert_close(got, want)
    (g,) = bmm_groups(c)
    wire = g.built.wire
    assert g.route == "kernel" and "m_hint" not in wire and g.built.layout.k == 0
    assert wire["inputs"][0]["shape"] == [2, 8, 16] and wire["inputs"][0]["strides"] == [16, 32, 1]
    assert wire["outputs"][0]["shape"] == [2, 8, 8]


def test_expanded_operand_has_batch_stride_zero(dead_socket):
    """One weight for every batch (w.expand): B's batch stride is 0."""
    x, w = torch.randn(3, 8, 16, dtype=BF16), torch.randn(16, 8, dtype=BF16)
    c, got, want = run(lambda a, b: torch.relu(torch.bmm(a, b.expand(3, 16, 8))) * 3, x, w)
    torch.testing.assert_close(got, want)
    (g,) = bmm_groups(c)
    assert g.route == "kernel", g.reason
    assert g.built.wire["inputs"][1]["shape"] == [-1, 16, 8]
    assert g.built.wire["inputs"][1]["strides"] == [0, 8, 1]


class Baddbmm(nn.Module):
    def __init__(self, beta, alpha):
        super().__init__()
        self.beta, self.alpha = beta, alpha

    def forward(self, inp, x, w):
        return torch.relu(torch.baddbmm(inp, x, w, beta=self.beta, alpha=self.alpha))


@pytest.mark.parametrize(
    "beta,alpha,ops",
    [
        (1.0, 1.0, ["bmm", "add", "relu"]),
        (0.5, 2.0, ["bmm", "const", "mul", "const", "mul", "add", "relu"]),
        (0.0, 0.25, ["bmm", "const", "mul", "relu"]),  # beta 0: the input is not read
    ],
)
def test_baddbmm_is_bmm_then_scale_then_add(dead_socket, beta, alpha, ops):
    g0 = torch.Generator().manual_seed(0)
    inp = torch.randn(1, 8, 8, generator=g0).to(BF16)
    if beta == 0:
        inp[0, 0, 0] = float("nan")  # torch ignores it: so must we
    x = torch.randn(3, 8, 16, generator=g0).to(BF16)
    w = torch.randn(3, 16, 8, generator=g0).to(BF16)
    c, got, want = run(Baddbmm(beta, alpha), inp, x, w)
    torch.testing.assert_close(got, want)
    (g,) = bmm_groups(c)
    assert g.route == "kernel" and g.op_names == ["baddbmm", "relu"], g.reason
    wire = g.built.wire
    assert wire["vocab"] == 4 and [op["op"] for op in wire["ops"]] == ops
    consts = [op["value"] for op in wire["ops"] if op["op"] == "const"]
    assert consts == [v for v in (alpha, beta) if v not in (0, 1)]
    # the input is an epilogue operand broadcast over the batch
    (bias,) = [i for i in wire["inputs"] if i["shape"][0] == 1]
    assert bias["shape"] == [1, 8, 8] and bias["strides"] == [0, 8, 1]


def test_dynamic_batch_shares_the_fragment(dead_socket):
    """A second batch size recompiles with the batch symbolic (s0 * H viewed as [s0, H, S, S]):
    the fragment is the same but for m_hint (the daemon rounds it to its bucket), the view's
    symbolic size is spelled -1 (the group reads tensors only), and the results still match
    eager."""
    c = fuseml.FuseMLCompiler()
    f = torch.compile(Scores(), backend=c)
    wires = []
    for b in (2, 3):
        q, k, mask = qkm(b=b)
        with torch.no_grad():
            torch.testing.assert_close(f(q, k, mask), Scores()(q, k, mask), rtol=0, atol=0)
        (g,) = bmm_groups(c)[-1:]
        assert g.route == "kernel", g.reason
        wires.append(g.built.wire)
    assert [w["m_hint"] for w in wires] == [2 * H, 3 * H]
    strip = [{k: v for k, v in w.items() if k != "m_hint"} for w in wires]
    assert strip[0] == strip[1]
    (g,) = bmm_groups(c)[-1:]
    view = g.members[1]
    assert view.args[1] == [-1, H, S, S]
    assert all(isinstance(n.meta.get("val"), torch.Tensor) for n in g.inputs)
    assert g.built.out_views == [(-1, H, S, S)]


def test_launch_outer_is_the_batch_count(dead_socket, standin):  # noqa: F811
    c = fuseml.FuseMLCompiler()
    f = torch.compile(Scores(), backend=c)
    for b in (2, 3):  # static, then symbolic
        with torch.no_grad():
            f(*qkm(b=b))
    runners = [r for r in _runners(c) if r.built.wire["vocab"] == 4]
    assert len(runners) == 2
    # inputs of batch 5 (B*H = 20) for each runner, in its input order
    q, k, mask = qkm(b=5)
    a = q.reshape(5 * H, S, D)
    bt = k.transpose(-2, -1).reshape(5 * H, D, S)
    standin.calls = []
    for r in runners[1:]:  # the symbolic graph takes any batch
        assert len(r.built.in_nodes) == 3
        xs = [a, bt, mask]
        r.kernel = ("k" * 64, "tuned", b"", {})
        got = r._launch(xs, torch.device("cpu"), r.kernel[0], b"", {})
        want = r.eager(xs)
        assert [(o.shape, o.stride(), o.dtype) for o in got] == [(o.shape, o.stride(), o.dtype) for o in want]
        assert got[0].shape == (5, H, S, S)
    assert [outer for _, _, outer in standin.calls] == [5 * H]
    # the static graph's runner: outer is still taken from A's dim 0
    r = runners[0]
    q, k, mask = qkm(b=2)
    xs = [q.reshape(2 * H, S, D), k.transpose(-2, -1).reshape(2 * H, D, S), mask]
    r.kernel = ("k" * 64, "tuned", b"", {})
    got = r._launch(xs, torch.device("cpu"), r.kernel[0], b"", {})
    assert got[0].shape == (2, H, S, S) and got[0].is_contiguous()
    assert standin.calls[-1] == (3, 1, 2 * H)


def test_launch_refuses_a_mask_of_other_strides(dead_socket, standin):  # noqa: F811
    """A mask with other strides than traced (here transposed) cannot be read by the kernel
    built for it: the group runs its ATen ops instead."""
    c, _, _ = run(Scores(), *qkm())
    (r,) = [r for r in _runners(c) if r.built.wire["vocab"] == 4]
    q, k, mask = qkm()
    xs = [q.reshape(B * H, S, D), k.transpose(-2, -1).reshape(B * H, D, S), mask]
    r.kernel = ("k" * 64, "tuned", b"", {})
    r._launch(xs, torch.device("cpu"), r.kernel[0], b"", {})  # traced strides: fine
    xs[2] = mask.transpose(-1, -2)
    with pytest.raises(runtime._Layout, match="stride"):
        r._launch(xs, torch.device("cpu"), r.kernel[0], b"", {})


def test_explain_shows_the_batched_group(dead_socket):
    import io

    buf = io.StringIO()
    rows = fuseml.explain(Scores(), *qkm(), file=buf)
    text = buf.getvalue()
    assert "bmm -> view -> mul -> add -> _to_copy" in text
    (r,) = [r for r in rows if r["ops"][0] == "bmm"]
    assert r["kind"] == "gemm" and r["strategy"].startswith("eager gemm")


# -- a real fusemld (compile-only without a GPU) ---------------------------------------------


def test_daemon_compiles_bmm_groups_and_hits_the_bucket(daemon):
    """The attention scores and bmm + bias + GELU groups are accepted (the C side speaks
    vocabulary 4); a second batch size in the same bucket is served the same key from the
    store. CPU tensors still run eagerly and correctly."""
    c = fuseml.FuseMLCompiler()
    f = torch.compile(Scores(), backend=c)
    keys = []
    for b in (3, 4):  # B*H = 12, 16: both in the bucket 16
        q, k, mask = qkm(b=b)
        with torch.no_grad():
            torch.testing.assert_close(f(q, k, mask), Scores()(q, k, mask), rtol=0, atol=0)
        (g,) = bmm_groups(c)[-1:]
        assert g.key and g.state in ("untuned", "tuned"), (g.describe(), g.reason)
        keys.append((g.key, g.origin))
    assert keys[0][0] == keys[1][0] and keys[1][1] == "hit"
    torch._dynamo.reset()
    c, got, want = run(BmmBiasGelu().to(BF16), torch.randn(3, 16, 32, dtype=BF16))
    assert rel_err(got, want) == 0
    (g,) = bmm_groups(c)
    assert g.key and g.state in ("untuned", "tuned"), (g.describe(), g.reason)


def test_daemon_refuses_a_strided_batch_matrix(daemon):
    """A batch matrix that is neither row- nor column-major is a clear refusal."""
    bad = {
        "vocab": 4,
        "m_hint": 8,
        "inputs": [
            {"id": 0, "dtype": "bf16", "shape": [-1, 16, 16], "strides": [512, 32, 2]},
            {"id": 1, "dtype": "bf16", "shape": [-1, 16, 16]},
        ],
        "ops": [{"op": "bmm", "out": 2, "args": [0, 1]}, {"op": "relu", "out": 3, "args": [2]}],
        "outputs": [{"id": 3, "dtype": "bf16", "shape": [-1, 16, 16]}],
    }
    conn = transport.connect(daemon.socket, timeout=30)
    try:
        (r,) = transport.compile_all(conn, [bad], 60)
    finally:
        conn.close()
    assert not r.get("ok") and r.get("code") == "unsupported", r


def test_refused_bmm_falls_back_with_one_warning(daemon, caplog, monkeypatch):
    """A daemon that does not speak vocabulary 4 (simulated: the fragments claim vocabulary 3,
    which the daemon refuses for a bmm) leaves every bmm group eager and correct, with one
    warning for the cause."""
    caplog.set_level(logging.WARNING, logger="fuseml")
    orig = fuseml.backend.build_bmm

    def old_daemon(*a):
        b = orig(*a)
        b.wire["vocab"] = 3
        return b

    monkeypatch.setattr(fuseml.backend, "build_bmm", old_daemon)

    class TwoLayers(nn.Module):
        def forward(self, q, k, mask):
            s = Scores()(q, k, mask)
            return Scores()(s.to(q.dtype)[..., :D].contiguous(), k, mask)

    c, got, want = run(TwoLayers(), *qkm())
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    gs = bmm_groups(c)
    assert len(gs) == 2 and all(g.route == "kernel" and g.key is None and g.reason for g in gs)
    refused = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(refused) == 1, refused


def test_masked_fill_spelling_matches_aten():
    from test_spellings import evaluate

    from fuseml.fragment import Emitter
    from fuseml.ops import POINTWISE

    aten = torch.ops.aten
    x = torch.randn(257, dtype=torch.float64)
    m = torch.rand(257) > 0.5
    g = torch.fx.Graph()
    px, pm = g.placeholder("x"), g.placeholder("m")
    px.meta["val"], pm.meta["val"] = x.float(), m
    node = g.call_function(aten.masked_fill.Scalar, (px, pm, -3.5))
    node.meta["val"] = x.float().masked_fill(m, -3.5)
    e = Emitter([px, pm])
    vid = POINTWISE[aten.masked_fill.Scalar](e, node)
    got = evaluate(e.ops, {0: x, 1: m})[vid]
    torch.testing.assert_close(got, x.masked_fill(m, -3.5), rtol=0, atol=0)


def test_daemon_accepts_baddbmm_and_expanded_operands(daemon):
    """baddbmm spelled as bmm, * alpha (+ beta * input; beta 0 leaves the input unread, a
    dead fragment input) and a B expanded over the batch (batch stride 0) are valid vocab-4
    fragments."""
    g0 = torch.Generator().manual_seed(0)
    x = torch.randn(3, 8, 16, generator=g0).to(BF16)
    w = torch.randn(3, 16, 8, generator=g0).to(BF16)
    inp = torch.randn(1, 8, 8, generator=g0).to(BF16)
    for beta, alpha in ((0.0, 0.25), (0.5, 2.0)):
        torch._dynamo.reset()
        c, got, want = run(Baddbmm(beta, alpha), inp, x, w)
        torch.testing.assert_close(got, want)
        (g,) = bmm_groups(c)
        assert g.key and g.state in ("untuned", "tuned"), (beta, alpha, g.reason)
    torch._dynamo.reset()
    c, got, want = run(lambda a, b: torch.relu(torch.bmm(a, b.expand(3, 16, 8))) * 3, x, w[0])
    torch.testing.assert_close(got, want)
    (g,) = bmm_groups(c)
    assert g.built.wire["inputs"][1]["strides"][0] == 0
    assert g.key and g.state in ("untuned", "tuned"), g.reason


def test_daemon_accepts_a_per_batch_mask_in_the_softmax_rows(daemon):
    """[B, 1, S, S] mask beside [B, H, S, S] scores: the product's group (with its scale) and
    the pointwise group that adds the mask are served; under a softmax, the rows group that
    scales, adds the mask and takes the softmax is."""
    c, got, want = run(Scores(), *qkm(mask_shape=(B, 1, S, S)))
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    served = [g for g in groups(c) if g.route == "kernel"]
    assert {g.kind for g in served} == {"gemm", "pointwise"}
    assert all(g.key and g.state in ("untuned", "tuned") for g in served), [g.describe() for g in served]
    torch._dynamo.reset()
    c, got, want = run(Attention(), *qkm(mask_shape=(B, 1, S, S)))
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    served = [g for g in groups(c) if g.route == "kernel"]
    assert {g.kind for g in served} == {"rows"}
    assert all(g.key and g.state in ("untuned", "tuned") for g in served), [g.describe() for g in served]
