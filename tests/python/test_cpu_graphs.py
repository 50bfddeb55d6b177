"""A graph without CUDA tensors never talks to the daemon: fused kernels run on CUDA only, so
it runs as its ATen ops, with one info note and no request (a real fusemld counts them)."""

import io
import logging

import pytest
import torch

from helpers import Fn

import fuseml
from fuseml import transport


def _requests(socket):
    """The daemon's session count of requests, through a connection of our own (its hello and
    stats count too: 2 per call)."""
    conn = transport.connect(socket, timeout=30)
    try:
        return conn.call({"op": "stats"})["session"]["requests"]
    finally:
        conn.close()


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 32), torch.nn.LayerNorm(32)
    )


@pytest.mark.parametrize("train", [False, True])
def test_cpu_graph_sends_nothing(daemon, caplog, monkeypatch, train):
    monkeypatch.delenv("FUSEML_REQUEST_CPU_GRAPHS")
    caplog.set_level(logging.DEBUG, logger="fuseml")
    model, x = _mlp(), torch.randn(8, 32)
    before = _requests(daemon.socket)
    compiler = fuseml.FuseMLCompiler(min_ops=1)
    fn = torch.compile(model, backend=compiler)
    for _ in range(2):
        if train:
            xi = x.clone().requires_grad_(True)
            fn(xi).sum().backward()
            xe = x.clone().requires_grad_(True)
            model(xe).sum().backward()
            torch.testing.assert_close(xi.grad, xe.grad)
        else:
            with torch.no_grad():
                torch.testing.assert_close(fn(x), model(x))
    assert _requests(daemon.socket) - before == 2  # our own hello and stats, nothing else
    assert compiler.plans and all(p.skipped and not p.groups for p in compiler.plans)
    assert {p.which for p in compiler.plans} == ({"forward", "backward"} if train else {"inference"})
    records = [r for r in caplog.records if r.name == "fuseml"]
    assert not [r for r in records if r.levelno >= logging.WARNING], [r.getMessage() for r in records]
    notes = [r for r in records if r.levelno == logging.INFO]
    assert len(notes) == 1 and "without CUDA tensors runs as ATen" in notes[0].getMessage()


def test_the_testing_aid_still_sends_them(daemon, monkeypatch):
    """The control for the count above: FUSEML_REQUEST_CPU_GRAPHS=1 (what the other tests
    set) sends the same model's fragments, which the daemon counts."""
    monkeypatch.setenv("FUSEML_REQUEST_CPU_GRAPHS", "1")
    model, x = _mlp(), torch.randn(8, 32)
    before = _requests(daemon.socket)
    compiler = fuseml.FuseMLCompiler(min_ops=1)
    with torch.no_grad():
        torch.compile(model, backend=compiler)(x)
    kernels = [g for p in compiler.plans for g in p.kernels()]
    assert kernels and _requests(daemon.socket) - before >= 2 + 1 + len(kernels)  # + hello + compiles


def test_no_daemon_needed_and_explain_says_why(dead_socket, monkeypatch, caplog):
    monkeypatch.delenv("FUSEML_REQUEST_CPU_GRAPHS")
    caplog.set_level(logging.WARNING, logger="fuseml")
    out = io.StringIO()
    rows = fuseml.explain(Fn(lambda x: torch.relu(x * 2 + 1)), torch.randn(4, 8), file=out)
    assert rows == []
    assert "no CUDA tensor: runs as ATen, nothing sent to fusemld" in out.getvalue(), out.getvalue()
    assert not caplog.records  # no "fusemld unreachable": nothing tried to reach it
