// wm_bench_kv_store: throughput of the remote KV tier (runtime/remote_store.h) in blocks/s and
// MiB/s, for put and get, by block shape, client threads and pipelining (blocks per put_many /
// get_many), next to redis-benchmark's SET and GET of values of the same size on the same
// server, the two run interleaved (ours, theirs, ours, theirs ...) as the machine may be shared.
//
// The threads share one RemoteStore (its connection pool), as programs do; each puts blocks of
// its own (random K/V), then gets them back; the first block of each thread is compared bit for
// bit with what was put, and a block that does not come back whole is an error, not a figure.
// Every key the program writes is under its own namespace ("wm:bench-<pid>:*"), deleted after
// each configuration and at the end (on an error too), with redis-benchmark's key when it was
// not there before.
#include <ATen/Parallel.h>
#include <CLI/CLI.hpp>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "llmkv/config.h"
#include "runtime/block.h"
#include "runtime/device.h"
#include "runtime/error.h"
#include "runtime/remote_store.h"
#include "runtime/spill_file.h"
#include "tools/cli/cleanup.h"
#include "tools/cli/error_text.h"
#include "tools/cli/output_file.h"
#include "tools/cli/progress.h"
#include "tools/cli/shipped_path.h"
#include "tools/cli/validators.h"

// Each program's code is in a namespace of its own: wm_tools, the one binary of the programs,
// compiles several of them in one unit (tools/README.md, "Building").
namespace wm_tool_bench_kv_store {

namespace {

using Clock = std::chrono::steady_clock;
using wm::str_cat;

// The embedded LLM (as wm_plan_bench names it): the "tiny" shape is one layer's block of it.
const char* const kEmbeddedModel = "assets/models/tiny-llm";

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// The calling thread's CPU time (user and system), seconds.
double thread_cpu_s() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

constexpr double kMiB = 1048576.0;

// ---------------------------------------------------------------------------------------------
// Block shapes: one layer's block, K and V [kv_heads, tokens, head_dim].

struct Shape {
  std::string name;
  int kv_heads = 0, head_dim = 0;
  std::string source;  // where the figures come from
};

// A named shape's KV heads and head size, from the model's own config.json (LlmConfig reads and
// checks it, head_dim's default included).
Shape shape_named(const std::string& name) {
  const std::string rel = name == "tiny"         ? std::string(kEmbeddedModel) + "/config.json"
                          : name == "qwen2-0.5b" ? std::string("configs/qwen2-0.5b.json")
                                                 : std::string();
  if (rel.empty()) throw wm::Error(str_cat("--shapes: unknown shape '", name, "' (tiny, qwen2-0.5b)"));
  std::string tried;
  const std::string path = wm::cli::find_shipped(rel, &tried);
  if (path.empty()) throw wm::Error(str_cat("--shapes ", name, ": ", rel, " was not found; tried ", tried));
  const wm::llm::LlmConfig c = wm::llm::LlmConfig::load(path);
  return {name, static_cast<int>(c.num_key_value_heads), static_cast<int>(c.head_dim), path};
}

// The first difference between two blocks, bit for bit ("" when none).
std::string first_difference(const wm::Block& a, const wm::Block& b) {
  if (a.id != b.id) return str_cat("the identity ('", b.id, "' instead of '", a.id, "')");
  if (a.layers.size() != b.layers.size()) return str_cat(b.layers.size(), " layers instead of ", a.layers.size());
  for (size_t l = 0; l < a.layers.size(); ++l) {
    const wm::LayerKv &x = a.layers[l], &y = b.layers[l];
    const std::pair<const char*, std::pair<const at::Tensor*, const at::Tensor*>> fields[] = {
        {"k", {&x.k, &y.k}}, {"v", {&x.v, &y.v}}, {"pos", {&x.pos, &y.pos}}, {"logw", {&x.logw, &y.logw}}};
    for (const auto& [name, t] : fields) {
      const at::Tensor &p = *t.first, &q = *t.second;
      const std::string where = str_cat("layer ", l, " ", name, ": ");
      if (p.defined() != q.defined()) return where + "defined in one block only";
      if (!p.defined()) continue;
      if (p.scalar_type() != q.scalar_type()) return where + "another dtype";
      if (p.sizes() != q.sizes()) return where + "another shape";
      const at::Tensor pc = p.cpu().contiguous(), qc = q.cpu().contiguous();
      if (std::memcmp(pc.data_ptr(), qc.data_ptr(), pc.nbytes()) != 0) return where + "other bytes";
    }
  }
  return "";
}

// ---------------------------------------------------------------------------------------------
// The program's own connection to the server (hiredis): reachability, the server's version, and
// deleting what the program wrote.

class Admin {
 public:
  Admin(const wm::RemoteEndpoint& ep, const std::string& password) {
    struct timeval tv {5, 0};
    c_ = ep.unix_socket ? redisConnectUnixWithTimeout(ep.path.c_str(), tv)
                        : redisConnectWithTimeout(ep.host.c_str(), ep.port, tv);
    if (c_ == nullptr || c_->err != 0) {
      const std::string why = c_ ? c_->errstr : "cannot allocate a connection";
      if (c_) redisFree(c_);
      c_ = nullptr;
      throw wm::Error(str_cat("--kv-store ", ep.url, ": cannot connect: ", why));
    }
    redisSetTimeout(c_, timeval{30, 0});
    if (!password.empty()) check(command({"AUTH", password}), ep.url, "AUTH");
    if (ep.db != 0) check(command({"SELECT", std::to_string(ep.db)}), ep.url, "SELECT");
    check(command({"PING"}), ep.url, "PING");
  }
  ~Admin() {
    if (c_) redisFree(c_);
  }
  Admin(const Admin&) = delete;
  Admin& operator=(const Admin&) = delete;

