"""Which CPU values of a CUDA graph move to the device so that the graph can be recorded as a
CUDA graph (device_constants.py), and why the others stay: graphs traced on fake CUDA tensors
(no GPU here), a hand-made one and a tiny T5 training step, whose KV cache leaves an empty
CPU constant per layer copied to the device. The move itself (a real device copy) and the
recording run on the GPU (bench/device/pad-gemm/run)."""

import pytest
import torch
import torch.fx.experimental.proxy_tensor as proxy_tensor
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

from fuseml import backend, cudagraphs, device_constants


def _trace(f, *shapes, cpu_scalar=False):
    """f traced on fake bf16 CUDA tensors of `shapes` (and a 0-dim CPU tensor after them)."""
    with FakeTensorMode():
        args = [torch.empty(s, device="cuda", dtype=torch.bfloat16) for s in shapes]
        if cpu_scalar:
            args.append(torch.empty((), dtype=torch.float32))
    return make_fx(f, tracing_mode="fake", decomposition_table=backend.DECOMPOSITIONS)(*args)


def _skip(gm, n_inputs=1):
    """What torch's own check says of gm, and what fuseml's plan says (moving nothing: a
    graph whose CPU values cannot all move stays as it is)."""
    api = cudagraphs._api()
    torch_says = api.check_for_skip(gm, 0)
    dev, static, skip, moved = cudagraphs._plan(
        api, gm, [None] * n_inputs, "inference", cudagraphs.State([None] * n_inputs)
    )
    return torch_says, skip, moved


def test_cpu_scalars_that_reach_the_gpu_move():
    def f(x):
        y = x * torch.tensor(2.0)  # a CPU scalar operand
        return torch.where(y > 0, y, torch.tensor(-1.0)).sum(), x.float() + torch.tensor(0.5)

    gm = _trace(f, (4, 8))
    assert "cpu device (_tensor_constant0)" in str(cudagraphs._api().check_for_skip(gm, 0))
    movable, kept = device_constants.plan(gm)
    assert kept == {}
    assert [n.name for n in movable] == [
        "_tensor_constant0",
        "lift_fresh_copy",
        "_tensor_constant1",
        "lift_fresh_copy_1",
        "_tensor_constant2",
        "lift_fresh_copy_2",
    ]


def test_cpu_values_the_caller_or_host_sees_stay():
    def f(x):
        c = torch.tensor(3.0) + 1  # a CPU result returned: the caller sees a CPU tensor
        return x * torch.tensor(2.0), c

    gm = _trace(f, (4, 8))
    movable, kept = device_constants.plan(gm)
    assert kept == {
        "add": "a graph output",
        "lift_fresh_copy": "used by add, which stays on the CPU",
        "_tensor_constant0": "used by lift_fresh_copy, which stays on the CPU",
    }
    assert [n.name for n in movable] == ["_tensor_constant1", "lift_fresh_copy_1"]
    torch_says, skip, moved = _skip(gm)
    # nothing moved (the graph stays refused either way), and the note says why
    assert moved == [] and all(n.meta["val"].device.type == "cpu" for n in gm.graph.nodes if n.op == "get_attr")
    assert skip.startswith("cpu device (_tensor_constant0): ")


def test_a_real_cpu_input_keeps_the_graph_refused():
    def f(x, s):
        return x * s * torch.tensor(2.0)

    gm = _trace(f, (4, 8), cpu_scalar=True)
    movable, kept = device_constants.plan(gm)
    assert kept["s_1"] == "an input of the graph"
    torch_says, skip, moved = _skip(gm, n_inputs=2)
    assert "cpu device (s_1)" in str(torch_says)
    assert skip == "cpu device (s_1): an input of the graph" and moved == []


def test_a_value_copied_to_the_host_stays():
    def f(x):
        return (x.to("cpu") * torch.tensor(2.0)).to(x.device)

    gm = _trace(f, (4, 8))
    movable, kept = device_constants.plan(gm)
    assert movable == []
    assert kept["_to_copy"] == "copied to the host from x_1"
    assert kept["mul"] == "computed from _to_copy, which stays on the CPU"


