"""The many-ranks benchmark (bench/models/ranks.py) on the CPU: two ranks under torchrun
(gloo) train a tiny Llama with DDP and AdamW and write the documented JSON; its report reads
fusectl's counters beside a run and refuses a folder that is not there. And the first-step
memory diagnostic's replay of an allocator history (bench/models/first_step_memory.py)."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(ROOT, "bench", "models")
sys.path.insert(0, BENCH)
import first_step_memory  # noqa: E402
import ranks  # noqa: E402


def test_two_ranks_train_and_report(tmp_path):
    out = tmp_path / "fuseml-n2.json"
    env = dict(
        os.environ,
        FUSEML_SOCKET=str(tmp_path / "nobody.sock"),
        FUSEML_NO_AUTOSTART="1",
        PYTHONPATH=os.path.join(ROOT, "client", "python"),
        CUDA_VISIBLE_DEVICES="",
    )
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        os.path.join(BENCH, "ranks.py"),
        "--model",
        "llama",
        "--size",
        "tiny",
        "--mode",
        "fuseml",
        "--seconds",
        "20",
        "--out",
        str(out),
    ]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=str(tmp_path))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    r = json.loads(out.read_text())
    assert r["ranks"] == 2 and len(r["per_rank"]) == 2 and r["mode"] == "fuseml"
    assert r["first_step_s"] > 0 and r["loss_rel_diff"] < 1e-2
    assert r["steps"] >= ranks.MIN_STEPS and len(r["series_ms"]) == r["steps"]
    assert r["step_ms_steady"] is not None and r["step_ms_tuning"] is None  # no daemon: nothing to tune
    table = ranks.report(str(tmp_path))
    assert "| fuseml-n2 | 2 |" in table


def _run(name, **extra):
    r = {
        "describe": "d",
        "device": "dev",
        "torch": "t",
        "mode": "fuseml",
        "ranks": 2,
        "first_step_s": 20.0,
        "step_ms_tuning": 16.0,
        "step_ms_steady": 15.0,
        "loss_rel_diff": 1e-5,
        "per_rank": [{"peak_gb": 1.5, "kernels": {"tuned": 3}}, {"peak_gb": 1.6, "kernels": {"tuned": 3}}],
    }
    r.update(extra)
    return r


def test_report_reads_the_daemons_counters(tmp_path):
    (tmp_path / "fuseml-n2.json").write_text(json.dumps(_run("fuseml-n2")))
    stats = {
        "entries": 22,
        "session": {"compiles": 22, "tunes": 22, "verified": 22, "joined_inflight": 30, "requests": 295},
    }
    (tmp_path / "stats-fuseml-n2.json").write_text(json.dumps(stats))
    (tmp_path / "ls-fuseml-n2.json").write_text(json.dumps([{"key": "k"}]))  # not a run: skipped
    table = ranks.report(str(tmp_path))
    (row,) = [line for line in table.splitlines() if line.startswith("| fuseml-n2")]
    assert "| 20.0 | 16.00 | 15.00 | 1.60 |" in row and "| 22 | 22 | 22 | 22 | 30 | 295 |" in row, row
    assert "tuned 3; tuned 3" in row


def test_report_of_a_folder_that_is_not_there(tmp_path):
    with pytest.raises(SystemExit, match="not a directory"):
        ranks.report(str(tmp_path / "absent"))
    assert ranks.report(str(tmp_path)) == "no runs\n"


def test_peak_blocks_replays_the_history_to_the_peak():
    mine = [
        {"filename": "/x/fuseml/runtime.py", "line": 120, "name": "eager"},
        {"filename": "/x/torch/nn/functional.py", "line": 1, "name": "f"},
    ]
    model = [{"filename": "/x/model_zoo.py", "line": 62, "name": "loss"}]
    trace = [
        {"action": "alloc", "addr": 1, "size": 100, "frames": mine},
        {"action": "alloc", "addr": 2, "size": 50, "frames": model},
        {"action": "free_requested", "addr": 1},
        {"action": "alloc", "addr": 3, "size": 70, "frames": mine},
        {"action": "free_completed", "addr": 1},
        {"action": "free_requested", "addr": 99},  # a block from before the recording
        {"action": "alloc", "addr": 4, "size": 60, "frames": []},
    ]
    peak, groups, blocks = first_step_memory.peak_blocks({"device_traces": [trace]}, 0)
    assert peak == 180  # blocks 2, 3 and 4 alive
    assert groups == {"runtime.py:120 eager": 70, "model_zoo.py:62 loss": 50, "?": 60}
    assert [size for size, _ in blocks] == [70, 60, 50]  # the largest first
    assert first_step_memory._anywhere(blocks[0][1]) == "runtime.py:120 eager < functional.py:1 f"
    assert first_step_memory._anywhere(blocks[1][1]) == "C++"  # no Python frame: the engine's
