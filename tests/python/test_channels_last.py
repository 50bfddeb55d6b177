"""2-D convolutions run on channels-last values (channels_last.py): the first convolution's
input is copied once, every op after it keeps the layout, the values a training forward
saves reach the backward channels-last (their strides reported to aot_autograd), and what
the user gets back is laid out as eager's. Results as eager's. FUSEML_CHANNELS_LAST=on runs
the rewrite on the CPU, where these tests run; "auto" converts CUDA bf16/f16 convolutions
only."""

import math

import pytest
import torch

from helpers import close_bf16, fp32_step, rel_err, run_step

import fuseml

aten = torch.ops.aten
BF16 = torch.bfloat16
CL = torch.channels_last


class Block(torch.nn.Module):
    """conv-bn-relu twice with a residual, pooled and classified: ResNet's shape."""

    def __init__(self, c=8, classes=5):
        super().__init__()
        self.stem = torch.nn.Conv2d(3, c, 3, padding=1, bias=False)
        self.bn0 = torch.nn.BatchNorm2d(c)
        self.conv = torch.nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(c)
        self.head = torch.nn.Linear(c, classes)

    def features(self, x):
        x = torch.relu(self.bn0(self.stem(x)))
        return torch.relu(self.bn1(self.conv(x)) + x)

    def forward(self, x):
        return self.head(self.features(x).mean((2, 3)))


class Features(Block):
    def __init__(self):
        super().__init__()
        del self.head

    def forward(self, x):
        return self.features(x)


def convolutions(gm):
    return [n for n in gm.graph.nodes if n.target is aten.convolution.default]


def layout_copies(gm):
    return [n for n in gm.graph.nodes if n.target is aten.clone.default and n.kwargs.get("memory_format") is CL]


@pytest.fixture
def channels_last_on(monkeypatch):
    monkeypatch.setenv("FUSEML_CHANNELS_LAST", "on")


def test_training_step_runs_channels_last(dead_socket, partitioned, channels_last_on):
    torch.manual_seed(0)
    model = Block().to(BF16)
    x = torch.randn(4, 3, 12, 12, dtype=BF16)
    ref = fp32_step(model, x)
    want = run_step(model, list(model.parameters()), x)
    got = run_step(torch.compile(model, backend=fuseml.FuseMLCompiler()), list(model.parameters()), x)
    close_bf16(got, want, ref)
    (fw, _), (bw, _) = partitioned
    # one copy, of the image; every convolution reads a channels-last value
    (copy,) = layout_copies(fw)
    assert copy.args[0].op == "placeholder"
    assert len(convolutions(fw)) == 2
    assert all(c.args[0].meta["val"].is_contiguous(memory_format=CL) for c in convolutions(fw))
    # the backward was compiled for the saved values as the forward leaves them
    saved = [
        p.meta["val"]
        for p in bw.graph.nodes
        if p.op == "placeholder" and p.meta["val"].dim() == 4 and not p.name.startswith(("primals", "tangents"))
    ]
    assert saved and all(v.is_contiguous(memory_format=CL) for v in saved), [v.stride() for v in saved]
    # the image is saved as its copy (channels-last): the backward's convolution reads its
    # input in its gradient's layout, and the forward returns no input of its own for it
    outs = next(n for n in fw.graph.nodes if n.op == "output").args[0]
    assert copy in outs and copy.args[0] not in outs
    (image,) = [p.meta["val"] for p in bw.graph.nodes if p.op == "placeholder" and p.meta["val"].shape == x.shape]
    assert image.is_contiguous(memory_format=CL), image.stride()
    # the gradients autograd accumulates are laid out as eager's
    for g, g0 in zip(got[1], want[1]):
        assert g.stride() == g0.stride()


