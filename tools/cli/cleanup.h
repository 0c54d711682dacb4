#pragma once
// Temporary outputs that a termination signal must not leave behind. A program that writes
// outputs calls remove_temporaries_on_signal() once, at start; OutputPath, OutputFile,
// OutputFolder (tools/cli/output_file.h) and Mp4Writer register each temporary path for as long
// as it exists. On SIGTERM, SIGINT, SIGHUP or SIGPIPE (standard output piped into a reader that
// went away, as `| head` does) the handler removes every registered path, restores the signal's
// default action and raises it again, so the program still ends as killed by that signal (exit
// status 128 + signal in a shell). SIGKILL cannot be caught: then only the hidden temporary
// names remain, never a final name.
//
// What a cleanup removes is only what the process made itself: a file under a name it chose, a
// folder it created (registered with folder = true: its files go, then the folder; so never a
// folder a user named), or, with register_made_folder, a folder it created that is removed only
// when it is empty by then (the folders of a path it created, whose other contents stay).
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
  enum : int { File = 0, Folder = 1, EmptyFolder = 2 };
  std::atomic<int> state{Free};
  int kind = File;
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

// Files first, then folders (again while one goes: a folder made inside another registered one
// goes before it), then the made folders that are empty by then, deepest first by retrying.
inline void remove_registered_now() {
  for (CleanupSlot& s : g_cleanup_slots)
    if (s.state.load(std::memory_order_acquire) == CleanupSlot::Armed && s.kind == CleanupSlot::File) ::unlink(s.path);
  for (int pass = 0; pass < 4; ++pass)
    for (CleanupSlot& s : g_cleanup_slots)
      if (s.state.load(std::memory_order_acquire) == CleanupSlot::Armed && s.kind == CleanupSlot::Folder)
        remove_folder_now(s.path);
  for (int pass = 0; pass < 16; ++pass) {
    bool removed = false;
    for (CleanupSlot& s : g_cleanup_slots)
      if (s.state.load(std::memory_order_acquire) == CleanupSlot::Armed && s.kind == CleanupSlot::EmptyFolder &&
          ::rmdir(s.path) == 0)
        removed = true;
    if (!removed) break;
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

namespace detail {

inline std::string absolute_text(const std::string& path) {
  std::error_code ec;
  std::string abs = std::filesystem::absolute(path, ec).lexically_normal().string();
  return ec ? path : abs;
}

inline int register_slot(const std::string& path, int kind) {
  const std::string abs = absolute_text(path);
  if (abs.size() >= kCleanupPathMax) return -1;
  for (int i = 0; i < kCleanupSlots; ++i) {
    CleanupSlot& s = g_cleanup_slots[i];
    int expected = CleanupSlot::Free;
    if (!s.state.compare_exchange_strong(expected, CleanupSlot::Claimed, std::memory_order_acq_rel)) continue;
    std::memcpy(s.path, abs.c_str(), abs.size() + 1);
    s.kind = kind;
    s.state.store(CleanupSlot::Armed, std::memory_order_release);
    return i;
  }
  return -1;
}

}  // namespace detail

// Registers a temporary path (made absolute; folder: a folder of plain files that this process
// created) for removal on a termination signal. Returns the slot to pass to
// unregister_temporary, or -1 when the table is full or the path too long (then only a normal
// failure removes it).
inline int register_temporary(const std::string& path, bool folder = false) {
  return detail::register_slot(path, folder ? detail::CleanupSlot::Folder : detail::CleanupSlot::File);
}

// Registers a folder this process created for removal on a termination signal when it is empty
// then (rmdir: whatever it holds stays, and so does the folder). Returns the slot, or -1.
inline int register_made_folder(const std::string& path) {
  return detail::register_slot(path, detail::CleanupSlot::EmptyFolder);
}

// Whether `path` (made absolute) is registered now: a temporary name another output of this
// process holds.
inline bool is_registered(const std::string& path) {
  const std::string abs = detail::absolute_text(path);
  for (const detail::CleanupSlot& s : detail::g_cleanup_slots)
    if (s.state.load(std::memory_order_acquire) == detail::CleanupSlot::Armed && abs == s.path) return true;
  return false;
}

// Forgets a slot from register_temporary (after the path was renamed or removed); -1: no-op.
inline void unregister_temporary(int slot) {
  if (slot >= 0 && slot < detail::kCleanupSlots)
    detail::g_cleanup_slots[slot].state.store(detail::CleanupSlot::Free, std::memory_order_release);
}

// Installs the handler for SIGTERM, SIGINT, SIGHUP and SIGPIPE (a signal that is ignored, as
// SIGHUP under nohup, stays ignored: then a write to a closed pipe fails with EPIPE, which the
// program handles as an error). Call once, early in main().
inline void remove_temporaries_on_signal() {
  struct sigaction sa {};
  sa.sa_handler = detail::on_termination_signal;
  sigemptyset(&sa.sa_mask);
  const int sigs[] = {SIGTERM, SIGINT, SIGHUP, SIGPIPE};
  for (int sig : sigs) sigaddset(&sa.sa_mask, sig);  // one handler at a time
  for (int sig : sigs) {
    struct sigaction old {};
    if (::sigaction(sig, nullptr, &old) == 0 && old.sa_handler == SIG_IGN) continue;
    ::sigaction(sig, &sa, nullptr);
  }
}

}  // namespace wm::cli
