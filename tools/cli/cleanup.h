#pragma once
// Temporary outputs that a termination signal must not leave behind. A program that writes
// outputs calls remove_temporaries_on_signal() once, at start; OutputPath, OutputFile,
// OutputFolder (tools/cli/output_file.h) and Mp4Writer register each temporary path for as long
// as it exists. On SIGTERM, SIGINT or SIGHUP the handler removes every registered path (a
// folder: its files, then the folder), restores the signal's default action and raises it again,
// so the program still ends as killed by that signal (exit status 128 + signal in a shell).
// SIGKILL cannot be caught: then only the hidden temporary names remain, never a final name.
//
// Async-signal-safe: a fixed table of C strings claimed with lock-free atomics; the handler calls
// only unlink, rmdir, open, getdents64, close, sigaction, pthread_sigmask and raise.
// Header-only.
#include <fcntl.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>

namespace wm::cli {

namespace detail {

constexpr int kCleanupSlots = 256;
constexpr size_t kCleanupPathMax = 1024;

struct CleanupSlot {
  enum : int { Free = 0, Claimed = 1, Armed = 2 };
  std::atomic<int> state{Free};
  bool folder = false;
  char path[kCleanupPathMax];
};
static_assert(std::atomic<int>::is_always_lock_free, "the signal handler needs lock-free atomics");

inline CleanupSlot g_cleanup_slots[kCleanupSlots];

// Removes the plain files of a folder, then the folder (one level: temporary folders hold files
// only). Async-signal-safe.
inline void remove_folder_now(const char* path) {
  const int fd = ::open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    alignas(8) char buf[4096];
    // Unlinking while reading may make a file system skip entries: read again until a pass
    // removes nothing.
    for (int pass = 0; pass < 64; ++pass) {
      bool removed = false;
      ::lseek(fd, 0, SEEK_SET);
      for (;;) {
        const long n = ::syscall(SYS_getdents64, fd, buf, sizeof buf);
        if (n <= 0) break;
        for (long off = 0; off < n;) {
          // struct linux_dirent64: u64 ino, s64 off, u16 reclen, u8 type, char name[].
          uint16_t reclen;
          std::memcpy(&reclen, buf + off + 16, sizeof reclen);
          const char* name = buf + off + 19;
          if (std::strcmp(name, ".") != 0 && std::strcmp(name, "..") != 0 && ::unlinkat(fd, name, 0) == 0)
            removed = true;
          off += reclen;
        }
      }
      if (!removed) break;
    }
    ::close(fd);
  }
  ::rmdir(path);
}

inline void remove_registered_now() {
  for (CleanupSlot& s : g_cleanup_slots) {
    if (s.state.load(std::memory_order_acquire) != CleanupSlot::Armed) continue;
    if (s.folder)
      remove_folder_now(s.path);
    else
      ::unlink(s.path);
  }
}

inline void on_termination_signal(int sig) {
  const int saved_errno = errno;
  remove_registered_now();
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  ::sigaction(sig, &dfl, nullptr);
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, sig);
  ::pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
  ::raise(sig);  // the default action: the process ends here
  errno = saved_errno;
}

}  // namespace detail

// Registers a temporary path (made absolute; folder: a folder of plain files) for removal on a
// termination signal. Returns the slot to pass to unregister_temporary, or -1 when the table
// is full or the path too long (then only a normal failure removes it).
inline int register_temporary(const std::string& path, bool folder = false) {
  std::error_code ec;
  std::string abs = std::filesystem::absolute(path, ec).string();
  if (ec) abs = path;
  if (abs.size() >= detail::kCleanupPathMax) return -1;
  for (int i = 0; i < detail::kCleanupSlots; ++i) {
    detail::CleanupSlot& s = detail::g_cleanup_slots[i];
    int expected = detail::CleanupSlot::Free;
    if (!s.state.compare_exchange_strong(expected, detail::CleanupSlot::Claimed, std::memory_order_acq_rel)) continue;
    std::memcpy(s.path, abs.c_str(), abs.size() + 1);
    s.folder = folder;
    s.state.store(detail::CleanupSlot::Armed, std::memory_order_release);
    return i;
  }
  return -1;
}

// Forgets a slot from register_temporary (after the path was renamed or removed); -1: no-op.
inline void unregister_temporary(int slot) {
  if (slot >= 0 && slot < detail::kCleanupSlots)
    detail::g_cleanup_slots[slot].state.store(detail::CleanupSlot::Free, std::memory_order_release);
}

// Installs the handler for SIGTERM, SIGINT and SIGHUP (a signal that is ignored, as under
// nohup, stays ignored). Call once, early in main().
inline void remove_temporaries_on_signal() {
  struct sigaction sa {};
  sa.sa_handler = detail::on_termination_signal;
  sigemptyset(&sa.sa_mask);
  const int sigs[] = {SIGTERM, SIGINT, SIGHUP};
  for (int sig : sigs) sigaddset(&sa.sa_mask, sig);  // one handler at a time
  for (int sig : sigs) {
    struct sigaction old {};
    if (::sigaction(sig, nullptr, &old) == 0 && old.sa_handler == SIG_IGN) continue;
    ::sigaction(sig, &sa, nullptr);
  }
}

}  // namespace wm::cli
