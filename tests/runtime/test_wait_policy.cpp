// OpenMP's wait policy (runtime/omp_wait_policy.cpp): every program and this test binary run
// with OMP_WAIT_POLICY=passive when the user set neither OMP_WAIT_POLICY nor GOMP_SPINCOUNT, and
// keep the user's value when they did. The children are started with OMP_DISPLAY_ENV=verbose,
// which makes libgomp print the settings it parsed when it loads (GOMP_SPINCOUNT '0' is passive;
// its default, spinning, also prints OMP_WAIT_POLICY 'PASSIVE', so the spin count is what tells).
#include <gtest/gtest.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "tests/cli/program_runner.h"
#include "tests/temp_dir.h"

extern char** environ;
// runtime/omp_wait_policy.cpp: the OpenBLAS kernel set a program is given on this CPU, or null;
// and the same choice from given CPUID registers.
extern "C" const char* wm_openblas_coretype_for_cpu();
extern "C" const char* wm_openblas_coretype_from_cpuid(unsigned max_leaf, unsigned vendor_ebx, unsigned vendor_edx,
                                                       unsigned vendor_ecx, unsigned leaf1_ecx, unsigned xcr0,
                                                       unsigned leaf7_eax, unsigned leaf7_ebx, unsigned leaf7_1_eax);

namespace wm::test_wait_policy {
namespace {

namespace fs = std::filesystem;

struct Output {
  int status = -1;  // exit code, or -1 when it did not exit
  std::string text;  // stdout and stderr together
};

// Runs argv (the file `file`, argv[0] when empty) with this process's environment less
// OMP_WAIT_POLICY, GOMP_SPINCOUNT and GoogleTest's variables, plus `add` and
// OMP_DISPLAY_ENV=verbose; stdout and stderr go to one file in a folder of its own, read back.
Output run_with(const std::vector<std::string>& argv, const std::vector<std::string>& add,
                const std::string& file = "") {
  std::vector<std::string> envs = add;
  envs.push_back("OMP_DISPLAY_ENV=verbose");
  for (char** e = environ; *e; ++e) {
    const std::string kv = *e, key = kv.substr(0, kv.find('='));
    if (key == "OMP_WAIT_POLICY" || key == "GOMP_SPINCOUNT" || key == "OMP_DISPLAY_ENV" || key == "OPENBLAS_CORETYPE")
      continue;
    if (key.rfind("GTEST_", 0) == 0) continue;  // no sharding or report of this run's in the child
    bool added = false;
    for (const auto& a : add) added = added || a.compare(0, key.size() + 1, key + "=") == 0;
    if (!added) envs.push_back(kv);
  }
  std::vector<char*> args, envp;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  for (const auto& e : envs) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);

  const fs::path dir = wm::testing::make_temp_dir("wm_wait_policy_");
  const fs::path log = dir / "run.out";
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  pid_t pid = -1;
  Output r;
  const int rc = posix_spawn(&pid, file.empty() ? args[0] : file.c_str(), &fa, nullptr, args.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) {
    r.text = "posix_spawn failed: " + std::to_string(rc);
    std::error_code ec;
    fs::remove_all(dir, ec);
    return r;
  }
  // A guard against a child that hangs, not a timing: --help and a test listing end at once.
  int status = 0;
  const auto t0 = std::chrono::steady_clock::now();
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(120)) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.text = wm::testing::read_text(log);
  std::error_code ec;
  fs::remove_all(dir, ec);
  return r;
}

// The spin count libgomp printed ("  GOMP_SPINCOUNT = '0'"), or empty when it printed none.
std::string spin_count(const std::string& text) {
  const std::string key = "GOMP_SPINCOUNT = '";
  const size_t at = text.find(key);
  if (at == std::string::npos) return {};
  const size_t end = text.find('\'', at + key.size());
  return end == std::string::npos ? std::string() : text.substr(at + key.size(), end - at - key.size());
}

