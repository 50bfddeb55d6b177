"""fuseml's CUDA-graph replay of inference graphs (fuseml/graph_replay.py) on a CPU machine,
with a stand-in for torch.cuda's graph capture that records the function and, at replay,
runs it again on the captured inputs into the captured outputs (what a CUDA graph does to
device memory): a warm-up call per new input set, a recording at its next call, replays that
do not run Python, inputs read where they are, outputs returned as aliases of the graph's
memory with a second recording while the caller holds the first one's (a kept output stays
right; with every recording's outputs held the call runs as compiled), graph-owned input
copies past MAX_DIRECT input sets, and a failed capture that turns graphs off with one
warning while the results stay right."""

import logging

import pytest
import torch

from fuseml import graph_replay
from helpers import fake_cuda  # noqa: F401  (the fixture)


@pytest.fixture(autouse=True)
def addressed_inputs(monkeypatch):
    """The tests' inputs are tiny: they are read where they are (keyed by address) as a large
    input is, unless a test says otherwise."""
    monkeypatch.setattr(graph_replay, "SMALL_INPUT_BYTES", -1)


def _runner(fake, static=(1,)):
    calls = []
    w = torch.randn(4, 4)

    def fn(args):
        calls.append(1)
        x, w_ = args
        return [torch.relu(x @ w_) + 1.0]

    return graph_replay.GraphReplay(fn, static, 0), calls, w


def test_warm_up_record_then_replay_without_python(fake_cuda):
    run, calls, w = _runner(fake_cuda)
    x = torch.randn(3, 4)
    want = torch.relu(x @ w) + 1.0
    assert torch.equal(run([x, w])[0], want) and len(calls) == 1  # warm-up: run as compiled
    assert fake_cuda.captures == 0
    assert torch.equal(run([x, w])[0], want)  # recorded, then replayed
    assert fake_cuda.captures == 1 and run.recordings == 1
    n = len(calls)
    x.copy_(torch.randn(3, 4))  # same address, new values
    assert torch.equal(run([x, w])[0], torch.relu(x @ w) + 1.0)
    assert len(calls) == n + 1 and fake_cuda.captures == 1  # the fake replay's one call
    assert run.replays == 2


def test_outputs_are_aliases_and_a_kept_one_is_not_overwritten(fake_cuda):
    run, calls, w = _runner(fake_cuda)
    x = torch.randn(3, 4)
    run([x, w])
    y = run([x, w])[0]  # recording A
    [a] = run.direct[next(iter(run.direct))]
    assert y.untyped_storage().data_ptr() == a.mine[0].untyped_storage().data_ptr()
    del y
    for _ in range(3):  # nothing held: A again, no new recording
        run([x, w])
    assert fake_cuda.captures == 1
    kept = run([x, w])[0]  # A's output, held
    before = kept.clone()
    x.copy_(torch.randn(3, 4))
    y = run([x, w])[0]  # A is held: recording B
    assert fake_cuda.captures == 2 and fake_cuda.pools == 2  # a pool per recording
    assert torch.equal(y, torch.relu(x @ w) + 1.0) and torch.equal(kept, before)
    view = y[1:]  # a view holds B's output too
    del y
    n = len(calls)
    z = run([x, w])[0]  # A and B held: run as compiled, still right
    assert len(calls) == n + 1 and run.held_runs == 1 and fake_cuda.captures == 2
    assert torch.equal(z, torch.relu(x @ w) + 1.0) and torch.equal(kept, before)
    del kept, view
    for _ in range(4):  # `y = model(x)`: alternates between A and B
        z = run([x, w])[0]
    assert fake_cuda.captures == 2 and run.held_runs == 1


def test_without_use_counts_outputs_are_copied(fake_cuda, monkeypatch):
    monkeypatch.setattr(graph_replay, "_use_count", None)
    run, _, w = _runner(fake_cuda)
    x = torch.randn(3, 4)
    run([x, w])
    kept = run([x, w])[0]
    before = kept.clone()
    x.copy_(torch.randn(3, 4))
    assert torch.equal(run([x, w])[0], torch.relu(x @ w) + 1.0)
    assert torch.equal(kept, before) and fake_cuda.captures == 1