class ConvAndFlatten(torch.nn.Module):
    """The image read by a convolution and, flattened, by a linear layer: the backward
    flattens the saved image again (the partitioner recomputes views there)."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1, bias=False)
        self.lin = torch.nn.Linear(3 * 6 * 6, 5, bias=False)

    def forward(self, x):
        return self.conv(x).mean((2, 3)).sum(1) + self.lin(x.flatten(1)).sum(1)


def test_a_view_of_a_saved_copy_reads_it_in_its_traced_layout(dead_socket, partitioned, channels_last_on):
    """The image is saved as its channels-last copy; the backward's flatten of it, which those
    strides cannot give as a view, reads a contiguous copy, and its convolution the saved one."""
    torch.manual_seed(2)
    model = ConvAndFlatten().to(BF16)
    x = torch.randn(2, 3, 6, 6, dtype=BF16)
    want = run_step(model, list(model.parameters()), x)
    got = run_step(torch.compile(model, backend=fuseml.FuseMLCompiler()), list(model.parameters()), x)
    close_bf16(got, want, fp32_step(model, x))
    (_, _), (bw, _) = partitioned
    (back,) = [n for n in bw.graph.nodes if n.target is aten.convolution_backward.default]
    assert back.args[1].meta["val"].is_contiguous(memory_format=CL)
    views = [n for n in bw.graph.nodes if n.target is aten.view.default and n.args[0].target is aten.clone.default]
    assert views and all(v.args[0].args[0] is back.args[1] for v in views)
    assert all(v.args[0].meta["val"].is_contiguous() for v in views)


def _adopt_channels_last(f):
    """f traced on a contiguous [2, 3, 4, 4] input, then given a channels-last example of it
    (what a backward gets for a value the forward saved channels-last): (graph, adopted)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from fuseml import fake_meta

    gm = make_fx(f, tracing_mode="fake")(torch.randn(2, 3, 4, 4))
    (ph,) = [n for n in gm.graph.nodes if n.op == "placeholder"]
    with fake_meta.mode_of(gm):
        example = torch.empty(2, 3, 4, 4).to(memory_format=CL)
    return gm, fake_meta.adopt_input_layouts(gm, [example])


def test_an_input_read_through_views_it_cannot_give_is_copied_for_them():
    """fake_meta.adopt_input_layouts: a view the new strides cannot give reads a contiguous
    copy (first the views alone, then every reader, as needed); the rest reads the input."""
    gm, adopted = _adopt_channels_last(lambda x: x.view(2, 48) * 2 + x.sum())
    assert adopted
    (copy,) = [n for n in gm.graph.nodes if n.target is aten.clone.default]
    assert [u.target for u in copy.users] == [aten.view.default]
    assert copy.meta["val"].is_contiguous() and copy.args[0].meta["val"].is_contiguous(memory_format=CL)
    gm, adopted = _adopt_channels_last(lambda x: x.unsqueeze(0).view(2, 48) * 2)  # no direct view: every reader
    (copy,) = [n for n in gm.graph.nodes if n.target is aten.clone.default]
    assert adopted and [u.target for u in copy.users] == [aten.unsqueeze.default]
    assert next(n for n in gm.graph.nodes if n.target is aten.view.default).meta["val"].shape == (2, 48)


def test_outputs_keep_eager_layout(dead_socket, partitioned, channels_last_on):
    """A feature map returned to the user is copied back to the contiguous layout it was
    traced in; inference and training alike."""
    torch.manual_seed(1)
    model = Features().to(BF16)
    x = torch.randn(2, 3, 10, 10, dtype=BF16)
    for train in (False, True):
        want = run_step(model, list(model.parameters()), x, train)
        got = run_step(torch.compile(model, backend=fuseml.FuseMLCompiler()), list(model.parameters()), x, train)
        assert got[0].is_contiguous() and got[0].stride() == want[0].stride()
        close_bf16(got, want, fp32_step(model, x, train))
        torch._dynamo.reset()
    (fw, _) = partitioned[0]
    outs = next(n for n in fw.graph.nodes if n.op == "output").args[0]
    (out,) = [o for o in outs if o.meta["val"].dim() == 4]  # the others: batch norm's running stats
    assert out.target is aten.clone.default and out.kwargs["memory_format"] is torch.contiguous_format


