import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))

import fuseml  # noqa: E402
from fuseml import _log  # noqa: E402


def _fusemld_bin():
    path = os.environ.get("FUSEMLD_BIN")
    if path:
        return path
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    for build in ("build-test", "build"):
        cand = os.path.join(root, build, "daemon", "fusemld")
        if os.path.exists(cand):
            return cand
    return None


_ROUTES = os.path.join(tempfile.mkdtemp(prefix="fuseml-test-routes-"), "routes.db")


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    """Each test compiles from scratch and hears every warning again. These tests run CPU
    tensors through the whole path (partition, fragments, the daemon's replies), which a graph
    without CUDA tensors skips unless FUSEML_REQUEST_CPU_GRAPHS=1 (test_cpu_graphs.py unsets it)."""
    torch._dynamo.reset()
    _log.reset_warnings()
    monkeypatch.delenv("FUSEML_ALLOW_UNTUNED", raising=False)
    monkeypatch.setenv("FUSEML_REQUEST_CPU_GRAPHS", "1")
    # routing decisions remembered by the tests' own GPU runs stay out of the user's cache
    monkeypatch.setenv("FUSEML_ROUTE_CACHE", _ROUTES)
    yield
    torch._dynamo.reset()


@pytest.fixture
def dead_socket(monkeypatch, tmp_path):
    path = str(tmp_path / "nobody.sock")
    monkeypatch.setenv("FUSEML_SOCKET", path)
    monkeypatch.setenv("FUSEML_NO_AUTOSTART", "1")
    return path


class Daemon:
    def __init__(self, exe, tmp, extra=()):
        self.exe = exe
        self.socket = os.path.join(tmp, "fusemld.sock")
        self.db = os.path.join(tmp, "kernels.db")
        self.log = open(os.path.join(tmp, "fusemld.log"), "wb")
        self.proc = subprocess.Popen(
            [
                exe,
                "--foreground",
                "--socket",
                self.socket,
                "--db",
                self.db,
                "--jobs",
                "2",
                "--log-level",
                "debug",
                *extra,
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 20
        while not os.path.exists(self.socket):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("fusemld did not start; see " + self.log.name)
            time.sleep(0.02)

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


@pytest.fixture
def daemon(monkeypatch):
    exe = _fusemld_bin()
    if not exe:
        pytest.skip("no fusemld built (set FUSEMLD_BIN)")
    tmp = tempfile.mkdtemp(prefix="fuseml-py-")
    d = Daemon(exe, tmp)
    monkeypatch.setenv("FUSEML_SOCKET", d.socket)
    monkeypatch.setenv("FUSEML_NO_AUTOSTART", "1")
    try:
        yield d
    finally:
        d.stop()
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture
def served(dead_socket, monkeypatch):
    """Every fragment is 'served' a tuned kernel without a daemon (a stand-in transport), so
    the graph is rewritten with the fuseml groups in it; on CPU each group then runs its own
    ATen ops through the runner (the rewritten graph, not the original one, computes the
    result). `served.wires` lists the fragments of each round of requests."""

    class Conn:
        hello = None

        def close(self):
            pass

    rounds = []

    def compile_all(conn, wires, timeout):
        rounds.append(list(wires))
        return [
            {"ok": True, "key": "k" * 64, "state": "tuned", "origin": "compiled", "cubin": b"", "meta": {}}
            for _ in wires
        ]

    monkeypatch.setattr(fuseml.backend.transport, "connect", lambda *a, **k: Conn())
    monkeypatch.setattr(fuseml.backend.transport, "compile_all", compile_all)
    compile_all.rounds = rounds
    return compile_all


@pytest.fixture
def partitioned(monkeypatch):
    """(graph module, groups) of every graph the backend partitions, in order: what a test
    reads to see which nodes were left outside the groups."""
    seen = []
    find = fuseml.backend.find_groups

    def record(gm, *a, **k):
        groups = find(gm, *a, **k)
        seen.append((gm, groups))
        return groups

    monkeypatch.setattr(fuseml.backend, "find_groups", record)
    return seen


@pytest.fixture
def saves_every_intermediate(monkeypatch):
    """Training graphs split by aot_autograd's default partition (FUSEML_RECOMPUTE=0): the
    tests of what a forward group saves for its backward read that partition's escapes."""
    monkeypatch.setenv("FUSEML_RECOMPUTE", "0")
