// jitops CPU emulator: the prelude that lets rendered HIP kernels compile with a host C++ compiler.
//
// Each GPU thread of a block runs as a fiber on one host thread; __syncthreads() and warp
// operations are real barriers (the runtime library, jitops_emu_runtime.cpp, switches fibers).
// Blocks are spread over host worker threads. The kernel library links against the runtime
// library, which the Python backend loads first with RTLD_GLOBAL.
#pragma once
#include <math.h>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <cstdio>
#include <type_traits>
#include <utility>

#ifndef JT_WARP_SIZE
#error "JT_WARP_SIZE must be defined by the jitops prelude"
#endif

struct jt_dim3 { unsigned int x, y, z; };

namespace jt_emu {
struct Tls {
  jt_dim3 thread_idx;
  jt_dim3 block_idx;
  jt_dim3 block_dim;
  jt_dim3 grid_dim;
  unsigned char* dynamic_smem;
};
}  // namespace jt_emu

extern "C" {
jt_emu::Tls* jt_emu_tls();
void jt_emu_syncthreads();
void jt_emu_syncwarp();
// Every lane publishes `nbytes` of `in`; after the warp barrier reads lane `src`'s value into out.
void jt_emu_warp_exchange(const void* in, void* out, int src_lane, int nbytes);
void* jt_emu_block_shared(const char* name, int line, unsigned long nbytes, int itemsize);
void jt_emu_trap(const char* what);
}
#define __trap() jt_emu_trap("__trap() called")

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __launch_bounds__(...)
#define __restrict__ __restrict
#define __shared__ static thread_local

#define threadIdx (jt_emu_tls()->thread_idx)
#define blockIdx (jt_emu_tls()->block_idx)
#define blockDim (jt_emu_tls()->block_dim)
#define gridDim (jt_emu_tls()->grid_dim)
#define warpSize JT_WARP_SIZE

#define JT_KERNEL extern "C"
#define JT_DEVICE inline __attribute__((always_inline))
#define JT_LAUNCH_BOUNDS(threads)
#define JT_RESTRICT __restrict
// Static shared arrays live in a per-block arena, so checked mode can guard each one.
#define JT_SHARED(T, name, dims)                 \
  typedef T jt_shared_type_##name dims;          \
  jt_shared_type_##name& name =                  \
      *reinterpret_cast<jt_shared_type_##name*>(jt_emu_block_shared(#name, __LINE__, sizeof(jt_shared_type_##name), (int)sizeof(T)))

template <typename T> static inline T* jt_dynamic_shared() { return reinterpret_cast<T*>(jt_emu_tls()->dynamic_smem); }

typedef long long jt_int64;
typedef unsigned long long jt_uint64;
typedef _Float16 jt_half;

static inline void __syncthreads() { jt_emu_syncthreads(); }
static inline void __syncwarp(unsigned = 0xffffffffu) { jt_emu_syncwarp(); }
static inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
static inline void __threadfence_block() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
static inline void jt_syncwarp() { jt_emu_syncwarp(); }

static inline unsigned jt_emu_lane() {
  const jt_emu::Tls* t = jt_emu_tls();
  unsigned linear = t->thread_idx.x + t->block_dim.x * (t->thread_idx.y + t->block_dim.y * t->thread_idx.z);
  return linear % JT_WARP_SIZE;
}

template <typename T> static inline T jt_emu_shfl_from(T v, int src) {
  T out;
  jt_emu_warp_exchange(&v, &out, src, (int)sizeof(T));
  return out;
}
// CUDA/HIP semantics: lanes are grouped in segments of `width`; out-of-segment sources keep v.
template <typename T> static inline T jt_shfl_down(T v, int delta, int width = JT_WARP_SIZE) {
  int lane = (int)jt_emu_lane();
  int seg = lane % width;
  int src = (seg + delta < width) ? lane + delta : lane;
  return jt_emu_shfl_from(v, src);
}
template <typename T> static inline T jt_shfl_xor(T v, int mask, int width = JT_WARP_SIZE) {
  int lane = (int)jt_emu_lane();
  int base = lane - lane % width;
  int src = base + ((lane % width) ^ mask);
  if (src >= base + width) src = lane;
  return jt_emu_shfl_from(v, src);
}
template <typename T> static inline T jt_shfl(T v, int src_lane, int width = JT_WARP_SIZE) {
  int lane = (int)jt_emu_lane();
  int base = lane - lane % width;
  return jt_emu_shfl_from(v, base + (((src_lane % width) + width) % width));
}

// Votes: every lane publishes its predicate through the warp exchange, then reads all of them.
static inline jt_uint64 jt_ballot(bool p) {
  const int lane = (int)jt_emu_lane();
  const int base = 0;
  jt_uint64 mask = 0;
  int mine = p ? 1 : 0;
  for (int l = 0; l < JT_WARP_SIZE; ++l) {
    int v = jt_emu_shfl_from(mine, base + l);
    if (v) mask |= (jt_uint64)1 << l;
  }
  (void)lane;
  return mask;
}
static inline bool jt_any(bool p) { return jt_ballot(p) != 0; }
static inline bool jt_all(bool p) {
  const jt_emu::Tls* t = jt_emu_tls();
  unsigned nthreads = t->block_dim.x * t->block_dim.y * t->block_dim.z;
  unsigned linear = t->thread_idx.x + t->block_dim.x * (t->thread_idx.y + t->block_dim.y * t->thread_idx.z);
  unsigned first = linear - linear % JT_WARP_SIZE;
  unsigned lanes = nthreads - first < (unsigned)JT_WARP_SIZE ? nthreads - first : (unsigned)JT_WARP_SIZE;
  jt_uint64 want = lanes == 64 ? ~(jt_uint64)0 : (((jt_uint64)1 << lanes) - 1);
  return jt_ballot(p) == want;
}