def test_what_is_left_as_it_was(dead_socket, partitioned, monkeypatch):
    """'auto' on the CPU, 'off', and a transposed convolution: no layout copy."""
    torch.manual_seed(2)
    x = torch.randn(2, 3, 8, 8, dtype=BF16)
    model = Block().to(BF16).eval()
    up = torch.nn.ConvTranspose2d(3, 4, 2, stride=2).to(BF16)
    for mode, m in (("auto", model), ("off", model), ("on", up)):
        monkeypatch.setenv("FUSEML_CHANNELS_LAST", mode)
        with torch.no_grad():
            got = torch.compile(m, backend=fuseml.FuseMLCompiler())(x)
            want = m(x)
        close_bf16((got, []), (want, []))
        torch._dynamo.reset()
    assert all(not layout_copies(gm) for gm, _ in partitioned)


def test_batch_norm_runs_as_column_and_pointwise_kernels(dead_socket, channels_last_on, partitioned, monkeypatch):
    """Batch norm in an inference graph whose convolutions run channels-last is decomposed:
    its statistics are column reductions of the [N * H * W, C] values as stored
    (memory_order.py, column_rewrite.py), its normalisation joins the ReLU after it, and the
    kernels read their channels-last tensors flat (channels innermost). With
    FUSEML_BATCH_NORM=aten a training graph keeps ATen's batch norm (channels-last kernels)."""
    torch.manual_seed(3)
    model = Block().to(BF16)  # training mode: batch statistics, also under no_grad
    x = torch.randn(4, 3, 12, 12, dtype=BF16)
    c = fuseml.FuseMLCompiler()
    with torch.no_grad():
        got = torch.compile(model, backend=c)(x)
        want = model(x)
    close_bf16((got, []), (want, []), (fp32_step(model, x, train=False)[0], []))
    (p,) = c.plans
    assert not any("batch_norm" in n for g in p.groups for n in g.op_names)
    stats = [g for g in p.groups if g.kind == "columns"]
    # each statistic's kernel: its mean, then per channel (column_shape.py) the running
    # statistic's update and, for the variance, rsqrt(var + eps)
    assert len(stats) == 4 and all(g.route == "kernel" and "mean" in g.op_names for g in stats)
    assert sum("rsqrt" in g.op_names for g in stats) == 2
    assert all(g.built.wire["inputs"][0]["shape"] == [4 * 12 * 12, 8] for g in stats)
    norm_relu = [g for g in p.groups if g.op_names[-1] == "relu"]
    assert norm_relu and all({"sub", "mul", "add"} <= set(g.op_names) for g in norm_relu)
    for t in norm_relu[0].built.wire["inputs"] + norm_relu[0].built.wire["outputs"]:
        assert t["strides"][-1] in (0, 1), t  # channels innermost: the kernel walks memory in order
    # training with FUSEML_BATCH_NORM=aten: ATen's batch norm, on channels-last values
    torch._dynamo.reset()
    monkeypatch.setenv("FUSEML_BATCH_NORM", "aten")
    run_step(torch.compile(model, backend=fuseml.FuseMLCompiler()), list(model.parameters()), x)
    fw = partitioned[-2][0]
    bns = [n for n in fw.graph.nodes if "batch_norm" in str(n.target)]
    assert len(bns) == 2 and all(n.args[0].meta["val"].is_contiguous(memory_format=CL) for n in bns)


def test_batch_norm_rewrites_are_exact_in_fp32(dead_socket, channels_last_on):
    """The same network in fp32 (FUSEML_CHANNELS_LAST=on converts it too): the decomposed,
    channels-last batch norm gives eager's values up to rounding, and a training step
    eager's gradients."""
    torch.manual_seed(4)
    model = Block(c=16)
    x = torch.randn(8, 3, 16, 16)
    for train in (False, True):
        got = run_step(torch.compile(model, backend=fuseml.FuseMLCompiler()), list(model.parameters()), x, train)
        want = run_step(model, list(model.parameters()), x, train)
        for a, b in zip([got[0]] + got[1], [want[0]] + want[1]):
            assert rel_err(a, b) < 1e-4, rel_err(a, b)
        torch._dynamo.reset()