def test_past_max_direct_inputs_are_copied_into_graph_buffers(fake_cuda):
    run, _, w = _runner(fake_cuda)
    xs = [torch.randn(3, 4) for _ in range(graph_replay.MAX_DIRECT + 2)]
    for _ in range(2):
        for x in xs:
            assert torch.equal(run([x, w])[0], torch.relu(x @ w) + 1.0)
    assert len(run.direct) == graph_replay.MAX_DIRECT and len(run.by_layout) == 1
    assert fake_cuda.captures == graph_replay.MAX_DIRECT + 1
    [[rec]] = run.by_layout.values()
    assert list(rec.buffers) == [0]  # the parameter (static) is never copied
    for x in xs:  # every input set now replays
        x.copy_(torch.randn(3, 4))
        assert torch.equal(run([x, w])[0], torch.relu(x @ w) + 1.0)
    assert fake_cuda.captures == graph_replay.MAX_DIRECT + 1


def test_inputs_at_a_new_address_every_call_are_copied(fake_cuda, monkeypatch):
    """A layout whose input sets never come back (a backward's tangent computed afresh each
    step where the allocator does not reuse its address) stops warming up after MAX_FRESH:
    one recording reads graph-owned copies and replays from then on."""
    monkeypatch.setattr(graph_replay, "MAX_FRESH", 3)
    run, calls, w = _runner(fake_cuda)
    xs = []
    for i in range(9):
        xs.append(torch.randn(3, 4))  # kept: every call's input at an address of its own
        assert torch.equal(run([xs[-1], w])[0], torch.relu(xs[-1] @ w) + 1.0)
    assert run.warmups == 4 and fake_cuda.captures == 1 and not run.direct
    [[rec]] = run.by_layout.values()
    assert list(rec.buffers) == [0] and run.replays == 5


def test_new_shape_or_moved_parameter_is_a_new_graph(fake_cuda):
    run, _, w = _runner(fake_cuda)
    x, y = torch.randn(3, 4), torch.randn(5, 4)
    for _ in range(2):
        run([x, w]), run([y, w])
    assert fake_cuda.captures == 2
    w2 = w.clone()
    for _ in range(2):
        assert torch.equal(run([x, w2])[0], torch.relu(x @ w2) + 1.0)
    assert fake_cuda.captures == 3


def test_failed_capture_runs_without_graphs_with_one_warning(fake_cuda, caplog):
    caplog.set_level(logging.WARNING)
    run, calls, w = _runner(fake_cuda)
    fake_cuda.fail = "operation not permitted when stream is capturing"
    x = torch.randn(3, 4)
    for _ in range(4):
        assert torch.equal(run([x, w])[0], torch.relu(x @ w) + 1.0)
    assert run.off and "not permitted" in run.off and run.recordings == 0
    assert len(calls) == 4
    warned = [r for r in caplog.records if "could not be recorded as a CUDA graph" in r.getMessage()]
    assert len(warned) == 1


def test_outputs_that_are_inputs_come_from_this_call(fake_cuda):
    """A training forward returns inputs it saves for backward: handed out as this call's
    argument (or a view of it), never as a graph-owned copy, and the recording keeps no
    reference to the caller's tensors."""
    import gc
    import weakref

    w = torch.randn(4, 4)

    def fn(args):
        x, w_ = args
        return (x @ w_, x, x[1:], w_)

    fake_cuda.fn = fn
    run = graph_replay.GraphReplay(fn, (1,), 0)
    x = torch.randn(3, 4)
    run([x, w])
    y, xo, xv, wo = run([x, w])  # recorded reading x where it is
    assert xo is x and wo is w and xv.data_ptr() == x[1:].data_ptr() and torch.equal(xv, x[1:])
    [[rec]] = run.direct.values()
    assert [e[0] for e in rec.spec] == ["graph", "input", "view", "input"]
    del y, xo, xv, wo
    for _ in range(graph_replay.MAX_DIRECT):  # fill the direct recordings
        xi = torch.randn(3, 4)
        run([xi, w]), run([xi, w])
    probe = torch.randn(3, 4)
    ref = weakref.ref(probe)
    run([probe, w])  # a layout recording (copies probe in)
    [recs] = run.by_layout.values()
    assert all(list(r.buffers) == [0] for r in recs)
    y, xo, xv, _ = run([probe, w])
    assert xo is probe and torch.equal(xv, probe[1:])
    assert xv.untyped_storage().data_ptr() == probe.untyped_storage().data_ptr()
    assert torch.equal(y, probe @ w)
    del y, xo, xv, probe
    gc.collect()
    assert ref() is None  # no recording holds the caller's input


