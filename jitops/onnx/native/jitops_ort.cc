// jitops custom ops for ONNX Runtime: one generic kernel that hands each node to jitops (Python).
//
// ORT loads this library with SessionOptions.register_custom_ops_library and calls
// RegisterCustomOps. Before that, jitops (jitops/onnx/native.py) has loaded the same file with
// ctypes and called jitops_ort_configure with the node types (domain `jitops`) and three callbacks.
// Each node type is registered for float, float16 and bfloat16, on the CPU execution provider and on the
// CUDA and ROCm ones. A kernel reads its node's attributes once (CreateKernelV2) and hands them to
// the `create` callback; Compute passes the inputs as they are (data pointer, shape, element type;
// host memory on CPU, device memory on CUDA/ROCm, no copies) plus ORT's GPU compute stream, and
// the callback allocates outputs through jitops_ort_output and launches jitops kernels into them.
// A failing callback's message becomes the ORT error status the caller sees.
//
// GPU providers: after a call worked out in Python, jitops hands back a replay of it (its launches
// with their argument values, which arguments are which outputs). A later Compute of the same node
// with the same input array (pointers, shapes, types) on the same stream, while no memory the replay
// names was freed or refilled (jitops_ort_invalidate), allocates the outputs and makes those launches
// from here, without entering Python (ORT's allocations meet the kernels' vector alignment):
// ORT's arena hands a node the same buffers run after run, and a model at batch 1 is bound by this
// host work per node (BERT-base, H100, 2026-11-26: a jitops node 27-68 us under ORT's profiler,
// ORT's own 14-30).
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "ort_abi.h"

#define JT_EXPORT extern "C" __attribute__((visibility("default")))

JT_EXPORT void* jitops_ort_output(void* call_ptr, int index, const int64_t* dims, int ndim);

