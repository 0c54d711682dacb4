// The LLM programs (wm_llm, wm_llm_bench, wm_plan_bench, wm_bench_llm, wm_llm_train) against
// careless and hostile inputs: a signal removes only what the run made (never a user's file in a
// folder it was given), two outputs on one file and an output on an input are refused before any
// work, a config that disagrees with its checkpoint fails before the model is allocated, prompts
// are bounded, spill files go with the run and earlier runs' are reported, SIGPIPE leaves no
// temporary file, impossible values are refused by name, libtorch's internals never reach the
// user, messages say what is wrong, and a failed run removes the folders it created. Programs
// that are not built are skipped, with the reason.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/build_paths.h"
#include "tests/cli/program_runner.h"
#include "tests/temp_dir.h"
#include "tools/cli/output_file.h"

namespace wm::testing {
// Named, not anonymous: in the unity build this file shares a unit with suites whose helpers
// have the same names (kVocab, positions(), ...).
namespace llm_hardening_test {

const char* const kTraceMarks[] = {"Exception raised from", "terminate called", "frame #", "what():"};

// How a child runs: stdin from /dev/null; stdout to a file, or into a pipe whose reader is gone.
struct Spawn {
  std::vector<std::string> argv;
  fs::path cwd = WM_SOURCE_DIR;
  bool stdout_broken_pipe = false;
  uint64_t address_space = 0;  // RLIMIT_AS when > 0
};

struct Outcome {
  RunResult r;
  long max_rss_kib = 0;
};

// A started child; wait() collects its status, output and peak memory (wait4).
class Child {
 public:
  Child(const Spawn& s, const fs::path& log_dir) : out_(log_dir / ".child.out"), err_(log_dir / ".child.err") {
    std::vector<std::string> envs = {"OMP_WAIT_POLICY=passive", "OMP_NUM_THREADS=1"};
    for (char** e = environ; *e; ++e) {
      const std::string kv = *e;
      if (kv.rfind("OMP_", 0) != 0) envs.push_back(kv);
    }
    std::vector<char*> args, envp;
    for (const auto& a : s.argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    for (const auto& e : envs) envp.push_back(const_cast<char*>(e.c_str()));
    envp.push_back(nullptr);
    int pipefd[2] = {-1, -1};
    if (s.stdout_broken_pipe && ::pipe(pipefd) != 0) ADD_FAILURE() << "pipe() failed";
    const std::string dir = s.cwd.string(), out = out_.string(), err = err_.string();
    const uint64_t as = s.address_space;
    pid_ = ::fork();
    if (pid_ == 0) {
      if (::chdir(dir.c_str()) != 0) ::_exit(126);
      const int in = ::open("/dev/null", O_RDONLY);
      const int o = s.stdout_broken_pipe ? pipefd[1] : ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      const int e = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (in < 0 || o < 0 || e < 0) ::_exit(126);
      if (s.stdout_broken_pipe) ::close(pipefd[0]);  // no reader: the first write meets EPIPE
      ::dup2(in, 0);
      ::dup2(o, 1);
      ::dup2(e, 2);
      // The signals the tests send start at their default action, also where this test runs
      // with them ignored (a shell's background job ignores SIGINT; the program keeps an ignored
      // signal ignored, and a SIGINT would then be waited on for 30 s and the test fail).
      struct sigaction dfl {};
      dfl.sa_handler = SIG_DFL;
      for (int sig : {SIGPIPE, SIGINT, SIGTERM, SIGHUP}) ::sigaction(sig, &dfl, nullptr);
      if (as > 0) {
        struct rlimit rl {as, as};
        ::setrlimit(RLIMIT_AS, &rl);
      }
      ::execve(args[0], args.data(), envp.data());
      ::_exit(127);
    }
    if (s.stdout_broken_pipe) ::close(pipefd[0]), ::close(pipefd[1]);
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  ~Child() {
    if (pid_ > 0 && !reaped_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  bool running() {
    if (reaped_ || pid_ <= 0) return false;
    struct rusage ru {};
    if (::wait4(pid_, &status_, WNOHANG, &ru) == pid_) reaped_ = true, max_rss_ = ru.ru_maxrss;
    return !reaped_;
  }
  void signal(int sig) {
    if (pid_ > 0 && !reaped_) ::kill(pid_, sig);
  }
  std::string err_so_far() const { return read_text(err_); }
  Outcome wait(double timeout_s) {
    Outcome o;
    const auto t0 = std::chrono::steady_clock::now();
    while (running()) {
      if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > timeout_s) {
        ::kill(pid_, SIGKILL);
        struct rusage ru {};
        ::wait4(pid_, &status_, 0, &ru);
        reaped_ = true;
        o.r.timed_out = true;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    o.r.exited = WIFEXITED(status_);
    o.r.code = o.r.exited ? WEXITSTATUS(status_) : -1;
    o.r.signal = WIFSIGNALED(status_) ? WTERMSIG(status_) : 0;
    o.r.out = read_text(out_);
    o.r.err = read_text(err_);
    o.max_rss_kib = max_rss_;
    return o;
  }

 private:
  fs::path out_, err_;
  pid_t pid_ = -1;
  int status_ = 0;
  bool reaped_ = false;
  long max_rss_ = 0;
};

// Every file under `dir` (recursively), as paths relative to it.
std::vector<std::string> tree(const fs::path& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec))
    out.push_back(fs::relative(it->path(), dir).string());
  std::sort(out.begin(), out.end());
  return out;
}

bool has_line(const std::string& text, const std::vector<std::string>& words) {
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    bool all = true;
    for (const auto& w : words) all = all && line.find(w) != std::string::npos;
    if (all) return true;
  }
  return false;
}

class LlmHardening : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = make_temp_dir(std::string("wm_llm_hard_") + info->name() + "_");
    src_ = WM_SOURCE_DIR;
    model_ = (src_ / "assets/models/tiny-llm").string();
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  // The program's path; skips the test when it is not built.
  std::string exe(const std::string& name) {
    const std::string p = program_path(name);
    if (p.empty()) ADD_FAILURE() << name << " is not built (looked in " << build_dir() << ")";
    return p;
  }
  Outcome run(std::vector<std::string> argv, double timeout_s = 60, Spawn base = {}) {
    base.argv = std::move(argv);
    Child c(base, dir_);
    return c.wait(timeout_s);
  }
  // A copy of the embedded model, to break.
  fs::path model_copy(const std::string& name) {
    const fs::path d = dir_ / name;
    fs::create_directories(d);
    for (const auto& e : fs::directory_iterator(model_)) fs::copy(e.path(), d / e.path().filename());
    return d;
  }
  // A run that must fail well: non-zero exit, a line of stderr holding all of `words`, no trace.
  void expect_refused(const Outcome& o, const std::vector<std::string>& words, const std::string& what) {
    SCOPED_TRACE(what);
    EXPECT_FALSE(o.r.timed_out) << "ran past its time";
    EXPECT_TRUE(o.r.exited) << "ended by signal " << o.r.signal << "\n" << o.r.err;
    EXPECT_NE(o.r.code, 0) << o.r.err;
    std::string shown;
    for (const auto& w : words) shown += " '" + w + "'";
    EXPECT_TRUE(has_line(o.r.err, words)) << "no line of stderr holds" << shown << ":\n" << o.r.err;
    for (const char* mark : kTraceMarks) EXPECT_EQ(o.r.err.find(mark), std::string::npos) << mark << " in:\n" << o.r.err;
  }
  static void write(const fs::path& p, const std::string& text) { std::ofstream(p, std::ios::binary) << text; }

  fs::path dir_, src_;
  std::string model_;
};

// --- 1. A signal removes only what the run made ------------------------------------------------

TEST_F(LlmHardening, PlanBenchSignalLeavesTheUsersFilesInTheSpillFolder) {
  const std::string bin = exe("wm_plan_bench");
  if (bin.empty()) return;
  const fs::path spill = dir_ / "s";
  fs::create_directories(spill / "keep");
  write(spill / "keep/thesis.txt", "precious");
  Spawn s;
  s.argv = {bin, "--policies", "keep", "--spill-dir", spill.string(), "--episodes", "1000", "--threads", "1"};
  Child c(s, dir_);
  const auto t0 = std::chrono::steady_clock::now();
  while (c.running() && c.err_so_far().find("episodes (driver") == std::string::npos &&
         std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60))
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  c.signal(SIGINT);
  const Outcome o = c.wait(30);
  EXPECT_EQ(o.r.signal, SIGINT) << o.r.err;
  ASSERT_TRUE(fs::exists(spill / "keep/thesis.txt")) << "a file the run did not create was removed";
  EXPECT_EQ(read_text(spill / "keep/thesis.txt"), "precious");
  EXPECT_EQ(tree(spill), (std::vector<std::string>{"keep", "keep/thesis.txt"})) << "the run's spill files stayed";
}

// --- 2. Two outputs on one file ----------------------------------------------------------------

TEST_F(LlmHardening, TwoOutputsOnOneFileAreRefusedBeforeAnyWork) {
  const std::string llm = exe("wm_llm"), bench = exe("wm_llm_bench"), plan = exe("wm_plan_bench");
  if (llm.empty() || bench.empty() || plan.empty()) return;
  const std::string x = (dir_ / "x").string();
  fs::create_symlink("x", dir_ / "link");
  expect_refused(run({llm, "-p", "hi", "-n", "2", "--dump-logits", x, "--stats-json", (dir_ / "." / "x").string()}),
                 {"--dump-logits", "--stats-json"}, "wm_llm, X and ./X");
  expect_refused(run({llm, "-p", "hi", "-n", "2", "--dump-logits", x, "--stats-json", (dir_ / "link").string()}),
                 {"--dump-logits", "--stats-json"}, "wm_llm, a link to X");
  // On a copy of the model: the run it would take replaces that copy's config.json.
  const fs::path m = model_copy("model");
  expect_refused(run({llm, "-m", m.string(), "-p", "hi", "-n", "2", "--stats-json", (m / "config.json").string()}),
                 {"--stats-json", "config.json"}, "wm_llm, the model's config.json");
  EXPECT_NE(read_text(m / "config.json").find("\"vocab_size\""), std::string::npos) << "the model's config.json was replaced";
  fs::remove_all(m);
  expect_refused(run({bench, "--tasks", "mqar", "--contexts", "64", "--samples", "1", "--json", x, "--csv", x}),
                 {"--json", "--csv"}, "wm_llm_bench");
  expect_refused(run({plan, "--episodes", "1", "--max-steps", "1", "--policies", "full_recompute", "--memory-tokens",
                      "64", "--json", x, "--csv", (dir_ / "link").string()}),
                 {"--json", "--csv"}, "wm_plan_bench");
  EXPECT_EQ(tree(dir_), (std::vector<std::string>{".child.err", ".child.out", "link"}));
  // Two outputs of one process on one final name get temporary names of their own.
  cli::OutputPath a(x), b(x);
  EXPECT_NE(a.tmp(), b.tmp());
}

// --- 3. Sizes: the checkpoint's shapes before any allocation; bounded random-weight models --------

TEST_F(LlmHardening, ConfigThatDisagreesWithItsCheckpointFailsBeforeAllocating) {
  const std::string llm = exe("wm_llm"), bench = exe("wm_bench_llm");
  if (llm.empty() || bench.empty()) return;
  const fs::path m = model_copy("big_vocab");
  nlohmann::json cfg = nlohmann::json::parse(read_text(m / "config.json"));
  cfg["vocab_size"] = 1 << 22;  // 2 GiB of embeddings beside a 3 MB checkpoint
  write(m / "config.json", cfg.dump());
  const Outcome o = run({llm, "-m", m.string(), "-p", "hi", "-n", "2", "--threads", "1"});
  expect_refused(o, {"model.embed_tokens.weight", "vocab_size 4194304"}, "vocab_size 2^22");
  EXPECT_LT(o.max_rss_kib, 600 * 1024) << "the model was allocated before the shapes were checked";
  // A random-weight model larger than memory: refused naming the fields, no allocator trace.
  const fs::path huge = dir_ / "huge.json";
  cfg = nlohmann::json::parse(read_text(src_ / "configs/qwen2-0.5b.json"));
  cfg["vocab_size"] = 1 << 24;
  cfg["hidden_size"] = 65536;
  cfg["head_dim"] = 64;
  cfg["num_attention_heads"] = 1024;
  cfg["num_key_value_heads"] = 1024;
  write(huge, cfg.dump());
  expect_refused(run({bench, "-m", huge.string(), "--contexts", "64", "--bank-block", "0", "--threads", "1"}),
                 {"vocab_size 16777216", "hidden_size 65536"}, "a 2 TiB random model");
}

// --- 7. Overlapping safetensors offsets ----------------------------------------------------------

TEST_F(LlmHardening, OverlappingTensorBytesAreRefusedNamingBoth) {
  const std::string llm = exe("wm_llm");
  if (llm.empty()) return;
  const fs::path m = model_copy("overlap");
  const std::string file = read_text(m / "model.safetensors");
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; --i) hlen = (hlen << 8) | static_cast<unsigned char>(file[i]);
  nlohmann::json h = nlohmann::json::parse(file.substr(8, hlen));
  ASSERT_EQ(h["model.embed_tokens.weight"]["data_offsets"][0], 0);
  const uint64_t n = h["model.norm.weight"]["data_offsets"][1].get<uint64_t>() -
                     h["model.norm.weight"]["data_offsets"][0].get<uint64_t>();
  h["model.norm.weight"]["data_offsets"] = {64, 64 + n};  // the norm's gains read from embedding rows
  std::string text = h.dump();
  while (text.size() % 8) text.push_back(' ');
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((text.size() >> (8 * i)) & 0xff);
  write(m / "model.safetensors", out + text + file.substr(8 + hlen));
  expect_refused(run({llm, "-m", m.string(), "-p", "hi", "-n", "2", "--threads", "1"}),
                 {"'model.norm.weight'", "'model.embed_tokens.weight'", "overlap"}, "norm inside the embedding");
}

// --- 4. Prompts are bounded; beyond the trained positions a warning, or a refusal ----------------

TEST_F(LlmHardening, PromptsAreBoundedAndLongOnesWarned) {
  const std::string llm = exe("wm_llm");
  if (llm.empty()) return;
  // Under a memory cap: an unbounded read would otherwise take the machine's memory.
  Spawn capped;
  capped.address_space = uint64_t{8} << 30;
  const fs::path big = dir_ / "big.txt";
  write(big, std::string(2 << 20, 'a'));  // 2 MiB: beyond the default --max-prompt-bytes
  expect_refused(run({llm, "-f", big.string(), "-n", "1", "--threads", "1"}, 60, capped),
                 {"--max-prompt-bytes", "big.txt"}, "a 2 MiB prompt file");
  expect_refused(run({llm, "-f", "/dev/zero", "-n", "1", "--threads", "1"}, 60, capped), {"--max-prompt-bytes"},
                 "/dev/zero");
  // ~5.4k tokens against the embedded model's 4096 trained positions (a prefill of 1.3 s of CPU;
  // the 30,000 characters this was, 10.8k tokens, took 2.7 s).
  std::string words;
  for (int i = 0; words.size() < 15000; ++i) words += "The key " + std::to_string(i * 7919 % 1000) + " opens it. ";
  const fs::path longer = dir_ / "long.txt";
  write(longer, words);
  const Outcome warned = run({llm, "-f", longer.string(), "-n", "1", "--threads", "1"}, 120);
  EXPECT_TRUE(warned.r.exited && warned.r.code == 0) << warned.r.err;
  EXPECT_TRUE(has_line(warned.r.err, {"warning", "max_position_embeddings"})) << warned.r.err;
  expect_refused(run({llm, "-f", longer.string(), "-n", "1", "--threads", "1", "--strict-positions"}),
                 {"max_position_embeddings", "--strict-positions"}, "--strict-positions");
}

// --- 5. Spill files go with the run, on a signal too; earlier runs' are reported -----------------

TEST_F(LlmHardening, LlmBenchSpillFilesGoOnSigtermAndStaleOnesAreReported) {
  const std::string bench = exe("wm_llm_bench");
  if (bench.empty()) return;
  const fs::path spill = dir_ / "spill";
  fs::create_directories(spill);
  write(spill / "notes.txt", "mine");
  const std::vector<std::string> args = {bench, "--policies", "evoke", "--budgets", "64", "--tasks", "multifact",
                                         "--contexts", "512", "--bank-host-mib", "0.01", "--spill-dir", spill.string(),
                                         "--threads", "1"};
  auto spill_files = [&] {
    int n = 0;
    for (const auto& f : tree(spill)) n += f.size() > 5 && f.compare(f.size() - 5, 5, ".wmkv") == 0;
    return n;
  };
  {
    Spawn s;
    s.argv = args;
    s.argv.insert(s.argv.end(), {"--samples", "1000"});
    Child c(s, dir_);
    const auto t0 = std::chrono::steady_clock::now();
    while (c.running() && spill_files() == 0 && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60))
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    ASSERT_GT(spill_files(), 0) << "no spill file appeared";
    c.signal(SIGTERM);
    const Outcome o = c.wait(30);
    EXPECT_EQ(o.r.signal, SIGTERM) << o.r.err;
  }
  EXPECT_EQ(tree(spill), std::vector<std::string>{"notes.txt"}) << "spill files were left after SIGTERM";
  // What an earlier run left (a run folder of a process that is gone, a loose spill file) is
  // reported and left alone.
  pid_t gone = 0;
  for (pid_t p = 4000000; p > 3000000 && gone == 0; p -= 7919)
    if (::kill(p, 0) != 0 && errno == ESRCH) gone = p;
  ASSERT_NE(gone, 0);
  const fs::path stale = spill / ("wm_llm_bench." + std::to_string(gone));
  fs::create_directories(stale);
  write(stale / "turn_3-0.wmkv", std::string(4096, 'k'));
  write(spill / "turn_1-0.wmkv", std::string(4096, 'k'));
  std::vector<std::string> again = args;
  again.insert(again.end(), {"--samples", "1"});
  const Outcome o = run(again);
  EXPECT_TRUE(o.r.exited && o.r.code == 0) << o.r.err;
  EXPECT_TRUE(has_line(o.r.err, {"warning", "earlier runs", spill.string()})) << o.r.err;
  EXPECT_TRUE(fs::exists(stale / "turn_3-0.wmkv") && fs::exists(spill / "turn_1-0.wmkv"));
}