def test_layouts_beyond_the_limit_drop_the_least_recently_used(fake_cuda):
    run, _, w = _runner(fake_cuda)
    for _ in range(graph_replay.MAX_DIRECT):  # fill the direct recordings
        xi = torch.randn(3, 4)
        run([xi, w]), run([xi, w])
    first = torch.randn(1, 4)
    for _ in range(2):
        run([first, w])
    for m in range(2, graph_replay.MAX_LAYOUTS + 3):  # new batch sizes, each once recorded
        x = torch.randn(m, 4)
        for _ in range(2):
            assert torch.equal(run([x, w])[0], torch.relu(x @ w) + 1.0)
        if m == 3:
            run([first, w])  # keeps the first layout recent
    assert len(run.by_layout) == graph_replay.MAX_LAYOUTS
    kept_rows = sorted(k[0][1][0] for k in run.by_layout)
    assert 1 in kept_rows and 2 not in kept_rows  # LRU: the first stayed, size 2 went


def test_recordings_stay_within_the_memory_budget(fake_cuda, monkeypatch):
    """Past FUSEML_GRAPH_MEMORY_MB the least recently used free recordings are dropped; when
    every recording's outputs are held, the call runs as compiled instead of recording."""
    monkeypatch.setenv("FUSEML_GRAPH_MEMORY_MB", "35")  # three 10 MB recordings fit
    run, _, w = _runner(fake_cuda)
    xs = [torch.randn(3, 4) for _ in range(5)]
    for x in xs:
        for _ in range(2):
            assert torch.equal(run([x, w])[0], torch.relu(x @ w) + 1.0)
    assert fake_cuda.captures == 5 and run.dropped == 2
    assert run.pool_bytes == 30 << 20 and len(run.direct) == 3
    kept = [run([x, w])[0] for x in xs[2:]]  # hold all three recordings' outputs
    for _ in range(3):  # x0 again: nothing free to drop
        assert torch.equal(run([xs[0], w])[0], torch.relu(xs[0] @ w) + 1.0)
    assert fake_cuda.captures == 5 and run.over_budget >= 1 and run.pool_bytes == 30 << 20
    assert all(torch.equal(k, torch.relu(x @ w) + 1.0) for k, x in zip(kept, xs[2:]))
    del kept  # now x0 may take the oldest's place
    for _ in range(2):
        run([xs[0], w])
    assert fake_cuda.captures == 6 and run.dropped == 3 and run.pool_bytes == 30 << 20


@pytest.mark.parametrize("bad", ["lots", "-5", "inf", "nan"])
def test_a_bad_memory_budget_warns_once_and_uses_the_default(fake_cuda, monkeypatch, caplog, bad):
    import types

    caplog.set_level(logging.WARNING)
    monkeypatch.setenv("FUSEML_GRAPH_MEMORY_MB", bad)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: types.SimpleNamespace(total_memory=80 << 30))
    from fuseml import _log

    monkeypatch.setattr(_log, "_warned", set(), raising=False)
    run, _, w = _runner(fake_cuda)
    x = torch.randn(3, 4)
    for _ in range(3):
        assert torch.equal(run([x, w])[0], torch.relu(x @ w) + 1.0)
    assert run.budget == (80 << 30) // 10 and run.recordings == 1
    assert [r for r in caplog.records if "FUSEML_GRAPH_MEMORY_MB" in r.getMessage()]


