/* RepeatCall: a whole repeat call of a bound plan in C (an op's Dispatch, jitops_dispatch.c, finds it;
 * bound_plan.py builds it from the plan's slot table; the file keeps its old name for setup.py).
 *
 * A RepeatCall reads the arrays' pointers (their data_ptr()), allocates the outputs through Python
 * callables (e.g. torch.empty_like: the caller's allocator), reads the current stream, finds its
 * per-stream scratch and its derived data (transformed weights, folded statistics) in tables it
 * keeps itself, then writes the pointer arguments into its own argument storage and launches.
 * Python runs on a repeat call only for the output allocation and the stream; the first call on a
 * new stream or with new derived-from inputs asks Python (which allocates, and launches the
 * prepare kernels). Every Python callback runs before the first argument is written, and nothing
 * from there to the last launch gives up the GIL, so concurrent callers never see each other's
 * pointers.
 *
 * Derived data is remembered by the derived-from inputs' pointers and version counters (torch
 * bumps the counter on every in-place change) and guarded by weak references to those inputs: a
 * pointer names the same contents only while the tensor it came from is alive.
 *
 * Inputs that a kernel reads in vectors with no unaligned path carry an alignment: an input whose
 * address misses it (a view at an offset) is not run here (NotImplemented: the caller takes the
 * Python path, which says what is wrong), before anything is allocated or launched.
 *
 * TMA tensor maps (128-byte kernel arguments encoded over a pointer) are remembered per argument
 * with the pointer they were encoded for; a call on another pointer asks Python to encode (with
 * the other callbacks, before any argument is written) and copies the map in with the pointers. */
#include "jitops_native.h"

#include <stdint.h>
#include <string.h>

#define FC_MAX_FP 8     /* inputs derived data is computed from */
#define FC_MAX_WS 8     /* derived workspaces, and per-call scratch buffers */
#define FC_MEMO 16      /* derived-data identities remembered per RepeatCall (layers sharing a shape) */
#define FC_STREAMS 4    /* streams whose scratch is remembered */
#define FC_MAX_TMAPS 8  /* tensor-map arguments of one call, all steps together */
#define FC_TMAP 128     /* bytes of a tensor map (CUtensorMap) */

/* Bumped whenever memory a RepeatCall may remember was freed; what was remembered before is stale. */
static unsigned long long epoch = 1;

PyObject* jt_memory_released(PyObject* self, PyObject* noargs) {
  (void)self; (void)noargs;
  epoch++;
  Py_RETURN_NONE;
}

PyObject *jt_s_data_ptr, *jt_s_shape, *jt_s_dtype, *jt_s_device, *jt_s_is_contiguous, *jt_s_version, *jt_s_stride;

int jt_intern_names(void) {
  if (jt_s_data_ptr != NULL) return 0;
  jt_s_data_ptr = PyUnicode_InternFromString("data_ptr");
  jt_s_shape = PyUnicode_InternFromString("shape");
  jt_s_dtype = PyUnicode_InternFromString("dtype");
  jt_s_device = PyUnicode_InternFromString("device");
  jt_s_is_contiguous = PyUnicode_InternFromString("is_contiguous");
  jt_s_version = PyUnicode_InternFromString("_version");
  jt_s_stride = PyUnicode_InternFromString("stride");
  return (jt_s_data_ptr && jt_s_shape && jt_s_dtype && jt_s_device && jt_s_is_contiguous && jt_s_version &&
          jt_s_stride) ? 0 : -1;
}

static PyObject* weak_target(PyObject* ref) { /* borrowed; Py_None once dead */
#if PY_VERSION_HEX >= 0x030D0000
  PyObject* obj = NULL;
  if (PyWeakref_GetRef(ref, &obj) <= 0) return Py_None;
  Py_DECREF(obj); /* the caller keeps the input alive */
  return obj;
#else
  return PyWeakref_GetObject(ref);
#endif
}

static int as_ull(PyObject* obj, unsigned long long* out) { /* steals obj */
  if (obj == NULL) return -1;
  *out = PyLong_AsUnsignedLongLongMask(obj);
  Py_DECREF(obj);
  return (*out == (unsigned long long)-1 && PyErr_Occurred()) ? -1 : 0;
}

static int seq_ull(PyObject* seq, Py_ssize_t i, unsigned long long* out) {
  return as_ull(PySequence_GetItem(seq, i), out);
}

/* ---------------------------------------------------------------- RepeatCall */

