#pragma once
// Layer-wise loading of banked blocks into compute memory on a schedule the consumer builds
// (KEEP's layer-balanced loading; next-layer prefetch as its special case).
#include <ATen/ATen.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "runtime/block.h"
#include "runtime/block_store.h"

namespace wm {

// Layer-wise loading on a schedule the consumer builds as it goes (KEEP's layer-balanced
// loading): the consumer queues blocks for given layers as soon as it knows it needs them; a
// worker thread reads them from the store (spill files as needed) and moves them to `device`,
// the earliest layer first (queue order within a layer), never more than `lookahead` layers ahead
// of the layer being consumed (lookahead < 0: no limit, so work queued for late layers fills the
// worker's idle time in early ones). With
// lookahead 1 it is the plain next-layer prefetch. A block that fails to load (absent, a damaged
// spill file) is handed to the consumer as its error, not delivered; the other blocks still are.
// It records how long the worker idled while the consumer was at each layer and how long the
// consumer waited for each layer. max_bytes_per_s caps the worker's throughput (it waits after a
// block until the cap allows it), to stand for a slower link than the machine's own (a PCIe bus, a
// network store) when measuring schedules.
class LayerQueueLoader {
 public:
  // The worker starts at once, idle until something is queued. The consumer is at layer 0.
  // max_bytes_per_s: 0 for no cap. Throws wm::Error on n_layers < 1, lookahead 0 or a negative cap.
  LayerQueueLoader(BlockStore& store, int n_layers, at::Device device, int lookahead = 1,
                   double max_bytes_per_s = 0);
  ~LayerQueueLoader();  // stops and joins the worker
  LayerQueueLoader(const LayerQueueLoader&) = delete;
  LayerQueueLoader& operator=(const LayerQueueLoader&) = delete;

  // Queues the blocks `ids` (of the store) for layer l, after everything queued before. Throws
  // wm::Error if l is out of range or below the layer being consumed.
  void enqueue(int l, const std::vector<std::string>& ids);

  // What wait() hands over: per block queued for the layer, in queue order, the block on the
  // device or, when it failed, the exception its load threw (then the block is empty).
  struct Loaded {
    std::vector<std::string> ids;
    std::vector<Block> blocks;
    std::vector<std::exception_ptr> errors;
  };
  // Moves the consumer to layer l (layers in increasing order, none skipped or repeated: call it
  // for every layer, even with nothing queued) and waits until every block queued for l so far
  // is loaded or failed. Throws wm::Error on a layer out of order.
  Loaded wait(int l);
  // Blocks queued and not yet taken up by the worker (what the lookahead holds back, or what it
  // has not reached yet).
  size_t queued() const;

  struct Stats {
    std::vector<double> idle_s;   // per layer: the worker idle while the consumer was at that layer
    std::vector<double> stall_s;  // per layer: the consumer waiting in wait(l)
    std::vector<double> busy_s;   // per layer: the worker loading while the consumer was at that layer
    int64_t blocks = 0;           // loaded (failures included)
    size_t bytes = 0;             // K, V, positions and log-weights delivered
  };
  // Stops the worker (what is still queued is dropped) and returns the figures; the time from the
  // last wait() to finish() counts for the last layer waited for. Idempotent.
  Stats finish();

 private:
  using Clock = std::chrono::steady_clock;
  struct Item {
    int layer;
    std::string id;
    size_t slot;  // its place among the layer's blocks
  };
  void run();
  // Adds the time since the last event to the current layer's idle or busy figure (lock held).
  void account(Clock::time_point now);

  BlockStore& store_;
  int n_layers_;
  at::Device device_;
  int lookahead_;
  double max_bytes_per_s_;
  Clock::time_point link_free_;  // with a cap: when the link is free for the next block
  std::deque<Item> queue_;
  std::vector<std::vector<std::string>> ids_;              // [layer] queued so far
  std::vector<std::vector<Block>> blocks_;                 // [layer] in queue order
  std::vector<std::vector<std::exception_ptr>> errors_;    // [layer]
  std::vector<size_t> done_;                               // [layer] items finished
  int current_ = 0;       // the layer the consumer is at
  int waited_ = -1;       // the last layer handed out
  bool worker_idle_ = true;
  bool stop_ = false;
  Clock::time_point last_event_;
  Stats stats_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::thread worker_;
};

}  // namespace wm
