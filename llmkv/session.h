#pragma once
// A text session over the decoder: the context lives in one KvWindow with named regions
// ([system | blocks | recent] by default) and grows as prompts are fed and tokens generated;
// generate() prefills a prompt in chunks, then samples token by token, streaming text, until a
// stop token, a stop string or the token limit. Programs drive it. The window and a bank form
// the session's KvMemory; its memory policy (text_policy.h, "full" by default) observes every
// forward step and its plan is applied before the next one.
#include <ATen/ATen.h>

#include <chrono>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "llmkv/model.h"
#include "llmkv/sampling.h"
#include "llmkv/text_policy.h"
#include "llmkv/tokenizer.h"
#include "runtime/memory.h"

namespace wm::llm {

struct SessionOptions {
  int64_t prefill_chunk = 512;  // prompt tokens per forward pass
  std::vector<std::string> regions = {"system", "blocks", "recent"};
  int64_t reserve_tokens = 0;   // window capacity preallocated per layer
  TextMemoryConfig memory;      // the memory policy and its budget
  StoreConfig bank = {at::kCPU, 0};  // where banked blocks go (evoke): its tiers and budgets (the
                                     // device is the session's; by default none in the device
                                     // tier: the host, spilling to spill_dir under its budget)
  void validate() const;        // throws wm::Error naming the field
};

struct GenerateOptions {
  SamplingOptions sampling;
  int64_t max_new_tokens = 256;
  std::vector<int64_t> stop_tokens;       // generation ends on these (not shown in the text)
  std::vector<std::string> stop_strings;  // generation ends when the text shows one (cut there)
  // Called after each prefill chunk of the prompt with the prompt's tokens done and in all (a
  // program shows progress on long prompts). Should not throw: an exception there leaves the
  // context holding part of the prompt (reset() the session then).
  std::function<void(int64_t done, int64_t total)> on_prefill;
  // Each generated token's log-probability and its top_logprobs most probable alternatives
  // (Generation::logprobs), from the logits row the sampler was given (token_logprob: the model's
  // distribution, before temperature, top-k and top-p). Off: nothing is computed.
  bool logprobs = false;
  int64_t top_logprobs = 0;               // [0, kMaxTopLogprobs]; more than 0 only with logprobs
  void validate() const;                  // throws wm::Error naming the field
};

struct GenerationStats {
  int64_t prompt_tokens = 0;
  int64_t new_tokens = 0;
  double prefill_s = 0.0;  // the prompt's forward passes
  double ttft_s = 0.0;     // from the call to the first new token
  double decode_s = 0.0;   // the forward passes of generated tokens after the first
  size_t kv_bytes_used = 0;
  size_t kv_bytes_allocated = 0;
  int64_t kv_tokens = 0;       // in the window at the end, per layer (the mean over layers)
  int64_t kv_tokens_peak = 0;  // the most per layer after a step since the last reset()
  double prefill_tokens_per_s() const { return prefill_s > 0 ? prompt_tokens / prefill_s : 0.0; }
  // Tokens after the first over the time their forward passes took.
  double decode_tokens_per_s() const { return decode_s > 0 ? (new_tokens - 1) / decode_s : 0.0; }
};

struct Generation {
  std::vector<int64_t> tokens;  // generated, the stop token included when one ended it
  std::string text;             // decoded, cut before a stop string, without a stop token; valid UTF-8
                                // (bytes that form no character, and one cut short, as U+FFFD)
  std::string stop_reason;      // "stop_token", "stop_string" or "max_tokens"
  at::Tensor prompt_logits;     // [vocab] float32 (CPU) at the prompt's last position
  GenerationStats stats;
  std::vector<TokenLogprob> logprobs;  // one per entry of tokens with GenerateOptions::logprobs, else empty
};

using TextCallback = std::function<void(const std::string&)>;

// A piece of a generation's text as it becomes final and the generated tokens it completes:
// Generation::tokens[first, end). The pieces of a generation come in order and cover every
// generated token once, each token by the first piece after it: a token whose text is held back
// (an unfinished character, the possible start of a stop string) by the piece that shows it; the
// last piece, at the end, covers what is left (a stop token, the tokens of a stop string, text
// held back until then), its text possibly empty. A piece may cover no token (the held-back end
// of a text, at the end).
struct TextPiece {
  std::string text;  // valid UTF-8
  int64_t first = 0, end = 0;
  std::vector<TokenLogprob> logprobs;  // Generation::logprobs[first, end) when it carries them
};
using PieceCallback = std::function<void(const TextPiece&)>;

// Time and size of predict() / predict_pieces() since the last reset(): the prompt's pieces
// (prefill chunks, recall probes, breadcrumbs) before the first stepwise token, and the stepwise
// tokens (one per step, as decoding goes), with the window's peak bytes.
struct PredictStats {
  int64_t prompt_tokens = 0;
  double prompt_s = 0.0;       // time to the first stepwise token's logits: TTFT
  int64_t step_tokens = 0;
  double step_s = 0.0;
  size_t peak_window_bytes = 0;  // K, V and log-weights used, the most after any step
  double step_tokens_per_s() const { return step_s > 0 ? step_tokens / step_s : 0.0; }
};

// A piece of a teacher-forced text (LlmSession::predict): tokens [the previous piece's end, end).
struct PromptPiece {
  int64_t end = 0;
  std::string segment;    // its block id (pieces with one id form one block); empty: region "recent"
  bool message = false;   // a new user message: the memory policy may recall for it first
  bool stepwise = false;  // one token per step, as generated tokens arrive (else prefill chunks)
  std::string region;     // where the block goes; empty: "blocks" (a segment) or "recent" (none)
  // The block's tags for the memory policy (evoke's scorer), set when its first piece is fed.
  std::string kind;       // "system", "user", "assistant", "tool", "file", ...
  double priority = 0.0;  // higher leaves later
  bool pinned = false;    // never leaves
};

// A session's whole state, as LlmSession::snapshot() gives it and restore() takes it: the
// window's blocks in window order, the bank's blocks, the policy's state, the next position,
// the generated token not yet fed and the count of generations (each draws its own random
// stream). Blocks are on the CPU. Everything a process needs to go on with the conversation
// where another left it; what stores it is llmkv/session_store.h.
struct SessionSnapshot {
  // {"version": 1, "policy", "n_layers", "n_kv_heads", "head_dim", "next_pos", "pending" (an id
  // or null), "generations", "peak_tokens", "window": [[region, id], ...], "bank": [id, ...],
  // "policy_state": the policy's save_state()}
  nlohmann::json state;
  std::vector<Block> window;  // in the order of state["window"]
  std::vector<Block> bank;    // in the order of state["bank"]
};

class LlmSession;

// One generation driven a step at a time: LlmSession::generate() runs one to its end, and a
// server advances several sessions' generations together (decode_together() below: one
// LlmModel::step_batch for all). LlmSession::begin() makes it: the prompt fed, the first token
// sampled. While !done(), token() is the token to run next and advance() takes the logits after
// it, samples the next one and applies the stop rules; finish() gives what generate() gives.
// It holds its session by reference: the session must outlive it and run nothing else meanwhile.
class Decoding {
 public:
  bool done() const { return done_; }
  // The sampled token not yet run through the model (its logits give the next one). Throws
  // wm::Error once done().
  int64_t token() const;
  // After token() went through the model (LlmSession::step_token, or after_step in a batch):
  // its logits [vocab]. Samples the next token; done() when a stop rule or the limit ends it.
  void advance(const at::Tensor& logits);
  // Ends the generation here (a listener that left): done(), stop reason "cancelled". The
  // session keeps what was generated (the last sampled token pending).
  void cancel();
  // The generation so far, its stats completed (call once done()).
  Generation finish();
  LlmSession& session() { return *s_; }
  Decoding(Decoding&&) = default;