typedef struct {
  launch_fn entry;
  void* handle;
  unsigned grid[3], block[3], shared;
  Py_ssize_t nargs, nslots;
  unsigned char* storage; /* 8 bytes per kernel argument, the value in the low bytes */
  void** params;          /* params[i] = storage + 8 i */
  Py_ssize_t* slot_arg;   /* argument written by each slot ... */
  Py_ssize_t* slot_src;   /* ... from this pointer of the call (inputs, outputs, derived, scratch) */
  Py_ssize_t ntmaps;      /* tensor-map arguments: params[tmap_arg[k]] = tmap_blob + FC_TMAP k */
  Py_ssize_t tmap_arg[FC_MAX_TMAPS], tmap_src[FC_MAX_TMAPS];
  PyObject* tmap_encode[FC_MAX_TMAPS];      /* encode(pointer) -> FC_TMAP bytes */
  unsigned long long tmap_ptr[FC_MAX_TMAPS]; /* the pointer tmap_known[k] was encoded for ... */
  int tmap_valid[FC_MAX_TMAPS];             /* ... if any yet */
  unsigned char* tmap_known;                /* FC_TMAP bytes per map: the last encoding */
  unsigned char* tmap_blob;                 /* the maps the launch reads (64-byte aligned) */
  unsigned char* tmap_alloc;
} fc_step;

typedef struct {
  unsigned long long epoch, stream; /* epoch 0: empty */
  unsigned long long ptr[FC_MAX_FP], version[FC_MAX_FP];
  PyObject* guard[FC_MAX_FP]; /* weak references to the inputs it was computed from */
  unsigned long long ws[FC_MAX_WS];
} fc_memo;

typedef struct {
  unsigned long long epoch, stream;
  unsigned long long ws[FC_MAX_WS];
} fc_scratch;

typedef struct {
  PyObject_HEAD
  Py_ssize_t n_inputs, n_outputs, n_steps;
  PyObject** makers;   /* per output: the allocator */
  Py_ssize_t* like;    /* per output: the input passed to its allocator, or -1 (called with none) */
  PyObject* stream_fn; /* stream = stream_fn(stream_arg), or stream_fn() when stream_arg is NULL */
  PyObject* stream_arg;
  PyObject* fail;      /* fail(step, rc, stream, params): retries the launch or raises its error */
  PyObject* expect;    /* per input: None (must be None) or (type, shape, dtype, device, memory format or None) */
  fc_step* steps;
  PyObject* derive;    /* derive(inputs, ptrs, stream) -> (remember, derived pointers), or NULL */
  Py_ssize_t n_fp, fp_index[FC_MAX_FP], n_derived;
  fc_memo memo[FC_MEMO];
  Py_ssize_t memo_next;
  PyObject* scratch;   /* scratch(stream) -> per-call scratch pointers for that stream, or NULL */
  Py_ssize_t n_scratch;
  fc_scratch scr[FC_STREAMS];
  Py_ssize_t scr_next;
  Py_ssize_t n_align, align_index[FC_MAX_PTRS]; /* inputs with an alignment ... */
  unsigned long long align_mask[FC_MAX_PTRS];   /* ... and its bytes - 1 */
} RepeatCall;

static void fc_forget_memo(RepeatCall* self) {
  Py_ssize_t i, k;
  for (i = 0; i < FC_MEMO; i++) {
    for (k = 0; k < FC_MAX_FP; k++) Py_CLEAR(self->memo[i].guard[k]);
    self->memo[i].epoch = 0;
  }
  for (i = 0; i < FC_STREAMS; i++) self->scr[i].epoch = 0;
}

static void fc_dealloc(RepeatCall* self) {
  Py_ssize_t i, j;
  if (self->makers != NULL) {
    for (i = 0; i < self->n_outputs; i++) Py_XDECREF(self->makers[i]);
    PyMem_Free(self->makers);
  }
  PyMem_Free(self->like);
  Py_XDECREF(self->stream_fn);
  Py_XDECREF(self->stream_arg);
  Py_XDECREF(self->fail);
  Py_XDECREF(self->expect);
  Py_XDECREF(self->derive);
  Py_XDECREF(self->scratch);
  fc_forget_memo(self);
  if (self->steps != NULL) {
    for (i = 0; i < self->n_steps; i++) {
      PyMem_Free(self->steps[i].storage);
      PyMem_Free(self->steps[i].params);
      PyMem_Free(self->steps[i].slot_arg);
      PyMem_Free(self->steps[i].slot_src);
      PyMem_Free(self->steps[i].tmap_known);
      PyMem_Free(self->steps[i].tmap_alloc);
      for (j = 0; j < self->steps[i].ntmaps; j++) Py_XDECREF(self->steps[i].tmap_encode[j]);
    }
    PyMem_Free(self->steps);
  }
  Py_TYPE(self)->tp_free((PyObject*)self);
}

