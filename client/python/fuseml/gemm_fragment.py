"""A GEMM group (mm or addmm, then a pointwise epilogue over its [M, N] result) -> a
vocabulary-3 fragment (protocol/PROTOCOL.md, "GEMM fragments") and its launch layout.

A sibling group (siblings.py) has two products of one A by B and B2 ([K, N] each), both
[M, N] values of one epilogue: the same fragment with two mm/addmm ops whose A is one input
id. The products are emitted first (they read only inputs), then the epilogue in graph order.

A chain group (chains.py) has two products in sequence, the second's A computed from the
first: build_chain spells it, ops in graph order.

M is sent as the symbolic dim 0 whenever no stride depends on it (A and every [M, N] operand
row-major), with `m_hint` = the M at hand: the daemon tunes for that M's power-of-two bucket,
and another batch size in the bucket reuses the kernel instead of compiling a new one."""

from .fragment import Built, Emitter, Unfusable, _align_of
from .ops import DTYPES, RESHAPE_OPS, products
from .shapes import is_known_int, known_equal, size_at_hand

VOCAB = 3


def _hint(x):
    """The concrete value of a size, symbolic or not."""
    v = size_at_hand(x)
    if v is None:
        raise Unfusable("a symbolic size without a hint")
    return v


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
    with_m = [a_node.meta["val"]] + [
        x.meta["val"]
        for x in in_nodes
        if x is not a_node and x not in b_nodes and x.meta["val"].dim() >= 2 and x.meta["val"].shape[-2] != 1
    ]
    symbolic, m_dim = _symbolic_m(m, with_m)

    e = Emitter(in_nodes)
    for p in prods:
        args = [e.arg(x) for x in p.args]
        e.ids[p] = e.op("addmm" if len(args) == 3 else "mm", *args)
    for node in members:
        if node in prods:
            continue
        if node.target in RESHAPE_OPS:  # [M, N] seen as [B, S, N]: the same elements
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
        inputs.append({"id": i, "dtype": DTYPES[t.dtype], "shape": shape, "strides": strides, "align": align})
    return _finish(
        e, inputs, in_nodes, in_align, full_input, out_nodes, m, n, m_dim, symbolic, siblings=len(prods) == 2
    )


def _finish(e, inputs, in_nodes, in_align, full_input, out_nodes, m, n, m_dim, symbolic, siblings=False, chain=False):
    """The outputs ([M, N] each, or a dense [B, S, N] view of it) and the Built."""
    outputs, out_strides, out_views = [], [], []
    for node in out_nodes:
        t = node.meta["val"]
        view = None
        if t.dim() > 2:  # [B, S, N] after a view: stored as [M, N]
            if not t.is_contiguous() or _rows(t) != _hint(m) or int(t.shape[-1]) != n:
                raise Unfusable(f"output {node.name} is not a dense view of [M, N]")
            view = tuple(int(d) for d in t.shape)
            strides = [n, 1]
        elif not known_equal(t.shape[0], m) or int(t.shape[1]) != n:
            raise Unfusable(f"output {node.name} is not [M, N]")
        else:
            strides = _strides(t)
        out_views.append(view)
        if symbolic and not _row_major(t):
            strides = [n, 1]  # the runtime allocates outputs; row-major keeps M free
        outputs.append(
            {"id": e.ids[node], "dtype": DTYPES[t.dtype], "shape": [m_dim, n], "strides": strides, "align": 16}
        )
        out_strides.append(strides)
    wire = {"vocab": VOCAB, "inputs": inputs, "ops": e.ops, "outputs": outputs}
    if symbolic:
        wire["m_hint"] = max(1, _hint(m))
    built = Built(wire, GemmLayout(m, n, symbolic), in_nodes, out_nodes, full_input, out_strides, in_align)
    built.gemm = True
    built.siblings = siblings
    built.chain = chain
    built.out_views = out_views if any(out_views) else None
    return built


def _symbolic_m(m, with_m):
    """Whether M goes symbolic: every tensor with the M dim row-major (static strides)."""
    symbolic = (not is_known_int(m)) or all(_row_major(t) for t in with_m)
    if not is_known_int(m) and not symbolic:
        raise Unfusable("a symbolic M with a column-major operand")
    return symbolic, (-1 if symbolic else int(m))


