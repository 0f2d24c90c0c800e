/* Dispatch: an op's repeat calls (FastCall, jitops_fastcall.c), found by a hash of the call's
 * signature; and the signature checks both use. */
#include "jitops_native.h"

#include <stdint.h>
#include <string.h>

/* ---------------------------------------------------------------- call signatures
 * What a bound call was made for: per input None, or an array of the expected type with this
 * shape, dtype and device, C-contiguous. */

void jt_sig_release(jt_sig* sig, Py_ssize_t n) {
  Py_ssize_t i;
  for (i = 0; i < n; i++) {
    Py_CLEAR(sig[i].shape);
    Py_CLEAR(sig[i].dtype);
    Py_CLEAR(sig[i].device);
  }
}

/* Reads the inputs' signatures: 1 read, 0 an input is not of type `base` (no match), -1 error. */
int jt_sig_read(PyObject* inputs, PyTypeObject* base, jt_sig* sig) {
  Py_ssize_t i, n = PyTuple_GET_SIZE(inputs);
  memset(sig, 0, (size_t)n * sizeof(jt_sig));
  for (i = 0; i < n; i++) {
    PyObject* v = PyTuple_GET_ITEM(inputs, i);
    if (v == Py_None) continue;
    if (!PyObject_TypeCheck(v, base)) {
      jt_sig_release(sig, i);
      return 0;
    }
    sig[i].dtype = PyObject_GetAttr(v, jt_s_dtype);
    sig[i].shape = sig[i].dtype ? PyObject_GetAttr(v, jt_s_shape) : NULL;
    sig[i].device = sig[i].shape ? PyObject_GetAttr(v, jt_s_device) : NULL;
    if (sig[i].device == NULL) {
      jt_sig_release(sig, i + 1);
      return -1;
    }
  }
  return 1;
}

/* 1 when the read signatures are what `expect` names, 0 not, -1 error. */
int jt_sig_equal(PyObject* expect, const jt_sig* sig, Py_ssize_t n) {
  Py_ssize_t i;
  int eq;
  if (PyTuple_GET_SIZE(expect) != n) return 0;
  for (i = 0; i < n; i++) {
    PyObject* e = PyTuple_GET_ITEM(expect, i);
    if ((e == Py_None) != (sig[i].dtype == NULL)) return 0;
    if (e == Py_None) continue;
    if (PyTuple_GET_ITEM(e, 2) != sig[i].dtype) return 0;
    if ((eq = PyObject_RichCompareBool(PyTuple_GET_ITEM(e, 1), sig[i].shape, Py_EQ)) != 1) return eq;
    if ((eq = PyObject_RichCompareBool(PyTuple_GET_ITEM(e, 3), sig[i].device, Py_EQ)) != 1) return eq;
  }
  return 1;
}

int jt_all_contiguous(PyObject* inputs) {
  Py_ssize_t i;
  for (i = 0; i < PyTuple_GET_SIZE(inputs); i++) {
    PyObject *v = PyTuple_GET_ITEM(inputs, i), *r;
    int ok;
    if (v == Py_None) continue;
    r = PyObject_CallMethodObjArgs(v, jt_s_is_contiguous, NULL);
    if (r == NULL) return -1;
    ok = r == Py_True;
    Py_DECREF(r);
    if (!ok) return 0;
  }
  return 1;
}

#define MIX(h, v) ((h) = ((h) ^ (Py_uhash_t)(v)) * (Py_uhash_t)1000003)

/* The hash of (backend, attrs, dtypes and shapes) that Dispatch files a bound call under; -1: error
 * (an unhashable attribute: the caller treats it as no match). */
static Py_hash_t sig_hash(PyObject* backend, PyObject* attrs, PyObject* const* shapes, PyObject* const* dtypes,
                          Py_ssize_t n) {
  Py_uhash_t h = (Py_uhash_t)0x9e3779b97f4a7c15ULL;
  Py_hash_t x;
  Py_ssize_t i;
  MIX(h, (uintptr_t)backend >> 4);
  if ((x = PyObject_Hash(attrs)) == -1) return -1;
  MIX(h, x);
  for (i = 0; i < n; i++) {
    if (dtypes[i] == NULL) {
      MIX(h, 0x51);
      continue;
    }
    MIX(h, (uintptr_t)dtypes[i] >> 4);
    if ((x = PyObject_Hash(shapes[i])) == -1) return -1;
    MIX(h, x); /* devices are compared, not hashed: one program rarely has many, and hashing costs */
  }
  x = (Py_hash_t)h;
  return x == -1 ? -2 : x;
}

static Py_hash_t sig_hash_read(PyObject* backend, PyObject* attrs, const jt_sig* sig, Py_ssize_t n) {
  PyObject *shapes[FC_MAX_PTRS], *dtypes[FC_MAX_PTRS];
  Py_ssize_t i;
  for (i = 0; i < n; i++) {
    shapes[i] = sig[i].shape;
    dtypes[i] = sig[i].dtype;
  }
  return sig_hash(backend, attrs, shapes, dtypes, n);
}