  // The reply as text (integers in decimal, nil as "(nil)"), "ERR ..." for an error reply;
  // throws wm::Error when the connection fails.
  std::string command(const std::vector<std::string>& args) {
    redisReply* r = call(args);
    std::string out;
    if (r->type == REDIS_REPLY_INTEGER) out = std::to_string(r->integer);
    else if (r->type == REDIS_REPLY_NIL) out = "(nil)";
    else if (r->type == REDIS_REPLY_ARRAY) out = std::to_string(r->elements);
    else out = std::string(r->str, r->len);
    if (r->type == REDIS_REPLY_ERROR && out.compare(0, 3, "ERR") != 0) out = "ERR " + out;
    freeReplyObject(r);
    return out;
  }

  // "redis_version" from INFO server, or "?".
  std::string version() {
    const std::string info = command({"INFO", "server"});
    const size_t at = info.find("redis_version:");
    if (at == std::string::npos) return "?";
    const size_t end = info.find_first_of("\r\n", at);
    return info.substr(at + 14, end == std::string::npos ? std::string::npos : end - at - 14);
  }

  // Deletes every key matching `pattern` (SCAN, then DEL in batches); the number deleted.
  int64_t delete_matching(const std::string& pattern) {
    int64_t deleted = 0;
    std::string cursor = "0";
    do {
      redisReply* r = call({"SCAN", cursor, "MATCH", pattern, "COUNT", "1000"});
      if (r->type != REDIS_REPLY_ARRAY || r->elements != 2) {
        freeReplyObject(r);
        throw wm::Error("SCAN: unexpected reply");
      }
      cursor = std::string(r->element[0]->str, r->element[0]->len);
      std::vector<std::string> del = {"DEL"};
      for (size_t i = 0; i < r->element[1]->elements; ++i)
        del.emplace_back(r->element[1]->element[i]->str, r->element[1]->element[i]->len);
      freeReplyObject(r);
      if (del.size() > 1) deleted += std::atoll(command(del).c_str());
    } while (cursor != "0");
    return deleted;
  }

 private:
  redisReply* call(const std::vector<std::string>& args) {
    std::vector<const char*> argv;
    std::vector<size_t> lens;
    for (const auto& a : args) argv.push_back(a.data()), lens.push_back(a.size());
    auto* r = static_cast<redisReply*>(redisCommandArgv(c_, static_cast<int>(argv.size()), argv.data(), lens.data()));
    if (r == nullptr) throw wm::Error(str_cat("kv store: ", args[0], " failed: ", c_->errstr));
    return r;
  }
  static void check(const std::string& reply, const std::string& url, const char* what) {
    if (reply.compare(0, 4, "ERR ") == 0) throw wm::Error(str_cat("--kv-store ", url, ": ", what, ": ", reply));
  }
  redisContext* c_ = nullptr;
};

// Deletes the program's keys when it ends, by an error too.
struct KeysCleanup {
  Admin* admin = nullptr;
  std::string pattern;
  std::vector<std::string> also;  // other keys of ours (redis-benchmark's)
  int64_t run() {
    int64_t n = admin->delete_matching(pattern);
    for (const auto& k : also) n += std::atoll(admin->command({"DEL", k}).c_str());
    also.clear();
    return n;
  }
  ~KeysCleanup() {
    if (admin == nullptr) return;
    try {
      run();
    } catch (const std::exception& e) {
      std::cerr << "wm_bench_kv_store: warning: could not delete the keys " << pattern << ": " << e.what() << "\n";
    }
  }
};

// ---------------------------------------------------------------------------------------------
// Threads released together: the time from the release to the last thread's end.

class Gate {
 public:
  void wait() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return open_; });
  }
  void open() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      open_ = true;
    }
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

template <class F>
double run_threads(int n, F f) {
  Gate gate;
  std::vector<std::exception_ptr> errors(n);
  std::vector<std::thread> threads;
  for (int t = 0; t < n; ++t)
    threads.emplace_back([&, t] {
      gate.wait();
      try {
        f(t);
      } catch (...) {
        errors[t] = std::current_exception();
      }
    });
  const auto t0 = Clock::now();
  gate.open();
  for (auto& th : threads) th.join();
  const double s = seconds_since(t0);
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  return s;
}

// ---------------------------------------------------------------------------------------------
// Our side: one round of puts and gets.

struct ThreadBlocks {
  std::vector<wm::Block> blocks;
  std::vector<std::string> ids, keys;
};

