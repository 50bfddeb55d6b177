"""A group's column index computed in its kernel (the fragment's `iota`, vocabulary 11) instead
of read from memory.

Cross-entropy's forward and backward compare each logit's column with the row's target
(cross_entropy.py), and a top-k's backward each column with its picks (scatter_picks.py); both
read the column as `torch.arange(C)`, an input of the group broadcast along its rows. Read from
memory it costs a load a logit beside the logit's own (4 bytes of f32 next to 2 of bf16), and
in a kernel that reads the logits element by element (GPT-2's odd rows) most of its L1 traffic.
An input that is arange(start, start + C) along the group's last dim, C its size, is the
element's column plus start: the fragment computes it and the input is not read.

Taken: a call of aten.arange (step 1, integer bounds) or a constant that equals one (what
const_fold makes of it), f32 (every value exact: at most 2^24) or int64, whose sizes are all 1
but the last, which is the group's last dim."""

import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily

from . import const_fold
from .fake_meta import tensor_val
from .shapes import is_plain_int

aten = torch.ops.aten
EXACT_F32 = 1 << 24  # every integer up to this is exact in f32
DTYPES = (torch.float32, torch.int64)


def _bounds(node):
    """(start, end) of an arange call of step 1 and integer bounds, else None."""
    if node.op != "call_function":
        return None
    if node.target is aten.arange.default:
        bounds = (0, node.args[0])
    elif node.target is aten.arange.start:
        bounds = tuple(node.args[:2])
    elif node.target is aten.arange.start_step:
        if len(node.args) > 2 and node.args[2] != 1:
            return None
        bounds = tuple(node.args[:2])
    else:
        return None
    return bounds if all(is_plain_int(b) for b in bounds) else None


def _constant_start(node, n):
    """start when get_attr node reads a constant equal to arange(start, start + n), else None."""
    obj = const_fold.constant(node.graph.owning_module, node)
    if obj is None or obj.numel() != n:
        return None
    with unset_fake_temporarily():  # a real comparison, once per compiled graph
        flat = obj.reshape(-1)
        start = int(flat[0].item()) if n else 0
        want = torch.arange(start, start + n, device=obj.device, dtype=obj.dtype)
        return start if torch.equal(flat, want) else None


def column_start(node, shape):
    """start when input `node` of a group of iteration shape `shape` is arange(start, start + C)
    along its last dim (above), else None."""
    v = tensor_val(node)
    if v is None or v.dtype not in DTYPES or not shape or not is_plain_int(shape[-1]):
        return None
    n = int(shape[-1])
    if v.dim() < 1 or v.dim() > len(shape) or not all(is_plain_int(d) for d in v.shape):
        return None
    if int(v.shape[-1]) != n or any(int(d) != 1 for d in v.shape[:-1]):
        return None
    if node.op == "get_attr":
        start = _constant_start(node, n)
    else:
        bounds = _bounds(node)
        start = bounds[0] if bounds is not None and bounds[1] - bounds[0] == n else None
    if start is None or (v.dtype == torch.float32 and (abs(start) > EXACT_F32 or abs(start + n) > EXACT_F32)):
        return None
    return int(start)