/* ---------------------------------------------------------------- Dispatch
 * The repeat calls of one op in an open-addressing table keyed by the hash of (backend,
 * attributes, input signatures): a call reads its inputs' dtype, shape and device once, hashes
 * them, and checks the one entry (or the few colliding ones) filed under that hash. A call with
 * the same signature as an existing entry replaces it. Beyond DISPATCH_MAX entries the table
 * starts over (the engine's dictionary still holds every bound call). */

#define DISPATCH_MAX 4096

typedef struct {
  Py_hash_t hash;
  PyObject* entry; /* (backend, attrs, FastCall), NULL: empty */
} dslot;

typedef struct {
  PyObject_HEAD
  PyObject* miss;      /* returned when nothing matches */
  PyTypeObject* base;  /* the array type every entry expects (the first entry's) */
  dslot* table;
  Py_ssize_t cap, count;
} Dispatch;

static void dispatch_empty(Dispatch* self) {
  Py_ssize_t i;
  for (i = 0; i < self->cap; i++) Py_CLEAR(self->table[i].entry);
  self->count = 0;
}

static void dispatch_dealloc(Dispatch* self) {
  dispatch_empty(self);
  PyMem_Free(self->table);
  Py_XDECREF(self->miss);
  Py_XDECREF(self->base);
  Py_TYPE(self)->tp_free((PyObject*)self);
}

static int dispatch_init(Dispatch* self, PyObject* args, PyObject* kwds) {
  PyObject* miss;
  (void)kwds;
  if (jt_intern_names() < 0 || !PyArg_ParseTuple(args, "O", &miss)) return -1;
  if (self->table == NULL) {
    self->cap = 64;
    self->table = PyMem_Calloc((size_t)self->cap, sizeof(dslot));
    if (self->table == NULL) {
      PyErr_NoMemory();
      return -1;
    }
  }
  Py_INCREF(miss);
  Py_XSETREF(self->miss, miss);
  return 0;
}

static void dispatch_place(dslot* table, Py_ssize_t cap, Py_hash_t hash, PyObject* entry) {
  Py_ssize_t i = (Py_ssize_t)((Py_uhash_t)hash & (Py_uhash_t)(cap - 1));
  while (table[i].entry != NULL) i = (i + 1) & (cap - 1);
  table[i].hash = hash;
  table[i].entry = entry;
}

static int dispatch_grow(Dispatch* self) {
  Py_ssize_t i, cap = self->cap * 2;
  dslot* table = PyMem_Calloc((size_t)cap, sizeof(dslot));
  if (table == NULL) {
    PyErr_NoMemory();
    return -1;
  }
  for (i = 0; i < self->cap; i++)
    if (self->table[i].entry != NULL) dispatch_place(table, cap, self->table[i].hash, self->table[i].entry);
  PyMem_Free(self->table);
  self->table = table;
  self->cap = cap;
  return 0;
}

/* add(backend, attrs: tuple, call: FastCall) -> whether it was filed (False: an array type other
 * than the one this table's entries expect, or an unhashable attribute) */
static PyObject* dispatch_add(Dispatch* self, PyObject* args) {
  PyObject *backend, *attrs, *call, *expect, *entry;
  PyObject *shapes[FC_MAX_PTRS], *dtypes[FC_MAX_PTRS];
  PyTypeObject* type = NULL;
  Py_ssize_t i, n;
  Py_hash_t hash;
  if (!PyArg_ParseTuple(args, "OO!O!", &backend, &PyTuple_Type, &attrs, &JtFastCallType, &call)) return NULL;
  expect = jt_fastcall_expect(call);
  n = PyTuple_GET_SIZE(expect);
  for (i = 0; i < n; i++) {
    PyObject* e = PyTuple_GET_ITEM(expect, i);
    dtypes[i] = shapes[i] = NULL;
    if (e == Py_None) continue;
    if (type != NULL && type != (PyTypeObject*)PyTuple_GET_ITEM(e, 0)) Py_RETURN_FALSE;
    type = (PyTypeObject*)PyTuple_GET_ITEM(e, 0);
    shapes[i] = PyTuple_GET_ITEM(e, 1);
    dtypes[i] = PyTuple_GET_ITEM(e, 2);
  }
  if (type == NULL || (self->base != NULL && self->base != type)) Py_RETURN_FALSE;
  hash = sig_hash(backend, attrs, shapes, dtypes, n);
  if (hash == -1) {
    PyErr_Clear();
    Py_RETURN_FALSE;
  }
  if (self->base == NULL) {
    Py_INCREF(type);
    self->base = type;
  }
  entry = PyTuple_Pack(3, backend, attrs, call);
  if (entry == NULL) return NULL;
  for (i = 0; i < self->cap; i++) { /* the same signature again: the newer call replaces it */
    dslot* s = &self->table[((Py_uhash_t)hash + (Py_uhash_t)i) & (Py_uhash_t)(self->cap - 1)];
    PyObject* old = s->entry;
    int eq;
    if (old == NULL) break;
    if (s->hash != hash || PyTuple_GET_ITEM(old, 0) != backend) continue;
    eq = PyObject_RichCompareBool(PyTuple_GET_ITEM(old, 1), attrs, Py_EQ);
    if (eq == 1) eq = PyObject_RichCompareBool(jt_fastcall_expect(PyTuple_GET_ITEM(old, 2)), expect, Py_EQ);
    if (eq < 0) {
      Py_DECREF(entry);
      return NULL;
    }
    if (eq) {
      s->entry = entry;
      Py_DECREF(old);
      Py_RETURN_TRUE;
    }
  }
  if (self->count >= DISPATCH_MAX) dispatch_empty(self);
  if ((self->count + 1) * 2 > self->cap && dispatch_grow(self) < 0) {
    Py_DECREF(entry);
    return NULL;
  }
  dispatch_place(self->table, self->cap, hash, entry);
  self->count++;
  Py_RETURN_TRUE;
}

