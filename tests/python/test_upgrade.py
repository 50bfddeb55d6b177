"""A running graph picks up the kernels fusemld tunes in the background (fuseml/upgrade.py),
against a real fusemld whose tuner is the stand-in worker (tests/unit/tuner_standin.c: no GPU;
its third candidate is the fastest): the kernels come back "verified", the client launches them
without FUSEML_ALLOW_UNTUNED, and the graph's calls swap in the tuned ones by key, without
recompiling, retiring the modules they replace."""

import contextlib
import logging
import os
import shutil
import tempfile
import time
import types

import pytest
import torch

from conftest import Daemon, _fusemld_bin

import fuseml
from fuseml import runtime, upgrade


def _runners(c):
    ids = {id(g.built) for p in c.plans for g in p.kernels()}
    return [r for r in runtime._registry.values() if r.built is not None and id(r.built) in ids]


@pytest.fixture
def tuning_daemon(monkeypatch):
    exe = _fusemld_bin()
    standin = exe and os.path.join(os.path.dirname(os.path.dirname(exe)), "tests", "tuner_standin")
    if not exe or not os.path.exists(standin):
        pytest.skip("no fusemld and tuner_standin built")
    monkeypatch.setenv("FM_STANDIN_PLAN", "ok:5,ok:4,ok:1")
    monkeypatch.setenv("FM_STANDIN_RUN_MS", "20")
    tmp = tempfile.mkdtemp(prefix="fuseml-py-")
    d = Daemon(exe, tmp, ("--tuner-worker", standin))
    monkeypatch.setenv("FUSEML_SOCKET", d.socket)
    monkeypatch.setenv("FUSEML_NO_AUTOSTART", "1")
    try:
        yield d
    finally:
        d.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def test_verified_kernels_launch_without_the_testing_flag(dead_socket, caplog):
    caplog.set_level(logging.WARNING, logger="fuseml")
    c = fuseml.FuseMLCompiler()
    f = lambda x: torch.relu(x * 2.0)  # noqa: E731
    torch.compile(f, backend=c)(torch.randn(4, 8))
    (r,) = _runners(c)
    r.kernel = ("k" * 64, "verified", b"", {})
    decided = []
    r._decide = lambda xs, dev, key, cubin, meta: decided.append(key) or ["out"]
    fake = types.SimpleNamespace(device=torch.device("cuda", 0))
    assert r.run([fake]) == ["out"]
    assert decided and "untuned" not in caplog.text and "not verified" not in caplog.text


def test_running_graph_picks_up_tuned_kernels(tuning_daemon, monkeypatch):
    monkeypatch.setenv("FUSEML_UPGRADE_S", "0.05")
    monkeypatch.setattr(upgrade, "CHECK_CALLS", 1)
    c = fuseml.FuseMLCompiler(socket=tuning_daemon.socket)
    f = lambda x: torch.sigmoid(x * 3.0) + x  # noqa: E731
    x = torch.randn(6, 32)
    fn = torch.compile(f, backend=c)
    torch.testing.assert_close(fn(x), f(x))
    rs = _runners(c)
    assert rs and all(r.kernel[1] == "verified" for r in rs), [r.kernel[1] for r in rs]
    first = {r.kernel[0]: r.kernel[2] for r in rs}
    # as if the verified kernels had been loaded on device 0
    loaded = {r.kernel[0]: object() for r in rs}
    for key, mod in loaded.items():
        runtime._modules[(key, 0)] = mod
    deadline = time.monotonic() + 120
    while any(r.kernel[1] != "tuned" for r in rs) and time.monotonic() < deadline:
        torch.testing.assert_close(fn(x), f(x))  # each call ticks; no recompile
        time.sleep(0.02)
    assert all(r.kernel[1] == "tuned" for r in rs), [r.kernel[1] for r in rs]
    for r in rs:
        key = r.kernel[0]
        assert key in first and r.kernel[2] != first[key]  # another candidate's CUBIN
        assert (key, 0) not in runtime._modules and loaded[key] in upgrade.retired
        assert r.group.state == "tuned"
    assert len(c.plans) == 1  # one compile of the graph