struct OursRound {
  double put_s = 0, get_s = 0;
  double put_blocks_per_s = 0, put_mib_per_s = 0, get_blocks_per_s = 0, get_mib_per_s = 0;
  double put_cpu_s = 0, get_cpu_s = 0;  // the client threads' CPU time (user + system), summed
  double encode_cpu_s = 0;              // of which encoding, in the put threads
  int64_t bytes = 0;        // values put (= values got)
};

OursRound run_ours(wm::RemoteStore& store, const std::vector<ThreadBlocks>& data, int batch, int64_t tokens) {
  const int nt = static_cast<int>(data.size());
  std::vector<double> put_cpu(nt), get_cpu(nt), encode_cpu(nt);
  std::vector<int64_t> bytes(nt);
  OursRound r;
  r.put_s = run_threads(nt, [&](int t) {
    const ThreadBlocks& tb = data[t];
    const double c0 = thread_cpu_s();
    for (size_t i = 0; i < tb.blocks.size(); i += batch) {
      const size_t end = std::min(tb.blocks.size(), i + static_cast<size_t>(batch));
      std::vector<wm::RemoteStore::Put> puts;
      puts.reserve(end - i);
      const double e0 = thread_cpu_s();
      for (size_t j = i; j < end; ++j) {
        wm::RemoteStore::Put p;
        p.key = tb.keys[j];
        p.id = tb.ids[j];
        p.kind = "kv";
        p.tokens = tokens;
        p.value = store.encode(tb.blocks[j]);
        bytes[t] += static_cast<int64_t>(p.value.size());
        puts.push_back(std::move(p));
      }
      encode_cpu[t] += thread_cpu_s() - e0;
      if (!store.put_many(std::move(puts)))
        throw wm::Error(str_cat("put: thread ", t, ": the write of blocks ", i, "..", end - 1,
                                " failed (store statistics: ", store.stats_json().dump(), ")"));
    }
    put_cpu[t] = thread_cpu_s() - c0;
  });
  std::vector<std::optional<wm::Block>> first(nt);
  std::vector<int64_t> missing(nt, 0), first_missing(nt, -1);
  r.get_s = run_threads(nt, [&](int t) {
    const ThreadBlocks& tb = data[t];
    const double c0 = thread_cpu_s();
    std::vector<std::string> keys, ids;
    for (size_t i = 0; i < tb.blocks.size(); i += batch) {
      const size_t end = std::min(tb.blocks.size(), i + static_cast<size_t>(batch));
      keys.assign(tb.keys.begin() + i, tb.keys.begin() + end);
      ids.assign(tb.ids.begin() + i, tb.ids.begin() + end);
      auto got = store.get_many(keys, ids);
      for (size_t j = 0; j < got.size(); ++j) {
        if (!got[j]) {
          if (missing[t]++ == 0) first_missing[t] = static_cast<int64_t>(i + j);
        } else if (i + j == 0) {
          first[t] = std::move(got[j]);
        }
      }
    }
    get_cpu[t] = thread_cpu_s() - c0;
  });
  for (int t = 0; t < nt; ++t) {
    if (missing[t] > 0)
      throw wm::Error(str_cat("get: thread ", t, ": ", missing[t], " of ", data[t].blocks.size(),
                              " blocks did not come back (the first: ", data[t].keys[first_missing[t]],
                              "); store statistics: ", store.stats_json().dump()));
    const std::string diff = first_difference(data[t].blocks[0], *first[t]);
    if (!diff.empty())
      throw wm::Error(
          str_cat("get: thread ", t, ": block ", data[t].keys[0], " came back different from what was put: ", diff));
  }
  int64_t n_blocks = 0;
  for (int t = 0; t < nt; ++t) {
    n_blocks += static_cast<int64_t>(data[t].blocks.size());
    r.bytes += bytes[t];
    r.encode_cpu_s += encode_cpu[t];
    r.put_cpu_s += put_cpu[t];
    r.get_cpu_s += get_cpu[t];
  }
  r.put_blocks_per_s = n_blocks / r.put_s;
  r.get_blocks_per_s = n_blocks / r.get_s;
  r.put_mib_per_s = r.bytes / kMiB / r.put_s;
  r.get_mib_per_s = r.bytes / kMiB / r.get_s;
  return r;
}

// ---------------------------------------------------------------------------------------------
// redis-benchmark.

// `name` itself when it has a '/', else the first executable of that name on $PATH ("" if none).
std::string find_program(const std::string& name) {
  if (name.find('/') != std::string::npos) return ::access(name.c_str(), X_OK) == 0 ? name : "";
  const char* path = std::getenv("PATH");
  std::stringstream ss(path ? path : "/usr/local/bin:/usr/bin:/bin");
  std::string dir;
  while (std::getline(ss, dir, ':')) {
    const std::string p = (dir.empty() ? std::string(".") : dir) + "/" + name;
    if (::access(p.c_str(), X_OK) == 0) return p;
  }
  return "";
}

struct ProcResult {
  int status = -1;  // exit status, or -1 when it did not exit by itself
  bool timed_out = false;
  std::string output;  // stdout and stderr
};

