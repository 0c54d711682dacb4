#include "runtime/block_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "runtime/error.h"
#include "runtime/remote_store.h"
#include "runtime/spill_file.h"

namespace wm {

namespace {
// Flushes a written file and advises the OS to drop its cached pages (best effort: a file
// system that keeps them, such as tmpfs, is left as it is).
void drop_page_cache(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}
}  // namespace

const char* tier_name(Tier t) {
  switch (t) {
    case Tier::Device: return "device";
    case Tier::Host: return "host";
    case Tier::Disk: return "disk";
    case Tier::Remote: return "remote";
  }
  return "?";
}

BlockStore::BlockStore(StoreConfig cfg) : cfg_(std::move(cfg)) {}

BlockStore::~BlockStore() {
  // No reads can be in flight: a fetch_async future outliving the store is a caller's bug.
  for (auto& [id, e] : entries_)
    if (e.tier == Tier::Disk && !e.path.empty()) std::remove(e.path.c_str());
  for (auto& [path, doomed] : doomed_) std::remove(path.c_str());
  if (cfg_.remote) {  // this store's remote blocks are its own (content keys of its values)
    for (auto& [id, e] : entries_)
      if (e.tier == Tier::Remote && !e.path.empty()) remote_garbage_.push_back(e.path);
    drop_remote_garbage();
  }
}

void BlockStore::drop_remote_garbage() {
  std::vector<std::string> keys;
  {
    std::lock_guard<std::mutex> lock(mu_);
    keys.swap(remote_garbage_);
  }
  if (!keys.empty() && cfg_.remote) cfg_.remote->erase(keys);
}

Block BlockStore::read_remote_unlocked(std::unique_lock<std::mutex>& lock, const std::string& id,
                                       const std::string& key) const {
  lock.unlock();
  std::optional<Block> b = cfg_.remote->get(key, id);
  lock.lock();
  if (!b)
    throw LostData(str_cat("block '", id, "': the remote tier (", cfg_.remote->endpoint().url,
                           ") no longer gives it back (expired, evicted, damaged or unreachable)"));
  return std::move(*b);
}

void BlockStore::remove_spill_file(const std::string& path) {
  auto it = readers_.find(path);
  if (it != readers_.end() && it->second > 0) {
    doomed_[path] = true;  // the last reader removes it
    return;
  }
  std::remove(path.c_str());
}

Block BlockStore::read_unlocked(std::unique_lock<std::mutex>& lock, const std::string& path) const {
  ++readers_[path];
  lock.unlock();
  auto done = [&] {
    lock.lock();
    if (--readers_[path] == 0) {
      readers_.erase(path);
      if (doomed_.erase(path) > 0) std::remove(path.c_str());
    }
  };
  Block b;
  try {
    b = read_spill_file(path);
  } catch (...) {
    done();
    throw;
  }
  done();
  return b;
}

size_t BlockStore::budget(Tier t) const {
  switch (t) {
    case Tier::Device: return cfg_.device_budget;
    case Tier::Host: return cfg_.host_budget;
    case Tier::Disk: return cfg_.disk_budget;
    case Tier::Remote: return cfg_.remote ? cfg_.remote_budget : 0;
  }
  return 0;
}

std::string BlockStore::spill_path(const std::string& id) {
  WM_CHECK(!cfg_.spill_dir.empty(), "block '", id, "' must go to the disk tier but no spill_dir is set");
  ::mkdir(cfg_.spill_dir.c_str(), 0755);
  std::string safe;
  for (char c : id) safe.push_back(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' ? c : '_');
  if (safe.size() > 64) safe.resize(64);
  return str_cat(cfg_.spill_dir, "/", safe, "-", spill_counter_++, ".wmkv");
}

void BlockStore::touch(Entry& e) {
  auto& l = lru_[static_cast<int>(e.tier)];
  l.splice(l.begin(), l, e.lru);
}

void BlockStore::unlink(Entry& e) {
  const int t = static_cast<int>(e.tier);
  lru_[t].erase(e.lru);
  bytes_[t] -= e.bytes;
  if (e.tier == Tier::Disk && !e.path.empty()) remove_spill_file(e.path);
  if (e.tier == Tier::Remote && !e.path.empty()) remote_garbage_.push_back(e.path);
  e.path.clear();
  e.block = Block{};
}

void BlockStore::place(Entry& e, Tier t, std::vector<SpillWrite>& writes) {
  // e is unlinked from any tier; e.block holds the data.
  const bool gpu = !cfg_.device.is_cpu();
  if (t == Tier::Device) {
    e.block = e.block.to(cfg_.device);
  } else if (t == Tier::Host) {
    Block h = e.block.to(at::kCPU);
    if (gpu && cfg_.pin_host)
      for (auto& l : h.layers) {
        l.k = l.k.pin_memory();
        l.v = l.v.pin_memory();
        l.logw = l.logw.pin_memory();
      }
    e.block = std::move(h);
  } else if (t == Tier::Remote) {
    // Written after the lock is released, under the key of its value's bytes; served from
    // e.block until then.
    e.path.clear();
    e.writing = true;
    writes.push_back({e.id, "", e.block, true, e.order});
  } else {
    // The file is written after the lock is released; until then the block is served from
    // e.block, and the write counts as a reader so that an erase or replace meanwhile defers
    // the file's removal to the writer.
    e.path = spill_path(e.block.id);
    e.writing = true;
    ++readers_[e.path];
    writes.push_back({e.id, e.path, e.block});
  }
  e.tier = t;
  const int ti = static_cast<int>(t);
  lru_[ti].push_front(e.id);
  e.lru = lru_[ti].begin();
  bytes_[ti] += e.bytes;
}

void BlockStore::finish_writes(std::vector<SpillWrite>& all) {
  if (all.empty()) return;
  drop_remote_garbage();  // before writing: a value written again has the key of one unlinked
  std::vector<SpillWrite> writes, remote;
  for (auto& w : all) (w.remote ? remote : writes).push_back(std::move(w));
  all.clear();
  if (!remote.empty()) {
    std::vector<RemoteStore::Put> puts;
    for (const auto& w : remote) puts.push_back(cfg_.remote->put_of(w.block));
    std::vector<std::string> keys;
    for (const auto& p : puts) keys.push_back(p.key);
    const bool ok = cfg_.remote->put_many(std::move(puts));
    std::vector<SpillWrite> none;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (size_t i = 0; i < remote.size(); ++i) {
        auto it = entries_.find(remote[i].id);
        const bool same = it != entries_.end() && it->second.order == remote[i].order &&
                          it->second.tier == Tier::Remote && it->second.writing;
        if (!same) {  // replaced, erased or moved meanwhile: nobody needs the value
          if (ok) remote_garbage_.push_back(keys[i]);
          continue;
        }
        Entry& e = it->second;
        e.writing = false;
        if (ok) {
          e.path = keys[i];
          e.block = Block{};
          continue;
        }
        // Not written (the remote is slow or unreachable): back to host memory, over budget
        // rather than lost; the remote store has warned once for its outage.
        lru_[static_cast<int>(Tier::Remote)].erase(e.lru);
        bytes_[static_cast<int>(Tier::Remote)] -= e.bytes;
        place(e, Tier::Host, none);
      }
    }
    drop_remote_garbage();
  }
  if (writes.empty()) return;
  std::vector<std::string> errors(writes.size());
  for (size_t i = 0; i < writes.size(); ++i) {
    try {
      write_spill_file(writes[i].path, writes[i].block.to(at::kCPU));
      if (cfg_.drop_spill_pages) drop_page_cache(writes[i].path);
    } catch (const std::exception& ex) {
      errors[i] = ex.what();
    }
  }
  std::string failed;
  std::vector<SpillWrite> none;
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < writes.size(); ++i) {
    const std::string& path = writes[i].path;
    if (--readers_[path] == 0) readers_.erase(path);
    if (doomed_.erase(path) > 0) {  // replaced or erased meanwhile: nobody needs the file
      if (readers_.count(path) == 0) std::remove(path.c_str());
      else doomed_[path] = true;
      continue;
    }
    auto it = entries_.find(writes[i].id);
    if (it == entries_.end() || it->second.path != path || !it->second.writing) continue;
    Entry& e = it->second;
    e.writing = false;
    if (errors[i].empty()) {
      e.block = Block{};
      continue;
    }
    // Not written: the block goes back to host memory, over budget rather than lost.
    std::remove(path.c_str());
    lru_[static_cast<int>(Tier::Disk)].erase(e.lru);
    bytes_[static_cast<int>(Tier::Disk)] -= e.bytes;
    e.path.clear();
    place(e, Tier::Host, none);
    failed += str_cat(failed.empty() ? "" : "; ", "block '", e.id, "': ", errors[i]);
  }
  WM_CHECK(failed.empty(), "spill to disk failed, the blocks stay in host memory over its budget: ", failed);
}

