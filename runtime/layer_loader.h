#pragma once
// Layer-wise loading of banked blocks into compute memory (KEEP's layer-balanced loading): a
// worker thread brings the blocks to the host (reading spill files as needed), then copies
// them to the device one layer at a time, staying at most `lookahead` layers ahead of the
// consumer, so layer l+1's transfers overlap layer l's compute.
#include <ATen/ATen.h>

#include <condition_variable>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "runtime/block.h"
#include "runtime/block_store.h"

namespace wm {

class LayerLoader {
 public:
  // Starts loading `ids` from `store` at once. n_layers: the blocks' layer count.
  LayerLoader(BlockStore& store, std::vector<std::string> ids, int n_layers, at::Device device, int lookahead = 2);
  ~LayerLoader();  // stops and joins the worker
  LayerLoader(const LayerLoader&) = delete;
  LayerLoader& operator=(const LayerLoader&) = delete;

  // Waits until layer l of every block is on the device; returns them in the order of `ids`.
  // Layers must be asked in increasing order. Rethrows any failure of the worker (a missing
  // block, a corrupt spill file) here.
  std::vector<LayerKv> wait(int l);
  // The blocks' metadata (available after wait(0)).
  const std::vector<BlockMeta>& metas() const { return metas_; }

 private:
  void run();

  BlockStore& store_;
  std::vector<std::string> ids_;
  int n_layers_;
  at::Device device_;
  int lookahead_;
  std::vector<std::vector<LayerKv>> ready_;  // [layer][block]
  std::vector<BlockMeta> metas_;
  int loaded_ = 0;    // layers ready
  int consumed_ = 0;  // layers handed out
  bool stop_ = false;
  std::exception_ptr error_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::thread worker_;
};

}  // namespace wm
