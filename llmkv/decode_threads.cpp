// The decode kernels' thread team: a few long-lived threads that spin briefly between jobs and
// then sleep. A decoder step is some two hundred short jobs (a projection, an attention) a few
// tens of microseconds apart; a pool that puts its threads to sleep after each (OpenMP with
// OMP_WAIT_POLICY=passive, as a shared machine wants) pays a wake-up every time, and one that
// always spins holds the cores between requests. Here a thread spins up to kSpin after a job,
// which covers the gaps inside a step, then waits on a condition variable. Every job's work is
// taken in units from a counter, and the calling thread never waits for a thread that has not
// started (Team::run): on a shared machine the other cores are often busy.
#include "llmkv/decode_kernels.h"
#include "llmkv/quant_kernels.h"

#include <algorithm>
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

  // body(ctx) on the calling thread and on up to n - 1 others, each taking its work from ctx
  // (an atomic counter) until none is left. The calling thread does not wait for a thread that
  // has not started: once its own call returns, no other thread joins, and it waits only for
  // those that did. On a shared machine a descheduled thread then costs nothing. A job's
  // threads join it by its generation (join_'s high word): a thread that wakes late joins the
  // job open then, if any, and never one it did not see posted, so a job may be posted while a
  // thread has not yet seen the last one (before, jobs ran on the caller alone until every
  // thread had acknowledged the last: on a loaded machine, some 9 in 10 of a decode step's jobs).
  // While another call holds the team (two sessions on two threads, say), jobs run alone.
  void run(int n, void (*body)(const void*), const void* ctx) {
    std::unique_lock<std::mutex> busy(run_mu_, std::try_to_lock);
    if (n <= 1 || !busy.owns_lock()) return body(ctx);
    post(n, body, ctx);
    body(ctx);
    const uint32_t joined = static_cast<uint32_t>(join_.fetch_or(kClosed, std::memory_order_acq_rel) & kCount);
    for (int spins = 0; done_.load(std::memory_order_acquire) < joined; ++spins) {
      cpu_relax();
      if (spins > kSpinAlone) std::this_thread::yield();  // a joined thread descheduled: let it run
    }
  }

 private:
  static constexpr std::chrono::microseconds kSpin{300};
  static constexpr int kSpinAlone = 2048;  // pauses before the spin starts yielding (some 20-40 us)
  // join_: the job's generation (its low 32 bits) in the high word, kClosed, the threads joined.
  static constexpr uint64_t kClosed = uint64_t{1} << 31, kCount = kClosed - 1, kTag = ~uint64_t{0} << 32;

  static uint64_t tag_of(uint64_t gen) { return gen << 32; }

  // Posts a job to the workers, starting any that are missing: its fields, then join_ open
  // under its generation, then the generation itself.
  void post(int n, void (*body)(const void*), const void* ctx) {
    while (static_cast<int>(workers_.size()) < n - 1) {
      // The generation the thread starts from is read here, before this call's job is posted:
      // read in the new thread, it could already be the job's, which would never run.
      const uint64_t seen = gen_.load(std::memory_order_acquire);
      workers_.emplace_back([this, seen] { loop(seen); });
      workers_.back().detach();
    }
    body_ = body;
    ctx_ = ctx;
    n_.store(n, std::memory_order_relaxed);
    done_.store(0, std::memory_order_relaxed);
    const uint64_t g = gen_.load(std::memory_order_relaxed) + 1;  // only a caller holding run_mu_ writes it
    join_.store(tag_of(g), std::memory_order_release);
    gen_.store(g, std::memory_order_seq_cst);
    if (sleepers_.load(std::memory_order_seq_cst) > 0) {
      std::lock_guard<std::mutex> lk(sleep_mu_);
      cv_.notify_all();
    }
  }

  // A worker's part in job g: joining it while it is the one open (and fewer than n - 1 have
  // joined), then taking work until none is left. body_ and ctx_ are g's once the join is made:
  // the caller waits for the thread before it posts again.
  void work(uint64_t g) {
    uint64_t j = join_.load(std::memory_order_acquire);
    while ((j & kTag) == tag_of(g) && !(j & kClosed) && static_cast<int>(j & kCount) < n_.load(std::memory_order_relaxed) - 1)
      if (join_.compare_exchange_weak(j, j + 1, std::memory_order_acq_rel, std::memory_order_acquire)) {
        body_(ctx_);
        done_.fetch_add(1, std::memory_order_release);
        return;
      }
  }

  void loop(uint64_t seen) {
    for (;;) {
      uint64_t g;
      auto deadline = std::chrono::steady_clock::now() + kSpin;
      int spins = 0;
      while ((g = gen_.load(std::memory_order_acquire)) == seen) {
        cpu_relax();
        // Past the first kSpinAlone, each check gives the core to any thread waiting for it (on
        // a busy machine, the caller itself may be): a spin costs the others nothing then.
        if (spins > kSpinAlone) std::this_thread::yield();
        if (++spins % 128 == 0 && std::chrono::steady_clock::now() > deadline) {
          std::unique_lock<std::mutex> lk(sleep_mu_);
          sleepers_.fetch_add(1, std::memory_order_seq_cst);
          cv_.wait(lk, [&] { return gen_.load(std::memory_order_seq_cst) != seen; });
          sleepers_.fetch_sub(1, std::memory_order_relaxed);
          deadline = std::chrono::steady_clock::now() + kSpin;
        }
      }
      seen = g;
      work(g);
    }
  }

  std::mutex run_mu_, sleep_mu_;
  std::condition_variable cv_;
  std::vector<std::thread> workers_;
  std::atomic<uint64_t> gen_{0}, join_{0};
  std::atomic<int> sleepers_{0}, n_{0};
  std::atomic<uint32_t> done_{0};  // run: the threads that joined and finished
  void (*body_)(const void*) = nullptr;
  const void* ctx_ = nullptr;
};

}  // namespace

