// jitops CPU emulator runtime: runs a kernel's grid on host threads, one fiber per GPU thread.
//
// - Blocks are handed to worker threads through an atomic counter.
// - Inside a block every GPU thread is a fiber; __syncthreads() and warp operations park the
//   fiber until every thread of the block (or lane of the warp) has arrived. When that can never
//   happen (some threads exited, or threads wait at different kinds of barrier) the launch fails
//   with a deadlock report instead of hanging.
// - Checked mode copies every buffer argument into memory whose end touches a PROT_NONE guard
//   region, and does the same for shared memory, so an out-of-bounds access faults; the fault
//   handler reports kernel, block, thread and offset, and the launch is abandoned.
// - Kernels built with the alignment check (CpuBackend(check_alignment=True)) trap on a typed
//   access whose address is not a multiple of its type's alignment (a 16-byte vector at a 4-byte
//   boundary), where x86 would silently go on and a GPU faults; the trap is reported the same way.
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#define JT_WARP_SIZE 64  // the header needs a value; the runtime reads the real one from the launch
#include "jitops_emu.h"


namespace {

constexpr int kMaxLanes = 64;
constexpr int kSlotBytes = 16;
constexpr size_t kGuardBytes = 64 * 1024;  // PROT_NONE before and after every guarded region

enum FiberState { kNew, kRunnable, kWaitBlock, kWaitWarp, kDone };

struct Fiber {
  void* sp = nullptr;
  unsigned char* stack = nullptr;
  int state = kNew;
  jt_dim3 idx{0, 0, 0};
  unsigned linear = 0;
  unsigned warp_ops = 0;
  unsigned block_syncs = 0;
#if !defined(__x86_64__)
  ucontext_t uc;
#endif
};

struct Region {  // one guarded copy of a buffer (or of overlapping buffers)
  unsigned char* map = nullptr;
  size_t map_bytes = 0;
  unsigned char* data = nullptr;  // guarded copy
  unsigned char* orig = nullptr;  // caller's memory
  size_t bytes = 0;
  std::string names;
  int itemsize = 1;
  bool shared = false;
};

struct LaunchCfg {
  unsigned grid[3];
  unsigned block[3];
  unsigned long long dynamic_smem;
  int warp_size;
  int workers;
  int checked;
  int stack_kb;
  const char* kernel;
  int nargs;
  void** args;
  const long long* buf_bytes;   // -1: scalar argument
  const int* buf_itemsize;
  const char* const* arg_names;
};

struct Launch;

struct Worker {
  Launch* launch = nullptr;
  jt_emu::Tls tls{};
  std::vector<Fiber> fibers;
  std::vector<unsigned char*> free_stacks;
  std::vector<unsigned char*> all_stacks;
  size_t stack_bytes = 0;
  Fiber* cur = nullptr;
  void* sched_sp = nullptr;
#if !defined(__x86_64__)
  ucontext_t sched_uc;
#endif
  std::vector<unsigned char> slots;  // [warp][parity][lane][16 bytes]
  struct SharedArray { const char* name; int line; size_t bytes; unsigned char* ptr; Region* region; };
  std::vector<SharedArray> shared;
  unsigned char* dyn = nullptr;
  Region* dyn_region = nullptr;
  sigjmp_buf abort_env;
  bool in_block = false;
  unsigned char* altstack = nullptr;
};

struct Launch {
  const LaunchCfg* cfg = nullptr;
  void (*thunk)(void**) = nullptr;
  void** args = nullptr;
  std::atomic<long long> next_block{0};
  long long nblocks = 0;
  unsigned nthreads = 0;
  std::atomic<bool> failed{false};
  std::mutex err_mu;
  std::string error;
  std::vector<Region*> regions;  // guarded buffers and shared arrays (checked mode)
  std::mutex regions_mu;
};

thread_local Worker* tls_worker = nullptr;

void fail(Launch* L, const char* fmt, ...) {
  char buf[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  std::lock_guard<std::mutex> g(L->err_mu);
  if (!L->failed.exchange(true)) L->error = buf;
}

// ---------------------------------------------------------------- fibers
#if defined(__x86_64__)
extern "C" void jt_emu_switch(void** save_sp, void* to_sp);
extern "C" void jt_emu_fiber_start();
asm(R"(
.text
.p2align 4
.hidden jt_emu_switch
.globl jt_emu_switch
.type jt_emu_switch,@function
jt_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
.size jt_emu_switch,.-jt_emu_switch
.p2align 4
.hidden jt_emu_fiber_start
.globl jt_emu_fiber_start
.type jt_emu_fiber_start,@function
jt_emu_fiber_start:
  call jt_emu_fiber_main
  ud2
.size jt_emu_fiber_start,.-jt_emu_fiber_start
)");
#endif

unsigned char* alloc_stack(Worker* w) {
  if (!w->free_stacks.empty()) {
    unsigned char* s = w->free_stacks.back();
    w->free_stacks.pop_back();
    return s;
  }
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  size_t total = w->stack_bytes + page;
  void* m = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return nullptr;
  mprotect(m, page, PROT_NONE);  // overflow guard at the low end
  w->all_stacks.push_back((unsigned char*)m);
  return (unsigned char*)m;
}

void release_stack(Worker* w, Fiber* f) {
  if (f->stack) {
    w->free_stacks.push_back(f->stack);
    f->stack = nullptr;
  }
}

}  // namespace

extern "C" __attribute__((visibility("hidden"))) void jt_emu_fiber_main() {
  Worker* w = tls_worker;
  w->launch->thunk(w->launch->args);
  w->cur->state = kDone;
#if defined(__x86_64__)
  jt_emu_switch(&w->cur->sp, w->sched_sp);
#else
  swapcontext(&w->cur->uc, &w->sched_uc);
#endif
  __builtin_trap();  // a finished fiber is never resumed
}

namespace {

void set_current(Worker* w, Fiber* f) {
  w->cur = f;
  w->tls.thread_idx = f->idx;
}

// Run fiber f until it parks at a barrier or finishes.
bool resume(Worker* w, Fiber* f) {
  set_current(w, f);
  if (f->state == kNew) {
    f->stack = alloc_stack(w);
    if (!f->stack) {
      fail(w->launch, "%s: out of memory for fiber stacks", w->launch->cfg->kernel);
      return false;
    }
    unsigned char* top = f->stack + (size_t)sysconf(_SC_PAGESIZE) + w->stack_bytes;
#if defined(__x86_64__)
    uintptr_t sp = ((uintptr_t)top - 128) & ~(uintptr_t)15;
    sp -= 64;  // mxcsr/fpucw slot, 6 callee-saved registers, return address
    uint64_t* frame = (uint64_t*)sp;
    uint32_t csr[2] = {0x1F80u, 0x037Fu};
    std::memcpy(&frame[0], csr, 8);
    for (int i = 1; i <= 6; i++) frame[i] = 0;
    frame[7] = (uint64_t)(uintptr_t)&jt_emu_fiber_start;
    f->sp = (void*)sp;
#else
    getcontext(&f->uc);
    f->uc.uc_stack.ss_sp = f->stack + (size_t)sysconf(_SC_PAGESIZE);
    f->uc.uc_stack.ss_size = w->stack_bytes;
    f->uc.uc_link = nullptr;
    makecontext(&f->uc, (void (*)())jt_emu_fiber_main, 0);
#endif
  }
  f->state = kRunnable;
#if defined(__x86_64__)
  jt_emu_switch(&w->sched_sp, f->sp);
#else
  swapcontext(&w->sched_uc, &f->uc);
#endif
  if (f->state == kDone) release_stack(w, f);
  return true;
}

void park(Worker* w, int state) {
  Fiber* f = w->cur;
  f->state = state;
#if defined(__x86_64__)
  jt_emu_switch(&f->sp, w->sched_sp);
#else
  swapcontext(&f->uc, &w->sched_uc);
#endif
  w->tls.thread_idx = f->idx;
}

std::string thread_list(Worker* w, int state, int limit = 8) {
  std::string s;
  int n = 0;
  for (auto& f : w->fibers) {
    if (f.state != state) continue;
    if (n == limit) { s += " ..."; break; }
    char b[64];
    snprintf(b, sizeof b, "%s(%u,%u,%u)", n ? " " : "", f.idx.x, f.idx.y, f.idx.z);
    s += b;
    n++;
  }
  return s;
}

// Run every fiber of the current block to completion; false on deadlock or failure.
bool run_block(Worker* w) {
  Launch* L = w->launch;
  const LaunchCfg* c = L->cfg;
  const unsigned n = L->nthreads;
  const unsigned ws = (unsigned)c->warp_size;
  const unsigned nwarps = (n + ws - 1) / ws;
  for (unsigned i = 0; i < n; i++) {
    Fiber& f = w->fibers[i];
    f.state = kNew;
    f.linear = i;
    f.idx = jt_dim3{i % c->block[0], (i / c->block[0]) % c->block[1], i / (c->block[0] * c->block[1])};
    f.warp_ops = 0;
    f.block_syncs = 0;
    f.stack = nullptr;
  }
  bool reverse = false;
  for (;;) {
    for (unsigned k = 0; k < n; k++) {
      unsigned i = reverse ? n - 1 - k : k;
      Fiber& f = w->fibers[i];
      if (f.state == kNew || f.state == kRunnable) {
        if (!resume(w, &f)) return false;
        if (L->failed.load(std::memory_order_relaxed)) return false;
      }
    }
    if (c->checked) reverse = !reverse;  // alternate the order to expose missing barriers
    unsigned done = 0, at_block = 0;
    for (auto& f : w->fibers) {
      if (f.state == kDone) done++;
      else if (f.state == kWaitBlock) at_block++;
    }
    if (done == n) return true;
    bool released = false;
    for (unsigned wp = 0; wp < nwarps; wp++) {
      unsigned lo = wp * ws, hi = std::min(n, lo + ws);
      unsigned waiting = 0, exited = 0, ops = 0;
      bool mismatch = false;
      for (unsigned i = lo; i < hi; i++) {
        Fiber& f = w->fibers[i];
        if (f.state == kWaitWarp) {
          if (waiting && f.warp_ops != ops) mismatch = true;
          ops = f.warp_ops;
          waiting++;
        } else if (f.state == kDone) {
          exited++;
        }
      }
      if (!waiting) continue;
      if (waiting == hi - lo && !mismatch) {
        for (unsigned i = lo; i < hi; i++) w->fibers[i].state = kRunnable;
        released = true;
      } else if (exited || mismatch) {
        fail(L, "%s: warp deadlock in block (%u,%u,%u) warp %u: %u lane(s) wait at a warp operation "
                "(shuffle/syncwarp) while %u lane(s) exited%s; every lane of a warp must reach it together",
             c->kernel, w->tls.block_idx.x, w->tls.block_idx.y, w->tls.block_idx.z, wp, waiting, exited,
             mismatch ? " or wait at a different warp operation" : "");
        return false;
      }
    }
    if (!released && at_block > 0) {
      if (at_block + done == n && done == 0) {
        unsigned syncs = w->fibers[0].block_syncs;
        for (auto& f : w->fibers) f.state = kRunnable, (void)syncs;
        released = true;
      } else if (at_block + done == n) {
        fail(L, "%s: __syncthreads deadlock in block (%u,%u,%u): %u thread(s) wait at the barrier "
                "[%s] but %u thread(s) exited without reaching it [%s]",
             c->kernel, w->tls.block_idx.x, w->tls.block_idx.y, w->tls.block_idx.z, at_block,
             thread_list(w, kWaitBlock).c_str(), done, thread_list(w, kDone).c_str());
        return false;
      }
    }
    if (!released) {
      fail(L, "%s: deadlock in block (%u,%u,%u): threads wait at different barriers "
              "(__syncthreads: [%s]; warp operations: [%s])",
           c->kernel, w->tls.block_idx.x, w->tls.block_idx.y, w->tls.block_idx.z,
           thread_list(w, kWaitBlock).c_str(), thread_list(w, kWaitWarp).c_str());
      return false;
    }
  }
}

// ---------------------------------------------------------------- checked-mode memory
size_t page_size() { return (size_t)sysconf(_SC_PAGESIZE); }

// A copy of `bytes` whose last byte sits just below a guard region; the start keeps the
// caller's alignment modulo 16 (vector loads depend on it), so when the size is not a multiple
// of 16 up to 15 bytes of slack after the end are filled with a canary and checked after the launch.
Region* make_region(unsigned char* orig, size_t bytes, bool shared) {
  size_t pg = page_size();
  size_t body = (bytes + 64 + pg - 1) / pg * pg;
  size_t total = kGuardBytes + body + kGuardBytes;
  void* m = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return nullptr;
  unsigned char* base = (unsigned char*)m;
  mprotect(base, kGuardBytes, PROT_NONE);
  mprotect(base + kGuardBytes + body, kGuardBytes, PROT_NONE);
  unsigned char* end = base + kGuardBytes + body;
  uintptr_t start = (uintptr_t)(end - bytes);
  uintptr_t want = (uintptr_t)orig % 16;
  start -= (start - want) % 16;
  Region* r = new Region();
  r->map = base;
  r->map_bytes = total;
  r->data = (unsigned char*)start;
  r->orig = orig;
  r->bytes = bytes;
  r->shared = shared;
  std::memset(base + kGuardBytes, 0xCD, body);
  if (orig && bytes) std::memcpy(r->data, orig, bytes);
  return r;
}

bool canary_intact(const Region* r, long long* bad_offset) {
  const unsigned char* lo = r->map + kGuardBytes;
  const unsigned char* hi = r->map + r->map_bytes - kGuardBytes;
  for (const unsigned char* p = lo; p < r->data; p++)
    if (*p != 0xCD) { *bad_offset = (long long)(p - r->data); return false; }
  for (const unsigned char* p = r->data + r->bytes; p < hi; p++)
    if (*p != 0xCD) { *bad_offset = (long long)(p - r->data); return false; }
  return true;
}

void free_region(Region* r) {
  munmap(r->map, r->map_bytes);
  delete r;
}

std::mutex g_signal_mu;
struct sigaction g_old_segv, g_old_bus, g_old_ill;
int g_signal_users = 0;

const char* is_write_kind(const char* rw) {
  return rw[0] == 'w' ? "out-of-bounds write" : rw[0] == 'r' ? "out-of-bounds read" : "out-of-bounds access";
}

void on_fault(int sig, siginfo_t* info, void* uctx) {
  Worker* w = tls_worker;
  if (!w || !w->in_block) {
    // Not ours: hand over to whatever was installed before.
    struct sigaction* old = sig == SIGSEGV ? &g_old_segv : sig == SIGBUS ? &g_old_bus : &g_old_ill;
    sigaction(sig, old, nullptr);
    raise(sig);
    return;
  }
  Launch* L = w->launch;
  const LaunchCfg* c = L->cfg;
  unsigned char* a = (unsigned char*)info->si_addr;
  const char* kind = "invalid memory access";
#if defined(__x86_64__)
  const bool is_write = uctx && (((ucontext_t*)uctx)->uc_mcontext.gregs[REG_ERR] & 2);
  const char* rw = is_write ? "write" : "read";
#else
  const char* rw = "access";
#endif
  char what[1024];
  snprintf(what, sizeof what, "address %p is not inside or next to any buffer of the launch", (void*)a);
  for (Region* r : L->regions) {
    if (a >= r->map && a < r->map + r->map_bytes) {
      long long off = (long long)(a - r->data);
      long long item = r->itemsize > 0 ? r->itemsize : 1;
      kind = is_write_kind(rw);
      snprintf(what, sizeof what, "%s '%s' of %zu bytes (%lld elements of %lld bytes): byte offset %lld = element %lld",
               r->shared ? "shared array" : "buffer", r->names.c_str(), r->bytes, (long long)r->bytes / item,
               item, off, off >= 0 ? off / item : -((-off + item - 1) / item));
      break;
    }
  }
  for (auto* s : w->all_stacks) {
    if (a >= s && a < s + page_size()) {
      kind = "stack overflow";
      snprintf(what, sizeof what, "fiber stack of %zu KiB exhausted (set JITOPS_CPU_STACK_KB)", w->stack_bytes / 1024);
    }
  }
  if (sig == SIGSEGV && info->si_code == SI_KERNEL) {  // x86 #GP: no address
    kind = "general-protection fault";
    snprintf(what, sizeof what, "no address reported; the usual cause is a misaligned 16-byte vector access "
             "(an aligned SSE load or store), which a GPU faults on too");
  }
  if (sig == SIGILL) {  // the alignment check's trap (ud2): si_addr is the instruction, not the data
    kind = "misaligned access";
    snprintf(what, sizeof what, "a load or store whose address is not a multiple of its type's alignment "
             "(e.g. a 16-byte vector at a 4-byte boundary: a GPU faults there); or an illegal instruction");
  }
  jt_dim3 b = w->tls.block_idx, t = w->tls.thread_idx;
  fail(L, "%s: %s in block (%u,%u,%u) thread (%u,%u,%u): %s", c->kernel, kind, b.x, b.y, b.z, t.x, t.y, t.z, what);
  siglongjmp(w->abort_env, 1);
}

void install_handlers() {
  std::lock_guard<std::mutex> g(g_signal_mu);
  if (g_signal_users++ > 0) return;
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_fault;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGSEGV, &sa, &g_old_segv);
  sigaction(SIGBUS, &sa, &g_old_bus);
  sigaction(SIGILL, &sa, &g_old_ill);
}

void remove_handlers() {
  std::lock_guard<std::mutex> g(g_signal_mu);
  if (--g_signal_users > 0) return;
  sigaction(SIGSEGV, &g_old_segv, nullptr);
  sigaction(SIGBUS, &g_old_bus, nullptr);
  sigaction(SIGILL, &g_old_ill, nullptr);
}

// ---------------------------------------------------------------- workers
void* worker_main(void* arg) {
  Worker* w = (Worker*)arg;
  Launch* L = w->launch;
  const LaunchCfg* c = L->cfg;
  tls_worker = w;
  stack_t ss, old_ss;
  const size_t alt_bytes = 256 * 1024;
  w->altstack = (unsigned char*)malloc(alt_bytes);
  ss.ss_sp = w->altstack;
  ss.ss_size = alt_bytes;
  ss.ss_flags = 0;
  sigaltstack(&ss, &old_ss);
  w->tls.block_dim = jt_dim3{c->block[0], c->block[1], c->block[2]};
  w->tls.grid_dim = jt_dim3{c->grid[0], c->grid[1], c->grid[2]};
  w->fibers.resize(L->nthreads);
  w->slots.assign((size_t)((L->nthreads + c->warp_size - 1) / c->warp_size) * 2 * c->warp_size * kSlotBytes, 0);
  if (c->dynamic_smem) {
    if (c->checked) {
      w->dyn_region = make_region(nullptr, c->dynamic_smem, true);
      w->dyn_region->names = "dynamic shared memory";
      w->dyn_region->itemsize = 1;
      {
        std::lock_guard<std::mutex> g(L->regions_mu);
        L->regions.push_back(w->dyn_region);
      }
      w->dyn = w->dyn_region->data;
    } else {
      w->dyn = (unsigned char*)aligned_alloc(64, (c->dynamic_smem + 63) / 64 * 64);
    }
  }
  w->tls.dynamic_smem = w->dyn;
  while (!L->failed.load()) {
    long long b = L->next_block.fetch_add(1);
    if (b >= L->nblocks) break;
    w->tls.block_idx = jt_dim3{(unsigned)(b % c->grid[0]), (unsigned)((b / c->grid[0]) % c->grid[1]),
                               (unsigned)(b / ((long long)c->grid[0] * c->grid[1]))};
    if (sigsetjmp(w->abort_env, 1)) {  // a fault inside the block lands here
      w->in_block = false;
      break;
    }
    w->in_block = true;
    bool ok = run_block(w);
    w->in_block = false;
    // Stacks of fibers parked forever (deadlock) go back to the pool.
    for (auto& f : w->fibers) release_stack(w, &f);
    if (!ok) break;
  }
  for (auto& f : w->fibers) f.stack = nullptr;
  sigaltstack(&old_ss, nullptr);
  free(w->altstack);
  return nullptr;
}

void destroy_worker(Worker* w) {
  size_t pg = page_size();
  for (auto* s : w->all_stacks) munmap(s, w->stack_bytes + pg);
  for (auto& s : w->shared)
    if (!s.region) free(s.ptr);
  if (w->dyn && !w->dyn_region) free(w->dyn);
  delete w;
}

}  // namespace

