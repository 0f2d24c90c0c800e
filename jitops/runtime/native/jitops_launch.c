/* jitops native launcher: one C call per kernel launch instead of a Python binding's argument
 * marshalling. The driver's launch entry point (cuLaunchKernel, hipModuleLaunchKernel: the same
 * signature) is passed in as an address, so this file links against no GPU library. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

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

/* ---------------------------------------------------------------- FastCall
 * A whole repeat call of a bound plan in C: the arrays' pointers (their data_ptr()), the outputs
 * (allocated by Python callables, e.g. torch.empty_like), the current stream, then each launch with
 * its pointer arguments written into this object's own argument storage. Every Python callback runs
 * before the first argument is written, and nothing from there to the last launch gives up the
 * GIL, so concurrent callers never see each other's pointers. */

typedef struct {
  launch_fn entry;
  void* handle;
  unsigned grid[3], block[3], shared;
  Py_ssize_t nargs, nslots;
  unsigned char* storage; /* 8 bytes per kernel argument, the value in the low bytes */
  void** params;          /* params[i] = storage + 8 i */
  Py_ssize_t* slot_arg;   /* argument written by each slot ... */
  Py_ssize_t* slot_src;   /* ... from this pointer of the call (inputs, then outputs) */
} fc_step;

typedef struct {
  PyObject_HEAD
  Py_ssize_t n_inputs, n_outputs, n_steps;
  PyObject** makers;    /* per output: the allocator */
  Py_ssize_t* like;     /* per output: the input passed to its allocator, or -1 (called with none) */
  PyObject* stream_fn;  /* stream = stream_fn(stream_arg), or stream_fn() when stream_arg is NULL */
  PyObject* stream_arg;
  PyObject* fail;       /* fail(step, rc, stream, params): retries the launch or raises its error */
  PyObject* ptr_name;
  PyObject* expect;     /* per input: None (must be None) or (type, shape, dtype, device) of a contiguous array */
  PyObject *shape_name, *dtype_name, *device_name, *contiguous_name;
  fc_step* steps;
} FastCall;

static void fc_free_steps(FastCall* self) {
  Py_ssize_t i;
  if (self->steps == NULL) return;
  for (i = 0; i < self->n_steps; i++) {
    PyMem_Free(self->steps[i].storage);
    PyMem_Free(self->steps[i].params);
    PyMem_Free(self->steps[i].slot_arg);
    PyMem_Free(self->steps[i].slot_src);
  }
  PyMem_Free(self->steps);
  self->steps = NULL;
}

static void fc_dealloc(FastCall* self) {
  Py_ssize_t i;
  if (self->makers != NULL) {
    for (i = 0; i < self->n_outputs; i++) Py_XDECREF(self->makers[i]);
    PyMem_Free(self->makers);
  }
  PyMem_Free(self->like);
  Py_XDECREF(self->stream_fn);
  Py_XDECREF(self->stream_arg);
  Py_XDECREF(self->fail);
  Py_XDECREF(self->ptr_name);
  Py_XDECREF(self->expect);
  Py_XDECREF(self->shape_name);
  Py_XDECREF(self->dtype_name);
  Py_XDECREF(self->device_name);
  Py_XDECREF(self->contiguous_name);
  fc_free_steps(self);
  Py_TYPE(self)->tp_free((PyObject*)self);
}

static int as_index(PyObject* seq, Py_ssize_t i, unsigned long long* out) {
  PyObject* item = PySequence_GetItem(seq, i);
  if (item == NULL) return -1;
  *out = PyLong_AsUnsignedLongLongMask(item);
  Py_DECREF(item);
  return (*out == (unsigned long long)-1 && PyErr_Occurred()) ? -1 : 0;
}

