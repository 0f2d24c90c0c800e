/* Programmatic dependent launch (CUDA sm_90+) behind the launch entry's signature, so every holder of an
 * entry (generated repeat code, RepeatCall, the ONNX Runtime library's replays) launches such a kernel
 * unchanged. The kernel may then start before the stream's previous kernel has finished: it waits for it
 * on the device (griddepcontrol.wait) before touching memory, and lets the next kernel start early
 * (griddepcontrol.launch_dependents).
 *
 * That pays only after a kernel that lets it start early: measured on an H200, ResNet-50's convolutions
 * chained gained 2-3%, but after other libraries' kernels the attribute cost 1.3%. So in mode 1 (auto) a
 * launch carries the attribute only while the stream is captured into a CUDA graph and the launch's one
 * dependency is a registered kernel (one that lets its dependents start early); otherwise it is a plain
 * cuLaunchKernel. Mode 2 (on) always carries it. Layouts as cuda.h's CUlaunchAttribute (id, padding, a
 * 64-byte value union), CUlaunchConfig and CUDA_KERNEL_NODE_PARAMS_v2 (the function first). */
#include "jitops_native.h"

#include <stdint.h>
#include <string.h>

typedef struct {
  int id;
  char pad[4];
  union { char bytes[64]; int allowed; unsigned long long align; } value;
} jt_launch_attr;
typedef struct {
  unsigned grid[3], block[3], shared;
  void* stream;
  jt_launch_attr* attrs;
  unsigned count;
} jt_launch_config;

typedef int (*launch_ex_fn)(const jt_launch_config* config, void* f, void** params, void** extra);
typedef int (*capture_info_fn)(void* stream, int* status, unsigned long long* id, void** graph,
                               void* const** deps, size_t* ndeps);               /* cuStreamGetCaptureInfo_v2 */
typedef int (*node_type_fn)(void* node, int* type);                               /* cuGraphNodeGetType */
typedef int (*kernel_node_params_fn)(void* node, void* params);                  /* cuGraphKernelNodeGetParams_v2 */

#define JT_ATTR_PROGRAMMATIC_STREAM_SERIALIZATION 6
#define JT_CUDA_ERROR_NOT_SUPPORTED 801
#define JT_CAPTURE_ACTIVE 1
#define JT_NODE_KERNEL 0

static struct {
  launch_fn launch;
  launch_ex_fn launch_ex;
  capture_info_fn capture_info;
  node_type_fn node_type;
  kernel_node_params_fn node_params;
  int mode;             /* 1 auto, 2 always */
  size_t n_early;
} pg = {NULL, NULL, NULL, NULL, NULL, 1, 0};
/* Kernels that let their dependents start early. A fixed table, filled under the GIL and read by launches
 * on any thread (the ONNX Runtime library's): an entry is written before the count that covers it, and
 * nothing moves. A kernel past its end launches plainly in auto mode. */
#define JT_EARLY_MAX 4096
static void* early[JT_EARLY_MAX];

static int lets_dependents_start(void* f) {
  size_t i;
  const size_t n = __atomic_load_n(&pg.n_early, __ATOMIC_ACQUIRE);
  for (i = 0; i < n; i++)
    if (early[i] == f) return 1;
  return 0;
}

/* Auto mode: the stream is being captured and the launch's one dependency is a registered kernel. */
static int after_early_kernel(void* stream) {
  int status = 0, type = -1;
  unsigned long long id = 0;
  void* graph = NULL;
  void* const* deps = NULL;
  size_t n = 0;
  union { void* func; unsigned char bytes[256]; } params;
  if (pg.capture_info == NULL || pg.node_type == NULL || pg.node_params == NULL) return 0;
  if (pg.capture_info(stream, &status, &id, &graph, &deps, &n) != 0 || status != JT_CAPTURE_ACTIVE) return 0;
  if (n != 1 || deps == NULL || pg.node_type(deps[0], &type) != 0 || type != JT_NODE_KERNEL) return 0;
  memset(&params, 0, sizeof params);
  if (pg.node_params(deps[0], &params) != 0) return 0;
  return lets_dependents_start(params.func);
}

static int programmatic_launch(void* f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                               unsigned bz, unsigned shared, void* stream, void** params, void** extra) {
  jt_launch_attr attr;
  jt_launch_config cfg;
  if (pg.launch == NULL || pg.launch_ex == NULL) return JT_CUDA_ERROR_NOT_SUPPORTED;
  if (pg.mode != 2 && !after_early_kernel(stream))
    return pg.launch(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra);
  memset(&attr, 0, sizeof attr);
  attr.id = JT_ATTR_PROGRAMMATIC_STREAM_SERIALIZATION;
  attr.value.allowed = 1;
  cfg.grid[0] = gx; cfg.grid[1] = gy; cfg.grid[2] = gz;
  cfg.block[0] = bx; cfg.block[1] = by; cfg.block[2] = bz;
  cfg.shared = shared;
  cfg.stream = stream;
  cfg.attrs = &attr;
  cfg.count = 1;
  return pg.launch_ex(&cfg, f, params, extra);
}

/* programmatic_setup(cuLaunchKernel, cuLaunchKernelEx, cuStreamGetCaptureInfo_v2, cuGraphNodeGetType,
 * cuGraphKernelNodeGetParams_v2): their addresses (0: missing; auto mode then launches plainly) -> the
 * address of programmatic_launch */
PyObject* jt_programmatic_setup(PyObject* self, PyObject* args) {
  unsigned long long a[5];
  (void)self;
  if (!PyArg_ParseTuple(args, "KKKKK", &a[0], &a[1], &a[2], &a[3], &a[4])) return NULL;
  pg.launch = (launch_fn)(uintptr_t)a[0];
  pg.launch_ex = (launch_ex_fn)(uintptr_t)a[1];
  pg.capture_info = (capture_info_fn)(uintptr_t)a[2];
  pg.node_type = (node_type_fn)(uintptr_t)a[3];
  pg.node_params = (kernel_node_params_fn)(uintptr_t)a[4];
  return PyLong_FromUnsignedLongLong((unsigned long long)(uintptr_t)&programmatic_launch);
}

/* programmatic_mode(1 auto | 2 always) */
PyObject* jt_programmatic_mode(PyObject* self, PyObject* arg) {
  long m = PyLong_AsLong(arg);
  (void)self;
  if (m == -1 && PyErr_Occurred()) return NULL;
  if (m != 1 && m != 2) {
    PyErr_SetString(PyExc_ValueError, "programmatic_mode takes 1 (auto) or 2 (always)");
    return NULL;
  }
  pg.mode = (int)m;
  Py_RETURN_NONE;
}

/* programmatic_register(CUfunction): a kernel that lets its dependents start early */
PyObject* jt_programmatic_register(PyObject* self, PyObject* arg) {
  unsigned long long v = PyLong_AsUnsignedLongLong(arg);
  void* f;
  (void)self;
  if (v == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
  f = (void*)(uintptr_t)v;
  if (lets_dependents_start(f) || pg.n_early == JT_EARLY_MAX) Py_RETURN_NONE;
  early[pg.n_early] = f;
  __atomic_store_n(&pg.n_early, pg.n_early + 1, __ATOMIC_RELEASE);
  Py_RETURN_NONE;
}
