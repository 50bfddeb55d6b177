"""Graph breaks fuseml avoids (graph_breaks.py): a logger method transformers patches in, called
inside a compiled function, no longer breaks its graph once registered (as fuseml does when it
is imported or a compiler made), and the function still returns what eager does; Hugging Face's GPT-2, whose loss warns on
every call, compiles a training step as one forward and one backward graph."""

import logging

import pytest
import torch

from graph_coverage import zoo_model

import fuseml
from fuseml import graph_breaks


def _graphs_of(fn, *args):
    seen = []

    def count(gm, ex):
        seen.append(gm)
        return gm

    torch._dynamo.reset()
    out = torch.compile(fn, backend=count)(*args)
    return out, len(seen)


def test_a_patched_logger_method_no_longer_breaks_the_graph(monkeypatch):
    def warning_once(self, msg):  # the shape of transformers' patch
        pass

    monkeypatch.setattr(logging.Logger, "warning_once", warning_once, raising=False)
    ignored = graph_breaks._ignored()
    saved = set(ignored)
    ignored.clear()
    try:
        _check_the_break_goes(warning_once)
    finally:
        ignored.clear()
        ignored.update(saved)


def test_dynamos_config_logging_keeps_working(monkeypatch):
    """A torch whose compile metrics sort the set of ignored functions (2.11) gets only the
    first method: a second one would make every compile log a TypeError's traceback."""

    def warning_once(self, msg):
        pass

    def info_once(self, msg):
        pass

    def sorting_config_writer():  # torch 2.11's: the set sorted, functions do not compare
        return str(sorted(graph_breaks._ignored()))

    monkeypatch.setattr(logging.Logger, "warning_once", warning_once, raising=False)
    monkeypatch.setattr(logging.Logger, "info_once", info_once, raising=False)
    monkeypatch.setattr(torch._dynamo.utils, "_get_dynamo_config_for_logging", sorting_config_writer, raising=False)
    ignored = graph_breaks._ignored()
    saved = set(ignored)
    ignored.clear()
    try:
        assert graph_breaks.avoid() == 1
        assert ignored == {warning_once}
        sorting_config_writer()  # still writes
        assert graph_breaks.avoid() == 1 and ignored == {warning_once}  # and stays so
    finally:
        ignored.clear()
        ignored.update(saved)


def _check_the_break_goes(warning_once):
    logger = logging.getLogger("fuseml-test")

    def f(x):
        y = x.sin()
        logger.warning_once("inside")
        return y * 2

    x = torch.randn(8)
    out, graphs = _graphs_of(f, x)
    assert graphs == 2 and torch.equal(out, f(x))  # broken at the call
    assert graph_breaks.avoid() >= 1
    assert warning_once in graph_breaks._ignored()
    out, graphs = _graphs_of(f, x)
    assert graphs == 1 and torch.equal(out, f(x))


def test_gpt2s_training_step_is_one_graph(dead_socket):
    pytest.importorskip("transformers")
    w = zoo_model("gpt2")
    c = fuseml.FuseMLCompiler()
    w.model.train()
    torch.manual_seed(0)
    want = w.loss(w.model, w.inputs).item()
    torch.manual_seed(0)
    loss = w.loss(torch.compile(w.model, backend=c), w.inputs)
    loss.backward()
    assert abs(loss.item() - want) < 2e-2 * abs(want)
    assert [p.which for p in c.plans] == ["forward", "backward"]