/* FastCall(n_inputs, outputs, stream_fn, stream_arg, fail, steps, expect)
 *   outputs: [(allocator, input index or -1)]
 *   steps:   [(entry, handle, (gx, gy, gz), (bx, by, bz), shared, storage bytes, [(arg, source)])]
 *   fail(step, rc, stream, params address): retries that launch (returns) or raises
 *   expect:  per input None or (type, shape, dtype, device): what matches(inputs) checks */
static int fc_init(FastCall* self, PyObject* args, PyObject* kwds) {
  Py_ssize_t n_inputs, i, j;
  PyObject *outputs, *stream_fn, *stream_arg, *fail, *steps, *expect;
  (void)kwds;
  if (!PyArg_ParseTuple(args, "nOOOOOO", &n_inputs, &outputs, &stream_fn, &stream_arg, &fail, &steps, &expect))
    return -1;
  if (!PyList_Check(outputs) || !PyList_Check(steps) || !PyCallable_Check(stream_fn) || !PyCallable_Check(fail) ||
      !PyTuple_Check(expect) || PyTuple_GET_SIZE(expect) != n_inputs) {
    PyErr_SetString(PyExc_TypeError,
                    "FastCall(n_inputs, outputs: list, stream_fn, stream_arg, fail, steps: list, expect: tuple)");
    return -1;
  }
  for (i = 0; i < n_inputs; i++) {
    PyObject* e = PyTuple_GET_ITEM(expect, i);
    if (e != Py_None && !(PyTuple_Check(e) && PyTuple_GET_SIZE(e) == 4 && PyType_Check(PyTuple_GET_ITEM(e, 0)))) {
      PyErr_SetString(PyExc_TypeError, "FastCall: expect[i] is None or (type, shape, dtype, device)");
      return -1;
    }
  }
  if (self->steps != NULL || self->makers != NULL) {
    PyErr_SetString(PyExc_RuntimeError, "FastCall is initialized once");
    return -1;
  }
  self->n_inputs = n_inputs;
  self->n_outputs = PyList_GET_SIZE(outputs);
  self->makers = PyMem_Calloc((size_t)self->n_outputs + 1, sizeof(PyObject*));
  self->like = PyMem_Calloc((size_t)self->n_outputs + 1, sizeof(Py_ssize_t));
  if (self->makers == NULL || self->like == NULL) { PyErr_NoMemory(); return -1; }
  for (i = 0; i < self->n_outputs; i++) {
    PyObject* o = PyList_GET_ITEM(outputs, i);
    PyObject* maker;
    Py_ssize_t like;
    if (!PyArg_ParseTuple(o, "On", &maker, &like)) return -1;
    if (!PyCallable_Check(maker) || like < -1 || like >= n_inputs) {
      PyErr_SetString(PyExc_ValueError, "FastCall: an output needs a callable and an input index or -1");
      return -1;
    }
    Py_INCREF(maker);
    self->makers[i] = maker;
    self->like[i] = like;
  }
  Py_INCREF(stream_fn);
  self->stream_fn = stream_fn;
  if (stream_arg != Py_None) {
    Py_INCREF(stream_arg);
    self->stream_arg = stream_arg;
  }
  Py_INCREF(fail);
  self->fail = fail;
  self->ptr_name = PyUnicode_InternFromString("data_ptr");
  self->shape_name = PyUnicode_InternFromString("shape");
  self->dtype_name = PyUnicode_InternFromString("dtype");
  self->device_name = PyUnicode_InternFromString("device");
  self->contiguous_name = PyUnicode_InternFromString("is_contiguous");
  if (!self->ptr_name || !self->shape_name || !self->dtype_name || !self->device_name || !self->contiguous_name)
    return -1;
  Py_INCREF(expect);
  self->expect = expect;
  self->n_steps = PyList_GET_SIZE(steps);
  self->steps = PyMem_Calloc((size_t)self->n_steps + 1, sizeof(fc_step));
  if (self->steps == NULL) { PyErr_NoMemory(); return -1; }
  for (i = 0; i < self->n_steps; i++) {
    fc_step* st = &self->steps[i];
    unsigned long long entry, handle, shared, v;
    PyObject *grid, *block, *slots;
    const char* data;
    Py_ssize_t size;
    if (!PyArg_ParseTuple(PyList_GET_ITEM(steps, i), "KKOOKy#O", &entry, &handle, &grid, &block, &shared, &data,
                          &size, &slots))
      return -1;
    if (size % 8 != 0 || !PyList_Check(slots)) {
      PyErr_SetString(PyExc_ValueError, "FastCall: storage of 8 bytes per argument and a list of slots");
      return -1;
    }
    st->entry = (launch_fn)(uintptr_t)entry;
    st->handle = (void*)(uintptr_t)handle;
    st->shared = (unsigned)shared;
    for (j = 0; j < 3; j++) {
      if (as_index(grid, j, &v) < 0) return -1;
      st->grid[j] = (unsigned)v;
      if (as_index(block, j, &v) < 0) return -1;
      st->block[j] = (unsigned)v;
    }
    st->nargs = size / 8;
    st->storage = PyMem_Malloc((size_t)size + 8);
    st->params = PyMem_Malloc(((size_t)st->nargs + 1) * sizeof(void*));
    st->nslots = PyList_GET_SIZE(slots);
    st->slot_arg = PyMem_Malloc(((size_t)st->nslots + 1) * sizeof(Py_ssize_t));
    st->slot_src = PyMem_Malloc(((size_t)st->nslots + 1) * sizeof(Py_ssize_t));
    if (!st->storage || !st->params || !st->slot_arg || !st->slot_src) { PyErr_NoMemory(); return -1; }
    memcpy(st->storage, data, (size_t)size);
    for (j = 0; j < st->nargs; j++) st->params[j] = st->storage + 8 * j;
    for (j = 0; j < st->nslots; j++) {
      Py_ssize_t arg, src;
      if (!PyArg_ParseTuple(PyList_GET_ITEM(slots, j), "nn", &arg, &src)) return -1;
      if (arg < 0 || arg >= st->nargs || src < 0 || src >= n_inputs + self->n_outputs) {
        PyErr_SetString(PyExc_ValueError, "FastCall: a slot names an argument or pointer that does not exist");
        return -1;
      }
      st->slot_arg[j] = arg;
      st->slot_src[j] = src;
    }
  }
  return 0;
}

