"""aot_autograd's output kept across processes: a second process on the same model skips
aot_autograd's trace and partition, and fuseml's passes over its graphs, which cost 2-6 s of a
warm first step (bench/NOTES.md, "The warm compile").

torch's AOTAutogradCache keeps, for a dynamo graph (keyed by its code, its inputs' metadata,
torch's version and configs), what aot_autograd made of it: the runtime metadata, its wrappers,
and the compiled forward, backward or inference graph as "output code". Inductor's output code
is its generated module; any other compiler's is kept too when it is an OutputCode that pickles
(the cache's "bundled" entries, torch 2.11 and later). fuseml's output code (KeptGraph) is the
ATen graph as fuseml's passes left it, before it is partitioned (`edited`, called by the
backend), its node values as layouts (kept_values.py) and the GEMMs the passes padded. A hit
partitions that graph and asks the daemon for its fragments, as a miss does after its passes:
the daemon's store answers without compiling and routes.py recalls their measured routing.
The kernels themselves are never in this cache. A training forward's saved values keep the
strides the miss reported for them: the graph that makes them is the one the backward was
compiled for.

Keys are torch's plus a tag naming fuseml's source and settings (the compiler's options, every
FUSEML_* variable), so that Inductor's entries, and fuseml's made with other settings or by
other code, are never taken for one another. A hit that cannot be compiled again raises, and
torch then compiles the graph from scratch. Not kept: graphs recorded as CUDA graphs,
rest="inductor" (Inductor's graphs have their own cache), graphs with symbolic sizes.
FUSEML_AOT_CACHE=0 turns it off."""

import contextlib
import contextvars
import hashlib
import logging
import operator
import os
import pickle

import torch

from . import graph_code, kept_values, settings
from ._log import info_once, log

try:  # torch 2.11 and later: a compiler whose output pickles can use AOTAutogradCache
    from torch._functorch.aot_autograd import SerializableAOTDispatchCompiler
    from torch._inductor.output_code import OutputCode
except ImportError:  # older torch: nothing is kept
    SerializableAOTDispatchCompiler = None
    OutputCode = object

# The graph being restored on a hit, the one a miss is making (for edited()), and the compilers
# of the dynamo graph being compiled (what a hit's post_compile calls), each set for the length
# of one compile.
_restoring = contextvars.ContextVar("fuseml_aot_restoring", default=None)
_making = contextvars.ContextVar("fuseml_aot_making", default=None)
_compilers = contextvars.ContextVar("fuseml_aot_compilers", default=None)

_SOURCE_DIGEST = []  # computed once a process


class Unkept(Exception):
    """A graph this cache cannot keep: compiled as usual, nothing saved."""


def why_not(rest, graphed, example_inputs):
    """None when this dynamo graph's aot_autograd output may be kept, else why not."""
    if not settings.aot_cache():
        return "FUSEML_AOT_CACHE=0"
    if SerializableAOTDispatchCompiler is None or not _torch_config_has_bundles():
        return "this torch keeps no other compiler's output"
    if rest != "aten":
        return "rest='inductor' (Inductor's own cache)"
    if graphed:
        return "recorded as CUDA graphs"
    for x in example_inputs:
        try:
            _describe(x)
        except Unkept as e:
            return str(e)
    return None


def _torch_config_has_bundles():
    cfg = torch._functorch.config
    return hasattr(cfg, "bundled_autograd_cache") and hasattr(cfg, "force_non_lazy_backward_lowering")


@contextlib.contextmanager
def keeping(gm, compilers, options):
    """Around one aot_autograd call of dynamo graph gm: yields the compilers to hand it (each
    wraps its result in a KeptGraph), with torch's cache switched to bundled entries under
    fuseml's tag. `compilers` maps "forward", "backward" and "inference" to fuseml's compile
    functions, and "forget" to a function that drops what a failed hit recorded; `options` is
    whatever else decides what fuseml makes of a graph (the compiler's settings)."""
    tag = _tag(options)
    # the functions fuseml's own rewrites of gm call (a fused cross-entropy, the experts' running
    # counts): torch keys only the functions it knows unless told; the tag names their source
    ours = {}
    for node in gm.graph.nodes:
        module = getattr(node.target, "__module__", None) or ""
        if node.op == "call_function" and module.split(".")[0] == __package__:
            ours[f"{module}.{node.target.__name__}"] = tag
    marked = {**torch._inductor.config.unsafe_marked_cacheable_functions, **ours}
    wrapped = {
        which: SerializableAOTDispatchCompiler(KeptGraph, _keeper(which, compilers[which]))
        for which in ("forward", "backward", "inference")
    }
    token = _compilers.set(compilers)
    patches = {
        # the entry holds our OutputCode itself, not an FxGraphCache key (Inductor's form)
        "bundled_autograd_cache": True,
        # the backward compiled with the forward, while the bundled setting holds: the entry is
        # written when both are compiled, and a lazy backward would be compiled after this call
        "force_non_lazy_backward_lowering": True,
    }
    unsaved = _UnsavedNote()
    torch_log = logging.getLogger(_TORCH_CACHE_LOGGER)
    torch_log.addFilter(unsaved)
    try:
        with (
            _pickled_outside_fake_mode(),
            torch._functorch.config.patch(patches),
            torch.compiler.config.patch(cache_key_tag=tag),
            torch._inductor.config.patch(unsafe_marked_cacheable_functions=marked),
        ):
            yield wrapped
    finally:
        torch_log.removeFilter(unsaved)
        _compilers.reset(token)


