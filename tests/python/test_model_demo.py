"""examples/model_demo.py, the end of scripts/quickstart, run as a user runs it (its own
process) against a real fusemld: without a GPU it says so, sends the model's fragments
(which the daemon compiles) and lists the groups; without torch it says how to install it
and still exits 0, so the quickstart never fails there."""

import os
import subprocess
import sys

from fuseml import transport

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEMO = os.path.join(ROOT, "examples", "model_demo.py")


def _env(**extra):
    env = dict(os.environ)
    env.pop("FUSEML_REQUEST_CPU_GRAPHS", None)  # the demo turns it on itself without a GPU
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.join(ROOT, "client", "python")] + [p for p in [env.get("PYTHONPATH")] if p]
    )
    env["CUDA_VISIBLE_DEVICES"] = ""  # the CPU path, on a GPU machine too
    env.update(extra)
    return env


def _daemon_counts(socket):
    conn = transport.connect(socket, timeout=30)
    try:
        return conn.call({"op": "stats"})["session"]
    finally:
        conn.close()


def test_compile_only_without_a_gpu(daemon):
    before = _daemon_counts(daemon.socket)
    run = subprocess.run(
        [sys.executable, DEMO],
        cwd="/",
        capture_output=True,
        text=True,
        timeout=600,
        env=_env(FUSEML_SOCKET=daemon.socket, FUSEML_NO_AUTOSTART="1"),
    )
    out = run.stdout
    assert run.returncode == 0, out + run.stderr
    assert "no GPU (torch.cuda.is_available() is False): compile only" in out, out
    # the groups explain lists: the LayerNorm's row group and the two GEMMs with their epilogues
    assert "[rows] " in out and out.count("[gemm] addmm") == 2, out
    assert "fusemld compiled 3 of the 3 groups (untuned)" in out, out
    assert "relative error against eager" in out, out
    assert len(out.splitlines()) <= 30, out  # what a user reads in a terminal
    after = _daemon_counts(daemon.socket)
    assert after["compiles"] - before["compiles"] == 3, (before, after)  # really sent, compiled
    assert "Traceback" not in run.stderr, run.stderr


def test_without_torch_it_says_how_to_install_and_exits_0():
    no_torch = (
        "import runpy, sys; sys.modules['torch'] = None; "  # import torch fails
        f"runpy.run_path({DEMO!r}, run_name='__main__')"
    )
    run = subprocess.run(
        [sys.executable, "-c", no_torch], cwd="/", capture_output=True, text=True, timeout=120, env=_env()
    )
    assert run.returncode == 0, run.stdout + run.stderr
    said = run.stdout
    assert "torch is not installed" in said and "pip install -e client/python" in said, said
    assert not run.stderr, run.stderr