#define FC_MAX_PTRS 64

/* A launch returned rc: fail(step, rc, stream, params) may retry it (returns) or raise. It gets a
 * private copy of the arguments: Python code runs in the callback, and another thread's call of
 * this object may rewrite the storage meanwhile. */
static int fc_failed(FastCall* self, fc_step* st, Py_ssize_t i, int rc, unsigned long long stream) {
  unsigned char* copy = PyMem_Malloc((size_t)st->nargs * 8 + 8);
  void** params = PyMem_Malloc(((size_t)st->nargs + 1) * sizeof(void*));
  PyObject* r = NULL;
  Py_ssize_t j;
  if (copy == NULL || params == NULL) {
    PyErr_NoMemory();
  } else {
    memcpy(copy, st->storage, (size_t)st->nargs * 8);
    for (j = 0; j < st->nargs; j++) params[j] = copy + 8 * j;
    r = PyObject_CallFunction(self->fail, "niKK", i, rc, stream, (unsigned long long)(uintptr_t)params);
  }
  PyMem_Free(copy);
  PyMem_Free(params);
  if (r == NULL) return -1;
  Py_DECREF(r);
  return 0;
}

static int fc_pointer(PyObject* obj, PyObject* name, unsigned long long* out) {
  PyObject* r;
  if (obj == Py_None) {
    *out = 0;
    return 0;
  }
  r = PyObject_CallMethodObjArgs(obj, name, NULL);
  if (r == NULL) return -1;
  *out = PyLong_AsUnsignedLongLongMask(r);
  Py_DECREF(r);
  return (*out == (unsigned long long)-1 && PyErr_Occurred()) ? -1 : 0;
}