/* The step's tensor maps: [(argument, source pointer, encode)]; each argument's 8 bytes of storage
 * are replaced by a 128-byte map of its own. */
static int fc_init_tmaps(fc_step* st, PyObject* tmaps, Py_ssize_t n_ptrs, Py_ssize_t* total) {
  Py_ssize_t j;
  if (!PyList_Check(tmaps) || PyList_GET_SIZE(tmaps) + *total > FC_MAX_TMAPS) {
    PyErr_Format(PyExc_ValueError, "RepeatCall: tensor maps are a list, at most %d per call", FC_MAX_TMAPS);
    return -1;
  }
  st->ntmaps = PyList_GET_SIZE(tmaps);
  *total += st->ntmaps;
  if (st->ntmaps == 0) return 0;
  st->tmap_known = PyMem_Calloc((size_t)st->ntmaps, FC_TMAP);
  st->tmap_alloc = PyMem_Calloc((size_t)st->ntmaps * FC_TMAP + 64, 1);
  if (!st->tmap_known || !st->tmap_alloc) {
    PyErr_NoMemory();
    return -1;
  }
  st->tmap_blob = st->tmap_alloc + ((64 - (uintptr_t)st->tmap_alloc % 64) % 64);
  for (j = 0; j < st->ntmaps; j++) {
    Py_ssize_t arg, src;
    PyObject* encode;
    if (!PyArg_ParseTuple(PyList_GET_ITEM(tmaps, j), "nnO", &arg, &src, &encode)) return -1;
    if (arg < 0 || arg >= st->nargs || src < 0 || src >= n_ptrs || !PyCallable_Check(encode)) {
      PyErr_SetString(PyExc_ValueError, "RepeatCall: a tensor map names an argument, a pointer and an encoder");
      return -1;
    }
    Py_INCREF(encode);
    st->tmap_encode[j] = encode;
    st->tmap_arg[j] = arg;
    st->tmap_src[j] = src;
    st->params[arg] = st->tmap_blob + FC_TMAP * j;
  }
  return 0;
}

static int fc_init_step(fc_step* st, PyObject* spec, Py_ssize_t n_ptrs, Py_ssize_t* total_tmaps) {
  unsigned long long entry, handle, shared, v;
  PyObject *grid, *block, *slots, *tmaps = NULL;
  const char* data;
  Py_ssize_t size, j;
  if (!PyArg_ParseTuple(spec, "KKOOKy#O|O", &entry, &handle, &grid, &block, &shared, &data, &size, &slots, &tmaps))
    return -1;
  if (size % 8 != 0 || !PyList_Check(slots)) {
    PyErr_SetString(PyExc_ValueError, "RepeatCall: storage of 8 bytes per argument and a list of slots");
    return -1;
  }
  st->entry = (launch_fn)(uintptr_t)entry;
  st->handle = (void*)(uintptr_t)handle;
  st->shared = (unsigned)shared;
  for (j = 0; j < 3; j++) {
    if (seq_ull(grid, j, &v) < 0) return -1;
    st->grid[j] = (unsigned)v;
    if (seq_ull(block, j, &v) < 0) return -1;
    st->block[j] = (unsigned)v;
  }
  st->nargs = size / 8;
  st->storage = PyMem_Malloc((size_t)size + 8);
  st->params = PyMem_Malloc(((size_t)st->nargs + 1) * sizeof(void*));
  st->nslots = PyList_GET_SIZE(slots);
  st->slot_arg = PyMem_Malloc(((size_t)st->nslots + 1) * sizeof(Py_ssize_t));
  st->slot_src = PyMem_Malloc(((size_t)st->nslots + 1) * sizeof(Py_ssize_t));
  if (!st->storage || !st->params || !st->slot_arg || !st->slot_src) {
    PyErr_NoMemory();
    return -1;
  }
  memcpy(st->storage, data, (size_t)size);
  for (j = 0; j < st->nargs; j++) st->params[j] = st->storage + 8 * j;
  for (j = 0; j < st->nslots; j++) {
    Py_ssize_t arg, src;
    if (!PyArg_ParseTuple(PyList_GET_ITEM(slots, j), "nn", &arg, &src)) return -1;
    if (arg < 0 || arg >= st->nargs || src < 0 || src >= n_ptrs) {
      PyErr_SetString(PyExc_ValueError, "RepeatCall: a slot names an argument or pointer that does not exist");
      return -1;
    }
    st->slot_arg[j] = arg;
    st->slot_src[j] = src;
  }
  return tmaps != NULL ? fc_init_tmaps(st, tmaps, n_ptrs, total_tmaps) : 0;
}

