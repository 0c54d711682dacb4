#pragma once
// Runs the built programs from tests: where they are, one run with its exit status and its
// stdout/stderr, and a started run that a test can signal. Programs are looked up in the build
// folder of the running wm_tests (build/tests/wm_tests -> build/tools/<name without wm_>/<name>,
// build/viewer/wm_viewer), falling back to WM_BINARY_DIR.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <c10/core/GeneratorImpl.h>
#include <c10/core/GradMode.h>
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "runtime/build_paths.h"
#include "tests/temp_dir.h"  // make_temp_dir
#if WM_TESTS_LINK_PROGRAMS
#include "tools/wm_tools.h"
#endif

namespace wm::testing {

namespace fs = std::filesystem;

// The build folder: two levels above this test binary, else the configured one.
inline fs::path build_dir() {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const fs::path b = exe.parent_path().parent_path();
    if (fs::exists(b / "CMakeCache.txt", ec)) return b;
  }
  return fs::path(WM_BINARY_DIR);
}

// Path of a program ("wm_render" -> build/tools/render/wm_render); empty when it is not built.
inline std::string program_path(const std::string& name) {
  const fs::path b = build_dir();
  const fs::path p = name == "wm_viewer" ? b / "viewer" / name : b / "tools" / name.substr(3) / name;
  std::error_code ec;
  return fs::exists(p, ec) ? p.string() : std::string();
}