bool BlockStore::make_room(Tier t, size_t need, std::vector<SpillWrite>& writes) {
  const int ti = static_cast<int>(t);
  if (need > budget(t)) return false;
  auto& l = lru_[ti];
  // Demote from the least recently used end: unpinned blocks first, pinned ones only if needed.
  for (int pass = 0; pass < 2; ++pass) {
    while (bytes_[ti] + need > budget(t)) {
      auto it = std::find_if(l.rbegin(), l.rend(),
                             [&](const std::string& id) { return pass == 1 || !entries_.at(id).meta.pinned; });
      if (it == l.rend()) break;
      if (t == last_tier()) return false;  // nothing below: never drop data
      Entry& victim = entries_.at(*it);
      // The first lower tier that can take it (a tier with a zero budget is skipped).
      int below = ti + 1;
      const int last = static_cast<int>(last_tier());
      while (below <= last && !make_room(static_cast<Tier>(below), victim.bytes, writes)) ++below;
      if (below > last) return false;
      l.erase(victim.lru);
      bytes_[ti] -= victim.bytes;
      place(victim, static_cast<Tier>(below), writes);
    }
  }
  return bytes_[ti] + need <= budget(t);
}

void BlockStore::put(Block block, Tier tier) { put_impl(std::move(block), tier, cfg_.remote && cfg_.remote_publish); }

