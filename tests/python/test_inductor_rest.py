"""rest="inductor": the graph with fuseml::group calls is compiled by TorchInductor, which runs
the groups as extern kernels and fuses what is left; forward and backward match eager."""
import torch

from helpers import assert_close, compile_run
from models import MODELS

import fuseml
from fuseml import runtime


def test_rest_inductor_without_daemon(dead_socket):
    c, got, want = compile_run(MODELS["activation_heavy"](), torch.randn(6, 32),
                               fuseml.FuseMLCompiler(rest="inductor"))
    assert_close(got, want, atol=1e-4, rtol=1e-4)
    assert c.plans and all(p.which in ("forward", "backward") for p in c.plans)


def test_rest_inductor_calls_fuseml_groups(daemon):
    """Served groups stay fuseml::group calls inside Inductor's code (on CPU they run their
    ATen ops inside the op: the call count shows Inductor kept them)."""
    before = runtime.counters["eager"]
    c, got, want = compile_run(MODELS["activation_heavy"](), torch.randn(6, 32),
                               fuseml.FuseMLCompiler(rest="inductor"))
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