namespace {

// Several products' output rows as one job: problem i's rows in units of unit[i] rows, the units
// of all of them numbered in turn (problem 0's first) and taken from one counter (Team::run),
// so that products of the same x (Q, K and V; gate and up) cost one hand-over.
struct Units {
  int64_t n = 0;
  std::vector<int64_t> first, unit;  // per problem: its first unit's number, rows a unit
  // The problem of unit u and its rows [*r0, *r1).
  template <class P>
  int64_t rows(const P* ps, int64_t u, int64_t* r0, int64_t* r1) const {
    int64_t i = 0;
    while (i + 1 < static_cast<int64_t>(first.size()) && first[i + 1] <= u) ++i;
    *r0 = (u - first[i]) * unit[i];
    *r1 = std::min(ps[i].out, *r0 + unit[i]);
    return i;
  }
  void add(int64_t out, int64_t rows_a_unit) {
    first.push_back(n);
    unit.push_back(rows_a_unit);
    n += (out + rows_a_unit - 1) / rows_a_unit;
  }
};

}  // namespace

void run_rows(RowsFn fn, const Problem& p, int threads) { run_rows_many(fn, &p, 1, threads); }

void run_rows_many(RowsFn fn, const Problem* ps, int64_t n, int threads) {
  // Fewer rows than this a thread cost more in the hand-over than they save.
  constexpr int64_t kMinRowsPerThread = 64;
  int64_t total = 0;
  for (int64_t i = 0; i < n; ++i) total += ps[i].out;
  const int64_t most = total / kMinRowsPerThread;
  if (most < threads) threads = most > 1 ? static_cast<int>(most) : 1;
  // Units of rows (a multiple of 8), about 8 a thread for each problem, taken in turn.
  Units units;
  for (int64_t i = 0; i < n; ++i) units.add(ps[i].out, std::max<int64_t>(8, (ps[i].out / (8 * threads) + 7) / 8 * 8));
  struct Ctx {
    RowsFn fn;
    const Problem* ps;
    const Units* units;
    mutable std::atomic<int64_t> next{0};
  } ctx{fn, ps, &units};
  Team::get().run(threads, [](const void* c) {
    const Ctx& x = *static_cast<const Ctx*>(c);
    for (int64_t u, r0, r1; (u = x.next.fetch_add(1, std::memory_order_relaxed)) < x.units->n;) {
      const int64_t i = x.units->rows(x.ps, u, &r0, &r1);
      x.fn(x.ps[i], r0, r1);
    }
  }, &ctx);
}

namespace {

// p restricted to activation rows [m0, m0 + m).
QProblem q_rows(const QProblem& p, int64_t m0, int64_t m) {
  QProblem q = p;
  q.m = m;
  q.y = p.y + m0 * p.out;
  if (p.float_x) {
    q.x = p.x + m0 * p.in;
    q.xsum = p.xsum ? p.xsum + m0 * (p.in / kQ32) : nullptr;
    return q;
  }
  q.a.q = p.a.q + m0 * p.in;
  // The tile's rows of each block: a tile of their own (QActs::tile), or else block-major.
  const int64_t at = p.a.tile ? (m0 / kMaxRows) * p.a.tile : m0;
  q.a.d = p.a.d + at;
  q.a.s = p.a.s ? p.a.s + at : nullptr;
  q.a.tile = 0;
  q.a.bsums = p.a.bsums ? p.a.bsums + m0 * (p.in / 16) : nullptr;
  return q;
}

}  // namespace

