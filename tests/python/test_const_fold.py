"""Values no input reaches are computed once, when the graph is compiled (const_fold.py): a
causal mask built from aranges becomes a tensor attribute of the graph, its ops gone; what an
input, a random op or a symbolic size reaches is computed on every call; a graph output is
never the one constant tensor; a constant too large to keep is left to be computed."""

import torch

from helpers import Fn, compile_run

from fuseml import const_fold

aten = torch.ops.aten


def targets(gm):
    return {n.target for n in gm.graph.nodes if n.op == "call_function"}


def constants(gm):
    return [n for n in gm.graph.nodes if n.op == "get_attr" and n.target.startswith("_fuseml_constant")]


def causal(x):
    s = x.shape[-1]
    i = torch.arange(s, device=x.device)
    keep = i[None, :] <= i[:, None]
    mask = torch.where(keep, torch.tensor(0.0, device=x.device), torch.tensor(float("-inf"), device=x.device))
    return torch.softmax(x + mask, -1)


def test_causal_mask_is_computed_once(dead_socket, partitioned):
    x = torch.randn(2, 8, 8)
    c, got, want = compile_run(Fn(causal), x, train=False)
    torch.testing.assert_close(got[0], want[0])
    ((gm, groups),) = partitioned
    assert aten.arange.start_step not in targets(gm) and aten.arange.default not in targets(gm)
    assert aten.le.Tensor not in targets(gm) and aten.where.self not in targets(gm)
    (k,) = constants(gm)
    mask = getattr(gm, k.target)
    assert mask.shape == (8, 8) and torch.isinf(mask).sum() == 8 * 7 // 2
    # the same graph on other values: the constant depends on the shape alone
    fn = torch.compile(Fn(causal), backend=c)
    y = torch.randn(2, 8, 8)
    torch.testing.assert_close(fn(y), causal(y))


def test_values_an_input_reaches_are_computed_each_call(dead_socket, partitioned):
    def f(x):
        keep = x > 0  # from the input
        ones = x.new_ones(x.shape)  # reads only x's dtype and device
        return torch.where(keep, x, ones * 2)

    x = torch.randn(4, 16)
    c, got, want = compile_run(Fn(f), x, train=False)
    torch.testing.assert_close(got[0], want[0])
    ((gm, groups),) = partitioned
    assert aten.gt.Scalar in targets(gm)
    assert aten.new_ones.default not in targets(gm) and len(constants(gm)) == 1


def test_random_ops_are_not_folded(dead_socket, partitioned):
    def f(x):
        return x + torch.rand(16, device=x.device)

    compile_run(Fn(f), torch.randn(4, 16), train=False)
    ((gm, groups),) = partitioned
    assert not constants(gm)


def test_a_graph_output_is_a_new_tensor_each_call(dead_socket, partitioned):
    def f(x):
        return x * 2, torch.arange(16, device=x.device) * 3

    c, got, want = compile_run(Fn(f), torch.randn(4, 16), train=False)
    fn = torch.compile(Fn(f), backend=c)
    a = fn(torch.randn(4, 16))[1]
    b = fn(torch.randn(4, 16))[1]
    assert a.data_ptr() != b.data_ptr()
    a.add_(1)  # the caller owns it
    torch.testing.assert_close(fn(torch.randn(4, 16))[1], torch.arange(16) * 3)


def test_a_constant_over_the_cap_is_computed_each_call(dead_socket, partitioned, monkeypatch):
    monkeypatch.setattr(const_fold, "MAX_BYTES", 16)
    x = torch.randn(2, 8, 8)
    c, got, want = compile_run(Fn(causal), x, train=False)
    torch.testing.assert_close(got[0], want[0])
    ((gm, groups),) = partitioned
    assert all(getattr(gm, k.target).numel() * getattr(gm, k.target).element_size() <= 16 for k in constants(gm))


def test_symbolic_sizes_are_not_folded(dead_socket, partitioned):
    c, got, want = compile_run(Fn(causal), torch.randn(2, 8, 8), train=False)
    fn = torch.compile(Fn(causal), backend=c, dynamic=True)
    for s in (8, 12):
        y = torch.randn(2, s, s)
        torch.testing.assert_close(fn(y), causal(y))
    gm, groups = partitioned[-1]
    # the mask's size is symbolic: it is computed on each call; the two scalars fold
    assert any("arange" in str(t) for t in targets(gm))
    assert all(getattr(gm, k.target).dim() == 0 for k in constants(gm))


class PositionsSaved(torch.nn.Module):
    """GPT-2's embedding of positions in training: the position ids (a view of an arange)
    are saved for the embedding's backward, so the forward returns them, and a mask is built
    from them too (HF's packed-sequence test: diff, ne, cumsum, compare)."""

    def __init__(self):
        super().__init__()
        self.pos = torch.nn.Embedding(8, 4)

    def forward(self, x):
        ids = torch.arange(x.shape[1])[None]
        first = ids[:, :1] - 1
        starts = (torch.cat([first, ids], -1).diff(dim=-1) != 1).cumsum(-1)
        same = starts[:, :, None] == starts[:, None, :]
        mask = torch.where(same, 0.0, -1.0)  # added: the backward needs none of it
        return (x @ x.transpose(1, 2) + mask).sum(-1) + self.pos(ids).sum(-1)


def test_an_output_view_of_a_constant_still_lets_its_readers_fold(dead_socket, partitioned):
    x = torch.randn(2, 8, 4, requires_grad=True)
    c, got, want = compile_run(PositionsSaved(), x)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)
    gm, groups = partitioned[0]  # the forward: it returns the ids for the backward
    assert aten.cumsum.default not in targets(gm) and aten.cat.default not in targets(gm)
    assert aten.ne.Scalar not in targets(gm) and aten.eq.Tensor not in targets(gm)
    assert constants(gm)
