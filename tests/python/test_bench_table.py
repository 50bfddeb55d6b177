"""The benchmark table harness (bench/table) in its CPU smoke mode: it runs end to end (eager,
Inductor on the CPU, Inductor max-autotune, fuseml falling back to eager; a real fusemld
for the compile-time columns when one is built), writes the JSON with every key the table
defines and the Markdown table, merges runs, and draws the charts."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TABLE = os.path.join(ROOT, "bench", "table")
sys.path.insert(0, os.path.dirname(__file__))
from conftest import _fusemld_bin  # noqa: E402

REQUIRED = [
    "device",
    "workload",
    "preset",
    "M",
    "d_model",
    "d_intermediate",
    "eager_ms",
    "inductor_ms",
    "inductor_max_autotune_ms",
    "fuseml_ms",
    "floor_ms",
    "fuseml_rel_err",
    "kernels_eager",
    "kernels_fuseml",
    "compile_cold_s",
    "compile_warm_s",
    # and the columns the issue names besides
    "speedup_vs_eager",
    "speedup_vs_best_peer",
    "best_peer",
    "strategy",
    "hbm_bytes_eager",
    "hbm_bytes_fused",
    "hbm_saved",
    "kernels_inductor",
    "kernels_inductor_max_autotune",
    # fuseml with CUDA graphs, and the columns that keep that comparison fair
    "fuseml_cudagraphs",
    "inductor_cudagraphs_ms",
    "fuseml_nographs_ms",
    "speedup_vs_inductor_cudagraphs",
]


def _env():
    # the smoke run is on the CPU: its fuseml modes still take the whole path to the daemon
    env = dict(os.environ, FUSEML_NO_AUTOSTART="1", FUSEML_REQUEST_CPU_GRAPHS="1")
    # This checkout's client, after whatever PYTHONPATH already names.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [env.get("PYTHONPATH"), os.path.join(ROOT, "client", "python")]))
    exe = _fusemld_bin()
    if exe:
        env["FUSEMLD_BIN"] = exe
    return env


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("table")
    # mlp (an inference graph) and mlp_train (forward + backward graphs) cover both step
    # kinds; a second run adds heavy to the same file, as a second part would.
    for wl in ("mlp,mlp_train", "heavy"):
        r = subprocess.run(
            [sys.executable, os.path.join(TABLE, "table.py"), "--smoke", "--workloads", wl, "--out", str(out)],
            env=_env(),
            capture_output=True,
            text=True,
            timeout=1200,
        )
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (path,) = [p for p in out.iterdir() if p.suffix == ".json"]
    return out, path, json.loads(path.read_text())


def test_rows_have_the_issue_keys(smoke):
    _, _, rows = smoke
    assert isinstance(rows, list)
    assert sorted((r["workload"], r["preset"]) for r in rows) == [
        ("heavy", "tiny"),
        ("mlp", "tiny"),
        ("mlp_train", "tiny"),
    ]
    for r in rows:
        missing = [k for k in REQUIRED if k not in r]
        assert not missing, f"{r['workload']}: missing {missing}"
        assert r["device"] == "cpu" and (r["M"], r["d_model"], r["d_intermediate"]) == (16, 32, 64)
        for col in ("eager", "inductor", "inductor_max_autotune", "fuseml", "fuseml_nographs"):
            assert r[f"{col}_ms"] > 0, (col, r["notes"])
        assert r["fuseml_cudagraphs"] is True
        # CUDA graphs need a GPU: the Inductor reduce-overhead cell is empty, with its reason
        assert r["inductor_cudagraphs_ms"] is None and "inductor_cudagraphs" in r["notes"]
        # bf16 against the fp32 reference: the output rounding, not a wrong result.
        assert 0 < r["fuseml_rel_err"] < 2e-2
        assert r["floor_ms"] > 0 and r["floor_bound"] in ("memory", "compute")
        assert r["speedup_vs_eager"] == pytest.approx(r["eager_ms"] / r["fuseml_ms"])
        peers = [r[f"{c}_ms"] for c in ("eager", "inductor", "inductor_max_autotune")]
        assert r["speedup_vs_best_peer"] == pytest.approx(min(peers) / r["fuseml_ms"])
        # On the CPU nothing is launched as a kernel: the fused traffic equals eager's.
        assert r["hbm_bytes_eager"] > 0 and r["hbm_bytes_fused"] == r["hbm_bytes_eager"]
        assert r["kernels_eager"] is None and "kernels" in r["notes"]
        assert r["strategy"] and all("strategy" in g for g in r["groups"])
        if _fusemld_bin():
            assert r["compile_cold_s"] > 0 and r["compile_warm_s"] > 0, r["notes"]


def test_hbm_model_counts_each_op(smoke):
    _, _, rows = smoke
    (r,) = [r for r in rows if r["workload"] == "mlp"]
    M, d, di, e = 16, 32, 64, 2
    # addmm1 (x, W1, b1 -> h), gelu (h -> g), addmm2 (g, W2, b2 -> y), add (y, x -> out).
    want = e * ((M * d + d * di + di + M * di) + 2 * M * di + (M * di + di * d + d + M * d) + 3 * M * d)
    assert r["hbm_bytes_eager"] == want


def test_train_step_has_two_graphs(smoke):
    _, _, rows = smoke
    (r,) = [r for r in rows if r["workload"] == "mlp_train"]
    assert {g["graph"] for g in r["groups"]} == {"forward", "backward"}
    (inf,) = [r for r in rows if r["workload"] == "mlp"]
    assert r["hbm_bytes_eager"] > 2 * inf["hbm_bytes_eager"]


def test_markdown_and_merge(smoke, tmp_path):
    out, path, rows = smoke
    md = path.with_suffix(".md").read_text()
    assert "| MLP block | tiny |" in md and "| Activation-heavy MLP | tiny |" in md
    # Merging the run into another folder rewrites the same rows and table there.
    r = subprocess.run(
        [sys.executable, os.path.join(TABLE, "table.py"), "--merge", str(path), "--out", str(tmp_path)],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    merged = json.loads((tmp_path / path.name).read_text())
    assert [(m["workload"], m["eager_ms"]) for m in merged] == [(x["workload"], x["eager_ms"]) for x in rows]


def test_merge_keeps_compile_times_of_a_row_rerun_without_them():
    sys.path.insert(0, TABLE)
    import report

    old = {
        "device": "d",
        "workload": "mlp",
        "preset": "small",
        "date": "2026-11-21",
        "compile_cold_s": 2.5,
        "compile_warm_s": 0.1,
        "eager_ms": 1.0,
        "notes": {},
    }
    new = dict(
        old,
        date="2026-11-22",
        compile_cold_s=None,
        compile_warm_s=None,
        eager_ms=0.9,
        notes={"compile_time": report.NOT_MEASURED},
    )
    (m,) = report.merge([[old], [new]])
    assert (m["eager_ms"], m["compile_cold_s"], m["compile_warm_s"]) == (0.9, 2.5, 0.1)
    assert "earlier run" in m["notes"]["compile_time"] and "2026-11-21" in m["notes"]["compile_time"]
    # a row whose compile times were measured (or failed) replaces them as it is
    newer = dict(new, notes={}, compile_cold_s=None)
    (m,) = report.merge([[old], [newer]])
    assert m["compile_cold_s"] is None


def test_charts(smoke, tmp_path):
    pytest.importorskip("matplotlib")
    _, path, _ = smoke
    r = subprocess.run(
        [sys.executable, os.path.join(TABLE, "charts.py"), str(path), "--out", str(tmp_path)],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    for kind in ("speedup", "hbm", "compile"):
        png = tmp_path / f"{path.stem}-{kind}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