/* The call itself: inputs is a tuple. */
static PyObject* fc_run(FastCall* self, PyObject* inputs) {
  PyObject* outs[FC_MAX_PTRS];
  unsigned long long ptrs[FC_MAX_PTRS], stream;
  Py_ssize_t i, j, made = 0;
  PyObject *r, *result = NULL;
  if (PyTuple_GET_SIZE(inputs) != self->n_inputs || self->n_inputs + self->n_outputs > FC_MAX_PTRS ||
      self->n_outputs < 1) {
    PyErr_Format(PyExc_TypeError, "FastCall expects %zd inputs (got %zd)", self->n_inputs, PyTuple_GET_SIZE(inputs));
    return NULL;
  }
  for (i = 0; i < self->n_inputs; i++)
    if (fc_pointer(PyTuple_GET_ITEM(inputs, i), self->ptr_name, &ptrs[i]) < 0) return NULL;
  for (i = 0; i < self->n_outputs; i++) {
    PyObject* o = self->like[i] < 0 ? PyObject_CallObject(self->makers[i], NULL)
                                    : PyObject_CallFunctionObjArgs(self->makers[i],
                                                                   PyTuple_GET_ITEM(inputs, self->like[i]), NULL);
    if (o == NULL) goto done;
    outs[made++] = o;
    if (fc_pointer(o, self->ptr_name, &ptrs[self->n_inputs + i]) < 0) goto done;
  }
  r = self->stream_arg ? PyObject_CallFunctionObjArgs(self->stream_fn, self->stream_arg, NULL)
                       : PyObject_CallObject(self->stream_fn, NULL);
  if (r == NULL) goto done;
  stream = PyLong_AsUnsignedLongLongMask(r);
  Py_DECREF(r);
  if (stream == (unsigned long long)-1 && PyErr_Occurred()) goto done;
  /* From here to the last launch: no Python code runs, the GIL stays held. */
  for (i = 0; i < self->n_steps; i++) {
    fc_step* st = &self->steps[i];
    int rc;
    for (j = 0; j < st->nslots; j++) memcpy(st->storage + 8 * st->slot_arg[j], &ptrs[st->slot_src[j]], 8);
    rc = st->entry(st->handle, st->grid[0], st->grid[1], st->grid[2], st->block[0], st->block[1], st->block[2],
                   st->shared, (void*)(uintptr_t)stream, st->params, NULL);
    if (rc != 0 && fc_failed(self, st, i, rc, stream) < 0) goto done;
  }
  if (made == 1) {
    result = outs[0];
    made = 0;
  } else {
    result = PyTuple_New(made);
    if (result == NULL) goto done;
    for (i = 0; i < made; i++) PyTuple_SET_ITEM(result, i, outs[i]);
    made = 0;
  }
done:
  for (i = 0; i < made; i++) Py_DECREF(outs[i]);
  return result;
}

/* fc(inputs: tuple) -> the output, or a tuple of them */
static PyObject* fc_call(FastCall* self, PyObject* args, PyObject* kwds) {
  if (kwds != NULL || PyTuple_GET_SIZE(args) != 1 || !PyTuple_Check(PyTuple_GET_ITEM(args, 0))) {
    PyErr_SetString(PyExc_TypeError, "FastCall takes one tuple of inputs");
    return NULL;
  }
  return fc_run(self, PyTuple_GET_ITEM(args, 0));
}

/* 1: every input is what this call was bound for, 0: not (the general path takes it), -1: error. */
static int fc_attr_equal(PyObject* obj, PyObject* name, PyObject* want, int identity) {
  PyObject* v = PyObject_GetAttr(obj, name);
  int eq;
  if (v == NULL) return -1;
  eq = identity ? (v == want) : PyObject_RichCompareBool(v, want, Py_EQ);
  Py_DECREF(v);
  return eq;
}

