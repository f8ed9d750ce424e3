"""The thread pool every cpu-target module carries (C source, pthreads and C11 atomics; no OpenMP, so
`zig cc`, which cannot link OpenMP, builds it too).

One pool per loaded module: `dcc_init(n)` starts n - 1 workers once; `dcc_parallel(f, ctx)` runs
f(ctx, tid, n) on every thread, the caller being worker 0, and returns when all are done.
`dcc_barrier()` inside such a task is a spinning sense-counting barrier (a few hundred ns): a whole
decode step is one task with a barrier between dependent kernels. Idle workers spin for
DCC_SPIN rounds (pauses, then yields of the core: about 6 ms; enough to catch the next kernel launch
of a launch-by-launch run or the next step of a decode) and then sleep on a condition variable, so
nothing spins while Python waits for long (a chat waiting for its user); waking costs a few
microseconds. Every wait yields its core after a short spin: with more threads than free cores, a pure
spin-wait starves the thread it waits for (two decoding processes on two cores ran 350x slower).
"""

POOL_SOURCE = r"""
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#define DCC_EXPORT __attribute__((visibility("default")))
#define DCC_MAX_THREADS 256
#ifndef DCC_SPIN
#define DCC_SPIN 20000
#endif
/* Pauses a thread waiting at a barrier (or for the last worker) spins before it yields its core each time round:
   with more threads than free cores (two packages, or a test runner beside one), a waiter that only spins keeps
   the core from the very thread it waits for, for a whole time slice (two decoding processes on two cores ran
   350 times slower). A few microseconds, far longer than a barrier's wait when every thread has a core. */
#ifndef DCC_YIELD_AFTER
#define DCC_YIELD_AFTER 2000
#endif
typedef void (*dcc_task)(void* ctx, int tid, int nt);
typedef struct { void* const* b; const int* s; int groups; } dcc_launch;

static int dcc_nt = 1;
static _Atomic unsigned dcc_gen;
static dcc_task dcc_job;
static void* dcc_job_ctx;
static _Atomic int dcc_done;
static _Atomic int dcc_sleepers;
static _Atomic int dcc_bar_count;
static _Atomic unsigned dcc_bar_gen;
static pthread_mutex_t dcc_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t dcc_cv = PTHREAD_COND_INITIALIZER;
static pthread_mutex_t dcc_run_mu = PTHREAD_MUTEX_INITIALIZER;  /* one task at a time (ctypes drops the GIL) */

static inline void dcc_pause(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

/* One round of a wait: spin at first, then yield the core (see DCC_YIELD_AFTER). */
static inline void dcc_wait(unsigned* spins) {
  if (++*spins < DCC_YIELD_AFTER) dcc_pause();
  else sched_yield();
}

/* The groups lo (which 0) or hi (which 1) of thread tid of nt: contiguous, balanced shares. */
static inline int dcc_share(int groups, int tid, int nt, int which) {
  return (int)(((int64_t)groups * (tid + which)) / nt);
}

__attribute__((unused)) static void dcc_barrier(void) {
  if (dcc_nt == 1) return;
  unsigned g = atomic_load_explicit(&dcc_bar_gen, memory_order_acquire);
  if (atomic_fetch_add_explicit(&dcc_bar_count, 1, memory_order_acq_rel) == dcc_nt - 1) {
    atomic_store_explicit(&dcc_bar_count, 0, memory_order_relaxed);
    atomic_fetch_add_explicit(&dcc_bar_gen, 1, memory_order_release);
  } else {
    unsigned spins = 0;
    while (atomic_load_explicit(&dcc_bar_gen, memory_order_acquire) == g) dcc_wait(&spins);
  }
}

static void* dcc_worker(void* arg) {
  int tid = (int)(intptr_t)arg;
  unsigned seen = 0;  /* the generation before any job: dcc_init runs before the first dcc_parallel */
  for (;;) {
    unsigned g;
    unsigned spins = 0;
    while ((g = atomic_load_explicit(&dcc_gen, memory_order_acquire)) == seen) {
      if (spins < DCC_SPIN) { dcc_wait(&spins); continue; }
      pthread_mutex_lock(&dcc_mu);
      atomic_fetch_add(&dcc_sleepers, 1);
      while (atomic_load(&dcc_gen) == seen) pthread_cond_wait(&dcc_cv, &dcc_mu);
      atomic_fetch_sub(&dcc_sleepers, 1);
      pthread_mutex_unlock(&dcc_mu);
    }
    seen = g;
    dcc_job(dcc_job_ctx, tid, dcc_nt);
    atomic_fetch_add_explicit(&dcc_done, 1, memory_order_acq_rel);
  }
  return 0;
}

/* Start the workers once; returns the number of threads the pool runs. */
DCC_EXPORT int dcc_init(int n) {
  static int started = 0;
  if (started) return dcc_nt;
  started = 1;
  if (n < 1) n = 1;
  if (n > DCC_MAX_THREADS) n = DCC_MAX_THREADS;
  for (int i = 1; i < n; ++i) {
    pthread_t th;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&th, &attr, dcc_worker, (void*)(intptr_t)i) != 0) { n = i; break; }
    pthread_attr_destroy(&attr);
  }
  dcc_nt = n;
  return n;
}

__attribute__((unused)) static void dcc_parallel(dcc_task f, void* ctx) {
  pthread_mutex_lock(&dcc_run_mu);
  if (dcc_nt == 1) { f(ctx, 0, 1); pthread_mutex_unlock(&dcc_run_mu); return; }
  dcc_job = f;
  dcc_job_ctx = ctx;
  atomic_store(&dcc_done, 0);
  pthread_mutex_lock(&dcc_mu);
  atomic_fetch_add_explicit(&dcc_gen, 1, memory_order_release);
  if (atomic_load(&dcc_sleepers)) pthread_cond_broadcast(&dcc_cv);
  pthread_mutex_unlock(&dcc_mu);
  f(ctx, 0, dcc_nt);
  unsigned spins = 0;
  while (atomic_load_explicit(&dcc_done, memory_order_acquire) != dcc_nt - 1) dcc_wait(&spins);
  pthread_mutex_unlock(&dcc_run_mu);
}

/* bench --roofline's read-bandwidth probe (runtime/roofline.py): XOR of `bytes` bytes at p, read by the caller alone
   (all = 0) or by every thread of the pool, each a contiguous share (the way the kernels split their work). */
typedef struct { const uint64_t* p; int64_t n; uint64_t out[DCC_MAX_THREADS]; } dcc_probe_ctx;
static void dcc_probe_task(void* ctx, int tid, int nt) {
  dcc_probe_ctx* c = (dcc_probe_ctx*)ctx;
  const int64_t lo = c->n * tid / nt, hi = c->n * (tid + 1) / nt;
  uint64_t a[8] = {0};
  int64_t i = lo;
  for (; i + 8 <= hi; i += 8)
    for (int k = 0; k < 8; ++k) a[k] ^= c->p[i + k];
  for (; i < hi; ++i) a[0] ^= c->p[i];
  c->out[tid] = a[0] ^ a[1] ^ a[2] ^ a[3] ^ a[4] ^ a[5] ^ a[6] ^ a[7];
}
DCC_EXPORT uint64_t dcc_read_probe(const void* p, int64_t bytes, int all) {
  static dcc_probe_ctx c;
  c.p = (const uint64_t*)p, c.n = bytes / 8;
  int nt = 1;
  if (all && dcc_nt > 1) dcc_parallel(dcc_probe_task, &c), nt = dcc_nt;
  else dcc_probe_task(&c, 0, 1);
  uint64_t x = 0;
  for (int t = 0; t < nt; ++t) x ^= c.out[t];
  return x;
}

/* bench --roofline's arithmetic probe: `iters` rounds of 8 independent chains of the integer dot product the
   kernels are built on (8-bit activations: vpdpbusd, or on AVX2 vpmaddubsw + vpmaddwd + vpaddd; 16-bit: vpdpwssd or
   vpmaddwd + vpaddd), by the caller alone (all = 0) or by every thread of the pool. Returns the multiply-adds done,
   so multiply-adds / time is the most a kernel of that width could do. The empty asm statements tell the compiler
   the operands change, so it cannot hoist the products out of the loop. */
typedef struct { int64_t iters; int bits; uint64_t macs[DCC_MAX_THREADS]; int32_t sink[DCC_MAX_THREADS]; } dcc_dot_ctx;
/* eight chains in named variables (an array of them is kept in memory: a store and a load per step), per ISA:
   DECL(k) the chain's accumulator and operand, STEP8 / STEP16 one step, SUM(k) its lanes into `sink` */
#if defined(DCC_ZMM)
#define DCC_DOT_DECL(k) __m512i acc##k = _mm512_setzero_si512(), a##k = _mm512_set1_epi8((char)(3 + k));
#define DCC_DOT_STEP8(k) __asm__("" : "+v"(a##k)); acc##k = _mm512_dpbusd_epi32(acc##k, a##k, b);
#define DCC_DOT_STEP16(k) __asm__("" : "+v"(a##k)); acc##k = _mm512_dpwssd_epi32(acc##k, a##k, b);
#define DCC_DOT_SUM(k) sink += _mm512_reduce_add_epi32(acc##k);
#define DCC_DOT_B const __m512i b = _mm512_set1_epi8(5);
#define DCC_DOT_LANES 16
#elif defined(__AVX2__)
#define DCC_DOT_DECL(k) __m256i acc##k = _mm256_setzero_si256(), a##k = _mm256_set1_epi8((char)(3 + k));
#define DCC_DOT_STEP8(k) __asm__("" : "+x"(a##k)); acc##k = _mm256_add_epi32(acc##k, DCC_DOT_U8S8(a##k, b));
#define DCC_DOT_STEP16(k) __asm__("" : "+x"(a##k)); acc##k = _mm256_add_epi32(acc##k, _mm256_madd_epi16(a##k, b));
#define DCC_DOT_SUM(k) { int32_t v[8]; _mm256_storeu_si256((__m256i*)v, acc##k); for (int l = 0; l < 8; ++l) sink += v[l]; }
#define DCC_DOT_B const __m256i b = _mm256_set1_epi8(5);
#define DCC_DOT_LANES 8
#endif
#define DCC_DOT8(STEP)                                                                                             \
  {                                                                                                                \
    DCC_DOT_DECL(0) DCC_DOT_DECL(1) DCC_DOT_DECL(2) DCC_DOT_DECL(3)                                                \
    DCC_DOT_DECL(4) DCC_DOT_DECL(5) DCC_DOT_DECL(6) DCC_DOT_DECL(7)                                                \
    for (int64_t i = 0; i < c->iters; ++i) { STEP(0) STEP(1) STEP(2) STEP(3) STEP(4) STEP(5) STEP(6) STEP(7) }      \
    DCC_DOT_SUM(0) DCC_DOT_SUM(1) DCC_DOT_SUM(2) DCC_DOT_SUM(3)                                                    \
    DCC_DOT_SUM(4) DCC_DOT_SUM(5) DCC_DOT_SUM(6) DCC_DOT_SUM(7)                                                    \
  }
static void dcc_dot_task(void* ctx, int tid, int nt) {
  dcc_dot_ctx* c = (dcc_dot_ctx*)ctx;
  (void)nt;
  int32_t sink = 0;
#if defined(DCC_DOT_LANES)
  DCC_DOT_B
  if (c->bits == 8) DCC_DOT8(DCC_DOT_STEP8) else DCC_DOT8(DCC_DOT_STEP16)
  /* per step and chain: 4 int8 (8-bit) or 2 int16 (16-bit) multiply-adds in each 32-bit lane */
  c->macs[tid] = (uint64_t)c->iters * 8 * DCC_DOT_LANES * (c->bits == 8 ? 4 : 2);
#else
  int8_t a[64];
  int32_t acc[8] = {0};
  for (int j = 0; j < 64; ++j) a[j] = (int8_t)(3 + j + tid);
  for (int64_t i = 0; i < c->iters; ++i) {
    __asm__("" : : "r"(a) : "memory");
    for (int j = 0; j < 64; ++j) acc[j & 7] += (int32_t)a[j] * 5;
  }
  for (int k = 0; k < 8; ++k) sink += acc[k];
  c->macs[tid] = (uint64_t)c->iters * 64;
#endif
  c->sink[tid] = sink;
}
DCC_EXPORT uint64_t dcc_dot_probe(int64_t iters, int bits, int all) {
  static dcc_dot_ctx c;
  c.iters = iters, c.bits = bits;
  int nt = 1;
  if (all && dcc_nt > 1) dcc_parallel(dcc_dot_task, &c), nt = dcc_nt;
  else dcc_dot_task(&c, 0, 1);
  uint64_t macs = 0;
  for (int t = 0; t < nt; ++t) macs += c.macs[t];
  return macs;
}

"""
