"""rest="inductor" compiles each graph by Inductor alone and with fuseml's groups, and keeps
the form its first calls measure faster (graph_choice.py): every call runs one form once,
the groups' form first; a tie goes to Inductor alone; tuned kernels measure again; a capture
runs Inductor alone before any choice; a forward whose groups would change the strides
reported to autograd is Inductor alone without measuring."""

import pytest
import torch

from helpers import assert_close, compile_run
from test_inductor_rest import ConvNet

import fuseml
from fuseml import graph_choice


class Clock:
    """time.perf_counter for graph_choice, moved only by the forms' calls: what a form costs
    is what the test says, whatever the machine's load."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(graph_choice.time, "perf_counter", c)
    return c


def forms(clock, alone_ms, grouped_ms):
    """Two boxed forms that log their calls, empty the argument list as compiled code does,
    and take the given time."""
    calls = []

    def form(name, ms):
        def run(args):
            calls.append(name)
            clock.now += ms / 1e3
            out = [a * 2 for a in args]
            args.clear()
            return out

        return run

    return form("alone", alone_ms), form("grouped", grouped_ms), calls


def run_calls(choice, n):
    return [choice([torch.full((2,), float(i))])[0] for i in range(n)]


MEASURING = 2 * (graph_choice.WARM + graph_choice.TIMED)


@pytest.mark.parametrize("alone_ms,grouped_ms,kept", [(2.0, 1.0, 1), (1.0, 2.0, 0), (1.0, 1.0, 0), (1.0, 0.995, 0)])
def test_the_faster_form_is_kept_and_a_tie_goes_to_inductor(clock, alone_ms, grouped_ms, kept):
    alone, grouped, calls = forms(clock, alone_ms, grouped_ms)
    choice = graph_choice.Choice(alone, grouped)
    outs = run_calls(choice, MEASURING)
    # one form per call, each call's own result; the groups' form first, then in turn
    assert calls == ["grouped", "alone"] * (MEASURING // 2)
    assert all(torch.equal(o, torch.full((2,), 2.0 * i)) for i, o in enumerate(outs))
    assert choice.chosen == kept and choice.form == graph_choice.NAMES[kept]
    assert choice.why.startswith(graph_choice.NAMES[kept])
    assert [len(t) for t in choice.times] == [graph_choice.TIMED] * 2
    del calls[:]
    run_calls(choice, 5)
    assert calls == [["alone", "grouped"][kept]] * 5


def test_reset_measures_again(clock):
    alone, grouped, calls = forms(clock, 1.0, 2.0)
    choice = graph_choice.Choice(alone, grouped)
    run_calls(choice, MEASURING)
    assert choice.chosen == 0
    choice.reset()
    assert choice.chosen is None and choice.form == "measuring" and choice.why.startswith("measuring")
    del calls[:]
    run_calls(choice, MEASURING)
    assert calls == ["grouped", "alone"] * (MEASURING // 2) and choice.chosen == 0


def test_a_capture_runs_inductor_alone_unmeasured(clock, monkeypatch):
    alone, grouped, calls = forms(clock, 1.0, 2.0)
    choice = graph_choice.Choice(alone, grouped)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    run_calls(choice, 3)
    assert calls == ["alone"] * 3 and choice.calls == 0 and choice.chosen is None


def test_a_failing_groups_form_settles_on_inductor_alone(clock, caplog):
    """The groups' form raising on a call while measuring (Gemma 2's training step did, on a
    group's output strides) is never the caller's failure: that call runs Inductor alone on its
    own arguments, and so does every later one, with one warning."""
    alone, _, calls = forms(clock, 1.0, 2.0)

    def grouped(args):
        calls.append("grouped")
        raise AssertionError("expected size 512==512, stride 128==1 at dim=2")

    choice = graph_choice.Choice(alone, grouped, "forward")
    with caplog.at_level("WARNING", logger="fuseml"):
        outs = run_calls(choice, 4)
    assert calls == ["grouped", "alone", "alone", "alone", "alone"]
    assert all(torch.equal(o, torch.full((2,), 2.0 * i)) for i, o in enumerate(outs))
    assert choice.chosen == 0 and choice.form == "Inductor alone" and "AssertionError" in choice.why
    choice.reset()  # tuned kernels swapped in: a form that failed is not tried again
    del calls[:]
    run_calls(choice, 2)
    assert calls == ["alone", "alone"] and choice.chosen == 0
    assert [r.getMessage() for r in caplog.records].count(f"fuseml: forward graph runs as {choice.why}") == 1


def test_a_groups_form_inductor_cannot_compile_is_inductor_alone(served, monkeypatch):
    """Inductor failing on the graph with fuseml's groups leaves the graph as Inductor alone
    compiled it, with the reason in explain(), and the model trains as eager."""
    from fuseml import inductor_joint

    real = inductor_joint.Compiler.compile

    def failing(self, gm, *args):
        if any(n.target is torch.ops.fuseml.group.default for n in gm.graph.nodes):
            raise RuntimeError("a lowering failed")
        return real(self, gm, *args)

    monkeypatch.setattr(inductor_joint.Compiler, "compile", failing)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 48), torch.nn.GELU(), torch.nn.Linear(48, 32), torch.nn.Tanh())
    c = fuseml.FuseMLCompiler(rest="inductor")
    for _ in range(3):
        c, got, want = compile_run(model, torch.randn(12, 32), c)
        assert_close(got, want, atol=1e-5, rtol=1e-5)
    for p in c.plans:
        assert p.kernels() and isinstance(p.choice, graph_choice.Fixed) and p.choice.chosen == 0
        assert "Inductor failed (RuntimeError: a lowering failed)" in p.choice.why


def test_rest_inductor_trains_right_while_measuring(served):
    """A training model under rest="inductor" with every group served (on CPU each runs its
    ATen ops inside fuseml::group): forward and backward each measure the two forms, every
    step on the way matches eager, and explain() says which form runs."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 48), torch.nn.GELU(), torch.nn.Linear(48, 32), torch.nn.Tanh())
    x = torch.randn(12, 32)
    c = fuseml.FuseMLCompiler(rest="inductor")
    for _ in range(MEASURING + 2):
        c, got, want = compile_run(model, x, c)
        assert_close(got, want, atol=1e-5, rtol=1e-5)
    plans = {p.which: p for p in c.plans}
    assert set(plans) == {"forward", "backward"}
    for p in plans.values():
        assert p.kernels(), p.describe()
        assert isinstance(p.choice, graph_choice.Choice) and p.choice.chosen in (0, 1)
        assert "runs as " + graph_choice.NAMES[p.choice.chosen] in p.describe()


def test_a_forward_whose_groups_change_saved_strides_is_inductor_alone(served, monkeypatch):
    """Channels-last convolutions under rest="inductor": fuseml's passes give the forward's
    saved values other strides than Inductor alone reports to aot_autograd, which compiles
    the backward for that one report: the forward runs as Inductor alone, unmeasured."""
    monkeypatch.setenv("FUSEML_CHANNELS_LAST", "on")
    torch.manual_seed(0)
    c = fuseml.FuseMLCompiler(rest="inductor")
    model, x = ConvNet(), torch.randn(2, 3, 12, 12)
    for _ in range(3):
        c, got, want = compile_run(model, x, c)
        assert_close(got, want, atol=1e-4, rtol=1e-4)
    forward = next(p for p in c.plans if p.which == "forward")
    assert forward.kernels() and isinstance(forward.choice, graph_choice.Fixed)
    assert forward.choice.chosen == 0 and forward.choice.form == "Inductor alone" and "strides" in forward.choice.why