_TORCH_CACHE_LOGGER = "torch._functorch._aot_autograd.autograd_cache"


@contextlib.contextmanager
def _pickled_outside_fake_mode():
    """torch's pickling of an entry run with no fake mode active. With the backward compiled
    beside the forward (force_non_lazy_backward_lowering), the entry is pickled inside the
    forward's fake mode, and torch 2.11 pickles it as it is (later torch leaves the modes
    first): a real CUDA tensor in it (a constant aot_autograd lifted into the backward graph it
    keeps, as Gemma 2's embedding scale is) is copied to the host by an op the fake mode refuses,
    and no entry is written."""
    from torch._functorch._aot_autograd.autograd_cache import AOTAutogradCache
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    original = AOTAutogradCache.__dict__.get("_pickle_entry")
    if not isinstance(original, staticmethod):  # a torch that pickles otherwise: left as it is
        yield
        return

    def pickle_entry(*args, **kwargs):
        with unset_fake_temporarily():
            return original.__func__(*args, **kwargs)

    AOTAutogradCache._pickle_entry = staticmethod(pickle_entry)
    try:
        yield
    finally:
        AOTAutogradCache._pickle_entry = original


class _UnsavedNote(logging.Filter):
    """torch's warning that it could not pickle an entry, in place of which fuseml notes it
    (and counts it as the bypass it is): torch only warns, and counts nothing, so a next
    process's miss would otherwise look like a cold start with no reason given."""

    def filter(self, record):
        message = record.getMessage()
        if "unable to serialize" not in message:
            return True
        from torch._dynamo.utils import counters

        counters["aot_autograd"]["autograd_cache_bypass"] += 1
        info_once("aot-unpickled", "aot_autograd's entry not kept for the next process: %s", message)
        return False


def restored_verdict():
    """For direct_call.Capture.note on a hit: the verdict the miss read from aot_autograd's
    metadata (which a hit's tracing context lacks), or None outside a hit."""
    kept = _restoring.get()
    return kept.verdict if kept is not None else None


def edited(gm, padded):
    """What the backend calls once its passes have edited gm, before partitioning it: on a miss
    whose output is kept, gm is written down now, as the graph a hit starts from (with
    `padded`, the GEMMs the passes padded)."""
    kept = _making.get()
    if kept is None or kept.unkept is not None:
        return
    try:
        kept.keep(gm)
        kept.padded = list(padded)
    except Exception as e:  # anything unpicklable a pass put in: compiled, not kept
        kept.refuse(e)


def edited_before():
    """On a hit whose graph was kept after fuseml's passes: the GEMMs they padded (the passes
    are not run again); else None."""
    kept = _restoring.get()
    return list(kept.padded) if kept is not None and kept.padded is not None else None


def _tag(options):
    """torch's cache_key_tag for fuseml's entries: the user's own tag, fuseml's source digest,
    the compiler's options and every FUSEML_* variable."""
    if not _SOURCE_DIGEST:
        h = hashlib.sha256()
        here = os.path.dirname(os.path.abspath(__file__))
        for name in sorted(os.listdir(here)):
            if name.endswith((".py", ".so", ".c")):
                h.update(name.encode())
                with open(os.path.join(here, name), "rb") as f:
                    h.update(f.read())
        _SOURCE_DIGEST.append(h.hexdigest()[:16])
    env = sorted((k, v) for k, v in os.environ.items() if k.startswith("FUSEML_"))
    mine = hashlib.sha256(repr((_SOURCE_DIGEST[0], sorted(options.items()), env)).encode()).hexdigest()[:16]
    user = torch.compiler.config.cache_key_tag
    return f"{user}+fuseml-{mine}" if user else f"fuseml-{mine}"