// Every program's path that is built: build/tools/*/wm_* and the viewer.
std::vector<std::string> programs() {
  std::vector<std::string> out;
  const fs::path tools = wm::testing::build_dir() / "tools";
  std::error_code ec;
  for (const auto& d : fs::directory_iterator(tools, ec)) {
    const std::string name = "wm_" + d.path().filename().string();
    const fs::path p = d.path() / name;
    if (fs::is_regular_file(p, ec) && ::access(p.c_str(), X_OK) == 0) out.push_back(p.string());
  }
  const std::string viewer = wm::testing::program_path("wm_viewer");
  if (!viewer.empty()) out.push_back(viewer);
  std::sort(out.begin(), out.end());
  return out;
}

// This binary, listing one test and printing the policy it sees (WaitPolicy.DISABLED_Print).
std::vector<std::string> self_print() {
  return {fs::read_symlink("/proc/self/exe").string(), "--gtest_also_run_disabled_tests",
          "--gtest_filter=WaitPolicy.DISABLED_Print"};
}

// A value DISABLED_Print writes ("wait policy seen", "process name").
std::string printed(const std::string& text, const std::string& what) {
  const std::string key = what + ": [";
  const size_t at = text.find(key);
  if (at == std::string::npos) return "(not printed)";
  const size_t end = text.find(']', at + key.size());
  return text.substr(at + key.size(), end - at - key.size());
}

// Run by the tests below in a child of this binary: the OMP_WAIT_POLICY and OPENBLAS_CORETYPE the
// child has, the kernel set OpenBLAS chose (when the BLAS loaded is OpenBLAS), and its process name.
TEST(WaitPolicy, DISABLED_Print) {
  const char* v = std::getenv("OMP_WAIT_POLICY");
  const char* kernels = std::getenv("OPENBLAS_CORETYPE");
  using Corename = char* (*)();
  const auto corename = reinterpret_cast<Corename>(::dlsym(RTLD_DEFAULT, "openblas_get_corename"));
  std::string comm = wm::testing::read_text("/proc/self/comm");
  if (!comm.empty() && comm.back() == '\n') comm.pop_back();
  std::printf("wait policy seen: [%s]\nblas kernels seen: [%s]\nopenblas core: [%s]\nprocess name: [%s]\n",
              v ? v : "(unset)", kernels ? kernels : "(unset)", corename ? corename() : "(not OpenBLAS)", comm.c_str());
}

// This process: started by ctest or by hand without a policy, it runs passive.
TEST(WaitPolicy, TestBinaryHasAPolicy) {
  if (std::getenv("OMP_WAIT_POLICY") == nullptr && std::getenv("GOMP_SPINCOUNT") != nullptr)
    GTEST_SKIP() << "GOMP_SPINCOUNT was set by the user: their choice, no policy added";
  const char* v = std::getenv("OMP_WAIT_POLICY");
  ASSERT_NE(v, nullptr) << "wm_tests started without OMP_WAIT_POLICY and was not given one";
}

TEST(WaitPolicy, TestBinaryStartedWithoutOneRunsPassive) {
  const Output r = run_with(self_print(), {});
  ASSERT_EQ(r.status, 0) << r.text;
  EXPECT_EQ(printed(r.text, "wait policy seen"), "passive") << r.text;
  EXPECT_EQ(spin_count(r.text), "0") << r.text;
  // Started again by its own path: the process keeps its name ("exe" through /proc/self/exe).
  EXPECT_EQ(printed(r.text, "process name"), fs::read_symlink("/proc/self/exe").filename().string().substr(0, 15))
      << r.text;
}

// A new folder of its own (mkdtemp) holding kName, a symbolic link to this test binary (the
// programs of wm_tools are such links); removed with the fixture.
class WaitPolicyLink : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = wm::testing::make_temp_dir("wm_wait_policy_link_");
    fs::create_symlink(fs::read_symlink("/proc/self/exe"), dir_ / kName);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  static constexpr const char* kName = "wm_linked_test";  // under 16 bytes: all of it is the name
  fs::path dir_;
};

// Started through a link by its path, it is started again by that path: the process is named
// after the link, not after the file linked to.
TEST_F(WaitPolicyLink, RestartKeepsTheLinksName) {
  std::vector<std::string> argv = self_print();
  argv[0] = (dir_ / kName).string();
  const Output r = run_with(argv, {});
  ASSERT_EQ(r.status, 0) << r.text;
  EXPECT_EQ(printed(r.text, "wait policy seen"), "passive") << r.text;
  EXPECT_EQ(printed(r.text, "process name"), kName) << r.text;
}

