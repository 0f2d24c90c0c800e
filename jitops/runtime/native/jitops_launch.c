/* jitops native launcher: one C call per kernel launch instead of a Python binding's argument
 * marshalling. The driver's launch entry point (cuLaunchKernel, hipModuleLaunchKernel: the same
 * signature) is passed in as an address, so this file links against no GPU library. Whole repeat
 * calls (RepeatCall, Dispatch) are in jitops_fastcall.c. */
#include "jitops_native.h"

#include <stdint.h>
#include <string.h>

/* launch(entry, kernel, gx, gy, gz, bx, by, bz, shared, stream, params) -> driver status */
static PyObject* launch(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  unsigned long long v[11];
  Py_ssize_t i;
  int rc;
  (void)self;
  if (nargs != 11) {
    PyErr_SetString(PyExc_TypeError, "launch takes 11 integer arguments");
    return NULL;
  }
  for (i = 0; i < 11; i++) {
    v[i] = PyLong_AsUnsignedLongLongMask(args[i]);
    if (v[i] == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
  }
  rc = ((launch_fn)(uintptr_t)v[0])((void*)(uintptr_t)v[1], (unsigned)v[2], (unsigned)v[3], (unsigned)v[4],
                                    (unsigned)v[5], (unsigned)v[6], (unsigned)v[7], (unsigned)v[8],
                                    (void*)(uintptr_t)v[9], (void**)(uintptr_t)v[10], NULL);
  return PyLong_FromLong(rc);
}

/* launch_buffer(entry, kernel, gx, gy, gz, bx, by, bz, shared, stream, buffer, size): the arguments
 * already laid out in one buffer, passed through `extra` (CU_LAUNCH_PARAM_BUFFER_POINTER / _SIZE;
 * HIP_LAUNCH_PARAM_* have the same values), so the driver copies one block instead of N pointers. */
static PyObject* launch_buffer(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  unsigned long long v[12];
  Py_ssize_t i;
  size_t size;
  void* extra[5];
  int rc;
  (void)self;
  if (nargs != 12) {
    PyErr_SetString(PyExc_TypeError, "launch_buffer takes 12 integer arguments");
    return NULL;
  }
  for (i = 0; i < 12; i++) {
    v[i] = PyLong_AsUnsignedLongLongMask(args[i]);
    if (v[i] == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
  }
  size = (size_t)v[11];
  extra[0] = (void*)(uintptr_t)1; /* BUFFER_POINTER */
  extra[1] = (void*)(uintptr_t)v[10];
  extra[2] = (void*)(uintptr_t)2; /* BUFFER_SIZE */
  extra[3] = &size;
  extra[4] = (void*)(uintptr_t)0; /* END */
  rc = ((launch_fn)(uintptr_t)v[0])((void*)(uintptr_t)v[1], (unsigned)v[2], (unsigned)v[3], (unsigned)v[4],
                                    (unsigned)v[5], (unsigned)v[6], (unsigned)v[7], (unsigned)v[8],
                                    (void*)(uintptr_t)v[9], NULL, extra);
  return PyLong_FromLong(rc);
}

/* ---------------------------------------------------------------- a launch entry that records
 * Stands in for the driver in tests and host-overhead measurements: stores what it was given and
 * returns the status set by probe_set_status. */
static struct {
  void* f;
  unsigned cfg[7];
  void* stream;
  void** params;
  long calls;
  int status;
  struct { void* f; void** params; } by_kernel[16]; /* the last launch of each recent kernel */
  unsigned next;
} probe;

static int probe_launch(void* f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned shared, void* stream, void** params, void** extra) {
  (void)extra;
  probe.f = f;
  probe.cfg[0] = gx; probe.cfg[1] = gy; probe.cfg[2] = gz;
  probe.cfg[3] = bx; probe.cfg[4] = by; probe.cfg[5] = bz; probe.cfg[6] = shared;
  probe.stream = stream;
  probe.params = params;
  probe.calls++;
  {
    unsigned i;
    for (i = 0; i < 16 && probe.by_kernel[i].f != f; i++) {}
    if (i == 16) i = probe.next++ % 16;
    probe.by_kernel[i].f = f;
    probe.by_kernel[i].params = params;
  }
  return probe.status;
}

static PyObject* probe_entry(PyObject* self, PyObject* noargs) {
  (void)self; (void)noargs;
  return PyLong_FromUnsignedLongLong((unsigned long long)(uintptr_t)&probe_launch);
}

static PyObject* probe_set_status(PyObject* self, PyObject* arg) {
  long v = PyLong_AsLong(arg);
  (void)self;
  if (v == -1 && PyErr_Occurred()) return NULL;
  probe.status = (int)v;
  Py_RETURN_NONE;
}

/* probe_last(nargs) -> (calls, kernel, (gx, gy, gz), (bx, by, bz), shared, stream, [8-byte argument values]);
 * the values are read through the recorded params, so their owner must still be alive. */
static PyObject* probe_last(PyObject* self, PyObject* arg) {
  Py_ssize_t n = PyLong_AsSsize_t(arg), i;
  PyObject* vals;
  (void)self;
  if (n == -1 && PyErr_Occurred()) return NULL;
  vals = PyList_New(0);
  if (vals == NULL) return NULL;
  for (i = 0; probe.params != NULL && i < n; i++) {
    unsigned long long v;
    PyObject* o;
    memcpy(&v, probe.params[i], 8);
    o = PyLong_FromUnsignedLongLong(v);
    if (o == NULL || PyList_Append(vals, o) < 0) { Py_XDECREF(o); Py_DECREF(vals); return NULL; }
    Py_DECREF(o);
  }
  return Py_BuildValue("lK(III)(III)IKN", probe.calls, (unsigned long long)(uintptr_t)probe.f, probe.cfg[0],
                       probe.cfg[1], probe.cfg[2], probe.cfg[3], probe.cfg[4], probe.cfg[5], probe.cfg[6],
                       (unsigned long long)(uintptr_t)probe.stream, vals);
}

/* probe_args(kernel, nargs) -> the 8-byte argument values of that kernel's last launch (read
 * through its params, so their owner must still be alive), or None when it was not launched lately. */
static PyObject* probe_args(PyObject* self, PyObject* args) {
  unsigned long long kernel;
  Py_ssize_t n, i;
  unsigned k;
  PyObject* vals;
  (void)self;
  if (!PyArg_ParseTuple(args, "Kn", &kernel, &n)) return NULL;
  for (k = 0; k < 16 && probe.by_kernel[k].f != (void*)(uintptr_t)kernel; k++) {}
  if (k == 16 || kernel == 0) Py_RETURN_NONE;
  vals = PyList_New(n);
  if (vals == NULL) return NULL;
  for (i = 0; i < n; i++) {
    unsigned long long v;
    PyObject* o;
    memcpy(&v, probe.by_kernel[k].params[i], 8);
    if ((o = PyLong_FromUnsignedLongLong(v)) == NULL) { Py_DECREF(vals); return NULL; }
    PyList_SET_ITEM(vals, i, o);
  }
  return vals;
}

static PyMethodDef methods[] = {
    {"launch", (PyCFunction)(void (*)(void))launch, METH_FASTCALL, "launch a kernel through a driver entry point"},
    {"launch_buffer", (PyCFunction)(void (*)(void))launch_buffer, METH_FASTCALL,
     "launch with the arguments packed in one buffer"},
    {"programmatic_setup", jt_programmatic_setup, METH_VARARGS,
     "the driver entries programmatic launches need; returns the address of their launch entry"},
    {"programmatic_mode", jt_programmatic_mode, METH_O, "1: in graph captures after a kernel that allows it; 2: always"},
    {"programmatic_register", jt_programmatic_register, METH_O,
     "a kernel that lets the next one launch early (its CUfunction)"},
    {"probe_entry", probe_entry, METH_NOARGS, "address of a launch entry that records its arguments"},
    {"probe_set_status", probe_set_status, METH_O, "the status the probe entry returns"},
    {"probe_last", probe_last, METH_O, "what the probe entry last received"},
    {"probe_args", probe_args, METH_VARARGS, "argument values of a kernel's last launch through the probe"},
    {"memory_released", jt_memory_released, METH_NOARGS,
     "memory a RepeatCall may remember was freed: every RepeatCall drops what it remembered"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "jitops_launch", NULL, -1, methods, NULL, NULL, NULL, NULL};

static int add_type(PyObject* m, const char* name, PyTypeObject* type) {
  if (PyType_Ready(type) < 0) return -1;
  Py_INCREF(type);
  if (PyModule_AddObject(m, name, (PyObject*)type) < 0) {
    Py_DECREF(type);
    return -1;
  }
  return 0;
}

PyMODINIT_FUNC PyInit_jitops_launch(void) {
  PyObject* m = PyModule_Create(&module);
  if (m == NULL) return NULL;
  if (add_type(m, "RepeatCall", &JtRepeatCallType) < 0 || add_type(m, "Dispatch", &JtDispatchType) < 0 ||
      add_type(m, "Entry", &JtEntryType) < 0) {
    Py_DECREF(m);
    return NULL;
  }
#ifdef JITOPS_LAUNCH_DIGEST
  /* Built with the wheel (setup.py): the digest of this file, so a stale build is not used. */
  if (PyModule_AddStringConstant(m, "source_digest", JITOPS_LAUNCH_DIGEST) < 0) {
    Py_DECREF(m);
    return NULL;
  }
#endif
  return m;
}
