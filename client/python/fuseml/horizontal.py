"""Horizontal fusion: pointwise groups of one shape (or rows groups over the same rows) that
read the same value, with no path between them, run as one kernel of several outputs.

Vertical fusion (a node joining its producer's group) leaves apart the ops that read one
value side by side: an MoE router's token numbers (`floor_divide` of the sort's permutation),
its routing weights read at that permutation and the sorted expert ids cast for `histc` are
three lone ops over one [T*k] shape, each an ATen kernel. Run as one, the shared value is read
once and two launches go. Inductor's scheduler fuses such nodes the same way: it pairs nodes
that read a common buffer and have no path between them.

The rules here are the pair's own (shape, what they share, the fragment's limits); whether
either waits on the other, and whether a mutation lies between them, is the partition's
dependency state's to say (partition.find_groups asks both before it merges)."""

import operator

import torch

from . import ops
from .shapes import same_known_shape

# Rows groups pair as pointwise ones do: over the same rows, their reductions run side by
# side in one kernel (a loss's masked sum and its count of kept labels, and the labels' range
# check, all over one [T] read from the labels' kernel).
KINDS = ("pointwise", "rows")

# Nodes of the graph between the pair's first members (a router's lone ops lie within a few,
# a loss's reductions within a score).
MAX_DISTANCE = 64

# A merged fragment's values stay well inside the wire's limits (FM_MAX_INPUTS 32,
# FM_MAX_OUTPUTS 16): a group of many outputs is no longer one small kernel's work.
MAX_INPUTS = 16
MAX_OUTPUTS = 8


def _source(node):
    """The value a read comes from: a multi-output op's (a sort's keys and its permutation are
    one source) or the node itself."""
    if node.target is operator.getitem and node.args and isinstance(node.args[0], torch.fx.Node):
        return node.args[0]
    return node


def _computes(g):
    """Whether g computes anything: a group of views alone (an expand) writes no values, and
    made an output of a kernel it would be materialised."""
    return any(n.target not in ops.RESHAPE_OPS and n.target not in ops.VIEW_OPS for n in g.members)


def sources(g, producer=lambda b: None):
    """The sources of what group g reads from outside at its own shape (a broadcast constant
    or a per-row scale is no shared read): the value, or the group that makes it
    (producer(b), a kernel that writes them all at once)."""
    mset = set(g.members)
    return {
        producer(b) or _source(b)
        for n in g.members
        for b in n.all_input_nodes
        if b not in mset
        and b.op != "get_attr"
        and isinstance(b.meta.get("val"), torch.Tensor)
        and same_known_shape(b.meta["val"].shape, g.shape)
    }


def _counts(members):
    """(inputs, outputs) of a group of `members`: what it reads from outside, and the members
    read outside it."""
    mset = set(members)
    inputs = {b for n in members for b in n.all_input_nodes if b not in mset}
    outputs = [n for n in members if any(u not in mset for u in n.users)]
    return len(inputs), len(outputs)


def why_not_pair(g, h, pos, producer=lambda b: None):
    """None when groups g (first in graph order) and h, both pointwise or both rows, may run
    as one kernel by the pair's own rules; else why not. pos: a node's position in the graph;
    producer: the group that makes a value, if any."""
    if g.kind != h.kind or g.kind not in KINDS:
        return "not two pointwise or two rows groups"
    # the merged group runs where g's first member is, h's inputs (and what they wait on)
    # pulled ahead and h's values made early: near neighbours only, so that nothing large
    # moves far or lives much longer (and the partition looks no further back than this)
    if pos(h.members[0]) - pos(g.members[0]) > MAX_DISTANCE:
        return "too far apart in the graph"
    if not same_known_shape(g.shape, h.shape):
        return "not of one shape"
    if not (_computes(g) and _computes(h)):
        return "a group of views alone"
    if not sources(g, producer) & sources(h, producer):
        return "they read no value in common"
    n_in, n_out = _counts(g.members + h.members)
    if n_in > MAX_INPUTS or n_out > MAX_OUTPUTS:
        return "the merged group would have too many inputs or outputs"
    return None
