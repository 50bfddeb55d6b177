"""The torch.compile backend: aot_autograd capture (forward, backward and inference graphs,
each partitioned and fused on its own), fragment building, one pipelined round of compile
requests per graph (and a second for the combined groups the daemon refused, split apart),
and the graph rewrite that calls `fuseml::group` for each fused group."""

import contextlib
import copy
import operator
import weakref

import torch
from torch._decomp import get_decompositions
from torch._dynamo.backends.common import aot_autograd
from functorch.compile import min_cut_rematerialization_partition

from . import (
    aot_cache,
    boxed_fx,
    channels_last,
    const_fold,
    cross_entropy,
    cudagraphs,
    direct_call,
    fake_meta,
    fresh_buffers,
    graph_breaks,
    graph_choice,
    graph_code,
    head_output,
    index_ranges,
    inductor_joint,
    linear_cross_entropy,
    max_pool,
    pad_gemm,
    patch_conv,
    settings,
    sorted_counts,
    straight_line,
    transport,
    upgrade,
)
from ._log import info_once, log, warn_once
from .alias_drop import drop_aliases
from .arange_index import spell_arange_indices
from .bmm_fragment import build_bmm
from .cast_sink import sink_casts, spread_small_casts
from .cat_rewrite import spell_cats
from .cols_fragment import build_columns
from .column_rewrite import spell_columns
from .column_shape import keep_column_shape
from .embedding_grad import rewrite_embedding_grads
from .fragment import Unfusable, build
from .input_updates import batch_input_updates
from .full_sums import spell_full_sums
from .gemm_fragment import build_chain, build_gemm
from .ops import is_batched_gemm
from .outer_product import spell_outer_products
from .memory_order import run_in_memory_order
from .partition import Served, epilogue_apart, find_groups, split_apart
from .runtime import GroupRunner
from .scatter_add import rewrite_index_put_adds
from .scatter_fragment import build_scatter
from .scatter_picks import spell_pick_scatters
from .short_sums import spell_short_sums
from .transpose_rewrite import compute_in_copy_layout
from .twin_copies import drop_twin_copies
from .gather_sink import gather_picks, sink_gathers
from .split_sink import sink_splits
from .unsort import drop_round_trips
from .view_sink import sink_views

aten = torch.ops.aten

# Decomposed before partitioning: backward ops that are pointwise chains in our vocabulary
# are kept whole here and spelled by ops.POINTWISE instead (silu_backward, sigmoid_backward,
# tanh_backward, threshold_backward, gelu_backward), and gelu/silu/sigmoid stay undecomposed
# so each maps to one vocabulary op; a group left unfused is then still one ATen op each.
# What is decomposed: composites whose parts we fuse.
DECOMPOSITIONS = get_decompositions(
    [
        aten._softmax,
        aten._log_softmax,  # amax, sub, exp, sum, div/log: one rows group
        # their backwards: g - exp(out) * sum(g), out * (g - sum(out * g)): one rows group each
        # (cross-entropy's backward over the vocabulary; attention written without SDPA)
        aten._log_softmax_backward_data,
        aten._softmax_backward_data,
        aten.native_layer_norm,  # var_mean (below), rsqrt, scale, shift: one rows group
        # x_hat recomputed, two row sums and the input's gradient: one rows group; the weight's
        # and bias's gradients: column sums (ATen runs it as three kernels, the weight's the
        # costliest: 39 us a call at ViT-S's 12.6k x 384 on an H200)
        aten.native_layer_norm_backward,
        aten.hardsigmoid,
        aten.hardswish,
        aten.leaky_relu,
        aten.elu,
        aten.clamp_min,
        aten.clamp_max,
        aten.addcmul,
        aten.addcdiv,
        aten.lerp,
        aten.mish,
        aten.softplus,
    ]
)


def _var_mean(x, dim=None, *, correction=None, keepdim=False):
    """var_mean as two reductions: the pair returns a tuple, which a group cannot hold. Over
    the last dim (LayerNorm's statistics), two row reductions (each one op of vocabulary 2).
    Over other dims (batch norm's [0, 2, 3], column reductions once its values are
    channels-last: memory_order.py), the mean and the mean of the squared deviations from it,
    what a column group computes (the two-pass form, no less exact than ATen's)."""
    rank = x.dim()
    dims = [d % rank for d in ([dim] if isinstance(dim, int) else (dim or range(rank)))]
    if dims == [rank - 1]:
        return (aten.var.correction(x, dim, correction=correction, keepdim=keepdim), aten.mean.dim(x, dim, keepdim))
    mean = aten.mean.dim(x, dims, True)
    dev = aten.sub.Tensor(x, mean)
    var = aten.mean.dim(aten.mul.Tensor(dev, dev), dims, keepdim)
    n = 1
    for d in dims:
        n *= x.shape[d]
    c = 1 if correction is None else correction
    if c:
        var = aten.mul.Tensor(var, n / (n - c) if n > c else float("nan"))
    return var, (mean if keepdim else aten.squeeze.dims(mean, dims))


DECOMPOSITIONS[aten.var_mean.correction] = _var_mean


def _detach(x):
    """What autograd saves of an op's output (tanh's, exp's, softmax's) reaches the joint graph
    as detach(out); the min-cut partitioner takes detach for an op nothing fuses with, so the
    output counts as needed whole by the backward and is saved. As alias, a view to it (what
    Inductor's table does), the output is recomputed from its inputs when that is cheaper:
    T5's gated GELU saved its tanh a layer beside what Inductor saves."""
    return aten.alias.default(x)


DECOMPOSITIONS[aten.detach.default] = _detach


def _safe_softmax(x, dim, dtype=None):
    """SDPA's math path (T5's attention with its learned bias): softmax with rows that are all
    -inf zeroed instead of NaN. torch's own decomposition fills a zeros_like tensor for the
    where; masked_fill by a scalar keeps the whole of it one rows group (softmax, the -inf
    test, the all-reduction of the row)."""
    out = aten._softmax.default(x if dtype is None else x.to(dtype), dim, False)
    masked_rows = aten.all.dim(aten.eq.Scalar(x, float("-inf")), dim, True)
    return aten.masked_fill.Scalar(out, masked_rows, 0.0)


