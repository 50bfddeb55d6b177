"""A GEMM group (mm or addmm, then a pointwise epilogue over its [M, N] result) -> a
vocabulary-3 fragment (protocol/PROTOCOL.md, "GEMM fragments") and its launch layout.

A sibling group (siblings.py) has two products of one A by B and B2 ([K, N] each), both
[M, N] values of one epilogue: the same fragment with two mm/addmm ops whose A is one input
id. The products are emitted first (they read only inputs), then the epilogue in graph order.

M is sent as the symbolic dim 0 whenever no stride depends on it (A and every [M, N] operand
row-major), with `m_hint` = the M at hand: the daemon tunes for that M's power-of-two bucket,
and another batch size in the bucket reuses the kernel instead of compiling a new one."""
from .fragment import Built, Emitter, Unfusable, _align_of, _same, _static
from .ops import DTYPES, RESHAPE_OPS, products

VOCAB = 3


def _hint(x):
    """The concrete value of a size, symbolic or not."""
    if _static(x):
        return int(x)
    try:
        return int(x.node.hint)
    except (AttributeError, TypeError):
        raise Unfusable("a symbolic size without a hint") from None


class GemmLayout:
    """What the runtime needs of the iteration space [M, N]: k = 1 when M is the symbolic
    dim 0 (its size comes from input `full_input`'s dim 0 at launch), else 0."""

    def __init__(self, m, n, symbolic):
        self.k = 1 if symbolic else 0
        self.shape = [m, n]


def _row_major(t):
    """dim 0's stride does not depend on dim 0's size."""
    return t.shape[1] == 1 or t.stride()[1] == 1 or t.shape[0] == 1


def build_gemm(members, in_nodes, out_nodes):
    """members: the matmul node (or two sibling ones) and the epilogue (graph order); in_nodes:
    the group's tensor inputs (fragment order); out_nodes: the members whose values leave the
    group."""
    prods = products(members)
    mm = prods[0]
    a_node = mm.args[-2]
    b_nodes = [p.args[-1] for p in prods]
    if any(p.args[-2] is not a_node for p in prods[1:]):
        raise Unfusable("the sibling products read different A's")
    if len(set(b_nodes)) != len(b_nodes):
        raise Unfusable("the sibling products read the same B")
    ta, tb = a_node.meta["val"], b_nodes[0].meta["val"]
    m, n = ta.shape[0], int(tb.shape[1])
    # Every tensor with the M dim must allow a symbolic M: row-major, static strides.
    with_m = [a_node.meta["val"]] + [x.meta["val"] for x in in_nodes
                                      if x is not a_node and x not in b_nodes
                                      and x.meta["val"].dim() >= 2 and x.meta["val"].shape[-2] != 1]
    symbolic = (not _static(m)) or all(_row_major(t) for t in with_m)
    if not _static(m) and not symbolic:
        raise Unfusable("a symbolic M with a column-major operand")
    m_dim = -1 if symbolic else int(m)

    e = Emitter(in_nodes)
    for p in prods:
        args = [e.arg(x) for x in p.args]
        e.ids[p] = e.op("addmm" if len(args) == 3 else "mm", *args)
    for node in members:
        if node in prods:
            continue
        if node.target in RESHAPE_OPS:      # [M, N] seen as [B, S, N]: the same elements
            e.ids[node] = e.ids[node.args[0]]
            continue
        e.emit_node(node)

    inputs, in_align = [], []
    full_input = None
    for i, node in enumerate(in_nodes):
        t = node.meta["val"]
        if node is a_node and node in b_nodes:
            raise Unfusable("A and B are one tensor")
        if node in b_nodes:
            shape, strides = [int(d) for d in t.shape], [int(s) for s in t.stride()]
        elif node is a_node:
            shape, strides = [m_dim, int(t.shape[1])], _strides(t)
            full_input = i
        else:
            shape, strides = _broadcast(t, m, n, m_dim, f"input {node.name}")
        align = _align_of(t)
        in_align.append(align)
        inputs.append({"id": i, "dtype": DTYPES[t.dtype], "shape": shape, "strides": strides,
                       "align": align})
    outputs, out_strides, out_views = [], [], []
    for node in out_nodes:
        t = node.meta["val"]
        view = None
        if t.dim() > 2:                     # [B, S, N] after a view: stored as [M, N]
            if not t.is_contiguous() or _rows(t) != _hint(m) or int(t.shape[-1]) != n:
                raise Unfusable(f"output {node.name} is not a dense view of [M, N]")
            view = tuple(int(d) for d in t.shape)
            strides = [n, 1]
        elif not _same(t.shape[0], m) or int(t.shape[1]) != n:
            raise Unfusable(f"output {node.name} is not [M, N]")
        else:
            strides = _strides(t)
        out_views.append(view)
        if symbolic and not _row_major(t):
            strides = [n, 1]   # the runtime allocates outputs; row-major keeps M free
        outputs.append({"id": e.ids[node], "dtype": DTYPES[t.dtype], "shape": [m_dim, n],
                        "strides": strides, "align": 16})
        out_strides.append(strides)
    wire = {"vocab": VOCAB, "inputs": inputs, "ops": e.ops, "outputs": outputs}
    if symbolic:
        wire["m_hint"] = max(1, _hint(m))
    built = Built(wire, GemmLayout(m, n, symbolic), in_nodes, out_nodes, full_input,
                  out_strides, in_align)
    built.gemm = True
    built.siblings = len(prods) == 2
    built.out_views = out_views if any(out_views) else None
    return built


