"""The workloads and presets of the benchmark table: the models, one step of each
(inference forward, or forward + backward for mlp_train), and the floor's two numbers (the
fewest HBM bytes and the flops of one step)."""

import torch
import torch.nn as nn

# (M, d_model, d_intermediate); "tiny" is the CPU smoke preset, not part of the table.
PRESETS = {
    "small": (128, 256, 1024),
    "memory_bound": (16384, 256, 1024),
    "medium": (2048, 1024, 4096),
    "large": (16384, 4096, 16384),
    "decode": (8, 4096, 11008),
    "prefill": (4096, 4096, 11008),
    "tiny": (16, 32, 64),
}
TABLE_PRESETS = ["small", "memory_bound", "medium", "large", "decode", "prefill"]
WORKLOADS = ["mlp", "heavy", "stacked", "llama_mlp", "mlp_train"]
LABELS = {
    "mlp": "MLP block",
    "heavy": "Activation-heavy MLP",
    "stacked": "Stacked MLP x4",
    "llama_mlp": "Llama MLP",
    "mlp_train": "MLP block train step",
}


class TransformerMLP(nn.Module):
    """Linear -> GELU -> Linear -> + residual (the reference's MLP block)."""

    def __init__(self, d_model, d_intermediate):
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_intermediate)
        self.gelu = nn.GELU()
        self.linear2 = nn.Linear(d_intermediate, d_model)

    def forward(self, x):
        return self.linear2(self.gelu(self.linear1(x))) + x


class ActivationHeavyMLP(TransformerMLP):
    """Linear -> GELU -> x0.5 -> +0.125 -> Linear -> + residual."""

    def forward(self, x):
        h = self.gelu(self.linear1(x)) * 0.5 + 0.125
        return self.linear2(h) + x


class StackedMLP(nn.Module):
    def __init__(self, d_model, d_intermediate, blocks=4):
        super().__init__()
        self.blocks = nn.ModuleList([TransformerMLP(d_model, d_intermediate) for _ in range(blocks)])

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x


class RMSNorm(nn.Module):
    """As Llama (Hugging Face LlamaRMSNorm): fp32 statistics, scaled in the input dtype."""

    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


class LlamaBlockMLP(nn.Module):
    """The MLP half of a Llama block: RMSNorm -> gate/up -> SiLU(gate) * up -> down -> + residual."""

    def __init__(self, d_model, d_intermediate):
        super().__init__()
        self.norm = RMSNorm(d_model)
        self.gate_proj = nn.Linear(d_model, d_intermediate, bias=False)
        self.up_proj = nn.Linear(d_model, d_intermediate, bias=False)
        self.down_proj = nn.Linear(d_intermediate, d_model, bias=False)

    def forward(self, x):
        h = self.norm(x)
        return self.down_proj(nn.functional.silu(self.gate_proj(h)) * self.up_proj(h)) + x


_MODELS = {
    "mlp": TransformerMLP,
    "heavy": ActivationHeavyMLP,
    "stacked": StackedMLP,
    "llama_mlp": LlamaBlockMLP,
    "mlp_train": TransformerMLP,
}


def is_train(workload):
    return workload == "mlp_train"


def make_model(workload, d_model, d_intermediate, device, dtype, seed=0):
    torch.manual_seed(seed)
    m = _MODELS[workload](d_model, d_intermediate)
    # Default Linear init gives outputs of ~unit scale for unit inputs: no overflow in bf16.
    return m.to(device=device, dtype=dtype)


def make_inputs(workload, M, d_model, device, dtype, count, seed=1):
    """`count` input buffers of one shape (the same for every column of a row), and for a
    training step the fixed output gradient."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    xs = [torch.randn(M, d_model, generator=g).to(device=device, dtype=dtype) for _ in range(count)]
    gy = torch.randn(M, d_model, generator=g).to(device=device, dtype=dtype) if is_train(workload) else None
    if is_train(workload):
        for x in xs:
            x.requires_grad_(True)
    return xs, gy


def make_step(workload, fn, model, gy):
    """One step of `fn` (the model, eager or compiled) on input x: returns what the step
    produced (the output, and for a training step the input and parameter gradients)."""
    if is_train(workload):
        params = list(model.parameters())

        def step(x):
            for p in params:
                p.grad = None
            x.grad = None
            y = fn(x)
            y.backward(gy)
            return [y.detach(), x.grad] + [p.grad for p in params]

        return step

    def infer(x):
        with torch.no_grad():
            return [fn(x)]

    return infer


def step_flops(workload, M, d, di):
    gemm = 2 * M * d * di  # one [M, d] x [d, di] GEMM
    per = {"mlp": 2, "heavy": 2, "stacked": 8, "llama_mlp": 3, "mlp_train": 6}[workload]
    return per * gemm


def step_min_bytes(workload, model, M, d, elem=2):
    """The fewest bytes a step must move: every input and parameter read once, every output
    written once (for a training step also the output gradient read, and the input and
    parameter gradients written). Intermediates cost nothing here: it is a floor."""
    params = sum(p.numel() for p in model.parameters())
    if is_train(workload):
        return elem * (4 * M * d + 2 * params)  # x, gy read; y, dx written; params read, grads written
    return elem * (2 * M * d + params)