DECOMPOSITIONS[aten._safe_softmax.default] = _safe_softmax
DECOMPOSITIONS.update(patch_conv.DECOMPOSITIONS)  # a ViT's patch embedding as a product (patch_conv.py)

# Batch norm as reductions and pointwise ops, in graphs whose convolutions run channels-last
# (channels_last.py): its statistics are then column reductions of the [N * H * W, C] values
# (memory_order.py, column_rewrite.py), whose epilogues compute what is per channel
# (column_shape.py), and the normalisation joins the activation after it. ResNet-50 on an
# H200: inference 3.23 ms of GPU time (Inductor 2.99); a training step 11.6 ms against 15.0
# with ATen's channels-last batch norm kernels, whose statistics kernel alone reads at a
# sixth of the bandwidth (bench/NOTES.md, "Batch norm in training, decomposed").
# Elsewhere ATen's batch norm kernels stay (NCHW statistics would be reductions no kernel
# template takes).
BATCH_NORM = get_decompositions(
    [
        aten._native_batch_norm_legit_functional,
        aten._native_batch_norm_legit_no_training,
        aten._native_batch_norm_legit,
        aten.native_batch_norm,
        aten.native_batch_norm_backward,
    ]
)


def _decomposes_batch_norm(gm, example_inputs):
    """Will this dynamo graph be one in which channels_last.convert finds a convolution (a
    2-D one and, in mode "auto", a bf16/f16 CUDA input), with FUSEML_BATCH_NORM not "aten"?"""
    mode, norm = settings.channels_last(), settings.batch_norm()
    if mode == "off" or norm == "aten" or not any("conv2d" in str(n.target) for n in gm.graph.nodes):
        return False
    return mode == "on" or any(
        isinstance(x, torch.Tensor) and x.device.type == "cuda" and x.dtype in channels_last.DTYPES
        for x in example_inputs
    )


# Ops of DECOMPOSITIONS left whole under rest="inductor": Inductor's table rewrites clamp into
# clamp_min and clamp_max and lowers those itself, while ours spells them as clamp again, so
# the two tables together recurse without end (Mixtral's expert routing, `ids.clamp_(max=7)`);
# var_mean, which Inductor lowers as one Welford reduction where ours makes two (ResNet-50's
# batch norms: 772 kernels a training step under rest="inductor" against Inductor's 691).
INDUCTOR_LOWERS = {aten.clamp_min, aten.clamp_max, aten.var_mean}


class Plan:
    """What one compiled graph became: its groups, for tests and explain()."""

    def __init__(self, which, groups, hello=None):
        self.which = which  # "forward" | "backward" | "inference"
        self.groups = groups
        self.hello = hello
        self.graphs = None  # with CUDA graphs asked for: whether this graph got them
        self.called = None  # an inference graph: "directly", or why not (direct_call.py)
        self.skipped = None  # why the graph was not partitioned (no CUDA tensor)
        self.compiled = None  # the Compiled it runs as (its `path`: generated code or FX)
        self.padded = []  # the GEMMs padded to aligned sizes (pad_gemm.py)
        self.choice = None  # rest="inductor": which form runs, and why (graph_choice.py)

    def kernels(self):
        return [g for g in self.groups if g.route == "kernel"]

    def describe(self):
        padded = self.padded and "padded " + ", ".join(self.padded)
        runs = self.compiled and "runs as " + self.compiled.path
        runs = runs or (self.choice and "runs as " + self.choice.why)
        notes = [n for n in (self.skipped, self.graphs, self.called and "called " + self.called, padded, runs) if n]
        head = f"{self.which} graph:" + (f" ({'; '.join(notes)})" if notes else "")
        return "\n".join([head] + ["  " + g.describe() for g in self.groups])


