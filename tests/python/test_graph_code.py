"""A graph module's code regenerated once per compile (fuseml/graph_code.py): passes inside
deferred() leave it for the block's end, which regenerates it even when a pass raised; outside,
a pass's edit is runnable at once."""

import pytest
import torch

from fuseml import graph_code


def _traced():
    return torch.fx.symbolic_trace(lambda x: torch.relu(x) + 1)


def _relu_to_sigmoid(gm):
    for n in gm.graph.nodes:
        if n.target is torch.relu:
            n.target = torch.sigmoid
    graph_code.edited(gm)


def test_an_edit_outside_a_block_runs_at_once():
    gm, x = _traced(), torch.randn(8)
    _relu_to_sigmoid(gm)
    assert "sigmoid" in gm.code
    torch.testing.assert_close(gm(x), torch.sigmoid(x) + 1)


def test_edits_inside_a_block_regenerate_once_at_its_end(monkeypatch):
    gm, x = _traced(), torch.randn(8)
    calls = []
    real = type(gm).recompile
    monkeypatch.setattr(type(gm), "recompile", lambda self: calls.append(1) or real(self))
    with graph_code.deferred():
        _relu_to_sigmoid(gm)
        with graph_code.deferred():  # nested: the outer block regenerates
            _relu_to_sigmoid(gm)
        assert "relu" in gm.code and not calls  # not yet
        assert "sigmoid" in str(graph_code.source(gm))  # what a debug log prints: the graph now
    assert len(calls) == 1 and "sigmoid" in gm.code
    torch.testing.assert_close(gm(x), torch.sigmoid(x) + 1)


def test_a_pass_that_raises_leaves_no_stale_code():
    gm = _traced()
    with pytest.raises(RuntimeError), graph_code.deferred():
        _relu_to_sigmoid(gm)
        raise RuntimeError("a pass failed")
    assert "sigmoid" in gm.code