static int fc_matches(FastCall* self, PyObject* inputs) {
  Py_ssize_t i;
  if (!PyTuple_Check(inputs) || PyTuple_GET_SIZE(inputs) != self->n_inputs) return 0;
  for (i = 0; i < self->n_inputs; i++) {
    PyObject* v = PyTuple_GET_ITEM(inputs, i);
    PyObject* e = PyTuple_GET_ITEM(self->expect, i);
    PyObject* r;
    int ok;
    if (e == Py_None || v == Py_None) {
      if (e != v) return 0;
      continue;
    }
    if (!PyObject_TypeCheck(v, (PyTypeObject*)PyTuple_GET_ITEM(e, 0))) return 0;
    if ((ok = fc_attr_equal(v, self->dtype_name, PyTuple_GET_ITEM(e, 2), 1)) != 1) return ok;
    if ((ok = fc_attr_equal(v, self->shape_name, PyTuple_GET_ITEM(e, 1), 0)) != 1) return ok;
    if ((ok = fc_attr_equal(v, self->device_name, PyTuple_GET_ITEM(e, 3), 0)) != 1) return ok;
    r = PyObject_CallMethodObjArgs(v, self->contiguous_name, NULL);
    if (r == NULL) return -1;
    ok = r == Py_True;
    Py_DECREF(r);
    if (!ok) return 0;
  }
  return 1;
}

static PyObject* fc_matches_py(FastCall* self, PyObject* inputs) {
  int m = fc_matches(self, inputs);
  if (m < 0) return NULL;
  return PyBool_FromLong(m);
}

static PyMethodDef fc_methods[] = {
    {"matches", (PyCFunction)fc_matches_py, METH_O, "whether these inputs are what the call was bound for"},
    {NULL, NULL, 0, NULL}};

static PyTypeObject FastCallType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "jitops_launch.FastCall",
    .tp_basicsize = sizeof(FastCall),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "a bound plan's repeat call, in C",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)fc_init,
    .tp_dealloc = (destructor)fc_dealloc,
    .tp_call = (ternaryfunc)fc_call,
    .tp_methods = fc_methods,
};

/* ---------------------------------------------------------------- Dispatch
 * The repeat calls of one op: finds the bound call of this backend whose attributes and input
 * signatures match, and runs it, without building and hashing a key. Newest first, at most
 * DISPATCH_MAX (the engine's dictionary still holds every bound call). */

#define DISPATCH_MAX 16

typedef struct {
  PyObject_HEAD
  PyObject* entries; /* list of (backend, attrs tuple, FastCall) */
  PyObject* miss;    /* returned when nothing matches */
} Dispatch;

static void dispatch_dealloc(Dispatch* self) {
  Py_XDECREF(self->entries);
  Py_XDECREF(self->miss);
  Py_TYPE(self)->tp_free((PyObject*)self);
}

static int dispatch_init(Dispatch* self, PyObject* args, PyObject* kwds) {
  PyObject* miss;
  (void)kwds;
  if (!PyArg_ParseTuple(args, "O", &miss)) return -1;
  Py_XDECREF(self->entries);
  self->entries = PyList_New(0);
  if (self->entries == NULL) return -1;
  Py_INCREF(miss);
  Py_XSETREF(self->miss, miss);
  return 0;
}

/* add(backend, attrs: tuple, call: FastCall) */
static PyObject* dispatch_add(Dispatch* self, PyObject* args) {
  PyObject *backend, *attrs, *call, *entry;
  if (!PyArg_ParseTuple(args, "OO!O!", &backend, &PyTuple_Type, &attrs, &FastCallType, &call)) return NULL;
  entry = PyTuple_Pack(3, backend, attrs, call);
  if (entry == NULL) return NULL;
  if (PyList_Insert(self->entries, 0, entry) < 0) {
    Py_DECREF(entry);
    return NULL;
  }
  Py_DECREF(entry);
  if (PyList_GET_SIZE(self->entries) > DISPATCH_MAX &&
      PyList_SetSlice(self->entries, DISPATCH_MAX, PyList_GET_SIZE(self->entries), NULL) < 0)
    return NULL;
  Py_RETURN_NONE;
}

