#pragma once
// Runs the built programs from tests: where they are, one run with its exit status and its
// stdout/stderr, and a started run that a test can signal. Programs are looked up in the build
// folder of the running wm_tests (build/tests/wm_tests -> build/tools/<name without wm_>/<name>,
// build/viewer/wm_viewer), falling back to WM_BINARY_DIR.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "runtime/build_paths.h"

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

// A new folder under the system's temporary folder, made for the caller alone by mkdtemp (a name
// no one had, mode 0700), so that removing it afterwards removes only what the test put there.
// Throws when it cannot be made.
inline fs::path make_temp_dir(const std::string& prefix) {
  std::string name = (fs::temp_directory_path() / (prefix + "XXXXXX")).string();
  if (::mkdtemp(name.data()) == nullptr)
    throw std::runtime_error("cannot make a folder " + name + ": " + std::strerror(errno));
  return fs::path(name);
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

// A program started in `cwd` (the source tree, so that its default paths resolve) with
// stdout and stderr into files in `log_dir`, OMP_WAIT_POLICY=passive and one OpenMP thread.
class Started {
 public:
  Started(const std::vector<std::string>& argv, const fs::path& log_dir, const fs::path& cwd,
          const std::vector<std::pair<std::string, std::string>>& env = {})
      : out_(log_dir / ".run.out"), err_(log_dir / ".run.err") {
    // Everything the child needs is built before fork(): after it only async-signal-safe calls.
    std::vector<std::string> envs = {"OMP_WAIT_POLICY=passive", "OMP_NUM_THREADS=1"};
    for (const auto& [k, v] : env) envs.push_back(k + "=" + v);
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
    pid_ = ::fork();
    if (pid_ == 0) {
      if (::chdir(dir.c_str()) != 0) ::_exit(126);
      const int o = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      const int e = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (o < 0 || e < 0) ::_exit(126);
      ::dup2(o, 1);
      ::dup2(e, 2);
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
  fs::path out_, err_;
  pid_t pid_ = -1;
  int status_ = 0;
  bool reaped_ = false;
};

// Runs a program to its end (at most timeout_s).
inline RunResult run_program(const std::vector<std::string>& argv, const fs::path& log_dir, const fs::path& cwd,
                             double timeout_s = 60) {
  Started s(argv, log_dir, cwd);
  return s.wait(timeout_s);
}

}  // namespace wm::testing
