"""A graph module's Python code regenerated once per compile, not after every pass.

Each rewrite pass edits gm.graph and must leave gm runnable, so on its own it regenerates gm's
code (gm.recompile() writes the whole graph out as Python and compiles it: ~0.1 s for a
4-layer T5 backward on an H200's host, and a compile ran a dozen passes). Inside `deferred()`,
the backend's run of its passes, which nothing executes in between, a pass only notes its
module, and the code is regenerated once when the block ends (also when a pass raised, so the
module never keeps code older than its graph)."""

import contextlib
import contextvars

import torch

try:  # a module whose code is written when first needed (torch 2.3 and later)
    from torch.fx._lazy_graph_module import _LazyGraphModule as _LAZY_MODULE
except ImportError:
    _LAZY_MODULE = torch.fx.GraphModule

_pending = contextvars.ContextVar("fuseml_graph_code_pending", default=None)


def edited(gm):
    """What a pass calls once it changed gm.graph: gm's code regenerated now, or at the end
    of the enclosing deferred() block."""
    pending = _pending.get()
    if pending is None:
        gm.recompile()
    else:
        pending[id(gm)] = gm


@contextlib.contextmanager
def deferred():
    """Passes inside regenerate their modules' code once, when the outermost block ends."""
    if _pending.get() is not None:  # nested: the outer block regenerates
        yield
        return
    pending = {}
    token = _pending.set(pending)
    try:
        yield
    finally:
        _pending.reset(token)
        for gm in pending.values():
            gm.recompile()


def lazy_module(root, graph):
    """A GraphModule of graph whose Python code is written at its first call (or when read),
    where torch can defer it: for a module that may only ever be interpreted, or be the root
    of others (writing a T5 backward's code costs ~0.1 s)."""
    return _LAZY_MODULE(root, graph)


class source:
    """gm's code as its graph now reads, for a debug log: generated only when printed."""

    def __init__(self, gm):
        self.gm = gm

    def __str__(self):
        return self.gm.graph.python_code(root_module="self").src
