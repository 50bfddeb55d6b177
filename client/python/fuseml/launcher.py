"""libfusemld: load a served CUBIN once per process and device (fm_module_load_bytes, through
ctypes) and launch it on torch's current stream (fm_module_launch: through the C extension
fuseml._launch where setup.py could build it, else ctypes; FUSEML_NO_FAST_LAUNCH=1 forces ctypes)."""

import ctypes
import ctypes.util
import functools
import os

import msgpack

from . import autostart, settings

_fast = None  # the C launch path (setup.py builds it when it can); ctypes otherwise
if settings.fast_launch():
    try:
        from . import _launch as _fast
    except ImportError:
        pass

_lib = None
_lib_error = None


class _Diag(ctypes.Structure):
    _fields_ = [("text", ctypes.c_char * 1024)]


def _candidates():
    env = settings.library()
    if env:
        yield env
    exe = autostart.daemon_binary()
    if exe:
        # A build tree (build/daemon/fusemld beside build/client/libfusemld.so) or an
        # installed prefix (bin/ beside lib/).
        root = os.path.dirname(os.path.dirname(os.path.realpath(exe)))
        yield os.path.join(root, "client", "libfusemld.so")
        yield os.path.join(root, "lib", "libfusemld.so")
    found = ctypes.util.find_library("fusemld")
    if found:
        yield found


def library():
    """The loaded libfusemld, or None (the reason in error())."""
    global _lib, _lib_error
    if _lib is not None or _lib_error is not None:
        return _lib
    tried = []
    for path in _candidates():
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            tried.append(f"{path}: {e}")
            continue
        lib.fm_module_load_bytes.argtypes = [
            ctypes.c_char_p,
            ctypes.c_size_t,
            ctypes.c_char_p,
            ctypes.c_size_t,
            ctypes.POINTER(ctypes.c_void_p),
            ctypes.POINTER(_Diag),
        ]
        lib.fm_module_load_bytes.restype = ctypes.c_int
        lib.fm_module_launch.argtypes = [
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_int64,
            ctypes.c_void_p,
            ctypes.POINTER(_Diag),
        ]
        lib.fm_module_launch.restype = ctypes.c_int
        if _fast is not None:
            _fast.bind(ctypes.cast(lib.fm_module_launch, ctypes.c_void_p).value)
        _lib = lib
        return lib
    _lib_error = "libfusemld not found (set FUSEML_LIB)" + (": " + "; ".join(tried) if tried else "")
    return None


def error():
    return _lib_error


class Module:
    """One loaded kernel in the current CUDA context."""

    def __init__(self, cubin, meta):
        lib = library()
        if lib is None:
            raise RuntimeError(_lib_error)
        self.lib = lib
        self.diag = _Diag()
        handle = ctypes.c_void_p()
        meta_bytes = msgpack.packb(meta, use_bin_type=True)
        rc = lib.fm_module_load_bytes(
            cubin, len(cubin), meta_bytes, len(meta_bytes), ctypes.byref(handle), ctypes.byref(self.diag)
        )
        if rc != 0:
            raise RuntimeError(f"fm_module_load_bytes: {rc}: {self.diag.text.decode(errors='replace')}")
        self.handle = handle.value
        self.n_in = meta["n_inputs"]
        self.n_out = meta["n_outputs"]
        # A cuBLASLt plan (kind "cublaslt") takes a scratch buffer after the outputs:
        # fixed + outer * per_row bytes (fm_meta.h "blas"), the caller's to allocate; so does
        # a split column reduction (its groups' partials: "finish", fixed bytes).
        blas, finish = meta.get("blas"), meta.get("finish")
        self.scratch = tuple(blas["scratch"]) if blas else (finish["scratch"], 0) if finish else None
        self.static_outer = meta.get("outer", -1)  # -1: dim 0 is the launch's
        self._ins = (ctypes.c_void_p * max(1, self.n_in))()
        self._outs = (ctypes.c_void_p * (max(1, self.n_out) + 1))()
        self._launch = lib.fm_module_launch
        self._diag_ref = ctypes.byref(self.diag)
        # launch_flat(*in_ptrs, *out_ptrs[, scratch], outer, stream): what generated code
        # calls (no tuple per launch); None without the C extension
        self.launch_flat = None
        if _fast is not None:
            # an instance attribute shadows the ctypes method below: no per-call test
            self.launch = functools.partial(_fast.launch, self.handle)
            if hasattr(_fast, "launch_flat"):
                n_ptrs = self.n_in + self.n_out + (1 if self.scratch is not None else 0)
                self.launch_flat = functools.partial(_fast.launch_flat, self.handle, self.n_in, n_ptrs)

    def scratch_bytes(self, outer):
        """Bytes of scratch a launch at outer needs (0: none)."""
        if self.scratch is None:
            return 0
        fixed, per_row = self.scratch
        rows = self.static_outer if self.static_outer >= 0 else max(outer, 0)
        return fixed + rows * per_row

    def launch(self, in_ptrs, out_ptrs, outer, stream):
        ins, outs = self._ins, self._outs
        for i, p in enumerate(in_ptrs):
            ins[i] = p
        for i, p in enumerate(out_ptrs):
            outs[i] = p
        rc = self._launch(self.handle, ins, outs, outer, stream, self._diag_ref)
        if rc != 0:
            raise RuntimeError(f"fm_module_launch: {rc}: {self.diag.text.decode(errors='replace')}")