 private:
  friend class LlmSession;
  Decoding(LlmSession& s, const GenerateOptions& opt, PieceCallback on_piece, uint64_t seed);
  void take(const at::Tensor& logits);  // samples a token and applies the stop rules
  void emit(std::string text);          // a piece: `text` and the tokens since the last piece

  LlmSession* s_;
  GenerateOptions opt_;
  PieceCallback on_piece_;
  TokenSampler sampler_;
  StopStrings stops_;
  StreamDecoder stream_;
  Generation g_;
  std::chrono::steady_clock::time_point t0_, t_token_;
  int64_t n_text_ = 0;
  int64_t covered_ = 0;  // generated tokens the pieces so far cover
  double decode_s_ = 0.0;
  bool done_ = false, finished_ = false;
};

class LlmSession {
 public:
  // The tokenizer gives stop strings and text (a shared handle: copying it is cheap).
  LlmSession(LlmModel model, Tokenizer tokenizer, at::Device device, at::ScalarType dtype = at::kFloat,
             SessionOptions opt = {});

  // Appends tokens to the context (to `segment` of `region`; empty segment: the region's own
  // name), in chunks of prefill_chunk, after any generated token not yet fed. Returns the
  // logits [vocab] (float32, CPU) at the last token. Throws wm::Error on an empty input or an
  // id outside the vocabulary.
  at::Tensor feed(const std::vector<int64_t>& ids, const std::string& region = "recent",
                  const std::string& segment = "");
  // Appends tokens as a piece of context the way predict_pieces() feeds one (p.end unused): the
  // breadcrumbs the policy has first, a recall for a user message (p.message), the block's tags,
  // then the tokens in prefill chunks to p.segment of p.region ("blocks" by default for a segment,
  // "recent" without). A generated token not yet fed goes first, on its own into "recent".
  // Returns the logits [vocab] at the last token. Throws as feed() does.
  at::Tensor feed_piece(const std::vector<int64_t>& ids, const PromptPiece& p);
  // Moves what region "recent" holds (a prompt's tail and the reply generated after it, its last
  // generated token run first) into a block `id` of region "blocks" tagged `kind`, positions
  // unchanged: a block-wise policy (evoke) can then let it leave and bring it back like any other.
  // Throws wm::Error when `id` names a segment the window holds already.
  void seal_recent(const std::string& id, const std::string& kind);

