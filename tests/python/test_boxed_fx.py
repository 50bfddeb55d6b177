"""An FX graph run boxed (fuseml/boxed_fx.py): the graph's inputs die at their last use, not
when it returns, which is what lets a backward free its saved activations as it goes."""

import copy
import gc
import weakref

import torch

from fuseml.boxed_fx import boxed, boxed_module, runner

_seen = []


def _probe(x):
    """Notes whether the graph's first input is still alive when this runs (after its last
    use), through the weak reference the test left in _seen."""
    gc.collect()
    _seen.append(_seen[0]() is None)
    return x


torch.fx.wrap("_probe")


def _graph(x, w):
    y = x.relu() * 2.0  # x's last use
    return _probe(y) + w


def test_an_input_is_freed_at_its_last_use_and_the_list_cleared():
    gm = torch.fx.symbolic_trace(_graph)
    run = boxed(gm)
    assert run._boxed_call
    x, w = torch.randn(64), torch.randn(64)
    want = x.relu() * 2.0 + w
    _seen[:] = [weakref.ref(x)]
    args = [x, w]
    del x
    out = run(args)
    assert args == []
    assert _seen[1:] == [True]  # x was gone before the graph returned
    assert torch.equal(out, want)


def test_the_graph_given_is_left_unboxed():
    gm = torch.fx.symbolic_trace(_graph)
    boxed(gm)
    x, w = torch.randn(8), torch.randn(8)
    _seen[:] = [weakref.ref(x)]
    assert torch.equal(gm(x, w), x.relu() * 2.0 + w)  # still called with its arguments
    assert _seen[1:] == [False]  # x, held by the caller, alive throughout


def test_a_module_written_boxed_is_its_own_runner():
    """A graph built for one module (the backend's rewritten graphs) is written boxed once:
    runner() returns the module itself, which frees its inputs as the copy does."""
    gm = torch.fx.symbolic_trace(_graph)
    own = boxed_module(gm, copy.deepcopy(gm.graph))
    assert runner(own) is own and own._boxed_call
    x, w = torch.randn(16), torch.randn(16)
    want = x.relu() * 2.0 + w
    _seen[:] = [weakref.ref(x)]
    args = [x, w]
    del x
    assert torch.equal(own(args), want) and args == [] and _seen[1:] == [True]
    assert not getattr(gm, "_boxed_call", False) and runner(gm) is not gm  # unboxed: wrapped


def test_a_compiled_graphs_first_call_is_interpreted_and_frees_its_inputs():
    """A compiled graph's first call (after which its straight-line code is written) runs the
    FX graph through torch's interpreter: its inputs die at their last use as in the written
    code, and the graph's own Python is never written for that call."""
    from fuseml.backend import Compiled

    gm = torch.fx.symbolic_trace(lambda x, w: (_graph(x, w),))  # outputs as aot_autograd's: a tuple
    own = boxed_module(gm, copy.deepcopy(gm.graph), lazy=True)
    compiled = Compiled(own, [], {})
    x, w = torch.randn(16), torch.randn(16)
    want = x.relu() * 2.0 + w
    _seen[:] = [weakref.ref(x)]
    args = [x, w]
    del x
    assert torch.equal(compiled(args)[0], want) and args == [] and _seen[1:] == [True]
    if hasattr(own, "_needs_recompile"):  # a lazy module: nothing wrote its code
        assert own._needs_recompile()
    # where it runs as FX again (no code generated on the CPU), its code is written then
    x = torch.randn(16)
    assert torch.equal(compiled.slow([x, w])[0], x.relu() * 2.0 + w)
