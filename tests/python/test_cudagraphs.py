"""CUDA graphs (mode="reduce-overhead") without a GPU: how the request is read (torch.compile's
mode and options, FuseMLCompiler(cudagraphs=), FUSEML_CUDAGRAPHS), CPU models that ask for graphs
run as eager with one warning, a torch without the cudagraph-trees API runs without graphs with
one warning, and, with stand-ins for the trees and a CUDA device, what each graph is handed to
the trees with: forward and backward modes, parameters as static inputs, the user's input
copied, and the inputs list emptied as the trees require; inference graphs go to fuseml's own
replay instead (test_graph_replay.py)."""
import logging

import pytest
import torch
from torch._dynamo.backends import cudagraphs as torch_cudagraphs
from torch._inductor import cudagraph_trees

from helpers import assert_close, compile_run
from models import MODELS

import fuseml
from fuseml import backend, cudagraphs


def _graph_warnings(caplog):
    return [r.getMessage() for r in caplog.records
            if r.levelno >= logging.WARNING and "CUDA graph" in r.getMessage()]


def test_modes_and_options(monkeypatch):
    monkeypatch.delenv("FUSEML_CUDAGRAPHS", raising=False)
    assert cudagraphs.wanted() is False
    assert cudagraphs.wanted("default") is False
    assert cudagraphs.wanted("max-autotune-no-cudagraphs") is False
    assert cudagraphs.wanted("reduce-overhead") is True
    assert cudagraphs.wanted("max-autotune") is True
    assert cudagraphs.wanted(options={"cudagraphs": True}) is True
    assert cudagraphs.wanted("reduce-overhead", {"cudagraphs": False}) is False
    assert cudagraphs.wanted(default=True) is True
    assert cudagraphs.wanted("default", default=True) is False   # an explicit mode wins
    with pytest.raises(ValueError, match="reduce-overhead"):
        cudagraphs.wanted("fast")
    with pytest.raises(ValueError, match="cudagraphs"):
        cudagraphs.wanted(options={"triton.cudagraphs": True})
    monkeypatch.setenv("FUSEML_CUDAGRAPHS", "1")
    assert cudagraphs.wanted() is True
    assert cudagraphs.wanted(default=False) is False             # the constructor wins
    assert cudagraphs.wanted("default") is False
    monkeypatch.setenv("FUSEML_CUDAGRAPHS", "0")
    assert cudagraphs.wanted() is False


def test_backend_takes_torch_compile_keywords(dead_socket):
    gm = torch.fx.symbolic_trace(MODELS["mlp"]())
    x = torch.randn(4, 32)
    with pytest.raises(ValueError, match="mode must be one of"):
        fuseml.fuseml_backend(gm, [x], mode="fast")
    with pytest.raises(ValueError, match="unknown options"):
        fuseml.FuseMLCompiler()(gm, [x], options={"epilogue_fusion": True})
    # newer torch also passes name=; unknown keywords are ignored
    model = MODELS["mlp"]()
    seen = []
    c = fuseml.FuseMLCompiler()
    compiler = lambda gm, ex, **kw: (seen.append(kw), c(gm, ex, **kw, name="m", later=1))[1]
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(model, backend=compiler, mode="max-autotune")(x),
                                   model(x))
    assert seen == [{"mode": "max-autotune"}] and c.plans[-1].graphs


def test_mode_reaches_the_backend_by_name(dead_socket, monkeypatch):
    """torch.compile(backend="fuseml", mode=...) and options={"cudagraphs": True} reach the
    registered backend: each compiled graph's plan says whether it got graphs."""
    monkeypatch.setattr(backend, "_default", None)
    model, x = MODELS["mlp"](), torch.randn(4, 32)
    with torch.no_grad():
        torch.compile(model, backend="fuseml", mode="reduce-overhead")(x)
    assert backend._default.plans[-1].graphs == "no CUDA graphs: no CUDA tensors"
    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(model, backend="fuseml")(x)
    assert backend._default.plans[-1].graphs is None
    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(model, backend="fuseml", options={"cudagraphs": True})(x)
    assert backend._default.plans[-1].graphs.startswith("no CUDA graphs")
    assert "no CUDA graphs" in backend._default.plans[-1].describe()