def _train_step_matches_eager(model, x):
    """One compiled training step of model and one eager step of its copy: output and
    gradients agree up to fp32 rounding. Returns the eager copy (its running statistics)."""
    import copy

    twin = copy.deepcopy(model)
    got = run_step(torch.compile(model, backend=fuseml.FuseMLCompiler()), list(model.parameters()), x)
    want = run_step(twin, list(twin.parameters()), x)
    for a, b in zip([got[0]] + got[1], [want[0]] + want[1]):
        assert rel_err(a, b) < 1e-4, rel_err(a, b)
    return twin


def test_training_batch_norm_is_three_kernels(dead_socket, channels_last_on, partitioned, monkeypatch):
    """fp32: a training forward runs each batch norm as its two
    statistics kernels (whose epilogues compute rsqrt(var + eps), the running statistics'
    updates and the saved statistics' casts, per channel) and one normalising kernel with
    the activation; nothing per channel runs alone. The step gives eager's loss, gradients
    and running statistics up to rounding."""
    torch.manual_seed(8)
    model = Block(c=16)
    twin = _train_step_matches_eager(model, torch.randn(8, 3, 16, 16))
    for bn, bn_eager in ((model.bn0, twin.bn0), (model.bn1, twin.bn1)):
        torch.testing.assert_close(bn.running_mean, bn_eager.running_mean, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(bn.running_var, bn_eager.running_var, rtol=1e-5, atol=1e-6)
        assert bn.num_batches_tracked.item() == bn_eager.num_batches_tracked.item() == 1
    fw_groups = partitioned[-2][1]
    small = [g for g in fw_groups if g.kind == "pointwise" and g.shape is not None and math.prod(g.shape) <= 16]
    assert not small, [g.describe() for g in small]
    columns = [g for g in fw_groups if g.kind == "columns"]
    assert len(columns) == 4, [g.describe() for g in columns]
    assert sum("rsqrt" in g.op_names for g in columns) == 2


def test_bf16_training_batch_norm_has_no_lone_casts(dead_socket, channels_last_on, partitioned):
    """bf16: the backward casts each saved mean to fp32 for the column kernel of batch norm's
    two sums (through the [1, C] view of its column space) and for the pointwise kernel of the
    input gradient. Each reader gets its own cast (cast_sink.spread_small_casts) and computes
    it inside its kernel: no cast runs as a kernel of its own. The step is as far from fp32's
    as eager bf16's, within half again: on the CPU the groups run their ATen ops, in bf16
    between the decomposition's casts (on the GPU, in fp32 inside the kernels)."""
    torch.manual_seed(9)
    model = Block(c=16).to(BF16)
    x = torch.randn(8, 3, 16, 16, dtype=BF16)
    import copy

    twin = copy.deepcopy(model)
    got = run_step(torch.compile(model, backend=fuseml.FuseMLCompiler()), list(model.parameters()), x)
    want = run_step(twin, list(twin.parameters()), x)
    ref = fp32_step(twin, x)
    for a, b, r in zip([got[0]] + got[1], [want[0]] + want[1], [ref[0]] + ref[1]):
        assert rel_err(a, r) <= 1.5 * rel_err(b, r) + 1e-3, (rel_err(a, r), rel_err(b, r))
    bw_gm, bw_groups = partitioned[-1]
    assert any(g.kind == "columns" for g in bw_groups)
    casts = [n for n in bw_gm.graph.nodes if n.target is aten._to_copy.default]
    fused = {n for g in bw_groups if g.route == "kernel" for n in g.members}
    assert casts and all(n in fused for n in casts), [n.name for n in casts if n not in fused]
    lone = [g.describe() for g in bw_groups if len(g.members) == 1 and g.route != "kernel"]
    assert not any("_to_copy" in d for d in lone), lone


@pytest.mark.parametrize("affine,track", [(False, True), (True, False), (False, False)])
def test_training_batch_norm_variants_match_eager(dead_socket, channels_last_on, affine, track):
    """Decomposed in training: batch norm without weight and bias, without running
    statistics (batch statistics only), or neither, gives eager's values and gradients."""
    torch.manual_seed(10)
    model = Block(c=16)
    for name in ("bn0", "bn1"):
        setattr(model, name, torch.nn.BatchNorm2d(16, affine=affine, track_running_stats=track))
    twin = _train_step_matches_eager(model, torch.randn(8, 3, 16, 16))
    if track:
        torch.testing.assert_close(model.bn1.running_var, twin.bn1.running_var, rtol=1e-5, atol=1e-6)


def _eval_step(model, x, compiler):
    with torch.no_grad():
        return torch.compile(model, backend=compiler)(x)


def test_eval_batch_norm_is_one_kernel_with_its_activation(dead_socket, channels_last_on):
    """With running statistics, batch norm is pointwise: rsqrt(var + eps), the statistics'
    casts (per channel, memory_order._small) and the normalisation run in the one kernel
    with the ReLU (and the residual add) after it; exact in fp32."""
    torch.manual_seed(5)
    model = Block(c=16).eval()
    for bn in (model.bn0, model.bn1):  # running statistics that are not the defaults
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2)
    x = torch.randn(2, 3, 10, 10)
    c = fuseml.FuseMLCompiler()
    got = _eval_step(model, x, c)
    torch.testing.assert_close(got, model(x), rtol=1e-5, atol=1e-5)
    (p,) = c.plans
    kernels = [g for g in p.groups if g.route == "kernel"]
    assert len(kernels) == 2, p.describe()  # one per batch norm: no per-channel kernels beside
    for g in kernels:
        assert {"rsqrt", "relu"} <= set(g.op_names), g.describe()