// Started by a bare name found on PATH (as a shell does it), the same.
TEST_F(WaitPolicyLink, RestartFindsTheNameOnPath) {
  std::vector<std::string> argv = self_print();
  argv[0] = kName;
  const Output r = run_with(argv, {"PATH=/nonexistent:" + dir_.string()}, (dir_ / kName).string());
  ASSERT_EQ(r.status, 0) << r.text;
  EXPECT_EQ(printed(r.text, "wait policy seen"), "passive") << r.text;
  EXPECT_EQ(printed(r.text, "process name"), kName) << r.text;
}

// An argv[0] that names another file is not executed: the binary is started again by its own path.
TEST_F(WaitPolicyLink, RestartIgnoresAnArgv0OfAnotherFile) {
  std::vector<std::string> argv = self_print();
  argv[0] = "/bin/true";
  const Output r = run_with(argv, {}, fs::read_symlink("/proc/self/exe").string());
  ASSERT_EQ(r.status, 0) << r.text;
  EXPECT_EQ(printed(r.text, "wait policy seen"), "passive") << r.text;
  EXPECT_EQ(printed(r.text, "process name"), fs::read_symlink("/proc/self/exe").filename().string().substr(0, 15))
      << r.text;
}

// The kernel set by CPUID, against the same features read by GCC's own CPU detection: an Intel
// CPU with AVX-512 F/DQ/CD/BW/VL gets SkylakeX (Cooperlake with AVX512_BF16), one with AVX2 and
// FMA only Haswell, anything else none.
TEST(WaitPolicy, BlasKernelsFollowTheCpusFeatures) {
  const char* got = wm_openblas_coretype_for_cpu();
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  std::string want;
  if (__builtin_cpu_is("intel") && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
                        __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx512bw") &&
                        __builtin_cpu_supports("avx512vl");
    want = !avx512 ? "Haswell" : __builtin_cpu_supports("avx512bf16") ? "Cooperlake" : "SkylakeX";
  }
  EXPECT_EQ(got ? std::string(got) : std::string(), want);
#else
  EXPECT_EQ(got, nullptr);
#endif
}