class FuseMLCompiler:
    """torch.compile(model, backend=FuseMLCompiler(**options)).

    Options: socket (path; default FUSEML_SOCKET or the per-user socket), timeout_s (per
    graph, for the daemon's replies; default 120), min_ops (the fewest ops worth one kernel;
    default 2; a lone op is one kernel either way), rest ("aten", the default: what is not
    fused runs as ATen ops; "inductor": each graph is compiled by TorchInductor alone and
    with the fuseml::group ops in it as extern kernels, and its first calls keep the faster
    form: graph_choice.py), cudagraphs (record
    each compiled graph as a CUDA graph, replayed by graph_replay.py; default
    FUSEML_CUDAGRAPHS=1, and torch.compile's mode="reduce-overhead" or options={"cudagraphs":
    True} turn it on per call: see cudagraphs.py), chains (merge back-to-back GEMM groups,
    an MLP's fc1 -> act -> fc2, into one chain group: chains.py; default True unless
    FUSEML_CHAINS=0: on an H100 the b2b kernel takes 0.78-0.92x the time of the two tuned GEMMs
    it replaces, bench/NOTES.md "The b2b rings"), direct (call an inference graph without
    aot_autograd's runtime wrappers when they would do nothing for it: direct_call.py; default True
    unless FUSEML_DIRECT=0; with rest="inductor" the wrappers always stay), pad_gemm ("auto",
    "all" or "off": which GEMMs with a dimension not a multiple of 8 are padded, pad_gemm.py;
    default FUSEML_PAD_GEMM, else "auto"), recompute (split training graphs with the min-cut
    partitioner, recomputing cheap pointwise chains in the backward instead of saving them;
    default on, off with FUSEML_RECOMPUTE=0), logits ("whole", "blocks" or "recompute": how the
    backward of a language model's head and loss gets the logits' gradient, whole or in
    column blocks of saved or recomputed logits, linear_cross_entropy.py; default
    FUSEML_LOGITS, else "whole")."""

    def __init__(
        self,
        socket=None,
        timeout_s=120.0,
        min_ops=2,
        rest="aten",
        cudagraphs=None,
        chains=None,
        direct=None,
        pad_gemm=None,
        recompute=None,
        logits=None,
    ):
        if rest not in ("aten", "inductor"):
            raise ValueError(f"rest must be 'aten' or 'inductor', not {rest!r}")
        self.socket = socket
        self.timeout_s = timeout_s
        self.min_ops = min_ops
        self.rest = rest
        self.cudagraphs = cudagraphs
        self.chains = chains  # None: FUSEML_CHAINS, read per graph (the default backend is long-lived)
        self.direct = direct  # None: FUSEML_DIRECT, read per graph
        if pad_gemm not in (None, "auto", "all", "off"):
            raise ValueError(f"pad_gemm must be 'auto', 'all' or 'off', not {pad_gemm!r}")
        self.pad_gemm = pad_gemm  # None: FUSEML_PAD_GEMM, read per graph
        self.recompute = recompute  # None: FUSEML_RECOMPUTE, read per graph
        if logits not in (None, "whole", "blocks", "recompute"):
            raise ValueError(f"logits must be 'whole', 'blocks' or 'recompute', not {logits!r}")
        self.logits = logits  # None: FUSEML_LOGITS, read per graph
        self.plans = []
        graph_breaks.avoid()  # before Dynamo traces what this compiler is given (graph_breaks.py)

    def _decompositions(self, batch_norm=False):
        if self.rest != "inductor":
            return {**DECOMPOSITIONS, **BATCH_NORM} if batch_norm else DECOMPOSITIONS
        # Inductor lowers only what its own table leaves, so its graph must be traced with it.
        # Some of its decompositions ask its lowerings what they take (max_pool2d's asks
        # torch._inductor.lowering), which only compile_fx imports: import it before tracing.
        import torch._inductor.compile_fx  # noqa: F401
        from torch._inductor.decomposition import select_decomp_table

        ours = {op: f for op, f in DECOMPOSITIONS.items() if getattr(op, "overloadpacket", op) not in INDUCTOR_LOWERS}
        return {**select_decomp_table(), **ours}

    def __call__(self, gm, example_inputs, mode=None, options=None, **kwargs):
        """torch.compile passes its mode and options (and, in newer torch, name) to a backend
        as keywords; what else it may pass is ignored."""
        if kwargs:
            log.debug("fuseml: ignoring backend keywords %s", sorted(kwargs))
        # before aot_autograd traces it: the logits a model returns beside its loss given their
        # gradient outside the compiled graph, so that no zeros are made for them when nobody
        # differentiates them (head_output.py); a language model's head and loss whose backward
        # never holds the logits' gradient whole (linear_cross_entropy.py), and any other
        # cross_entropy saving no fp32 log-probabilities (cross_entropy.py)
        reattach = head_output.rewrite(gm)
        linear_cross_entropy.rewrite(gm, self.logits)
        cross_entropy.rewrite(gm)
        # max pooling whose backward reads no saved indices (max_pool.py), but where Inductor
        # compiles the graph: it lowers max_pool2d into its own kernels, and fuseml's op would be
        # an extern call to it, ATen's pool and index conversions (ResNet-50's step 1.16x
        # Inductor's GPU time with it, its graphs kept as Inductor alone)
        if self.rest != "inductor":
            max_pool.rewrite(gm)
        # masks and clamps an index's range decides (index_ranges.py: a mixture of experts'
        # sentinel mask, never set without expert parallelism), and its experts' running counts
        # as one binary search (sorted_counts.py)
        index_ranges.rewrite(gm)
        sorted_counts.rewrite(gm)
        # Inductor's compiled graphs rely on aot_autograd's wrappers: only ours are called directly
        capture = direct_call.Capture(gm, example_inputs, self.rest == "aten" and direct_call.wanted(self.direct))
        graphed = cudagraphs.wanted(mode, options, self.cudagraphs)
        # rest="inductor": each graph compiled as Inductor's own compilers would (inductor_joint.py)
        inductor = inductor_joint.Compiler(gm, example_inputs) if self.rest == "inductor" else None
        if not graphed:

            def compile_as(which):
                return lambda g, ex: self.compile_graph(g, ex, which, inductor)
        else:
            # forward and backward of this dynamo graph share one State (pairing, static inputs)
            state = cudagraphs.State(example_inputs)

            def compile_as(which):
                return lambda g, ex: self._graphed(g, ex, which, state, inductor)

        plans = []

        def inference(g, ex):
            fn = compile_as("inference")(g, ex)
            plans.append(self.plans[-1])
            capture.note(g, fn, aot_cache.restored_verdict())
            return fn

        # Which values the forward saves for the backward: the min-cut partitioner (Inductor's;
        # fuseml's default) saves the inputs of cheap pointwise chains and recomputes them inside
        # the backward's fused groups, instead of saving every intermediate the backward reads
        # (aot_autograd's default partition, FUSEML_RECOMPUTE=0).
        recompute = settings.recompute() if self.recompute is None else bool(self.recompute)
        extra = {"partition_fn": min_cut_rematerialization_partition} if recompute else {}
        if self.rest == "inductor":  # the joint graph as Inductor's own would be (inductor_joint.py)
            extra = {"partition_fn": inductor_joint.partition_fn()}
        compilers = {"forward": compile_as("forward"), "backward": compile_as("backward"), "inference": inference}
        recorded = len(self.plans)

        def forget():  # a kept graph that failed to compile again: torch compiles afresh
            del self.plans[recorded:], plans[:]

        compilers["forget"] = forget
        # aot_autograd's output kept in torch's compile cache, so that a second process skips
        # its trace (aot_cache.py); the options are what else decides what fuseml makes of it
        unkept = aot_cache.why_not(self.rest, graphed, example_inputs)
        keeping = contextlib.nullcontext(compilers) if unkept else aot_cache.keeping(gm, compilers, self._options())
        with keeping as compilers:
            wrapped = aot_autograd(
                fw_compiler=compilers["forward"],
                bw_compiler=compilers["backward"],
                inference_compiler=compilers["inference"],
                **extra,
                decompositions=self._decompositions(_decomposes_batch_norm(gm, example_inputs)),
                # the inputs a graph updates without autograd seeing it (batch norm's running
                # statistics) are written by the graph itself (copy_ nodes at its end, batched by
                # input_updates.py), not one by one by aot_autograd's wrapper after the call
                # (159 copies a ResNet-50 training step, ~1.3 ms of host); a recorded graph writes
                # them inside its recording where they are fixed inputs (cudagraphs.py)
                keep_inference_input_mutations=True,
            )(gm, example_inputs)
        fn = capture.callable(wrapped)
        for p in plans:
            p.called = "directly" if fn is not wrapped else f"through aot_autograd ({capture.why_not})"
        return reattach(fn) if reattach is not None else fn

    def _options(self):
        """The settings that decide what this compiler makes of a graph (aot_cache.py's key)."""
        names = ("min_ops", "rest", "chains", "direct", "pad_gemm", "recompute", "logits")
        return {name: getattr(self, name) for name in names}

    def _graphed(self, gm, example_inputs, which, state, inductor=None):
        plans = []

        def compile_fn():
            fn = self.compile_graph(gm, example_inputs, which, inductor)
            plans.append(self.plans[-1])  # the one compile_graph just made
            return fn

        fn, note = cudagraphs.wrap(gm, example_inputs, which, state, compile_fn)
        for p in plans:
            p.graphs = note
        return fn

    # -- one ATen graph ------------------------------------------------------------------

    def compile_graph(self, gm, example_inputs, which, inductor=None):
        """One graph aot_autograd made; `inductor` (rest="inductor"): the inductor_joint.Compiler
        of its dynamo graph."""
        if self.rest == "inductor":
            inductor = inductor or inductor_joint.Compiler(None, ())  # no dynamo graph: compile_fx_inner
            gm = inductor.prepare(gm, which)
        if not _has_cuda_tensor(gm, example_inputs) and not settings.request_cpu_graphs():
            # Kernels run on CUDA only: partitioning and asking the daemon would buy nothing
            # but a daemon (perhaps started for it) and a fallback warning.
            plan = Plan(which, [])
            plan.skipped = "no CUDA tensor: runs as ATen, nothing sent to fusemld"
            self._record(plan)
            info_once(
                "cpu-graph",
                "a graph without CUDA tensors runs as ATen (fused kernels run "
                "on CUDA only); nothing is sent to fusemld",
            )
            if self.rest == "inductor":
                return self._inductor(inductor, gm, example_inputs, which)
            return boxed_fx.boxed(gm)
        # Inductor alone compiles the graph as traced, before fuseml's passes edit it: the form
        # that rest="inductor" measures its groups against (graph_choice.py)
        alone = torch.fx.GraphModule(gm, copy.deepcopy(gm.graph)) if self.rest == "inductor" else None
        # a graph torch's cache kept after fuseml's passes edited it (aot_cache.py) is not edited
        # again: its padded GEMMs are what the miss recorded
        padded = aot_cache.edited_before()
        if padded is None:
            # before partitioning: the padded GEMMs' slices and the copies of their values are
            # what the groups around them read
            if which == "backward":  # saved values the forward left at a padded layout
                try:
                    fake_meta.adopt_input_layouts(gm, example_inputs)
                except Exception as e:
                    if self.rest != "inductor":
                        raise
                    # Inductor's forward chose the saved values' layouts (channels-last), and a view
                    # in its own decompositions (max_pool2d's indices) cannot take them: Inductor,
                    # which knows its layouts, compiles this backward whole
                    plan = Plan(which, [])
                    plan.skipped = f"Inductor's saved layouts: {type(e).__name__}; the graph went to Inductor whole"
                    self._record(plan)
                    return self._inductor(inductor, alone, example_inputs, which)
            padded = self._edit(gm, which)
            aot_cache.edited(gm, padded)  # what a later process's hit starts from
        chains = settings.chains() if self.chains is None else bool(self.chains)
        groups = find_groups(gm, self.min_ops, chains=chains)
        fused = []
        for g in list(groups):
            fused += self._build(g, groups)
        plan = Plan(which, groups)
        plan.padded = padded
        runners = {}
        if fused:
            plan.hello, fused = self._request(fused, runners, groups)
        self._record(plan)
        log.debug("fuseml: %s", plan.describe())
        if self.rest == "inductor":
            return self._inductor(inductor, alone, example_inputs, which, plan, gm, fused, runners)
        plan.compiled = Compiled(
            gm,
            fused,
            runners,
            socket=self.socket,
            apart=lambda dropped: self._epilogues_apart(dropped, runners, groups),
            backward=which == "backward",
        )
        return plan.compiled

    def _edit(self, gm, which):
        """fuseml's passes over graph gm, in place, before it is partitioned; returns the GEMMs
        padded to aligned sizes (pad_gemm.py)."""
        # the passes edit the graph; its code is regenerated once, after the last (graph_code.py)
        with graph_code.deferred():
            if self.rest != "inductor":  # Inductor traces the graph again, with fake tensors only
                const_fold.fold(gm)  # values no input reaches (a causal mask) computed once (const_fold.py)
                if spell_pick_scatters(gm):  # topk's backward as compares and wheres (scatter_picks.py)
                    const_fold.fold(gm)  # the column iota it compares with
                spell_arange_indices(gm)  # a mask read at whole aranges as a view of it (arange_index.py)
                drop_twin_copies(gm)  # a copy the graph makes twice, made once (twin_copies.py)
            keeps_layout, report_to, saved = _layout_policy(which)
            padded, kept = pad_gemm.pad(gm, self.pad_gemm or settings.pad_gemm(), keeps_layout)
            if padded and self.rest != "inductor":
                # the zeros a padding concatenates (GPT-2's tied lm_head: [47, 768] forward and
                # backward, [4096, 47] for the logits' gradient) are constants too: an ATen `full`
                # each, ~80 us of host a step on an H200's host otherwise
                const_fold.fold(gm)
            # after the padding: a padded GEMM's slot it kept is not one the convolutions change
            kept += channels_last.convert(gm, settings.channels_last(), saved) or []
            # Inductor reports the strides of the graph it compiles itself (and asserts that no
            # one did before it): under rest="inductor" the report is left to it
            if kept and report_to is not None and self.rest != "inductor":
                _report_output_strides(gm, sorted(set(kept)), report_to)
            drop_aliases(gm)  # an alias between two pointwise ops, read as its operand (alias_drop.py)
            spell_outer_products(gm)  # a product over K = 1 (rotary angles) as a multiply (outer_product.py)
            spell_short_sums(gm)  # a sum over a short inner dim as adds of its slices (short_sums.py)
            spell_full_sums(gm)  # a full sum of a short 1-D value as a row of one (full_sums.py)
            spell_cats(gm)  # a backward's slice_backward pairs as aten.cat (cat_rewrite.py)
            compute_in_copy_layout(gm)  # a transposed pointwise value's copy computes it there (transpose_rewrite.py)
            sink_casts(gm)  # a cast read through views moves next to its fused reader or producer (cast_sink.py)
            sink_views(gm)  # a reshape or a broadcast between pointwise ops moves below the second (view_sink.py)
            sink_splits(gm)  # a pointwise op a split reads moves below it, one per piece (split_sink.py)
            sink_gathers(gm)  # ... and one a row gather or its picks read, below them (gather_sink.py)
            drop_round_trips(gm)  # rows gathered through a permutation and back through its inverse (unsort.py)
            gather_picks(gm)  # a row gather's picks, each read at its own index (gather_sink.py)
            run_in_memory_order(gm)  # ops over channels-last values walk them as stored (memory_order.py)
            # again: a per-channel cast that memory order now reads through unsqueezes and a permute
            # (batch norm's running variance as torch 2.11 decomposes it: a kernel of its own and a
            # launch per batch norm otherwise)
            sink_casts(gm)
            spell_columns(gm)  # sums over leading dims as column sums of a 2-D view (column_rewrite.py)
            keep_column_shape(gm)  # per-column ops on a column sum read it in its shape (column_shape.py)
            spread_small_casts(gm)  # a small cast a column view shares, one per reader (cast_sink.py)
            if self.rest != "inductor":  # Inductor writes both its own way
                batch_input_updates(gm)  # the inputs the graph updates, written at once (input_updates.py)
                rewrite_embedding_grads(gm)  # an embedding's gradient as an fp32 scatter-add (embedding_grad.py)
                rewrite_index_put_adds(gm)  # a gathered rows' gradient as a scatter-add (scatter_add.py)
                fresh_buffers.rewrite(gm)  # an index_put into a buffer made for it, in place (fresh_buffers.py)
        return padded

    def _record(self, plan):
        self.plans.append(plan)
        del self.plans[:-256]  # a long-lived default compiler keeps only recent plans

    def _inductor(self, inductor, alone, example_inputs, which, plan=None, gm=None, fused=(), runners=None):
        """The rest to Inductor. `alone` is the graph as traced, compiled by Inductor by
        itself; where the daemon served groups, `gm` (the graph fuseml's passes edited) is
        compiled too, with each served group as a fuseml::group call (Inductor runs a custom op
        it does not know as an extern kernel, through its fake implementation for shapes), and
        the graph's first calls measure which form is faster (graph_choice.py). The groups'
        own measured routing still happens inside fuseml::group at their first call."""
        from torch._guards import TracingContext

        kept = [g for g in fused if runners[g.gid].kernel is not None]
        fn_alone = inductor.compile(alone, example_inputs, which)  # reports a forward's output strides
        if not kept:
            return fn_alone
        # aot_autograd takes one report of the forward's output strides (the saved values' the
        # backward is compiled for): Inductor alone's; the groups' form reports into a list
        # dropped here, and is a candidate only where its strides are the same
        for g in kept:  # Inductor asserts the strides the fake returns: the kernel's, at every call
            runners[g.gid].fixed_layout = True
        try:
            with TracingContext.report_output_strides():
                fn_grouped = inductor.compile(rewrite(gm, kept, runners), example_inputs, which)
        except Exception as e:  # the graph as Inductor alone compiled it runs
            plan.choice = graph_choice.Fixed(
                0, f"Inductor alone: with fuseml's groups Inductor failed ({type(e).__name__}: {e})"
            )
            warn_once("inductor_groups", "%s graph: %s", which, plan.choice.why, suffix="")
            return fn_alone
        strides = [getattr(f, "output_strides", None) for f in (fn_alone, fn_grouped)]
        if which == "forward" and (strides[0] is None or strides[0] != strides[1]):
            plan.choice = graph_choice.Fixed(
                0, "Inductor alone: with fuseml's groups the forward's outputs would take other strides"
            )
            return fn_alone
        plan.choice = graph_choice.Choice(fn_alone, fn_grouped, which)
        up = upgrade.Upgrader([runners[g.gid] for g in kept], self.socket)
        return plan.choice if up.done else InductorCompiled(plan.choice, up)

    def _build(self, g, groups):
        """The groups to request for group g (routed "kernel"): g with its fragment built, or,
        when a combined group cannot be spelled, its two parts (apart()); [] when g stays
        ATen."""
        if g.route != "kernel":
            return []
        try:
            if g.kind == "gemm" and is_batched_gemm(g.members[0]):
                g.built = build_bmm(g.members, g.inputs, g.outputs)
            elif g.kind == "gemm" and g.chain:
                g.built = build_chain(g.members, g.inputs, g.outputs)
                g.inputs = list(g.built.in_nodes)  # x twice when stage 2 reads it
            elif g.kind == "gemm":
                g.built = build_gemm(g.members, g.inputs, g.outputs)
            elif g.kind == "columns":
                g.built = build_columns(g.members, g.inputs, g.outputs)
            elif g.kind == "scatter":
                g.built = build_scatter(g.members, g.inputs, g.outputs)
                g.inputs = list(g.built.in_nodes)  # the values, then the index: the wire's order
            else:
                g.built = build(g.members, g.inputs, g.outputs, g.shape)
            return [g]
        except Unfusable as e:
            if g.parts:
                return [h for p in self._apart(g, str(e), groups) for h in self._build(p, groups)]
            g.route, g.reason = "bypass", str(e)
            # a product whose epilogue the GEMM template cannot take (a [B, 1, S, S] mask beside
            # [B, H, S, S] scores) still has its epilogue fused: cuBLAS's product, then one
            # kernel where its ops would each be an ATen kernel over the whole product
            h = epilogue_apart(g, max(x.gid for x in groups) + 1, self.min_ops) if g.kind == "gemm" else None
            if h is None:
                return []
            groups.insert(groups.index(g) + 1, h)
            return self._build(h, groups)

    def _epilogues_apart(self, dropped, runners, groups):
        """The GEMM groups measured routing dropped (their fused kernel lost to ATen) run their
        product on cuBLAS and their epilogue as one pointwise kernel: the epilogue groups are
        requested now (one round), placed after their GEMM group in the plan, and returned
        where the daemon served a kernel (each is routed by measurement at its first call)."""
        new = []
        for g in dropped:
            h = epilogue_apart(g, max(x.gid for x in groups) + 1, self.min_ops)
            if h is None:
                continue
            groups.insert(groups.index(g) + 1, h)
            new += self._build(h, groups)
        if not new:
            return []
        _, done = self._request(new, runners, groups)
        for h in done:
            if runners[h.gid].kernel is None:
                h.route = "bypass"
        return [h for h in done if runners[h.gid].kernel is not None]

    def _apart(self, g, why, groups):
        """Combined group g (siblings or a chain) runs as its two GEMM groups: they take its
        place in the plan right after it (g stays, routed "apart", for explain)."""
        g.route, g.reason = "apart", why
        parts = split_apart(g, max(h.gid for h in groups) + 1, self.min_ops)
        i = groups.index(g) + 1
        groups[i:i] = parts
        return parts

    def _request(self, fused, runners, groups):
        """Compiles the fragments of `fused` in one pipelined round; a combined group the
        daemon answers with anything but a kernel (bypass, unsupported, an older daemon) is
        split apart and its parts go in a second round on the same connection, so a chain or
        sibling pair the daemon cannot serve still runs as two served GEMM groups, never as
        ATen whole. Returns (hello, the groups requested that the graph calls)."""
        for g in fused:
            runners[g.gid] = GroupRunner(g)
        try:
            conn = transport.connect(self.socket, timeout=5.0)
        except (transport.DaemonError, OSError) as e:
            cause = ("daemon", "fusemld unreachable: %s", str(e))
            for g in fused:
                runners[g.gid].why_eager = cause
            warn_once(*cause)
            return None, fused
        done, todo = [], fused
        try:
            while todo:
                try:
                    replies = transport.compile_all(conn, [g.built.wire for g in todo], self.timeout_s)
                except (transport.DaemonError, OSError) as e:
                    cause = ("daemon", "fusemld failed: %s", str(e))
                    for g in todo:
                        runners[g.gid].why_eager = cause
                    warn_once(*cause)
                    return conn.hello, done + todo
                retry = []
                for g, r in zip(todo, replies):
                    if r.get("ok"):
                        g.served = Served(r["key"], r["state"], r["origin"])
                        runners[g.gid].kernel = (r["key"], r["state"], r["cubin"], r["meta"])
                        done.append(g)
                        continue
                    why = f"{r.get('code')}: {r.get('detail')}"
                    log.debug("fuseml: group %d fragment %s", g.gid, g.built.wire)
                    if g.parts:
                        # not a fallback to eager: its GEMMs are requested apart, each served
                        # or refused (and said) on its own
                        warn_once(
                            f"apart:{g.label}:{r.get('code')}",
                            "fusemld refused a %s group (%s): its two GEMM groups are "
                            "requested as separate fragments",
                            g.label,
                            why,
                            suffix="",
                        )
                        for p in self._apart(g, why, groups):
                            new = self._build(p, groups)
                            for h in new:
                                runners[h.gid] = GroupRunner(h)
                            retry += new
                        continue
                    g.reason = why
                    runners[g.gid].why_eager = (
                        "compile:" + str(r.get("code")),
                        "fusemld refused a fragment: %s",
                        g.reason,
                    )
                    warn_once(*runners[g.gid].why_eager)  # the group runs inlined ATen: said now
                    done.append(g)
                todo = retry
        finally:
            conn.close()
        return conn.hello, done


