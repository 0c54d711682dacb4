#include "runtime/layer_loader.h"

#include "runtime/error.h"

namespace wm {

LayerQueueLoader::LayerQueueLoader(BlockStore& store, int n_layers, at::Device device, int lookahead,
                                   double max_bytes_per_s)
    : store_(store),
      n_layers_(n_layers),
      device_(device),
      lookahead_(lookahead),
      max_bytes_per_s_(max_bytes_per_s),
      ids_(n_layers),
      blocks_(n_layers),
      errors_(n_layers),
      done_(n_layers, 0) {
  WM_CHECK(n_layers > 0, "n_layers must be positive, got ", n_layers);
  WM_CHECK(lookahead != 0, "lookahead must be positive, or negative for no limit; got 0");
  WM_CHECK(max_bytes_per_s >= 0, "max_bytes_per_s must be >= 0, got ", max_bytes_per_s);
  stats_.idle_s.assign(n_layers, 0.0);
  stats_.stall_s.assign(n_layers, 0.0);
  stats_.busy_s.assign(n_layers, 0.0);
  last_event_ = Clock::now();
  worker_ = std::thread([this] { run(); });
}

LayerQueueLoader::~LayerQueueLoader() { finish(); }

void LayerQueueLoader::account(Clock::time_point now) {
  const double dt = std::chrono::duration<double>(now - last_event_).count();
  (worker_idle_ ? stats_.idle_s : stats_.busy_s)[current_] += dt;
  last_event_ = now;
}

void LayerQueueLoader::enqueue(int l, const std::vector<std::string>& ids) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    WM_CHECK(l >= 0 && l < n_layers_, "layer ", l, " out of range [0, ", n_layers_, ")");
    WM_CHECK(l > waited_, "layer ", l, " was already handed out (the consumer is at layer ", current_, ")");
    WM_CHECK(!stop_, "the loader is finished");
    for (const auto& id : ids) {
      queue_.push_back({l, id, ids_[l].size()});
      ids_[l].push_back(id);
      blocks_[l].emplace_back();
      errors_[l].emplace_back();
    }
  }
  cv_.notify_all();
}

void LayerQueueLoader::run() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    if (stop_) return;
    // The queued item of the earliest layer (the first queued among equals), if the lookahead
    // allows it.
    auto allowed = [&] {
      auto best = queue_.end();
      for (auto it = queue_.begin(); it != queue_.end(); ++it)
        if (best == queue_.end() || it->layer < best->layer) best = it;
      if (best != queue_.end() && lookahead_ >= 0 && best->layer > current_ + lookahead_) return queue_.end();
      return best;
    };
    auto it = allowed();
    if (it == queue_.end()) {
      if (!worker_idle_) account(Clock::now()), worker_idle_ = true;
      cv_.wait(lock, [&] { return stop_ || allowed() != queue_.end(); });
      if (stop_) return;
      continue;
    }
    if (worker_idle_) account(Clock::now()), worker_idle_ = false;
    const Item item = *it;
    queue_.erase(it);
    lock.unlock();
    Block b;
    std::exception_ptr err;
    try {
      b = store_.get_host(item.id);
      if (!device_.is_cpu()) b = b.to(device_, false, /*non_blocking=*/true);
    } catch (...) {
      err = std::current_exception();
      b = Block{};
    }
    if (max_bytes_per_s_ > 0 && !err) {  // the capped link carries the block: wait for it
      const auto start = std::max(link_free_, Clock::now());
      link_free_ = start + std::chrono::duration_cast<Clock::duration>(
                               std::chrono::duration<double>(static_cast<double>(b.nbytes()) / max_bytes_per_s_));
      std::this_thread::sleep_until(link_free_);
    }
    lock.lock();
    stats_.blocks += 1;
    if (!err) stats_.bytes += b.nbytes();
    blocks_[item.layer][item.slot] = std::move(b);
    errors_[item.layer][item.slot] = err;
    done_[item.layer] += 1;
    cv_.notify_all();
  }
}

LayerQueueLoader::Loaded LayerQueueLoader::wait(int l) {
  std::unique_lock<std::mutex> lock(mu_);
  WM_CHECK(l == waited_ + 1, "layers must be waited for in order, none skipped: asked ", l, " after ", waited_);
  WM_CHECK(l < n_layers_, "layer ", l, " out of range [0, ", n_layers_, ")");
  if (l != current_) {
    account(Clock::now());
    current_ = l;
  }
  cv_.notify_all();  // the lookahead window moved
  const auto t0 = Clock::now();
  cv_.wait(lock, [&] { return done_[l] == ids_[l].size(); });
  stats_.stall_s[l] += std::chrono::duration<double>(Clock::now() - t0).count();
  waited_ = l;
  Loaded out;
  out.ids = std::move(ids_[l]);
  out.blocks = std::move(blocks_[l]);
  out.errors = std::move(errors_[l]);
  ids_[l].clear(), blocks_[l].clear(), errors_[l].clear();
  done_[l] = 0;
  return out;
}

size_t LayerQueueLoader::queued() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queue_.size();
}

LayerQueueLoader::Stats LayerQueueLoader::finish() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stop_) {
      account(Clock::now());
      stop_ = true;
    }
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace wm