namespace {

constexpr int kMaxRank = 8;
constexpr size_t kErrLen = 8192;

struct JtTensor {        // mirrored by jitops/onnx/native.py (ctypes)
  void* data;            // null: input absent
  int64_t dims[kMaxRank];
  int32_t ndim;          // -1: input absent
  int32_t elem_type;
};

enum Provider : int { kCpu = 0, kCuda = 1, kRocm = 2 };
const char* const kProviderNames[] = {nullptr, "CUDAExecutionProvider", "ROCMExecutionProvider"};

using CreateFn = int (*)(const char* op_type, int provider, int elem_type, const char* attrs_json,
                         int64_t* kernel_id, char* err, size_t errlen);
using ComputeFn = int (*)(int64_t kernel_id, void* call, int n_inputs, const JtTensor* inputs, void* stream,
                          char* err, size_t errlen);
using DestroyFn = void (*)(int64_t kernel_id);

struct AttrSpec {
  std::string name;
  char kind;  // i: int, f: float, s: string, I: ints, F: floats
};

struct TypeSpec {
  std::string name;
  int n_inputs = 0;
  uint32_t optional_mask = 0;
  int n_outputs = 1;
  std::vector<AttrSpec> attrs;
};

struct JtOp {            // standard layout: `base` first, so an OrtCustomOp* is a JtOp*
  OrtCustomOp base;
  const TypeSpec* spec;
  int elem_type;
  int provider;
};

// The driver's launch entry (cuLaunchKernel, hipModuleLaunchKernel, the probe's: one signature), as
// jitops' native launcher calls it.
using LaunchFn = int (*)(void* f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                         unsigned shared, void* stream, void** params, void** extra);

// One call's launches, replayable with other output buffers. Built from the blob jitops writes
// (jitops/onnx/kernels.py, replay_blob): u32 outputs, per output u32 rank + i64 dims; u32 steps, per
// step u64 entry, u64 function, u32 grid x3, block x3, shared bytes, u32 arguments, per argument
// u32 size + its bytes, u32 patches, per patch u32 argument + u32 output (the argument is that
// output's pointer). Each replay owns its argument values: launches of several nodes that share one
// plan never write into each other's.
struct Replay {
  struct Step {
    LaunchFn entry;
    void* function;
    unsigned cfg[7];
    std::vector<uint8_t> storage;      // the argument values, each 8-byte aligned
    std::vector<void*> params;         // pointers into storage
    std::vector<std::pair<uint32_t, uint32_t>> patches;   // (argument, output)
  };
  std::vector<std::vector<int64_t>> outputs;
  std::vector<Step> steps;
  // what a call must match (set when a kernel keeps the replay)
  std::vector<JtTensor> inputs;
  void* stream = nullptr;
  int64_t generation = -1;
};

struct JtKernel {
  const OrtApi* api;
  const JtOp* op;
  int64_t id;
  std::mutex mutex;                    // the replay: kept, replaced and run one call at a time
  Replay* replay = nullptr;
};

struct JtCall {           // handed to Python during one Compute
  const OrtApi* api;
  OrtKernelContext* ctx;
  std::string error;
  JtKernel* kernel;
  const JtTensor* inputs;
  int n_inputs;
  void* stream;
};

std::atomic<int64_t> g_generation{0};   // bumped when memory a replay may name is freed: every replay is stale

template <typename T>
bool take(const uint8_t*& p, const uint8_t* end, T* v) {
  if (static_cast<size_t>(end - p) < sizeof(T)) return false;
  std::memcpy(v, p, sizeof(T));
  p += sizeof(T);
  return true;
}

Replay* parse_replay(const uint8_t* p, size_t len) {
  const uint8_t* end = p + len;
  auto* r = new Replay();
  uint32_t n = 0;
  bool ok = take(p, end, &n);
  for (uint32_t i = 0; ok && i < n; ++i) {
    uint32_t rank = 0;
    ok = take(p, end, &rank) && rank <= static_cast<uint32_t>(kMaxRank);
    std::vector<int64_t> dims(ok ? rank : 0);
    for (uint32_t d = 0; ok && d < rank; ++d) ok = take(p, end, &dims[d]);
    r->outputs.push_back(dims);
  }
  if (ok) ok = take(p, end, &n);
  for (uint32_t i = 0; ok && i < n; ++i) {
    Replay::Step st;
    uint64_t entry = 0, function = 0;
    uint32_t n_args = 0, n_patches = 0;
    ok = take(p, end, &entry) && take(p, end, &function);
    for (int c = 0; ok && c < 7; ++c) ok = take(p, end, &st.cfg[c]);
    if (ok) ok = take(p, end, &n_args);
    std::vector<size_t> offsets;
    for (uint32_t a = 0; ok && a < n_args; ++a) {
      uint32_t size = 0;
      ok = take(p, end, &size) && static_cast<size_t>(end - p) >= size;
      if (!ok) break;
      size_t at = (st.storage.size() + 7) & ~static_cast<size_t>(7);
      st.storage.resize(at + size);
      std::memcpy(st.storage.data() + at, p, size);
      offsets.push_back(at);
      p += size;
    }
    if (ok) ok = take(p, end, &n_patches);
    for (uint32_t q = 0; ok && q < n_patches; ++q) {
      uint32_t arg = 0, out = 0;
      ok = take(p, end, &arg) && take(p, end, &out) && arg < n_args && out < r->outputs.size();
      st.patches.push_back({arg, out});
    }
    if (!ok) break;
    for (size_t at : offsets) st.params.push_back(st.storage.data() + at);
    st.entry = reinterpret_cast<LaunchFn>(static_cast<uintptr_t>(entry));
    st.function = reinterpret_cast<void*>(static_cast<uintptr_t>(function));
    r->steps.push_back(std::move(st));
  }
  if (!ok || p != end || r->steps.empty()) {
    delete r;
    return nullptr;
  }
  return r;
}

// The replay's launches with these output buffers on `stream`; the first failing launch's status.
int run_replay(Replay* r, void* stream, void* const* outputs) {
  for (Replay::Step& st : r->steps) {
    for (const auto& patch : st.patches) {
      const uint64_t ptr = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(outputs[patch.second]));
      std::memcpy(st.params[patch.first], &ptr, sizeof ptr);
    }
    const int rc = st.entry(st.function, st.cfg[0], st.cfg[1], st.cfg[2], st.cfg[3], st.cfg[4], st.cfg[5],
                            st.cfg[6], stream, st.params.data(), nullptr);
    if (rc) return rc;
  }
  return 0;
}

