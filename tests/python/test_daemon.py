"""Round trips to a real fusemld (compile-only on a machine without a GPU): fragments built
from the reference models are accepted, keys come back, a second compile is all cache hits;
and the per-user daemon is started when none answers."""

import logging
import os
import signal
import time

import pytest
import torch

from conftest import _fusemld_bin
from helpers import assert_close, compile_run, plan
from models import MODELS

import fuseml
from fuseml import transport


def _kernels(c):
    return [g for p in c.plans for g in p.kernels()]


def test_models_compile_then_hit(daemon, caplog):
    caplog.set_level(logging.WARNING, logger="fuseml")
    torch.manual_seed(0)
    first = {}
    for name in sorted(MODELS):
        torch._dynamo.reset()
        c, got, want = compile_run(MODELS[name](), torch.randn(6, 32), fuseml.FuseMLCompiler(min_ops=1))
        assert_close(got, want)
        ks = _kernels(c)
        assert ks, name
        for g in ks:
            assert g.key and len(g.key) == 64, (name, g.describe(), g.reason)
            assert g.state in ("untuned", "tuned")
            assert g.origin in ("compiled", "joined", "hit")
        first[name] = [g.key for g in ks]
        hello = plan(c, "forward").hello
        assert hello["server"] == "fusemld" and hello["vocab"] >= 1
    # A fresh compile of the same models: every kernel is served from the store.
    for name in sorted(MODELS):
        torch._dynamo.reset()
        c, got, want = compile_run(MODELS[name](), torch.randn(6, 32), fuseml.FuseMLCompiler(min_ops=1))
        assert_close(got, want)
        ks = _kernels(c)
        assert [g.key for g in ks] == first[name]
        assert all(g.origin == "hit" for g in ks), [(g.describe(), g.origin) for g in ks]
    # CPU tensors run eager: said once, whatever the number of groups and models.
    msgs = [r.getMessage() for r in caplog.records if r.name == "fuseml" and r.levelno >= logging.WARNING]
    assert len(msgs) == 1 and "CUDA only" in msgs[0], msgs


def test_pipelined_requests_and_errors(daemon):
    conn = transport.connect(daemon.socket, timeout=30)
    try:
        good = {
            "vocab": 1,
            "inputs": [{"id": 0, "dtype": "f32", "shape": [-1, 16]}],
            "ops": [{"op": "exp", "out": 1, "args": [0]}],
            "outputs": [{"id": 1, "dtype": "f32", "shape": [-1, 16]}],
        }
        # (bmm, once the reserved name here, is vocabulary 4's batched product now)
        bad = dict(good, ops=[{"op": "frobnicate", "out": 1, "args": [0]}])
        replies = transport.compile_all(conn, [good, bad, good], 60)
        assert replies[0]["ok"] and replies[2]["ok"] and replies[0]["key"] == replies[2]["key"]
        assert not replies[1]["ok"] and replies[1]["code"] == "unknown_op"
        assert conn.call({"op": "ping"})["pong"] is True
    finally:
        conn.close()


def test_more_fragments_than_a_connection_may_have_waiting(daemon):
    """A graph with more groups than fusemld lets one connection keep waiting (256) is asked
    in windows: every fragment is served, none refused as busy; identical fragments (a
    model's repeated layers) are asked once and each gets its own reply."""
    n = 2 * transport.WINDOW + 50  # 306 distinct: more than 256 in flight if sent at once
    frags = [
        {
            "vocab": 1,
            "inputs": [{"id": 0, "dtype": "f32", "shape": [-1, 8]}],
            "ops": [{"op": "const", "out": 1, "value": float(i + 2)}, {"op": "mul", "out": 2, "args": [0, 1]}],
            "outputs": [{"id": 2, "dtype": "f32", "shape": [-1, 8]}],
        }
        for i in range(n)
    ]
    asked = []
    conn = transport.connect(daemon.socket, timeout=60)
    real = conn.send
    conn.send = lambda req: asked.append(req) or real(req)
    try:
        replies = transport.compile_all(conn, frags + frags[:10], 120)
    finally:
        conn.close()
    assert len(replies) == n + 10 and all(r["ok"] for r in replies), [r for r in replies if not r["ok"]][:2]
    assert len(asked) == n  # the ten repeats were not asked again
    assert [r["key"] for r in replies[n:]] == [r["key"] for r in replies[:10]]
    assert replies[n] is not replies[0]  # a reply of its own to each group
    assert len({r["key"] for r in replies}) == n


def test_compile_error_falls_back(daemon, caplog, monkeypatch):
    """A fragment the daemon refuses leaves its group eager, correct, with one warning."""
    caplog.set_level(logging.WARNING, logger="fuseml")
    orig = fuseml.backend.build

    def sabotage(members, ins, outs, shape=None):
        b = orig(members, ins, outs, shape)
        b.wire["vocab"] = 99
        return b

    monkeypatch.setattr(fuseml.backend, "build", sabotage)
    c, got, want = compile_run(MODELS["activation_heavy"](), torch.randn(6, 32))
    assert_close(got, want)
    (k,) = plan(c, "forward").kernels()
    assert k.key is None and "vocab 99" in k.reason
    msgs = [r.getMessage() for r in caplog.records if r.name == "fuseml"]
    assert len([m for m in msgs if "refused" in m]) == 1, msgs


def test_connect_timeout_on_silent_socket(tmp_path):
    import socket

    path = str(tmp_path / "silent.sock")
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(path)
    srv.listen(1)
    t0 = time.monotonic()
    with pytest.raises(transport.DaemonError) as e:
        transport.connect(path, timeout=0.3)
    assert e.value.code == "timeout" and time.monotonic() - t0 < 5
    srv.close()


def test_autostart(monkeypatch, tmp_path):
    exe = _fusemld_bin()
    if not exe:
        pytest.skip("no fusemld built (set FUSEMLD_BIN)")
    # The started daemon keeps its database and log under $HOME/.cache: keep them in tmp.
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("FUSEML_DAEMON", exe)
    monkeypatch.delenv("FUSEML_NO_AUTOSTART", raising=False)
    path = str(tmp_path / "auto.sock")
    monkeypatch.setenv("FUSEML_SOCKET", path)
    conn = transport.connect(timeout=10)
    try:
        assert conn.hello["ok"] and conn.hello["server"] == "fusemld"
    finally:
        conn.close()
        _stop_daemon_on(path)


def _stop_daemon_on(path):
    """SIGTERM to the daemon we started: the one whose command line names this socket."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if path.encode() in argv and os.path.basename(argv[0]) == b"fusemld":
            os.kill(int(pid), signal.SIGTERM)
            for _ in range(200):
                if not os.path.exists(f"/proc/{pid}"):
                    break
                time.sleep(0.05)
