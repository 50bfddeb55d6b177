"""rest="inductor": the graph with fuseml::group calls is compiled by TorchInductor, which runs
the groups as extern kernels and fuses what is left; forward and backward match eager."""

import pytest
import torch

from helpers import assert_close, compile_run
from models import MODELS

import fuseml
from fuseml import runtime


def test_rest_inductor_without_daemon(dead_socket):
    c, got, want = compile_run(MODELS["activation_heavy"](), torch.randn(6, 32), fuseml.FuseMLCompiler(rest="inductor"))
    assert_close(got, want, atol=1e-4, rtol=1e-4)
    assert c.plans and all(p.which in ("forward", "backward") for p in c.plans)


def test_rest_inductor_calls_fuseml_groups(daemon):
    """Served groups stay fuseml::group calls inside Inductor's code (on CPU they run their
    ATen ops inside the op: the call count shows Inductor kept them)."""
    before = runtime.counters["eager"]
    c, got, want = compile_run(MODELS["activation_heavy"](), torch.randn(6, 32), fuseml.FuseMLCompiler(rest="inductor"))
    assert_close(got, want, atol=1e-4, rtol=1e-4)
    served = [g for p in c.plans for g in p.kernels() if g.key]
    assert served
    assert runtime.counters["eager"] - before >= len(served)


def test_rest_must_be_known():
    try:
        fuseml.FuseMLCompiler(rest="tvm")
    except ValueError as e:
        assert "rest" in str(e)
    else:
        raise AssertionError("an unknown rest= was accepted")


class ClampedRouting(torch.nn.Module):
    """Mixtral's expert routing in miniature: each row's top expert, clamped in place to the
    last expert's index (`expert_ids.clamp_(max=n - 1)`), picks a scale; float clamps beside."""

    def __init__(self, d=16, experts=4):
        super().__init__()
        self.gate = torch.nn.Linear(d, experts + 2)
        self.scale = torch.nn.Parameter(torch.randn(experts))

    def forward(self, x):
        logits = self.gate(x)
        ids = logits.argmax(-1)
        ids.clamp_(max=self.scale.numel() - 1)
        y = x.clamp(max=0.5) + x.clamp_min(-0.5) + torch.clamp(x, -0.25, 0.25)
        return y * self.scale[ids].unsqueeze(-1) + logits.mean(-1, keepdim=True)


def test_rest_inductor_traces_in_place_clamp(dead_socket):
    """Inductor's decompositions spell clamp as clamp_min and clamp_max; fuseml's own spell
    those as clamp: together they recursed without end (RecursionError tracing the clamp_)."""
    c, got, want = compile_run(ClampedRouting(), torch.randn(6, 16), fuseml.FuseMLCompiler(rest="inductor"))
    assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert {p.which for p in c.plans} == {"forward", "backward"}


class ConvNet(torch.nn.Module):
    """A ResNet stem in miniature: conv, batch norm, ReLU, max pool, then a classifier."""

    def __init__(self, c=8, classes=5):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, c, 3, padding=1, bias=False)
        self.bn = torch.nn.BatchNorm2d(c)
        self.head = torch.nn.Linear(c, classes)

    def forward(self, x):
        y = torch.nn.functional.max_pool2d(torch.relu(self.bn(self.conv(x))), 3, 2, 1)
        return self.head(y.mean((2, 3)))


def test_rest_inductor_trains_channels_last_convnet(served, monkeypatch):
    """A training graph whose convolutions run channels-last under rest="inductor". Two
    failures are fixed:
    - fuseml reported the saved values' strides to aot_autograd, and Inductor then asserted
      that no one had reported before it;
    - Inductor's max_pool2d decomposition reads torch._inductor.lowering, which nothing had
      imported yet."""
    monkeypatch.setenv("FUSEML_CHANNELS_LAST", "on")
    torch.manual_seed(0)
    c, got, want = compile_run(ConvNet(), torch.randn(2, 3, 12, 12), fuseml.FuseMLCompiler(rest="inductor"))
    assert_close(got, want, atol=1e-4, rtol=1e-4)
    assert {p.which for p in c.plans} == {"forward", "backward"}


def test_rest_inductor_traces_with_inductors_var_mean():
    """Inductor lowers var_mean as one Welford reduction; fuseml's decomposition (two row
    reductions, for its rows groups) is left out of the table rest="inductor" traces with."""
    aten = torch.ops.aten
    ours = fuseml.FuseMLCompiler()._decompositions()
    theirs = fuseml.FuseMLCompiler(rest="inductor")._decompositions()
    assert ours[aten.var_mean.correction] is fuseml.backend._var_mean
    assert theirs.get(aten.var_mean.correction) is not fuseml.backend._var_mean