class _Upgrading:
    """A compiled graph whose kernels a test upgrades: poll_kernels() returns the version, as
    backend.Compiled's does after an upgrade tick; the result depends on the version (as if
    the tuned kernel were another computation), so a stale recording would show."""

    def __init__(self):
        self.kernels_version = 0
        self.calls = 0
        self.polls = 0

    def poll_kernels(self):
        self.polls += 1
        return self.kernels_version

    def __call__(self, args):
        self.calls += 1
        (x,) = args
        return [x * 2.0 + self.kernels_version]


def test_upgraded_kernels_are_recorded_again(fake_cuda):
    """Tuned kernels arriving after a graph was recorded: the replay sees the compiled
    graph's kernel version move, drops its recordings, warms the input set up again (the
    call that loads the tuned modules runs as compiled, outside any capture) and records it
    again; replays then run the new kernels."""
    fn = _Upgrading()
    run = graph_replay.GraphReplay(fn, (), 0)
    x = torch.randn(3, 4)
    run([x])  # warm-up
    assert torch.equal(run([x])[0], x * 2.0)  # recorded
    assert torch.equal(run([x])[0], x * 2.0) and fake_cuda.captures == 1
    fn.kernels_version = 1  # an upgrade
    calls = fn.calls
    assert torch.equal(run([x])[0], x * 2.0 + 1.0)
    assert fn.calls == calls + 1 and fake_cuda.captures == 1  # warmed up as compiled, not captured
    assert torch.equal(run([x])[0], x * 2.0 + 1.0) and fake_cuda.captures == 2
    assert torch.equal(run([x])[0], x * 2.0 + 1.0) and fake_cuda.captures == 2  # a replay
    assert run.upgrades == 1 and graph_replay.stats()["upgrades"] >= 1
    assert fn.polls >= 6  # asked at every call, replays included


def test_held_output_survives_an_upgrade(fake_cuda):
    """An output the caller holds across the upgrade keeps its values: dropping a recording
    does not hand its memory to the next one while the output lives."""
    fn = _Upgrading()
    run = graph_replay.GraphReplay(fn, (), 0)
    x = torch.randn(3, 4)
    run([x])
    kept = run([x])[0]
    before = kept.clone()
    fn.kernels_version = 1
    for _ in range(3):
        run([x])
    assert torch.equal(kept, before)


def test_small_inputs_at_a_new_address_every_call_are_copied_not_warmed_up(fake_cuda, monkeypatch):
    """A backward's tangents, a batch's ids: a small input seen at a second address is copied
    into the recording's buffers from then on and keys it by layout, so that the graph is
    recorded once and every later call replays it, wherever the input is."""
    monkeypatch.setattr(graph_replay, "SMALL_INPUT_BYTES", 256 << 10)
    run, calls, w = _runner(fake_cuda)
    xs = [torch.randn(3, 4) for _ in range(8)]
    for x in xs:
        assert torch.equal(run([x, w])[0], torch.relu(x @ w) + 1.0)
    # x0 warmed up by address; x1 moved it: warmed up by layout, x2 recorded, then replays
    assert run.warmups == 2 and fake_cuda.captures == 1 and run.replays == 6
    (recs,) = run.direct.values()
    assert list(recs[0].buffers) == [0]  # x copied; w, static, read where it is
    assert run.copied == {0}


def test_small_inputs_that_stay_are_read_where_they_are(fake_cuda, monkeypatch):
    """A small input the caller keeps at one address (a buffer it refills) is not copied."""
    monkeypatch.setattr(graph_replay, "SMALL_INPUT_BYTES", 256 << 10)
    run, calls, w = _runner(fake_cuda)
    x = torch.randn(3, 4)
    for _ in range(4):
        x.copy_(torch.randn(3, 4))
        assert torch.equal(run([x, w])[0], torch.relu(x @ w) + 1.0)
    (recs,) = run.direct.values()
    assert recs[0].buffers == {} and run.copied == set() and fake_cuda.captures == 1


def test_large_inputs_keep_keying_by_address(fake_cuda, monkeypatch):
    monkeypatch.setattr(graph_replay, "SMALL_INPUT_BYTES", 8)
    run, calls, w = _runner(fake_cuda)
    for x in [torch.randn(3, 4) for _ in range(3)]:
        run([x, w])
    assert run.warmups == 3 and fake_cuda.captures == 0 and run.copied == set()