void run_qrows(QRowsFn fn, const QProblem& p, int threads) { run_qrows_many(fn, &p, 1, threads); }

void run_qrows_many(QRowsFn fn, const QProblem* ps, int64_t n, int threads) {
  // Output rows a thread at least (per tile of activation rows).
  constexpr int64_t kMinRowsPerThread = 64;
  const int64_t tiles = (ps[0].m + kMaxRows - 1) / kMaxRows;
  int64_t total = 0;
  for (int64_t i = 0; i < n; ++i) total += ps[i].out;
  const int64_t most = total * tiles / kMinRowsPerThread;
  if (most < threads) threads = most > 1 ? static_cast<int>(most) : 1;
  // Units of work: output rows (a multiple of 8, the kernels' widest row block) against every
  // tile, taken in turn: a thread that starts late or runs slower leaves its share to the
  // others. One activation tile: 2 to 8 units a thread, about 64 KiB of weights each (a unit
  // starts cold, its first rows not prefetched: small products in 2 units a thread, SmolLM2's
  // 576 x 576 Q4_1 in 9 us against 14 in 8). Several tiles: 8 units a thread, their weight rows
  // 16 KiB at most, so that they stay in L1 while the tiles (from L2) pass.
  Units units;
  for (int64_t i = 0; i < n; ++i) {
    const QProblem& p = ps[i];
    int64_t unit;
    if (tiles == 1) {
      const int64_t k = std::clamp<int64_t>(p.out * p.row_bytes / 65536, 2 * threads, 8 * threads);
      unit = (p.out + k - 1) / k;
    } else {
      unit = std::min(p.out / (8 * threads), 16384 / std::max<int64_t>(p.row_bytes, 1));
    }
    units.add(p.out, std::max<int64_t>((unit + 7) / 8 * 8, 8));
  }
  struct Ctx {
    QRowsFn fn;
    const QProblem* ps;
    const Units* units;
    int64_t tiles;
    mutable std::atomic<int64_t> next{0};
  } ctx{fn, ps, &units, tiles};
  Team::get().run(threads, [](const void* c) {
    const Ctx& x = *static_cast<const Ctx*>(c);
    for (int64_t u, r0, r1; (u = x.next.fetch_add(1, std::memory_order_relaxed)) < x.units->n;) {
      const QProblem& p = x.ps[x.units->rows(x.ps, u, &r0, &r1)];
      if (x.tiles == 1) {
        x.fn(p, r0, r1);
        continue;
      }
      for (int64_t i = 0; i < x.tiles; ++i) {
        const int64_t m0 = i * kMaxRows;
        x.fn(q_rows(p, m0, std::min<int64_t>(kMaxRows, p.m - m0)), r0, r1);
      }
    }
  }, &ctx);
}

void run_quantize(QuantizeFn fn, QuantKind kind, const float* x, int64_t m, int64_t in, const QActs& a, int threads) {
  // Rows a unit of work: quantizing a row costs about what handing it over does.
  constexpr int64_t kUnit = 8;
  if (m < 2 * kUnit) threads = 1;
  struct Ctx {
    QuantizeFn fn;
    QuantKind kind;
    const float* x;
    int64_t m, in;
    const QActs* a;
    mutable std::atomic<int64_t> next{0};
  } ctx{fn, kind, x, m, in, &a};
  Team::get().run(threads, [](const void* c) {
    const Ctx& q = *static_cast<const Ctx*>(c);
    for (int64_t u; (u = q.next.fetch_add(kUnit, std::memory_order_relaxed)) < q.m;)
      for (int64_t r = u; r < std::min(q.m, u + kUnit); ++r) q.fn(q.kind, q.x, q.in, *q.a, r);
  }, &ctx);
}

void run_attention(AttnFn fn, const AttnProblem& p, int threads) { run_attention_many(fn, &p, 1, threads); }

