"""The reference models of the Triton-based FuseML project's README, whose benchmark table
ours extends (MLP block, activation-heavy MLP, stacked MLP x4), and a SwiGLU Llama MLP, small
enough for CPU tests."""

import torch.nn as nn
import torch.nn.functional as F


class TransformerMLP(nn.Module):
    def __init__(self, d_model=32, d_intermediate=64):
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_intermediate)
        self.gelu = nn.GELU()
        self.linear2 = nn.Linear(d_intermediate, d_model)

    def forward(self, x):
        residual = x
        x = self.linear1(x)
        x = self.gelu(x)
        x = self.linear2(x)
        return x + residual


class ActivationHeavyMLP(TransformerMLP):
    def forward(self, x):
        residual = x
        x = self.linear1(x)
        x = self.gelu(x)
        x = x * 0.5
        x = x + 0.125
        x = self.linear2(x)
        return x + residual


class StackedTransformerMLP(nn.Module):
    def __init__(self, d_model=32, d_intermediate=64, num_blocks=4):
        super().__init__()
        self.blocks = nn.ModuleList([TransformerMLP(d_model, d_intermediate) for _ in range(num_blocks)])

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


class LlamaMLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)), no biases, as in Llama."""

    def __init__(self, d_model=32, d_intermediate=64):
        super().__init__()
        self.gate_proj = nn.Linear(d_model, d_intermediate, bias=False)
        self.up_proj = nn.Linear(d_model, d_intermediate, bias=False)
        self.down_proj = nn.Linear(d_intermediate, d_model, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


MODELS = {
    "mlp": TransformerMLP,
    "activation_heavy": ActivationHeavyMLP,
    "stacked": StackedTransformerMLP,
    "llama_mlp": LlamaMLP,
}
