"""A batched GEMM group (bmm or baddbmm, then a pointwise epilogue over its [Bt, M, N] result)
-> a vocabulary-4 fragment (protocol/PROTOCOL.md, "batched GEMM fragments") and its launch
layout.

torch.matmul on [B, H, S, D] reaches the graph as a bmm over [B*H, S, D] whose result is
viewed back as [B, H, S, S]; the epilogue after that view (`* scale`, `+ mask`) runs over the
same elements, so every tensor it reads is mapped onto [Bt, M, N] by collapsing its leading
(batch) dims into one batch stride. That is exact only when the tensor is dense across them
or broadcast over all of them: a mask [B, 1, S, S] beside [B, H, S, S] (per batch, not per
head) has no single batch stride and keeps the group with ATen.

The batch is sent as the symbolic dim 0 (-1) whenever no stride depends on its size (the
batch is every tensor's outermost dim), with `m_hint` = the batch count at hand: the daemon
tunes at its power-of-two bucket and another batch size in the bucket reuses the kernel. M, K
and N are static."""

from .fragment import Built, Emitter, Unfusable, _align_of
from .gemm_fragment import _hint, _strides
from .ops import DTYPES, RESHAPE_OPS, aten
from .shapes import is_known_int, known_equal, known_true

VOCAB = 4


class BmmLayout:
    """What the runtime needs of the iteration space [Bt, M, N]: k = 1 when the batch is the
    symbolic dim 0 (its size, the launch's `outer`, comes from A's dim 0), else 0."""

    def __init__(self, bt, m, n, symbolic):
        self.k = 1 if symbolic else 0
        self.shape = [bt, m, n]


def _is_one(d):
    return d is not None and is_known_int(d) and int(d) == 1


def collapse(size, stride, rank):
    """A tensor read in a space of `rank` dims (rank - 2 batch dims, then M, N), right-aligned
    to it (torch's broadcast), as [b, m, n] sizes and strides: its batch dims collapsed into
    one. Raises ValueError when they cannot be (not dense across them). Size-1 dims count
    for nothing; a batch broadcast over every dim (stride 0) is [1, ...] with stride 0.
    Used on fake tensors (sizes may be symbolic) by the builder and on real ones by the
    runtime's stride check."""
    size, stride = list(size), list(stride)
    if len(size) > rank:
        raise ValueError(f"rank {len(size)} above the iteration space's {rank}")
    size = [1] * (rank - len(size)) + size
    stride = [0] * (rank - len(stride)) + stride
    lead = [i for i in range(rank - 2) if not _is_one(size[i])]
    b, bs = 1, 0
    if lead:
        for i, j in zip(lead, lead[1:]):
            if not known_true(stride[i] == stride[j] * size[j]):
                raise ValueError("not dense across its batch dims")
        for i in lead:
            b = b * size[i]
        bs = stride[lead[-1]]
        if is_known_int(bs) and int(bs) == 0:
            b = 1  # every batch dim broadcast: one [M, N] matrix for all
    return [b] + size[-2:], [bs] + stride[-2:]


def _outer_batch(size, stride):
    """The batch is the outermost dim: the other strides cannot depend on its size."""
    if _is_one(size[0]) or (is_known_int(stride[0]) and int(stride[0]) == 0):
        return True
    return all(_is_one(size[d]) or int(stride[d]) * int(size[d]) <= int(stride[0]) for d in (1, 2))


def _dense_row_major(t):
    size, stride = list(t.shape), list(t.stride())
    if not known_true(stride[-1] == 1) and not _is_one(size[-1]):
        return False
    return all(
        _is_one(size[i + 1]) or known_true(stride[i] == stride[i + 1] * size[i + 1]) for i in range(len(size) - 1)
    )


