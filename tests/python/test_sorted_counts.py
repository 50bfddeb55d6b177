"""Running counts of sorted integers as a binary search (sorted_counts.py): running_counts is
the running sum of the histogram, with and without ids under the first bin or past the last;
a mixture-of-experts' offsets (HF's grouped experts' form) leave the graph as one searchsorted
with eager's values; a histogram of descending ids, of bins wider than one integer, or of ids
whose range is unknown (a cast might not hold them) stays."""

import pytest
import torch

from helpers import plan

import fuseml
from fuseml import sorted_counts

aten = torch.ops.aten
E = 8


@pytest.mark.parametrize("low,bins,dtype", [(0, 8, torch.int32), (3, 4, torch.int64), (-2, 9, torch.float32)])
def test_running_counts_are_the_histograms_running_sum(low, bins, dtype):
    torch.manual_seed(0)
    ids = torch.sort(torch.randint(-4, 12, (200,)))[0]  # under the first bin and past the last too
    want = torch.cumsum(torch.histc(ids.float(), bins=bins, min=low, max=low + bins - 1), 0).to(dtype)
    got = sorted_counts.running_counts(ids, low, bins, dtype, below=True)
    assert got.dtype == dtype and torch.equal(got, want)
    inside = ids[ids >= low]
    got = sorted_counts.running_counts(inside, low, bins, dtype, below=False)
    assert torch.equal(got, want)


def _offsets(x, router, descending=False, bins=E):
    """HF's grouped experts' offsets from top-2 routing (the CPU's cast: histc takes floats)."""
    ids = torch.topk(x @ router, 2, dim=-1)[1].reshape(-1)
    ids_g, perm = torch.sort(ids, descending=descending)
    hist = torch.histc(ids_g.float(), bins=bins, min=0, max=E - 1)
    return torch.cumsum(hist, dim=0, dtype=torch.int32), perm


def _targets(c):
    return [n.target for n in plan(c, "inference").compiled.gm.graph.nodes if n.op == "call_function"]


def _inputs():
    torch.manual_seed(0)
    return torch.randn(40, 16), torch.randn(16, E)


def test_a_mixture_of_experts_offsets_are_one_search(dead_socket):
    x, router = _inputs()
    c = fuseml.FuseMLCompiler()
    got = torch.compile(_offsets, backend=c)(x, router)
    want = _offsets(x, router)
    assert got[0].dtype == torch.int32 and torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    targets = _targets(c)
    assert aten.searchsorted.Tensor in targets
    assert aten.histc.default not in targets and aten.cumsum.default not in targets


@pytest.mark.parametrize("kw", [{"descending": True}, {"bins": 4}])
def test_what_it_does_not_take_stays(dead_socket, kw):
    """Descending ids; bins two integers wide."""
    x, router = _inputs()
    c = fuseml.FuseMLCompiler()
    got = torch.compile(_offsets, backend=c)(x, router, **kw)
    want = _offsets(x, router, **kw)
    assert torch.equal(got[0], want[0])
    targets = _targets(c)
    assert aten.histc.default in targets and aten.searchsorted.Tensor not in targets


def test_unranged_ids_stay(dead_socket):
    """Ids from the caller, sorted: their range is unknown, so a cast may not hold them."""

    def offsets(ids):
        return torch.cumsum(torch.histc(torch.sort(ids)[0].float(), bins=E, min=0, max=E - 1), 0)

    ids = torch.randint(0, E, (64,))
    c = fuseml.FuseMLCompiler()
    assert torch.equal(torch.compile(offsets, backend=c)(ids), offsets(ids))
    assert aten.histc.default in _targets(c)