// Runs a program with its stdout and stderr captured, killed (SIGKILL) after timeout_s.
ProcResult run_capture(const std::vector<std::string>& argv, double timeout_s) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) throw wm::Error(str_cat("pipe: ", std::strerror(errno)));
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    throw wm::Error(str_cat("fork: ", std::strerror(errno)));
  }
  if (pid == 0) {
    ::dup2(fds[1], 1);
    ::dup2(fds[1], 2);
    const int null = ::open("/dev/null", O_RDONLY);
    if (null >= 0) ::dup2(null, 0);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  ::close(fds[1]);
  ProcResult r;
  const auto t0 = Clock::now();
  char buf[4096];
  for (;;) {
    const double left = timeout_s - seconds_since(t0);
    if (left <= 0) {
      r.timed_out = true;
      ::kill(pid, SIGKILL);
      break;
    }
    pollfd p{fds[0], POLLIN, 0};
    const int n = ::poll(&p, 1, static_cast<int>(std::min(left, 1.0) * 1000) + 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) continue;
    const ssize_t got = ::read(fds[0], buf, sizeof buf);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    r.output.append(buf, static_cast<size_t>(got));
  }
  ::close(fds[0]);
  int st = 0;
  while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  if (!r.timed_out && WIFEXITED(st)) r.status = WEXITSTATUS(st);
  return r;
}

// The requests per second of one redis-benchmark test ("SET", "GET"), its --csv output parsed.
struct Baseline {
  std::string exe;
  wm::RemoteEndpoint ep;

  double run(const std::string& test, int64_t value_bytes, int clients, int pipeline, int64_t requests,
             double timeout_s) const {
    std::vector<std::string> argv = {exe};
    if (ep.unix_socket) argv.insert(argv.end(), {"-s", ep.path});
    else argv.insert(argv.end(), {"-h", ep.host, "-p", std::to_string(ep.port)});
    if (ep.db != 0) argv.insert(argv.end(), {"--dbnum", std::to_string(ep.db)});
    std::string lower = test;
    for (char& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    argv.insert(argv.end(), {"-t", lower, "-d", std::to_string(value_bytes), "-c", std::to_string(clients), "-n",
                             std::to_string(requests), "-q", "--csv"});
    if (pipeline > 1) argv.insert(argv.end(), {"-P", std::to_string(pipeline)});
    std::string cmd;
    for (const auto& a : argv) cmd += (cmd.empty() ? "" : " ") + a;
    const ProcResult p = run_capture(argv, timeout_s);
    if (p.timed_out) throw wm::Error(str_cat("redis-benchmark ran past ", timeout_s, " s: ", cmd));
    const std::string want = "\"" + test + "\",\"";
    std::stringstream ss(p.output);
    std::string line;
    while (std::getline(ss, line)) {
      if (line.compare(0, want.size(), want) != 0) continue;
      const size_t end = line.find('"', want.size());
      const double rps = std::atof(line.substr(want.size(), end - want.size()).c_str());
      if (rps > 0) return rps;
    }
    throw wm::Error(str_cat("redis-benchmark gave no ", test, " figure (exit status ", p.status, "): ", cmd,
                            "\n", p.output));
  }
};

// ---------------------------------------------------------------------------------------------

std::vector<double> field(const std::vector<OursRound>& v, double OursRound::*f) {
  std::vector<double> out;
  for (const auto& r : v) out.push_back(r.*f);
  return out;
}

std::vector<double> ratios(const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<double> out;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) out.push_back(b[i] > 0 ? a[i] / b[i] : 0);
  return out;
}

std::string loadavg() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  f >> a >> b >> c;
  return f ? a + " " + b + " " + c : "?";
}

// ---------------------------------------------------------------------------------------------
// The program: its options, one configuration's measurement and report, the run.

struct Options {
  std::string url, json_out, rb_name = "redis-benchmark", dtype_name = "float32";
  std::vector<std::string> shape_names = {"tiny", "qwen2-0.5b"};
  std::vector<int> thread_counts = {1, 8}, batches = {1, 16};
  int tokens = 512, blocks = 64, rounds = 3, deadline_ms = 10000;
  double baseline_s = 2.0;
  bool default_malloc = false;
  bool rb_named = false;  // --redis-benchmark was given
};