def test_a_group_aten_won_against_its_verified_kernel_is_measured_again(tuning_daemon, monkeypatch):
    """Measured routing compared ATen with the verified kernel (the heuristic default, which
    can be many times slower than the tuned one) and ATen won: when the tuned kernel arrives,
    the group goes back into the graph and its routing is open again (measured at the next
    call on a GPU); the results stay right and the graph is not recompiled."""
    from fuseml import backend

    monkeypatch.setenv("FUSEML_UPGRADE_S", "0.05")
    monkeypatch.setattr(upgrade, "CHECK_CALLS", 1)
    c = fuseml.FuseMLCompiler(socket=tuning_daemon.socket)
    f = lambda x: torch.tanh(x * 2.0) - x  # noqa: E731
    x = torch.randn(6, 32)
    fn = torch.compile(f, backend=c)
    torch.testing.assert_close(fn(x), f(x))
    (r,) = _runners(c)
    (compiled,) = [k for k in backend.live if r in k.runners.values()]
    r.use_kernel = False  # as if ATen had won against the verified kernel
    compiled._reroute()
    assert r.group not in compiled.kept
    deadline = time.monotonic() + 120
    while r.kernel[1] != "tuned" and time.monotonic() < deadline:
        torch.testing.assert_close(fn(x), f(x))
        time.sleep(0.02)
    assert r.kernel[1] == "tuned"
    torch.testing.assert_close(fn(x), f(x))
    assert r.group in compiled.kept and r.use_kernel is None  # on the CPU nothing decides it
    assert len(c.plans) == 1


def test_a_dropped_gemm_group_comes_back_for_its_tuned_kernel(tuning_daemon, monkeypatch):
    """A GEMM group whose verified kernel lost to ATen runs cuBLAS plus its epilogue apart (one
    pointwise group); when its tuned kernel arrives the GEMM group takes its place back, to be
    measured again, and a second loss brings back the same epilogue group (no new request)."""
    from fuseml import backend

    monkeypatch.setenv("FUSEML_UPGRADE_S", "0.05")
    monkeypatch.setenv("FUSEML_REQUEST_CPU_GRAPHS", "1")  # a GEMM group is requested on the CPU
    monkeypatch.setattr(upgrade, "CHECK_CALLS", 1)
    c = fuseml.FuseMLCompiler(socket=tuning_daemon.socket)
    f = lambda x, w, b: torch.relu(x @ w + b) * 2.0  # noqa: E731
    x, w, b = (torch.randn(*s, dtype=torch.bfloat16) for s in ((64, 32), (32, 48), (48,)))
    fn = torch.compile(f, backend=c)
    torch.testing.assert_close(fn(x, w, b), f(x, w, b))
    (r,) = [r for r in _runners(c) if r.group.kind == "gemm"]
    (compiled,) = [k for k in backend.live if r in k.runners.values()]
    r.use_kernel = False  # as if ATen had won against the verified kernel
    compiled._reroute()
    (epilogue,) = compiled.epilogues[r.group]
    assert epilogue.apart_of is r.group and epilogue in compiled.kept and r.group not in compiled.kept
    deadline = time.monotonic() + 120
    while r.kernel[1] != "tuned" and time.monotonic() < deadline:
        torch.testing.assert_close(fn(x, w, b), f(x, w, b))
        time.sleep(0.02)
    assert r.kernel[1] == "tuned"
    torch.testing.assert_close(fn(x, w, b), f(x, w, b))
    assert r.group in compiled.kept and epilogue not in compiled.kept and r.use_kernel is None
    r.use_kernel = False  # the tuned kernel lost as well
    compiled._reroute()
    assert compiled.epilogues[r.group] == [epilogue] and epilogue in compiled.kept
    torch.testing.assert_close(fn(x, w, b), f(x, w, b))
    assert len(c.plans) == 1


class _Runner:  # what swap() reads and writes of a runtime.GroupRunner (hashable)
    kernel = ("u" * 64, "verified", b"old", {})
    name = "g"
    use_kernel = True