// --- 6. SIGPIPE ----------------------------------------------------------------------------------

TEST_F(LlmHardening, ClosedStdoutLeavesNoTemporaryFile) {
  const std::string llm = exe("wm_llm");
  if (llm.empty()) return;
  const fs::path out = dir_ / "out";
  fs::create_directories(out);
  Spawn s;
  s.stdout_broken_pipe = true;
  const Outcome o = run({llm, "-p", "hi", "-n", "64", "--threads", "1", "--stats-json", (out / "s.json").string(),
                         "--dump-logits", (out / "l.npy").string()},
                        60, s);
  EXPECT_FALSE(o.r.timed_out);
  EXPECT_TRUE(o.r.signal == SIGPIPE || (o.r.exited && o.r.code != 0)) << "exit " << o.r.code << "\n" << o.r.err;
  EXPECT_EQ(tree(out), std::vector<std::string>{}) << "outputs or their temporary files were left";
}

// --- 8. Impossible values ------------------------------------------------------------------------

TEST_F(LlmHardening, ImpossibleValuesAreRefusedByName) {
  const std::string llm = exe("wm_llm"), bench = exe("wm_llm_bench"), plan = exe("wm_plan_bench"),
                    bllm = exe("wm_bench_llm");
  if (llm.empty() || bench.empty() || plan.empty() || bllm.empty()) return;
  const std::vector<std::string> small_bench = {bllm, "-m", model_, "--contexts", "64", "--decode-tokens", "1",
                                                "--bank-block", "0", "--threads", "1"};
  auto with = [](std::vector<std::string> a, const std::vector<std::string>& more) {
    a.insert(a.end(), more.begin(), more.end());
    return a;
  };
  expect_refused(run(with(small_bench, {"--policies", "h2o", "--policy-budget", "nan"})), {"--policy-budget"},
                 "--policy-budget nan");
  expect_refused(run(with(small_bench, {"--dtype", "float16"})), {"--dtype", "float16", "CPU"}, "float16 on the CPU");
  expect_refused(run({llm, "-p", "hi", "-n", "1", "--dtype", "float16"}), {"--dtype", "CPU"}, "wm_llm float16");
  expect_refused(run({plan, "--policies", "keep", "--check-layers", "5", "--episodes", "1", "--max-steps", "1",
                      "--memory-tokens", "64", "--threads", "1"}),
                 {"--check-layers", "3 layers"}, "--check-layers 5 on 3 layers");
  expect_refused(run({plan, "--load-mib-per-s", "1e-9", "--policies", "keep", "--episodes", "1", "--max-steps", "1",
                      "--memory-tokens", "64", "--threads", "1"}, 20),
                 {"--load-mib-per-s"}, "--load-mib-per-s 1e-9");
  expect_refused(run({llm, "-p", "hi", "-n", "1", "--policy", "full", "--kv-budget", "8"}), {"--kv-budget", "full"},
                 "--kv-budget with full");
  expect_refused(run({bench, "--policies", "evoke", "--budgets", "64", "--tasks", "multifact", "--contexts", "256",
                      "--samples", "1", "--kind-floor", "bogus:2", "--threads", "1"}),
                 {"--kind-floor", "bogus"}, "an unknown --kind-floor kind");
  for (const char* seed : {"-1", "18446744073709551616"})
    expect_refused(run({llm, "-p", "hi", "-n", "1", "--seed", seed}), {"--seed", seed}, std::string("--seed ") + seed);
}