def _layout_policy(which):
    """(keeps_layout for pad_gemm.pad, the tracing context to report kept strides to or None,
    saved for channels_last.convert): which output slots of the graph being compiled may
    leave it in another layout than they were traced in. A padded GEMM's row stride, as
    Inductor's outputs do: in an inference graph, one slot reached from a GEMM (two would be
    outputs that alias, which aot_autograd rebuilds from their traced strides); in a training
    forward, known only while aot_autograd compiles it (its tracing context holds the graph's
    metadata and collects output strides then), at most one of its first num_forward_returns
    slots, the user's, and any of the values saved for the backward after them, whose strides
    are reported so that the backward is compiled for them. Channels-last values: the saved
    ones only. A backward: none (a parameter's gradient in another layout would be copied by
    autograd's accumulation)."""
    if which == "inference":
        return (lambda positions: len(positions) == 1), None, (lambda position: False)
    if which == "forward":
        from torch._guards import TracingContext

        tc = TracingContext.try_get()
        meta = tc.fw_metadata if tc is not None and tc.output_strides is not None else None
        returns = getattr(meta, "num_forward_returns", None)
        if isinstance(returns, int):
            return (lambda positions: sum(p < returns for p in positions) <= 1), tc, (lambda p: p >= returns)
    return (lambda positions: False), None, (lambda position: False)