// The choice on a table of CPUs, by their registers: each feature the rule reads is dropped once,
// so that a wrong bit position or a missing check changes one row's answer.
TEST(WaitPolicy, BlasKernelsOfATableOfCpus) {
  constexpr unsigned kIntel[3] = {0x756e6547u, 0x49656e69u, 0x6c65746eu};  // Genu ineI ntel (EBX EDX ECX)
  constexpr unsigned kAmd[3] = {0x68747541u, 0x69746e65u, 0x444d4163u};    // Auth enti cAMD
  constexpr unsigned kFma = 1u << 12, kOsxsave = 1u << 27, kAvx = 1u << 28, kLeaf1 = kFma | kOsxsave | kAvx;
  constexpr unsigned kAvx2 = 1u << 5, kF = 1u << 16, kDq = 1u << 17, kCd = 1u << 28, kBw = 1u << 30, kVl = 1u << 31;
  constexpr unsigned kAvx512 = kF | kDq | kCd | kBw | kVl, kBf16 = 1u << 5;
  constexpr unsigned kYmm = 0x7u, kZmm = 0xe7u;
  struct Cpu {
    const char* what;
    const unsigned* vendor;
    unsigned max_leaf, leaf1_ecx, xcr0, leaf7_eax, leaf7_ebx, leaf7_1_eax;
    const char* want;  // null: left to OpenBLAS
  };
  const Cpu cpus[] = {
      {"Haswell-class (AVX2, FMA)", kIntel, 0xd, kLeaf1, kYmm, 0, kAvx2, 0, "Haswell"},
      {"Skylake-SP (AVX-512)", kIntel, 0x16, kLeaf1, kZmm, 0, kAvx2 | kAvx512, 0, "SkylakeX"},
      {"Cooper Lake (AVX-512, BF16)", kIntel, 0x1b, kLeaf1, kZmm, 1, kAvx2 | kAvx512, kBf16, "Cooperlake"},
      {"Emerald Rapids (as this project's CI machine)", kIntel, 0x23, kLeaf1, kZmm, 2, kAvx2 | kAvx512, kBf16 | (1u << 4),
       "Cooperlake"},
      {"BF16 bit with no subleaf 1", kIntel, 0x1b, kLeaf1, kZmm, 0, kAvx2 | kAvx512, kBf16, "SkylakeX"},
      {"AVX512_VNNI bit (4) only", kIntel, 0x1b, kLeaf1, kZmm, 1, kAvx2 | kAvx512, 1u << 4, "SkylakeX"},
      {"no VL", kIntel, 0x16, kLeaf1, kZmm, 0, kAvx2 | (kAvx512 & ~kVl), 0, "Haswell"},
      {"no BW", kIntel, 0x16, kLeaf1, kZmm, 0, kAvx2 | (kAvx512 & ~kBw), 0, "Haswell"},
      {"no CD", kIntel, 0x16, kLeaf1, kZmm, 0, kAvx2 | (kAvx512 & ~kCd), 0, "Haswell"},
      {"no DQ", kIntel, 0x16, kLeaf1, kZmm, 0, kAvx2 | (kAvx512 & ~kDq), 0, "Haswell"},
      {"no F", kIntel, 0x16, kLeaf1, kZmm, 0, kAvx2 | (kAvx512 & ~kF), 0, "Haswell"},
      {"AVX-512 the OS has not enabled", kIntel, 0x16, kLeaf1, kYmm, 0, kAvx2 | kAvx512, 0, "Haswell"},
      {"no AVX state enabled", kIntel, 0x16, kLeaf1, 0x3u, 0, kAvx2 | kAvx512, 0, nullptr},
      {"no AVX2", kIntel, 0xd, kLeaf1, kYmm, 0, 0, 0, nullptr},
      {"no FMA", kIntel, 0xd, kLeaf1 & ~kFma, kYmm, 0, kAvx2, 0, nullptr},
      {"no AVX", kIntel, 0xd, kLeaf1 & ~kAvx, kYmm, 0, kAvx2, 0, nullptr},
      {"no OSXSAVE", kIntel, 0xd, kLeaf1 & ~kOsxsave, kYmm, 0, kAvx2, 0, nullptr},
      {"no leaf 7", kIntel, 6, kLeaf1, kZmm, 0, kAvx2 | kAvx512, 0, nullptr},
      {"Zen 4 (AMD, AVX-512)", kAmd, 0x10, kLeaf1, kZmm, 1, kAvx2 | kAvx512, kBf16, nullptr},
  };
  for (const Cpu& c : cpus) {
    const char* got = wm_openblas_coretype_from_cpuid(c.max_leaf, c.vendor[0], c.vendor[1], c.vendor[2], c.leaf1_ecx,
                                                      c.xcr0, c.leaf7_eax, c.leaf7_ebx, c.leaf7_1_eax);
    EXPECT_EQ(got ? std::string(got) : "(none)", c.want ? std::string(c.want) : "(none)") << c.what;
  }
}

// Started without OPENBLAS_CORETYPE on a CPU that gets a kernel set, this binary runs with it, and
// OpenBLAS (when it is the BLAS) uses it; a value of the user's own is kept.
TEST(WaitPolicy, TestBinaryRunsTheCpusBlasKernels) {
  const char* want = wm_openblas_coretype_for_cpu();
  if (want == nullptr) GTEST_SKIP() << "this CPU's BLAS kernels are left to OpenBLAS (not Intel, or no AVX2)";
  Output r = run_with(self_print(), {});
  ASSERT_EQ(r.status, 0) << r.text;
  EXPECT_EQ(printed(r.text, "blas kernels seen"), want) << r.text;
  const std::string core = printed(r.text, "openblas core");
  if (core != "(not OpenBLAS)") EXPECT_EQ(core, want) << r.text;
  EXPECT_EQ(printed(r.text, "wait policy seen"), "passive") << r.text;

  r = run_with(self_print(), {"OPENBLAS_CORETYPE=Nehalem"});
  ASSERT_EQ(r.status, 0) << r.text;
  EXPECT_EQ(printed(r.text, "blas kernels seen"), "Nehalem") << r.text;
  if (core != "(not OpenBLAS)") EXPECT_EQ(printed(r.text, "openblas core"), "Nehalem") << r.text;
  EXPECT_EQ(printed(r.text, "wait policy seen"), "passive") << r.text;

  // Both chosen by the user: started once, as it is.
  r = run_with(self_print(), {"OPENBLAS_CORETYPE=Haswell", "OMP_WAIT_POLICY=active"});
  ASSERT_EQ(r.status, 0) << r.text;
  EXPECT_EQ(printed(r.text, "blas kernels seen"), "Haswell") << r.text;
  EXPECT_EQ(printed(r.text, "wait policy seen"), "active") << r.text;
}

