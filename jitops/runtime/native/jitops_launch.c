/* jitops native launcher: one C call per kernel launch instead of a Python binding's argument
 * marshalling. The driver's launch entry point (cuLaunchKernel, hipModuleLaunchKernel: the same
 * signature) is passed in as an address, so this file links against no GPU library. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

typedef int (*launch_fn)(void* f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                         unsigned bz, unsigned shared, void* stream, void** params, void** extra);

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

static PyMethodDef methods[] = {
    {"launch", (PyCFunction)(void (*)(void))launch, METH_FASTCALL, "launch a kernel through a driver entry point"},
    {"launch_buffer", (PyCFunction)(void (*)(void))launch_buffer, METH_FASTCALL,
     "launch with the arguments packed in one buffer"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "jitops_launch", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit_jitops_launch(void) { return PyModule_Create(&module); }