def _report_output_strides(gm, kept, tc):
    """The strides of gm's output slots at positions `kept` (None for the others: aot_autograd
    then keeps their traced layout), to the tracing context aot_autograd reads them from."""
    output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    if tc.output_strides:  # someone reported already: theirs stand
        return
    values = pad_gemm.output_values(output)
    tc.output_strides.extend(
        tuple(v.meta["val"].stride()) if i in kept and isinstance(v, torch.fx.Node) else None
        for i, v in enumerate(values)
    )


def _has_cuda_tensor(gm, example_inputs):
    """Whether any value of the graph (its nodes' fake tensors, else the inputs) is on a CUDA
    device."""
    for node in gm.graph.nodes:
        val = node.meta.get("val")
        for v in val if isinstance(val, (list, tuple)) else (val,):
            if isinstance(v, torch.Tensor) and v.device.type == "cuda":
                return True
    return any(isinstance(x, torch.Tensor) and x.device.type == "cuda" for x in example_inputs)


def _poll_kernels(self):
    """Picks up the tuned kernels the daemon finished (upgrade.py; rewrite_code() moves the
    version) and returns the version of this graph's kernels: for a caller that replays a
    recording of the graph instead of calling it (graph_replay.py), which records it again
    when the version moves. A method of Compiled and InductorCompiled."""
    up = self.upgrader
    if not up.done and up.tick():
        self.rewrite_code()
    return self.kernels_version


