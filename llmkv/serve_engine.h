#pragma once
// The serving engine under wm_serve (tools/serve): named chat sessions that persist between
// requests, each with its own KV window and memory policy, and continuous batching: up to
// `parallel` generations decode together, one LlmModel::step_batch a step (decode_together),
// a new request joining at the next step and a finished or abandoned one leaving at once. One
// thread (the engine's) runs the model; submit() may be called from any thread. No HTTP here:
// the program parses requests into ServeRequest and writes what comes back.
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "llmkv/session.h"
#include "runtime/error.h"

namespace wm::llm {

struct ServeOptions {
  int parallel = 4;           // generations decoding together
  int queue_limit = 16;       // requests waiting for a slot; beyond, submit() refuses (ServeBusy)
  size_t max_sessions = 256;  // named sessions kept; beyond, the least recently used idle one goes
  SessionOptions session;     // every session's: memory policy and budget, prefill chunk
  void validate() const;      // throws wm::Error naming the field
};

struct ServeRequest {
  std::string session;          // a named session to continue (made when new); empty: one-shot
  std::vector<int64_t> prompt;  // the tokens fed before generating: the request's new turn
  GenerateOptions gen;
  // The text as it becomes final, on the engine's thread. Returning false says nobody listens
  // any more: the generation ends at the next step ("cancelled") and frees its slot.
  std::function<bool(const std::string&)> on_text;
};

struct ServeResult {
  Generation generation;  // stop_reason "cancelled" when the listener left
  std::string error;      // non-empty: the request failed before generating (the reason)
};

// submit() when the queue is full: the caller answers "try later" (HTTP 429).
struct ServeBusy : Error {
  using Error::Error;
};

// Latency histograms and counters, as /metrics shows them.
struct ServeCounters {
  int64_t requests = 0, refused = 0, cancelled = 0, failed = 0;
  int64_t prompt_tokens = 0, completion_tokens = 0;
  int64_t batched_steps = 0, batched_tokens = 0;  // decode_together calls and tokens they made
  std::vector<int64_t> ttft_buckets, token_buckets;  // counts at or below each bound (cumulative)
  double ttft_sum = 0, token_sum = 0;
  int64_t ttft_count = 0, token_count = 0;
};

class ServeEngine {
 public:
  // Starts the engine's thread. Throws wm::Error on bad options.
  ServeEngine(LlmModel model, Tokenizer tokenizer, at::Device device, at::ScalarType dtype, ServeOptions opt);
  // Finishes what runs and what waits, then stops.
  ~ServeEngine();
  ServeEngine(const ServeEngine&) = delete;
  ServeEngine& operator=(const ServeEngine&) = delete;

  // Queues a request; the future is ready when it ended. Throws ServeBusy when queue_limit
  // requests wait already, wm::Error once the engine stops.
  std::future<ServeResult> submit(ServeRequest req);
  // Ends named session `id`: true if it was there. A session a request is using ends when that
  // request does.
  bool erase_session(const std::string& id);
  bool has_session(const std::string& id) const;
  // The position the named session's next token takes (0 for a new or unknown one), as of the
  // end of its last request.
  int64_t session_position(const std::string& id) const;
  // Stops taking requests; those queued and running finish. Returns when they have.
  void drain();

  static const std::vector<double>& ttft_bounds();   // seconds
  static const std::vector<double>& token_bounds();  // seconds between tokens
  ServeCounters counters() const;
  int64_t active() const;    // generations decoding now
  int64_t queued() const;
  int64_t sessions() const;  // named sessions held
  size_t kv_bytes() const;   // K/V bytes used by the held sessions' windows
  const ServeOptions& options() const { return opt_; }

 private:
  struct Held {
    std::unique_ptr<LlmSession> session;
    bool busy = false, doomed = false;
    size_t kv_bytes = 0;
    int64_t position = 0;
  };
  struct Job {
    ServeRequest req;
    std::promise<ServeResult> done;
  };
  struct Running {
    std::unique_ptr<Job> job;
    Held* held = nullptr;
    std::unique_ptr<LlmSession> oneshot;  // a request without a session
    std::unique_ptr<Decoding> decoding;
    bool cancelled = false;
    std::chrono::steady_clock::time_point t0, t_last;
  };
  void loop();
  void start_job(std::unique_ptr<Job> job);
  void finish(Running& r);
  void release(Held* h, LlmSession* s);
  Held& held_session(const std::string& id);  // under mu_

  LlmModel model_;
  Tokenizer tok_;
  at::Device device_;
  at::ScalarType dtype_;
  ServeOptions opt_;
  mutable std::mutex mu_;
  std::condition_variable cv_, idle_cv_;
  std::deque<std::unique_ptr<Job>> queue_;
  std::map<std::string, Held> held_;
  std::list<std::string> lru_;  // named sessions, least recently used first
  std::vector<std::unique_ptr<Running>> running_;  // the engine thread's alone (active_ mirrors its size)
  int64_t active_ = 0;
  ServeCounters counters_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace wm::llm
