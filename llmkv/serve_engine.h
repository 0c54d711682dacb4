#pragma once
// The serving engine under wm_serve (tools/serve): named chat sessions that persist between
// requests, each with its own KV window and memory policy, and continuous batching: up to
// `parallel` generations decode together, one LlmModel::step_batch a step (decode_together),
// a new request joining at the next step and a finished or abandoned one leaving at once. One
// thread (the engine's) runs the model; submit() may be called from any thread. No HTTP here:
// the program parses requests into ServeRequest and writes what comes back.
//
// A request's new context comes as blocks (messages) and a tail (the assistant's header). Under
// a block-wise memory policy (evoke) each block is fed as a block of its own (a user message
// recalled for first) and the tail with the reply becomes one more ("assistant") once the
// request ends, so that the policy can bank any turn and bring it back; under a token-wise one
// blocks and tail are one prompt.
//
// With a state folder (ServeOptions::state_dir, llmkv/session_files.h) every named session is
// saved there when a request of it ends (its snapshot taken on the engine's thread, written on
// a thread of its own while the others decode), before its answer is delivered; an engine opened on
// the folder again finds the sessions there: a session whose last answer was delivered is found
// with that answer, whatever happened to the process after. Idle sessions beyond the memory
// budget then leave memory for the folder alone and come back on their next request.
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <array>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "llmkv/session.h"
#include "llmkv/session_files.h"
#include "runtime/error.h"

namespace wm::llm {

struct ServeOptions {
  int parallel = 4;           // generations decoding together
  int queue_limit = 16;       // requests waiting for a slot; beyond, submit() refuses (ServeBusy)
  size_t max_sessions = 256;  // named sessions in memory; beyond, the least recently used idle one leaves
  // K/V bytes the idle named sessions may hold in memory; beyond, the least recently used leave
  // it. Leaving is to the state folder when there is one; without one, or when the session's last
  // save failed (a full or read-only disk: its answer said so, ServeResult::saved), it ends. The
  // limits hold whatever the disk does.
  size_t session_memory = size_t{1} << 30;
  std::string state_dir;      // where sessions are saved (see above); empty: in memory only
  // Bytes the state folder's session files may take (0: no limit). Beyond, the least recently
  // used saved sessions that are neither in use nor in memory end (their files removed).
  size_t state_max_bytes = 0;
  SessionOptions session;     // every session's: memory policy and budget, prefill chunk
  // Warnings: a damaged session file, a save that failed. Default: standard error.
  std::function<void(const std::string&)> log;
  void validate() const;      // throws wm::Error naming the field
};

// A piece of a request's new context: a message, as tokens.
struct ServeBlock {
  std::vector<int64_t> tokens;
  std::string kind;      // "system", "user", "assistant", "tool", ...: the block's tag for the policy
  bool message = false;  // a new user message: a recalling policy brings back what it needs first
};

struct ServeRequest {
  std::string session;          // a named session to continue (made when new); empty: one-shot
  std::vector<ServeBlock> blocks;  // the request's new context before the tail (may be empty)
  std::vector<int64_t> prompt;  // the tail, fed last (may be empty when blocks are not)
  GenerateOptions gen;
  // A named session's note when this request ends (answered or cancelled), from what it
  // generated and the note before (null for a new session): what the program keeps of the
  // conversation beside its K/V. Saved with the session; called on the engine's thread.
  std::function<nlohmann::json(const Generation&, const nlohmann::json& before)> note;
  // The text as it becomes final (valid UTF-8), with the generated tokens each piece completes
  // and, with gen.logprobs, their log-probabilities (TextPiece: the pieces cover every token once;
  // the last may have no text), on the engine's thread. Returning false says nobody listens any
  // more: the generation ends at the next step ("cancelled") and frees its slot.
  std::function<bool(const TextPiece&)> on_text;
  // A named session's request that may be sent again (a client retrying after a lost answer):
  // when the session's last request ended with the same key, it is not fed again; its answer
  // comes back as it was (ServeResult::replayed: its text, stop reason and counts; not its
  // logprobs), on_text not called. Empty: none.
  std::string idempotency_key;
};

struct ServeResult {
  // stop_reason "cancelled" when the listener left, "interrupted" when drain()'s time limit cut
  // it (its session keeps what was generated).
  Generation generation;
  std::string error;          // non-empty: the request failed before generating (the reason)
  bool stopped = false;       // with error: the engine stopped before it ran (HTTP 503)
  bool bad_request = false;   // with error: the request cannot run as asked (HTTP 400): its
                              // context would pass the model's positions
  bool saved = true;          // false: its session's state could not be written to the state
                              // folder (it stays in memory while the limits allow; see trim)
  bool replayed = false;      // the answer of the session's last request, whose idempotency key
                              // this one repeated (nothing was fed or generated)
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
  int64_t saves = 0, save_failed = 0, save_bytes = 0;  // session files written (state folder)
  int64_t loads = 0, load_failed = 0;  // sessions brought back from the folder; found damaged
  int64_t unloaded = 0;                // idle sessions that left memory for the folder
  int64_t evictions = 0, recoveries = 0;  // blocks the sessions' policies banked and brought back
  int64_t ended = 0;                   // idle sessions ended beyond the limits (no folder, or
                                       // their state could not be saved)
  int64_t replayed = 0;                // requests answered from their idempotency key
  int64_t state_evicted = 0;           // saved sessions the state folder's budget ended
  int64_t too_long = 0;                // requests refused: their context would pass the model's positions
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
  // request does; either way this returns once it has ended and its file is gone from the state
  // folder.
  bool erase_session(const std::string& id);
  bool has_session(const std::string& id) const;
  // The position the named session's next token takes (0 for a new or unknown one), as of the
  // end of its last request.
  int64_t session_position(const std::string& id) const;
  // What the engine holds of a named session, as of the end of its last request.
  struct SessionInfo {
    int64_t turns = 0;      // requests that ended in it
    int64_t position = 0;   // as session_position()
    bool in_memory = false; // else only in the state folder
    size_t kv_bytes = 0;    // its window's K/V in memory
    nlohmann::json note;    // ServeRequest::note's last (null before any)
  };
  std::optional<SessionInfo> session_info(const std::string& id) const;
  // Stops taking requests; those queued and running finish, and their sessions' files are
  // written. Returns when they have. With a time limit (seconds >= 0), what is still queued then
  // is answered "stopped" and what runs ends as cancelled (its session saved as far as it got).
  void drain(double seconds = -1);

