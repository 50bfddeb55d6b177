"""Horizontal fusion: pointwise groups of one shape that read one value (or the values of one
multi-output op), with no path between them, run as one kernel of several outputs: an MoE
router's token numbers and its sorted expert ids cast for histc, batch norm's two running
statistics cast back to bf16. Groups that read nothing in common, or where one waits on the
other, stay apart; the merged kernel's results are eager's; a real fusemld accepts it."""

import torch

from helpers import Fn, compile_run

from fuseml import horizontal


def kernels(c):
    return [g for p in c.plans for g in p.groups if g.route == "kernel"]


def router(scores):
    """What a grouped-GEMM MoE router does with its picks' expert ids (flattened, 2 a token)."""
    ids = scores.topk(2, dim=-1).indices.view(-1)
    expert, order = ids.sort(stable=True)
    return order // 2, expert.float()


def scores(seed=0):
    return torch.randn(64, 8, generator=torch.Generator().manual_seed(seed))


def test_lone_ops_on_one_sort_run_as_one_kernel(served):
    c, (got, _), (want, _) = compile_run(Fn(router), scores(), train=False)
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and torch.equal(a, b)
    (g,) = [g for g in kernels(c) if "floor_divide" in g.op_names]
    assert set(g.op_names) == {"floor_divide", "_to_copy"}, g.op_names
    assert len(g.outputs) == 2 and len(g.built.wire["outputs"]) == 2


def apart(x):
    a = x.argsort(dim=-1)
    return a // 2, x.sin().float() * 0 + (x.cos() > 0).float()  # nothing read in common with a


def test_groups_reading_nothing_in_common_stay_apart(served):
    x = scores(1)
    c, (got, _), (want, _) = compile_run(Fn(lambda v: apart(v)[0]), x, train=False)
    assert torch.equal(got, want)
    assert not kernels(c)  # floor_divide alone: nothing to fuse, nothing to pair with


def chained(x):
    s = x.sort(dim=-1)
    q = s.indices // 2
    return q, (s.values + q).float()  # reads q: the pair would wait on itself


def test_a_group_that_reads_the_other_is_no_pair(served):
    c, (got, _), (want, _) = compile_run(Fn(chained), scores(2), train=False)
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    for g in kernels(c):
        assert len(g.outputs) <= 2, g.describe()


def test_batch_norms_running_statistics_are_cast_in_one_kernel(served):
    torch.manual_seed(0)
    bn = torch.nn.BatchNorm2d(16).to(torch.bfloat16).train()
    x = torch.randn(4, 16, 6, 6, dtype=torch.bfloat16)
    ref = torch.nn.BatchNorm2d(16).to(torch.bfloat16).train()
    ref.load_state_dict(bn.state_dict())
    c = __import__("fuseml").FuseMLCompiler()
    got = torch.compile(bn, backend=c)(x)
    want = ref(x)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(bn.running_mean, ref.running_mean)
    torch.testing.assert_close(bn.running_var, ref.running_var)
    pairs = [g for g in kernels(c) if g.op_names == ["_to_copy", "_to_copy"]]
    assert len(pairs) == 1 and len(pairs[0].outputs) == 2, [g.describe() for p in c.plans for g in p.groups]


def many(x):
    order = x.sort(dim=-1).indices
    return tuple(order // (i + 2) for i in range(11))


def test_a_merged_group_keeps_inside_the_limits(served):
    """Eleven lone ops on one sort: merged while the group stays within MAX_OUTPUTS."""
    c, (got, _), (want, _) = compile_run(Fn(many), scores(3), train=False)
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    sizes = sorted(len(g.outputs) for g in kernels(c))
    assert sizes == [11 - horizontal.MAX_OUTPUTS, horizontal.MAX_OUTPUTS], sizes
    assert horizontal.MAX_OUTPUTS < 16 and horizontal.MAX_INPUTS < 32  # inside the wire's limits


def shapes_differ(x):
    s = x.sort(dim=-1)
    return s.indices // 2, s.values[:, :4].float()


def test_groups_of_two_shapes_stay_apart(served):
    c, (got, _), (want, _) = compile_run(Fn(shapes_differ), scores(5), train=False)
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    assert not kernels(c)


def test_daemon_accepts_the_merged_fragment(daemon):
    c, (got, _), (want, _) = compile_run(Fn(router), scores(4), train=False)
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    (g,) = [g for g in kernels(c) if "floor_divide" in g.op_names]
    assert g.key and g.state in ("untuned", "tuned"), (g.describe(), g.reason)