def _describe(x):
    """An input of a kept graph as plain values: a tensor's layout, or the value itself."""
    if isinstance(x, torch.Tensor):
        dims = (*x.shape, *x.stride(), x.storage_offset())
        if not all(type(d) is int for d in dims):
            raise Unkept("symbolic sizes")
        return ("tensor", tuple(x.shape), tuple(x.stride()), int(x.storage_offset()), x.dtype, str(x.device))
    if x is None or type(x) in (int, float, bool):
        return ("value", x)
    raise Unkept(f"an input of type {type(x).__name__}")


def _has_symbols(gm):
    for node in gm.graph.nodes:
        val = node.meta.get("val")
        for v in val if isinstance(val, (list, tuple)) else (val,):
            if isinstance(v, torch.SymInt):
                return True
            if isinstance(v, torch.Tensor) and not all(type(d) is int for d in (*v.shape, *v.stride())):
                return True
    return False


def _pickled(gm):
    """(gm as bytes, {constant: device}): its nodes and the tensors its get_attr nodes read,
    before any pass edits it; the node values are kept apart (kept_values.py). Not torch.fx's
    own pickling: that re-traces the generated code on loading, which runs the ops on constants
    (a `lift_fresh_copy` of a Hugging Face cache's empty tensor) as Python and keeps their
    results as new CPU constants. The constants are written as CPU copies and moved back to
    their devices on a hit: an empty CUDA tensor has no data pointer for torch's pickling."""
    from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily

    nodes, constants, devices = [], {}, {}
    for node in gm.graph.nodes:
        args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: _Ref(n.name))
        nodes.append((node.op, node.name, _target_form(node.target), args, kwargs))
        if node.op != "get_attr":
            continue
        t = operator.attrgetter(node.target)(gm)
        if not isinstance(t, torch.Tensor):
            raise Unkept(f"a constant of type {type(t).__name__} ({node.target})")
        if isinstance(t, FakeTensor):
            raise Unkept(f"a fake constant {node.target}")
        with unset_fake_temporarily():
            copy = torch.empty(t.shape, dtype=t.dtype) if t.numel() == 0 else t.detach().to("cpu", copy=True)
        constants[node.target], devices[node.target] = copy, str(t.device)
    return pickle.dumps((nodes, constants)), devices


def _unpickled(data, devices):
    """The graph module _pickled wrote, its constants on their devices again. Its Python code is
    written at its first call, where torch can defer it: the backend runs the graphs it makes
    from this one, and writing a T5 backward's code costs ~0.1 s."""
    nodes, constants = pickle.loads(data)
    graph, made = torch.fx.Graph(), {}
    for op, name, target, args, kwargs in nodes:
        args, kwargs = _refs_resolved((args, kwargs), made)
        made[name] = graph.create_node(op, _target_named(target), args, kwargs, name)
    return graph_code.lazy_module({name: t.to(devices[name]) for name, t in constants.items()}, graph)


class _Ref:
    """A node named in another node's arguments, as _pickled writes it."""

    def __init__(self, name):
        self.name = name


def _refs_resolved(value, made):
    return torch.fx.node.map_aggregate(value, lambda a: made[a.name] if isinstance(a, _Ref) else a)


def _target_form(target):
    """A node's target as something that pickles: torch's operators by name (they do not
    pickle), anything else (a Python function fuseml's rewrites call, operator.getitem) as
    itself, which pickle writes as a reference to its module."""
    if isinstance(target, torch._ops.OpOverload):
        return ("overload", target.namespace, target._opname, target._overloadname)
    if isinstance(target, torch._ops.OpOverloadPacket):
        return ("packet", target._qualified_op_name.split("::")[0], target.__name__)
    if isinstance(target, torch._ops.HigherOrderOperator):
        return ("higher_order", target.name())
    return ("object", target)


def _target_named(form):
    kind, *names = form
    if kind == "overload":
        namespace, op, overload = names
        return getattr(getattr(getattr(torch.ops, namespace), op), overload)
    if kind == "packet":
        return getattr(getattr(torch.ops, names[0]), names[1])
    if kind == "higher_order":
        return getattr(torch.ops.higher_order, names[0])
    return names[0]