// --- 9. libtorch's internals never reach the user ------------------------------------------------

TEST_F(LlmHardening, AllocatorAndReaderFailuresAreOneLineNamingTheCause) {
  const std::string bllm = exe("wm_bench_llm"), train = exe("wm_llm_train");
  if (bllm.empty() || train.empty()) return;
  Spawn capped;
  capped.address_space = uint64_t{8} << 30;
  expect_refused(run({bllm, "-m", model_, "--contexts", "4194304", "--decode-tokens", "1", "--bank-block", "0",
                      "--threads", "1"},
                     60, capped),
                 {"--contexts 4194304"}, "--contexts 2^22 under an 8 GiB cap");
  // A damaged optimizer.pt on --resume names the file.
  const fs::path cfg = dir_ / "config.json";
  write(cfg, R"({"model_type": "qwen2", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
    "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16, "max_position_embeddings": 512,
    "tie_word_embeddings": true, "vocab_size": 500})");
  const std::string tok = (src_ / "tests/llmkv/fixtures/tokenizer/cpp_trained.tokenizer.json").string();
  const std::string out = (dir_ / "run").string();
  const std::vector<std::string> common = {train, "-o", out, "--config", cfg.string(), "--tokenizer", tok, "--tasks",
                                           "recall", "--batch-tokens", "128", "--eval-samples", "1", "--threads", "1",
                                           "--warmup", "1"};
  std::vector<std::string> first = common;
  first.insert(first.end(), {"--curriculum", "64:1"});
  const Outcome o1 = run(first, 120);
  ASSERT_TRUE(o1.r.exited && o1.r.code == 0) << o1.r.err;
  const fs::path opt = fs::path(out) / "checkpoint/optimizer.pt";
  ASSERT_TRUE(fs::exists(opt));
  fs::resize_file(opt, 100);
  std::vector<std::string> resume = common;
  resume.insert(resume.end(), {"--curriculum", "64:2", "--resume"});
  expect_refused(run(resume, 120), {"optimizer.pt", "--resume"}, "a damaged optimizer.pt");
}