bool same_inputs(const Replay* r, const JtTensor* inputs, size_t n) {
  return r->inputs.size() == n && std::memcmp(r->inputs.data(), inputs, n * sizeof(JtTensor)) == 0;
}

std::mutex g_mutex;
CreateFn g_create = nullptr;
ComputeFn g_compute = nullptr;
DestroyFn g_destroy = nullptr;
std::vector<TypeSpec>* g_types = nullptr;   // never freed: ORT sessions point into them
std::vector<JtOp*>* g_ops = nullptr;
OrtCustomOpDomain* g_domain = nullptr;
std::string g_domain_name = "jitops";

const JtOp* as_op(const OrtCustomOp* op) { return reinterpret_cast<const JtOp*>(op); }

// ---- OrtCustomOp callbacks

const char* op_name(const OrtCustomOp* op) { return as_op(op)->spec->name.c_str(); }
const char* op_provider(const OrtCustomOp* op) { return kProviderNames[as_op(op)->provider]; }
int op_input_type(const OrtCustomOp* op, size_t) { return as_op(op)->elem_type; }
size_t op_input_count(const OrtCustomOp* op) { return static_cast<size_t>(as_op(op)->spec->n_inputs); }
int op_output_type(const OrtCustomOp* op, size_t) { return as_op(op)->elem_type; }
size_t op_output_count(const OrtCustomOp* op) { return static_cast<size_t>(as_op(op)->spec->n_outputs); }
int op_input_characteristic(const OrtCustomOp* op, size_t i) {
  return (as_op(op)->spec->optional_mask >> i) & 1u ? 1 : 0;
}
int op_output_characteristic(const OrtCustomOp*, size_t) { return 0; }
int op_input_memory_type(const OrtCustomOp*, size_t) { return 0; }
int op_variadic_min_arity(const OrtCustomOp*) { return 1; }
int op_variadic_homogeneity(const OrtCustomOp*) { return 1; }

OrtStatus* fail(const OrtApi* api, const std::string& msg) {
  return ort::create_status(api, ort::kFail, ("jitops: " + msg).c_str());
}

// Appends `"name": value` for one attribute, when the node has it.
bool append_attr(const OrtApi* api, const OrtKernelInfo* info, const AttrSpec& a, std::string* json) {
  char buf[64];
  OrtStatus* st = nullptr;
  std::string value;
  if (a.kind == 'i') {
    int64_t v = 0;
    st = ort::fn<OrtStatus* (*)(const OrtKernelInfo*, const char*, int64_t*)>(
        api, ort::KernelInfoGetAttribute_int64)(info, a.name.c_str(), &v);
    std::snprintf(buf, sizeof buf, "%lld", static_cast<long long>(v));
    value = buf;
  } else if (a.kind == 'f') {
    float v = 0;
    st = ort::fn<OrtStatus* (*)(const OrtKernelInfo*, const char*, float*)>(
        api, ort::KernelInfoGetAttribute_float)(info, a.name.c_str(), &v);
    std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(v));
    value = buf;
  } else if (a.kind == 'I' || a.kind == 'F') {
    size_t n = 0;
    std::vector<int64_t> ints;
    std::vector<float> floats;
    if (a.kind == 'I') {
      auto get = ort::fn<OrtStatus* (*)(const OrtKernelInfo*, const char*, int64_t*, size_t*)>(
          api, ort::KernelInfoGetAttributeArray_int64);
      st = get(info, a.name.c_str(), nullptr, &n);
      if (!st) { ints.resize(n); st = get(info, a.name.c_str(), ints.data(), &n); }
    } else {
      auto get = ort::fn<OrtStatus* (*)(const OrtKernelInfo*, const char*, float*, size_t*)>(
          api, ort::KernelInfoGetAttributeArray_float);
      st = get(info, a.name.c_str(), nullptr, &n);
      if (!st) { floats.resize(n); st = get(info, a.name.c_str(), floats.data(), &n); }
    }
    value = "[";
    for (size_t k = 0; !st && k < n; ++k) {
      if (a.kind == 'I') std::snprintf(buf, sizeof buf, "%lld", static_cast<long long>(ints[k]));
      else std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(floats[k]));
      value += (k ? "," : "") + std::string(buf);
    }
    value += "]";
  } else {  // string: only names and enum-like values, no escaping needed beyond quotes
    size_t n = 0;
    auto get = ort::fn<OrtStatus* (*)(const OrtKernelInfo*, const char*, char*, size_t*)>(
        api, ort::KernelInfoGetAttribute_string);
    st = get(info, a.name.c_str(), nullptr, &n);
    std::string s(n, '\0');
    if (!st) st = get(info, a.name.c_str(), &s[0], &n);
    if (!st) {
      s.resize(std::strlen(s.c_str()));
      value = "\"";
      for (char c : s) value += (c == '"' || c == '\\') ? '?' : c;
      value += "\"";
    }
  }
  if (st) {  // the node does not carry this attribute: its default applies
    ort::release_status(api, st);
    return false;
  }
  *json += (json->size() > 1 ? "," : "") + ("\"" + a.name + "\":") + value;
  return true;
}