void BlockStore::put_impl(Block block, Tier tier, bool publish) {
  std::vector<SpillWrite> writes;
  std::string no_room;
  Block published;  // what is published to the remote (the tensors are shared, not copied)
  if (publish) published = block;
  {
    std::lock_guard<std::mutex> lock(mu_);
    WM_CHECK(!block.id.empty(), "a block needs an identity");
    auto old = entries_.find(block.id);
    if (old != entries_.end()) {
      unlink(old->second);
      entries_.erase(old);
    }
    const size_t nb = block.nbytes();
    Tier t = tier;
    while (no_room.empty() && !make_room(t, nb, writes)) {
      if (t == last_tier())
        no_room = str_cat("block '", block.id, "' (", nb, " bytes) fits in no tier: device ", bytes_[0], "/",
                          cfg_.device_budget, ", host ", bytes_[1], "/", cfg_.host_budget, ", disk ", bytes_[2],
                          "/", cfg_.disk_budget, cfg_.remote ? str_cat(", remote ", bytes_[3], "/", cfg_.remote_budget) : "",
                          " bytes used");
      else
        t = static_cast<Tier>(static_cast<int>(t) + 1);
    }
    if (no_room.empty()) {
      Entry e;
      e.id = block.id;
      e.bytes = nb;
      e.meta = block.meta;
      e.order = next_order_++;
      e.block = std::move(block);
      const std::string id = e.block.id;
      auto it = entries_.emplace(id, std::move(e)).first;
      place(it->second, t, writes);
    }
  }
  // Blocks demoted on the way (even when this one found no room) are placed; write their files.
  if (no_room.empty()) {
    if (publish) {
      std::string key = cfg_.remote->key_for_id(published.id);  // before the block is moved
      cfg_.remote->put_async(std::move(key), std::move(published));
    }
    drop_remote_garbage();
    return finish_writes(writes);
  }
  try {
    finish_writes(writes);
  } catch (const Error& e) {
    throw Error(str_cat(no_room, "; ", e.what()));
  }
  throw Error(no_room);
}

Block BlockStore::load(const Entry& e, bool to_device) const {
  WM_CHECK(in_memory(e), "block '", e.id, "' is on disk");  // callers read files without the lock
  Block b = e.block;
  b.meta = e.meta;
  if (to_device) return b.to(cfg_.device, false, /*non_blocking=*/!cfg_.device.is_cpu());
  return b;
}

Block BlockStore::read_stored_unlocked(std::unique_lock<std::mutex>& lock, const std::string& id, Tier tier,
                                       const std::string& path) const {
  return tier == Tier::Remote ? read_remote_unlocked(lock, id, path) : read_unlocked(lock, path);
}

