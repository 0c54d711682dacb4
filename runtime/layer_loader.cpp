#include "runtime/layer_loader.h"

#include "runtime/error.h"

namespace wm {

LayerLoader::LayerLoader(BlockStore& store, std::vector<std::string> ids, int n_layers, at::Device device,
                         int lookahead)
    : store_(store),
      ids_(std::move(ids)),
      n_layers_(n_layers),
      device_(device),
      lookahead_(std::max(1, lookahead)),
      ready_(n_layers) {
  worker_ = std::thread([this] { run(); });
}

LayerLoader::~LayerLoader() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

void LayerLoader::run() {
  try {
    std::vector<Block> host;
    host.reserve(ids_.size());
    for (auto& id : ids_) {
      host.push_back(store_.get_host(id));
      WM_CHECK(host.back().n_layers() == n_layers_, "block '", id, "' has ", host.back().n_layers(),
               " layers, expected ", n_layers_);
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& b : host) metas_.push_back(b.meta);
    }
    const bool non_blocking = !device_.is_cpu();
    for (int l = 0; l < n_layers_; ++l) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || l - consumed_ < lookahead_; });
        if (stop_) return;
      }
      std::vector<LayerKv> layer;
      layer.reserve(host.size());
      for (auto& b : host) {
        LayerKv& src = b.layers[l];
        LayerKv dst;
        dst.k = src.k.to(device_, src.k.scalar_type(), non_blocking);
        dst.v = src.v.to(device_, src.v.scalar_type(), non_blocking);
        dst.logw = src.logw.to(device_, src.logw.scalar_type(), non_blocking);
        dst.pos = src.pos;
        src = LayerKv{};  // the host copy of this layer is no longer needed
        layer.push_back(std::move(dst));
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        ready_[l] = std::move(layer);
        loaded_ = l + 1;
      }
      cv_.notify_all();
    }
  } catch (...) {
    std::lock_guard<std::mutex> lock(mu_);
    error_ = std::current_exception();
    cv_.notify_all();
  }
}

std::vector<LayerKv> LayerLoader::wait(int l) {
  std::unique_lock<std::mutex> lock(mu_);
  WM_CHECK(l >= 0 && l < n_layers_, "layer ", l, " out of range [0, ", n_layers_, ")");
  WM_CHECK(l >= consumed_, "layers must be asked in increasing order: asked ", l, " after ", consumed_ - 1);
  cv_.wait(lock, [&] { return error_ || loaded_ > l; });
  if (error_ && loaded_ <= l) std::rethrow_exception(error_);
  std::vector<LayerKv> out = std::move(ready_[l]);
  consumed_ = l + 1;
  lock.unlock();
  cv_.notify_all();
  return out;
}

}  // namespace wm