  static const std::vector<double>& ttft_bounds();   // seconds
  static const std::vector<double>& token_bounds();  // seconds between tokens
  ServeCounters counters() const;
  int64_t active() const;    // generations decoding now
  int64_t queued() const;
  int64_t sessions() const;  // named sessions held (in memory or in the state folder)
  int64_t sessions_in_memory() const;
  size_t kv_bytes() const;   // K/V bytes used by the held sessions' windows
  std::array<size_t, kTiers> bank_bytes() const;  // their banks' bytes per tier
  const ServeOptions& options() const { return opt_; }

 private:
  struct Held {
    std::unique_ptr<LlmSession> session;  // null while only in the folder (or not made yet)
    bool busy = false, doomed = false;
    bool stored = false;  // a file in the state folder holds its state as of its last request
    int saving = 0;       // its snapshots waiting to be written (it stays in memory meanwhile)
    uint64_t incarnation = 0;  // which session of this name (one ended and made anew is another)
    std::vector<std::shared_ptr<std::promise<void>>> erase_waiters;  // DELETEs of it while busy
    size_t kv_bytes = 0;  // its window's K/V and its bank's blocks in memory (device and host)
    std::array<size_t, kTiers> bank_bytes{};  // its bank's, per tier
    int64_t position = 0, turns = 0;
    nlohmann::json note;
    std::string last_key;  // the idempotency key of its last request, and that request's answer
    Generation last;
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
    bool interrupted = false;  // cut by drain's time limit
    int64_t turn = 0, block_tokens = 0;  // the session's turn this is; tokens fed as blocks
    int64_t evictions0 = 0, recoveries0 = 0;  // its session's policy's counts when it started
    std::chrono::steady_clock::time_point t0, t_last;
  };
  void loop();
  void start_job(std::unique_ptr<Job> job);
  // A named session's state back from the folder into s: "" when done, else why not (the
  // session then starts afresh, its file gone).
  std::string bring_back(Running& r, LlmSession* s);
  // Feeds the request's blocks and prompt into s and starts its decoding. Throws what feeding
  // throws; *too_long when the context would pass the model's positions (nothing fed then).
  void feed(Running& r, LlmSession* s, const PieceCallback& on_text, bool* too_long);
  void finish(Running& r);
  // Request over: named session `id` (its Held h, null for a one-shot request) is free again, or
  // ends if a DELETE came meanwhile.
  void release(const std::string& id, Held* h, LlmSession* s);
  // A named session's snapshot or end for the writer thread, in order; a request's answer waits
  // for its snapshot's write.
  struct FileOp {
    std::string id;
    uint64_t incarnation = 0;  // the Held's it was taken of
    bool erase = false;
    SessionSnapshot snap;
    nlohmann::json note;
    std::unique_ptr<Job> job;  // answered once written (null for an erase)
    ServeResult result;
    std::vector<std::shared_ptr<std::promise<void>>> erased;  // DELETEs waiting for this erase
  };
  void writer_loop();
  void queue_file_op(FileOp op);
  // Idle sessions beyond max_sessions or session_memory leave memory (under mu_).
  void trim();
  void warn(const std::string& msg) const;
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
  std::mutex files_mu_;  // files_'s (the writer thread's, and the engine thread's loads)
  std::unique_ptr<SessionFiles> files_;
  std::mutex w_mu_;
  std::condition_variable w_cv_;
  std::deque<FileOp> w_queue_;
  bool w_stop_ = false;
  int64_t pending_writes_ = 0;  // answers waiting for their session's write (under mu_)
  uint64_t incarnations_ = 0;   // Held::incarnation's source (under mu_)
  std::thread writer_;
  bool stopping_ = false;
  bool cut_ = false;  // drain's time is up: running generations end now
  std::thread thread_;
};

}  // namespace wm::llm