def _keeper(which, compile_fn):
    """fuseml's compile function for `which`, its result wrapped in a KeptGraph that holds what a
    hit needs: the graph as the backend's passes left it (edited()), or, where none ran (a
    graph without CUDA tensors), as aot_autograd handed it; a graph that cannot be kept
    compiles the same and is marked unkept."""

    def compile(gm, example_inputs):
        kept = KeptGraph(which)
        try:
            if _has_symbols(gm):
                raise Unkept("symbolic sizes")
            kept.inputs = [_describe(x) for x in example_inputs]
            kept.verdict = _verdict_now(which, gm)
        except Exception as e:
            kept.refuse(e)
        token = _making.set(kept)
        try:
            kept.fn = _compile_as_aot_would(which, compile_fn, gm, example_inputs)
        finally:
            _making.reset(token)
        if kept.unkept is None and kept.graph is None:  # no pass ran: the graph as handed over
            try:
                kept.keep(gm)
            except Exception as e:
                kept.refuse(e)
        return kept

    return compile


def _compile_as_aot_would(which, compile_fn, gm, example_inputs):
    """A backward compiled with no fake mode active, as aot_autograd's lazy backward is (at the
    first backward call): its lowering with the forward here would run inside the forward's
    fake mode, where fuseml's passes that compute on a graph's real constants fail."""
    if which != "backward":
        return compile_fn(gm, example_inputs)
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily():
        return compile_fn(gm, example_inputs)


def _verdict_now(which, gm):
    """What direct_call reads from aot_autograd's metadata for an inference graph, read now."""
    if which != "inference":
        return None
    from . import direct_call

    tc = torch._guards.TracingContext.try_get()
    return direct_call.metadata_verdict(tc.fw_metadata if tc is not None else None)


class KeptGraph(OutputCode):
    """What fuseml's compiler returned for one aot_autograd graph, as torch's cache keeps it:
    called like the compiled graph (boxed: one argument list); pickled without the compiled
    function; after a hit's unpickling, post_compile compiles the kept graph again."""

    def __init__(self, which):
        # an instance attribute: aot_autograd wraps a backward in dynamo's disable(), which
        # copies the callable's __dict__ (the boxed mark with it) but not its class's
        self._boxed_call = True
        self.which = which
        self.fn = None
        self.graph = None  # bytes: the ATen graph, as fuseml's passes left it where they ran
        self.constants = None  # {attribute: device} of the tensors its get_attr nodes read
        self.padded = None  # the GEMMs the passes padded; None: no pass ran on the graph
        self.inputs = None  # its inputs, as _describe wrote them
        self.values = None  # its node values, as kept_values.described wrote them (or None)
        self.verdict = None  # inference: direct_call.metadata_verdict at the miss
        self.unkept = None  # why this graph cannot be kept, or None

    def keep(self, gm):
        """gm written down, as it is now."""
        self.graph, self.constants = _pickled(gm)
        self.values = kept_values.described(gm)

    def refuse(self, e):
        self.unkept = f"{type(e).__name__}: {e}"
        info_once("aot-unkept", "aot_autograd's %s graph not kept for the next process: %s", self.which, self.unkept)

    def __call__(self, args):
        fn = self.fn
        return fn(args) if getattr(fn, "_boxed_call", False) else fn(*args)

    def prepare_for_serialization(self):
        """On the copy torch pickles: the compiled function stays in this process. A field that
        does not pickle fails torch's pickling of the entry, which fuseml notes and counts as a
        bypass (_UnsavedNote)."""
        if self.unkept is not None:
            from torch._functorch._aot_autograd.autograd_cache import BypassAOTAutogradCache

            raise BypassAOTAutogradCache(f"fuseml: {self.which} graph not kept ({self.unkept})")
        self.fn = None

    def set_triton_bundle(self, triton_bundle):
        pass  # no Triton kernels here

    def post_compile(self, example_inputs, constants, graph_kwargs):
        """A hit: the kept graph, its node values made again (kept_values.py), compiled by the
        dynamo graph's fuseml compiler of this `which` (which skips the passes the graph has
        been through: edited_before())."""
        compilers = _compilers.get()
        if compilers is None or self.which not in compilers:
            raise RuntimeError("fuseml: a kept graph loaded outside fuseml's compile")
        token = _restoring.set(self)
        try:
            gm = _unpickled(self.graph, self.constants)
            fakes = kept_values.restored(gm, self.values, self.inputs)
            self.fn = _compile_as_aot_would(self.which, compilers[self.which], gm, fakes)
        except Exception as e:
            # torch compiles the dynamo graph afresh: what this hit recorded is forgotten
            compilers.get("forget", lambda: None)()
            info_once("aot-reload", "a kept %s graph was compiled afresh: %s: %s", self.which, type(e).__name__, e)
            log.debug("fuseml: the kept graph's failure", exc_info=True)
            raise
        finally:
            _restoring.reset(token)