def test_rest_inductor_leaves_max_pooling_to_inductor(served, partitioned):
    """Inductor lowers max_pool2d into its own kernels; fuseml's pooling op (max_pool.py)
    would be an extern call in both of its forms, running ATen's pool and index conversions
    (ResNet-50's step took 1.16x Inductor's GPU time so): under rest="inductor" the graphs
    hold torch's pooling, under the default fuseml's."""
    pools = {}
    for rest in ("inductor", "aten"):
        torch.manual_seed(0)
        del partitioned[:]
        c, got, want = compile_run(ConvNet(), torch.randn(2, 3, 12, 12), fuseml.FuseMLCompiler(rest=rest))
        assert_close(got, want, atol=1e-4, rtol=1e-4)
        targets = [str(n.target) for gm, _ in partitioned for n in gm.graph.nodes]
        pools[rest] = {t.split(".")[0] for t in targets if "pool" in t}
    # torch's pool, as Inductor's table decomposes it (prims' pool with offsets, or ATen's)
    assert pools["inductor"] and "fuseml" not in pools["inductor"], pools
    assert pools["aten"] == {"fuseml"}, pools


@pytest.mark.parametrize("own", [True, False], ids=["inductors-compilers", "compile_fx_inner"])
@pytest.mark.parametrize("train", [True, False], ids=["train", "inference"])
def test_rest_inductor_compiles_each_graph_as_inductor_would(served, monkeypatch, own, train):
    """Each graph of rest="inductor" is compiled by Inductor's own forward and backward
    compilers where this torch has them, by compile_fx_inner (an inference graph given
    Inductor's joint passes first) where it does not; both forms of every graph (Inductor
    alone and with the groups) go that way, and the results match eager either way."""
    from fuseml import inductor_joint

    if not own:
        monkeypatch.setattr(inductor_joint, "_own_compilers", lambda: None)
    compiled = []
    compile_graph = inductor_joint.Compiler.compile

    def spy(self, gm, example_inputs, which):
        compiled.append((which, self.how))
        return compile_graph(self, gm, example_inputs, which)

    monkeypatch.setattr(inductor_joint.Compiler, "compile", spy)
    torch.manual_seed(0)
    model = MODELS["activation_heavy"]()
    c, got, want = compile_run(model, torch.randn(6, 32), fuseml.FuseMLCompiler(rest="inductor"), train=train)
    assert_close(got, want, atol=1e-4, rtol=1e-4)
    whiches = {"forward", "backward"} if train else {"inference"}
    assert {p.which for p in c.plans} == whiches
    assert all(p.kernels() for p in c.plans)
    how = "Inductor's forward and backward compilers" if own else "compile_fx_inner"
    assert sorted(compiled) == sorted((w, how) for w in whiches for _ in range(2))


def test_rest_inductor_takes_torch_2_11s_compiler_config(served, monkeypatch):
    """torch 2.11 makes the state its forward and backward compilers share from Inductor's
    config module, later versions from the dynamo graph: each is called as it asks."""
    import torch._inductor.config
    from torch._inductor import compile_fx

    made = compile_fx.create_compiler_config_extra
    given = []

    def from_config(config):  # 2.11's parameter; `made` reads no meta off a non-graph
        given.append(config)
        return made(config)

    monkeypatch.setattr(compile_fx, "create_compiler_config_extra", from_config)
    torch.manual_seed(0)
    c, got, want = compile_run(MODELS["activation_heavy"](), torch.randn(6, 32), fuseml.FuseMLCompiler(rest="inductor"))
    assert_close(got, want, atol=1e-4, rtol=1e-4)
    assert given == [torch._inductor.config]


def test_rest_inductor_compilers_that_refuse_their_arguments_fall_back(served, monkeypatch, caplog):
    """Inductor's forward and backward compilers are private functions: one that does not
    take the arguments given (another torch's) leaves rest="inductor" on compile_fx_inner,
    with one warning, and the results right."""
    from torch._inductor import compile_fx

    from fuseml import inductor_joint

    def refuses(gm):
        raise TypeError("create_compiler_config_extra() takes another argument")

    monkeypatch.setattr(compile_fx, "create_compiler_config_extra", refuses)
    hows = []
    compile_graph = inductor_joint.Compiler.compile
    monkeypatch.setattr(
        inductor_joint.Compiler, "compile", lambda self, *a: hows.append(self.how) or compile_graph(self, *a)
    )
    fuseml._log.reset_warnings()
    torch.manual_seed(0)
    c, got, want = compile_run(MODELS["activation_heavy"](), torch.randn(6, 32), fuseml.FuseMLCompiler(rest="inductor"))
    assert_close(got, want, atol=1e-4, rtol=1e-4)
    assert hows and set(hows) == {"compile_fx_inner"}
    warned = [r for r in caplog.records if r.levelname == "WARNING" and "compile_fx_inner" in r.getMessage()]
    assert len(warned) == 1


def test_a_graph_compiled_outside_torch_compile_takes_compile_fx_inner():
    """Inductor's forward compiler counts the user's outputs on the dynamo graph: without one
    (compile_graph called by hand), rest="inductor" compiles with compile_fx_inner."""
    from fuseml import inductor_joint

    assert inductor_joint.Compiler(None, ()).how == "compile_fx_inner"