// --- 10. Messages that say what is wrong ---------------------------------------------------------

TEST_F(LlmHardening, MessagesNameWhatIsWrong) {
  const std::string llm = exe("wm_llm");
  if (llm.empty()) return;
  // Outside the repository the embedded model is found beside the program.
  Spawn elsewhere;
  elsewhere.cwd = dir_;
  const Outcome away = run({llm, "-p", "hi", "-n", "2", "--threads", "1"}, 60, elsewhere);
  EXPECT_TRUE(away.r.exited && away.r.code == 0) << away.r.err;
  expect_refused(run({llm, "-p", "", "-n", "1"}), {"--prompt is empty"}, "-p ''");
  expect_refused(run({llm, "-m", "", "-p", "hi"}), {"--model is empty"}, "-m ''");
  expect_refused(run({llm, "-f", dir_.string(), "-n", "1"}), {dir_.string(), "folder"}, "a prompt file that is a folder");
  const fs::path tokdir = model_copy("tokdir");
  fs::remove(tokdir / "tokenizer.json");
  fs::create_directories(tokdir / "tokenizer.json");
  expect_refused(run({llm, "-m", tokdir.string(), "-p", "hi", "-n", "1"}), {"tokenizer.json", "folder"},
                 "a tokenizer.json that is a folder");
  const fs::path dangling = model_copy("dangling");
  fs::remove(dangling / "model.safetensors");
  fs::create_symlink(dir_ / "nowhere.safetensors", dangling / "model.safetensors");
  expect_refused(run({llm, "-m", dangling.string(), "-p", "hi", "-n", "1"}), {"model.safetensors", "link", "nowhere"},
                 "a dangling model.safetensors link");
  const fs::path eos = model_copy("eos");
  write(eos / "generation_config.json", R"({"eos_token_id": 5000})");
  expect_refused(run({llm, "-m", eos.string(), "-p", "hi", "-n", "1"}), {"generation_config.json", "5000"},
                 "an eos id outside the vocabulary");
  const Outcome neg = run({llm, "-p", "hi", "--stop-token", "-1"});
  expect_refused(neg, {"--stop-token"}, "--stop-token -1");
  EXPECT_LT(neg.r.err.size(), 300u) << neg.r.err;
  const Outcome pyr = run({llm, "-p", "hi", "-n", "1", "--policy", "pyramidkv", "--kv-budget", "1"});
  expect_refused(pyr, {"pyramidkv", "budget"}, "pyramidkv budget 1");
  EXPECT_EQ(pyr.r.err.find("SnapKv"), std::string::npos) << pyr.r.err;
}