inline std::string read_text(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

struct RunResult {
  bool exited = false;  // ended by exit(): code is valid
  int code = -1;
  int signal = 0;        // the signal that ended it, else 0
  bool timed_out = false;
  std::string out, err;
};

// How a run starts.
// - Exec: the program's file is executed (its link in the build folder), a process of its own from
//   its first instruction.
// - Forked: a child of this test process runs the same code through wm_tools' dispatcher
//   (tools/wm_tools.h, linked into the test binary), without executing the file, and so without
//   starting libtorch again: 0.6 s of CPU a start on the 2-core development machine, most of a
//   bad-input case. The child gets what an executed run gets: the same folder, streams and
//   variables; OpenMP at one thread and passive (below, the test process itself must run so);
//   libtorch's generator at its default seed and gradients on; the descriptors an exec would
//   close, closed; caught signals back at their default action. It runs the program with no
//   exception leaving it (one that escapes ends it as an uncaught one ends a program), and leaves
//   by _exit once its streams are flushed, so nothing of this process's exit runs in it.
//   What differs, and is not tested forked: the program's own static destructors and atexit
//   handlers do not run (nor LeakSanitizer, so an ASan build executes every run); its peak memory
//   counts this process's pages; what the test binary registered at its start (a test payload
//   kind of the block store) is registered in the child too; after a backward pass in this
//   process, libtorch refuses one in the child.
//   It falls back to Exec: for a file that is not this build's wm_tools, or when the programs'
//   library (libwm_programs.a) is newer than this binary (its copy of them would be older than
//   wm_tools'); when this process runs more than one thread (a fork copies only the calling one:
//   OpenMP's pool, for one, would be lost); when this process was not started with
//   OMP_NUM_THREADS=1 and OMP_WAIT_POLICY=passive (libgomp read them when it loaded, and the
//   threads a program starts take them: the ctest entries of the suites that fork set them,
//   tests/cmake/add_suites.cmake, wm_forking_suites); and when the caller sets a variable other
//   than those a program reads as it runs (kForkVariables), since a library may have read it
//   when it loaded. Tests of the start itself (the wait policy, the dispatcher) and
//   of signals at their default action, memory limits and peak memory (LlmHardening) use Exec;
//   BadInput.ForkedRunIsTheExecutedRun (tests/cli/bad_input_test.cpp) holds Forked to Exec.
enum class Launch { Exec, Forked };

// The variables a caller may set for a Forked run: read by the programs as they run.
inline const char* const kForkVariables[] = {"TMPDIR", "WM_KV_STORE_PASSWORD", "WM_SERVE_API_KEY"};

// The number of threads of this process (its /proc/self/task entries); 0 when unknown.
inline size_t thread_count() {
  std::error_code ec;
  size_t n = 0;
  for (fs::directory_iterator it("/proc/self/task", ec), end; !ec && it != end; it.increment(ec)) ++n;
  return ec ? 0 : n;
}

// Why this process cannot start a Forked run now (above); empty when it can.
inline std::string forked_runs_refused() {
#if !WM_TESTS_LINK_PROGRAMS
  return "this test binary does not link the programs";
#elif defined(__SANITIZE_ADDRESS__)
  return "an ASan build: LeakSanitizer checks executed runs only";
#else
  const char* threads = std::getenv("OMP_NUM_THREADS");
  const char* policy = std::getenv("OMP_WAIT_POLICY");
  if (threads == nullptr || std::strcmp(threads, "1") != 0 || policy == nullptr || std::strcmp(policy, "passive") != 0 ||
      std::getenv("GOMP_SPINCOUNT") != nullptr)
    return "this process was not started with OMP_NUM_THREADS=1 and OMP_WAIT_POLICY=passive (nor GOMP_SPINCOUNT)";
  if (const size_t n = thread_count(); n != 1) return "this process runs " + std::to_string(n) + " threads";
  return {};
#endif
}

// Whether `argv` with the extra variables `env` can start Forked (above).
inline bool can_fork_program(const std::vector<std::string>& argv,
                             const std::vector<std::pair<std::string, std::string>>& env) {
#if WM_TESTS_LINK_PROGRAMS
  if (argv.empty() || !wm::tools::has_program(argv[0].c_str())) return false;
  std::error_code ec;
  const fs::path exe = fs::canonical(argv[0], ec);
  if (ec || exe != fs::canonical(build_dir() / "tools" / "wm_tools", ec) || ec) return false;
  // This binary's copy of the programs is current when it was linked after the library was last
  // written (a newer wm_tools alone says nothing: the two link in either order).
  const auto library_time = fs::last_write_time(build_dir() / "tools" / "libwm_programs.a", ec);
  if (ec) return false;
  const auto self_time = fs::last_write_time("/proc/self/exe", ec);
  if (ec || library_time > self_time) return false;
  for (const auto& [k, v] : env) {
    bool allowed = false;
    for (const char* name : kForkVariables) allowed = allowed || k == name;
    if (!allowed) return false;
  }
  return forked_runs_refused().empty();
#else
  (void)argv;
  (void)env;
  return false;
#endif
}

// A program started in `cwd` (the source tree, so that its default paths resolve) with
// stdout and stderr into files in `log_dir`, OMP_WAIT_POLICY=passive and one OpenMP thread.
class Started {
 public:
  Started(const std::vector<std::string>& argv, const fs::path& log_dir, const fs::path& cwd,
          const std::vector<std::pair<std::string, std::string>>& env = {}, Launch launch = Launch::Exec)
      : out_(log_dir / ".run.out"), err_(log_dir / ".run.err") {
    // Everything the child needs is built before fork(): after it only async-signal-safe calls
    // (Exec), or this process's code on its one thread (Forked).
    std::vector<std::string> envs = {"OMP_WAIT_POLICY=passive", "OMP_NUM_THREADS=1"};
    for (const auto& [k, v] : env) envs.push_back(k + "=" + v);
    const size_t own = envs.size();
    for (char** e = environ; *e; ++e) {
      const std::string kv = *e, key = kv.substr(0, kv.find('='));
      bool overridden = false;
      for (const auto& x : envs) overridden = overridden || x.compare(0, key.size() + 1, key + "=") == 0;
      if (!overridden) envs.push_back(kv);
    }
    std::vector<char*> args, envp;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    for (const auto& e : envs) envp.push_back(const_cast<char*>(e.c_str()));
    envp.push_back(nullptr);
    const std::string dir = cwd.string(), out = out_.string(), err = err_.string();
    forked_ = launch == Launch::Forked && can_fork_program(argv, env);
    if (forked_) {  // what this process has buffered is not the child's to write
      std::cout.flush();
      std::cerr.flush();
      std::fflush(nullptr);
    }
    pid_ = ::fork();
    if (pid_ == 0) {
      if (::chdir(dir.c_str()) != 0) ::_exit(126);
      const int o = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      const int e = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (o < 0 || e < 0) ::_exit(126);
      ::dup2(o, 1);
      ::dup2(e, 2);
      if (forked_) run_forked(args, envp, own);
      ::execve(args[0], args.data(), envp.data());
      ::_exit(127);
    }
  }
  Started(const Started&) = delete;
  Started& operator=(const Started&) = delete;
  ~Started() {
    if (pid_ > 0 && !reaped_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }

  // Whether the run started Forked (Launch above).
  bool forked() const { return forked_; }

  bool running() {
    if (reaped_ || pid_ <= 0) return false;
    if (::waitpid(pid_, &status_, WNOHANG) == pid_) reaped_ = true;
    return !reaped_;
  }
  void signal(int sig) {
    if (pid_ > 0 && !reaped_) ::kill(pid_, sig);
  }
  // Waits for the end (SIGKILL after timeout_s) and collects the result.
  RunResult wait(double timeout_s) {
    RunResult r;
    const auto t0 = std::chrono::steady_clock::now();
    while (running()) {
      if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > timeout_s) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, &status_, 0);
        reaped_ = true;
        r.timed_out = true;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (reaped_) {
      r.exited = WIFEXITED(status_);
      r.code = r.exited ? WEXITSTATUS(status_) : -1;
      r.signal = WIFSIGNALED(status_) ? WTERMSIG(status_) : 0;
    }
    r.out = read_text(out_);
    r.err = read_text(err_);
    return r;
  }

 private:
  // The child of a Forked start: what an exec would close closed and reset, the variables set,
  // libtorch's state as at a start, the program run, its streams flushed.
  [[noreturn]] static void run_forked(std::vector<char*>& args, std::vector<char*>& envp, size_t own) noexcept {
#if WM_TESTS_LINK_PROGRAMS
    // What an exec would close: this process's close-on-exec descriptors (a client's socket to
    // an earlier server, an open file), which the child would otherwise hold open.
    std::vector<int> cloexec;
    if (DIR* d = ::opendir("/proc/self/fd")) {
      while (const dirent* e = ::readdir(d)) {
        const int fd = std::atoi(e->d_name);
        if (fd > 2 && fd != ::dirfd(d) && (::fcntl(fd, F_GETFD) & FD_CLOEXEC)) cloexec.push_back(fd);
      }
      ::closedir(d);
    }
    for (int fd : cloexec) ::close(fd);
    // What an exec does to signals: a caught one goes back to its default action (an ignored one
    // stays ignored, the mask is kept, as through an exec).
    for (int sig = 1; sig < NSIG; ++sig) {
      struct sigaction old {};
      if (::sigaction(sig, nullptr, &old) != 0) continue;
      const bool caught = (old.sa_flags & SA_SIGINFO) ? old.sa_sigaction != nullptr
                                                      : old.sa_handler != SIG_DFL && old.sa_handler != SIG_IGN;
      if (!caught) continue;
      struct sigaction dfl {};
      dfl.sa_handler = SIG_DFL;
      ::sigaction(sig, &dfl, nullptr);
    }
    for (size_t i = 0; i < own; ++i) ::putenv(envp[i]);
    at::set_num_threads(1);
    // libtorch's process state as a fresh start has it, whatever this process did before: the
    // default generator at its default seed, gradients on.
    {
      auto gen = at::detail::getDefaultCPUGenerator();
      std::lock_guard<std::mutex> lock(gen.mutex());
      gen.set_current_seed(c10::default_rng_seed_val);
    }
    at::GradMode::set_enabled(true);
    const int code = wm::tools::run(static_cast<int>(args.size()) - 1, args.data());
    std::cout.flush();
    std::cerr.flush();
    std::fflush(nullptr);
    ::_exit(code & 0xff);
#else
    (void)args;
    (void)envp;
    (void)own;
    ::_exit(127);
#endif
  }

  fs::path out_, err_;
  bool forked_ = false;
  pid_t pid_ = -1;
  int status_ = 0;
  bool reaped_ = false;
};

// Runs a program to its end (at most timeout_s).
inline RunResult run_program(const std::vector<std::string>& argv, const fs::path& log_dir, const fs::path& cwd,
                             double timeout_s = 60, Launch launch = Launch::Exec) {
  Started s(argv, log_dir, cwd, {}, launch);
  return s.wait(timeout_s);
}

}  // namespace wm::testing