OrtStatus* create_kernel(const OrtCustomOp* base, const OrtApi* api, const OrtKernelInfo* info, void** kernel) {
  const JtOp* op = as_op(base);
  std::string json = "{";
  for (const AttrSpec& a : op->spec->attrs) append_attr(api, info, a, &json);
  if (op->provider != kCpu) {
    // Inputs that are initializers keep their buffer and contents for the session's life: data
    // derived from them (transformed filters, folded BatchNorm) can then be kept, not redone.
    std::string constant;
    for (int i = 0; i < op->spec->n_inputs; ++i) {
      int is_constant = 0;
      const OrtValue* value = nullptr;
      OrtStatus* st = ort::fn<OrtStatus* (*)(const OrtKernelInfo*, size_t, int*, const OrtValue**)>(
          api, ort::KernelInfoGetConstantInput_tensor)(info, static_cast<size_t>(i), &is_constant, &value);
      if (st) {
        ort::release_status(api, st);
        continue;
      }
      if (is_constant) constant += (constant.empty() ? "" : ",") + std::to_string(i);
    }
    json += (json.size() > 1 ? "," : "") + ("\"__constant_inputs\":[" + constant + "]");
  }
  json += "}";
  CreateFn create = g_create;
  if (!create) return fail(api, "the jitops Python runtime is not active in this process");
  std::vector<char> err(kErrLen, '\0');
  int64_t id = -1;
  if (create(op->spec->name.c_str(), op->provider, op->elem_type, json.c_str(), &id, err.data(), kErrLen) != 0)
    return fail(api, err.data());
  auto* made = new JtKernel();
  made->api = api;
  made->op = op;
  made->id = id;
  *kernel = made;
  return nullptr;
}