Block BlockStore::read_entry(std::unique_lock<std::mutex>& lock, const Entry& e, bool to_device) const {
  if (in_memory(e)) return to_device ? load(e, true) : load(e, false).to(at::kCPU);
  // Copied before the lock goes: the entry may change while the data is read.
  const std::string id = e.id, path = e.path;
  const BlockMeta meta = e.meta;
  Block b = read_stored_unlocked(lock, id, e.tier, path);
  b.meta = meta;
  return to_device ? b.to(cfg_.device) : b;
}

Block BlockStore::get(const std::string& id) {
  std::unique_lock<std::mutex> lock(mu_);
  auto it = entries_.find(id);
  WM_CHECK(it != entries_.end(), "no block '", id, "' in the store");
  touch(it->second);
  return read_entry(lock, it->second, true);
}

Block BlockStore::peek(const std::string& id) const {
  std::unique_lock<std::mutex> lock(mu_);
  auto it = entries_.find(id);
  WM_CHECK(it != entries_.end(), "no block '", id, "' in the store");
  return read_entry(lock, it->second, true);
}

Block BlockStore::get_host(const std::string& id) {
  std::unique_lock<std::mutex> lock(mu_);
  auto it = entries_.find(id);
  WM_CHECK(it != entries_.end(), "no block '", id, "' in the store");
  touch(it->second);
  return read_entry(lock, it->second, false);
}

std::future<Block> BlockStore::fetch_async(const std::string& id) {
  return std::async(std::launch::async, [this, id] { return get(id); });
}

Block BlockStore::take(const std::string& id) {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    auto it = entries_.find(id);
    WM_CHECK(it != entries_.end(), "no block '", id, "' in the store");
    if (in_memory(it->second)) {
      Block b = load(it->second, true);
      unlink(it->second);
      entries_.erase(it);
      return b;
    }
    // Read the file without the lock, then take the entry if it is still that file's; if it
    // was replaced or moved meanwhile, read again (if it was erased, the find above throws).
    const std::string path = it->second.path;
    const BlockMeta meta = it->second.meta;
    const Tier tier = it->second.tier;
    Block b = read_stored_unlocked(lock, id, tier, path);
    it = entries_.find(id);
    if (it != entries_.end() && it->second.tier == tier && !it->second.writing && it->second.path == path) {
      unlink(it->second);
      entries_.erase(it);
      lock.unlock();
      drop_remote_garbage();
      b.meta = meta;
      return b.to(cfg_.device);
    }
  }
}

bool BlockStore::erase(const std::string& id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(id);
    if (it == entries_.end()) return false;
    unlink(it->second);
    entries_.erase(it);
  }
  drop_remote_garbage();
  return true;
}

bool BlockStore::import_remote(const std::vector<std::string>& ids, Tier tier) {
  if (!cfg_.remote) return false;
  std::vector<std::string> keys, want;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& id : ids)
      if (!entries_.count(id)) want.push_back(id), keys.push_back(cfg_.remote->key_for_id(id));
  }
  if (want.empty()) return true;
  std::vector<std::optional<Block>> got = cfg_.remote->get_many(keys, want);
  for (const auto& b : got)
    if (!b) return false;
  for (auto& b : got) put_impl(std::move(*b), tier, /*publish=*/false);
  return true;
}

bool BlockStore::contains(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.count(id) != 0;
}

Tier BlockStore::tier_of(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(id);
  WM_CHECK(it != entries_.end(), "no block '", id, "' in the store");
  return it->second.tier;
}

BlockMeta BlockStore::meta(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(id);
  WM_CHECK(it != entries_.end(), "no block '", id, "' in the store");
  return it->second.meta;
}

size_t BlockStore::bytes(Tier t) const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_[static_cast<int>(t)];
}

size_t BlockStore::count(Tier t) const {
  std::lock_guard<std::mutex> lock(mu_);
  return lru_[static_cast<int>(t)].size();
}

size_t BlockStore::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}

std::vector<std::string> BlockStore::ids() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::pair<uint64_t, std::string>> v;
  for (auto& [id, e] : entries_) v.emplace_back(e.order, id);
  std::sort(v.begin(), v.end());
  std::vector<std::string> out;
  for (auto& p : v) out.push_back(p.second);
  return out;
}

}  // namespace wm
