"""The running counts of sorted integers as one binary search: a rewrite of the Dynamo graph,
before aot_autograd traces it.

Hugging Face's grouped-GEMM experts sort the routed tokens by expert id and give the grouped
product each expert's end row as the running sum of a histogram:

    ids, perm = torch.sort(expert_ids)                  # ascending
    offsets = torch.cumsum(torch.histc(ids.int(), bins=E, min=0, max=E - 1), 0, dtype=torch.int32)

ATen runs that as five kernels (the cast, the histogram's zero fill and its count, and the
scan's two). With one integer per bin (bins = max - min + 1) the running count up to bin e is
the number of ids at most min + e, and in a sorted sequence that is where min + e would be
inserted after its equals:

    offsets = torch.searchsorted(ids, arange(min, max + 1), right=True)

one kernel, exact. Where the ids may lie below min, the count below min is subtracted
(searching min - 1 too). Taken when the histogram's input is an exact cast of a 1-D ascending
sort's values whose integer range is known (index_ranges.py: the cast must hold every value),
bins = max - min + 1 with integral edges, and the running sum is along dim 0 of the histogram
alone. Anything else is left."""

import operator

import torch

from . import graph_code
from ._log import log
from .fake_meta import tensor_val
from .index_ranges import EXACT, cast_dtype, ranges, target_of

_HISTC = {torch.histc, "histc"}
_CUMSUM = {torch.cumsum, "cumsum"}
_SORT = {torch.sort, "sort"}
MAX_BINS = 1 << 16  # a bin's edges stay far from a float's rounding at these counts


def running_counts(ids, low, bins, dtype, below):
    """cumsum(histc(ids, bins, low, low + bins - 1), 0) as `dtype` for ascending integers ids:
    the count of ids at most low + e for each bin e, less those under low when `below`."""
    edges = torch.arange(low - 1 if below else low, low + bins, device=ids.device, dtype=ids.dtype)
    counts = torch.searchsorted(ids, edges, right=True, out_int32=dtype == torch.int32)
    if below:
        counts = counts[1:] - counts[:1]
    return counts if counts.dtype == dtype else counts.to(dtype)


def _sorted_ids(cast, found):
    """The ascending 1-D sort values node a cast reads, when the cast holds each exactly."""
    if target_of(cast) not in ("int", "long", "float", "double", "to") or not cast.args:
        return None
    ids = cast.args[0]
    dtype = cast_dtype(cast)
    if not isinstance(ids, torch.fx.Node) or ids not in found or dtype not in EXACT:
        return None
    lo, hi = found[ids]
    if max(-lo, hi) > EXACT[dtype]:
        return None
    if target_of(ids) is not operator.getitem or ids.args[1] != 0:
        return None
    sort = ids.args[0]
    x = tensor_val(ids, "example_value")
    descending = sort.args[2] if len(sort.args) > 2 else sort.kwargs.get("descending", False)
    if target_of(sort) not in _SORT or x is None or x.dim() != 1 or descending is not False:
        return None
    if x.dtype not in (torch.int32, torch.int64):
        return None
    return ids


def _histogram(node):
    """(bins, min, max) of a histc node with one integer per bin, else None."""
    given = dict(zip(("input", "bins", "min", "max"), node.args)) | dict(node.kwargs)
    bins, low, high = given.get("bins", 100), given.get("min", 0), given.get("max", 0)
    if type(bins) is not int or type(low) not in (int, float) or type(high) not in (int, float):
        return None
    if low != int(low) or high != int(high) or not 0 < bins <= MAX_BINS or int(high) - int(low) + 1 != bins:
        return None
    return bins, int(low), int(high)


def _result_dtype(cumsum, hist):
    # keyword-only in torch.cumsum; Tensor.cumsum(dim, dtype) may pass it third, after self
    dtype = cumsum.kwargs.get("dtype") or (cumsum.args[2] if len(cumsum.args) > 2 else None)
    h = tensor_val(hist, "example_value")
    if dtype is None and h is not None:
        dtype = torch.int64 if not h.dtype.is_floating_point else h.dtype
    return dtype


def rewrite(gm):
    """Replaces the running sums of histograms of sorted integers in Dynamo's graph gm (above)
    by running_counts, in place; returns how many."""
    found = None
    done = 0
    for cumsum in list(gm.graph.nodes):
        if target_of(cumsum) not in _CUMSUM or not cumsum.args:
            continue
        hist = cumsum.args[0]
        dim = cumsum.args[1] if len(cumsum.args) > 1 else cumsum.kwargs.get("dim")
        if target_of(hist) not in _HISTC or dim not in (0, -1) or len(hist.users) != 1:
            continue
        edges = _histogram(hist)
        found = ranges(gm) if found is None else found
        ids = _sorted_ids(hist.args[0], found) if hist.args else None
        dtype = _result_dtype(cumsum, hist)
        if edges is None or ids is None or dtype is None:
            log.debug("fuseml: %s stays a histogram's running sum", cumsum.name)
            continue
        bins, low, _ = edges
        with gm.graph.inserting_before(cumsum):
            new = gm.graph.call_function(running_counts, (ids, low, bins, dtype, found[ids][0] < low))
        new.meta.update(cumsum.meta)
        cumsum.replace_all_uses_with(new)
        gm.graph.erase_node(cumsum)
        gm.graph.erase_node(hist)
        done += 1
    if done:
        gm.graph.lint()
        graph_code.edited(gm)
    return done