void add_options(CLI::App& app, Options& o) {
  app.add_option("--kv-store", o.url, "the Redis server: redis://HOST[:PORT][/DB] or unix:///PATH[?db=N]; a password "
                                      "comes from $WM_KV_STORE_PASSWORD")
      ->required();
  app.add_option("--shapes", o.shape_names,
                 "block shapes, one layer's K and V of --tokens tokens each: tiny (the embedded LLM's layer, its KV "
                 "heads and head size read from " +
                     std::string(kEmbeddedModel) + "/config.json), qwen2-0.5b (configs/qwen2-0.5b.json: 2 KV heads x 64)")
      ->capture_default_str()
      ->check(CLI::IsMember({"tiny", "qwen2-0.5b"}));
  app.add_option("--tokens", o.tokens, "tokens per block")->capture_default_str()->check(CLI::Range(1, 1 << 20));
  app.add_option("--dtype", o.dtype_name, "the K/V dtype")
      ->capture_default_str()
      ->check(CLI::IsMember({"float32", "float16", "bfloat16"}));
  app.add_option("--threads", o.thread_counts,
                 "client thread counts to measure (sharing one store and its connection pool; redis-benchmark "
                 "gets as many clients, -c)")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  app.add_option("--blocks", o.blocks, "blocks each thread puts and gets back per round")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000000));
  app.add_option("--rounds", o.rounds, "rounds per configuration after a warm-up (medians reported)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  app.add_option("--batch", o.batches,
                 "blocks per pipelined put_many / get_many to measure (redis-benchmark -P when above 1)")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  app.add_option("--deadline-ms", o.deadline_ms,
                 "the store's limit per operation; a benchmark wants figures, not misses, so it is longer than a "
                 "program's default")
      ->capture_default_str()
      ->check(CLI::Range(1, 600000));
  app.add_option("--redis-benchmark", o.rb_name,
                 "redis-benchmark to compare with (a name on $PATH or a path); the comparison is skipped with a note "
                 "when the default is not installed")
      ->capture_default_str();
  app.add_option("--baseline-s", o.baseline_s,
                 "seconds each redis-benchmark run aims at (its -n from the previous run's rate); 0: no comparison")
      ->capture_default_str()
      ->check(wm::cli::FiniteRange(0, 3600));
  app.add_flag("--default-malloc", o.default_malloc,
               "leave glibc's allocator as it is (as wm_plan_bench does) instead of wm::keep_freed_memory() (as "
               "wm_render and wm_revisit_bench do): the memory of large values then goes back to the kernel and is "
               "faulted in again");
  app.add_option("--json", o.json_out, "also write every figure (each round's too) as JSON to this file");
}

// The comparison: baseline.exe becomes the redis-benchmark to run, or stays empty; returns the
// note that says why there is no comparison ("" when there is one). redis-benchmark takes a
// password only on its command line (visible to every user in `ps`), so a server with one is
// measured without it. Throws wm::Error when the --redis-benchmark named is not found.
std::string choose_baseline(const Options& o, const std::string& password, Baseline& baseline) {
  if (o.baseline_s <= 0) return "--baseline-s 0: no comparison";
  baseline.exe = find_program(o.rb_name);
  if (baseline.exe.empty() && o.rb_named)
    throw wm::Error(str_cat("--redis-benchmark ", o.rb_name, ": not found or not executable"));
  if (baseline.exe.empty()) return "redis-benchmark is not installed (Debian: redis-tools): no comparison";
  if (!password.empty()) {
    baseline.exe.clear();
    return "the server needs a password and redis-benchmark takes it only on its command line: no comparison";
  }
  return "";
}

// Each of nt threads' blocks of shape sh: random K/V, its own identities (made here: the
// generator is not the threads' to share).
std::vector<ThreadBlocks> make_blocks(wm::RemoteStore& store, const Shape& sh, int nt, const Options& o,
                                      at::ScalarType dtype) {
  std::vector<ThreadBlocks> data(nt);
  at::Tensor pos = at::arange(o.tokens, at::kLong).unsqueeze(1);
  for (int t = 0; t < nt; ++t)
    for (int i = 0; i < o.blocks; ++i) {
      const std::string id = str_cat("bench:", sh.name, ":", t, ":", i);
      std::vector<at::Tensor> k = {at::randn({sh.kv_heads, o.tokens, sh.head_dim}).to(dtype)};
      std::vector<at::Tensor> v = {at::randn({sh.kv_heads, o.tokens, sh.head_dim}).to(dtype)};
      data[t].blocks.push_back(wm::make_block(id, k, v, pos));
      data[t].blocks.back().meta.kind = "kv";
      data[t].ids.push_back(id);
      data[t].keys.push_back(store.key_for_id(id));
    }
  return data;
}

// Decoding `sample` alone, on one thread: its CPU time in seconds, the median of 15 after 3 to
// warm up.
double decode_cpu_s(const std::string& sample) {
  std::vector<double> dec;
  for (int i = 0; i < 18; ++i) {
    const double c0 = thread_cpu_s();
    wm::Block b = wm::decode_block(sample.data(), sample.size(), "sample");
    if (i >= 3) dec.push_back(thread_cpu_s() - c0);
  }
  return median(dec);
}

// One configuration: a shape's blocks, threads and blocks per batch.
struct Config {
  const Shape& sh;
  int nt = 0, batch = 0;
  size_t raw_bytes = 0;     // a block's tensors
  int64_t value_bytes = 0;  // a block encoded
  double decode_s = 0;      // decoding one block alone, CPU seconds
};

// A configuration's rounds: ours, and redis-benchmark's (requests/s and requests) when compared.
struct Measured {
  std::vector<OursRound> ours;
  std::vector<double> rb_set, rb_get;
  std::vector<int64_t> rb_set_n, rb_get_n;
};