/* d(backend, inputs: tuple, attrs: tuple) -> the result, or `miss` */
static PyObject* dispatch_call(Dispatch* self, PyObject* args, PyObject* kwds) {
  PyObject *backend, *inputs, *attrs;
  Py_ssize_t i;
  if (kwds != NULL || PyTuple_GET_SIZE(args) != 3 || !PyTuple_Check(PyTuple_GET_ITEM(args, 1))) {
    PyErr_SetString(PyExc_TypeError, "Dispatch takes (backend, inputs: tuple, attrs: tuple)");
    return NULL;
  }
  backend = PyTuple_GET_ITEM(args, 0);
  inputs = PyTuple_GET_ITEM(args, 1);
  attrs = PyTuple_GET_ITEM(args, 2);
  for (i = 0; i < PyList_GET_SIZE(self->entries); i++) {
    PyObject* entry = PyList_GET_ITEM(self->entries, i);
    PyObject *call, *result;
    int eq, m;
    if (PyTuple_GET_ITEM(entry, 0) != backend) continue;
    Py_INCREF(entry); /* the list may change while Python code runs below */
    eq = PyObject_RichCompareBool(PyTuple_GET_ITEM(entry, 1), attrs, Py_EQ);
    if (eq < 0) { Py_DECREF(entry); return NULL; }
    call = PyTuple_GET_ITEM(entry, 2);
    m = eq ? fc_matches((FastCall*)call, inputs) : 0;
    if (m < 0) { Py_DECREF(entry); return NULL; }
    if (m) {
      result = fc_run((FastCall*)call, inputs);
      Py_DECREF(entry);
      return result;
    }
    Py_DECREF(entry);
  }
  Py_INCREF(self->miss);
  return self->miss;
}

static PyObject* dispatch_clear(Dispatch* self, PyObject* noargs) {
  (void)noargs;
  if (PyList_SetSlice(self->entries, 0, PyList_GET_SIZE(self->entries), NULL) < 0) return NULL;
  Py_RETURN_NONE;
}

static Py_ssize_t dispatch_len(Dispatch* self) { return PyList_GET_SIZE(self->entries); }

static PyMethodDef dispatch_methods[] = {
    {"add", (PyCFunction)dispatch_add, METH_VARARGS, "add(backend, attrs, call): newest first"},
    {"clear", (PyCFunction)dispatch_clear, METH_NOARGS, "forget every bound call"},
    {NULL, NULL, 0, NULL}};

static PySequenceMethods dispatch_as_sequence = {.sq_length = (lenfunc)dispatch_len};

static PyTypeObject DispatchType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "jitops_launch.Dispatch",
    .tp_basicsize = sizeof(Dispatch),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "an op's repeat calls, found by attributes and input signatures",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)dispatch_init,
    .tp_dealloc = (destructor)dispatch_dealloc,
    .tp_call = (ternaryfunc)dispatch_call,
    .tp_methods = dispatch_methods,
    .tp_as_sequence = &dispatch_as_sequence,
};

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

static PyMethodDef methods[] = {
    {"launch", (PyCFunction)(void (*)(void))launch, METH_FASTCALL, "launch a kernel through a driver entry point"},
    {"launch_buffer", (PyCFunction)(void (*)(void))launch_buffer, METH_FASTCALL,
     "launch with the arguments packed in one buffer"},
    {"probe_entry", probe_entry, METH_NOARGS, "address of a launch entry that records its arguments"},
    {"probe_set_status", probe_set_status, METH_O, "the status the probe entry returns"},
    {"probe_last", probe_last, METH_O, "what the probe entry last received"},
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
  if (add_type(m, "FastCall", &FastCallType) < 0 || add_type(m, "Dispatch", &DispatchType) < 0) {
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
