"""The inputs a graph updates, written at once (fuseml/input_updates.py): aot_autograd leaves
batch norm's running statistics and counters in the graph as copy_ nodes, and they become one
_foreach_copy_ per dtype and one _foreach_add_ per increment; what could change a value keeps
its copy_. The updated buffers are eager's, in the FX graph and in the generated code."""

import copy

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from helpers import run_step
from test_channels_last import Block

import fuseml
from fuseml import input_updates, straight_line

aten = torch.ops.aten


def _targets(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def _updates(d1, d2, n, x):
    d1.copy_(x * 2)
    d2.copy_(x + 1)
    n.copy_(n + 1)
    return (x * 3,)


def _args():
    return [torch.zeros(4), torch.zeros(4), torch.zeros((), dtype=torch.int64), torch.randn(4)]


def test_copies_and_increments_become_two_calls():
    gm = make_fx(_updates, tracing_mode="fake")(*_args())
    assert input_updates.batch_input_updates(gm) == 3
    ts = _targets(gm)
    assert aten.copy_.default not in ts and ts.count(aten.add.Tensor) == 1  # x + 1; the increment went
    assert ts.count(torch._foreach_copy_) == 1 and ts.count(torch._foreach_add_) == 1
    for run in (gm, straight_line.generate(gm, None, lambda a: gm(*a))[0][1]):
        args, want = _args(), _args()
        want[3] = args[3]
        (y,) = run(*args) if run is gm else run(list(args))
        (y0,) = _updates(*want)
        torch.testing.assert_close(y, y0)
        for a, b in zip(args, want):
            assert torch.equal(a, b)


def _read_between(d1, d2, n, x):
    d1.copy_(x * 2)
    y = d1 + 1  # reads the new value: batching d1's copy later would change y
    d2.copy_(x + 1)
    n.copy_(n + 1)
    return (y,)


def _view_of_input(d1, d2, n, x):
    d1.copy_(x.view(4))  # a view of an input: not a fresh value
    d2.copy_(x + 1)
    n.copy_(n + 1)
    return (x * 3,)


def _broadcast(d1, d2, n, x):
    d1.copy_(x.sum())  # a scalar into [4]: broadcast
    d2.copy_(x + 1)
    n.copy_(n + 1)
    return (x * 3,)


def test_what_could_change_a_value_keeps_its_copy():
    for f, kept in ((_read_between, 1), (_view_of_input, 1), (_broadcast, 1)):
        gm = make_fx(f, tracing_mode="fake")(*_args())
        input_updates.batch_input_updates(gm)
        assert _targets(gm).count(aten.copy_.default) == kept, (f.__name__, gm.code)
        args, want = _args(), _args()
        want[3] = args[3]
        torch.testing.assert_close(gm(*args)[0], f(*want)[0])
        for a, b in zip(args, want):
            assert torch.equal(a, b), f.__name__


def test_one_copy_is_left_alone():
    def one(d1, d2, n, x):
        d1.copy_(x * 2)
        return (x,)

    gm = make_fx(one, tracing_mode="fake")(*_args())
    assert input_updates.batch_input_updates(gm) == 0
    assert aten.copy_.default in _targets(gm)


def test_batch_norm_statistics_after_two_training_steps(dead_socket, partitioned, monkeypatch):
    """A training forward writes every batch norm's running mean, variance and counter in
    two calls; after two steps they are eager's."""
    monkeypatch.setenv("FUSEML_CHANNELS_LAST", "on")
    torch.manual_seed(11)
    model = Block(c=16)
    twin = copy.deepcopy(model)
    compiled = torch.compile(model, backend=fuseml.FuseMLCompiler())
    for step in range(2):
        x = torch.randn(8, 3, 16, 16)
        run_step(compiled, list(model.parameters()), x)
        run_step(twin, list(twin.parameters()), x)
    for bn, bn0 in ((model.bn0, twin.bn0), (model.bn1, twin.bn1)):
        torch.testing.assert_close(bn.running_mean, bn0.running_mean, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(bn.running_var, bn0.running_var, rtol=1e-5, atol=1e-6)
        assert bn.num_batches_tracked.item() == bn0.num_batches_tracked.item() == 2
    fw = partitioned[-2][0]
    ts = _targets(fw)
    assert aten.copy_.default not in ts
    assert ts.count(torch._foreach_copy_) == 1 and ts.count(torch._foreach_add_) == 1, fw.code


def _twice(d1, d2, n, x):
    d1.copy_(x * 2)
    d2.copy_(x + 1)
    return (x * 3,)


def test_an_input_written_twice_keeps_its_copies():
    gm = make_fx(_twice, tracing_mode="fake")(*_args())
    copies = [n for n in gm.graph.nodes if n.target is aten.copy_.default]
    # a second copy into d1, last: the graph's order of the two writes decides d1
    with gm.graph.inserting_after(copies[-1]):
        gm.graph.call_function(aten.copy_.default, (copies[0].args[0], copies[1].args[1]))
    gm.recompile()
    input_updates.batch_input_updates(gm)
    assert _targets(gm).count(aten.copy_.default) == 3, gm.code  # d1 twice; d2 alone, no batch of one
    args = _args()
    gm(*args)
    torch.testing.assert_close(args[0], args[3] + 1)