OrtStatus* compute(void* kernel_ptr, OrtKernelContext* ctx) {
  auto* k = static_cast<JtKernel*>(kernel_ptr);
  const OrtApi* api = k->api;
  const TypeSpec& spec = *k->op->spec;
  size_t n_present = 0;
  if (OrtStatus* st = ort::fn<OrtStatus* (*)(const OrtKernelContext*, size_t*)>(
          api, ort::KernelContext_GetInputCount)(ctx, &n_present))
    return st;
  std::vector<JtTensor> inputs(static_cast<size_t>(spec.n_inputs));
  for (size_t i = 0; i < inputs.size(); ++i) {
    JtTensor& t = inputs[i];
    t.data = nullptr;
    t.ndim = -1;
    t.elem_type = 0;
    const OrtValue* value = nullptr;
    if (i < n_present) {
      if (OrtStatus* st = ort::fn<OrtStatus* (*)(const OrtKernelContext*, size_t, const OrtValue**)>(
              api, ort::KernelContext_GetInput)(ctx, i, &value))
        return st;
    }
    if (!value) continue;
    OrtTensorTypeAndShapeInfo* info = nullptr;
    if (OrtStatus* st = ort::fn<OrtStatus* (*)(const OrtValue*, OrtTensorTypeAndShapeInfo**)>(
            api, ort::GetTensorTypeAndShape)(value, &info))
      return st;
    size_t rank = 0;
    OrtStatus* st = ort::fn<OrtStatus* (*)(const OrtTensorTypeAndShapeInfo*, int*)>(
        api, ort::GetTensorElementType)(info, &t.elem_type);
    if (!st) st = ort::fn<OrtStatus* (*)(const OrtTensorTypeAndShapeInfo*, size_t*)>(
        api, ort::GetDimensionsCount)(info, &rank);
    if (!st && rank > static_cast<size_t>(kMaxRank)) {
      ort::fn<void (*)(OrtTensorTypeAndShapeInfo*)>(api, ort::ReleaseTensorTypeAndShapeInfo)(info);
      return fail(api, spec.name + ": input of rank " + std::to_string(rank) + " (at most 8 supported)");
    }
    if (!st) st = ort::fn<OrtStatus* (*)(const OrtTensorTypeAndShapeInfo*, int64_t*, size_t)>(
        api, ort::GetDimensions)(info, t.dims, rank);
    ort::fn<void (*)(OrtTensorTypeAndShapeInfo*)>(api, ort::ReleaseTensorTypeAndShapeInfo)(info);
    if (st) return st;
    t.ndim = static_cast<int32_t>(rank);
    if (OrtStatus* s2 = ort::fn<OrtStatus* (*)(OrtValue*, void**)>(api, ort::GetTensorMutableData)(
            const_cast<OrtValue*>(value), &t.data))
      return s2;
  }
  void* stream = nullptr;
  if (k->op->provider != kCpu) {
    if (OrtStatus* st = ort::fn<OrtStatus* (*)(const OrtKernelContext*, void**)>(
            api, ort::KernelContext_GetGPUComputeStream)(ctx, &stream))
      return st;
  }
  if (k->op->provider != kCpu) {
    std::lock_guard<std::mutex> lock(k->mutex);
    Replay* r = k->replay;
    if (r && r->stream == stream && r->generation == g_generation.load() &&
        same_inputs(r, inputs.data(), inputs.size())) {
      std::vector<void*> outs(r->outputs.size(), nullptr);
      JtCall call{api, ctx, std::string(), k, inputs.data(), spec.n_inputs, stream};
      bool allocated = true;
      for (size_t i = 0; allocated && i < outs.size(); ++i) {
        outs[i] = jitops_ort_output(&call, static_cast<int>(i), r->outputs[i].data(),
                                    static_cast<int>(r->outputs[i].size()));
        allocated = outs[i] != nullptr;
      }
      if (!allocated) return fail(api, spec.name + ": " + call.error);
      if (run_replay(r, stream, outs.data()) == 0) return nullptr;
      // a failed launch: the Python path launches again and reports (or retries) it
    }
  }
  ComputeFn run = g_compute;
  if (!run) return fail(api, "the jitops Python runtime is not active in this process (interpreter exiting?)");
  JtCall call{api, ctx, std::string(), k, inputs.data(), spec.n_inputs, stream};
  std::vector<char> err(kErrLen, '\0');
  if (run(k->id, &call, spec.n_inputs, inputs.data(), stream, err.data(), kErrLen) != 0)
    return fail(api, err[0] ? std::string(err.data()) : call.error);
  return nullptr;
}

void destroy_kernel(void* kernel_ptr) {
  auto* k = static_cast<JtKernel*>(kernel_ptr);
  DestroyFn destroy = g_destroy;
  if (destroy && k) destroy(k->id);
  if (k) delete k->replay;
  delete k;
}

// Legacy entry points a version-16 op never has called (CreateKernelV2 / KernelComputeV2 are used);
// present so that no field a runtime might read is null.
void* create_kernel_v1(const OrtCustomOp*, const OrtApi*, const OrtKernelInfo*) { return nullptr; }
void compute_v1(void*, OrtKernelContext*) {}