  // Feeds the prompt (may be empty right after feed() or a generation: the context then ends
  // where generation starts), then generates. on_text receives the text as it becomes final.
  // Ids the model has beyond the tokenizer's vocabulary are never sampled. Each call draws a
  // random stream of its own (seed and call count). Throws wm::Error on bad options or ids; a
  // failed feed leaves the context as it was.
  Generation generate(const std::vector<int64_t>& prompt, const GenerateOptions& opt, const TextCallback& on_text = {});
  // generate() a step at a time (see Decoding): feeds the prompt and samples the first token.
  // on_piece receives the text as it becomes final with the tokens each piece completes
  // (TextPiece). Throws as generate() does.
  Decoding begin(const std::vector<int64_t>& prompt, const GenerateOptions& opt, const PieceCallback& on_piece = {});
  // Runs the pending token (a Decoding's token()) through the model and returns its logits
  // [vocab] (float32, CPU), the memory policy acting after the step.
  at::Tensor step_token(int64_t token);
  // The same split for a caller that runs the model itself over several sessions at once: the
  // options a decode step of this session takes (what its policy wants captured), and, after
  // the caller ran `token` at next_position() over window() with them, the step's result for
  // this session: the policy acts, and the logits [vocab] come back as step_token() gives them.
  StepOptions decode_options() const;
  at::Tensor after_step(int64_t token, StepResult r);

  // Teacher forcing: feeds ids as a prompt and its continuation would arrive, the memory policy
  // acting after every step, and returns the greedy prediction after each token: out[i] is the
  // argmax of the logits at ids[i] (among the tokenizer's ids). `cuts` split ids into prompt
  // pieces [0, c0), [c0, c1), ... each fed in prefill chunks (a policy that acts when a prompt
  // ends sees each piece end); the tokens after the last cut go one per step, as generated ones
  // would. No cuts: all of ids in prefill chunks. Throws wm::Error as feed() does, or when the
  // cuts are not strictly increasing within [1, ids.size()].
  std::vector<int64_t> predict(const std::vector<int64_t>& ids, const std::vector<int64_t>& cuts);
  // The same over explicit pieces (their ends strictly increasing, the last = ids.size()): block
  // ids for block-wise policies, user messages the policy recalls for (recall()), stepwise parts.
  std::vector<int64_t> predict_pieces(const std::vector<int64_t>& ids, const std::vector<PromptPiece>& pieces);
  // Asks the next predict() / predict_pieces() to keep the log-probabilities (over the
  // tokenizer's ids, float32, CPU) after the tokens at these indices of its ids, and hands
  // them over in the order given and clears the request (take_log_probs).
  void keep_log_probs(std::vector<int64_t> at) { lp_at_ = std::move(at), lp_.clear(); }
  std::vector<at::Tensor> take_log_probs();

