// The part of ONNX Runtime's C ABI that jitops uses, declared here from the documented ABI.
//
// ONNX Runtime's C API is append-only: OrtApi is a table of function pointers whose positions
// never change, and OrtCustomOp only grows at its end, gated by its `version` field. So we name
// the positions we call and the custom-op layout of the version we declare, and nothing else.
// We ask for API version 16 and declare custom ops of version 16: every runtime from 1.16 on
// serves that table and reads that layout (KernelComputeV2, which returns a status, is version 16).
#pragma once
#include <cstddef>
#include <cstdint>

extern "C" {

struct OrtStatus;
struct OrtApi;  // opaque: used only as a table of function pointers (see OrtFn below)
struct OrtKernelInfo;
struct OrtKernelContext;
struct OrtValue;
struct OrtTensorTypeAndShapeInfo;
struct OrtSessionOptions;
struct OrtCustomOpDomain;

struct OrtApiBase {
  const OrtApi* (*GetApi)(uint32_t version);
  const char* (*GetVersionString)(void);
};

// OrtCustomOp as of version 16. Fields of later versions follow in newer runtimes; a runtime
// reads them only from ops that declare a higher version, so they stay zero here.
struct OrtCustomOp {
  uint32_t version;
  void* (*CreateKernel)(const OrtCustomOp* op, const OrtApi* api, const OrtKernelInfo* info);
  const char* (*GetName)(const OrtCustomOp* op);
  const char* (*GetExecutionProviderType)(const OrtCustomOp* op);
  int (*GetInputType)(const OrtCustomOp* op, size_t index);       // ONNXTensorElementDataType
  size_t (*GetInputTypeCount)(const OrtCustomOp* op);
  int (*GetOutputType)(const OrtCustomOp* op, size_t index);
  size_t (*GetOutputTypeCount)(const OrtCustomOp* op);
  void (*KernelCompute)(void* kernel, OrtKernelContext* context);
  void (*KernelDestroy)(void* kernel);
  int (*GetInputCharacteristic)(const OrtCustomOp* op, size_t index);   // 0 required, 1 optional
  int (*GetOutputCharacteristic)(const OrtCustomOp* op, size_t index);
  int (*GetInputMemoryType)(const OrtCustomOp* op, size_t index);       // OrtMemType, 0 = default
  int (*GetVariadicInputMinArity)(const OrtCustomOp* op);
  int (*GetVariadicInputHomogeneity)(const OrtCustomOp* op);
  int (*GetVariadicOutputMinArity)(const OrtCustomOp* op);
  int (*GetVariadicOutputHomogeneity)(const OrtCustomOp* op);
  OrtStatus* (*CreateKernelV2)(const OrtCustomOp* op, const OrtApi* api, const OrtKernelInfo* info,
                               void** kernel);
  OrtStatus* (*KernelComputeV2)(void* kernel, OrtKernelContext* context);
  void* later_versions[8];  // InferOutputShapeFn, GetStartVersion, ... (version >= 17): unused
};

}  // extern "C"

namespace ort {

constexpr uint32_t kApiVersion = 16;
constexpr uint32_t kCustomOpVersion = 16;

// Element types (TensorProto.DataType numbering).
constexpr int kFloat = 1;
constexpr int kFloat16 = 10;
constexpr int kBFloat16 = 16;

// OrtErrorCode values.
constexpr int kFail = 1;
constexpr int kInvalidArgument = 2;

// Positions in the OrtApi function table.
enum Position : size_t {
  CreateStatus = 0,
  GetErrorMessage = 2,
  CreateCustomOpDomain = 26,
  CustomOpDomain_Add = 27,
  AddCustomOpDomain = 28,
  GetTensorMutableData = 51,
  GetTensorElementType = 60,
  GetDimensionsCount = 61,
  GetDimensions = 62,
  GetTensorTypeAndShape = 65,
  KernelInfoGetAttribute_float = 85,
  KernelInfoGetAttribute_int64 = 86,
  KernelInfoGetAttribute_string = 87,
  KernelContext_GetInputCount = 88,
  KernelContext_GetOutputCount = 89,
  KernelContext_GetInput = 90,
  KernelContext_GetOutput = 91,
  ReleaseStatus = 93,
  ReleaseTensorTypeAndShapeInfo = 99,
  KernelInfoGetAttributeArray_float = 162,
  KernelInfoGetAttributeArray_int64 = 163,
  KernelContext_GetGPUComputeStream = 193,
  KernelInfoGetConstantInput_tensor = 249,   // in the table since ORT 1.16 (API 16)
};

// The function at `pos`, typed by the caller.
template <typename Fn>
inline Fn fn(const OrtApi* api, Position pos) {
  return reinterpret_cast<Fn>(reinterpret_cast<void* const*>(api)[pos]);
}

// Typed calls for the positions above.
using StatusPtr = OrtStatus*;
inline StatusPtr create_status(const OrtApi* a, int code, const char* msg) {
  return fn<StatusPtr (*)(int, const char*)>(a, CreateStatus)(code, msg);
}
inline const char* error_message(const OrtApi* a, const OrtStatus* s) {
  return fn<const char* (*)(const OrtStatus*)>(a, GetErrorMessage)(s);
}
inline void release_status(const OrtApi* a, OrtStatus* s) {
  if (s) fn<void (*)(OrtStatus*)>(a, ReleaseStatus)(s);
}

}  // namespace ort