// --- 11. A failed run removes the folders it created ---------------------------------------------

TEST_F(LlmHardening, FailedRunsRemoveTheFoldersTheyMade) {
  const std::string bench = exe("wm_llm_bench"), plan = exe("wm_plan_bench"), train = exe("wm_llm_train");
  if (bench.empty() || plan.empty() || train.empty()) return;
  const std::string missing = (dir_ / "missing").string();
  expect_refused(run({bench, "-m", missing, "--plots", (dir_ / "p/q").string()}), {"missing"}, "wm_llm_bench --plots");
  expect_refused(run({bench, "-m", missing, "--bank-host-mib", "1", "--spill-dir", (dir_ / "s/t").string()}),
                 {"missing"}, "wm_llm_bench --spill-dir");
  const fs::path bad = dir_ / "bad.json";
  write(bad, "{\"model_type\": \"qwen2\"}");
  expect_refused(run({plan, "-m", bad.string(), "--plots", (dir_ / "p/q").string(), "--spill-dir",
                      (dir_ / "s/t").string()}),
                 {"bad.json"}, "wm_plan_bench --plots --spill-dir");
  expect_refused(run({train, "--config", bad.string(), "--tokenizer", model_ + "/tokenizer.json", "-o",
                      (dir_ / "o/run").string(), "--threads", "1"}),
                 {"bad.json"}, "wm_llm_train -o");
  EXPECT_EQ(tree(dir_), (std::vector<std::string>{".child.err", ".child.out", "bad.json"}));
}

}  // namespace llm_hardening_test
}  // namespace wm::testing
