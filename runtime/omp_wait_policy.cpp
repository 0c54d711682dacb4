// The environment every program that links wm_runtime starts its libraries with, set before they
// start: OpenMP's wait policy, and OpenBLAS's kernel set on a CPU its Debian build does not know.
//
// libtorch and OpenBLAS run their parallel regions on libgomp's threads, and libgomp's default
// wait policy spins (GOMP_SPINCOUNT's 300,000 rounds) at the end of every region before it sleeps.
// On a machine whose cores are all busy that spinning takes the core from the thread the region
// waits for, and a chunk of the world model takes many times longer (tools/README.md, "On a
// shared machine"). OMP_WAIT_POLICY=passive makes the threads sleep at once.
//
// OpenBLAS (Debian 12's 0.3.21, built for every x86 kernel set and choosing one when it loads)
// falls back to its oldest kernels, Prescott's SSE3, on an Intel CPU model newer than it knows:
// on a Xeon of the Sapphire/Emerald Rapids generation every float32 matrix product of libtorch
// then ran some 2.4x slower than with the AVX-512 kernels (tools/README.md, "On a shared
// machine"). OPENBLAS_CORETYPE, OpenBLAS's documented override, names the kernel set instead:
// on an Intel CPU whose AVX-512 (F, DQ, CD, BW, VL) the OS has enabled, SkylakeX, or Cooperlake
// when it also has AVX512_BF16; with AVX2 and FMA only, Haswell. These are the sets OpenBLAS
// 0.3.21 itself picks for the Intel models it knows with those features, so a CPU it knows gets
// what it had (a later OpenBLAS that knows Sapphire Rapids would pick its own set there, whose
// float32 kernels are SkylakeX's; what the override loses is its bfloat16 ones, which libtorch
// 1.13 does not call); AMD's CPUs, and any CPU without AVX2, are left to OpenBLAS. A BLAS other
// than OpenBLAS ignores the variable.
//
// libgomp and OpenBLAS read their environment in their constructors, which run before main and
// before any constructor of the executable's own, and neither offers a call to change it
// afterwards. The earliest code of an executable is its .preinit_array, which glibc runs before
// the shared libraries' constructors; but libc's environment is not set up yet there (libc's own
// initialisation sets `environ` from the stack afterwards, so a setenv there is lost). So the
// function below, run from .preinit_array, re-executes the program (by the name it was started
// under when that names the same file, else the file /proc/self/exe names; the same argv) with
// the variables added to its environment: before any library's constructor has run, at the cost
// of the dynamic loader's work twice (0.17 s a start on the quiet 2-core development machine:
// `wm_render --help` 0.43 s -> 0.60 s; tools/README.md). Each variable is added only when the
// user set none of its own: OMP_WAIT_POLICY unless OMP_WAIT_POLICY or GOMP_SPINCOUNT is set (any
// value: that is their choice), OPENBLAS_CORETYPE unless it is set; so the second start, which
// has them, never starts a third. Nothing is done when nothing is to be added, when the program
// cannot be executed again (it then goes on as started), when it was started through the dynamic
// loader (/proc/self/exe is the loader then), and outside glibc on Linux.
//
// A static library's object file is linked only when something refers to one of its symbols:
// runtime/CMakeLists.txt names wm_omp_wait_policy_anchor as undefined in the link of every
// target that links wm_runtime, which pulls this file in. tests/runtime/test_wait_policy.cpp
// checks that the programs and the test binary run passive, that the test binary runs the kernel
// set named here, and the choice itself on a table of CPUs.

#if defined(__linux__)
#include <alloca.h>
#include <limits.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>  // defines __GLIBC__ under glibc
#endif
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <stdint.h>
#endif

