// OpenMP's wait policy for every program that links wm_runtime, chosen before the OpenMP runtime
// starts.
//
// libtorch and OpenBLAS run their parallel regions on libgomp's threads, and libgomp's default
// wait policy spins (GOMP_SPINCOUNT's 300,000 rounds) at the end of every region before it sleeps.
// On a machine whose cores are all busy that spinning takes the core from the thread the region
// waits for, and a chunk of the world model takes many times longer (tools/README.md, "On a
// shared machine"). OMP_WAIT_POLICY=passive makes the threads sleep at once.
//
// libgomp reads its environment in its constructor, which runs before main and before any
// constructor of the executable's own, and it offers no call to change the policy afterwards. The
// earliest code of an executable is its .preinit_array, which glibc runs before the shared
// libraries' constructors; but libc's environment is not set up yet there (libc's own
// initialisation sets `environ` from the stack afterwards, so a setenv there is lost). So the
// function below, run from .preinit_array, re-executes the program (by the name it was started
// under when that names the same file, else the file /proc/self/exe names; the same argv) with
// OMP_WAIT_POLICY=passive added to its environment: before any library's constructor has run,
// at the cost of the dynamic loader's work twice (0.17 s a start on the quiet 2-core development
// machine: `wm_render --help` 0.43 s -> 0.60 s; tools/README.md). It does nothing when the user
// set OMP_WAIT_POLICY or GOMP_SPINCOUNT (any value: that is their choice, and the variable set by
// the first start keeps the second from starting a third), when the program cannot be executed
// again (it then goes on with libgomp's default), when it was started through
// the dynamic loader (/proc/self/exe is the loader then), and outside glibc on Linux.
//
// A static library's object file is linked only when something refers to one of its symbols:
// runtime/CMakeLists.txt names wm_omp_wait_policy_anchor as undefined in the link of every
// target that links wm_runtime, which pulls this file in. tests/runtime/test_wait_policy.cpp
// checks the programs and the test binary run passive.

#if defined(__linux__)
#include <alloca.h>
#include <limits.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>  // defines __GLIBC__ under glibc
#endif

extern "C" {
// Referred to by the linker (--undefined) so that this object file is part of every program.
void wm_omp_wait_policy_anchor() {}
}

#if defined(__linux__) && defined(__GLIBC__)
namespace {

bool has_variable(char** envp, const char* name) {
  const size_t n = strlen(name);
  for (char** e = envp; *e; ++e)
    if (strncmp(*e, name, n) == 0 && (*e)[n] == '=') return true;
  return false;
}

// True when `path` names the same file as `exe` (a link to it, or the file itself).
bool same_file(const char* path, const struct stat& exe) {
  struct stat st;
  return stat(path, &st) == 0 && st.st_dev == exe.st_dev && st.st_ino == exe.st_ino;
}

// The path to start again, into `out` (PATH_MAX bytes): the name it was started under when that
// names this executable, so that the process keeps its name (the kernel names a process after the
// file executed, and a program of wm_tools is a link whose name says which program it is):
// argv[0] when it holds a '/', else the first folder of PATH holding argv[0]; else `exe`.
const char* restart_path(const char* argv0, char** envp, const char* exe, char* out) {
  struct stat self;
  if (argv0 == nullptr || stat(exe, &self) != 0) return exe;
  if (strchr(argv0, '/')) return same_file(argv0, self) ? argv0 : exe;
  const char* path = nullptr;
  for (char** e = envp; *e && !path; ++e)
    if (strncmp(*e, "PATH=", 5) == 0) path = *e + 5;
  const size_t name = strlen(argv0);
  while (path && *path) {
    const char* end = strchr(path, ':');
    const size_t dir = end ? static_cast<size_t>(end - path) : strlen(path);
    if (dir > 0 && dir + 1 + name < PATH_MAX) {
      memcpy(out, path, dir);
      out[dir] = '/';
      memcpy(out + dir + 1, argv0, name + 1);
      if (same_file(out, self)) return out;
    }
    path = end ? end + 1 : nullptr;
  }
  return exe;
}

// Called by glibc with main's arguments before any shared library's constructor. Only plain
// system calls and string functions here: malloc, stdio and the environment are not set up yet.
void passive_wait_policy(int argc, char** argv, char** envp) {
  if (argc < 1 || argv == nullptr || envp == nullptr) return;
  if (has_variable(envp, "OMP_WAIT_POLICY") || has_variable(envp, "GOMP_SPINCOUNT")) return;
  char exe[PATH_MAX];
  const ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (len <= 0) return;
  exe[len] = '\0';
  const char* base = strrchr(exe, '/');
  base = base ? base + 1 : exe;
  if (strncmp(base, "ld-", 3) == 0 || strncmp(base, "ld.so", 5) == 0) return;  // run by the loader
  size_t count = 0;
  while (envp[count]) ++count;
  char** env = static_cast<char**>(alloca((count + 2) * sizeof(char*)));
  static char passive[] = "OMP_WAIT_POLICY=passive";
  env[0] = passive;
  for (size_t i = 0; i < count; ++i) env[i + 1] = envp[i];
  env[count + 1] = nullptr;
  // By a path, so that the process keeps its name (through /proc/self/exe it would be "exe");
  // through /proc/self/exe when the file was removed since it started (readlink then names it
  // "... (deleted)").
  char found[PATH_MAX];
  execve(restart_path(argv[0], envp, exe, found), argv, env);
  execve(exe, argv, env);
  execve("/proc/self/exe", argv, env);
  // Not reached unless both failed: go on as started.
}

}  // namespace

// glibc calls the functions of .preinit_array with (argc, argv, envp).
using PreinitFunction = void (*)(int, char**, char**);
__attribute__((used, section(".preinit_array"))) static PreinitFunction wm_omp_wait_policy_preinit =
    passive_wait_policy;
#endif
