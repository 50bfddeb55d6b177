"""Which kind of code a GPU kernel is, from its name: the classes of the GPU-time breakdown.
The first row whose pattern matches names the class (lower-cased substring match), so the
order matters: a cuBLAS kernel whose name holds "copy" is still cuBLAS, an ATen copy is an
elementwise kernel by its template but counts as a copy."""

CLASSES = (
    # class                      substrings of the kernel name
    ("fuseml", ("fm_",)),  # tested as a prefix, below
    ("triton", ("triton",)),
    (
        "cublas/cudnn/flash",
        (
            "nvjet",
            "xmma",
            "cutlass",
            "gemm",
            "gemv",
            "cublas",
            "flash",
            "fmha",
            "cudnn",
            "conv",
            "dgrad",
            "wgrad",
            "splitk",
            "attention",
        ),
    ),
    ("aten copy/cat", ("copy", "catarray", "transpose", "permute")),
    ("aten elementwise", ("elementwise_kernel",)),
    (
        "aten reduction/norm",
        (
            "reduce",
            "softmax",
            "norm",
            "cross_entropy",
            "nll_loss",
            "welford",
            "batch_norm",
            "moments",
            "scan",
            "sort",
            "topk",
        ),
    ),
    ("aten index/embedding", ("index", "gather", "scatter", "embedding")),
)
MEMCPY = "memcpy/memset"
OTHER = "other"
ORDER = [c for c, _ in CLASSES] + [MEMCPY, OTHER]


def classify(name):
    """The class of a kernel (or memcpy/memset activity) called `name`."""
    low = name.lower()
    if low.startswith("memcpy") or low.startswith("memset"):
        return MEMCPY
    if low.startswith("fm_"):
        return "fuseml"
    for cls, subs in CLASSES[1:]:
        if any(s in low for s in subs):
            return cls
    return OTHER