// A warm-up, then o.rounds rounds of ours, each followed by redis-benchmark's SET and GET when
// baseline is given (its -n from the previous run's rate, after a calibration run); the
// configuration's keys are deleted after. `what` names the configuration on the progress line.
Measured measure(wm::RemoteStore& store, const std::vector<ThreadBlocks>& data, const Config& c, const Options& o,
                 const Baseline* baseline, KeysCleanup& cleanup, wm::cli::ProgressLine& progress,
                 const std::string& what) {
  progress.show(false, "%s: warm-up", what.c_str());
  run_ours(store, data, c.batch, o.tokens);  // warm-up: connections, the server's memory
  const int64_t min_req = static_cast<int64_t>(c.nt) * c.batch * 4;
  double set_rps = 0, get_rps = 0;
  const double rb_timeout = 120 + 20 * o.baseline_s;
  if (baseline) {  // calibration for -n
    const int64_t n0 = std::max<int64_t>(min_req, 200);
    set_rps = baseline->run("SET", c.value_bytes, c.nt, c.batch, n0, rb_timeout);
    get_rps = baseline->run("GET", c.value_bytes, c.nt, c.batch, n0, rb_timeout);
  }
  Measured m;
  for (int r = 0; r < o.rounds; ++r) {
    m.ours.push_back(run_ours(store, data, c.batch, o.tokens));
    if (baseline) {
      const int64_t n_set = std::max<int64_t>(min_req, static_cast<int64_t>(o.baseline_s * set_rps));
      set_rps = baseline->run("SET", c.value_bytes, c.nt, c.batch, n_set, rb_timeout);
      const int64_t n_get = std::max<int64_t>(min_req, static_cast<int64_t>(o.baseline_s * get_rps));
      get_rps = baseline->run("GET", c.value_bytes, c.nt, c.batch, n_get, rb_timeout);
      m.rb_set.push_back(set_rps), m.rb_get.push_back(get_rps);
      m.rb_set_n.push_back(n_set), m.rb_get_n.push_back(n_get);
    }
    progress.show(false, "%s: round %d/%d: put %.0f blocks/s, get %.0f blocks/s%s", what.c_str(), r + 1, o.rounds,
                  m.ours.back().put_blocks_per_s, m.ours.back().get_blocks_per_s,
                  baseline ? str_cat("; SET ", static_cast<int64_t>(set_rps), "/s, GET ",
                                     static_cast<int64_t>(get_rps), "/s").c_str()
                           : "");
  }
  cleanup.admin->delete_matching(cleanup.pattern);  // this configuration's keys and counters
  return m;
}

// redis-benchmark's figures of a configuration, and ours over theirs, as JSON.
void add_baseline_json(nlohmann::json& j, const Config& c, const Measured& m, const std::vector<double>& put_bps,
                       const std::vector<double>& get_bps) {
  const double vmib = c.value_bytes / kMiB;
  j["redis_benchmark"] = {
      {"set",
       {{"requests_per_s", median(m.rb_set)},
        {"mib_per_s", median(m.rb_set) * vmib},
        {"rounds_requests_per_s", m.rb_set},
        {"rounds_requests", m.rb_set_n}}},
      {"get",
       {{"requests_per_s", median(m.rb_get)},
        {"mib_per_s", median(m.rb_get) * vmib},
        {"rounds_requests_per_s", m.rb_get},
        {"rounds_requests", m.rb_get_n}}},
      {"clients", c.nt},
      {"pipeline", c.batch}};
  j["ratio"] = {{"put_over_set", median(ratios(put_bps, m.rb_set))},
                {"get_over_get", median(ratios(get_bps, m.rb_get))},
                {"rounds_put_over_set", ratios(put_bps, m.rb_set)},
                {"rounds_get_over_get", ratios(get_bps, m.rb_get)}};
}