static inline float jt_inf() { return __builtin_inff(); }
static inline float jt_to_f32(jt_half h) { return (float)h; }
static inline jt_half jt_f32_to_half(float f) { return (jt_half)f; }
// bfloat16: the high 16 bits of a float, rounded to nearest even (NaN stays NaN).
struct alignas(2) jt_bf16 { unsigned short bits; };
static inline float jt_to_f32(jt_bf16 h) { unsigned u = (unsigned)h.bits << 16; float f; __builtin_memcpy(&f, &u, 4); return f; }
static inline jt_bf16 jt_f32_to_bf16(float f) {
  unsigned u; __builtin_memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return jt_bf16{(unsigned short)((u >> 16) | 0x40u)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return jt_bf16{(unsigned short)(u >> 16)};
}
static inline float jt_exp(float x) { return std::exp(x); }
static inline float jt_rsqrt(float x) { return 1.0f / std::sqrt(x); }
static inline float jt_fdiv(float a, float b) { return a / b; }

// CUDA math spellings used by templates.
// __expf and __logf come from glibc's <math.h> with the same meaning.
static inline float __fdividef(float a, float b) { return a / b; }
static inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
static inline float __saturatef(float x) { return x < 0.f ? 0.f : (x > 1.f ? 1.f : x); }
static inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
static inline int __float_as_int(float f) { int i; std::memcpy(&i, &f, 4); return i; }
template <typename T> static inline T __ldg(const T* p) { return *p; }
static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }
static inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
static inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
static inline long long min(long long a, long long b) { return a < b ? a : b; }
static inline long long max(long long a, long long b) { return a > b ? a : b; }
static inline float min(float a, float b) { return std::fmin(a, b); }
static inline float max(float a, float b) { return std::fmax(a, b); }

// Atomics: blocks run on several host threads, so these are real atomics.
static inline float atomicAdd(float* p, float v) {
  float old, sum;
  __atomic_load(p, &old, __ATOMIC_RELAXED);
  do { sum = old + v; } while (!__atomic_compare_exchange(p, &old, &sum, true, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED));
  return old;
}
static inline double atomicAdd(double* p, double v) {
  double old, sum;
  __atomic_load(p, &old, __ATOMIC_RELAXED);
  do { sum = old + v; } while (!__atomic_compare_exchange(p, &old, &sum, true, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED));
  return old;
}
static inline int atomicAdd(int* p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
static inline unsigned atomicAdd(unsigned* p, unsigned v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
static inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
static inline int atomicMax(int* p, int v) {
  int old = __atomic_load_n(p, __ATOMIC_RELAXED);
  while (old < v && !__atomic_compare_exchange_n(p, &old, v, true, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED)) {}
  return old;
}
static inline int atomicMin(int* p, int v) {
  int old = __atomic_load_n(p, __ATOMIC_RELAXED);
  while (old > v && !__atomic_compare_exchange_n(p, &old, v, true, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED)) {}
  return old;
}
static inline int atomicExch(int* p, int v) { return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST); }
static inline unsigned atomicExch(unsigned* p, unsigned v) { return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST); }
static inline int atomicCAS(int* p, int cmp, int v) { __atomic_compare_exchange_n(p, &cmp, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST); return cmp; }
static inline unsigned atomicCAS(unsigned* p, unsigned cmp, unsigned v) { __atomic_compare_exchange_n(p, &cmp, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST); return cmp; }
// CUDA's atomicInc: old >= limit ? 0 : old + 1.
static inline unsigned atomicInc(unsigned* p, unsigned limit) {
  unsigned old = __atomic_load_n(p, __ATOMIC_RELAXED);
  while (!__atomic_compare_exchange_n(p, &old, old >= limit ? 0u : old + 1u, true, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED)) {}
  return old;
}

// Vector types with the GPU's alignment.
struct alignas(8) float2 { float x, y; };
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(8) int2 { int x, y; };
struct alignas(16) int4 { int x, y, z, w; };
struct alignas(8) uint2 { unsigned x, y; };
struct alignas(16) uint4 { unsigned x, y, z, w; };
static inline float2 make_float2(float x, float y) { return float2{x, y}; }
static inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }

namespace jt_emu {
template <typename... A, unsigned long... I>
static inline void invoke_impl(void (*f)(A...), void** args, std::integer_sequence<unsigned long, I...>) {
  f(*reinterpret_cast<typename std::remove_reference<A>::type*>(args[I])...);
}
template <typename... A> static inline void invoke(void (*f)(A...), void** args) {
  invoke_impl(f, args, std::make_integer_sequence<unsigned long, sizeof...(A)>());
}
}  // namespace jt_emu
