"""Reshapes moved off the seams of elementwise chains (view_motion.py): the lone casts around
a flattening reshape join the rows groups on the other side (Hugging Face's causal-LM loss
forward and backward), results unchanged; a reshape that is no view of its new operand, or a
move that would change a value's layout, is left where it was."""
import torch

from helpers import Fn, close_bf16, compile_run, plan

from fuseml import view_motion

BF16 = torch.bfloat16


def _loss(x, labels):
    # what transformers' ForCausalLMLoss does with [B, S, V] logits: upcast, flatten, CE
    return torch.nn.functional.cross_entropy(x.float().view(-1, x.shape[-1]), labels)


def test_loss_casts_join_the_rows_groups(dead_socket):
    torch.manual_seed(0)
    labels = torch.randint(0, 96, (2 * 8,))
    c, got, want = compile_run(Fn(lambda x: _loss(x, labels)), torch.randn(2, 8, 96, dtype=BF16))
    close_bf16(got, want)
    fw, bw = plan(c, "forward"), plan(c, "backward")
    # forward: the upcast runs inside log_softmax's rows group, not as a lone copy
    assert any({"_to_copy", "amax"} <= set(g.op_names) for g in fw.groups if g.kind == "rows"), fw.describe()
    assert not [g for g in fw.groups if g.op_names == ["_to_copy"]], fw.describe()
    # backward: the downcast of the gradient joins its rows group
    assert any({"_to_copy", "sum"} <= set(g.op_names) for g in bw.groups if g.kind == "rows"), bw.describe()
    assert not [g for g in bw.groups if g.op_names == ["_to_copy"]], bw.describe()


def _graph(f, *xs):
    """f's ATen graph with fake values (what the backend partitions)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx
    mode = FakeTensorMode()
    with mode:
        fakes = [mode.from_tensor(x) for x in xs]
        return make_fx(f)(*fakes)


def _targets(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def test_hoist_and_sink_and_their_limits():
    aten = torch.ops.aten
    # hoist: view(cast(x)) where x is an input -> cast(view(x))
    gm = _graph(lambda x: x.float().view(-1, 16).amax(-1, keepdim=True), torch.randn(2, 4, 16, dtype=BF16))
    assert view_motion.move(gm) == 1
    ts = _targets(gm)
    assert ts.index(aten.view.default) < ts.index(aten._to_copy.default), ts
    x = torch.randn(2, 4, 16, dtype=BF16)
    torch.testing.assert_close(gm(x), x.float().view(-1, 16).amax(-1, keepdim=True))
    # sink: cast(view(amax-chain value)) -> view(cast(...)); the output keeps its layout
    f = lambda x: (x.float() - x.float().amax(-1, keepdim=True)).view(2, 4, 16).to(BF16)  # noqa: E731
    gm = _graph(f, torch.randn(8, 16, dtype=BF16))
    assert view_motion.move(gm) == 1
    ts = _targets(gm)
    assert ts[-1] == aten.view.default, ts
    x = torch.randn(8, 16, dtype=BF16)
    torch.testing.assert_close(gm(x), f(x))
    # no sink when the op below the view has a fusible reader: it fuses there already
    f2 = lambda x, t: (x.float() - x.float().amax(-1, keepdim=True)).view(2, 4, 16).to(BF16) + t  # noqa: E731
    gm = _graph(f2, torch.randn(8, 16, dtype=BF16), torch.randn(2, 4, 16, dtype=BF16))
    assert view_motion.move(gm) == 0
    # no view of the new operand: the cast of a padded slice is contiguous, the slice is not,
    # so flattening it is no view: the pair stays
    g = lambda x: x[:, :16].float().view(-1).amax(-1, keepdim=True)  # noqa: E731
    gm = _graph(g, torch.randn(8, 20, dtype=BF16))
    assert view_motion.move(gm) == 0
    x = torch.randn(8, 20, dtype=BF16)
    torch.testing.assert_close(gm(x), g(x))
    # a cast read twice stays (moving it would compute it twice)
    def h(x):
        y = x.float()
        return y.view(-1, 16).amax(-1, keepdim=True), y
    gm = _graph(h, torch.randn(2, 4, 16, dtype=BF16))
    assert view_motion.move(gm) == 0