// Prints a configuration's two rows (put, get) and returns its figures as JSON.
nlohmann::json report(const Config& c, const Options& o, const Measured& m, bool with_baseline) {
  const auto put_bps = field(m.ours, &OursRound::put_blocks_per_s);
  const auto get_bps = field(m.ours, &OursRound::get_blocks_per_s);
  const double put_med = median(put_bps), get_med = median(get_bps);
  const double n_round = static_cast<double>(c.nt) * o.blocks;
  std::vector<double> enc_shares, dec_shares, put_us, get_us;
  for (const auto& r : m.ours) {
    enc_shares.push_back(r.put_cpu_s > 0 ? r.encode_cpu_s / r.put_cpu_s : 0);
    dec_shares.push_back(r.get_cpu_s > 0 ? std::min(1.0, n_round * c.decode_s / r.get_cpu_s) : 0);
    put_us.push_back(1e6 * r.put_cpu_s / n_round);
    get_us.push_back(1e6 * r.get_cpu_s / n_round);
  }
  const double enc_share = median(enc_shares), dec_share = median(dec_shares);
  const double vmib = c.value_bytes / kMiB;
  auto row = [&](const char* op, double bps, double us, double share, const std::vector<double>& rb,
                 const std::vector<double>& mine) {
    std::printf("%-10s %9lld %4d %5d %4s | %10.0f %9.1f %7.0f %5.0f%% | ", c.sh.name.c_str(),
                static_cast<long long>(c.value_bytes), c.nt, c.batch, op, bps, bps * vmib, us, 100 * share);
    if (with_baseline)
      std::printf("%10.0f %9.1f | %6.2f\n", median(rb), median(rb) * vmib, median(ratios(mine, rb)));
    else
      std::printf("%10s %9s | %6s\n", "-", "-", "-");
  };
  row("put", put_med, median(put_us), enc_share, m.rb_set, put_bps);
  row("get", get_med, median(get_us), dec_share, m.rb_get, get_bps);
  std::fflush(stdout);

  nlohmann::json j;
  j["shape"] = c.sh.name;
  j["shape_source"] = c.sh.source;
  j["kv_heads"] = c.sh.kv_heads;
  j["head_dim"] = c.sh.head_dim;
  j["tokens"] = o.tokens;
  j["dtype"] = o.dtype_name;
  j["block_bytes"] = c.raw_bytes;
  j["value_bytes"] = c.value_bytes;
  j["threads"] = c.nt;
  j["batch"] = c.batch;
  j["blocks_per_round"] = static_cast<int64_t>(c.nt) * o.blocks;
  j["put"] = {{"blocks_per_s", put_med},
              {"mib_per_s", median(field(m.ours, &OursRound::put_mib_per_s))},
              {"client_cpu_us_per_block", median(put_us)},
              {"encode_share_of_cpu", enc_share},
              {"rounds_blocks_per_s", put_bps},
              {"rounds_s", field(m.ours, &OursRound::put_s)}};
  j["get"] = {{"blocks_per_s", get_med},
              {"mib_per_s", median(field(m.ours, &OursRound::get_mib_per_s))},
              {"client_cpu_us_per_block", median(get_us)},
              {"decode_share_of_cpu_estimated", dec_share},
              {"decode_cpu_s_per_block_alone", c.decode_s},
              {"rounds_blocks_per_s", get_bps},
              {"rounds_s", field(m.ours, &OursRound::get_s)}};
  if (with_baseline) add_baseline_json(j, c, m, put_bps, get_bps);
  return j;
}

// The run's settings, as the table's heading prints them and as the JSON's top level.
struct RunInfo {
  std::string redis_version, ns, load_before, baseline_note;
  const Baseline* baseline = nullptr;  // null: no comparison
};

// Prints the heading of the table.
void print_heading(const Options& o, const RunInfo& info) {
  std::printf("wm_bench_kv_store: %s (redis-server %s), %u cores, load average %s; %d blocks per thread per round, "
              "median of %d rounds after a warm-up; %s; %s%s\n",
              o.url.c_str(), info.redis_version.c_str(), std::thread::hardware_concurrency(), info.load_before.c_str(),
              o.blocks, o.rounds, o.default_malloc ? "glibc's default malloc" : "keep_freed_memory",
              info.baseline ? "redis-benchmark: " : "",
              info.baseline ? info.baseline->exe.c_str() : info.baseline_note.c_str());
  std::printf("put = encode + put_many, get = get_many + decode; ratio = ours blocks/s / redis-benchmark requests/s "
              "(median of the rounds' ratios); cpu = the client threads' CPU time per block (user + system); codec = "
              "encode's share of it (measured), decode's (estimated from decoding alone)\n\n");
  std::printf("%-10s %9s %4s %5s %4s | %10s %9s %7s %6s | %10s %9s | %6s\n", "shape", "value B", "thr", "batch",
              "op", "blocks/s", "MiB/s", "cpu us", "codec", "r-b req/s", "MiB/s", "ratio");
  std::fflush(stdout);
}

// The JSON's top level before the configurations.
nlohmann::json run_json(const Options& o, const RunInfo& info) {
  nlohmann::json out;
  out["program"] = "wm_bench_kv_store";
  out["url"] = o.url;
  out["redis_version"] = info.redis_version;
  out["namespace"] = info.ns;
  out["tokens"] = o.tokens;
  out["dtype"] = o.dtype_name;
  out["blocks_per_thread"] = o.blocks;
  out["rounds"] = o.rounds;
  out["deadline_ms"] = o.deadline_ms;
  out["keep_freed_memory"] = !o.default_malloc;
  out["cores"] = std::thread::hardware_concurrency();
  out["load_average_before"] = info.load_before;
  out["redis_benchmark"] = info.baseline ? nlohmann::json(info.baseline->exe) : nlohmann::json(nullptr);
  if (!info.baseline_note.empty()) out["baseline_note"] = info.baseline_note;
  out["configs"] = nlohmann::json::array();
  return out;
}

