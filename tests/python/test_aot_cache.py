"""aot_autograd's output kept in torch's compile cache (aot_cache.py): a second compile of the
same model (a second process, or this one after dynamo forgets it) loads the forward, backward
and inference graphs instead of tracing them, compiles them again with fuseml's compiler (the
same fragments asked, the same groups), and computes what eager does; other settings, an
entry that cannot be compiled again, and FUSEML_AOT_CACHE=0 each compile from scratch."""

import inspect
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from torch._dynamo.utils import counters

from helpers import assert_close, plan, run_step
from graph_coverage import zoo_model
from models import MODELS

import fuseml
from fuseml import aot_cache, kept_values

pytestmark = pytest.mark.skipif(
    aot_cache.why_not("aten", False, []) is not None and os.environ.get("FUSEML_AOT_CACHE") != "0",
    reason="this torch keeps no other compiler's aot_autograd output",
)


@pytest.fixture(autouse=True)
def _own_cache(monkeypatch, tmp_path):
    """torch's compile cache in a directory of this test's own."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    monkeypatch.delenv("FUSEML_AOT_CACHE", raising=False)


def _step(train, compiler=None):
    """(compiler, (output, gradients), eager's) of one compile and step of the MLP model."""
    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    model = MODELS["mlp"]()
    x = torch.randn(6, 32)
    compiler = compiler or fuseml.FuseMLCompiler(min_ops=1)
    params = list(model.parameters())
    want = run_step(model, params, x, train)
    got = run_step(torch.compile(model, backend=compiler), params, x, train)
    return compiler, got, want


def _aot():
    return dict(counters["aot_autograd"])


def _fragments(rounds):
    return sorted(bytes(w) if isinstance(w, (bytes, bytearray)) else repr(w) for r in rounds for w in r)


@pytest.mark.parametrize("train", [True, False])
def test_a_second_compile_loads_the_graphs_and_compiles_them_again(served, train):
    first, got, want = _step(train)
    assert_close(got, want)
    assert _aot().get("autograd_cache_saved") == 1, _aot()
    asked = _fragments(served.rounds)
    assert asked, "the first compile asked for kernels"
    served.rounds.clear()

    second, got, want = _step(train)
    assert_close(got, want)
    assert _aot().get("autograd_cache_hit") == 1 and not _aot().get("autograd_cache_miss"), _aot()
    # fuseml's compiler ran on the loaded graphs: the same fragments, the same groups
    assert _fragments(served.rounds) == asked
    whiches = ["forward", "backward"] if train else ["inference"]
    for which in whiches:
        a, b = plan(first, which), plan(second, which)
        assert [g.describe() for g in a.groups] == [g.describe() for g in b.groups]
        assert b.kernels(), b.describe()
    if not train:  # the loaded inference graph is still called without aot_autograd's wrappers
        assert plan(second, "inference").called == "directly", plan(second, "inference").describe()


class _WithConstants(torch.nn.Module):
    """Tensors made inside forward become the graph's constants: a scale, and an empty tensor
    concatenated in front (a Hugging Face cache's first `torch.tensor([])`)."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(32, 32)

    def forward(self, x):
        empty = torch.tensor([]).view(0, 32)
        y = torch.nn.functional.gelu(self.lin(x)) * torch.tensor([0.5] * 32)
        return torch.cat([empty, y])


def test_the_graphs_constants_are_kept(served, monkeypatch):
    pickled, kept = aot_cache._pickled, []

    def recording(gm):
        graph, devices = pickled(gm)
        kept.append(devices)
        return graph, devices

    monkeypatch.setattr(aot_cache, "_pickled", recording)
    torch.manual_seed(0)
    model = _WithConstants()
    x = torch.randn(6, 32)
    for expect in ("autograd_cache_saved", "autograd_cache_hit"):
        torch._dynamo.reset()
        counters.clear()
        params = list(model.parameters())
        got = run_step(torch.compile(model, backend=fuseml.FuseMLCompiler(min_ops=1)), params, x)
        assert_close(got, run_step(model, params, x))
        assert _aot().get(expect) == 1, _aot()
    assert any(len(devices) >= 2 for devices in kept), kept  # the scale and the empty tensor


def test_the_kept_graph_is_the_graph_it_was_made_from():
    """Every node comes back as it was, ops on constants included (torch.fx's own pickling
    re-traces the code and would fold the `lift_fresh_copy` of an empty constant into a new CPU
    constant), and each constant on its device (meta standing in for a GPU here)."""
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    lifted = graph.call_function(torch.ops.aten.lift_fresh_copy.default, (graph.get_attr("cache.empty"),))
    joined = graph.call_function(torch.ops.aten.cat.default, ([lifted, x],), {"dim": 0})
    scaled = graph.call_function(torch.ops.aten.mul.Tensor, (joined, graph.get_attr("scale")))
    graph.output((scaled, graph.call_function(torch.ops.aten.sym_size.int, (x, 0))))
    gm = torch.fx.GraphModule({"cache.empty": torch.empty(0, device="meta"), "scale": torch.tensor(0.5)}, graph)

    data, devices = aot_cache._pickled(gm)
    assert devices == {"cache.empty": "meta", "scale": "cpu"}
    back = aot_cache._unpickled(data, devices)
    assert back.code == gm.code
    assert back.cache.empty.device.type == "meta" and torch.equal(back.scale, gm.scale)
    # a description that cannot be made again (no storage 0): its ops are run on fakes instead
    broken = ([], {"x": ("tensor", 0, (4,), (1,), 0)})
    kept_values.restored(back, broken, [("tensor", (4,), (1,), 0, torch.float32, "meta")])
    values = {n.name: n.meta["val"] for n in back.graph.nodes if n.op == "call_function"}
    assert values["lift_fresh_copy_default"].device.type == values["cat_default"].device.type == "meta"
    assert values["sym_size_int"] == 4


def _layouts(vals, storage=True):
    """Each node's value as (layout, storage number): storages numbered in order of first use
    (or, with storage=False, not at all)."""
    storages, out = {}, {}
    for name, v in vals.items():
        flat = v if isinstance(v, (list, tuple)) else [v]
        out[name] = [
            (
                tuple(t.shape),
                t.stride(),
                t.storage_offset(),
                t.dtype,
                t.device,
                storages.setdefault(t.untyped_storage()._cdata, len(storages)) if storage else None,
            )
            if isinstance(t, torch.Tensor)
            else t
            for t in flat
        ]
    return out


@pytest.mark.parametrize("name", ["t5", "llama"])
def test_the_values_made_again_are_those_aot_autograd_traced(served, monkeypatch, name):
    """kept_values makes each node's value again from its layout: the same shapes, strides,
    offsets, dtypes and devices as aot_autograd's fake tensors, the same values sharing one
    storage; running the ops on fakes again (where no layouts were kept) gives the same layouts."""
    pickled, compared = aot_cache._pickled, []

    def recording(gm):
        data, devices = pickled(gm)
        want = _layouts({n.name: n.meta["val"] for n in gm.graph.nodes if "val" in n.meta and n.op != "get_attr"})
        want_layouts = _layouts({n.name: n.meta["val"] for n in gm.graph.nodes if n.name in want}, False)
        inputs = [aot_cache._describe(n.meta["val"]) for n in gm.graph.nodes if n.op == "placeholder"]
        for kept in (kept_values.described(gm), None):  # from the layouts; through the ops
            back = aot_cache._unpickled(data, devices)
            kept_values.restored(back, kept, inputs)
            got = {n.name: n.meta["val"] for n in back.graph.nodes if n.name in want}
            # running the ops gives the inputs storages of their own; the layouts are the same
            same = _layouts(got) == want if kept is not None else _layouts(got, False) == want_layouts
            compared.append((kept is not None, same, len(want)))
        return data, devices

    monkeypatch.setattr(aot_cache, "_pickled", recording)
    work = zoo_model(name)
    torch._dynamo.reset()
    work.loss(torch.compile(work.model, backend=fuseml.FuseMLCompiler()), work.inputs).backward()
    assert len(compared) == 4, compared  # forward and backward, each both ways
    assert all(same for _, same, _ in compared), compared


def test_other_settings_compile_from_scratch(served, monkeypatch):
    _step(True)
    assert _aot().get("autograd_cache_saved") == 1
    monkeypatch.setenv("FUSEML_RECOMPUTE", "0")  # another partition: another entry
    _step(True)
    assert _aot().get("autograd_cache_miss") == 1 and not _aot().get("autograd_cache_hit"), _aot()
    _step(True, fuseml.FuseMLCompiler(min_ops=3))  # another option of the compiler
    assert _aot().get("autograd_cache_miss") == 1 and not _aot().get("autograd_cache_hit"), _aot()


def test_inductor_never_takes_fusemls_entry(served):
    """Inductor's key differs from fuseml's (the tag, the bundled entries): after fuseml kept
    a graph, Inductor misses; its own compile is what runs."""
    _step(False)
    assert _aot().get("autograd_cache_saved") == 1
    torch._dynamo.reset()
    counters.clear()
    model = MODELS["mlp"]()
    x = torch.randn(6, 32)
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(model, backend="inductor")(x), model(x))
    assert not _aot().get("autograd_cache_hit"), _aot()


def test_an_entry_that_cannot_be_compiled_again_is_compiled_from_scratch(served, monkeypatch):
    _step(True)

    def broken(gm, kept, inputs):
        raise RuntimeError("a kept graph whose values cannot be made again")

    monkeypatch.setattr(kept_values, "restored", broken)
    second, got, want = _step(True)
    assert_close(got, want)
    assert _aot().get("autograd_cache_bypass") == 1 and not _aot().get("autograd_cache_hit"), _aot()
    assert plan(second, "forward").kernels() and plan(second, "backward").kernels()


def test_a_hit_starts_from_the_graph_the_passes_left(served, monkeypatch):
    """The kept graphs are those fuseml's passes edited: a hit partitions them without running
    the passes again (a T5 backward's ~1 s), and its groups are the miss's."""
    first, _, _ = _step(True)
    edits = []
    real = fuseml.FuseMLCompiler._edit
    monkeypatch.setattr(
        fuseml.FuseMLCompiler, "_edit", lambda self, gm, which: edits.append(which) or real(self, gm, which)
    )
    second, got, want = _step(True)
    assert_close(got, want)
    assert _aot().get("autograd_cache_hit") == 1, _aot()
    assert edits == [], edits
    for which in ("forward", "backward"):
        a, b = plan(first, which), plan(second, which)
        assert [g.describe() for g in a.groups] == [g.describe() for g in b.groups]
        assert a.padded == b.padded


def test_a_graph_a_pass_left_unpicklable_is_compiled_not_kept(served, monkeypatch):
    real = fuseml.FuseMLCompiler._edit

    def edit(self, gm, which):
        padded = real(self, gm, which)
        # a call of a function pickle cannot name (a lambda), placed before the output
        with gm.graph.inserting_before(next(iter(reversed(gm.graph.nodes)))):
            gm.graph.call_function(lambda: None, ())
        return padded

    monkeypatch.setattr(fuseml.FuseMLCompiler, "_edit", edit)
    _, got, want = _step(True)
    assert_close(got, want)
    assert not _aot().get("autograd_cache_saved") and _aot().get("autograd_cache_bypass") == 1, _aot()


def test_a_field_that_does_not_pickle_is_a_counted_bypass(served, monkeypatch):
    """A field of fuseml's that does not pickle fails torch's pickling of the entry, which
    torch only warns about: fuseml counts it as a bypass and notes torch's reason."""
    monkeypatch.setattr(aot_cache, "_verdict_now", lambda which, gm: lambda: None)
    _, got, want = _step(False)
    assert_close(got, want)
    assert _aot().get("autograd_cache_bypass") == 1 and not _aot().get("autograd_cache_saved"), _aot()


def test_an_entry_torch_cannot_pickle_is_a_counted_bypass_noted_by_fuseml(served, monkeypatch, caplog):
    """Where torch's own pickling of the entry fails (something outside fuseml's fields), torch
    warns and counts nothing: fuseml counts the bypass and notes torch's reason in its place."""

    def unpicklable(self):
        raise TypeError("cannot pickle 'planted' object")

    monkeypatch.setattr(aot_cache.KeptGraph, "__getstate__", unpicklable, raising=False)
    with caplog.at_level("INFO"):
        _, got, want = _step(True)
    assert_close(got, want)
    assert _aot().get("autograd_cache_bypass") and not _aot().get("autograd_cache_saved"), _aot()
    notes = [r.getMessage() for r in caplog.records if "not kept for the next process" in r.getMessage()]
    assert notes and "cannot pickle 'planted' object" in notes[0], notes
    assert not [r for r in caplog.records if r.name.startswith("torch") and "unable to serialize" in r.getMessage()]


def test_an_entry_is_pickled_outside_the_compiles_fake_mode(served, monkeypatch):
    """The entry is pickled inside the forward's compile, under its fake mode; torch 2.11 pickles
    it there as it is, and a real CUDA tensor in it (a constant aot_autograd lifted into the
    backward) is then copied to the host by an op the fake mode refuses: fuseml has torch
    pickle it with no fake mode active."""
    modes = []

    def state(self):
        if any(f.function == "_pickle_entry" for f in inspect.stack()):  # not pre_save's copy
            modes.append(torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE))
        return dict(vars(self))

    monkeypatch.setattr(aot_cache.KeptGraph, "__getstate__", state, raising=False)
    _, got, want = _step(True)
    assert_close(got, want)
    assert _aot().get("autograd_cache_saved") == 1, _aot()
    assert modes and all(m is None for m in modes), modes


def test_turned_off_keeps_nothing(served, monkeypatch):
    monkeypatch.setenv("FUSEML_AOT_CACHE", "0")
    _step(True)
    _step(True)
    assert not _aot().get("autograd_cache_saved") and not _aot().get("autograd_cache_hit"), _aot()


def test_graphs_with_symbolic_sizes_are_not_kept(served):
    torch._dynamo.reset()
    counters.clear()
    model = MODELS["mlp"]()
    compiled = torch.compile(model, backend=fuseml.FuseMLCompiler(min_ops=1), dynamic=True)
    with torch.no_grad():
        for rows in (6, 9):
            x = torch.randn(rows, 32)
            torch.testing.assert_close(compiled(x), model(x))
    assert not _aot().get("autograd_cache_saved"), _aot()


_CHILD = textwrap.dedent(
    """
    import sys, torch
    from torch._dynamo.utils import counters
    sys.path.insert(0, {tests!r})
    from helpers import run_step
    from models import MODELS
    import fuseml
    torch.manual_seed(0)
    model = MODELS["mlp"]()
    x = torch.randn(6, 32)
    c = fuseml.FuseMLCompiler(min_ops=1)
    params = list(model.parameters())
    want = run_step(model, params, x)
    got = run_step(torch.compile(model, backend=c), params, x)
    for a, b in zip([got[0]] + got[1], [want[0]] + want[1]):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    aot = counters["aot_autograd"]
    origins = sorted(g.origin for p in c.plans for g in p.kernels())
    print("RESULT", aot.get("autograd_cache_hit", 0), aot.get("autograd_cache_saved", 0), origins)
    """
)


def test_a_second_process_loads_the_graphs_and_the_daemons_kernels(daemon, tmp_path):
    """Two processes, one daemon, one cache directory: the second traces nothing in
    aot_autograd and every kernel it runs comes from the daemon's store."""
    script = tmp_path / "child.py"
    script.write_text(_CHILD.format(tests=os.path.dirname(os.path.abspath(__file__))))
    env = {k: v for k, v in os.environ.items() if k != "FUSEML_AOT_CACHE"}

    def run():
        out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr[-3000:]
        line = next(ln for ln in out.stdout.splitlines() if ln.startswith("RESULT"))
        hit, saved, origins = line.split(" ", 3)[1:]
        return int(hit), int(saved), origins

    hit, saved, origins = run()
    assert (hit, saved) == (0, 1), origins
    hit, saved, origins = run()
    assert (hit, saved) == (1, 0), origins
    assert "compiled" not in origins and "hit" in origins, origins
