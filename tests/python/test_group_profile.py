"""bench/models/group_profile.py: a fused group's call, wrapped in a profiler range named after
the group, has its time and the bytes it moved read back per group; the wrapping is undone
after."""

import os
import sys

import torch

from helpers import Fn, compile_run

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))), "bench", "models"))
import group_profile  # noqa: E402

from fuseml import runtime  # noqa: E402


def test_group_ranges_are_read_back_per_group(daemon, monkeypatch):
    """CPU tensors against a real daemon: each group's call runs its ATen ops inside its
    range, whose CPU time group_times reads; the ranges go when undone."""
    monkeypatch.setenv("FUSEML_REQUEST_CPU_GRAPHS", "1")
    monkeypatch.setenv("FUSEML_STRAIGHT_LINE", "0")
    run = runtime.GroupRunner.run
    moved = {}
    undo = group_profile.ranged_groups(moved)
    try:

        def f(x):
            y = torch.tanh(x * 2.0) + 1.0
            return torch.softmax(y, -1) * 3.0

        x = torch.randn(64, 256)
        c, got, want = compile_run(Fn(f), x, train=False)
        torch.testing.assert_close(got[0], want[0])
        fn = torch.compile(Fn(f), backend=c)
        fn(x)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            fn(x)
    finally:
        undo()
    assert runtime.GroupRunner.run is run
    rows, total = group_profile.group_times(prof, on_gpu=False)
    assert rows, "no group range was recorded"
    assert all(name.startswith("group ") and "(" in name for _, name in rows)
    assert all(ms > 0 for ms, _ in rows) and sum(ms for ms, _ in rows) <= total
    assert [ms for ms, _ in rows] == sorted((ms for ms, _ in rows), reverse=True)
    # each group read a [64, 256] f32 value and wrote one
    assert {name for _, name in rows} <= set(moved)
    assert all(moved[name] >= 2 * 64 * 256 * 4 for _, name in rows), moved


def test_tensor_bytes_counts_what_a_kernel_reads():
    """A slice of a larger buffer counts its elements, an expanded view its storage once, the
    same tensor twice once; non-tensors and empty tensors nothing."""
    base = torch.zeros(8, 64, dtype=torch.bfloat16)
    half = base[:, :32]
    wide = torch.zeros(1, 64).expand(16, 64)
    assert group_profile.tensor_bytes([half]) == 8 * 32 * 2
    assert group_profile.tensor_bytes([wide]) == 64 * 4
    assert group_profile.tensor_bytes([base, base, 3, None, torch.zeros(0)]) == 8 * 64 * 2
