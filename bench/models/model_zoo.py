"""The model set: real architectures from `transformers` and `timm`, random weights, configs
in code (nothing is downloaded). Each entry builds the model in bf16 on a device, one fixed
batch, the forward output that an inference step returns and the loss a training step
differentiates. Three sizes:

- small: about 4 layers, d 768-1024, about 4k tokens a step (the host matters);
- large: the GPU-bound size (Llama only: d 2048, 4 x 1024 tokens);
- tiny: a few hundred parameters' worth of each architecture, for the CPU smoke test.

Dropout is 0 everywhere, so a step is deterministic and comparable with its fp32 copy;
FM_MODELS_DROPOUT=1 leaves each transformers config's own dropout (0.1 in GPT-2, BERT and
T5) on, as a user trains them (the error columns then compare different random masks)."""

import copy
import dataclasses
import os

import torch
import torch.nn.functional as F


@dataclasses.dataclass
class Workload:
    """One model at one size: `model` (bf16), `inputs` (the keyword arguments of one step),
    `forward(fn, inputs)` (the tensor an inference step returns), `loss(fn, inputs)` (the
    scalar a training step differentiates), `describe` (shapes, for the tables)."""

    name: str
    size: str
    model: torch.nn.Module
    inputs: dict
    forward: object
    loss: object
    describe: str

    def fp32_copy(self):
        """The fp32 reference: the same weights and inputs, in fp32."""
        ref = copy.deepcopy(self.model).float()
        inputs = {k: v.float() if v.is_floating_point() else v for k, v in self.inputs.items()}
        return ref, inputs


# the transformers configs' dropout probabilities, set to 0 unless FM_MODELS_DROPOUT=1
DROPOUT_KEYS = (
    "attention_dropout",
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
    "resid_pdrop",
    "embd_pdrop",
    "attn_pdrop",
    "dropout_rate",
)


def _hf(cls, cfg, attn="sdpa"):
    """A transformers model from its config with `attn` attention (SDPA but where the model
    needs eager), random weights."""
    cfg.use_cache = False
    if os.environ.get("FM_MODELS_DROPOUT") != "1":
        for key in DROPOUT_KEYS:
            if hasattr(cfg, key):
                setattr(cfg, key, 0.0)
    cfg._attn_implementation = attn
    return cls(cfg)


def _tokens(vocab, batch, seq, dev, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, seq), generator=g).to(dev)


def _causal_lm(model, vocab, batch, seq, dev):
    ids = _tokens(vocab, batch, seq, dev)
    inputs = {"input_ids": ids, "labels": ids}

    def forward(fn, inp):
        return fn(input_ids=inp["input_ids"]).logits

    def loss(fn, inp):
        return fn(**inp).loss

    return inputs, forward, loss


# -- the architectures: (builder of the HF/timm model, inputs) per size ----------------------

# Decoder shapes: d, intermediate, heads, kv heads, layers, vocab, batch, seq.
_DECODERS = {
    ("llama", "small"): (1024, 2816, 16, 16, 4, 32000, 8, 512),
    ("llama", "large"): (2048, 5632, 16, 16, 4, 32000, 4, 1024),
    ("llama", "tiny"): (64, 176, 4, 4, 2, 256, 2, 16),
    ("gqa", "small"): (1024, 3584, 16, 4, 4, 32768, 8, 512),
    ("gqa", "tiny"): (64, 224, 4, 2, 2, 256, 2, 16),
    ("moe", "small"): (1024, 1792, 16, 4, 4, 32000, 8, 512),
    ("moe", "tiny"): (64, 112, 4, 2, 2, 256, 2, 16),
    ("gemma2", "small"): (1024, 4096, 8, 4, 4, 32000, 8, 512),
    ("gemma2", "tiny"): (64, 128, 4, 2, 2, 256, 2, 16),
}