def _rows(t):
    rows = 1
    for d in t.shape[:-1]:
        rows *= int(d)
    return rows


def _strides(t):
    st = t.stride()
    if not all(_static(s) for s in st):
        raise Unfusable("symbolic strides")
    return [int(s) for s in st]


def _broadcast(t, m, n, m_dim, where):
    """An epilogue operand right-aligned to [M, N]: rank 0 -> [1, 1], [N] -> [1, N]."""
    size, stride = list(t.shape), list(t.stride())
    if len(size) > 2:
        # [B, S, N] beside a GEMM seen through a view: dense across the leading dims, it is
        # [M, N] with the stride of its second-to-last dim (or a row broadcast: [1, N])
        if not all(_static(d) for d in size[:-1]) or not all(_static(s) for s in stride):
            raise Unfusable(f"{where}: symbolic sizes in a GEMM epilogue operand of rank {len(size)}")
        lead = [int(d) for d in size[:-2]]
        if all(d == 1 for d in lead):
            size, stride = size[-2:], stride[-2:]
        else:
            for i in range(len(size) - 2):
                if int(size[i + 1]) > 1 and int(stride[i]) != int(stride[i + 1]) * int(size[i + 1]):
                    raise Unfusable(f"{where}: not dense across its leading dims")
            rows = 1
            for d in size[:-1]:
                rows *= int(d)
            size, stride = [rows, size[-1]], [stride[-2], stride[-1]]
    size = [1] * (2 - len(size)) + size
    stride = [0] * (2 - len(stride)) + stride
    shape, strides = [], []
    for d, (sz, st) in enumerate(zip(size, stride)):
        if _static(sz) and int(sz) == 1:
            shape.append(1)
            strides.append(0)
            continue
        if d == 0 and not _same(sz, m):
            raise Unfusable(f"{where}: dim 0 is {sz}, not M or 1")
        if d == 1 and (not _static(sz) or int(sz) != n):
            raise Unfusable(f"{where}: dim 1 is {sz}, not N or 1")
        if not _static(st):
            raise Unfusable(f"{where}: symbolic stride")
        shape.append(m_dim if d == 0 else int(sz))
        strides.append(int(st))
    return shape, strides