JtOp* make_op(const TypeSpec* spec, int elem_type, int provider) {
  auto* op = new JtOp();
  std::memset(&op->base, 0, sizeof op->base);
  OrtCustomOp& b = op->base;
  b.version = ort::kCustomOpVersion;
  b.CreateKernel = create_kernel_v1;
  b.GetName = op_name;
  b.GetExecutionProviderType = op_provider;
  b.GetInputType = op_input_type;
  b.GetInputTypeCount = op_input_count;
  b.GetOutputType = op_output_type;
  b.GetOutputTypeCount = op_output_count;
  b.KernelCompute = compute_v1;
  b.KernelDestroy = destroy_kernel;
  b.GetInputCharacteristic = op_input_characteristic;
  b.GetOutputCharacteristic = op_output_characteristic;
  b.GetInputMemoryType = op_input_memory_type;
  b.GetVariadicInputMinArity = op_variadic_min_arity;
  b.GetVariadicInputHomogeneity = op_variadic_homogeneity;
  b.GetVariadicOutputMinArity = op_variadic_min_arity;
  b.GetVariadicOutputHomogeneity = op_variadic_homogeneity;
  b.CreateKernelV2 = create_kernel;
  b.KernelComputeV2 = compute;
  op->spec = spec;
  op->elem_type = elem_type;
  op->provider = provider;
  return op;
}

// "Name;n_inputs;optional_mask;n_outputs;attr:kind,attr:kind" per line.
bool parse_spec(const char* text, std::vector<TypeSpec>* out, std::string* err) {
  std::string all(text), line;
  size_t pos = 0;
  while (pos <= all.size()) {
    size_t nl = all.find('\n', pos);
    line = all.substr(pos, nl == std::string::npos ? std::string::npos : nl - pos);
    pos = nl == std::string::npos ? all.size() + 1 : nl + 1;
    if (line.empty()) continue;
    std::vector<std::string> f;
    size_t s = 0;
    for (size_t e; (e = line.find(';', s)) != std::string::npos; s = e + 1) f.push_back(line.substr(s, e - s));
    f.push_back(line.substr(s));
    if (f.size() != 5) { *err = "bad op spec line: " + line; return false; }
    TypeSpec t;
    t.name = f[0];
    t.n_inputs = std::atoi(f[1].c_str());
    t.optional_mask = static_cast<uint32_t>(std::strtoul(f[2].c_str(), nullptr, 10));
    t.n_outputs = std::atoi(f[3].c_str());
    size_t a = 0;
    while (a < f[4].size()) {
      size_t e = f[4].find(',', a);
      std::string item = f[4].substr(a, e == std::string::npos ? std::string::npos : e - a);
      a = e == std::string::npos ? f[4].size() : e + 1;
      size_t colon = item.find(':');
      if (colon == std::string::npos || colon + 2 != item.size()) { *err = "bad attribute spec: " + item; return false; }
      t.attrs.push_back({item.substr(0, colon), item[colon + 1]});
    }
    out->push_back(t);
  }
  return !out->empty();
}

}  // namespace

// Called by jitops (ctypes) before any session registers the library. Later calls with the same
// spec only swap the callbacks (a re-imported jitops); returns 0, or 1 with a message in err.
JT_EXPORT int jitops_ort_configure(const char* spec, const char* domain, CreateFn create, ComputeFn compute_fn,
                                   DestroyFn destroy, char* err, size_t errlen) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!g_types) {
    auto* types = new std::vector<TypeSpec>();
    std::string why;
    if (!parse_spec(spec, types, &why)) {
      std::snprintf(err, errlen, "%s", why.empty() ? "no op types" : why.c_str());
      delete types;
      return 1;
    }
    types->shrink_to_fit();
    g_types = types;
    g_domain_name = domain;
    g_ops = new std::vector<JtOp*>();
    for (const TypeSpec& t : *g_types)
      for (int elem : {ort::kFloat, ort::kFloat16, ort::kBFloat16})
        for (int provider : {kCpu, kCuda, kRocm}) g_ops->push_back(make_op(&t, elem, provider));
  }
  g_create = create;
  g_compute = compute_fn;
  g_destroy = destroy;
  return 0;
}

