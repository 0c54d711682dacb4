// The decode kernels' thread team: a few long-lived threads that spin briefly between jobs and
// then sleep. A decoder step is some two hundred short jobs (a projection, an attention) a few
// tens of microseconds apart; a pool that puts its threads to sleep after each (OpenMP with
// OMP_WAIT_POLICY=passive, as a shared machine wants) pays a wake-up every time, and one that
// always spins holds the cores between requests. Here a thread spins up to kSpin after a job,
// which covers the gaps inside a step, then waits on a condition variable.
#include "llmkv/decode_kernels.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include <unistd.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace wm::llm::gemv {

namespace {

inline void cpu_relax() {
#if defined(__x86_64__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

class Team {
 public:
  // Never destroyed: its threads live as long as the process. A child of fork() has none of
  // its parent's threads, and gets a team of its own.
  static Team& get() {
    static std::atomic<Team*> team{nullptr};
    static std::atomic<pid_t> owner{0};
    static std::mutex make_mu;
    const pid_t pid = ::getpid();
    Team* t = team.load(std::memory_order_acquire);
    if (t && owner.load(std::memory_order_acquire) == pid) return *t;
    std::lock_guard<std::mutex> lk(make_mu);
    t = team.load(std::memory_order_acquire);
    if (!t || owner.load(std::memory_order_acquire) != pid) {
      t = new Team;
      team.store(t, std::memory_order_release);
      owner.store(pid, std::memory_order_release);
    }
    return *t;
  }

  // body(ctx, t, n) for t in [0, n), t = 0 on the calling thread. Serial when another call holds
  // the team (two sessions on two threads, say).
  void run(int n, void (*body)(const void*, int, int), const void* ctx) {
    std::unique_lock<std::mutex> busy(run_mu_, std::try_to_lock);
    if (n <= 1 || !busy.owns_lock()) {
      for (int t = 0; t < n; ++t) body(ctx, t, n);
      return;
    }
    while (static_cast<int>(workers_.size()) < n - 1) {
      // The generation the thread starts from is read here, before this call's job is posted:
      // read in the new thread, it could already be the job's, which would never run.
      const int id = static_cast<int>(workers_.size()) + 1;
      const uint64_t seen = gen_.load(std::memory_order_acquire);
      workers_.emplace_back([this, id, seen] { loop(id, seen); });
      workers_.back().detach();
    }
    body_ = body;
    ctx_ = ctx;
    n_ = n;
    pending_.store(static_cast<int>(workers_.size()), std::memory_order_relaxed);
    gen_.fetch_add(1, std::memory_order_seq_cst);
    if (sleepers_.load(std::memory_order_seq_cst) > 0) {
      std::lock_guard<std::mutex> lk(sleep_mu_);
      cv_.notify_all();
    }
    body(ctx, 0, n);
    while (pending_.load(std::memory_order_acquire) > 0) cpu_relax();
  }

 private:
  static constexpr std::chrono::microseconds kSpin{300};

  void loop(int id, uint64_t seen) {
    for (;;) {
      uint64_t g;
      auto deadline = std::chrono::steady_clock::now() + kSpin;
      int spins = 0;
      while ((g = gen_.load(std::memory_order_acquire)) == seen) {
        cpu_relax();
        if (++spins % 128 == 0 && std::chrono::steady_clock::now() > deadline) {
          std::unique_lock<std::mutex> lk(sleep_mu_);
          sleepers_.fetch_add(1, std::memory_order_seq_cst);
          cv_.wait(lk, [&] { return gen_.load(std::memory_order_seq_cst) != seen; });
          sleepers_.fetch_sub(1, std::memory_order_relaxed);
          deadline = std::chrono::steady_clock::now() + kSpin;
        }
      }
      seen = g;
      if (id < n_) body_(ctx_, id, n_);
      pending_.fetch_sub(1, std::memory_order_release);
    }
  }

  std::mutex run_mu_, sleep_mu_;
  std::condition_variable cv_;
  std::vector<std::thread> workers_;
  std::atomic<uint64_t> gen_{0};
  std::atomic<int> pending_{0}, sleepers_{0};
  void (*body_)(const void*, int, int) = nullptr;
  const void* ctx_ = nullptr;
  int n_ = 0;
};

}  // namespace

void run_rows(RowsFn fn, const Problem& p, int threads) {
  // Fewer rows than this a thread cost more in the hand-over than they save.
  constexpr int64_t kMinRowsPerThread = 64;
  const int64_t most = p.out / kMinRowsPerThread;
  if (most < threads) threads = most > 1 ? static_cast<int>(most) : 1;
  struct Ctx {
    RowsFn fn;
    const Problem* p;
  } ctx{fn, &p};
  Team::get().run(threads, [](const void* c, int t, int n) {
    const Ctx& x = *static_cast<const Ctx*>(c);
    const int64_t out = x.p->out, r0 = out * t / n, r1 = out * (t + 1) / n;
    if (r1 > r0) x.fn(*x.p, r0, r1);
  }, &ctx);
}

void run_attention(AttnFn fn, const AttnProblem& p, int threads) {
  const int64_t G = p.H / p.KH, nk = p.nk, d = p.d;
  // Key ranges per kv head: enough tasks for the threads when there are fewer kv heads, none
  // shorter than kMinKeys keys (each range costs a merge).
  constexpr int64_t kMinKeys = 256;
  int64_t splits = 1;
  if (threads > p.KH) {
    splits = (threads + p.KH - 1) / p.KH;
    if (splits > nk / kMinKeys) splits = nk / kMinKeys > 1 ? nk / kMinKeys : 1;
  }
  const int64_t tasks = p.KH * splits;
  std::vector<float> m(tasks * G, -__builtin_inff()), l(tasks * G, 0.f), o(tasks * G * d, 0.f);
  struct Ctx {
    AttnFn fn;
    const AttnProblem* p;
    int64_t splits, tasks, G, d;
    float *m, *l, *o;
  } ctx{fn, &p, splits, tasks, G, d, m.data(), l.data(), o.data()};
  const int team = threads < tasks ? threads : static_cast<int>(tasks);
  Team::get().run(team, [](const void* c, int t, int n) {
    const Ctx& x = *static_cast<const Ctx*>(c);
    for (int64_t k = t; k < x.tasks; k += n) {
      const int64_t h = k / x.splits, s = k % x.splits, nk = x.p->nk;
      const int64_t j0 = nk * s / x.splits, j1 = nk * (s + 1) / x.splits;
      if (j1 > j0) x.fn(*x.p, h, j0, j1, x.m + k * x.G, x.l + k * x.G, x.o + k * x.G * x.d);
    }
  }, &ctx);
  // Merge the ranges: rescale each by e^(its max - the head's max).
  std::vector<float> coef(splits);
  for (int64_t h = 0; h < p.KH; ++h) {
    for (int64_t g = 0; g < G; ++g) {
      float mx = -__builtin_inff();
      for (int64_t s = 0; s < splits; ++s) mx = m[(h * splits + s) * G + g] > mx ? m[(h * splits + s) * G + g] : mx;
      float total = 0.f;
      for (int64_t s = 0; s < splits; ++s) {
        const int64_t t = h * splits + s;
        coef[s] = l[t * G + g] > 0.f ? __builtin_expf(m[t * G + g] - mx) : 0.f;
        total += l[t * G + g] * coef[s];
      }
      float* out = p.out + (h * G + g) * d;
      for (int64_t i = 0; i < d; ++i) out[i] = 0.f;
      for (int64_t s = 0; s < splits; ++s) {
        const float c = coef[s] / total;
        const float* os = &o[((h * splits + s) * G + g) * d];
        for (int64_t i = 0; i < d; ++i) out[i] += os[i] * c;
        coef[s] = c;
      }
      if (p.mass) {
        float* mass = p.mass + h * nk;
        const float* e = p.scratch + (h * G + g) * nk;
        for (int64_t s = 0; s < splits; ++s) {
          const int64_t j0 = nk * s / splits, j1 = nk * (s + 1) / splits;
          for (int64_t j = j0; j < j1; ++j) mass[j] = (g == 0 ? 0.f : mass[j]) + e[j] * coef[s];
        }
      }
    }
  }
}

}  // namespace wm::llm::gemv
