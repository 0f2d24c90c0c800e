/* Shared between the two translation units of the jitops_launch extension module. */
#ifndef JITOPS_NATIVE_H
#define JITOPS_NATIVE_H
#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* The driver's launch entry point (cuLaunchKernel, hipModuleLaunchKernel: the same signature). */
typedef int (*launch_fn)(void* f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                         unsigned bz, unsigned shared, void* stream, void** params, void** extra);

#define FC_MAX_PTRS 64 /* inputs, outputs, derived and scratch pointers of one call */

/* jitops_fastcall.c: the repeat call of a bound plan. */
extern PyTypeObject JtRepeatCallType;
PyObject* jt_fastcall_run(PyObject* call, PyObject* inputs); /* inputs: a tuple of the right signature;
                                                                NotImplemented: a misaligned input */
PyObject* jt_fastcall_expect(PyObject* call);                  /* borrowed: per input None or (type, shape, dtype, device) */
extern PyObject *jt_s_data_ptr, *jt_s_shape, *jt_s_dtype, *jt_s_device, *jt_s_is_contiguous, *jt_s_version, *jt_s_stride;
int jt_intern_names(void);

/* jitops_dispatch.c: an op's table of RepeatCalls, and the call signatures they are checked by. */
extern PyTypeObject JtDispatchType;
typedef struct {
  PyObject *shape, *dtype, *device; /* NULL for a None input */
} jt_sig;
int jt_sig_read(PyObject* inputs, PyTypeObject* base, jt_sig* sig); /* 1 read, 0 not of type base, -1 error */
int jt_sig_equal(PyObject* expect, const jt_sig* sig, Py_ssize_t n); /* 1 equal, 0 not, -1 error */
void jt_sig_release(jt_sig* sig, Py_ssize_t n);
int jt_formats_match(PyObject* expect, PyObject* inputs);                                /* 1, 0, -1 error */
/* The matching repeat call of Dispatch `d`, run: 1 (*result: the outputs), 0 none matches, -1 error. */
int jt_dispatch_run(PyObject* d, PyObject* backend, PyObject* inputs, PyObject* attrs, PyObject** result);
/* An op's public function in C: its Dispatch first, the Python function otherwise. */
extern PyTypeObject JtEntryType;
/* memory_released(): memory some RepeatCall may remember (derived data, per-stream scratch) was
 * freed; every remembered pointer is dropped before its next use. */
PyObject* jt_memory_released(PyObject* self, PyObject* noargs);

/* jitops_programmatic.c: programmatic dependent launch behind the launch entry's signature. */
PyObject* jt_programmatic_setup(PyObject* self, PyObject* args);
PyObject* jt_programmatic_mode(PyObject* self, PyObject* arg);
PyObject* jt_programmatic_register(PyObject* self, PyObject* arg);

#endif