@pytest.fixture
def tiny_t5():
    tf = pytest.importorskip("transformers")
    cfg = tf.T5Config(
        vocab_size=64,
        d_model=32,
        d_kv=8,
        d_ff=64,
        num_heads=4,
        num_layers=1,
        num_decoder_layers=1,
        feed_forward_proj="gated-gelu",
        tie_word_embeddings=False,
        decoder_start_token_id=0,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    return tf.T5ForConditionalGeneration(cfg).to(torch.bfloat16)


def test_t5_training_graph_constants_all_move(tiny_t5, monkeypatch):
    """T5's training step traced on fake CUDA tensors holds empty CPU constants (its KV cache's
    `torch.tensor([], device=...)`), the "cpu device (_tensor_constant0)" that kept its graphs
    unrecorded: all of them reach the GPU only, so all move."""
    # make_fx would run the constant's copy to the device for real (it keeps small constants'
    # values): there is no GPU here
    monkeypatch.setattr(proxy_tensor, "CONSTANT_NUMEL_LIMIT", -1)
    named = list(tiny_t5.named_parameters()) + list(tiny_t5.named_buffers())
    with FakeTensorMode():
        params = {k: torch.empty(v.shape, dtype=v.dtype, device="cuda") for k, v in named}
        ids = torch.zeros(2, 16, dtype=torch.long, device="cuda")
        labels = torch.zeros(2, 8, dtype=torch.long, device="cuda")

    def step(p, ids, labels):
        return torch.func.functional_call(tiny_t5, p, (), {"input_ids": ids, "labels": labels}).loss

    gm = make_fx(step, tracing_mode="fake", decomposition_table=backend.DECOMPOSITIONS)(params, ids, labels)
    assert "cpu device (_tensor_constant0)" in str(cudagraphs._api().check_for_skip(gm, 0))
    movable, kept = device_constants.plan(gm)
    consts = [n for n in movable if n.op == "get_attr"]
    assert kept == {} and len(consts) >= 2
    for n in consts:
        assert n.meta["val"].numel() == 0
        (user,) = n.users
        assert user.target is torch.ops.aten.lift_fresh_copy.default
        assert {u.target for u in user.users} == {torch.ops.aten._to_copy.default}


def test_move_changes_the_constants_and_their_metadata():
    """The move on a device this machine has without a GPU ("meta", which torch's check
    ignores as it holds no data): the constants, their values' metadata and a factory's device
    change, the graph's code with them, and torch's check then lets the graph be recorded."""

    def f(x):
        s = torch.scalar_tensor(3.0, dtype=torch.float32, device="cpu")  # a CPU factory
        return torch.where(x > 0, x * torch.tensor(2.0), s)

    gm = _trace(f, (4, 8))
    assert "cpu device" in str(cudagraphs._api().check_for_skip(gm, 0))
    moved, kept = device_constants.move(gm, torch.device("meta"))
    assert kept == {} and moved == ["scalar_tensor", "_tensor_constant0", "lift_fresh_copy"]
    assert gm._tensor_constant0.device.type == "meta"
    nodes = {n.name: n for n in gm.graph.nodes}
    assert nodes["scalar_tensor"].kwargs["device"] == torch.device("meta")
    assert all(nodes[m].meta["val"].device.type == "meta" for m in moved)
    assert nodes["where"].meta["val"].device.type == "cuda"
    assert "device = device(type='meta')" in gm.code
    assert cudagraphs._api().check_for_skip(gm, 0) is None


def test_move_under_a_fake_mode_keeps_real_constants():
    """aot_autograd calls a training graph's compiler under its fake mode: the constants moved
    there are still real tensors (a fake one kept as the graph's attribute broke T5's training
    step under CUDA graphs: "Please convert all Tensors to FakeTensors first" at folding)."""
    from torch._subclasses.fake_tensor import FakeTensor

    def f(x):
        return x * torch.tensor(2.0)

    gm = _trace(f, (4, 8))
    with FakeTensorMode():
        moved, kept = device_constants.move(gm, torch.device("meta"))
    assert moved and kept == {}
    const = gm._tensor_constant0
    assert const.device.type == "meta" and not isinstance(const, FakeTensor)