extern "C" {
// Referred to by the linker (--undefined) so that this object file is part of every program.
void wm_omp_wait_policy_anchor() {}

// The OpenBLAS kernel set for a CPU described by its CPUID and XCR0 registers ("SkylakeX",
// "Cooperlake", "Haswell"), or null when the choice is left to OpenBLAS (above): max_leaf and
// the vendor words from leaf 0 (EBX, EDX, ECX), leaf 1's ECX, XCR0's low word (read only when
// leaf 1 says OSXSAVE), leaf 7 subleaf 0's EAX (its last subleaf) and EBX, leaf 7 subleaf 1's EAX.
// Pure, for the tests' table of CPUs.
const char* wm_openblas_coretype_from_cpuid(unsigned max_leaf, unsigned vendor_ebx, unsigned vendor_edx,
                                            unsigned vendor_ecx, unsigned leaf1_ecx, unsigned xcr0,
                                            unsigned leaf7_eax, unsigned leaf7_ebx, unsigned leaf7_1_eax) {
  // "GenuineIntel" in EBX, EDX, ECX.
  if (max_leaf < 7 || vendor_ebx != 0x756e6547u || vendor_edx != 0x49656e69u || vendor_ecx != 0x6c65746eu)
    return nullptr;
  const bool fma = leaf1_ecx & (1u << 12), osxsave = leaf1_ecx & (1u << 27), avx = leaf1_ecx & (1u << 28);
  if (!osxsave || !avx || !fma) return nullptr;
  const bool ymm_state = (xcr0 & 0x6u) == 0x6u;    // SSE and AVX state
  const bool zmm_state = (xcr0 & 0xe6u) == 0xe6u;  // and opmask, ZMM0-15 upper, ZMM16-31
  const bool avx2 = leaf7_ebx & (1u << 5);
  const bool avx512 = (leaf7_ebx & (1u << 16)) && (leaf7_ebx & (1u << 17)) && (leaf7_ebx & (1u << 28)) &&
                      (leaf7_ebx & (1u << 30)) && (leaf7_ebx & (1u << 31));  // F, DQ, CD, BW, VL
  if (!ymm_state || !avx2) return nullptr;
  if (!zmm_state || !avx512) return "Haswell";
  const bool bf16 = leaf7_eax >= 1 && (leaf7_1_eax & (1u << 5));  // AVX512_BF16 (subleaf 1 exists)
  return bf16 ? "Cooperlake" : "SkylakeX";
}

// The kernel set this file gives a program on this CPU, or null. Plain CPUID: callable before
// libc is set up.
const char* wm_openblas_coretype_for_cpu() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  unsigned max_leaf = 0, vb = 0, vc = 0, vd = 0;
  if (!__get_cpuid(0, &max_leaf, &vb, &vc, &vd) || max_leaf < 7) return nullptr;
  unsigned a = 0, b = 0, c1 = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c1, &d)) return nullptr;
  uint32_t xcr0 = 0, xcr0_hi = 0;
  if (c1 & (1u << 27)) __asm__ volatile("xgetbv" : "=a"(xcr0), "=d"(xcr0_hi) : "c"(0));  // OSXSAVE: xgetbv exists
  unsigned a7 = 0, b7 = 0, c7 = 0, d7 = 0, a71 = 0, b71 = 0, c71 = 0, d71 = 0;
  __cpuid_count(7, 0, a7, b7, c7, d7);
  if (a7 >= 1) __cpuid_count(7, 1, a71, b71, c71, d71);
  return wm_openblas_coretype_from_cpuid(max_leaf, vb, vd, vc, c1, xcr0, a7, b7, a71);
#else
  return nullptr;
#endif
}
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
void start_environment(int argc, char** argv, char** envp) {
  if (argc < 1 || argv == nullptr || envp == nullptr) return;
  static char passive[] = "OMP_WAIT_POLICY=passive";
  static char coretype[64] = "OPENBLAS_CORETYPE=";
  char* add[2];
  size_t n_add = 0;
  if (!has_variable(envp, "OMP_WAIT_POLICY") && !has_variable(envp, "GOMP_SPINCOUNT")) add[n_add++] = passive;
  if (!has_variable(envp, "OPENBLAS_CORETYPE")) {
    const char* kernels = wm_openblas_coretype_for_cpu();
    if (kernels != nullptr && strlen(kernels) + 19 < sizeof coretype) {
      strcpy(coretype + 18, kernels);
      add[n_add++] = coretype;
    }
  }
  if (n_add == 0) return;
  char exe[PATH_MAX];
  const ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (len <= 0) return;
  exe[len] = '\0';
  const char* base = strrchr(exe, '/');
  base = base ? base + 1 : exe;
  if (strncmp(base, "ld-", 3) == 0 || strncmp(base, "ld.so", 5) == 0) return;  // run by the loader
  size_t count = 0;
  while (envp[count]) ++count;
  char** env = static_cast<char**>(alloca((count + n_add + 1) * sizeof(char*)));
  for (size_t i = 0; i < n_add; ++i) env[i] = add[i];
  for (size_t i = 0; i < count; ++i) env[i + n_add] = envp[i];
  env[count + n_add] = nullptr;
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
    start_environment;
#endif