@pytest.mark.parametrize("train", [False, True])
def test_cpu_model_runs_eager_with_one_warning(daemon, caplog, train):
    caplog.set_level(logging.WARNING)
    c, got, want = compile_run(MODELS["activation_heavy"](), torch.randn(6, 32), train=train,
                               mode="reduce-overhead")
    assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert any(p.kernels() for p in c.plans)              # the daemon served its groups
    assert all(p.graphs.startswith("no CUDA graphs") for p in c.plans)
    warned = _graph_warnings(caplog)
    assert len(warned) == 1 and "no CUDA tensors" in warned[0], warned


def test_env_turns_graphs_on(dead_socket, monkeypatch, caplog):
    caplog.set_level(logging.WARNING)
    monkeypatch.setenv("FUSEML_CUDAGRAPHS", "1")
    c, got, want = compile_run(MODELS["mlp"](), torch.randn(6, 32))
    assert_close(got, want)
    assert all(p.graphs for p in c.plans)
    assert len(_graph_warnings(caplog)) == 1


def test_torch_without_the_api_runs_without_graphs(dead_socket, monkeypatch, caplog):
    caplog.set_level(logging.WARNING)
    monkeypatch.delattr(cudagraph_trees, "cudagraphify_impl")
    c, got, want = compile_run(MODELS["llama_mlp"](), torch.randn(6, 32),
                               fuseml.FuseMLCompiler(cudagraphs=True))
    assert_close(got, want)
    warned = _graph_warnings(caplog)
    assert len(warned) == 1 and "unavailable" in warned[0], warned
    assert all(p.graphs == "no CUDA graphs: torch API missing" or
               p.graphs == "no CUDA graphs: forward not recorded" for p in c.plans)


def test_a_renamed_keyword_is_caught_before_the_first_step(dead_socket, monkeypatch, caplog):
    """A torch whose cudagraphify takes other keywords: no graphs (one warning), not a failed
    step at the first recording."""
    caplog.set_level(logging.WARNING)

    def cudagraphify(model, inputs, static_input_idxs=(), *, device_index, is_backward,
                     is_inference, stack_traces=None, constants=()):
        raise AssertionError("never called")
    monkeypatch.setattr(cudagraph_trees, "cudagraphify", cudagraphify)
    c, got, want = compile_run(MODELS["mlp"](), torch.randn(6, 32), mode="reduce-overhead")
    assert_close(got, want)
    assert len(_graph_warnings(caplog)) == 1


class _FakeTrees:
    """Stands in for cudagraph trees on a CPU machine: records what each graph is handed and
    runs it as the trees' warm-up does (the inputs list must come back empty)."""

    def __init__(self):
        self.calls = []

    def __call__(self, model, inputs, static_input_idxs, **kw):
        self.calls.append((list(inputs), tuple(static_input_idxs), kw))

        def run(args):
            out = model(args)
            assert len(args) == 0, "the trees expect the inputs list emptied"
            return out
        return run


@pytest.fixture
def fake_trees(monkeypatch):
    fake = _FakeTrees()
    monkeypatch.setattr(cudagraph_trees, "cudagraphify_impl", fake)
    monkeypatch.setattr(torch_cudagraphs, "check_for_skip", lambda gm, fixed: None)
    monkeypatch.setattr(cudagraphs, "_cuda_index", lambda gm: 0)
    return fake