TEST(WaitPolicy, UserValueWinsInTestBinary) {
  Output r = run_with(self_print(), {"OMP_WAIT_POLICY=active"});
  ASSERT_EQ(r.status, 0) << r.text;
  EXPECT_EQ(printed(r.text, "wait policy seen"), "active") << r.text;
  EXPECT_NE(r.text.find("OMP_WAIT_POLICY = 'ACTIVE'"), std::string::npos) << r.text;

  // A spin count of the user's own: no policy is added beside it.
  r = run_with(self_print(), {"GOMP_SPINCOUNT=1234"});
  ASSERT_EQ(r.status, 0) << r.text;
  EXPECT_EQ(printed(r.text, "wait policy seen"), "(unset)") << r.text;
  EXPECT_EQ(spin_count(r.text), "1234") << r.text;
}

// True when the executable at `path` names libtorch among the libraries it needs (its dynamic
// string table holds "libtorch"): such a program runs OpenMP teams.
bool links_libtorch(const std::string& path) {
  return wm::testing::read_text(path).find("libtorch") != std::string::npos;
}

// Every built program that links libtorch runs passive: --help is enough, libgomp prints its
// settings when it loads. (wm_make_suite and wm_render_world do not link libtorch nor run an
// OpenMP team; the latter loads libgomp through OpenCV's BLAS and is not checked.) The policy is
// set by the executable file, so each file is run once, through the first of its names: most
// programs are links to wm_tools (the name a program is started under is the WaitPolicyLink
// tests' matter).
TEST(WaitPolicy, EveryProgramRunsPassive) {
  std::map<std::string, std::string> files;  // executable file -> the first program naming it
  for (const auto& p : programs())
    if (links_libtorch(p)) files.emplace(fs::canonical(p).string(), p);
  if (files.empty()) GTEST_SKIP() << "no program that links libtorch is built beside this test binary";
  std::set<std::string> checked;
  for (const auto& [file, p] : files) {
    const Output r = run_with({p, "--help"}, {});
    EXPECT_EQ(r.status, 0) << p << ":\n" << r.text;
    EXPECT_EQ(spin_count(r.text), "0") << p << " spins, or printed no libgomp settings: its OpenMP wait policy "
                                       << "is not passive\n" << r.text;
    checked.insert(file);
  }
  // The programs named in tools/README.md ("On a shared machine"), when built, were among them.
  for (const char* name : {"wm_render", "wm_serve", "wm_llm", "wm_viewer"}) {
    const std::string p = wm::testing::program_path(name);
    if (p.empty()) continue;
    EXPECT_EQ(checked.count(fs::canonical(p).string()), 1u) << name;
  }
}

TEST(WaitPolicy, UserValueWinsInAProgram) {
  std::string p = wm::testing::program_path("wm_render");
  if (p.empty()) p = wm::testing::program_path("wm_llm");
  if (p.empty()) GTEST_SKIP() << "neither wm_render nor wm_llm is built";
  Output r = run_with({p, "--help"}, {"OMP_WAIT_POLICY=active"});
  ASSERT_EQ(r.status, 0) << r.text;
  EXPECT_NE(r.text.find("OMP_WAIT_POLICY = 'ACTIVE'"), std::string::npos) << r.text;
  EXPECT_NE(spin_count(r.text), "0") << r.text;

  r = run_with({p, "--help"}, {"GOMP_SPINCOUNT=1234"});
  ASSERT_EQ(r.status, 0) << r.text;
  EXPECT_EQ(spin_count(r.text), "1234") << r.text;
}

}  // namespace
}  // namespace wm::test_wait_policy