def test_daemon_accepts_batch_norm_kernels(daemon, channels_last_on):
    torch.manual_seed(6)
    model = Block().to(BF16).eval()
    x = torch.randn(2, 3, 10, 10, dtype=BF16)
    c = fuseml.FuseMLCompiler()
    _eval_step(model, x, c)
    with torch.no_grad():
        _eval_step(model.train(), x, c)  # batch statistics: the column kernels
    gs = [g for p in c.plans for g in p.groups if g.route == "kernel"]
    assert any(g.kind == "columns" for g in gs) and any("rsqrt" in g.op_names for g in gs)
    # the daemon answered ok with a kernel (compile-only here: not yet tuned on a GPU)
    assert all(g.key and g.state in ("untuned", "tuned") for g in gs), [g.describe() for g in gs]


def test_daemon_accepts_training_batch_norm_kernels(daemon, channels_last_on, monkeypatch):
    """A training step: every group of the forward and backward (the statistics, the
    backward's two sums in one column kernel, the per-channel epilogues) is a fragment the
    daemon generates and compiles."""
    torch.manual_seed(7)
    model = Block(c=16).to(BF16)
    c = fuseml.FuseMLCompiler()
    run_step(torch.compile(model, backend=c), list(model.parameters()), torch.randn(4, 3, 10, 10, dtype=BF16))
    gs = [g for p in c.plans for g in p.groups if g.route == "kernel"]
    assert any(g.kind == "columns" and g.op_names.count("sum") == 2 for g in gs)
    assert all(g.key and g.state in ("untuned", "tuned") for g in gs), [g.describe() for g in gs]