class Compiled:
    """What a graph compiles to: a boxed callable (it takes the argument list). Groups the
    daemon served run as calls of their runners (what fuseml::group calls); a group without a
    kernel (refused, daemon unreachable) or one that measured routing sent to ATen is inlined
    back as its ATen ops, so it costs no more than eager: the graph is rebuilt once a decision
    drops a group. Once every group is routed, the graph runs as generated straight-line code
    (straight_line.py) where it can; `path` says which way it runs and why. Kernels served
    "verified" are swapped for their tuned ones as the daemon finishes them (upgrade.py): the
    generated code, which holds the launches it was written with, is written again then."""

    def __init__(self, gm, fused, runners, generate=True, apart=None, socket=None, backward=False):
        # an instance attribute: aot_autograd wraps a backward in dynamo's disable(), which
        # copies the callable's __dict__ (the boxed mark with it) but not its class's
        self._boxed_call = True
        self.gm, self.runners = gm, runners
        self.fused = list(fused)
        self.kept = [g for g in fused if runners[g.gid].kernel is not None]
        self._set_current(rewrite(gm, self.kept, runners, direct=True) if self.kept else gm)
        self.pending = bool(self.kept)  # some kept group has not been routed yet
        self.generate = generate
        self.apart = apart  # dropped GEMM groups -> their epilogue groups served
        self.epilogues = {}  # a dropped GEMM group -> its epilogue groups served (apart)
        self.backward = backward  # its outputs are gradients (straight_line.generate)
        self.first = None  # generated code, its first call (checks ATen layouts)
        self.fast = None  # generated code, verified
        self.path = "FX graph (groups not routed yet)" if self.pending else "FX graph"
        self.upgrader = upgrade.Upgrader([runners[g.gid] for g in self.kept], socket)
        self.kernels_version = 0  # moves whenever tuned kernels are swapped in
        live.add(self)

    poll_kernels = _poll_kernels

    def __call__(self, args):
        self.poll_kernels()
        fast = self.fast
        if fast is not None:
            return fast(args)
        if self.first is not None:
            return self._first_generated(args)
        if self.pending:
            self._reroute()
        device_index = args_device((), args) if self.generate else None  # args are cleared next
        # each input dies at its last use; a call after which code is written runs the graph
        # once, interpreted: its Python code is written only if it runs again (run_fx)
        out = self._run_once(args) if self.generate else self.run_fx(args)
        if self.pending:
            # the first call decided: the graph is rebuilt now, so that the next call (under
            # CUDA graphs, the recording that follows the warm-up call) runs the final routing
            self._reroute()
        if not self.pending and self.generate:
            self._write_code(device_index if device_index is not None else args_device(out, ()))
        return out

    def slow(self, args):
        return self.run_fx(args)

    def _set_current(self, gm):
        """The graph that runs until code is generated (and when it cannot be): current, as
        FX; its boxed call is made when first needed (run_fx)."""
        self.current = gm
        self._fx = None

    def run_fx(self, args):
        """current's boxed call as Python code, written at its first use (a rewritten graph is
        written boxed; the graph as aot_autograd gave it is copied)."""
        if self._fx is None:
            gm = self.current
            self._fx = boxed_fx.runner(gm) if getattr(gm, "_boxed_call", False) else boxed_fx.boxed(gm)
        return self._fx(args)

    def _run_once(self, args):
        """current run once by torch's FX interpreter, which drops each value (the boxed
        inputs too) after its last use, as the written code does: a graph's first call and the
        one after an upgrade are followed by generated code, and writing the FX graph's own
        Python for them cost ~0.1 s a T5 backward, against ~0.02 s of interpretation."""
        return torch.fx.Interpreter(self.current).boxed_run(args)

    def rewrite_code(self):
        """The kernels changed (an upgrade): the next call runs the FX graph, which loads them,
        and the code is generated again after it. A group measured routing had given to ATen
        whose tuned kernel arrived (its runner's use_kernel back to None, upgrade.swap) is put
        back, to be measured again at that call."""
        self.fast = self.first = None
        self.generate = True
        self.kernels_version += 1
        self.path = "FX graph (kernels upgraded; code written again after this call)"
        back = [
            g
            for g in self.fused
            if g not in self.kept and self.runners[g.gid].kernel is not None and self.runners[g.gid].use_kernel is None
        ]
        if back:
            # a GEMM group back in place of the epilogue that ran apart from it
            gone = {h for g in back for h in self.epilogues.get(g, ())}
            self.kept = sorted([g for g in self.kept if g not in gone] + back, key=lambda g: g.gid)
            self.pending = True
            self._set_current(rewrite(self.gm, self.kept, self.runners, direct=True))

    def _first_generated(self, args):
        first, self.first = self.first, None
        try:
            out = first(args)
        except AssertionError as e:  # only a variant that kept args raises it
            return self._layout_missed(str(e), self.run_fx(args))
        if first.missed:  # copied to the traced layouts: this call's results are right
            return self._layout_missed("; ".join(first.missed), out)
        self.path = "generated straight-line code"
        self.fast = self.fast_next
        return out

    def _layout_missed(self, what, out):
        # an ATen result's layout differs from its trace: this graph keeps its FX form
        self.path = f"FX graph (an ATen result's layout differs from its trace: {what})"
        log.info("fuseml: generated code not used: %s", self.path)
        return out

    def _write_code(self, device_index):
        self.generate = False
        if not settings.straight_line():
            self.path = "FX graph (FUSEML_STRAIGHT_LINE=0)"
            return
        fns, why = straight_line.generate(self.current, device_index, self.slow, self.backward)
        if fns is None:
            self.path = f"FX graph ({why})"
            log.debug("fuseml: %s", self.path)
            return
        self.first, self.fast_next = fns
        self.path = "generated straight-line code (first call pending)"

    def _reroute(self):
        dropped = [g for g in self.kept if self.runners[g.gid].use_kernel is False]
        self.pending = any(self.runners[g.gid].use_kernel is None for g in self.kept)
        if dropped:
            self.kept = [g for g in self.kept if g not in dropped]
            if self.apart is not None:
                self.kept += self._epilogues_of([g for g in dropped if g.kind == "gemm"])
                self.pending = any(self.runners[g.gid].use_kernel is None for g in self.kept)
            self._set_current(rewrite(self.gm, self.kept, self.runners, direct=True) if self.kept else self.gm)

    def _epilogues_of(self, gemms):
        """The epilogue groups that run in the place of dropped GEMM groups: requested at a
        group's first drop, the same ones again at a later drop (after its tuned kernel came
        back and lost too); those measured routing sent to ATen are left out."""
        new = [g for g in gemms if g not in self.epilogues]
        if new:
            try:
                served = self.apart(new)
            except Exception as e:  # never a failed job: the dropped groups run as ATen
                log.info("fuseml: epilogues of dropped GEMM groups not requested: %r", e)
                served = []
            for g in new:
                self.epilogues[g] = [h for h in served if h.apart_of is g]
            self.upgrader.add([self.runners[h.gid] for h in served])
        return [h for g in gemms for h in self.epilogues[g] if self.runners[h.gid].use_kernel is not False]