# Decoder families: transformers' config and model class names, what each adds to the
# shared shape (Mistral: grouped-query attention, 4 query heads per key/value head; Mixtral:
# 8 experts, 2 routed per token), and the label's head.
_DECODER_KINDS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}, "Llama"),
    "gqa": ("MistralConfig", "MistralForCausalLM", {"sliding_window": None}, "Mistral (GQA)"),
    "moe": (
        "MixtralConfig",
        "MixtralForCausalLM",
        {"num_local_experts": 8, "num_experts_per_tok": 2, "sliding_window": None, "output_router_logits": False},
        "Mixtral 8x top-2",
    ),
    # soft-capped attention logits (50) and final logits (30), which SDPA cannot apply: Gemma 2
    # is trained with eager attention (transformers says so); tied embeddings, GeGLU
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", {"_attn": "eager"}, "Gemma 2"),
}


def _decoder(key):
    def build(size, dev):
        import transformers as tf

        config, cls, extra, label = _DECODER_KINDS[key]
        extra = dict(extra)
        attn = extra.pop("_attn", "sdpa")
        d, inter, heads, kv, layers, vocab, batch, seq = _DECODERS[(key, size)]
        cfg = getattr(tf, config)(
            vocab_size=vocab,
            hidden_size=d,
            intermediate_size=inter,
            num_attention_heads=heads,
            num_key_value_heads=kv,
            num_hidden_layers=layers,
            head_dim=d // heads,
            max_position_embeddings=max(2048, seq),
            **extra,
        )
        return (
            _hf(getattr(tf, cls), cfg, attn),
            _causal_lm,
            (vocab, batch, seq),
            f"{label} d{d} ff{inter} h{heads}/{kv} L{layers}, {batch}x{seq} tokens",
        )

    return build


_GPT2 = {"small": (768, 12, 4, 50257, 8, 512), "tiny": (64, 4, 2, 256, 2, 16)}


def gpt2(size, dev):
    import transformers as tf

    d, heads, layers, vocab, batch, seq = _GPT2[size]
    cfg = tf.GPT2Config(
        vocab_size=vocab,
        n_embd=d,
        n_head=heads,
        n_layer=layers,
        n_positions=max(1024, seq),
        bos_token_id=vocab - 1,
        eos_token_id=vocab - 1,
    )
    return (
        _hf(tf.GPT2LMHeadModel, cfg),
        _causal_lm,
        (vocab, batch, seq),
        f"GPT-2 d{d} h{heads} L{layers}, {batch}x{seq} tokens",
    )


_BERT = {"small": (768, 3072, 12, 4, 30522, 8, 512), "tiny": (64, 128, 4, 2, 256, 2, 16)}