def build_chain(members, in_nodes, out_nodes):
    """A chain group (chains.py): p1 = x @ W1 (+ b1), its stage-1 epilogue up to h, p2 = h @ W2
    (+ b2), its stage-2 epilogue (PROTOCOL.md, GEMM fragments, "Chains"). Ops in graph order
    (p1 first: the products are spelled like any op, p2's A the value id of h; a view of h to
    [M, N1] is an alias). Inputs in the group's order; a stage-1 input is read over [M, N1],
    a stage-2 one over [M, N2]; outputs (stage 2 only) as for one GEMM. When stage 2 reads x
    (the MLP's residual), x is sent a second time, as an epilogue input of its own: the
    daemon lets nothing else read a matrix operand's value (it is streamed, not addressable
    per output element), and the kernel reads the same memory through two parameters. The
    Built's in_nodes then name x twice: the group is called with that list."""
    prods = products(members)
    if len(prods) != 2:
        raise Unfusable("a chain has two products")
    p1, p2 = prods
    x, w1, w2 = p1.args[-2], p1.args[-1], p2.args[-1]
    # stage 2: the second product and everything computed from it
    stage2 = set()
    for node in members:
        if node is p2 or any(a in stage2 for a in node.all_input_nodes):
            stage2.add(node)
    reads = {}  # input node -> the stages that read it as an epilogue operand
    for node in members:
        for b in node.all_input_nodes:
            if (node is p1 and b in (x, w1)) or (node is p2 and b in (p2.args[-2], w2)):
                continue
            reads.setdefault(b, set()).add(2 if node in stage2 else 1)
    if 1 in reads.get(x, ()) or any(b in reads for b in (w1, w2)):
        raise Unfusable("an epilogue op reads a product's matrix operand")
    in_nodes = list(in_nodes) + ([x] if x in reads else [])
    tx, t1, t2 = x.meta["val"], w1.meta["val"], w2.meta["val"]
    m, n1, n2 = tx.shape[0], int(t1.shape[1]), int(t2.shape[1])
    with_m = [tx] + [b.meta["val"] for b in reads if b.meta["val"].dim() >= 2 and b.meta["val"].shape[-2] != 1]
    symbolic, m_dim = _symbolic_m(m, with_m)

    e = Emitter(in_nodes)
    a_id = in_nodes.index(x)  # the first x: the matrix operand (e.ids names the last)
    for node in members:
        if node is p1:
            e.ids[node] = e.op(
                "addmm" if len(node.args) == 3 else "mm", *[e.arg(b) for b in node.args[:-2]], a_id, e.arg(w1)
            )
        elif node is p2:
            e.ids[node] = e.op("addmm" if len(node.args) == 3 else "mm", *[e.arg(b) for b in node.args])
        elif node.target in RESHAPE_OPS:  # [M, N] seen as [B, S, N] and back: one value
            e.ids[node] = e.ids[node.args[0]]
        else:
            e.emit_node(node)

    inputs, in_align, full_input = [], [], None
    for i, node in enumerate(in_nodes):
        t = node.meta["val"]
        if node in (w1, w2):
            shape, strides = [int(d) for d in t.shape], [int(s) for s in t.stride()]
        elif node is x and full_input is None:
            shape, strides = [m_dim, int(t.shape[1])], _strides(t)
            full_input = i
        else:
            specs = {
                tuple(map(tuple, _broadcast(t, m, (n1, n2)[s - 1], m_dim, f"input {node.name} (stage {s})")))
                for s in sorted(reads[node])
            }
            if len(specs) != 1:
                raise Unfusable(f"input {node.name} is read in both stages and broadcasts " "differently to each")
            shape, strides = (list(v) for v in specs.pop())
        align = _align_of(t)
        in_align.append(align)
        inputs.append({"id": i, "dtype": DTYPES[t.dtype], "shape": shape, "strides": strides, "align": align})
    return _finish(e, inputs, in_nodes, in_align, full_input, out_nodes, m, n2, m_dim, symbolic, chain=True)


def _rows(t):
    rows = 1
    for d in t.shape[:-1]:
        rows *= int(d)
    return rows


def _strides(t):
    st = t.stride()
    if not all(is_known_int(s) for s in st):
        raise Unfusable("symbolic strides")
    return [int(s) for s in st]


def _broadcast(t, m, n, m_dim, where):
    """An epilogue operand right-aligned to [M, N]: rank 0 -> [1, 1], [N] -> [1, N]."""
    size, stride = list(t.shape), list(t.stride())
    if len(size) > 2:
        # [B, S, N] beside a GEMM seen through a view: dense across the leading dims, it is
        # [M, N] with the stride of its second-to-last dim (or a row broadcast: [1, N])
        if not all(is_known_int(d) for d in size[:-1]) or not all(is_known_int(s) for s in stride):
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
        if is_known_int(sz) and int(sz) == 1:
            shape.append(1)
            strides.append(0)
            continue
        if d == 0 and not known_equal(sz, m):
            raise Unfusable(f"{where}: dim 0 is {sz}, not M or 1")
        if d == 1 and (not is_known_int(sz) or int(sz) != n):
            raise Unfusable(f"{where}: dim 1 is {sz}, not N or 1")
        if not is_known_int(st):
            raise Unfusable(f"{where}: symbolic stride")
        shape.append(m_dim if d == 0 else int(sz))
        strides.append(int(st))
    return shape, strides
