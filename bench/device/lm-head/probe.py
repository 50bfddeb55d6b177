"""What an unaligned vocabulary costs cuBLAS, and what Inductor does about it (GPT-2's lm_head:
4096 tokens x 768 -> 50257, bf16). Prints one line per variant: median ms by CUDA events, and
output strides where a compiled function returns the logits."""

import torch
import torch.nn.functional as F

torch.manual_seed(0)
dev = "cuda"
M, K, N = 4096, 768, 50257
NP = 50304
a = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
W = torch.randn(N, K, device=dev, dtype=torch.bfloat16) * 0.02
Wp = torch.zeros(NP, K, device=dev, dtype=torch.bfloat16)
Wp[:N] = W
g = torch.randn(M, N, device=dev, dtype=torch.bfloat16)
gp = torch.zeros(M, NP, device=dev, dtype=torch.bfloat16)
gp[:, :N] = g
gview = gp[:, :N]
zrow = torch.zeros(1, NP - N, device=dev, dtype=torch.bfloat16)
zfull = torch.zeros(M, NP - N, device=dev, dtype=torch.bfloat16)
zcol = torch.zeros(NP - N, 1, device=dev, dtype=torch.bfloat16)


def t(fn, reps=20):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
        ts.append(s.elapsed_time(e))
    ts.sort()
    return ts[len(ts) // 2]


rows = [
    ("fwd mm(a, W.t()) unpadded", lambda: torch.mm(a, W.t())),
    ("fwd mm(a, Wp.t()) padded output", lambda: torch.mm(a, Wp.t())),
    ("fwd padded + slice.contiguous()", lambda: torch.mm(a, Wp.t())[:, :N].contiguous()),
    ("copy of padded logits to contiguous", lambda: gview.contiguous()),
    ("dgrad mm(g, W) unpadded (K=50257)", lambda: torch.mm(g, W)),
    ("dgrad mm(gview, W) strided g (lda 50304)", lambda: torch.mm(gview, W)),
    ("dgrad mm(gp, Wp) padded", lambda: torch.mm(gp, Wp)),
    ("wgrad mm(g.t(), a) unpadded (M=50257)", lambda: torch.mm(g.t(), a)),
    ("wgrad mm(gview.t(), a) strided", lambda: torch.mm(gview.t(), a)),
    ("wgrad mm(gp.t(), a) padded", lambda: torch.mm(gp.t(), a)),
    ("pad g -> gp (constant_pad_nd)", lambda: F.pad(g, (0, NP - N))),
    ("pad g as cat with expanded zeros", lambda: torch.cat([g, zrow.expand(M, NP - N)], 1)),
    ("pad g as cat with contiguous zeros", lambda: torch.cat([g, zfull], 1)),
    ("pad W as cat with expanded zeros (dim 0)", lambda: torch.cat([W, zcol.expand(NP - N, K)], 0)),
    ("pad W (constant_pad_nd, dim 0)", lambda: F.pad(W, (0, 0, 0, NP - N))),
    ("log_softmax fp32 of g", lambda: torch.log_softmax(g.float(), -1)),
]
for name, fn in rows:
    print(f"{name:48s} {t(fn):.4f} ms", flush=True)

f = torch.compile(lambda x, w: torch.mm(x, w.t()))
y = f(a, W)
print(f"inductor mm out stride {y.stride()} contiguous {y.is_contiguous()}; {t(lambda: f(a, W)):.4f} ms")