// Python's side of a Compute: allocate output `index` with `dims`; returns its data pointer or null
// (the ORT message is kept for the error the kernel returns).
JT_EXPORT void* jitops_ort_output(void* call_ptr, int index, const int64_t* dims, int ndim) {
  auto* call = static_cast<JtCall*>(call_ptr);
  OrtValue* value = nullptr;
  OrtStatus* st = ort::fn<OrtStatus* (*)(OrtKernelContext*, size_t, const int64_t*, size_t, OrtValue**)>(
      call->api, ort::KernelContext_GetOutput)(call->ctx, static_cast<size_t>(index), dims,
                                               static_cast<size_t>(ndim), &value);
  void* data = nullptr;
  if (!st) st = ort::fn<OrtStatus* (*)(OrtValue*, void**)>(call->api, ort::GetTensorMutableData)(value, &data);
  if (st) {
    call->error = std::string("allocating output: ") + ort::error_message(call->api, st);
    ort::release_status(call->api, st);
    return nullptr;
  }
  return data;
}

// A replay parsed from jitops' blob (format: struct Replay), or null when the blob is malformed.
JT_EXPORT void* jitops_ort_replay_new(const uint8_t* blob, size_t len) { return parse_replay(blob, len); }

JT_EXPORT void jitops_ort_replay_free(void* replay) { delete static_cast<Replay*>(replay); }

// Runs a replay with these output pointers (tests: the probe backend's entry records the launches).
JT_EXPORT int jitops_ort_replay_run(void* replay, void* stream, void* const* outputs) {
  return run_replay(static_cast<Replay*>(replay), stream, outputs);
}

// During a Compute (Python's side): the node keeps `replay` (owned from here on) for later calls
// with this call's input array and stream; returns 0, or 1 when the replay does not fit the node.
JT_EXPORT int jitops_ort_keep_replay(void* call_ptr, void* replay_ptr) {
  auto* call = static_cast<JtCall*>(call_ptr);
  auto* r = static_cast<Replay*>(replay_ptr);
  if (!call->kernel || !r || static_cast<int>(r->outputs.size()) != call->kernel->op->spec->n_outputs) {
    delete r;
    return 1;
  }
  r->inputs.assign(call->inputs, call->inputs + call->n_inputs);
  r->stream = call->stream;
  r->generation = g_generation.load();
  std::lock_guard<std::mutex> lock(call->kernel->mutex);
  delete call->kernel->replay;
  call->kernel->replay = r;
  return 0;
}

// Memory a replay may name was freed or refilled (jitops' fastlaunch.memory_released: plans dropped,
// derived data evicted or recomputed, a stream's scratch released): no replay made before this runs again.
JT_EXPORT void jitops_ort_invalidate() { g_generation.fetch_add(1); }

// At interpreter exit: sessions released later must not call into a finalized Python.
JT_EXPORT void jitops_ort_shutdown() {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_create = nullptr;
  g_compute = nullptr;
  g_destroy = nullptr;
}

JT_EXPORT OrtStatus* RegisterCustomOps(OrtSessionOptions* options, const OrtApiBase* base) {
  const OrtApi* api = base->GetApi(ort::kApiVersion);
  if (!api) {
    const OrtApi* any = base->GetApi(1);
    return any ? ort::create_status(any, ort::kFail, "jitops custom ops need ONNX Runtime >= 1.16 (C API 16)")
               : nullptr;
  }
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!g_ops)
    return fail(api, "this library is loaded by jitops.onnx.session() (or jitops.onnx.register(options)), "
                     "which first connects it to the jitops Python runtime");
  if (!g_domain) {
    OrtCustomOpDomain* domain = nullptr;
    if (OrtStatus* st = ort::fn<OrtStatus* (*)(const char*, OrtCustomOpDomain**)>(api, ort::CreateCustomOpDomain)(
            g_domain_name.c_str(), &domain))
      return st;
    for (JtOp* op : *g_ops) {
      if (OrtStatus* st = ort::fn<OrtStatus* (*)(OrtCustomOpDomain*, const OrtCustomOp*)>(
              api, ort::CustomOpDomain_Add)(domain, &op->base))
        return st;
    }
    g_domain = domain;  // shared by every session; lives as long as the process
  }
  return ort::fn<OrtStatus* (*)(OrtSessionOptions*, OrtCustomOpDomain*)>(api, ort::AddCustomOpDomain)(options,
                                                                                                     g_domain);
}