def test_dynamic_batch_sizes_stay_right(dead_socket, channels_last_on):
    """Compiled with dynamic=True: the rewrites take symbolic sizes as they are (or leave the
    graph as it was); training and eval steps at three batch sizes match eager's."""
    torch.manual_seed(8)
    model = Block(c=16)
    fn = torch.compile(model, backend=fuseml.FuseMLCompiler(), dynamic=True)
    for batch in (2, 3, 5):
        x = torch.randn(batch, 3, 10, 10)
        got = run_step(fn, list(model.parameters()), x)
        want = run_step(model, list(model.parameters()), x)
        for a, b in zip([got[0]] + got[1], [want[0]] + want[1]):
            assert rel_err(a, b) < 1e-4, (batch, rel_err(a, b))
        model.eval()
        with torch.no_grad():
            assert rel_err(fn(x), model(x)) < 1e-5
        model.train()


def test_the_setting_reads_as_documented(monkeypatch):
    """FUSEML_CHANNELS_LAST: 0/off none, on/1 any convolution, anything else (a typo too) the
    default, auto."""
    from fuseml import settings

    for value, mode in (
        ("0", "off"),
        ("OFF", "off"),
        ("on", "on"),
        ("1", "on"),
        ("auto", "auto"),
        ("yes please", "auto"),
    ):
        monkeypatch.setenv("FUSEML_CHANNELS_LAST", value)
        assert settings.channels_last() == mode, value
    monkeypatch.delenv("FUSEML_CHANNELS_LAST")
    assert settings.channels_last() == "auto"


def test_batch_norm_setting_decomposes_training_graphs(dead_socket, channels_last_on, partitioned, monkeypatch):
    """By default a training graph's batch norm is decomposed too (its statistics column
    reductions of the channels-last values, its backward's sums too), and the step gives the
    loss and gradients of torch's own decomposition of batch norm (what Inductor runs; on the
    CPU, where this runs, the decomposition rounds the saved statistics to bf16 as the CPU's
    kernels do, so its gradients are compared with the decomposition's; on CUDA they stay fp32,
    as eager's); "aten" keeps ATen's batch norm everywhere."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    from fuseml import settings
    from fuseml.backend import BATCH_NORM, DECOMPOSITIONS

    torch.manual_seed(9)
    model = Block(c=16).to(BF16)
    x = torch.randn(8, 3, 16, 16, dtype=BF16)
    assert settings.batch_norm() == "auto"
    ref = fp32_step(model, x)
    decomposed = aot_autograd(
        fw_compiler=lambda gm, ex: make_boxed_func(gm), decompositions={**DECOMPOSITIONS, **BATCH_NORM}
    )
    want = run_step(torch.compile(model, backend=decomposed), list(model.parameters()), x)
    torch._dynamo.reset()
    del partitioned[:]
    got = run_step(torch.compile(model, backend=fuseml.FuseMLCompiler()), list(model.parameters()), x)
    close_bf16(got, want, ref)
    (fw, fw_groups), (bw, bw_groups) = partitioned[-2:]
    assert not [n for n in fw.graph.nodes if "batch_norm" in str(n.target)]
    assert not [n for n in bw.graph.nodes if "batch_norm" in str(n.target)]
    assert [g for g in fw_groups if g.kind == "columns"]
    # each batch norm's two backward sums (of g and of g * (x - mean)) are one column kernel,
    # which reads g and x once, though each sum took its own copy of g's prologue (before:
    # four column kernels where the second norm's sums were apart)
    bw_columns = [g for g in bw_groups if g.kind == "columns"]
    sums = sorted(g.op_names.count("sum") for g in bw_columns)
    assert sums == [1, 2, 2], [g.describe() for g in bw_columns]  # the head's bias gradient, the two norms
    torch._dynamo.reset()
    monkeypatch.setenv("FUSEML_BATCH_NORM", "aten")
    with torch.no_grad():
        torch.compile(model.eval(), backend=fuseml.FuseMLCompiler())(x)
    assert [n for n in partitioned[-1][0].graph.nodes if "batch_norm" in str(n.target)]
    for value, mode in (("fused", "auto"), ("ATEN", "aten"), ("auto", "auto"), ("typo", "auto")):
        monkeypatch.setenv("FUSEML_BATCH_NORM", value)
        assert settings.batch_norm() == mode