class InductorCompiled:
    """A graph of rest="inductor" (its graph_choice.Choice between Inductor alone and Inductor
    with fuseml's groups) whose runners hold kernels served before their background tune: they
    are swapped for the tuned ones as the daemon finishes them (upgrade.py). Inductor's code
    calls the runners at each call, so nothing is written again; the choice is measured again
    (tuned kernels can turn it), and the version tells a CUDA-graph replay to record again."""

    def __init__(self, choice, upgrader):
        self._boxed_call = True  # an instance attribute, as Compiled's
        self.choice, self.upgrader = choice, upgrader
        self.kernels_version = 0
        live.add(self)

    poll_kernels = _poll_kernels

    def __call__(self, args):
        self.poll_kernels()
        return self.choice(args)

    def rewrite_code(self):
        self.kernels_version += 1
        self.choice.reset()  # tuned kernels can turn the measured choice


live = weakref.WeakSet()  # every compiled graph alive: pick_up_tuned() upgrades them all


def pick_up_tuned(timeout_s=5.0):
    """Swaps the tuned kernels the daemon has finished into every compiled graph now (one
    lookup per kernel still "verified"), rather than at the next periodic check; returns how
    many were swapped. For a step boundary, or a benchmark that wants tuned kernels."""
    n = 0
    for c in list(live):
        got = upgrade.swap(upgrade.refresh(c.upgrader.runners, c.upgrader.socket, timeout_s))
        if got:
            c.rewrite_code()
            n += got
    return n


