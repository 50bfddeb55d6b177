"""The shared protocol vectors (protocol/vectors): fragments built from FX graphs of the same
computations equal the vectors' canonical forms, and every fragment the builder makes is
accepted by a real daemon."""

import json
import os

import msgpack
import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import fuseml
from fuseml import transport

VEC = os.path.join(os.path.dirname(__file__), "..", "..", "protocol", "vectors")
F = torch.nn.functional


def canon(name):
    with open(os.path.join(VEC, name + ".canon.mp"), "rb") as f:
        return msgpack.unpackb(f.read(), raw=False)


def built(fn, *args, mode="real"):
    gm = make_fx(fn, tracing_mode=mode)(*args)
    groups = [g for g in fuseml.find_groups(gm, min_ops=1) if g.kind == "pointwise"]
    assert len(groups) == 1, [g.describe() for g in groups]
    g = groups[0]
    return fuseml.build(g.members, g.inputs, g.outputs).wire


def compiled(fn, *args, dyn0=()):
    """The wire fragment of fn's one fused group, captured through torch.compile; dyn0 names
    the arguments whose dim 0 is dynamic."""
    for i in dyn0:
        torch._dynamo.mark_dynamic(args[i], 0)
    c = fuseml.FuseMLCompiler(min_ops=1)
    torch.compile(fn, backend=c)(*args)
    (k,) = [g for p in c.plans for g in p.kernels()]
    return k.built.wire


def _bias_offset8():
    # a [1, 768] f16 bias whose base is 8 bytes past a 16-byte boundary
    return torch.zeros(772, dtype=torch.float16)[4:].view(1, 768)


def _multi(x):
    t = torch.tanh(x)
    return t, t + torch.exp(x)


CASES = {
    "chain": lambda: built(lambda x: F.silu(x) * 2.0, torch.randn(8, 1024, dtype=torch.bfloat16)),
    "bias_broadcast": lambda: compiled(
        lambda x, b: F.gelu(x + b), torch.randn(128, 768, dtype=torch.float16), _bias_offset8()
    ),
    # The slice inside the graph: a sliced graph input would get a symbolic stride.
    "symbolic_dim0": lambda: compiled(
        lambda x, y: torch.relu(x + y[:, :4096]),
        torch.randn(5, 4096, dtype=torch.bfloat16),
        torch.randn(5, 8192, dtype=torch.bfloat16),
        dyn0=(0, 1),
    ),
    "multi_output": lambda: compiled(_multi, torch.randn(7, 256), dyn0=(0,)),
    "where_compare": lambda: built(lambda x: torch.where(x > 0, x, x * 0.01), torch.randn(64, 64, dtype=torch.float16)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_builder_matches_vector(name, dead_socket):
    assert CASES[name]() == canon(name)


def test_cast_vector_ops():
    # The vector stores the cast contiguously; torch's _to_copy keeps the transposed layout,
    # so only inputs and ops are the vector's.
    w = built(lambda x: (x * 0.125).to(torch.bfloat16), torch.randn(32, 32).t())
    c = canon("cast")
    assert w["inputs"] == c["inputs"] and w["ops"] == c["ops"]
    assert w["outputs"][0]["strides"] == [1, 32]


def test_manifest_accepted_vectors_roundtrip_json():
    with open(os.path.join(VEC, "manifest.json")) as f:
        manifest = json.load(f)
    for v in manifest["vectors"]:
        if v["expect"] != "accept":
            continue
        with open(os.path.join(VEC, v["json"])) as f:
            frag = json.load(f)
        with open(os.path.join(VEC, v["msgpack"]), "rb") as f:
            assert msgpack.unpackb(f.read(), raw=False) == frag, v["name"]


def test_daemon_accepts_every_built_vector(daemon, monkeypatch, tmp_path):
    monkeypatch.setenv("FUSEML_SOCKET", str(tmp_path / "none.sock"))  # builders only
    frags = [CASES[n]() for n in sorted(CASES)]
    conn = transport.connect(daemon.socket, timeout=60)
    try:
        replies = transport.compile_all(conn, frags, 120)
    finally:
        conn.close()
    for name, r in zip(sorted(CASES), replies):
        assert r["ok"], (name, r.get("code"), r.get("detail"))
        assert r["kind"] == "pointwise" and len(r["cubin"]) > 0
    # chain's canonical bytes are the vector's, so its key is too, given the same device.
    assert replies[0]["key"] != replies[1]["key"]
