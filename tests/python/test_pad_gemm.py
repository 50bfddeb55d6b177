"""Unaligned GEMM dimensions padded (pad_gemm.py): which GEMMs are padded and which are not
(aligned, small, fp32, the setting off), the rewrite's numbers against the unpadded graph
(mm, addmm, bmm; M, N and K), the metadata every node keeps (what partitioning and
fragments read), values that leave the graph copied back to their layout, a padded value
shared by two GEMMs, and a training step of a tiny model with a tied lm_head (vocabulary
1001) through torch.compile, its loss and gradients against eager. GEMMs run on the CPU
here; the GPU script bench/device/pad-gemm/run measures GPT-2 with and without."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

from helpers import plan, rel_err

import fuseml
from fuseml import pad_gemm

aten = torch.ops.aten
BF16 = torch.bfloat16


def _trace(f, *shapes, dtype=BF16, fake=False):
    """f traced (make_fx, fake-tensor metadata) on random inputs of `shapes` (fake CUDA
    tensors with fake=True: sizes too large to run here); (graph, inputs)."""
    torch.manual_seed(0)
    if fake:
        with FakeTensorMode():
            xs = [torch.empty(s, dtype=dtype, device="cuda") for s in shapes]
    else:
        xs = [torch.randn(s, dtype=dtype) for s in shapes]
    return make_fx(f, tracing_mode="fake")(*xs), xs


def _targets(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def _all_have_meta(gm):
    for n in gm.graph.nodes:
        if n.op in ("call_function", "placeholder"):
            assert isinstance(n.meta.get("val"), torch.Tensor), n.name


def _run(gm, xs):
    out = gm(*xs)
    return out if isinstance(out, (list, tuple)) else [out]


def _check_numerics(f, *shapes, padded_dims):
    gm, xs = _trace(f, *shapes)
    want = _run(gm, xs)
    done, _ = pad_gemm.pad(gm, "all")
    assert len(done) == 1 and all(d in done[0] for d in padded_dims), done
    _all_have_meta(gm)
    got = _run(gm, xs)
    exact = [f(*[x.float() for x in xs])] if not isinstance(f(*xs), tuple) else list(f(*[x.float() for x in xs]))
    for g, w, e in zip(got, want, exact):
        assert g.shape == w.shape and g.is_contiguous()  # a graph output keeps its layout
        assert rel_err(g, w) < 1e-2 and rel_err(g, e) < 1e-2
    return gm


@pytest.mark.parametrize(
    "m,k,n,dims",
    [
        (48, 64, 1001, ["N 1001 -> 1008"]),
        (1001, 64, 40, ["M 1001 -> 1008"]),
        (48, 1001, 40, ["K 1001 -> 1008"]),
        (33, 17, 1001, ["M 33 -> 40", "K 17 -> 24", "N 1001 -> 1008"]),
    ],
)
def test_mm_numerics(m, k, n, dims):
    """An operand padded along one dim is a cat with zeros; along two, constant_pad_nd."""
    gm = _check_numerics(lambda a, b: a @ b, (m, k), (k, n), padded_dims=dims)
    one_dim = len(dims) == 1
    assert (aten.cat.default in _targets(gm)) is one_dim
    assert (aten.constant_pad_nd.default in _targets(gm)) is not one_dim


def _pads(gm):
    """The padded copies in gm: constant_pad_nd and cat-with-zeros nodes."""
    return [n for n in gm.graph.nodes if n.target in (aten.constant_pad_nd.default, aten.cat.default)]


def test_one_dim_padded_as_cat_with_contiguous_zeros():
    """cat([x, full(0)]) along the padded dim, the zeros a contiguous tensor of their own
    (ATen's cat takes contiguous operands in one pass), equal to constant_pad_nd's copy; a
    lone cat of contiguous operands stays ATen's."""
    gm, xs = _trace(lambda a, w: a @ w.t(), (24, 64), (1001, 64))
    pad_gemm.pad(gm, "all")
    cat = next(n for n in gm.graph.nodes if n.target is aten.cat.default)
    src, zeros = cat.args[0]
    assert src.op == "placeholder" and cat.args[1] == 0 and list(cat.meta["val"].shape) == [1008, 64]
    assert zeros.target is aten.full.default and zeros.meta["val"].is_contiguous()
    assert list(zeros.meta["val"].shape) == [7, 64]
    w = xs[1]
    torch.testing.assert_close(
        torch.cat([w, torch.zeros(7, 64, dtype=BF16)]), torch.nn.functional.pad(w, (0, 0, 0, 7)), rtol=0, atol=0
    )


def test_addmm_pads_its_bias():
    def f(bias, a, w):
        return torch.addmm(bias, a, w.t()) * 2

    gm = _check_numerics(f, (1001,), (24, 40), (1001, 40), padded_dims=["N 1001 -> 1008"])
    assert sorted(list(n.meta["val"].shape) for n in _pads(gm)) == [[1008], [1008, 40]]


def test_bmm_numerics():
    _check_numerics(
        lambda a, b: torch.bmm(a, b), (3, 20, 1001), (3, 1001, 24), padded_dims=["M 20 -> 24", "K 1001 -> 1008"]
    )


def test_which_gemms_are_padded():
    """Mode "auto": GPT-2's lm_head and its backward's GEMMs (4096 tokens, d 768, vocabulary
    50257, on fake CUDA tensors) are padded, N to a multiple of 64; aligned ones, small ones
    and fp32 ones are not. Mode "all" pads the small one too, never fp32; "off" nothing."""
    v, d, t = 50257, 768, 4096
    cases = {
        "lm_head": (lambda h, w: h @ w.t(), [(t, d), (v, d)], BF16),
        "grad_h": (lambda g, w: g @ w, [(t, v), (v, d)], BF16),
        "grad_w": (lambda g, h: g.t() @ h, [(t, v), (t, d)], BF16),
        "aligned": (lambda h, w: h @ w.t(), [(t, d), (3072, d)], BF16),
        "small": (lambda h, w: h @ w.t(), [(128, 64), (1001, 64)], BF16),
        "fp32": (lambda h, w: h @ w.t(), [(t, d), (v, d)], torch.float32),
        "m_is_one": (lambda h, w: h @ w.t(), [(1, d), (v, d)], BF16),
    }
    padded = {}
    for mode in ("auto", "all", "off"):
        for name, (f, shapes, dtype) in cases.items():
            gm, _ = _trace(f, *shapes, dtype=dtype, fake=True)
            padded[mode, name] = pad_gemm.pad(gm, mode)[0]
            _all_have_meta(gm)
    assert padded["auto", "lm_head"] == ["mm (N 50257 -> 50304)"]
    assert padded["auto", "grad_h"] == ["mm (K 50257 -> 50304)"]
    assert padded["auto", "grad_w"] == ["mm (M 50257 -> 50304)"]
    assert padded["auto", "m_is_one"] == []  # 0.08 GFLOP: the padding would cost more
    for name in ("aligned", "small", "fp32"):
        assert padded["auto", name] == [], name
    assert padded["all", "small"] == ["mm (N 1001 -> 1008)"]
    assert padded["all", "fp32"] == [] and padded["all", "aligned"] == []
    assert all(not p for (mode, _), p in padded.items() if mode == "off")


def test_weight_padded_before_its_transpose_and_shared():
    """A transposed operand is padded before the transpose (the weight keeps its layout), and
    the backward's two GEMMs over one gradient, `g @ w` (K) and `g.t() @ x` (M), share one
    padded copy of it."""
    gm, xs = _trace(lambda g, w, x: (g @ w, g.t() @ x), (24, 1001), (1001, 40), (24, 32))
    want = _run(gm, xs)
    assert len(pad_gemm.pad(gm, "all")[0]) == 2
    pads = _pads(gm)
    g = next(n for n in gm.graph.nodes if n.op == "placeholder")
    assert [p.args[0][0] for p in pads].count(g) == 1  # g padded once, along its columns
    assert list(pads[0].meta["val"].shape) == [24, 1008]
    for a, b in zip(_run(gm, xs), want):
        assert rel_err(a, b) < 1e-2


def test_a_transposed_input_is_padded_in_its_memory_order():
    """A GEMM operand reached through transposes of an input that is itself a transpose (a
    weight the forward saved as w.t() for the backward) is padded as the contiguous value it
    views: the cat reads and writes contiguous rows, and the operand is a permuted view of
    the padded copy."""
    torch.manual_seed(0)
    g, w = torch.randn(24, 1001, dtype=BF16), torch.randn(1001, 40, dtype=BF16)
    f = lambda g, wt: g @ wt.t()  # noqa: E731
    gm = make_fx(f, tracing_mode="fake")(g, w.t())
    want = gm(g, w.t())
    assert pad_gemm.pad(gm, "all")[0] == ["mm (K 1001 -> 1008)"]
    wt = [n for n in gm.graph.nodes if n.op == "placeholder"][1]
    (cat,) = [
        n
        for n in gm.graph.nodes
        if n.target is aten.cat.default and n.args[0][0].target is aten.permute.default and n.args[0][0].args[0] is wt
    ]
    assert cat.args[0][0].meta["val"].is_contiguous()
    assert list(cat.meta["val"].shape) == [1008, 40]
    assert rel_err(gm(g, w.t()), want) < 1e-2


def test_readers_see_the_padded_layout():
    """The slice is read in place: a reader's metadata carries the padded row stride (what a
    fused group's fragment bakes in), and an output copied back is contiguous again."""

    def f(h, w):
        logits = (h @ w.t()).view(2, 12, 1001)
        return logits.float().sum(-1), logits

    gm, xs = _trace(f, (24, 64), (1001, 64))
    want = _run(gm, xs)
    pad_gemm.pad(gm, "all")
    nodes = {n.name: n for n in gm.graph.nodes}
    view = next(n for n in gm.graph.nodes if n.target is aten.view.default)
    assert view.meta["val"].stride() == (12 * 1008, 1008, 1)
    clone = next(n for n in gm.graph.nodes if n.target is aten.clone.default)
    assert clone.args[0] is view and clone.meta["val"].is_contiguous()
    assert nodes["output"].args[0][1] is clone
    for a, b in zip(_run(gm, xs), want):
        assert a.is_contiguous() and rel_err(a, b) < 1e-2


def test_a_computed_value_is_read_through_its_padded_copy():
    """A value the graph computes, padded for a GEMM (BERT's logits gradient from the loss's
    backward, beside the bias gradient's column sum): its other readers read a slice of the
    padded copy, so the cat is its only reader and joins the group that computes it (one
    kernel writes the value padded); the numbers are the graph's as traced."""
    from fuseml.partition import find_groups

    def f(x, w):
        g = (x.float() * 0.5).exp().to(torch.bfloat16)
        return g @ w, g.sum(0)

    gm, xs = _trace(f, (48, 1001), (1001, 64))
    want = _run(gm, xs)
    assert pad_gemm.pad(gm, "all")[0] == ["mm (K 1001 -> 1008)"]
    cat = next(n for n in gm.graph.nodes if n.target is aten.cat.default)
    assert list(cat.args[0][0].users) == [cat]
    (total,) = [n for n in gm.graph.nodes if n.target is aten.sum.dim_IntList]
    view = total.args[0]
    assert view.target is aten.slice.Tensor and view.args[0] is cat
    assert view.meta["val"].stride() == (1008, 1)
    _all_have_meta(gm)
    for a, b in zip(_run(gm, xs), want):
        assert a.shape == b.shape and rel_err(a, b) < 1e-2
    groups = find_groups(gm)
    (exp_group,) = [g for g in groups if any(n.target is aten.exp.default for n in g.members)]
    assert cat in exp_group.members, [g.describe() for g in groups]


def test_an_input_padded_keeps_its_readers():
    """A graph input padded (GPT-2's logits gradient behind a graph break) has nothing to fuse
    into: its other readers keep reading it."""

    def f(g, w):
        return g @ w, g.sum(0)

    gm, _ = _trace(f, (48, 1001), (1001, 64))
    pad_gemm.pad(gm, "all")
    (total,) = [n for n in gm.graph.nodes if n.target is aten.sum.dim_IntList]
    assert total.args[0].op == "placeholder"


def test_a_user_output_keeps_the_padded_layout():
    """The output slots the caller allows keep the padded row stride (no copy, as Inductor
    returns logits) and are listed; slots it does not allow are copied back; under the
    inference policy (one slot), two slots reached from one GEMM (an output and a view of it:
    they alias) are both copied back."""

    def f(h, w):
        logits = (h @ w.t()).view(2, 12, 1001)
        return logits.float().sum(-1), logits

    for slots, kept in ((lambda ps: ps == [1], True), (lambda ps: 0 in ps, False), (lambda ps: False, False)):
        gm, xs = _trace(f, (24, 64), (1001, 64))
        want = _run(gm, xs)
        assert pad_gemm.pad(gm, "all", slots)[1] == ([1] if kept else [])
        got = _run(gm, xs)
        assert (aten.clone.default in _targets(gm)) is not kept
        assert got[1].stride() == ((12 * 1008, 1008, 1) if kept else (12 * 1001, 1001, 1))
        for a, b in zip(got, want):
            assert rel_err(a, b) < 1e-2

    def aliased(h, w):
        y = h @ w.t()
        return y, y.view(2, 12, 1001)

    gm, xs = _trace(aliased, (24, 64), (1001, 64))
    pad_gemm.pad(gm, "all", lambda ps: len(ps) == 1)
    assert all(o.is_contiguous() for o in _run(gm, xs))


def test_graph_adopts_the_layouts_of_its_example_inputs():
    """fake_meta.adopt_input_layouts: an example input at another stride (what aot_autograd
    passes a backward whose saved value the forward kept padded) recomputes every value from
    it; examples as traced change nothing."""
    from fuseml import fake_meta

    gm, _ = _trace(lambda x: (x * 2).sum(-1), (4, 6), fake=True)
    (ph,) = [n for n in gm.graph.nodes if n.op == "placeholder"]
    traced = ph.meta["val"]
    assert not fake_meta.adopt_input_layouts(gm, [traced])
    with fake_meta.mode_of(gm):
        padded = torch.empty(4, 8, dtype=BF16, device="cuda")[:, :6]
    assert fake_meta.adopt_input_layouts(gm, [padded])
    assert ph.meta["val"].stride() == (8, 1)
    mul = next(n for n in gm.graph.nodes if n.target is aten.mul.Tensor)
    assert mul.meta["val"].shape == (4, 6)


def test_option_must_be_known():
    with pytest.raises(ValueError, match="pad_gemm"):
        fuseml.FuseMLCompiler(pad_gemm="yes")


def test_setting(monkeypatch):
    for value, mode in ((None, "auto"), ("all", "all"), ("0", "off"), ("ALL", "all"), ("x", "auto")):
        if value is None:
            monkeypatch.delenv("FUSEML_PAD_GEMM", raising=False)
        else:
            monkeypatch.setenv("FUSEML_PAD_GEMM", value)
        assert fuseml.settings.pad_gemm() == mode


class TiedLM(torch.nn.Module):
    """Embedding, a block, and the lm_head tied to the embedding (GPT-2's), vocabulary 1001."""

    def __init__(self, vocab=1001, d=64):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, d)
        self.fc = torch.nn.Linear(d, d)
        self.norm = torch.nn.LayerNorm(d)

    def forward(self, ids, labels):
        h = self.norm(torch.nn.functional.gelu(self.fc(self.emb(ids))))
        logits = h @ self.emb.weight.t()
        loss = torch.nn.functional.cross_entropy(logits.float().view(-1, logits.shape[-1]), labels.view(-1))
        return loss, logits


