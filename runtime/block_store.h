#pragma once
// The bank: blocks by identity in tiers (device -> host -> disk -> remote), each under a byte
// budget. A tier over budget demotes its least recently used unpinned blocks to the next tier;
// disk blocks live in checksummed spill files, remote blocks in a Redis server
// (runtime/remote_store.h) under content keys. Nothing is dropped silently: when every tier is
// full, put() throws; a remote write that fails leaves its block in host memory (over budget),
// and a remote block the server no longer has is reported on reading (wm::LostData).
//
// With a remote store, the store can also share: remote_publish writes every block put here to
// the remote under its identity's key (asynchronously), and import_remote() brings blocks that
// another process published into a local tier. Identities must then be content hashes (equal
// identity, equal content), as the chunk cache's are. Thread-safe; fetch_async() reads on a worker thread. Spill files are
// written and read without the lock: a block on its way to disk is served from memory until its
// file is whole, and a file being read is removed only after its last reader.
#include <ATen/ATen.h>

#include <array>
#include <cstddef>
#include <future>
#include <limits>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "runtime/block.h"

namespace wm {

class RemoteStore;

enum class Tier { Device = 0, Host = 1, Disk = 2, Remote = 3 };
constexpr int kTiers = 4;
const char* tier_name(Tier t);

struct StoreConfig {
  at::Device device = at::kCPU;  // where get() delivers blocks and the device tier lives
  size_t device_budget = std::numeric_limits<size_t>::max();
  size_t host_budget = std::numeric_limits<size_t>::max();
  size_t disk_budget = std::numeric_limits<size_t>::max();
  std::string spill_dir;  // required once anything reaches the disk tier
  bool pin_host = true;   // pinned host memory when the device is a GPU
  bool drop_spill_pages = false;  // once a spill file is written, flush it and ask the OS to drop
                                  // its pages from the page cache, so that reading it back
                                  // comes from the disk (a bank larger than memory would)
  std::shared_ptr<RemoteStore> remote;  // the remote tier; none: the store has three tiers
  size_t remote_budget = std::numeric_limits<size_t>::max();  // bytes this store demotes there
  bool remote_publish = false;  // every put() is also written to the remote under its identity
};

class BlockStore {
 public:
  explicit BlockStore(StoreConfig cfg);
  ~BlockStore();  // removes its spill files
  BlockStore(const BlockStore&) = delete;
  BlockStore& operator=(const BlockStore&) = delete;

  // Stores the block (replacing one of the same id) in `tier` or, if it cannot fit there, the
  // first lower tier where it fits after demotions. Throws wm::Error if no tier can take it.
  // Spill files of blocks demoted to disk are written by the calling thread after the lock is
  // released. If one cannot be written, its block stays whole in host memory (over the host
  // budget: nothing is dropped) and put() throws wm::Error naming the block and the file.
  void put(Block block, Tier tier = Tier::Device);
  // The block on the store's device, bit-exact (from a spill file if it is on disk). Leaves it
  // in its tier and marks it most recently used. Tensors may share memory with the store: read
  // them, do not write them. Throws wm::Error if absent, wm::CorruptData if its spill file is bad.
  Block get(const std::string& id);
  // As get(), but the tensors stay on the CPU (host or disk blocks are not moved to the device).
  Block get_host(const std::string& id);
  // As get(), without marking the block used (its tier and LRU place stay): a read for planning.
  Block peek(const std::string& id) const;
  // get() on a worker thread.
  std::future<Block> fetch_async(const std::string& id);
  // Removes the block and returns it on the device.
  Block take(const std::string& id);
  // Removes the block; false if it was absent.
  bool erase(const std::string& id);
  // Brings blocks another process published (remote_publish) into `tier`, all or none: true when
  // every one was in the remote, sound and of this namespace (blocks already here count as found
  // and are not read). Network reads run without the lock. False without a remote store.
  bool import_remote(const std::vector<std::string>& ids, Tier tier = Tier::Host);
  RemoteStore* remote() const { return cfg_.remote.get(); }

