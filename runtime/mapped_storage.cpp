#include "runtime/mapped_storage.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <mutex>

#include "runtime/error.h"

namespace wm {

struct MappedStorage::State {
  std::string dir;
  int dir_fd = -1;  // the folder as opened once: later renames or links in its path do not move it
  uint64_t max_bytes = 0;
  std::mutex mu;
  uint64_t bytes = 0;  // under mu
  State() = default;
  State(const State&) = delete;
  State& operator=(const State&) = delete;
  ~State() {
    if (dir_fd >= 0) ::close(dir_fd);
  }
};

namespace {

// A file in the folder that no one else can name, open for reading and writing; -1 with errno set.
int unnamed_file(int dir_fd) {
  // O_EXCL: the file can never be given a name later.
  int fd = ::openat(dir_fd, ".", O_TMPFILE | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd >= 0 || (errno != EOPNOTSUPP && errno != EISDIR && errno != EINVAL)) return fd;
  // No O_TMPFILE on this file system: a random name in the folder, unlinked before anything is
  // written (mkostemp takes a path: the folder through its descriptor).
  std::string name = "/proc/self/fd/" + std::to_string(dir_fd) + "/wm_mapped_XXXXXX";
  fd = ::mkostemp(name.data(), O_CLOEXEC);
  if (fd >= 0) ::unlink(name.c_str());
  return fd;
}

std::string describe_errno(int e) { return std::strerror(e); }

}  // namespace

MappedStorage::MappedStorage(const std::string& dir, uint64_t max_bytes) : state_(std::make_shared<State>()) {
  WM_CHECK(!dir.empty(), "a mapped storage needs a folder");
  // O_NOFOLLOW: a symbolic link as the folder is refused, not followed.
  state_->dir_fd = ::open(dir.c_str(), O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (state_->dir_fd < 0) {
    const int e = errno;
    struct stat st {};
    if (::lstat(dir.c_str(), &st) == 0 && S_ISLNK(st.st_mode))
      throw Error(str_cat("mapped storage folder '", dir, "' is a symbolic link; give the folder itself"));
    throw Error(str_cat("mapped storage folder '", dir, "': ", e == ENOTDIR ? "not a folder" : describe_errno(e)));
  }
  state_->dir = dir;
  state_->max_bytes = max_bytes;
}

at::Tensor MappedStorage::empty(at::IntArrayRef sizes, at::ScalarType dtype) const {
  int64_t n = 1;
  for (int64_t s : sizes) {
    WM_CHECK(s >= 0, "mapped tensor of negative size ", sizes);
    n *= s;
  }
  const uint64_t bytes = static_cast<uint64_t>(n) * c10::elementSize(dtype);
  if (bytes == 0) return at::empty(sizes, at::TensorOptions().dtype(dtype));
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    WM_CHECK(state_->max_bytes == 0 || state_->bytes + bytes <= state_->max_bytes, "mapped storage in '", state_->dir,
             "' is limited to ", state_->max_bytes, " bytes: ", state_->bytes, " held, ", bytes, " more asked");
    state_->bytes += bytes;
  }
  std::shared_ptr<State> st = state_;
  auto give_back = [st, bytes] {
    std::lock_guard<std::mutex> lock(st->mu);
    st->bytes -= bytes;
  };
  const int fd = unnamed_file(state_->dir_fd);
  if (fd < 0) {
    const int e = errno;
    give_back();
    throw Error(str_cat("cannot make a file in '", state_->dir, "' for ", bytes, " bytes of K/V: ", describe_errno(e)));
  }
  // posix_fallocate returns the error instead of setting errno.
  const int fe = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  void* p = fe == 0 ? ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
  const int me = errno;
  ::close(fd);  // the mapping keeps the file
  if (p == MAP_FAILED) {
    give_back();
    throw Error(str_cat("cannot ", fe != 0 ? "reserve" : "map", " ", bytes, " bytes in '", state_->dir,
                        "': ", describe_errno(fe != 0 ? fe : me)));
  }
  try {
    return at::from_blob(
        p, sizes,
        [bytes, give_back](void* q) {
          ::munmap(q, bytes);
          give_back();
        },
        at::TensorOptions().dtype(dtype));
  } catch (...) {
    ::munmap(p, bytes);
    give_back();
    throw;
  }
}

uint64_t MappedStorage::bytes() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->bytes;
}

uint64_t MappedStorage::max_bytes() const { return state_->max_bytes; }

const std::string& MappedStorage::dir() const { return state_->dir; }

}  // namespace wm
