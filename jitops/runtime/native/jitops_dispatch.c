/* Dispatch: an op's repeat calls (RepeatCall, jitops_fastcall.c), found by a hash of the call's
 * signature; the signature checks both use; and Entry, an op's public function in front of its Dispatch. */
#include "jitops_native.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* ---------------------------------------------------------------- call signatures
 * What a bound call was made for: per input None, or an array of the expected type with this
 * shape, dtype and device, C-contiguous or in the memory format its entry names. */

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

/* 1 when v's strides are those of a dense array whose memory order lists v's axes as `order` does
 * (outermost first; axes of size 1 may have any stride, as torch's is_contiguous), 0 not, -1 error.
 * pitch > 0: the axis second in memory order has rows `pitch` elements apart instead (the slices of a
 * packed projection, jitops.arrays.bshd_pitch), and the outermost axis steps over whole such rows. */
static int dense_in_order(PyObject* v, PyObject* order, long long pitch) {
  PyObject *shape = PyObject_GetAttr(v, jt_s_shape), *stride = shape ? PyObject_CallMethodObjArgs(v, jt_s_stride, NULL) : NULL;
  Py_ssize_t k, n = PyTuple_GET_SIZE(order);
  long long step = 1;
  int ok = shape != NULL && stride != NULL ? 1 : -1;
  if (ok == 1 && (!PyTuple_Check(shape) || !PyTuple_Check(stride) || PyTuple_GET_SIZE(shape) != n ||
                  PyTuple_GET_SIZE(stride) != n)) ok = 0;
  for (k = n - 1; ok == 1 && k >= 0; k--) {
    Py_ssize_t ax = PyLong_AsSsize_t(PyTuple_GET_ITEM(order, k));
    long long size, st;
    if (ax < 0 || ax >= n) { ok = ax == -1 && PyErr_Occurred() ? -1 : 0; break; }
    size = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, ax));
    st = PyLong_AsLongLong(PyTuple_GET_ITEM(stride, ax));
    if ((size == -1 || st == -1) && PyErr_Occurred()) { ok = -1; break; }
    if (k == 1 && pitch > 0) step = pitch;
    if (size != 1 && st != step) ok = 0;
    step *= size;
  }
  Py_XDECREF(shape);
  Py_XDECREF(stride);
  return ok;
}

/* 1 when every input has the memory format its `expect` entry names, 0 not, -1 error. Entry item 4
 * (absent or None): C-contiguous; a memory format object (torch.channels_last) the array must be
 * contiguous in while not C-contiguous, as jitops.arrays reads it; for a layout torch has no
 * memory format for ("bshd"), a tuple: the memory order of the logical axes (jitops.arrays.LAYOUTS);
 * or for such a layout with a row pitch, the tuple (memory order, pitch). */