// Every configuration (shapes x threads x batches), its rows printed and its JSON appended to
// out["configs"].
void run_configs(wm::RemoteStore& store, const Options& o, const std::vector<Shape>& shapes, at::ScalarType dtype,
                 const RunInfo& info, KeysCleanup& cleanup, nlohmann::json& out) {
  wm::cli::ProgressLine progress(10);
  const int n_configs = static_cast<int>(shapes.size() * o.thread_counts.size() * o.batches.size());
  int config_no = 0;
  for (const Shape& sh : shapes)
    for (int nt : o.thread_counts) {
      const std::vector<ThreadBlocks> data = make_blocks(store, sh, nt, o, dtype);
      const std::string sample = store.encode(data[0].blocks[0]);
      Config c{sh, nt, 0, data[0].blocks[0].nbytes(), static_cast<int64_t>(sample.size()), decode_cpu_s(sample)};
      for (int batch : o.batches) {
        ++config_no;
        c.batch = batch;
        const std::string what = str_cat("wm_bench_kv_store: [", config_no, "/", n_configs, "] ", sh.name, ", ", nt,
                                         nt == 1 ? " thread" : " threads", ", batch ", batch);
        const Measured m = measure(store, data, c, o, info.baseline, cleanup, progress, what);
        out["configs"].push_back(report(c, o, m, info.baseline != nullptr));
      }
    }
  progress.show(true, "wm_bench_kv_store: %d configurations done", n_configs);
  progress.finish();
}

void run(const Options& o) {
  wm::RemoteEndpoint ep;
  try {
    ep = wm::parse_store_url(o.url);
  } catch (const wm::Error& e) {
    throw wm::Error(str_cat("--kv-store: ", e.what()));
  }
  std::vector<Shape> shapes;
  for (const auto& n : o.shape_names) shapes.push_back(shape_named(n));
  const at::ScalarType dtype = wm::parse_compute_dtype(o.dtype_name);
  std::unique_ptr<wm::cli::OutputFile> json_file;  // opened first: a bad path fails before the work
  if (!o.json_out.empty()) json_file = std::make_unique<wm::cli::OutputFile>(o.json_out);

  const char* pw = std::getenv("WM_KV_STORE_PASSWORD");
  const std::string password = pw ? pw : "";
  Admin admin(ep, password);
  RunInfo info;
  info.redis_version = admin.version();
  Baseline baseline;
  baseline.ep = ep;
  info.baseline_note = choose_baseline(o, password, baseline);
  if (!baseline.exe.empty()) info.baseline = &baseline;

  at::set_num_threads(1);  // the client threads are the parallelism; encode/decode are copies
  if (!o.default_malloc) wm::keep_freed_memory();  // blocks come and go without mmap/munmap each time
  info.ns = str_cat("bench-", ::getpid());
  KeysCleanup cleanup;
  cleanup.admin = &admin;
  cleanup.pattern = str_cat("wm:", info.ns, ":*");
  const std::string rb_key = "key:__rand_int__";  // redis-benchmark's SET/GET key without -r
  if (info.baseline && admin.command({"EXISTS", rb_key}) == "0") cleanup.also.push_back(rb_key);

  wm::RemoteConfig rc;
  rc.url = o.url;
  rc.ns = info.ns;
  rc.deadline_ms = o.deadline_ms;
  rc.flush_ms = 0;
  rc.log = [](const std::string& m) { std::cerr << "wm_bench_kv_store: store: " << m << "\n"; };
  wm::RemoteStore store(rc);
  if (!store.available()) throw wm::Error(str_cat("--kv-store ", o.url, ": the store could not connect"));

  info.load_before = loadavg();
  print_heading(o, info);
  nlohmann::json out = run_json(o, info);
  run_configs(store, o, shapes, dtype, info, cleanup, out);
  out["store_stats"] = store.stats_json();
  out["load_average_after"] = loadavg();
  out["keys_deleted_at_end"] = cleanup.run();
  if (!info.baseline_note.empty()) std::printf("\nnote: %s\n", info.baseline_note.c_str());
  if (info.baseline && std::any_of(o.batches.begin(), o.batches.end(), [](int b) { return b > 1; }))
    std::printf("\nnote: with -P and values this large redis-benchmark can be bound by its own client (7.0.15's "
                "write path copies the unwritten rest of a pipeline on every partial write): read its SET figure "
                "with a batch above 1 as its client's limit, not the server's\n");
  std::printf("\nload average before %s, after %s\n", info.load_before.c_str(), loadavg().c_str());
  if (json_file) {
    json_file->stream() << out.dump(2) << "\n";
    json_file->commit();
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "wm_bench_kv_store: throughput of the remote KV tier (runtime/remote_store.h): blocks/s and MiB/s for put "
      "(encode + put_many) and get (get_many + decode) by block shape, client threads and pipelining, next to "
      "redis-benchmark's SET and GET of values of the same size on the same server, run interleaved round by "
      "round. Start a redis-server of its own for it (a Unix socket, no persistence): every figure is this "
      "machine's, and the keys it writes (wm:bench-<pid>:*) are deleted at the end"};
  Options o;
  add_options(app, o);
  CLI11_PARSE(app, argc, argv);
  o.rb_named = app.count("--redis-benchmark") > 0;
  wm::cli::remove_temporaries_on_signal();
  try {
    run(o);
  } catch (const std::exception& e) {
    std::cerr << "wm_bench_kv_store: error: " << wm::cli::error_text(e) << "\n";
    return 1;
  }
  return 0;
}

}  // namespace wm_tool_bench_kv_store