/* d(backend, inputs: tuple, attrs: tuple) -> the result, or `miss` */
static PyObject* dispatch_call(Dispatch* self, PyObject* args, PyObject* kwds) {
  PyObject *backend, *inputs, *attrs, *found = NULL;
  jt_sig sig[FC_MAX_PTRS];
  Py_ssize_t i, n;
  Py_hash_t hash;
  int m;
  if (kwds != NULL || PyTuple_GET_SIZE(args) != 3 || !PyTuple_Check(PyTuple_GET_ITEM(args, 1))) {
    PyErr_SetString(PyExc_TypeError, "Dispatch takes (backend, inputs: tuple, attrs: tuple)");
    return NULL;
  }
  backend = PyTuple_GET_ITEM(args, 0);
  inputs = PyTuple_GET_ITEM(args, 1);
  attrs = PyTuple_GET_ITEM(args, 2);
  n = PyTuple_GET_SIZE(inputs);
  if (self->count == 0 || self->base == NULL || n > FC_MAX_PTRS) goto miss;
  if ((m = jt_sig_read(inputs, self->base, sig)) <= 0) {
    if (m < 0) return NULL;
    goto miss;
  }
  hash = sig_hash_read(backend, attrs, sig, n);
  if (hash == -1) { /* an unhashable attribute: the general path deals with it */
    jt_sig_release(sig, n);
    PyErr_Clear();
    goto miss;
  }
  for (i = (Py_ssize_t)((Py_uhash_t)hash & (Py_uhash_t)(self->cap - 1)); self->table[i].entry != NULL;
       i = (i + 1) & (self->cap - 1)) {
    PyObject* entry = self->table[i].entry;
    if (self->table[i].hash != hash || PyTuple_GET_ITEM(entry, 0) != backend) continue;
    m = PyObject_RichCompareBool(PyTuple_GET_ITEM(entry, 1), attrs, Py_EQ);
    if (m == 1) m = jt_sig_equal(jt_fastcall_expect(PyTuple_GET_ITEM(entry, 2)), sig, n);
    if (m < 0) {
      jt_sig_release(sig, n);
      return NULL;
    }
    if (m) {
      found = PyTuple_GET_ITEM(entry, 2);
      Py_INCREF(found); /* the table may change while Python code runs in the call */
      break;
    }
  }
  jt_sig_release(sig, n);
  if (found != NULL) {
    PyObject* result = NULL;
    m = jt_all_contiguous(inputs);
    if (m == 1) result = jt_fastcall_run(found, inputs);
    Py_DECREF(found);
    if (m == 1 || m < 0) return result;
  }
miss:
  Py_INCREF(self->miss);
  return self->miss;
}

static PyObject* dispatch_clear(Dispatch* self, PyObject* noargs) {
  (void)noargs;
  dispatch_empty(self);
  Py_RETURN_NONE;
}

static Py_ssize_t dispatch_len(Dispatch* self) { return self->count; }

static PyMethodDef dispatch_methods[] = {
    {"add", (PyCFunction)dispatch_add, METH_VARARGS, "add(backend, attrs, call) -> filed; replaces an equal signature"},
    {"clear", (PyCFunction)dispatch_clear, METH_NOARGS, "forget every bound call"},
    {NULL, NULL, 0, NULL}};

static PySequenceMethods dispatch_as_sequence = {.sq_length = (lenfunc)dispatch_len};

PyTypeObject JtDispatchType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "jitops_launch.Dispatch",
    .tp_basicsize = sizeof(Dispatch),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "an op's repeat calls, found by a hash of attributes and input signatures",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)dispatch_init,
    .tp_dealloc = (destructor)dispatch_dealloc,
    .tp_call = (ternaryfunc)dispatch_call,
    .tp_methods = dispatch_methods,
    .tp_as_sequence = &dispatch_as_sequence,
};