// ---------------------------------------------------------------- API used by kernels
extern "C" {

jt_emu::Tls* jt_emu_tls() { return &tls_worker->tls; }

void jt_emu_syncthreads() {
  Worker* w = tls_worker;
  w->cur->block_syncs++;
  park(w, kWaitBlock);
}

void jt_emu_syncwarp() {
  Worker* w = tls_worker;
  w->cur->warp_ops++;
  park(w, kWaitWarp);
}

void jt_emu_warp_exchange(const void* in, void* out, int src_lane, int nbytes) {
  Worker* w = tls_worker;
  Fiber* f = w->cur;
  const unsigned ws = (unsigned)w->launch->cfg->warp_size;
  const unsigned n = w->launch->nthreads;
  unsigned lane = f->linear % ws, warp = f->linear / ws;
  unsigned parity = f->warp_ops & 1u;
  unsigned char* base = &w->slots[((size_t)warp * 2 + parity) * ws * kSlotBytes];
  std::memcpy(base + (size_t)lane * kSlotBytes, in, (size_t)nbytes);
  f->warp_ops++;
  park(w, kWaitWarp);
  unsigned src = (src_lane < 0 || (unsigned)src_lane >= ws || warp * ws + (unsigned)src_lane >= n) ? lane : (unsigned)src_lane;
  std::memcpy(out, base + (size_t)src * kSlotBytes, (size_t)nbytes);
}

void* jt_emu_block_shared(const char* name, int line, unsigned long nbytes, int itemsize) {
  Worker* w = tls_worker;
  for (auto& s : w->shared)
    if (s.line == line && s.name == name && s.bytes == nbytes) return s.ptr;
  Worker::SharedArray s{name, line, nbytes, nullptr, nullptr};
  if (w->launch->cfg->checked) {
    s.region = make_region(nullptr, nbytes, true);
    s.region->names = name;
    s.region->itemsize = itemsize;
    std::lock_guard<std::mutex> g(w->launch->regions_mu);
    w->launch->regions.push_back(s.region);
    s.ptr = s.region->data;
  } else {
    s.ptr = (unsigned char*)aligned_alloc(64, (nbytes + 63) / 64 * 64);
  }
  w->shared.push_back(s);
  return s.ptr;
}

void jt_emu_trap(const char* what) {
  Worker* w = tls_worker;
  jt_dim3 b = w->tls.block_idx, t = w->tls.thread_idx;
  fail(w->launch, "%s: %s in block (%u,%u,%u) thread (%u,%u,%u)", w->launch->cfg->kernel, what, b.x, b.y, b.z, t.x, t.y, t.z);
  siglongjmp(w->abort_env, 1);
}

// Returns 0 on success; otherwise writes a report into err.
int jt_emu_launch(const LaunchCfg* cfg, void (*thunk)(void**), char* err, int errlen) {
  Launch L;
  L.cfg = cfg;
  L.thunk = thunk;
  L.nblocks = (long long)cfg->grid[0] * cfg->grid[1] * cfg->grid[2];
  L.nthreads = cfg->block[0] * cfg->block[1] * cfg->block[2];
  if (cfg->warp_size < 1 || cfg->warp_size > kMaxLanes) {
    snprintf(err, (size_t)errlen, "%s: warp size %d not supported (1..%d)", cfg->kernel, cfg->warp_size, kMaxLanes);
    return 1;
  }
  if (L.nblocks == 0 || L.nthreads == 0) return 0;

  // Argument values; in checked mode buffers are redirected into guarded copies.
  std::vector<void*> values(cfg->nargs);
  std::vector<void*> argv(cfg->nargs);
  std::vector<Region*> buf_regions;
  for (int i = 0; i < cfg->nargs; i++) argv[i] = cfg->args[i];
  if (cfg->checked) {
    struct Span { unsigned char* lo; unsigned char* hi; int arg; };
    std::vector<Span> spans;
    for (int i = 0; i < cfg->nargs; i++) {
      if (cfg->buf_bytes[i] < 0) continue;
      unsigned char* p = *(unsigned char**)cfg->args[i];
      if (!p) continue;
      spans.push_back(Span{p, p + cfg->buf_bytes[i], i});
    }
    std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) { return a.lo < b.lo; });
    size_t k = 0;
    while (k < spans.size()) {  // merge overlapping buffers into one region
      size_t j = k + 1;
      unsigned char* hi = spans[k].hi;
      while (j < spans.size() && (spans[j].lo < hi || spans[j].lo == spans[k].lo)) hi = std::max(hi, spans[j].hi), j++;
      Region* r = make_region(spans[k].lo, (size_t)(hi - spans[k].lo), false);
      if (!r) {
        snprintf(err, (size_t)errlen, "%s: checked mode could not map guarded memory", cfg->kernel);
        for (auto* q : buf_regions) free_region(q);
        return 1;
      }
      r->itemsize = cfg->buf_itemsize[spans[k].arg];
      for (size_t m = k; m < j; m++) {
        int a = spans[m].arg;
        if (!r->names.empty()) r->names += "|";
        r->names += cfg->arg_names && cfg->arg_names[a] ? cfg->arg_names[a] : "?";
        values[a] = r->data + (spans[m].lo - spans[k].lo);
        argv[a] = &values[a];
      }
      buf_regions.push_back(r);
      L.regions.push_back(r);
      k = j;
    }
    install_handlers();
  } else {
    install_handlers();  // still turn a wild access into an error report instead of a crash
  }
  L.args = argv.data();

  long long nworkers = cfg->workers > 0 ? cfg->workers : 1;
  if (nworkers > L.nblocks) nworkers = L.nblocks;
  std::vector<Worker*> workers;
  std::vector<pthread_t> tids;
  size_t stack_bytes = (size_t)(cfg->stack_kb > 0 ? cfg->stack_kb : 64) * 1024;
  for (long long i = 0; i < nworkers; i++) {
    Worker* w = new Worker();
    w->launch = &L;
    w->stack_bytes = stack_bytes;
    workers.push_back(w);
  }
  for (long long i = 1; i < nworkers; i++) {
    pthread_t t;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 1 << 20);
    if (pthread_create(&t, &attr, worker_main, workers[i]) == 0) tids.push_back(t);
    pthread_attr_destroy(&attr);
  }
  Worker* prev = tls_worker;
  worker_main(workers[0]);
  tls_worker = prev;
  for (auto t : tids) pthread_join(t, nullptr);
  remove_handlers();

  if (cfg->checked) {
    for (Region* r : buf_regions) {
      long long off;
      if (!L.failed && !canary_intact(r, &off))
        fail(&L, "%s: out-of-bounds write to buffer '%s' of %zu bytes at byte offset %lld "
                 "(found after the launch; the writing thread is unknown)", cfg->kernel, r->names.c_str(), r->bytes, off);
      std::memcpy(r->orig, r->data, r->bytes);
    }
  }
  for (Worker* w : workers) destroy_worker(w);
  for (Region* r : L.regions) free_region(r);
  if (L.failed) {
    snprintf(err, (size_t)errlen, "%s", L.error.c_str());
    return 1;
  }
  return 0;
}

}  // extern "C"