def build_bmm(members, in_nodes, out_nodes):
    """members: the bmm/baddbmm node, its epilogue, at most one view of the result among them
    (graph order); in_nodes: the group's tensor inputs (fragment order); out_nodes: the
    members whose values leave the group."""
    mm = members[0]
    a_node, b_node = mm.args[-2], mm.args[-1]
    if a_node is b_node:
        raise Unfusable("A and B are one tensor")
    ta, tb = a_node.meta["val"], b_node.meta["val"]
    bt, m, n = ta.shape[0], int(ta.shape[1]), int(tb.shape[2])
    # the view of the result, if any: the members from it on read and write its shape
    view_at = next((i for i, x in enumerate(members) if x.target in RESHAPE_OPS), len(members))
    space = {}  # member -> the shape of the space it runs in
    for i, x in enumerate(members):
        space[x] = members[view_at].meta["val"].shape if i >= view_at else mm.meta["val"].shape

    # Each epilogue input as [b, m, n] in every space it is read in (one mapping, or refused).
    mapped = {}
    for x in in_nodes:
        if x is a_node or x is b_node:
            continue
        for user in members:
            if x not in user.all_input_nodes:
                continue
            if user is mm and mm.target is aten.bmm.default:
                continue
            got = _epilogue_operand(x.meta["val"], len(space[user]), bt, m, n, f"input {x.name}")
            if mapped.setdefault(x, got) != got:
                raise Unfusable(f"input {x.name} is read in two shapes that map differently")

    # The batch goes symbolic when no stride depends on it (always when it is symbolic in
    # the graph already, where a stride depending on it would itself be symbolic).
    with_batch = [(list(ta.shape), _strides(ta)), (list(tb.shape), _strides(tb))] + [
        (sz, st) for sz, st in mapped.values()
    ]
    outer_ok = all(_outer_batch(sz, st) for sz, st in with_batch)
    symbolic = (not is_known_int(bt)) or outer_ok
    if not is_known_int(bt) and not outer_ok:
        raise Unfusable("a symbolic batch with an operand whose strides depend on it")
    bt_dim = -1 if symbolic else int(bt)

    e = Emitter(in_nodes)
    e.ids[mm] = _emit_product(e, mm)
    for node in members[1:]:
        if node.target in RESHAPE_OPS:  # [Bt, M, N] seen as [B, H, M, N]: same elements
            e.ids[node] = e.ids[node.args[0]]
            continue
        e.emit_node(node)

    inputs, in_align, in_ranks = [], [], []
    full_input = None
    for i, node in enumerate(in_nodes):
        t = node.meta["val"]
        if node is a_node or node is b_node:
            shape = [bt_dim] + [int(d) for d in t.shape[1:]]
            strides = _strides(t)
            rank = 3
            if node is a_node:
                full_input = i
        else:
            sz, strides = mapped[node]
            shape = [bt_dim if sz[0] is None else 1] + list(sz[1:])
            strides = list(strides)
            rank = max(len(space[u]) for u in members if node in u.all_input_nodes)
        in_ranks.append(rank)
        align = _align_of(t)
        in_align.append(align)
        inputs.append({"id": i, "dtype": DTYPES[t.dtype], "shape": shape, "strides": strides, "align": align})

    outputs, out_strides, out_views = [], [], []
    for node in out_nodes:
        t = node.meta["val"]
        view = None
        if members.index(node) >= view_at and t.dim() != 3:
            # [B, H, M, N] after the view: stored as dense [Bt, M, N], viewed back at launch
            # (-1 for the one symbolic batch dim: view infers it)
            if not _dense_row_major(t):
                raise Unfusable(f"output {node.name} is not a dense view of [Bt, M, N]")
            view = tuple(int(d) if is_known_int(d) else -1 for d in t.shape)
            strides = [m * n, n, 1]
        else:
            if not (known_equal(t.shape[0], bt) and int(t.shape[1]) == m and int(t.shape[2]) == n):
                raise Unfusable(f"output {node.name} is not [Bt, M, N]")
            strides = _strides(t)
            if symbolic and not _outer_batch(list(t.shape), strides):
                strides = [m * n, n, 1]  # the runtime allocates outputs; row-major frees Bt
        out_views.append(view)
        outputs.append(
            {"id": e.ids[node], "dtype": DTYPES[t.dtype], "shape": [bt_dim, m, n], "strides": strides, "align": 16}
        )
        out_strides.append(strides)

    wire = {"vocab": VOCAB, "inputs": inputs, "ops": e.ops, "outputs": outputs}
    if symbolic:
        wire["m_hint"] = max(1, _hint(bt))
    built = Built(wire, BmmLayout(bt, m, n, symbolic), in_nodes, out_nodes, full_input, out_strides, in_align)
    built.gemm = True
    built.in_ranks = in_ranks  # the runtime's stride check collapses each input the same way
    built.out_views = out_views if any(out_views) else None
    return built


def _emit_product(e, mm):
    """bmm(A, B); baddbmm(input, A, B, beta, alpha) = beta * input + alpha * (A @ B), spelled
    as bmm, * alpha, + beta * input (vocabulary 4 has no baddbmm). beta 0: torch ignores the
    input, NaNs included, so it is not read."""
    prod = e.op("bmm", e.arg(mm.args[-2]), e.arg(mm.args[-1]))
    if mm.target is aten.bmm.default:
        return prod
    alpha, beta = mm.kwargs.get("alpha", 1), mm.kwargs.get("beta", 1)
    if alpha != 1:
        prod = e.op("mul", prod, e.const(alpha))
    if beta != 0:
        inp = e.arg(mm.args[0])
        if beta != 1:
            inp = e.op("mul", inp, e.const(beta))
        prod = e.op("add", prod, inp)
    return e.cast(prod, DTYPES[mm.meta["val"].dtype])


def _epilogue_operand(t, rank, bt, m, n, where):
    """An epilogue operand read in a space of `rank` dims, as ([b, m, n] sizes, strides) with
    b 1 (broadcast) or None (Bt). Refused when its batch dims do not collapse into one
    stride."""
    try:
        size, stride = collapse(t.shape, t.stride(), rank)
    except ValueError as e:
        raise Unfusable(f"{where}: {e}") from None
    b, rows, cols = size
    if not _is_one(b) and not known_equal(b, bt):
        raise Unfusable(
            f"{where}: broadcast over part of the batch dims (e.g. a [B, 1, S, S] "
            f"mask beside [B, H, S, S]): one batch stride cannot express it"
        )
    if not _is_one(rows) and not (is_known_int(rows) and int(rows) == m):
        raise Unfusable(f"{where}: dim -2 is {rows}, not M or 1")
    if not _is_one(cols) and not (is_known_int(cols) and int(cols) == n):
        raise Unfusable(f"{where}: dim -1 is {cols}, not N or 1")
    # wire-ready but for the batch: None where it is Bt (sent as -1 or Bt once the builder
    # knows whether the batch goes symbolic), 1 where broadcast; plain ints, so that two
    # mappings of one input compare without guards on symbolic sizes
    out_size, out_stride = [], []
    for d, s in zip(size, stride):
        if _is_one(d):
            out_size.append(1)
            out_stride.append(0)
            continue
        if not is_known_int(s):
            raise Unfusable(f"{where}: symbolic stride")
        out_size.append(None if len(out_size) == 0 else int(d))
        out_stride.append(int(s))
    return tuple(out_size), tuple(out_stride)
