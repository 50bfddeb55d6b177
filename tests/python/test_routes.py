"""Measured routing remembered across processes (fuseml/routes.py): a decision written by one
process is read by the next, keyed by everything that made it, and a damaged, unwritable or
edited file never breaks a job (routing is then measured again)."""

import os
import sqlite3
import subprocess
import sys

import pytest
import torch

from fuseml import routes

GPU = ("NVIDIA H200", 9, 0, 132, "2.11.0")
STEPS = [(torch.ops.aten.mul.Tensor, (("in", 0), ("in", 1)), {}), (torch.ops.aten.relu.default, (("val", 0),), {})]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    path = str(tmp_path / "sub" / "routes.db")
    monkeypatch.setenv("FUSEML_ROUTE_CACHE", path)
    routes.forget_connections()
    yield path
    routes.forget_connections()


def _xs(shape=(4, 8)):
    return [torch.randn(shape), torch.randn(shape)]


def test_a_decision_is_recalled_by_another_process(cache):
    sig = routes.signature(b"cubin", STEPS, routes.layouts(_xs()), GPU)
    assert routes.recall(sig) is None
    routes.remember(sig, "aten", 0.25, 0.125)
    assert routes.recall(sig) == ("aten", 0.25, 0.125)
    code = f"from fuseml import routes; print(routes.recall({sig!r}))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ), check=True)
    assert out.stdout.strip() == "('aten', 0.25, 0.125)"


def test_the_key_holds_the_kernel_the_ops_the_inputs_and_the_gpu():
    xs = _xs()
    base = routes.signature(b"cubin", STEPS, routes.layouts(xs), GPU)
    assert base == routes.signature(
        b"cubin", STEPS, routes.layouts([x.clone() for x in xs]), GPU
    )  # values do not count
    others = [
        routes.signature(b"cubin2", STEPS, routes.layouts(xs), GPU),  # a tuned kernel replacing a verified one
        routes.signature(b"cubin", STEPS[:1], routes.layouts(xs), GPU),
        routes.signature(b"cubin", STEPS, routes.layouts(_xs((8, 4))), GPU),
        routes.signature(b"cubin", STEPS, routes.layouts([xs[0], xs[1].t().contiguous().t()]), GPU),  # strides
        routes.signature(b"cubin", STEPS, routes.layouts([xs[0], xs[1].to(torch.bfloat16)]), GPU),
        routes.signature(b"cubin", STEPS, routes.layouts(xs), GPU[:4] + ("2.12.0",)),  # torch's ATen kernels
        routes.signature(b"cubin", STEPS, routes.layouts(xs), ("NVIDIA H100 80GB HBM3",) + GPU[1:]),
    ]
    assert base not in others and len(set(others)) == len(others)


def test_an_entry_that_is_not_a_route_is_ignored(cache):
    sig = routes.signature(b"k", STEPS, routes.layouts(_xs()), GPU)
    routes.remember(sig, "kernel", 0.1, 0.2)
    routes.remember(sig, "something else", 0.1, 0.2)  # refused: the kernel decision stays
    assert routes.recall(sig)[0] == "kernel"
    with sqlite3.connect(cache) as db:
        db.execute("UPDATE routes SET route = 'launch anything' WHERE sig = ?", (sig,))
    assert routes.recall(sig) is None
    routes.remember(sig, "kernel", 0.1, 0.2)
    with sqlite3.connect(cache) as db:
        db.execute("UPDATE routes SET aten_ms = NULL WHERE sig = ?", (sig,))
    assert routes.recall(sig) is None  # a route without its two times is measured again


def test_a_damaged_file_turns_remembering_off(cache):
    os.makedirs(os.path.dirname(cache))
    with open(cache, "wb") as f:
        f.write(os.urandom(4096))
    sig = routes.signature(b"k", STEPS, routes.layouts(_xs()), GPU)
    routes.remember(sig, "kernel", 0.1, 0.2)  # no exception
    assert routes.recall(sig) is None


def test_an_unwritable_place_turns_remembering_off(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("FUSEML_ROUTE_CACHE", str(blocker / "routes.db"))
    routes.forget_connections()
    sig = routes.signature(b"k", STEPS, routes.layouts(_xs()), GPU)
    routes.remember(sig, "kernel", 0.1, 0.2)
    assert routes.recall(sig) is None
    routes.forget_connections()


def test_off_keeps_no_file(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEML_ROUTE_CACHE", "off")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    routes.forget_connections()
    sig = routes.signature(b"k", STEPS, routes.layouts(_xs()), GPU)
    routes.remember(sig, "kernel", 0.1, 0.2)
    assert routes.recall(sig) is None
    assert not any(tmp_path.iterdir())


def test_the_default_place_is_the_users_cache(tmp_path, monkeypatch):
    monkeypatch.delenv("FUSEML_ROUTE_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    routes.forget_connections()
    sig = routes.signature(b"k", STEPS, routes.layouts(_xs()), GPU)
    routes.remember(sig, "kernel", 0.1, 0.2)
    assert (tmp_path / "fuseml" / "routes.db").exists()
    assert routes.recall(sig) == ("kernel", 0.1, 0.2)
    routes.forget_connections()


def test_the_file_is_kept_bounded(cache, monkeypatch):
    monkeypatch.setattr(routes, "MAX_ROWS", 10)
    for i in range(15):
        routes.remember(f"sig{i}", "kernel", 0.1, 0.2)
    routes.forget_connections()
    routes.recall("sig0")  # opening trims the oldest down to half the cap
    with sqlite3.connect(cache) as db:
        kept = [s for (s,) in db.execute("SELECT sig FROM routes")]
    assert len(kept) == 5 and "sig14" in kept and "sig0" not in kept