int jt_formats_match(PyObject* expect, PyObject* inputs) {
  Py_ssize_t i;
  for (i = 0; i < PyTuple_GET_SIZE(inputs); i++) {
    PyObject *v = PyTuple_GET_ITEM(inputs, i), *e = PyTuple_GET_ITEM(expect, i), *fmt, *r;
    int c;
    if (v == Py_None || e == Py_None) continue;
    fmt = PyTuple_GET_SIZE(e) > 4 ? PyTuple_GET_ITEM(e, 4) : Py_None;
    r = PyObject_CallMethodObjArgs(v, jt_s_is_contiguous, NULL);
    if (r == NULL) return -1;
    c = r == Py_True;
    Py_DECREF(r);
    if (fmt == Py_None) {
      if (!c) return 0;
      continue;
    }
    if (c) return 0;
    if (PyTuple_Check(fmt) && PyTuple_GET_SIZE(fmt) == 2 && PyTuple_Check(PyTuple_GET_ITEM(fmt, 0))) {
      long long pitch = PyLong_AsLongLong(PyTuple_GET_ITEM(fmt, 1));
      if (pitch == -1 && PyErr_Occurred()) return -1;
      if ((c = dense_in_order(v, PyTuple_GET_ITEM(fmt, 0), pitch)) != 1) return c;
      continue;
    }
    if (PyTuple_Check(fmt)) {
      if ((c = dense_in_order(v, fmt, 0)) != 1) return c;
      continue;
    } else {
      PyObject *meth = PyObject_GetAttr(v, jt_s_is_contiguous), *args = PyTuple_New(0), *kw = NULL;
      if (meth != NULL && args != NULL) kw = Py_BuildValue("{s:O}", "memory_format", fmt);
      r = kw != NULL ? PyObject_Call(meth, args, kw) : NULL;
      Py_XDECREF(meth);
      Py_XDECREF(args);
      Py_XDECREF(kw);
    }
    if (r == NULL) return -1;
    c = r == Py_True;
    Py_DECREF(r);
    if (!c) return 0;
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
  PyObject* entry; /* (backend, attrs, RepeatCall), NULL: empty */
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

static void dispatch_forget(Dispatch* self) { /* clear(): the next entry may expect another array type */
  dispatch_empty(self);
  Py_CLEAR(self->base);
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

/* add(backend, attrs: tuple, call: RepeatCall) -> whether it was filed (False: an array type other
 * than the one this table's entries expect, or an unhashable attribute) */
static PyObject* dispatch_add(Dispatch* self, PyObject* args) {
  PyObject *backend, *attrs, *call, *expect, *entry;
  PyObject *shapes[FC_MAX_PTRS], *dtypes[FC_MAX_PTRS];
  PyTypeObject* type = NULL;
  Py_ssize_t i, n;
  Py_hash_t hash;
  if (!PyArg_ParseTuple(args, "OO!O!", &backend, &PyTuple_Type, &attrs, &JtRepeatCallType, &call)) return NULL;
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

/* The repeat call of `d` for (backend, inputs, attrs), run: 1 with *result set (the outputs), 0 no
 * entry matches (or an input is strided, or misses the alignment its kernel needs), -1 error. */
int jt_dispatch_run(PyObject* d, PyObject* backend, PyObject* inputs, PyObject* attrs, PyObject** result) {
  Dispatch* self = (Dispatch*)d;
  PyObject* found = NULL;
  jt_sig sig[FC_MAX_PTRS];
  Py_ssize_t i, n = PyTuple_GET_SIZE(inputs);
  Py_hash_t hash;
  int m;
  *result = NULL;
  if (self->count == 0 || self->base == NULL || n > FC_MAX_PTRS) return 0;
  if ((m = jt_sig_read(inputs, self->base, sig)) <= 0) return m;
  hash = sig_hash_read(backend, attrs, sig, n);
  if (hash == -1) { /* an unhashable attribute: the general path deals with it */
    jt_sig_release(sig, n);
    PyErr_Clear();
    return 0;
  }
  for (i = (Py_ssize_t)((Py_uhash_t)hash & (Py_uhash_t)(self->cap - 1)); self->table[i].entry != NULL;
       i = (i + 1) & (self->cap - 1)) {
    PyObject* entry = self->table[i].entry;
    if (self->table[i].hash != hash || PyTuple_GET_ITEM(entry, 0) != backend) continue;
    m = PyObject_RichCompareBool(PyTuple_GET_ITEM(entry, 1), attrs, Py_EQ);
    if (m == 1) m = jt_sig_equal(jt_fastcall_expect(PyTuple_GET_ITEM(entry, 2)), sig, n);
    if (m == 1) m = jt_formats_match(jt_fastcall_expect(PyTuple_GET_ITEM(entry, 2)), inputs);
    if (m < 0) {
      jt_sig_release(sig, n);
      return -1;
    }
    if (m) {
      found = PyTuple_GET_ITEM(entry, 2);
      Py_INCREF(found); /* the table may change while Python code runs in the call */
      break;
    }
  }
  jt_sig_release(sig, n);
  if (found == NULL) return 0;
  *result = jt_fastcall_run(found, inputs);
  m = *result == NULL ? -1 : 1;
  if (*result == Py_NotImplemented) { /* a misaligned input: the Python path explains */
    Py_CLEAR(*result);
    m = 0;
  }
  Py_DECREF(found);
  return m;
}

/* d(backend, inputs: tuple, attrs: tuple) -> the result, or `miss` */
static PyObject* dispatch_call(Dispatch* self, PyObject* args, PyObject* kwds) {
  PyObject* result;
  int m;
  if (kwds != NULL || PyTuple_GET_SIZE(args) != 3 || !PyTuple_Check(PyTuple_GET_ITEM(args, 1))) {
    PyErr_SetString(PyExc_TypeError, "Dispatch takes (backend, inputs: tuple, attrs: tuple)");
    return NULL;
  }
  m = jt_dispatch_run((PyObject*)self, PyTuple_GET_ITEM(args, 0), PyTuple_GET_ITEM(args, 1),
                      PyTuple_GET_ITEM(args, 2), &result);
  if (m < 0) return NULL;
  if (m == 0) {
    Py_INCREF(self->miss);
    return self->miss;
  }
  return result;
}

static PyObject* dispatch_clear(Dispatch* self, PyObject* noargs) {
  (void)noargs;
  dispatch_forget(self);
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

/* ---------------------------------------------------------------- Entry
 * An op's public function as a C callable, so that a repeat call runs no Python frame before the
 * driver's launch: it binds the call's arguments to the Python function's parameters (positional
 * or by keyword, defaults filled in), sorts them into the inputs and attributes the op's Dispatch
 * is keyed by, reads the current backend, and runs the matching RepeatCall. Anything it does not
 * handle (no match, an unknown or repeated keyword, a missing argument, a non-None `out`,
 * `schedule` or `layout`) goes to the Python function unchanged, which also owns every error
 * message. Its __dict__ carries the Python function's __wrapped__, __doc__, __name__, ...: help()
 * and inspect.signature() see the Python function's. Entries live as long as their module (no
 * garbage-collection support). */

#define ENTRY_MAX_PARAMS 32
#ifndef Py_TPFLAGS_HAVE_VECTORCALL
#define Py_TPFLAGS_HAVE_VECTORCALL _Py_TPFLAGS_HAVE_VECTORCALL /* Python 3.8 */
#endif

enum { ROLE_INPUT = 0, ROLE_ATTR = 1, ROLE_NONE = 2 }; /* ROLE_NONE: only None stays on the C path */

typedef struct {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  PyObject* dict;
  PyObject* fallback;       /* the Python function */
  PyObject* dispatch;       /* the op's Dispatch */
  PyObject* names;          /* parameter names, positional-or-keyword first */
  PyObject* defaults;       /* per parameter: its default, or `required` */
  PyObject* required;
  PyObject* local;          /* the threading.local use_backend sets `backend` on */
  PyObject* globals;        /* a dict whose "_default" is None or (key, backend) */
  PyObject* current;        /* current_backend(): when neither names a backend */
  Py_ssize_t n_positional, n_params, n_inputs, n_attrs;
  unsigned char role[ENTRY_MAX_PARAMS];
} Entry;

static PyObject *s_dict, *s_backend, *s_default;

static void entry_dealloc(Entry* self) {
  Py_XDECREF(self->dict);
  Py_XDECREF(self->fallback);
  Py_XDECREF(self->dispatch);
  Py_XDECREF(self->names);
  Py_XDECREF(self->defaults);
  Py_XDECREF(self->required);
  Py_XDECREF(self->local);
  Py_XDECREF(self->globals);
  Py_XDECREF(self->current);
  Py_TYPE(self)->tp_free((PyObject*)self);
}

/* The backend current_backend() would return (new reference), without its Python frame. */
static PyObject* entry_backend(Entry* self) {
  PyObject *d = PyObject_GetAttr(self->local, s_dict), *b;
  if (d == NULL) return NULL;
  b = PyDict_GetItemWithError(d, s_backend);
  Py_DECREF(d);
  if (b != NULL && b != Py_None) {
    Py_INCREF(b);
    return b;
  }
  if (PyErr_Occurred()) return NULL;
  d = PyDict_GetItemWithError(self->globals, s_default);
  if (d != NULL && PyTuple_Check(d) && PyTuple_GET_SIZE(d) == 2) {
    b = PyTuple_GET_ITEM(d, 1);
    Py_INCREF(b);
    return b;
  }
  if (PyErr_Occurred()) return NULL;
  return PyObject_CallNoArgs(self->current);
}

static Py_ssize_t entry_param(Entry* self, PyObject* key) {
  Py_ssize_t j;
  for (j = 0; j < self->n_params; j++)
    if (PyTuple_GET_ITEM(self->names, j) == key) return j;
  for (j = 0; j < self->n_params; j++)
    if (PyUnicode_Compare(PyTuple_GET_ITEM(self->names, j), key) == 0) return j;
  PyErr_Clear();
  return -1;
}

static PyObject* entry_vectorcall(Entry* self, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  Py_ssize_t nargs = PyVectorcall_NARGS(nargsf), nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0, i, j;
  Py_ssize_t ni = 0, na = 0;
  PyObject* vals[ENTRY_MAX_PARAMS];
  PyObject *inputs = NULL, *attrs = NULL, *backend = NULL, *result = NULL;
  int m = 0;
  if (nargs > self->n_positional) goto fallback;
  for (i = 0; i < self->n_params; i++) vals[i] = i < nargs ? args[i] : NULL;
  for (i = 0; i < nkw; i++) {
    j = entry_param(self, PyTuple_GET_ITEM(kwnames, i));
    if (j < 0 || vals[j] != NULL) goto fallback;
    vals[j] = args[nargs + i];
  }
  for (i = 0; i < self->n_params; i++) {
    if (vals[i] == NULL) vals[i] = PyTuple_GET_ITEM(self->defaults, i);
    if (vals[i] == self->required || (self->role[i] == ROLE_NONE && vals[i] != Py_None)) goto fallback;
  }
  inputs = PyTuple_New(self->n_inputs);
  attrs = inputs ? PyTuple_New(self->n_attrs) : NULL;
  if (attrs == NULL) goto done;
  for (i = 0; i < self->n_params; i++) {
    if (self->role[i] == ROLE_NONE) continue;
    Py_INCREF(vals[i]);
    if (self->role[i] == ROLE_INPUT)
      PyTuple_SET_ITEM(inputs, ni++, vals[i]);
    else
      PyTuple_SET_ITEM(attrs, na++, vals[i]);
  }
  if ((backend = entry_backend(self)) == NULL) goto done;
  m = jt_dispatch_run(self->dispatch, backend, inputs, attrs, &result);
done:
  Py_XDECREF(inputs);
  Py_XDECREF(attrs);
  Py_XDECREF(backend);
  if (m != 0 || PyErr_Occurred()) return result; /* found (result) or an error (NULL) */
fallback:
  return PyObject_Vectorcall(self->fallback, args, nargsf, kwnames);
}

/* Entry(fallback, dispatch, names: tuple, n_positional, defaults: tuple, required, roles: bytes,
 *       local, globals: dict, current) */
static int entry_init(Entry* self, PyObject* args, PyObject* kwds) {
  PyObject *fallback, *dispatch, *names, *defaults, *required, *local, *globals, *current;
  const char* roles;
  Py_ssize_t n_positional, n_roles, i;
  (void)kwds;
  if (s_dict == NULL) {
    s_dict = PyUnicode_InternFromString("__dict__");
    s_backend = PyUnicode_InternFromString("backend");
    s_default = PyUnicode_InternFromString("_default");
    if (!s_dict || !s_backend || !s_default) return -1;
  }
  if (!PyArg_ParseTuple(args, "OO!O!nO!Oy#OO!O", &fallback, &JtDispatchType, &dispatch, &PyTuple_Type, &names,
                        &n_positional, &PyTuple_Type, &defaults, &required, &roles, &n_roles, &local, &PyDict_Type,
                        &globals, &current))
    return -1;
  if (self->fallback != NULL) {
    PyErr_SetString(PyExc_RuntimeError, "Entry is initialized once");
    return -1;
  }
  if (!PyCallable_Check(fallback) || !PyCallable_Check(current) || PyTuple_GET_SIZE(names) > ENTRY_MAX_PARAMS ||
      PyTuple_GET_SIZE(defaults) != PyTuple_GET_SIZE(names) || n_roles != PyTuple_GET_SIZE(names) ||
      n_positional < 0 || n_positional > n_roles) {
    PyErr_SetString(PyExc_ValueError, "Entry: one name, default and role per parameter (at most 32)");
    return -1;
  }
  for (i = 0; i < n_roles; i++) {
    if (!PyUnicode_CheckExact(PyTuple_GET_ITEM(names, i)) || roles[i] > ROLE_NONE) {
      PyErr_SetString(PyExc_ValueError, "Entry: parameter names are str, roles 0 (input), 1 (attribute), 2 (None)");
      return -1;
    }
    self->role[i] = (unsigned char)roles[i];
    self->n_inputs += roles[i] == ROLE_INPUT;
    self->n_attrs += roles[i] == ROLE_ATTR;
  }
  self->n_params = n_roles;
  self->n_positional = n_positional;
  self->names = PyTuple_New(n_roles);
  if (self->names == NULL) return -1;
  for (i = 0; i < n_roles; i++) { /* interned: keywords are usually found by identity */
    PyObject* name = PyTuple_GET_ITEM(names, i);
    Py_INCREF(name);
    PyUnicode_InternInPlace(&name);
    PyTuple_SET_ITEM(self->names, i, name);
  }
#define KEEP(field, value) (Py_INCREF(value), self->field = (value))
  KEEP(fallback, fallback);
  KEEP(dispatch, dispatch);
  KEEP(defaults, defaults);
  KEEP(required, required);
  KEEP(local, local);
  KEEP(globals, globals);
  KEEP(current, current);
#undef KEEP
  self->vectorcall = (vectorcallfunc)entry_vectorcall;
  return 0;
}

/* Bound as a method (a class attribute) it stays itself, as built-in functions do; and pydoc
 * documents it as a routine: the Python function's signature and docstring. */
static PyObject* entry_get(PyObject* self, PyObject* obj, PyObject* type) {
  (void)obj; (void)type;
  Py_INCREF(self);
  return self;
}

static PyObject* entry_repr(Entry* self) {
  PyObject* name = self->dict ? PyDict_GetItemString(self->dict, "__qualname__") : NULL;
  return PyUnicode_FromFormat("<jitops function %S>", name ? name : Py_None);
}

/* Pickled by name, as functions are: pickle looks __qualname__ up in __module__. */
static PyObject* entry_reduce(Entry* self, PyObject* noargs) {
  PyObject* name = self->dict ? PyDict_GetItemString(self->dict, "__qualname__") : NULL;
  (void)noargs;
  if (name == NULL) {
    PyErr_SetString(PyExc_TypeError, "Entry without __qualname__ cannot be pickled");
    return NULL;
  }
  Py_INCREF(name);
  return name;
}

static PyObject* entry_fallback(Entry* self, void* closure) {
  (void)closure;
  Py_INCREF(self->fallback);
  return self->fallback;
}

static PyObject* entry_dispatch(Entry* self, void* closure) {
  (void)closure;
  Py_INCREF(self->dispatch);
  return self->dispatch;
}

static PyMethodDef entry_methods[] = {{"__reduce__", (PyCFunction)entry_reduce, METH_NOARGS, NULL},
                                      {NULL, NULL, 0, NULL}};

static PyGetSetDef entry_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {"fallback", (getter)entry_fallback, NULL, "the Python function every call it does not handle goes to", NULL},
    {"dispatch", (getter)entry_dispatch, NULL, "the op's Dispatch", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

PyTypeObject JtEntryType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "jitops_launch.Entry",
    .tp_basicsize = sizeof(Entry),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "an op's public function: its native repeat call when one matches, else the Python function",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)entry_init,
    .tp_dealloc = (destructor)entry_dealloc,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(Entry, vectorcall),
    .tp_dictoffset = offsetof(Entry, dict),
    .tp_descr_get = entry_get,
    .tp_repr = (reprfunc)entry_repr,
    .tp_methods = entry_methods,
    .tp_getset = entry_getset,
};