@pytest.mark.parametrize(
    "env,option,padding", [("all", None, True), ("0", None, False), ("0", "all", True), ("all", "off", False)]
)
def test_training_tied_lm_head(dead_socket, monkeypatch, env, option, padding):
    """The forward pads the lm_head's N (the tied weight, before its transpose), the backward
    the gradient's M and K GEMMs; loss, logits and every gradient match eager, and the
    partitioner and fragments downstream (groups built, though no daemon answers) read the
    new metadata. FuseMLCompiler(pad_gemm=...) wins over FUSEML_PAD_GEMM."""
    monkeypatch.setenv("FUSEML_PAD_GEMM", env)
    torch.manual_seed(0)
    model = TiedLM().to(BF16)
    ids, labels = torch.randint(0, 1001, (2, 24)), torch.randint(0, 1001, (2, 24))
    compiler = fuseml.FuseMLCompiler(pad_gemm=option)

    def step(fn):
        for p in model.parameters():
            p.grad = None
        loss, logits = fn(ids, labels)
        loss.backward()
        return [loss.detach(), logits.detach()] + [p.grad.clone() for p in model.parameters()]

    want = step(model)
    got = step(torch.compile(model, backend=compiler))
    for i, (a, b) in enumerate(zip(got, want)):
        # the logits (slot 1) come back at the padded row stride, as Inductor's do; they are
        # also saved for the backward (cross_entropy.py keeps them, not fp32 log-probabilities),
        # which is compiled for the strides the forward reported
        stride = (24 * 1008, 1008, 1) if padding and i == 1 else b.stride()
        assert a.shape == b.shape and a.stride() == stride
        assert rel_err(a, b) < 1e-2
    fw, bw = plan(compiler, "forward"), plan(compiler, "backward")
    if not padding:
        assert fw.padded == [] and bw.padded == []
        return
    assert fw.padded == ["mm (N 1001 -> 1008)"] and "padded mm (N 1001" in fw.describe()
    # each padded copy of a value the graph reads (the weight) is a cat of contiguous
    # operands, left to ATen's cat (one pass); the logits' gradient, which the backward
    # computes (the loss's backward), is written padded by the group that computes it
    for p in (fw, bw):
        lone = [g for g in p.groups if g.op_names == ["cat"]]
        assert lone and all(g.route == "bypass" for g in lone), p.describe()
    (grad,) = [g for g in bw.groups if "cat" in g.op_names and "exp" in g.op_names]
    assert grad.route == "kernel", bw.describe()
    # the backward was compiled for the saved logits at the padded stride the forward reported
    saved = [n.meta["val"] for n in bw.compiled.gm.graph.nodes if n.op == "placeholder"]
    assert [v.stride() for v in saved if isinstance(v, torch.Tensor) and 1008 in v.stride()]
    assert sorted(d.split(" (")[1] for d in bw.padded) == ["K 1001 -> 1008)", "M 1001 -> 1008)"]
    assert any(g.built for g in fw.groups) and any(g.built for g in bw.groups)


