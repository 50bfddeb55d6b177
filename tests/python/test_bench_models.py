"""The whole-model benchmark (bench/models) on the CPU, tiny configs of every architecture:
it runs end to end (one process per model, every mode, the warm-compile child, a real
fusemld when one is built), writes rows in the documented schema, records a failing mode or
a model that runs out of time as error rows instead of dropping them, refuses unknown names
clearly, and merges, reports and charts its results."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(ROOT, "bench", "models")
sys.path.insert(0, os.path.dirname(__file__))
from conftest import _fusemld_bin  # noqa: E402

ROW_FIGURES = {
    "wall_ms": float,
    "gpu_ms": (float, type(None)),
    "kernels": (float, type(None)),
    "peak_mem_gb": (float, type(None)),
    "compile_cold_s": (float, type(None)),
    "compile_warm_s": (float, type(None)),
    "rel_err": float,
    "eager_bf16_rel_err": float,
}
ALL_MODES = ["eager", "inductor", "inductor_graphs", "fuseml", "fuseml_graphs", "fuseml_inductor"]


def _load(name):
    """A bench/models module by file (its names must not meet bench/table's in this process)."""
    if BENCH not in sys.path:
        sys.path.insert(0, BENCH)
    spec = importlib.util.spec_from_file_location(f"bench_models_{name}", os.path.join(BENCH, f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _env():
    # the smoke run is on the CPU: its fuseml modes still take the whole path to the daemon
    env = dict(os.environ, FUSEML_NO_AUTOSTART="1", FUSEML_REQUEST_CPU_GRAPHS="1")
    env.pop("FUSEML_SOCKET", None)
    exe = _fusemld_bin()
    if exe:
        env["FUSEMLD_BIN"] = exe
    return env


def _bench(*args, timeout=1500):
    return subprocess.run(
        [sys.executable, os.path.join(BENCH, "bench.py"), *args],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def llama_all_modes(tmp_path_factory):
    """Llama (tiny) under every mode and phase, with the warm-compile child."""
    out = tmp_path_factory.mktemp("models")
    # budgets far past what a run takes here: a loaded CI machine must not turn into error rows
    r = _bench("run", "--smoke", "--models", "llama", "--budget-s", "1400", "--out", str(out))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (path,) = [p for p in out.iterdir() if p.name.startswith("cpu-") and p.suffix == ".json"]
    return out, path, json.loads(path.read_text())


def test_every_mode_and_phase_has_a_row_in_the_schema(llama_all_modes):
    _, _, doc = llama_all_modes
    assert doc["device"] == "cpu" and doc["date"] and doc["torch"]
    rows = doc["rows"]
    assert sorted((r["mode"], r["phase"]) for r in rows) == sorted((m, p) for m in ALL_MODES for p in ("fwd", "train"))
    for r in rows:
        assert "error" not in r, r
        assert (r["model"], r["size"]) == ("llama", "tiny")
        for key, kind in ROW_FIGURES.items():
            assert isinstance(r[key], kind), (key, r)
        assert r["wall_ms"] > 0
        # bf16 against the fp32 copy: rounding, not a wrong result; eager's own error beside it
        assert 0 < r["rel_err"] < 5e-2 and 0 < r["eager_bf16_rel_err"] < 5e-2
        if r["mode"].startswith("fuseml"):
            # every kernel the step launched was tuned when it was timed (no background tune cut short)
            assert r["untuned_left"] == 0 and r["tune_wait_s"] >= 0, r
            # no kernel launches on the CPU: no group was measured against its ATen ops
            assert r.get("routed_to_aten", []) == [], r
        if r["mode"] == "eager":
            assert r["compile_cold_s"] is None
        else:
            assert r["compile_cold_s"] > 0 and r["compile_warm_s"] > 0, r
    # a training step's error covers the loss and every gradient
    train = [r for r in rows if r["phase"] == "train"]
    assert all(set(r["rel_err_parts"]) == {"loss", "grads"} for r in train)
    # the modes of one family say whose caches their cold compile found filled
    (graphs,) = [r for r in rows if (r["mode"], r["phase"]) == ("fuseml_graphs", "fwd")]
    assert "fuseml/fwd" in graphs["cold_after"]
    # rest="inductor": each graph says which form its first calls kept, and why
    for r in rows:
        if r["mode"] == "fuseml_inductor":
            assert r["forms_chosen"], r
            assert set(r["graphs_run_as"]) <= {"Inductor alone", "Inductor with fuseml's groups"}, r
            assert all(f.split(":")[0] in ("inference", "forward", "backward") for f in r["forms_chosen"]), r


def test_breakdown_lists_the_aten_ops_that_ran(llama_all_modes):
    _, _, doc = llama_all_modes
    b = doc["models"]["llama/tiny"]["breakdown"]
    assert set(b) == set(ALL_MODES)
    ops = {o["op"] for o in b["eager"]["fwd"]["aten_ops"]}
    # eager Llama runs its projections as matrix products and RMSNorm as pointwise ops
    assert {"aten::mm", "aten::mul"} <= ops, ops
    assert all(o["ms"] > 0 and o["calls"] > 0 for o in b["eager"]["fwd"]["aten_ops"])


def test_markdown_report(llama_all_modes):
    _, path, _ = llama_all_modes
    md = path.with_suffix(".md").read_text()
    assert "## Training step: fuseml against Inductor" in md
    assert "| llama/tiny | fwd | fuseml |" in md
    assert "## ATen ops that ran unfused under fuseml" in md


def test_a_row_timed_before_its_tunes_arrived_says_so():
    model_report = _load("model_report")
    row = {"model": "llama", "size": "tiny", "phase": "train", "mode": "fuseml_graphs", "wall_ms": 1.0}
    row.update(gpu_ms=1.0, kernels=3, peak_mem_gb=0.1, compile_cold_s=2.0, compile_warm_s=None)
    row.update(rel_err=0.01, eager_bf16_rel_err=0.01, untuned_left=2)
    assert "| fuseml_graphs (2 kernels untuned) |" in model_report.cell_table({"rows": [row]})
    row["untuned_left"] = 0
    assert "| fuseml_graphs |" in model_report.cell_table({"rows": [row]})


def test_every_architecture_runs(tmp_path):
    """The other eight architectures, eager and fuseml, both phases (Inductor is exercised
    on Llama above)."""
    r = _bench(
        "run",
        "--smoke",
        "--models",
        "gqa,gpt2,bert,t5,vit,convnet,moe,gemma2",
        "--modes",
        "eager,fuseml",
        "--no-warm",
        "--budget-s",
        "1400",
        "--out",
        str(tmp_path),
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (path,) = tmp_path.glob("cpu-*.json")
    rows = json.loads(path.read_text())["rows"]
    assert len(rows) == 8 * 2 * 2
    bad = [r for r in rows if "error" in r]
    assert not bad, [(r["model"], r["mode"], r["phase"], r["error"][:200]) for r in bad]
    for r in rows:
        # no worse than eager bf16 against the same fp32 copy (fuseml runs eager on the CPU)
        assert 0 < r["rel_err"] <= 2 * r["eager_bf16_rel_err"] + 1e-2, r


def test_model_out_of_time_is_error_rows(tmp_path):
    """A model's process stopped at the run's budget leaves one error row per mode and phase."""
    r = _bench(
        "run",
        "--smoke",
        "--models",
        "gpt2",
        "--modes",
        "eager,fuseml",
        "--budget-s",
        "2",
        "--min-model-s",
        "1",
        "--out",
        str(tmp_path),
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    (path,) = tmp_path.glob("cpu-*.json")
    rows = json.loads(path.read_text())["rows"]
    assert len(rows) == 4 and all("ran past the run's budget" in r["error"] for r in rows), rows


def test_unknown_names_are_clear_errors(tmp_path):
    run = os.path.join(BENCH, "run_model.py")
    for args, says in (
        (["--model", "nosuch"], "invalid choice: 'nosuch'"),
        (["--model", "gpt2", "--modes", "eager,warp"], "unknown mode(s) warp"),
        (["--model", "gpt2", "--size", "large"], "model gpt2 has no size large"),
        (["--model", "gpt2", "--phases", "fwd,step"], "unknown phase(s) step"),
    ):
        r = subprocess.run(
            [sys.executable, run, "--out", str(tmp_path), *args],
            env=_env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == 2 and says in r.stderr, (args, r.stderr[-500:])
    r = _bench("run", "--part", "3/2", "--out", str(tmp_path), timeout=60)
    assert r.returncode == 2 and "1 <= i <= n" in r.stderr
    r = _bench("run", "--models", "llama,nosuch", "--out", str(tmp_path), timeout=60)
    assert r.returncode == 2 and "unknown model 'nosuch'" in r.stderr


def test_setting_ab_refuses_a_setting_it_cannot_compare():
    ab = os.path.join(BENCH, "setting_ab.py")
    for env in ("FUSEML_BATCH_NORM=aten", "junk", "PATH=a,b", "FUSEML_BATCH_NORM="):
        r = subprocess.run(
            [sys.executable, ab, "--model", "convnet", "--env", env],
            env=_env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == 2 and "expected FUSEML_NAME=value,value" in r.stderr, (env, r.stderr[-500:])


def test_a_failing_mode_does_not_hide_the_others():
    """In process: a mode whose compile raises gets an error row; eager beside it is measured."""
    import torch

    run = _load("run_model")
    modes = _load("compile_modes")

    def broken(model):
        raise RuntimeError("this backend cannot compile anything")

    selected = [modes.MODES["eager"], modes.Mode("broken", "fuseml", False, broken)]

    class Args:
        model, size, phases, reps, target_ms, profile_steps = "gpt2", "tiny", ["fwd", "train"], 2, 1.0, 1

    saved = []
    describe, rows, _ = run.measure_model(
        Args, torch.device("cpu"), selected, float("inf"), lambda *a: saved.append(len(a[1]))
    )
    assert describe.startswith("GPT-2")
    assert {(r["mode"], r["phase"]) for r in rows if "error" in r} == {("broken", "fwd"), ("broken", "train")}
    assert all("cannot compile anything" in r["error"] for r in rows if "error" in r)
    assert all(r["wall_ms"] > 0 for r in rows if r["mode"] == "eager")
    assert saved == [2, 4]  # the result is saved after each phase


def test_kernel_classes():
    kc = _load("kernel_classes")
    # names as the profiler reported them on an H200
    cases = {
        "fm_pointwise_v28": "fuseml",
        "fm_gemm_128x128x64_s5_w4x1_r8_wgmma_pp": "fuseml",
        "triton_poi_fused_add_mul_pow_tanh_view_4": "triton",
        "nvjet_sm90_tst_192x128_64x5_1x2_h_bz_coopB_bias_NNT": "cublas/cudnn/flash",
        "void cutlass::Kernel2<cutlass_75_tensorop_bf16_s1688gemm_bf16_128x128_tn_align1>(Params)": "cublas/cudnn/flash",
        "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7": "cublas/cudnn/flash",
        "void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<"
        "at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)": "aten copy/cat",
        "void at::native::(anonymous namespace)::CatArrayBatchedCopy<at::native::(anonymous namespace)::OpaqueType<2u>": "aten copy/cat",
        "void at::native::vectorized_elementwise_kernel<8, at::native::BinaryFunctor<c10::BFloat16>": "aten elementwise",
        "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::func_wrapper_t>": "aten reduction/norm",
        "void at::native::batch_norm_backward_kernel<c10::BFloat16, c10::BFloat16, float, int>": "aten reduction/norm",
        "void at::native::indexSelectLargeIndex<c10::BFloat16, long, unsigned int, 2, 2, -2, true>": "aten index/embedding",
        "Memcpy DtoD (Device -> Device)": "memcpy/memset",
        "void at::native::(anonymous namespace)::max_pool_backward_nchw<c10::BFloat16, float, int>": "other",
    }
    for name, want in cases.items():
        assert kc.classify(name) == want, name


def test_merge_replaces_rows_and_keeps_breakdowns():
    report = _load("model_report")
    a = {
        "device": "nvidia-h200",
        "date": "2026-11-26",
        "torch": "2.11",
        "rows": [{"model": "gpt2", "size": "small", "mode": "fuseml", "phase": "fwd", "error": "not run"}],
        "models": {"gpt2/small": {"describe": "GPT-2", "breakdown": {"eager": {"fwd": {"gpu_ms": 1.0}}}}},
    }
    b = {
        "device": "nvidia-h200",
        "date": "2026-11-27",
        "torch": "2.11",
        "rows": [{"model": "gpt2", "size": "small", "mode": "fuseml", "phase": "fwd", "wall_ms": 2.0}],
        "models": {"gpt2/small": {"describe": "GPT-2", "breakdown": {"fuseml": {"fwd": {"gpu_ms": 1.5}}}}},
    }
    m = report.merge([a, b])
    assert m["date"] == "2026-11-27" and m["rows"] == b["rows"]
    assert set(m["models"]["gpt2/small"]["breakdown"]) == {"eager", "fuseml"}


def test_charts(llama_all_modes, tmp_path):
    pytest.importorskip("matplotlib")
    _, path, _ = llama_all_modes
    r = _bench("merge", str(path), "--out", str(tmp_path), timeout=300)
    assert r.returncode == 0, r.stderr
    for kind in ("speedup", "breakdown"):
        png = tmp_path / f"{path.stem}-{kind}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_routed_to_aten_lists_the_groups_measured_slower():
    """fuseml_state.routed_to_aten: each group whose first call measured its ATen ops faster,
    with both times; groups that kept their kernel, or were never measured, are not listed."""
    import types

    import torch

    from fuseml.partition import Group, Served

    state = _load("fuseml_state")
    g = torch.fx.Graph()
    x = g.placeholder("x")
    nodes = [g.call_function(torch.ops.aten.neg.default, (x,)), g.call_function(torch.ops.aten.exp.default, (x,))]
    slower = Group(0, "pointwise", nodes, served=Served("k" * 64, "tuned", "compiled", ("aten", 0.0123, 0.0045)))
    kept = Group(1, "pointwise", nodes, served=Served("k" * 64, "tuned", "compiled", ("kernel", 0.002, 0.004)))
    unmeasured = Group(2, "pointwise", nodes)
    plan = types.SimpleNamespace(groups=[slower, kept, unmeasured])
    assert state.routed_to_aten([plan]) == ["neg -> exp: kernel 0.0123 ms, ATen 0.0045 ms"]