def test_swap_loads_the_tuned_module_and_waits_out_a_capture(monkeypatch):
    """The tuned CUBIN is loaded by the swap itself, on each device the verified one was
    loaded on, so that a CUDA-graph capture right after it (which cannot load a module)
    launches the tuned kernel; a swap that falls in a capture waits for the next call."""
    from fuseml import launcher

    loads = []
    monkeypatch.setattr(launcher, "Module", lambda cubin, meta: loads.append(cubin) or ("module", cubin))
    monkeypatch.setattr(torch.cuda, "device", lambda i: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda i=None: None)
    key = "u" * 64
    r = _Runner()
    old = runtime._modules[(key, 1)] = ("module", b"old")
    up = upgrade.Upgrader([r])
    up.ready = {r: (key, "tuned", b"new", {})}
    capturing = [True]
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing[0])
    try:
        assert up.tick() == 0 and r.kernel[1] == "verified" and not loads  # inside a capture
        capturing[0] = False
        assert up.tick() == 1 and r.kernel[2] == b"new"
        assert loads == [b"new"] and runtime._modules[(key, 1)] == ("module", b"new")
        assert old in upgrade.retired and up.done
    finally:
        runtime._modules.pop((key, 1), None)


def test_inductor_rest_picks_up_tuned_kernels(tuning_daemon, monkeypatch):
    """rest="inductor": Inductor's compiled code calls the runners, whose verified kernels are
    swapped for the tuned ones between calls, without recompiling."""
    from fuseml import backend

    monkeypatch.setenv("FUSEML_UPGRADE_S", "0.05")
    monkeypatch.setattr(upgrade, "CHECK_CALLS", 1)
    c = fuseml.FuseMLCompiler(socket=tuning_daemon.socket, rest="inductor")
    f = lambda x: torch.sigmoid(x * 3.0) + x  # noqa: E731
    x = torch.randn(6, 32)
    fn = torch.compile(f, backend=c)
    torch.testing.assert_close(fn(x), f(x))
    rs = _runners(c)
    assert rs and all(r.kernel[1] == "verified" for r in rs)
    wrapped = [
        k for k in backend.live if isinstance(k, backend.InductorCompiled) and set(rs) <= set(k.upgrader.runners)
    ]
    assert len(wrapped) == 1
    deadline = time.monotonic() + 120
    while any(r.kernel[1] != "tuned" for r in rs) and time.monotonic() < deadline:
        torch.testing.assert_close(fn(x), f(x))
        time.sleep(0.02)
    assert all(r.kernel[1] == "tuned" for r in rs) and wrapped[0].kernels_version >= 1
    assert len(c.plans) == 1


def test_a_group_running_its_kernel_keeps_the_tuned_one_in_the_next_process(tmp_path, monkeypatch):
    """The decision measured routing made for a verified kernel that won is remembered for the
    tuned kernel's bytes when it is swapped in: the next process recalls it instead of timing
    the tuned kernel against ATen again. A group ATen won is measured again instead (above)."""
    from fuseml import routes

    monkeypatch.setenv("FUSEML_ROUTE_CACHE", str(tmp_path / "routes.db"))
    routes.forget_connections()
    steps = [(torch.ops.aten.relu.default, (("in", 0),), {})]
    gpu = ("NVIDIA H200", 9, 0, 132, torch.__version__)
    inputs = routes.layouts([torch.randn(4, 8)])

    class Runner:  # what swap reads of a GroupRunner whose first call decided its route
        def __init__(self, name, use_kernel, timing):
            self.name, self.group, self.steps, self.decided_on = name, None, steps, (inputs, gpu)
            self.use_kernel, self.timing = use_kernel, timing

    won, lost = Runner("won", True, (0.01, 0.02)), Runner("lost", False, (0.03, 0.02))
    try:
        upgrade.swap({won: ("a" * 64, "tuned", b"tuned-a", {}), lost: ("b" * 64, "tuned", b"tuned-b", {})})
        assert routes.recall(routes.signature(b"tuned-a", steps, inputs, gpu)) == ("kernel", 0.01, 0.02)
        assert routes.recall(routes.signature(b"tuned-b", steps, inputs, gpu)) is None
        assert won.kernel[2] == b"tuned-a" and won.use_kernel is True
    finally:
        routes.forget_connections()
