"""The rewritten graphs compute what eager computes (CPU: every fused group runs its ATen ops
through the fuseml::group custom op)."""

import logging

import pytest
import torch

from helpers import assert_close, compile_run, plan
from models import MODELS

import fuseml


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("train", [True, False])
def test_model_matches_eager(dead_socket, name, train):
    torch.manual_seed(0)
    c, got, want = compile_run(MODELS[name](), torch.randn(6, 32), fuseml.FuseMLCompiler(min_ops=1), train=train)
    assert_close(got, want)
    p = plan(c, "forward" if train else "inference")
    assert p.kernels(), "nothing went through fuseml::group"


def test_dynamic_shapes_match_eager(dead_socket):
    torch.manual_seed(0)
    model = MODELS["llama_mlp"]()
    compiled = torch.compile(model, backend=fuseml.FuseMLCompiler(), dynamic=True)
    for batch in (3, 7, 11):
        x = torch.randn(batch, 4, 32)
        torch.testing.assert_close(compiled(x), model(x))


def test_bf16_and_casts(dead_socket):
    def f(x, y):
        h = torch.nn.functional.gelu(x.float() * 2.0, approximate="tanh")
        z = torch.where(h > 0.1, h, torch.exp(h) - 1.0).to(torch.bfloat16)
        return torch.sigmoid(z) * y + torch.rsqrt(y.abs() + 1) - torch.maximum(z, y) ** 2

    x = torch.randn(16, 8, dtype=torch.bfloat16)
    y = torch.randn(16, 8, dtype=torch.bfloat16)
    c = fuseml.FuseMLCompiler()
    got = torch.compile(f, backend=c)(x, y)
    torch.testing.assert_close(got, f(x, y))
    (k,) = plan(c, "inference").kernels()
    ops = [o["op"] for o in k.built.wire["ops"]]
    assert "cast" in ops and "where" in ops and "gelu_tanh" in ops and "pow" in ops


def test_fallback_without_daemon_warns_once(dead_socket, caplog):
    caplog.set_level(logging.WARNING, logger="fuseml")
    torch.manual_seed(0)
    c, got, want = compile_run(MODELS["activation_heavy"](), torch.randn(6, 32))
    assert_close(got, want)
    # and once more, a second model in the same process: no new warning for the same cause
    compile_run(MODELS["llama_mlp"](), torch.randn(6, 32))
    warnings = [r for r in caplog.records if r.name == "fuseml" and r.levelno == logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert "unreachable" in warnings[0].getMessage()
    assert all(g.key is None for p in c.plans for g in p.kernels())