def test_inference_logits_keep_the_padded_layout(dead_socket):
    """Under no_grad the inference graph's logits come back at the padded row stride (no copy
    back), equal to eager's."""
    torch.manual_seed(0)
    model = TiedLM().to(BF16)
    ids, labels = torch.randint(0, 1001, (2, 24)), torch.randint(0, 1001, (2, 24))
    compiler = fuseml.FuseMLCompiler(pad_gemm="all")
    with torch.no_grad():
        want = model(ids, labels)
        got = torch.compile(model, backend=compiler)(ids, labels)
    assert got[1].stride() == (24 * 1008, 1008, 1) and want[1].is_contiguous()
    for a, b in zip(got, want):
        assert rel_err(a, b) < 1e-2
    assert not [g for g in plan(compiler, "inference").groups if "clone" in g.op_names]


def test_a_reader_that_cannot_take_the_padded_layout_keeps_the_gemm():
    """`view(-1)` of the sliced [M, N] (row stride N + 7) has no view: that GEMM is left as
    it was, and the graph still runs; the other GEMM is padded."""

    def f(a, b, c):
        return (a @ b).view(-1), a @ c

    gm, xs = _trace(f, (24, 64), (64, 1001), (64, 1001))
    want = _run(gm, xs)
    assert pad_gemm.pad(gm, "all") == (["mm_1 (N 1001 -> 1008)"], [])
    assert [n.name for n in gm.graph.nodes if n.target is aten.mm.default] == ["mm", "mm_default"]
    for a, b in zip(_run(gm, xs), want):
        assert rel_err(a, b) < 1e-2