  bool contains(const std::string& id) const;
  Tier tier_of(const std::string& id) const;
  // A copy of the block's metadata, without loading the tensors (a copy: a reference would
  // outlive the lock while another thread replaces or erases the block).
  BlockMeta meta(const std::string& id) const;
  size_t bytes(Tier t) const;
  size_t count(Tier t) const;
  size_t size() const;
  // Identities in insertion order (oldest first).
  std::vector<std::string> ids() const;
  const StoreConfig& config() const { return cfg_; }
  size_t budget(Tier t) const;

 private:
  struct Entry {
    std::string id;
    Tier tier;
    size_t bytes;
    BlockMeta meta;
    Block block;           // tensors when on the device or host tier
    std::string path;      // spill file when on the disk tier, key when on the remote tier
    bool writing = false;  // on the disk or remote tier, not yet written: `block` still holds it
    std::list<std::string>::iterator lru;  // position in lru_[tier], front = most recent
    uint64_t order;
  };
  // A spill file (or remote value) to write once the lock is released.
  struct SpillWrite {
    std::string id, path;  // path: empty for a remote write (the key is the value's hash)
    Block block;
    bool remote = false;
    uint64_t order = 0;    // the entry's, to tell it from a replacement made meanwhile
  };
  void put_impl(Block block, Tier tier, bool publish);
  // Makes room for `bytes` in tier t by demoting its LRU unpinned blocks; false if impossible.
  bool make_room(Tier t, size_t bytes, std::vector<SpillWrite>& writes);
  // Moves e's data (e.block) into tier t and links it there as most recent; no budget check. A
  // block going to disk keeps its tensors and is queued in `writes`.
  void place(Entry& e, Tier t, std::vector<SpillWrite>& writes);
  // Writes the queued spill files without the lock, then settles each entry: its tensors are
  // released, or (the write failed) it moves back to the host tier. Throws wm::Error on failure.
  void finish_writes(std::vector<SpillWrite>& writes);
  // The entry's block from memory (any tier while its tensors are held); the lock is held.
  Block load(const Entry& e, bool to_device) const;
  static bool in_memory(const Entry& e) { return (e.tier != Tier::Disk && e.tier != Tier::Remote) || e.writing; }
  // A remote block read without the lock; throws wm::LostData when the remote has it no more.
  Block read_remote_unlocked(std::unique_lock<std::mutex>& lock, const std::string& id, const std::string& key) const;
  // A block whose data is on disk or in the remote, read without the lock.
  Block read_stored_unlocked(std::unique_lock<std::mutex>& lock, const std::string& id, Tier tier,
                             const std::string& path) const;
  // Entry e's block, from memory or read without the lock, its metadata set; on the store's
  // device, or on the CPU when !to_device. The lock is held on entry and on return.
  Block read_entry(std::unique_lock<std::mutex>& lock, const Entry& e, bool to_device) const;
  // Deletes the remote keys of blocks unlinked meanwhile (called without the lock).
  void drop_remote_garbage();
  Tier last_tier() const { return cfg_.remote ? Tier::Remote : Tier::Disk; }
  void unlink(Entry& e);
  // Disk reads run without the lock; a spill file being read is removed only after its last
  // reader is done (erase or replace meanwhile defers the removal).
  Block read_unlocked(std::unique_lock<std::mutex>& lock, const std::string& path) const;
  void remove_spill_file(const std::string& path);
  void touch(Entry& e);
  std::string spill_path(const std::string& id);

  StoreConfig cfg_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, Entry> entries_;
  std::array<std::list<std::string>, kTiers> lru_;
  std::array<size_t, kTiers> bytes_{};
  std::vector<std::string> remote_garbage_;  // keys of remote blocks unlinked, to delete
  uint64_t next_order_ = 0;
  uint64_t spill_counter_ = 0;
  // Bookkeeping of reads in flight (so mutable: a const read counts too).
  mutable std::unordered_map<std::string, int> readers_;  // spill file -> reads and writes in flight
  mutable std::unordered_map<std::string, bool> doomed_;  // spill files to remove when those end
};

}  // namespace wm
