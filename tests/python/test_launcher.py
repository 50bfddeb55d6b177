"""launcher.Module without a GPU: a stand-in libfusemld (compiled here) records what
fm_module_launch receives; the C extension fuseml._launch (compiled here too) and the ctypes
fallback must pass it the same arguments and report a failure the same way."""

import ctypes
import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sysconfig

import pytest

from fuseml import launcher

STANDIN = r"""
#include <stddef.h>
#include <stdint.h>
#include <string.h>
typedef struct { char text[1024]; } fm_diag;
static uintptr_t last[8];
static int fail;
int fm_module_load_bytes(const void *c, size_t n, const void *m, size_t mn, void **h, fm_diag *d) {
  (void)c; (void)n; (void)m; (void)mn; (void)d; *h = (void *)0x1234; return 0; }
int fm_module_launch(void *m, void *const *in, void *const *out, int64_t outer, void *s, fm_diag *d) {
  last[0] = (uintptr_t)m; last[1] = (uintptr_t)in[0]; last[2] = (uintptr_t)in[1];
  last[3] = (uintptr_t)out[0]; last[4] = (uintptr_t)outer; last[5] = (uintptr_t)s;
  if (fail) { strcpy(d->text, "planted failure"); return -7; }
  return 0; }
void standin_last(uintptr_t *out) { memcpy(out, last, sizeof last); }
void standin_fail(int f) { fail = f; }
"""

SRC = os.path.join(os.path.dirname(__file__), "..", "..", "client", "python", "fuseml", "_launch.c")


def _cc():
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler")
    return cc


@pytest.fixture
def standin(tmp_path, monkeypatch):
    cc = _cc()
    so = tmp_path / "libstandin.so"
    (tmp_path / "standin.c").write_text(STANDIN)
    subprocess.run([cc, "-O2", "-fPIC", "-shared", str(tmp_path / "standin.c"), "-o", str(so)], check=True)
    monkeypatch.setenv("FUSEML_LIB", str(so))
    monkeypatch.setattr(launcher, "_lib", None)
    monkeypatch.setattr(launcher, "_lib_error", None)
    lib = ctypes.CDLL(str(so))
    lib.standin_last.argtypes = [ctypes.POINTER(ctypes.c_uint64)]
    return lib


def _extension(tmp_path):
    inc = sysconfig.get_paths()["include"]
    if not os.path.exists(os.path.join(inc, "Python.h")):
        pytest.skip("no Python headers")
    so = tmp_path / ("_launch" + importlib.machinery.EXTENSION_SUFFIXES[0])
    subprocess.run(
        [_cc(), "-O2", "-Wall", "-Wextra", "-Werror", "-fPIC", "-shared", "-I" + inc, SRC, "-o", str(so)], check=True
    )
    spec = importlib.util.spec_from_file_location("fuseml._launch", so)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _last(lib):
    out = (ctypes.c_uint64 * 8)()
    lib.standin_last(out)
    return list(out[:6])


@pytest.mark.parametrize("fast", [False, True])
def test_launch_arguments_and_failure(standin, tmp_path, monkeypatch, fast):
    monkeypatch.setattr(launcher, "_fast", _extension(tmp_path) if fast else None)
    m = launcher.Module(b"\0" * 16, {"n_inputs": 2, "n_outputs": 1})
    assert isinstance(m.launch, launcher.functools.partial) == fast
    m.launch([0x7F0000001000, 0x7F0000002000], [0x7F0000003000], 16384, 0x55AA)
    assert _last(standin) == [0x1234, 0x7F0000001000, 0x7F0000002000, 0x7F0000003000, 16384, 0x55AA]
    m.launch((0x10, 0x20), (0x30,), 1, 0)  # tuples, and the default stream 0
    assert _last(standin) == [0x1234, 0x10, 0x20, 0x30, 1, 0]
    standin.standin_fail(1)
    with pytest.raises(RuntimeError, match=r"fm_module_launch: -7: planted failure"):
        m.launch([1, 2], [3], 5, 0)
    standin.standin_fail(0)
    if fast:
        with pytest.raises(ValueError):
            m.launch([1] * 65, [3], 5, 0)  # more pointers than the stack array holds
        with pytest.raises(TypeError):
            m.launch([1, "x"], [3], 5, 0)


def test_flat_launch_takes_the_pointers_as_arguments(standin, tmp_path, monkeypatch):
    """What generated code calls: launch_flat(*inputs, *outputs, outer, stream), the handle,
    the input count and the pointer count bound by Module; a wrong count, a non-integer or a
    failure is an error, never a launch with pointers it was not given."""
    monkeypatch.setattr(launcher, "_fast", _extension(tmp_path))
    m = launcher.Module(b"\0" * 16, {"n_inputs": 2, "n_outputs": 1})
    m.launch_flat(0x7F0000001000, 0x7F0000002000, 0x7F0000003000, 16384, 0x55AA)
    assert _last(standin) == [0x1234, 0x7F0000001000, 0x7F0000002000, 0x7F0000003000, 16384, 0x55AA]
    with pytest.raises(ValueError, match="2 pointers \\(3 expected\\)"):
        m.launch_flat(0x10, 0x20, 1, 0)  # an output missing
    with pytest.raises(TypeError):
        m.launch_flat(0x10, "x", 0x30, 1, 0)
    standin.standin_fail(1)
    with pytest.raises(RuntimeError, match=r"fm_module_launch: -7: planted failure"):
        m.launch_flat(1, 2, 3, 5, 0)
    standin.standin_fail(0)
    # a split column reduction's scratch is one more pointer, after the outputs
    split = launcher.Module(b"\0" * 16, {"n_inputs": 2, "n_outputs": 1, "finish": {"scratch": 4096}})
    assert split.scratch_bytes(7) == 4096
    split.launch_flat(0x10, 0x20, 0x30, 0x40, 7, 0)
    assert _last(standin) == [0x1234, 0x10, 0x20, 0x30, 7, 0]
    with pytest.raises(ValueError):
        split.launch_flat(0x10, 0x20, 0x30, 7, 0)  # the scratch missing
    # without the extension there is no flat form: generated code uses the tuple one
    monkeypatch.setattr(launcher, "_fast", None)
    assert launcher.Module(b"\0" * 16, {"n_inputs": 2, "n_outputs": 1}).launch_flat is None