/* RepeatCall(n_inputs, outputs, stream_fn, stream_arg, fail, steps, expect,
 *          derive=None, fingerprint=(), n_derived=0, scratch=None, n_scratch=0, align=[])
 *   outputs:  [(allocator, input index or -1)]
 *   steps:    [(entry, handle, (gx, gy, gz), (bx, by, bz), shared, storage bytes, [(arg, source)]
 *              [, [(arg, source, encode)]])]; sources count inputs, then outputs, then derived
 *             pointers, then scratch pointers; the last list: tensor-map arguments, encode(pointer)
 *             -> the 128 bytes of the map over that pointer
 *   fail(step, rc, stream, params address): retries that launch (returns) or raises
 *   expect:   per input None or (type, shape, dtype, device, memory format or None): what
 *             matches(inputs) checks
 *   derive(inputs, pointers so far, stream) -> (remember: bool, n_derived pointers): fills (prepare
 *             launches on that stream) or finds the derived data; fingerprint: the input indices
 *             (-1: an absent optional input) it is computed from
 *   scratch(stream) -> n_scratch pointers of per-call scratch for that stream
 *   align:    [(input index, bytes: a power of two)]: inputs whose address must be a multiple of it */
static int fc_init_align(RepeatCall* self, PyObject* align, Py_ssize_t n_inputs) {
  Py_ssize_t i;
  if (!PyList_Check(align) || PyList_GET_SIZE(align) > FC_MAX_PTRS) {
    PyErr_SetString(PyExc_TypeError, "RepeatCall: align is a list of (input index, bytes)");
    return -1;
  }
  for (i = 0; i < PyList_GET_SIZE(align); i++) {
    Py_ssize_t index;
    unsigned long long bytes;
    if (!PyArg_ParseTuple(PyList_GET_ITEM(align, i), "nK", &index, &bytes)) return -1;
    if (index < 0 || index >= n_inputs || bytes == 0 || (bytes & (bytes - 1)) != 0) {
      PyErr_SetString(PyExc_ValueError, "RepeatCall: an alignment names an input and a power of two");
      return -1;
    }
    self->align_index[i] = index;
    self->align_mask[i] = bytes - 1;
  }
  self->n_align = PyList_GET_SIZE(align);
  return 0;
}