def _masked_lm(model, vocab, batch, seq, dev):
    """BERT's masked-LM step over a padded batch: the second half of the batch has its last
    quarter of tokens padded (attention mask 0, labels ignored), as a real batch would."""
    ids = _tokens(vocab, batch, seq, dev)
    mask = torch.ones(batch, seq, dtype=torch.long, device=dev)
    mask[batch // 2 :, seq - seq // 4 :] = 0
    labels = ids.masked_fill(mask == 0, -100)
    inputs = {"input_ids": ids, "attention_mask": mask, "labels": labels}

    def forward(fn, inp):
        return fn(input_ids=inp["input_ids"], attention_mask=inp["attention_mask"]).logits

    def loss(fn, inp):
        return fn(**inp).loss

    return inputs, forward, loss


def bert(size, dev):
    import transformers as tf

    d, inter, heads, layers, vocab, batch, seq = _BERT[size]
    cfg = tf.BertConfig(
        vocab_size=vocab,
        hidden_size=d,
        intermediate_size=inter,
        num_attention_heads=heads,
        num_hidden_layers=layers,
        max_position_embeddings=max(512, seq),
    )
    return (
        _hf(tf.BertForMaskedLM, cfg),
        _masked_lm,
        (vocab, batch, seq),
        f"BERT d{d} ff{inter} h{heads} L{layers}, {batch}x{seq} tokens (padded)",
    )


# d, d_ff, heads, layers (each stack), vocab, batch, encoder seq, decoder seq
_T5 = {"small": (768, 2048, 12, 4, 32128, 8, 512, 128), "tiny": (64, 128, 4, 2, 256, 2, 16, 8)}


def t5(size, dev):
    """T5 v1.1 style: gated GELU feed-forward, relative attention bias, encoder + decoder."""
    import transformers as tf

    d, ff, heads, layers, vocab, batch, seq, dec = _T5[size]
    cfg = tf.T5Config(
        vocab_size=vocab,
        d_model=d,
        d_kv=d // heads,
        d_ff=ff,
        num_heads=heads,
        num_layers=layers,
        num_decoder_layers=layers,
        feed_forward_proj="gated-gelu",
        tie_word_embeddings=False,
        decoder_start_token_id=0,
        pad_token_id=0,
    )
    return (
        _hf(tf.T5ForConditionalGeneration, cfg),
        _seq2seq(dec),
        (vocab, batch, seq),
        f"T5 (gated GELU) d{d} ff{ff} h{heads} L{layers}+{layers}, {batch}x{seq} -> {batch}x{dec} tokens",
    )


def _seq2seq(dec):
    def make(model, vocab, batch, seq, dev):
        ids = _tokens(vocab, batch, seq, dev)
        labels = _tokens(vocab, batch, dec, dev, seed=2)
        inputs = {"input_ids": ids, "labels": labels}

        def forward(fn, inp):
            # the decoder's input is the labels shifted right, as the training step builds it
            start = torch.zeros_like(inp["labels"][:, :1])
            dec_in = torch.cat([start, inp["labels"][:, :-1]], dim=1)
            return fn(input_ids=inp["input_ids"], decoder_input_ids=dec_in).logits

        def loss(fn, inp):
            return fn(**inp).loss

        return inputs, forward, loss

    return make


# timm: model name, its keyword arguments, batch, image side
_TIMM = {
    ("vit", "small"): ("vit_small_patch16_224", {"depth": 4}, 64, 224),
    ("vit", "tiny"): (
        "vit_small_patch16_224",
        {"depth": 1, "embed_dim": 64, "num_heads": 4, "img_size": 32, "num_classes": 10},
        2,
        32,
    ),
    ("convnet", "small"): ("resnet50", {}, 64, 224),
    # batch statistics over 4 images of 64 x 64 pixels: the last stage's BatchNorm sees 16
    # values a channel (at 2 x 32 x 32 it saw 2, and bf16 against fp32 gradients drifted apart)
    ("convnet", "tiny"): ("resnet18", {"num_classes": 10}, 4, 64),
}


def _classifier(model, classes, batch, side, dev):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(batch, 3, side, side, generator=g).to(dev, torch.bfloat16)
    y = torch.randint(0, classes, (batch,), generator=g).to(dev)
    inputs = {"x": x, "y": y}

    def forward(fn, inp):
        return fn(inp["x"])

    def loss(fn, inp):
        return F.cross_entropy(fn(inp["x"]).float(), inp["y"])

    return inputs, forward, loss


def _timm(key):
    def build(size, dev):
        import timm

        name, kwargs, batch, side = _TIMM[(key, size)]
        model = timm.create_model(name, pretrained=False, **kwargs)
        shape = f"{batch}x3x{side}x{side}"
        extra = f" depth {kwargs['depth']}" if "depth" in kwargs else ""
        return model, _classifier, (model.num_classes, batch, side), f"timm {name}{extra}, {shape}"

    return build


# The table: model name -> (builder, the sizes it has besides tiny)
MODELS = {
    "llama": (_decoder("llama"), ("small", "large")),
    "gqa": (_decoder("gqa"), ("small",)),
    "gpt2": (gpt2, ("small",)),
    "bert": (bert, ("small",)),
    "t5": (t5, ("small",)),
    "vit": (_timm("vit"), ("small",)),
    "convnet": (_timm("convnet"), ("small",)),
    "moe": (_decoder("moe"), ("small",)),
    "gemma2": (_decoder("gemma2"), ("small",)),
}


def build(name, size, dev, seed=0):
    """The Workload `name` at `size` on `dev`, bf16, weights seeded (the same in every process
    that asks for the same name, size and seed). An unknown name or size is a ValueError."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(MODELS)}")
    builder, sizes = MODELS[name]
    if size not in sizes + ("tiny",):
        raise ValueError(f"model {name!r} has no size {size!r}; it has {', '.join(sizes + ('tiny',))}")
    torch.manual_seed(seed)
    with torch.device(dev):
        model, make_inputs, shape, describe = builder(size, dev)
    model = model.to(device=dev, dtype=torch.bfloat16)
    inputs, forward, loss = make_inputs(model, *shape, dev)
    return Workload(name, size, model, inputs, forward, loss, describe)
