#pragma once
// CPU tensors whose bytes live in files instead of anonymous memory. Each tensor is a file that
// no one can name (made with O_TMPFILE in the folder given, mode 0600; where the file system
// lacks it, a random name unlinked at once), mapped shared, and gone with the tensor's last view
// (or the process). Its pages belong to the page cache: when memory runs short the kernel writes
// them to the file and drops them, and reads them back when they are touched. A K/V window
// larger than memory (LingBot-World-Fast's 40 blocks under WorldKV: 23 GB in bfloat16 beside
// the streamed weights) then runs from disk a layer at a time, as the weights do. The file's
// blocks are reserved when it is made (posix_fallocate): on ext4 and xfs a full disk is then an
// error there, not a fault on a later write; on a copy-on-write file system (btrfs, ZFS) a write
// may still fail for space, and the process gets SIGBUS. Give a folder on such a disk: on tmpfs
// the pages stay in memory. A child forked without exec shares the mappings (writes reach the
// parent's tensors), unlike anonymous memory.
#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <string>

namespace wm {

class MappedStorage {
 public:
  // dir: an existing folder, not a symbolic link; max_bytes: the most its live tensors may hold
  // together (0: what the disk holds). Throws wm::Error when dir is not such a folder.
  MappedStorage(const std::string& dir, uint64_t max_bytes = 0);

  // A new CPU tensor, contiguous, its contents undefined (zeros on a fresh file). Throws
  // wm::Error, naming the folder, when the limit would be passed, the file cannot be made or
  // reserved (a full disk), or it cannot be mapped.
  at::Tensor empty(at::IntArrayRef sizes, at::ScalarType dtype) const;

  // Bytes held by live tensors made here.
  uint64_t bytes() const;
  uint64_t max_bytes() const;
  const std::string& dir() const;

 private:
  struct State;
  std::shared_ptr<State> state_;  // shared with the tensors' deleters
};

}  // namespace wm
