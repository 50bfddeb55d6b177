/* _launch.c: the per-launch hot path of fuseml.launcher in C. ctypes spends several
 * microseconds per fm_module_launch converting arguments (two pointer arrays, an int64, a
 * stream, a diag reference) through its generic FFI; this module does the same call with
 * PyLong_AsVoidPtr and a stack array.
 *
 * It does not link libfusemld: launcher.py hands it the address of fm_module_launch from
 * the ctypes-loaded library (bind), so both paths call the very same library and this file
 * builds with nothing but Python's headers. If it cannot be built or imported, launcher.py
 * keeps using ctypes.
 *
 *   bind(fn_address)                                  once per process
 *   launch(handle, in_ptrs, out_ptrs, outer, stream)  -> None, RuntimeError on failure
 *   launch_flat(handle, n_in, n_ptrs, p_1, ..., p_n_ptrs, outer, stream)
 *       the same with the pointers as arguments (the first n_in the inputs, the rest the
 *       outputs and a plan's scratch; exactly n_ptrs of them): generated code calls it with
 *       no tuple to build, and so no object for Python's garbage collector to count, per
 *       launch (launcher.Module binds the first three) */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#define MAX_PTRS 64 /* inputs or outputs per kernel (FM_MAX_TENSORS is lower) */

typedef struct diag { /* layout of fm_diag (protocol/fm_error.h) */
  char text[1024];
} diag;

typedef int (*launch_fn)(void *m, void *const *inputs, void *const *outputs, int64_t outer, void *stream, diag *d);

static launch_fn fm_launch;

static PyObject *bind(PyObject *self, PyObject *arg) {
  (void)self;
  void *p = PyLong_AsVoidPtr(arg);
  if (!p) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "bind: NULL function address");
    return NULL;
  }
  fm_launch = (launch_fn)p;
  Py_RETURN_NONE;
}

/* A sequence of ints (device pointers) -> out[0..n); -1 with an exception set. */
static Py_ssize_t ptrs(PyObject *seq, void **out, const char *what) {
  PyObject *fast = PySequence_Fast(seq, what);
  if (!fast) return -1;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
  if (n > MAX_PTRS) {
    Py_DECREF(fast);
    PyErr_Format(PyExc_ValueError, "%s: %zd pointers (at most %d)", what, n, MAX_PTRS);
    return -1;
  }
  PyObject **items = PySequence_Fast_ITEMS(fast);
  for (Py_ssize_t i = 0; i < n; i++) {
    out[i] = PyLong_AsVoidPtr(items[i]);
    if (!out[i] && PyErr_Occurred()) {
      Py_DECREF(fast);
      return -1;
    }
  }
  Py_DECREF(fast);
  return n;
}

/* Calls fm_module_launch with the handle, outer and stream of args[0], args[n - 2] and
 * args[n - 1]; NULL with an exception set on failure. */
static PyObject *call(PyObject *const *args, Py_ssize_t nargs, void *const *ins, void *const *outs) {
  void *handle = PyLong_AsVoidPtr(args[0]);
  if (!handle && PyErr_Occurred()) return NULL;
  long long outer = PyLong_AsLongLong(args[nargs - 2]);
  if (outer == -1 && PyErr_Occurred()) return NULL;
  /* torch's stream handle is an int; 0 (the legacy default stream) is a valid one */
  void *stream = PyLong_AsVoidPtr(args[nargs - 1]);
  if (!stream && PyErr_Occurred()) return NULL;
  diag d;
  d.text[0] = '\0';
  int rc = fm_launch(handle, ins, outs, (int64_t)outer, stream, &d);
  if (rc != 0) {
    d.text[sizeof d.text - 1] = '\0';
    PyErr_Format(PyExc_RuntimeError, "fm_module_launch: %d: %s", rc, d.text);
    return NULL;
  }
  Py_RETURN_NONE;
}

static int bound(void) {
  if (fm_launch) return 1;
  PyErr_SetString(PyExc_RuntimeError, "launch: bind() was not called");
  return 0;
}

static PyObject *launch(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  (void)self;
  void *ins[MAX_PTRS], *outs[MAX_PTRS];
  if (nargs != 5) {
    PyErr_SetString(PyExc_TypeError, "launch(handle, in_ptrs, out_ptrs, outer, stream)");
    return NULL;
  }
  if (!bound()) return NULL;
  if (ptrs(args[1], ins, "in_ptrs") < 0 || ptrs(args[2], outs, "out_ptrs") < 0) return NULL;
  return call(args, nargs, ins, outs);
}

static PyObject *launch_flat(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  (void)self;
  void *ptr[2 * MAX_PTRS];
  if (nargs < 5) {
    PyErr_SetString(PyExc_TypeError, "launch_flat(handle, n_in, n_ptrs, pointers..., outer, stream)");
    return NULL;
  }
  if (!bound()) return NULL;
  Py_ssize_t n_in = PyLong_AsSsize_t(args[1]), want = PyLong_AsSsize_t(args[2]), n = nargs - 5;
  if ((n_in == -1 || want == -1) && PyErr_Occurred()) return NULL;
  if (n != want || n_in < 0 || n_in > n || n_in > MAX_PTRS || n - n_in > MAX_PTRS) {
    PyErr_Format(PyExc_ValueError, "launch_flat: %zd pointers (%zd expected), %zd of them inputs (at most %d each)", n,
                 want, n_in, MAX_PTRS);
    return NULL;
  }
  for (Py_ssize_t i = 0; i < n; i++) {
    ptr[i] = PyLong_AsVoidPtr(args[3 + i]);
    if (!ptr[i] && PyErr_Occurred()) return NULL;
  }
  return call(args, nargs, ptr, ptr + n_in);
}

static PyMethodDef methods[] = {
    {"bind", bind, METH_O, "bind(address of fm_module_launch)"},
    {"launch", (PyCFunction)(void (*)(void))launch, METH_FASTCALL, "launch(handle, in_ptrs, out_ptrs, outer, stream)"},
    {"launch_flat", (PyCFunction)(void (*)(void))launch_flat, METH_FASTCALL,
     "launch_flat(handle, n_in, n_ptrs, pointers..., outer, stream)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "fuseml._launch", "fm_module_launch without ctypes", -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__launch(void) { return PyModule_Create(&module); }