def test_graphs_handed_to_the_trees(dead_socket, fake_trees, caplog):
    caplog.set_level(logging.WARNING)
    model = MODELS["mlp"]()
    shapes = sorted(tuple(p.shape) for p in model.parameters())
    c, got, want = compile_run(model, torch.randn(6, 32), mode="reduce-overhead")
    assert_close(got, want)
    assert not _graph_warnings(caplog)
    (fw_in, fw_static, fw_kw), (bw_in, bw_static, bw_kw) = fake_trees.calls
    assert (fw_kw["is_backward"], fw_kw["is_inference"]) == (False, False)
    assert (bw_kw["is_backward"], bw_kw["is_inference"]) == (True, False)
    assert fw_kw["device_index"] == 0 and bw_kw["device_index"] == 0
    # the parameters are static (never copied), the user's input is not
    assert sorted(tuple(fw_in[i].shape) for i in fw_static) == shapes
    assert len(fw_in) == len(shapes) + 1
    # backward: saved values static, tangents and the saved user input copied
    names = [p.name for p in bw_kw["placeholders"]]
    user = f"primals_{[i for i in range(len(fw_in)) if i not in fw_static][0] + 1}"
    assert user in names and names.index(user) not in bw_static
    assert bw_static and all(not names[i].startswith("tangents") for i in bw_static)
    assert all(p.graphs.startswith("CUDA graphs") for p in c.plans)

    # an inference graph is not handed to the trees: fuseml replays it (graph_replay.py),
    # with the same static inputs; its first call is the warm-up, run as compiled
    torch._dynamo.reset()
    fake_trees.calls.clear()
    c, got, want = compile_run(model, torch.randn(6, 32), train=False, mode="reduce-overhead")
    assert_close(got, want)
    assert fake_trees.calls == []
    [plan] = c.plans
    assert plan.which == "inference" and plan.graphs.startswith("CUDA graphs (fuseml replay")
    assert plan.graphs.count(",") == 3   # the 4 parameters are the static inputs


def test_user_visible_outputs_named_where_torch_clones_them(dead_socket, fake_trees):
    """With torch's generation cloning on, the trees are told which forward outputs are the
    model's own (cloned if still alive at the next step); saved values and gradients not."""
    from torch._inductor import config
    if not hasattr(config.triton, "cudagraph_trees_generation_cloning"):
        pytest.skip("this torch's trees do not clone live outputs")
    with config.patch({"triton.cudagraph_trees_generation_cloning": "user_visible"}):
        c, got, want = compile_run(MODELS["mlp"](), torch.randn(6, 32), mode="reduce-overhead")
    assert_close(got, want)
    (_, _, fw_kw), (_, _, bw_kw) = fake_trees.calls
    assert fw_kw["user_visible_output_idxs"] == (0,)
    assert "user_visible_output_idxs" not in bw_kw


def test_rest_inductor_under_the_trees(dead_socket, fake_trees):
    c, got, want = compile_run(MODELS["activation_heavy"](), torch.randn(6, 32),
                               fuseml.FuseMLCompiler(rest="inductor"), mode="reduce-overhead")
    assert_close(got, want, atol=1e-4, rtol=1e-4)
    assert [kw["is_backward"] for _, _, kw in fake_trees.calls] == [False, True]


def test_backward_of_a_recorded_forward_not_recorded(dead_socket, fake_trees, monkeypatch):
    """A backward the trees cannot take after a recorded forward runs eagerly but tells the
    trees' manager it runs (so the forward's outputs it reads stay valid)."""
    told = []

    class _Manager:
        def set_to_running_backward(self):
            told.append(True)
    monkeypatch.setattr(cudagraph_trees, "get_manager", lambda idx, create_if_none_exists: _Manager())
    skip = {"n": 0}

    def check(gm, fixed):
        skip["n"] += 1
        return None if skip["n"] == 1 else "skipping cudagraphs due to incompatible op (x)"
    monkeypatch.setattr(torch_cudagraphs, "check_for_skip", check)
    c, got, want = compile_run(MODELS["mlp"](), torch.randn(6, 32), mode="reduce-overhead")
    assert_close(got, want)
    assert len(fake_trees.calls) == 1 and told == [True]
    assert c.plans[-1].graphs == "no CUDA graphs: incompatible op (x)"