  // The position the next token takes (a pending generated one included): the count of tokens
  // in the context unless the memory policy re-anchors.
  int64_t next_position() const { return next_pos_ + (pending_ ? 1 : 0); }
  // The last generated token, sampled and not yet run through the model (the next feed or
  // generate() runs it first); none after a feed.
  std::optional<int64_t> pending_token() const { return pending_; }
  const KvWindow& window() const { return memory_.window(); }
  KvWindow& window() { return memory_.window(); }
  const KvMemory& memory() const { return memory_; }
  const TextPolicy& policy() const { return *policy_; }
  // Tokens the window holds per layer (the mean over layers: pyramidkv's layers differ), now
  // and at most after a step since the last reset().
  int64_t tokens_per_layer() const;
  int64_t peak_tokens() const { return peak_tokens_; }
  const PredictStats& predict_stats() const { return pstats_; }
  LlmModelImpl& model() { return *model_; }
  const Tokenizer& tokenizer() const { return tok_; }
  at::Device device() const { return device_; }
  // Empties the context.
  void reset();

  // The session's state (see SessionSnapshot). Throws wm::Error when the memory policy keeps
  // state a snapshot does not hold (TextPolicy::save_state).
  SessionSnapshot snapshot() const;
  // Replaces the session's state with a snapshot's. Throws wm::Error when it was taken with
  // another memory policy or a model of another K/V shape, wm::CorruptData when it does not hold
  // together (blocks missing or of the wrong shape, a malformed state); the session is then
  // empty, as after reset(). After a restore the next generate() needs a prompt or a pending
  // token (the last logits are not part of a snapshot).
  void restore(const SessionSnapshot& snap);

 private:
  // Runs ids in chunks (of `chunk` tokens, prefill_chunk if 0), the policy acting after each;
  // the logits at the last token, and the argmax after every token in *argmax if given.
  at::Tensor run(const std::vector<int64_t>& ids, const std::string& region, const std::string& segment,
                 int64_t chunk = 0, std::vector<int64_t>* argmax = nullptr);
  // After a forward step of c tokens (`tokens`, CPU) into `segment`: the policy observes it and
  // its plan is applied; positions and peaks follow.
  void observe_step(StepResult& r, const at::Tensor& tokens, int64_t c, const std::string& segment);
  // When the policy wants it: probes a new user message (nothing appended) and applies the
  // policy's recall plan for it.
  void recall_for(const std::vector<int64_t>& message);
  // Feeds the breadcrumbs the policy has for blocks it dropped (recovery "breadcrumb").
  void feed_breadcrumbs();
  // Runs the generated token not yet fed (if any) into "recent".
  void feed_pending();
  // One piece of predict_pieces() / feed_piece(): its logits at the last token.
  at::Tensor piece(const std::vector<int64_t>& part, const PromptPiece& p, std::vector<int64_t>* argmax);

  LlmModel model_;
  Tokenizer tok_;
  at::Device device_;
  SessionOptions opt_;
  KvMemory memory_;
  std::unique_ptr<TextPolicy> policy_;
  int64_t next_pos_ = 0;
  int64_t peak_tokens_ = 0;
  PredictStats pstats_;
  std::optional<int64_t> pending_;  // the last generated token, not yet run through the model
  at::Tensor last_logits_;          // [vocab] at the last token run (CPU)
  int64_t generations_ = 0;         // generate() calls so far (each draws its own random stream)
  std::vector<int64_t> lp_at_;      // keep_log_probs(): indices into predict()'s ids
  std::vector<at::Tensor> lp_;      // their log-probabilities, by index (undefined until seen)
  std::function<void(int64_t, int64_t)> on_chunk_;  // generate()'s on_prefill while it feeds
  int64_t lp_base_ = 0;             // the index of the next token run() sees in predict()
  friend class Decoding;
};

// One decode step of several generations together, each of its own session (one model): their
// pending tokens run as one LlmModel::step_batch, each session's memory policy acts on its own
// step, each generation advances. Generations already done are skipped. Each generation's
// tokens are those its session's generate() gives alone (up to the rounding of batched
// products: the same greedy tokens in practice). Throws wm::Error when two share a session or the
// sessions run different models.
void decode_together(const std::vector<Decoding*>& ds);

}  // namespace wm::llm