def args_device(out, args):
    """The CUDA device index of the graph's tensors (the first found among outputs and
    arguments); None if there is none or they span devices."""
    found = set()
    for t in list(out or ()) + list(args):
        if isinstance(t, torch.Tensor) and t.device.type == "cuda":
            found.add(t.device.index)
    return found.pop() if len(found) == 1 else None


def rewrite(gm, fused, runners, direct=False):
    """A new graph in which each fused group is one fuseml::group call (direct: a call of the
    group's runner itself, for a graph that only runs, never traced again: the dispatcher's
    ~7 us per custom-op call saved). Nodes are emitted in graph order, except that a group
    is emitted (with its inputs) when its first value is needed, so a user of an escaping
    value that sits between the group's members works."""
    unit = {}
    for g in fused:
        for n in g.members:
            unit[n] = g
    new = torch.fx.Graph()
    env, done = {}, set()

    def emit(u):
        if id(u) in done:
            return
        done.add(id(u))
        if isinstance(u, torch.fx.Node):
            for a in u.all_input_nodes:
                emit(unit.get(a, a))
            env[u] = new.node_copy(u, lambda x: env[x])
            return
        for a in u.inputs:
            emit(unit.get(a, a))
        xs = [env[a] for a in u.inputs]
        runner = runners[u.gid]
        call = (
            new.call_function(runner.run, (xs,))
            if direct
            else new.call_function(torch.ops.fuseml.group.default, (runner.gid, xs))
        )
        call.meta["val"] = [o.meta.get("val") for o in u.outputs]
        for i, o in enumerate(u.outputs):
            env[o] = new.call_function(operator.getitem, (call, i))
            env[o].meta = dict(o.meta)

    for node in gm.graph.nodes:
        emit(unit.get(node, node))
    # a graph that only runs is written boxed at once (its inputs die at their last use)
    out = boxed_fx.boxed_module(gm, new, lazy=True) if direct else torch.fx.GraphModule(gm, new)
    out.graph.lint()
    return out


_default = None


def fuseml_backend(gm, example_inputs, mode=None, options=None, **kwargs):
    """The backend registered as "fuseml" (entry point torch_dynamo_backends); torch.compile's
    mode ("reduce-overhead": CUDA graphs) and options ({"cudagraphs": bool}) as keywords."""
    global _default
    graph_breaks.avoid()  # for the frames traced after this one (graph_breaks.py)
    if _default is None:
        _default = FuseMLCompiler()
    return _default(gm, example_inputs, mode=mode, options=options, **kwargs)