static int fc_init(RepeatCall* self, PyObject* args, PyObject* kwds) {
  Py_ssize_t n_inputs, i, n_derived = 0, n_scratch = 0, n_ptrs, total_tmaps = 0;
  PyObject *outputs, *stream_fn, *stream_arg, *fail, *steps, *expect;
  PyObject *derive = Py_None, *fingerprint = NULL, *scratch = Py_None, *align = NULL;
  (void)kwds;
  if (jt_intern_names() < 0) return -1;
  if (!PyArg_ParseTuple(args, "nOOOOOO|OOnOnO", &n_inputs, &outputs, &stream_fn, &stream_arg, &fail, &steps,
                        &expect, &derive, &fingerprint, &n_derived, &scratch, &n_scratch, &align))
    return -1;
  if (align != NULL && fc_init_align(self, align, n_inputs) < 0) return -1;
  if (!PyList_Check(outputs) || !PyList_Check(steps) || !PyCallable_Check(stream_fn) || !PyCallable_Check(fail) ||
      !PyTuple_Check(expect) || PyTuple_GET_SIZE(expect) != n_inputs) {
    PyErr_SetString(PyExc_TypeError,
                    "RepeatCall(n_inputs, outputs: list, stream_fn, stream_arg, fail, steps: list, expect: tuple, ...)");
    return -1;
  }
  if (self->steps != NULL || self->makers != NULL) {
    PyErr_SetString(PyExc_RuntimeError, "RepeatCall is initialized once");
    return -1;
  }
  n_ptrs = n_inputs + PyList_GET_SIZE(outputs) + n_derived + n_scratch;
  if (PyList_GET_SIZE(outputs) < 1 || n_ptrs > FC_MAX_PTRS || n_derived < 0 || n_derived > FC_MAX_WS ||
      n_scratch < 0 || n_scratch > FC_MAX_WS || (derive != Py_None && !PyCallable_Check(derive)) ||
      (scratch != Py_None && !PyCallable_Check(scratch)) || (n_derived > 0) != (derive != Py_None) ||
      (n_scratch > 0) != (scratch != Py_None)) {
    PyErr_SetString(PyExc_ValueError, "RepeatCall: outputs, derived data or scratch out of range");
    return -1;
  }
  for (i = 0; i < n_inputs; i++) {
    PyObject* e = PyTuple_GET_ITEM(expect, i);
    if (e != Py_None && !(PyTuple_Check(e) && PyTuple_GET_SIZE(e) >= 4 && PyTuple_GET_SIZE(e) <= 5 &&
                          PyType_Check(PyTuple_GET_ITEM(e, 0)))) {
      PyErr_SetString(PyExc_TypeError, "RepeatCall: expect[i] is None or (type, shape, dtype, device[, memory format])");
      return -1;
    }
  }
  self->n_inputs = n_inputs;
  self->n_outputs = PyList_GET_SIZE(outputs);
  self->makers = PyMem_Calloc((size_t)self->n_outputs + 1, sizeof(PyObject*));
  self->like = PyMem_Calloc((size_t)self->n_outputs + 1, sizeof(Py_ssize_t));
  if (self->makers == NULL || self->like == NULL) {
    PyErr_NoMemory();
    return -1;
  }
  for (i = 0; i < self->n_outputs; i++) {
    PyObject* maker;
    Py_ssize_t like;
    if (!PyArg_ParseTuple(PyList_GET_ITEM(outputs, i), "On", &maker, &like)) return -1;
    if (!PyCallable_Check(maker) || like < -1 || like >= n_inputs) {
      PyErr_SetString(PyExc_ValueError, "RepeatCall: an output needs a callable and an input index or -1");
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
  Py_INCREF(expect);
  self->expect = expect;
  if (derive != Py_None) {
    PyObject* fp = fingerprint ? PySequence_Fast(fingerprint, "RepeatCall: fingerprint is a sequence") : NULL;
    if (fp == NULL) return -1;
    self->n_fp = PySequence_Fast_GET_SIZE(fp);
    for (i = 0; i < self->n_fp && i < FC_MAX_FP; i++) {
      self->fp_index[i] = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(fp, i));
      if (self->fp_index[i] < -1 || self->fp_index[i] >= n_inputs) self->n_fp = FC_MAX_FP + 1;
    }
    Py_DECREF(fp);
    if (PyErr_Occurred()) return -1;
    if (self->n_fp > FC_MAX_FP) {
      PyErr_SetString(PyExc_ValueError, "RepeatCall: fingerprint inputs out of range");
      return -1;
    }
    Py_INCREF(derive);
    self->derive = derive;
    self->n_derived = n_derived;
  }
  if (scratch != Py_None) {
    Py_INCREF(scratch);
    self->scratch = scratch;
    self->n_scratch = n_scratch;
  }
  self->n_steps = PyList_GET_SIZE(steps);
  self->steps = PyMem_Calloc((size_t)self->n_steps + 1, sizeof(fc_step));
  if (self->steps == NULL) {
    PyErr_NoMemory();
    return -1;
  }
  for (i = 0; i < self->n_steps; i++)
    if (fc_init_step(&self->steps[i], PyList_GET_ITEM(steps, i), n_ptrs, &total_tmaps) < 0) return -1;
  return 0;
}

/* A launch returned rc: fail(step, rc, stream, params) may retry it (returns) or raise. It gets a
 * private copy of the arguments: Python code runs in the callback, and another thread's call of
 * this object may rewrite the storage meanwhile. */
static int fc_failed(RepeatCall* self, fc_step* st, Py_ssize_t i, int rc, unsigned long long stream) {
  const size_t maps = (size_t)st->nargs * 8 + 64;   /* tensor maps after the 8-byte values, 64-aligned */
  unsigned char* copy = PyMem_Malloc(maps + (size_t)st->ntmaps * FC_TMAP + 64);
  void** params = PyMem_Malloc(((size_t)st->nargs + 1) * sizeof(void*));
  PyObject* r = NULL;
  Py_ssize_t j;
  if (copy == NULL || params == NULL) {
    PyErr_NoMemory();
  } else {
    unsigned char* blob = copy + maps - (uintptr_t)(copy + maps) % 64;
    memcpy(copy, st->storage, (size_t)st->nargs * 8);
    for (j = 0; j < st->nargs; j++) params[j] = copy + 8 * j;
    if (st->ntmaps > 0) memcpy(blob, st->tmap_blob, (size_t)st->ntmaps * FC_TMAP);
    for (j = 0; j < st->ntmaps; j++) params[st->tmap_arg[j]] = blob + FC_TMAP * j;
    r = PyObject_CallFunction(self->fail, "niKK", i, rc, stream, (unsigned long long)(uintptr_t)params);
  }
  PyMem_Free(copy);
  PyMem_Free(params);
  if (r == NULL) return -1;
  Py_DECREF(r);
  return 0;
}

static int fc_pointer(PyObject* obj, unsigned long long* out) {
  if (obj == Py_None) {
    *out = 0;
    return 0;
  }
  return as_ull(PyObject_CallMethodObjArgs(obj, jt_s_data_ptr, NULL), out);
}

/* Copy `n` pointers from a Python sequence returned by a callback into `out`. Steals `seq`. */
static int take_pointers(PyObject* seq, Py_ssize_t n, unsigned long long* out, const char* what) {
  Py_ssize_t k;
  if (seq == NULL) return -1;
  if (!PySequence_Check(seq) || PySequence_Size(seq) != n) {
    PyErr_Format(PyExc_TypeError, "RepeatCall: %s must return %zd pointers", what, n);
    Py_DECREF(seq);
    return -1;
  }
  for (k = 0; k < n; k++)
    if (seq_ull(seq, k, &out[k]) < 0) {
      Py_DECREF(seq);
      return -1;
    }
  Py_DECREF(seq);
  return 0;
}

/* The per-call scratch for this stream: remembered per stream (calls on one stream run in order,
 * so each may reuse what the last one used); the first call on a stream asks Python. */
static int fc_scratch_for(RepeatCall* self, unsigned long long stream, unsigned long long* out) {
  Py_ssize_t i;
  fc_scratch* s;
  for (i = 0; i < FC_STREAMS; i++)
    if (self->scr[i].epoch == epoch && self->scr[i].stream == stream) {
      memcpy(out, self->scr[i].ws, (size_t)self->n_scratch * 8);
      return 0;
    }
  if (take_pointers(PyObject_CallFunction(self->scratch, "K", stream), self->n_scratch, out, "scratch") < 0)
    return -1;
  s = &self->scr[self->scr_next++ % FC_STREAMS];
  memcpy(s->ws, out, (size_t)self->n_scratch * 8);
  s->stream = stream;
  s->epoch = epoch; /* read after the callback: an allocation there may have freed older memory */
  return 0;
}

/* The derived data for these inputs on this stream: remembered by pointer and version counter of
 * each derived-from input while the tensors it was computed from live; else Python finds or
 * fills it (launching the prepare kernels on `stream`). */
static int fc_derived_for(RepeatCall* self, PyObject* inputs, unsigned long long* ptrs, unsigned long long stream,
                          unsigned long long* out) {
  unsigned long long p[FC_MAX_FP], ver[FC_MAX_FP];
  PyObject *r, *ptr_tuple, *remember, *found;
  Py_ssize_t i, k, n_io = self->n_inputs + self->n_outputs;
  fc_memo* m;
  for (k = 0; k < self->n_fp; k++) {
    Py_ssize_t idx = self->fp_index[k];
    PyObject* v = idx < 0 ? Py_None : PyTuple_GET_ITEM(inputs, idx);
    p[k] = idx < 0 ? 0 : ptrs[idx];
    ver[k] = 0;
    if (v != Py_None && as_ull(PyObject_GetAttr(v, jt_s_version), &ver[k]) < 0) return -1;
  }
  for (i = 0; i < FC_MEMO; i++) {
    m = &self->memo[i];
    if (m->epoch != epoch || m->stream != stream || memcmp(m->ptr, p, (size_t)self->n_fp * 8) != 0 ||
        memcmp(m->version, ver, (size_t)self->n_fp * 8) != 0)
      continue;
    for (k = 0; k < self->n_fp; k++)
      if (m->guard[k] != NULL && weak_target(m->guard[k]) == Py_None) break;
    if (k < self->n_fp) continue; /* its memory may now be another tensor's */
    memcpy(out, m->ws, (size_t)self->n_derived * 8);
    return 0;
  }
  ptr_tuple = PyTuple_New(n_io);
  if (ptr_tuple == NULL) return -1;
  for (i = 0; i < n_io; i++) {
    PyObject* o = PyLong_FromUnsignedLongLong(ptrs[i]);
    if (o == NULL) {
      Py_DECREF(ptr_tuple);
      return -1;
    }
    PyTuple_SET_ITEM(ptr_tuple, i, o);
  }
  r = PyObject_CallFunction(self->derive, "OOK", inputs, ptr_tuple, stream);
  Py_DECREF(ptr_tuple);
  if (r == NULL) return -1;
  if (!PyArg_ParseTuple(r, "OO", &remember, &found)) {
    Py_DECREF(r);
    return -1;
  }
  Py_INCREF(found);
  k = PyObject_IsTrue(remember);
  Py_DECREF(r);
  if (k < 0) {
    Py_DECREF(found);
    return -1;
  }
  if (take_pointers(found, self->n_derived, out, "derive") < 0) return -1;
  if (!k) return 0;
  m = &self->memo[self->memo_next++ % FC_MEMO];
  for (k = 0; k < FC_MAX_FP; k++) Py_CLEAR(m->guard[k]);
  m->epoch = 0;
  for (k = 0; k < self->n_fp; k++) {
    Py_ssize_t idx = self->fp_index[k];
    PyObject* v = idx < 0 ? Py_None : PyTuple_GET_ITEM(inputs, idx);
    if (v == Py_None) continue;
    m->guard[k] = PyWeakref_NewRef(v, NULL);
    if (m->guard[k] == NULL) { /* not weakly referenceable: never remembered */
      PyErr_Clear();
      return 0;
    }
  }
  memcpy(m->ptr, p, sizeof(p));
  memcpy(m->version, ver, sizeof(ver));
  memcpy(m->ws, out, (size_t)self->n_derived * 8);
  m->stream = stream;
  m->epoch = epoch;
  return 0;
}

/* Tensor map k of a step over pointer ptr into out: the one remembered when the pointer is the same,
 * else encode(ptr) (Python; its result remembered). Another thread may replace what is remembered
 * while the GIL is let go, so the caller keeps its own copy. */
static int fc_tmap_for(fc_step* st, Py_ssize_t k, unsigned long long ptr, unsigned char* out) {
  PyObject* r;
  char* data;
  Py_ssize_t size;
  if (st->tmap_valid[k] && st->tmap_ptr[k] == ptr) {
    memcpy(out, st->tmap_known + FC_TMAP * k, FC_TMAP);
    return 0;
  }
  r = PyObject_CallFunction(st->tmap_encode[k], "K", ptr);
  if (r == NULL) return -1;
  if (PyBytes_AsStringAndSize(r, &data, &size) < 0 || size != FC_TMAP) {
    if (!PyErr_Occurred()) PyErr_Format(PyExc_ValueError, "RepeatCall: a tensor map encoder returned %zd bytes, not %d",
                                        size, FC_TMAP);
    Py_DECREF(r);
    return -1;
  }
  memcpy(out, data, FC_TMAP);
  memcpy(st->tmap_known + FC_TMAP * k, data, FC_TMAP);
  st->tmap_ptr[k] = ptr;
  st->tmap_valid[k] = 1;
  Py_DECREF(r);
  return 0;
}

/* The call itself: inputs is a tuple whose signature was checked. NotImplemented (not run): an
 * input misses its alignment. */
static PyObject* fc_run(RepeatCall* self, PyObject* inputs) {
  PyObject* outs[FC_MAX_PTRS];
  unsigned long long ptrs[FC_MAX_PTRS], stream;
  unsigned char maps[FC_MAX_TMAPS][FC_TMAP];  /* this call's tensor maps, found before any argument is written */
  Py_ssize_t i, j, t, made = 0, n_io = self->n_inputs + self->n_outputs;
  PyObject *r, *result = NULL;
  if (PyTuple_GET_SIZE(inputs) != self->n_inputs) {
    PyErr_Format(PyExc_TypeError, "RepeatCall expects %zd inputs (got %zd)", self->n_inputs, PyTuple_GET_SIZE(inputs));
    return NULL;
  }
  for (i = 0; i < self->n_inputs; i++)
    if (fc_pointer(PyTuple_GET_ITEM(inputs, i), &ptrs[i]) < 0) return NULL;
  for (i = 0; i < self->n_align; i++)
    if (ptrs[self->align_index[i]] & self->align_mask[i]) Py_RETURN_NOTIMPLEMENTED;
  for (i = 0; i < self->n_outputs; i++) {
    PyObject* o = self->like[i] < 0 ? PyObject_CallObject(self->makers[i], NULL)
                                    : PyObject_CallFunctionObjArgs(self->makers[i],
                                                                   PyTuple_GET_ITEM(inputs, self->like[i]), NULL);
    if (o == NULL) goto done;
    outs[made++] = o;
    if (fc_pointer(o, &ptrs[self->n_inputs + i]) < 0) goto done;
  }
  r = self->stream_arg ? PyObject_CallFunctionObjArgs(self->stream_fn, self->stream_arg, NULL)
                       : PyObject_CallObject(self->stream_fn, NULL);
  if (as_ull(r, &stream) < 0) goto done;
  if (self->scratch != NULL && fc_scratch_for(self, stream, ptrs + n_io + self->n_derived) < 0) goto done;
  if (self->derive != NULL && fc_derived_for(self, inputs, ptrs, stream, ptrs + n_io) < 0) goto done;
  for (i = 0, t = 0; i < self->n_steps; i++)
    for (j = 0; j < self->steps[i].ntmaps; j++, t++)
      if (fc_tmap_for(&self->steps[i], j, ptrs[self->steps[i].tmap_src[j]], maps[t]) < 0) goto done;
  /* From here to the last launch: no Python code runs, the GIL stays held. */
  for (i = 0, t = 0; i < self->n_steps; i++) {
    fc_step* st = &self->steps[i];
    int rc;
    for (j = 0; j < st->nslots; j++) memcpy(st->storage + 8 * st->slot_arg[j], &ptrs[st->slot_src[j]], 8);
    for (j = 0; j < st->ntmaps; j++, t++) memcpy(st->tmap_blob + FC_TMAP * j, maps[t], FC_TMAP);
    rc = st->entry(st->handle, st->grid[0], st->grid[1], st->grid[2], st->block[0], st->block[1], st->block[2],
                   st->shared, (void*)(uintptr_t)stream, st->params, NULL);
    if (rc != 0 && fc_failed(self, st, i, rc, stream) < 0) goto done;
  }
  if (made == 1) {
    result = outs[0];
  } else {
    result = PyTuple_New(made);
    if (result == NULL) goto done;
    for (i = 0; i < made; i++) PyTuple_SET_ITEM(result, i, outs[i]);
  }
  made = 0;
done:
  for (i = 0; i < made; i++) Py_DECREF(outs[i]);
  return result;
}

/* fc(inputs: tuple) -> the output, or a tuple of them (the signature is the caller's business);
 * NotImplemented for an input that misses its alignment */
static PyObject* fc_call(RepeatCall* self, PyObject* args, PyObject* kwds) {
  if (kwds != NULL || PyTuple_GET_SIZE(args) != 1 || !PyTuple_Check(PyTuple_GET_ITEM(args, 0))) {
    PyErr_SetString(PyExc_TypeError, "RepeatCall takes one tuple of inputs");
    return NULL;
  }
  return fc_run(self, PyTuple_GET_ITEM(args, 0));
}

/* matches(inputs) -> whether every input is what this call was bound for */
static PyObject* fc_matches(RepeatCall* self, PyObject* inputs) {
  jt_sig sig[FC_MAX_PTRS];
  PyTypeObject* base = NULL;
  Py_ssize_t i, n;
  int m;
  if (!PyTuple_Check(inputs) || (n = PyTuple_GET_SIZE(inputs)) != self->n_inputs) Py_RETURN_FALSE;
  for (i = 0; i < n && base == NULL; i++)
    if (PyTuple_GET_ITEM(self->expect, i) != Py_None)
      base = (PyTypeObject*)PyTuple_GET_ITEM(PyTuple_GET_ITEM(self->expect, i), 0);
  if (base == NULL) base = &PyBaseObject_Type;
  m = jt_sig_read(inputs, base, sig);
  if (m == 1) {
    m = jt_sig_equal(self->expect, sig, n);
    jt_sig_release(sig, n);
    if (m == 1) m = jt_formats_match(self->expect, inputs);
  }
  if (m < 0) return NULL;
  return PyBool_FromLong(m);
}

static PyObject* fc_forget(RepeatCall* self, PyObject* noargs) {
  (void)noargs;
  fc_forget_memo(self);
  Py_RETURN_NONE;
}

static PyMethodDef fc_methods[] = {
    {"matches", (PyCFunction)fc_matches, METH_O, "whether these inputs are what the call was bound for"},
    {"forget", (PyCFunction)fc_forget, METH_NOARGS, "drop the remembered derived data and scratch pointers"},
    {NULL, NULL, 0, NULL}};

PyTypeObject JtRepeatCallType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "jitops_launch.RepeatCall",
    .tp_basicsize = sizeof(RepeatCall),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "a bound plan's repeat call, in C",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)fc_init,
    .tp_dealloc = (destructor)fc_dealloc,
    .tp_call = (ternaryfunc)fc_call,
    .tp_methods = fc_methods,
};

PyObject* jt_fastcall_run(PyObject* call, PyObject* inputs) { return fc_run((RepeatCall*)call, inputs); }

PyObject* jt_fastcall_expect(PyObject* call) { return ((RepeatCall*)call)->expect; }
