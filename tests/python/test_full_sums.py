"""A language model's loss tail: the masked sum of per-token losses, the count of kept labels
(a bool sum cast to float) and the labels' range check (`all`), full reductions of one short
1-D value each, become row reductions of one row: with the `where` they read and the
division, one rows kernel (full_sums.py, and horizontal.py pairing rows groups over the same
rows). Values are eager's; a long or a 2-D value keeps ATen's reduction; a real fusemld
accepts the kernel."""

import torch

from graph_coverage import is_view
from helpers import Fn, compile_run

from fuseml import full_sums

aten = torch.ops.aten


def loss_tail(x):
    """What torch's cross-entropy decomposition does after the per-token losses x[:, 0], with
    the labels in x[:, 1] (ignore_index -100, 1000 classes)."""
    per_token, y = x[:, 0], x[:, 1].long()
    keep = y != -100
    check = ((y >= 0) & (y < 1000)) | ~keep
    torch._assert_async(check.all(), "label out of range")
    total = torch.where(keep, per_token, 0.0).sum()
    return total / keep.sum().float()


def tokens(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 1000, (n,), generator=g)
    y[torch.rand(n, generator=g) < 0.3] = -100
    return torch.stack([torch.rand(n, generator=g) * 5, y.float()], dim=1)


def kernels(c):
    return [g for p in c.plans for g in p.groups if g.route == "kernel"]


def test_the_loss_tail_is_one_rows_kernel(served, partitioned):
    x = tokens(512)
    c, (got, _), (want, _) = compile_run(Fn(loss_tail), x, train=False)
    torch.testing.assert_close(got, want)
    rows = [g for g in kernels(c) if g.kind == "rows"]
    assert len(rows) == 1, [g.describe() for p in c.plans for g in p.groups]
    assert {"all", "sum", "div"} <= set(rows[0].op_names), rows[0].op_names
    assert rows[0].op_names.count("sum") == 2
    ((gm, groups),) = partitioned
    fused = {n for g in groups if g.route == "kernel" for n in g.members}
    left = [n for n in gm.graph.nodes if n.op == "call_function" and n not in fused and not is_view(n.target)]
    # left: the assert, and the test's own float -> int64 cast of its labels (no fragment form)
    assert [n.target for n in left] == [aten._to_copy.default, aten._assert_async.msg], [n.format_node() for n in left]
    left = [n for n in gm.graph.nodes if n.target in (aten.sum.default, aten.all.default)]
    assert not left, [n.format_node() for n in left]


def rewritten(f, x):
    """(rewrites made, the rewritten graph's value, f's) for f traced over x."""
    gm = torch.fx.experimental.proxy_tensor.make_fx(f, tracing_mode="fake")(x)
    done = full_sums.spell_full_sums(gm)
    gm.recompile()
    return done, gm(x), f(x)


def test_counts_are_exact_and_sums_in_fp32():
    b = torch.rand(full_sums.MAX_ELEMENTS) < 0.5
    done, got, want = rewritten(lambda v: v.sum().float(), b)
    assert done == 1 and got.dtype == torch.float32 and got == want == b.long().sum().float()
    x = torch.randn(4000, dtype=torch.bfloat16)
    done, got, want = rewritten(lambda v: v.sum(), x)
    assert done == 1 and got.shape == () and got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), x.float().sum(), rtol=1e-2, atol=1e-2)
    done, got, want = rewritten(lambda v: (v > -4).all(), torch.randn(300))
    assert done == 1 and bool(got) == bool(want)


def test_long_or_2d_values_keep_atens_reduction():
    done, _, _ = rewritten(lambda v: v.sum(), torch.randn(full_sums.MAX_ELEMENTS + 1))
    assert done == 0
    done, _, _ = rewritten(lambda v: v.sum(), torch.randn(8, 16))
    assert done == 0
    # an int64 count read by something other than a float cast stays int64
    done, got, want = rewritten(lambda v: (v > 0).sum() + 1, torch.randn(64))
    assert done == 0 and got.dtype == torch.int64


def test_daemon_accepts_the_loss_tail(daemon):
    c, (got, _), (want, _) = compile_run(Fn(loss_tail), tokens(256, seed=1), train=False)
    torch.testing.assert_close(got, want)
    rows = [g for g in kernels(c) if g.kind == "rows"]
    assert rows and all(g.key for g in rows), [(g.describe(), g.reason) for g in rows]
