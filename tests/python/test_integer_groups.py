"""Integer values (vocabulary 10): a language model's label preparation (the ignore_index
test, the range check, the labels as f32 for the loss) and a router's token numbers
(floor_divide) join pointwise groups over int64 tensors; a float meeting an int64 value (torch's
promotion) stays out; the groups keep to pointwise fragments; a real fusemld accepts them."""

import torch

from helpers import Fn, compile_run

from fuseml import ops
from fuseml.fragment import Emitter

aten = torch.ops.aten


def labels_prep(labels):
    """What Hugging Face's causal LM loss does to its labels before the cross-entropy."""
    y = torch.nn.functional.pad(labels, (0, 1), value=-100)[..., 1:].contiguous().view(-1)
    keep = y != -100
    inside = (y >= 0) & (y < 1000)
    target = torch.where(keep, y, 0).float()
    return keep, inside | ~keep, target, y // 3 + keep


def random_labels(seed=0):
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(-5, 1000, (4, 33), generator=g)
    y[y < 0] = -100  # ignored positions
    return y


def groups(c):
    return [g for p in c.plans for g in p.groups]


def integer_groups(c):
    return [g for g in groups(c) if g.route == "kernel" and "ne" in g.op_names]


def test_label_prep_is_one_group(served):
    x = random_labels()
    c, got, want = compile_run(Fn(labels_prep), x, train=False)
    for a, b in zip(got[0], want[0]):
        assert a.dtype == b.dtype and torch.equal(a, b)
    found = integer_groups(c)
    assert len(found) == 1, [g.describe() for g in groups(c)]
    g = found[0]
    assert {"ne", "ge", "lt", "where", "floor_divide", "_to_copy"} <= set(g.op_names), g.op_names
    wire = g.built.wire
    assert wire["vocab"] == 10
    assert {t["dtype"] for t in wire["inputs"]} == {"i64"}  # the labels (and where's 0, a 0-dim tensor)
    assert sorted(t["dtype"] for t in wire["outputs"]) == ["bool", "bool", "f32", "i64"]
    assert any(op["op"] == "floor_div" for op in wire["ops"])


def test_daemon_accepts_integer_fragments(daemon):
    c, got, want = compile_run(Fn(labels_prep), random_labels(1), train=False)
    for a, b in zip(got[0], want[0]):
        assert torch.equal(a, b)
    ks = [g for p in c.plans for g in p.kernels()]
    assert any(g.built.wire["vocab"] == 10 for g in ks)
    assert all(g.key and g.state in ("untuned", "tuned") for g in ks), [
        (g.describe(), g.reason) for g in ks if not g.key
    ]


def node(target, *args):
    """A one-op FX graph over placeholders for the tensor args (meta from them)."""
    g = torch.fx.Graph()
    phs, call = [], []
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor):
            p = g.placeholder(f"x{i}")
            p.meta["val"] = a
            phs.append(p)
            call.append(p)
        else:
            call.append(a)
    n = g.call_function(target, tuple(call))
    n.meta["val"] = target(*args)
    return n, phs


def test_what_stays_out():
    y, f = torch.arange(-4, 4), torch.randn(8)
    cases = {
        (aten.mul.Tensor, y, f): "with a float result",
        (aten.mul.Scalar, y, 0.5): "with a float result",
        (aten.where.self, y > 0, y, f): "with a float result",
        (aten.lt.Tensor, y, f): "an int64 value meeting a float",
        (aten.lt.Scalar, y, 1 << 25): "a large scalar",
        (aten.floor_divide.default, y, y.abs() + 1): "floor_divide by a tensor",
        (aten.floor_divide.default, f, 2): "floor_divide of floats",
        (aten.exp.default, y): "integer op outside the integer vocabulary",
        (aten._to_copy.default, f): None,  # a float to int64: below
    }
    for (target, *args), why in cases.items():
        if why is None:
            continue
        n, _ = node(target, *args)
        assert why in (ops.why_not_pointwise(n) or ""), (target, ops.why_not_pointwise(n))
    n, _ = node(aten.ne.Scalar, y, -100)
    assert ops.why_not_pointwise(n) is None


def test_spellings_keep_torch_dtypes():
    y, b = torch.arange(-7, 9), torch.arange(16) % 2 == 0
    for target, args in [
        (aten.floor_divide.default, (y, 3)),
        (aten.add.Tensor, (y, b)),
        (aten.where.self, (b, y, torch.tensor(0))),
        (aten.ne.Scalar, (y, -100)),
        (aten.div.Tensor, (y, y)),
    ]:
        n, phs = node(target, *args)
        e = Emitter(phs)
        vid = e.emit_node(n)
        assert e.dtype[vid] == ops.dtype_name(n.meta["val"].dtype), (target, e.dtype[vid])


def test_integers_stay_out_of_rows_groups(partitioned, served):
    def f(x):
        keep = (x != -100).float()
        return (keep * 2.0).sum(-1, keepdim=True)

    c, got, want = compile_run(Fn(f), random_labels(2), train=False)
    assert torch.equal(got[0], want[0])
    for _, groups in partitioned:
        for g in groups:
            if g.kind in ("rows", "columns", "gemm"):
                assert not any(ops.is_integer_node(n) for n in g.members), g.describe()