void run_attention_many(AttnFn fn, const AttnProblem* ps, int64_t n, int threads) {
  // Key ranges per kv head: enough tasks for the threads when there are fewer kv heads in all,
  // none shorter than kMinKeys keys (each range costs a merge).
  constexpr int64_t kMinKeys = 256;
  int64_t heads = 0;
  for (int64_t i = 0; i < n; ++i) heads += ps[i].KH;
  struct Part {
    int64_t splits, first, G;  // key ranges per kv head; its first task; query heads per kv head
    int64_t row0, out0;        // its first partial row (task, query head) and output float
  };
  std::vector<Part> parts(static_cast<size_t>(n));
  int64_t tasks = 0, rows = 0, floats = 0, most_splits = 1;
  for (int64_t i = 0; i < n; ++i) {
    const AttnProblem& p = ps[i];
    int64_t splits = 1;
    if (threads > heads) {
      splits = (threads + heads - 1) / heads;
      if (splits > p.nk / kMinKeys) splits = p.nk / kMinKeys > 1 ? p.nk / kMinKeys : 1;
    }
    const int64_t G = p.H / p.KH;
    parts[i] = {splits, tasks, G, rows, floats};
    most_splits = splits > most_splits ? splits : most_splits;
    tasks += p.KH * splits;
    rows += p.KH * splits * G;
    floats += p.KH * splits * G * p.d;
  }
  std::vector<float> m(rows, -__builtin_inff()), l(rows, 0.f), o(floats, 0.f);
  std::vector<int64_t> owner(tasks);  // task -> its problem (each problem's tasks consecutive)
  for (int64_t i = 0; i < n; ++i)
    for (int64_t k = 0; k < ps[i].KH * parts[i].splits; ++k) owner[parts[i].first + k] = i;
  struct Ctx {
    AttnFn fn;
    const AttnProblem* ps;
    const Part* parts;
    const int64_t* owner;
    int64_t tasks;
    float *m, *l, *o;
    mutable std::atomic<int64_t> next{0};
  } ctx{fn, ps, parts.data(), owner.data(), tasks, m.data(), l.data(), o.data()};
  const int team = threads < tasks ? threads : static_cast<int>(tasks);
  // Tasks taken in turn (Team::run); each writes its own partial rows, merged below.
  Team::get().run(team, [](const void* c) {
    const Ctx& x = *static_cast<const Ctx*>(c);
    for (int64_t k; (k = x.next.fetch_add(1, std::memory_order_relaxed)) < x.tasks;) {
      const Part& pt = x.parts[x.owner[k]];
      const AttnProblem& p = x.ps[x.owner[k]];
      const int64_t local = k - pt.first, h = local / pt.splits, s = local % pt.splits;
      const int64_t j0 = p.nk * s / pt.splits, j1 = p.nk * (s + 1) / pt.splits;
      if (j1 > j0)
        x.fn(p, h, j0, j1, x.m + pt.row0 + local * pt.G, x.l + pt.row0 + local * pt.G,
             x.o + pt.out0 + local * pt.G * p.d);
    }
  }, &ctx);
  // Merge each problem's ranges: rescale each by e^(its max - the head's max).
  std::vector<float> coef(most_splits);
  float* cf = coef.data();
  for (int64_t i = 0; i < n; ++i) {
    const AttnProblem& p = ps[i];
    const int64_t splits = parts[i].splits, G = parts[i].G, nk = p.nk, d = p.d;
    const float* mi = m.data() + parts[i].row0;
    const float* li = l.data() + parts[i].row0;
    const float* oi = o.data() + parts[i].out0;
    for (int64_t h = 0; h < p.KH; ++h) {
      for (int64_t g = 0; g < G; ++g) {
        float mx = -__builtin_inff();
        for (int64_t s = 0; s < splits; ++s) mx = mi[(h * splits + s) * G + g] > mx ? mi[(h * splits + s) * G + g] : mx;
        float total = 0.f;
        for (int64_t s = 0; s < splits; ++s) {
          const int64_t t = h * splits + s;
          cf[s] = li[t * G + g] > 0.f ? __builtin_expf(mi[t * G + g] - mx) : 0.f;
          total += li[t * G + g] * cf[s];
        }
        float* out = p.out + (h * G + g) * d;
        for (int64_t e = 0; e < d; ++e) out[e] = 0.f;
        for (int64_t s = 0; s < splits; ++s) {
          const float c = cf[s] / total;
          const float* os = &oi[((h * splits + s) * G + g) * d];
          for (int64_t e = 0; e < d; ++e) out[e] += os[e] * c;
          cf[s] = c;
        }
        if (p.mass) {
          float* mass = p.mass + h * nk;
          const float* ex = p.scratch + (h * G + g) * nk;
          for (int64_t s = 0; s < splits; ++s) {
            const int64_t j0 = nk * s / splits, j1 = nk * (s + 1) / splits;
            for (int64_t j = j0; j < j1; ++j) mass[j] = (g == 0 ? 0.f : mass[j]) + ex[j] * cf[s];
          }
        }
      }
    }
  }
}

}  // namespace wm::llm::gemv
