#include "llmkv/session.h"

#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>
#include <chrono>

#include "runtime/error.h"

namespace wm::llm {

namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }
}  // namespace

void SessionOptions::validate() const {
  WM_CHECK(prefill_chunk > 0, "prefill_chunk must be > 0, got ", prefill_chunk);
  WM_CHECK(!regions.empty(), "a session needs at least one region");
  WM_CHECK(std::find(regions.begin(), regions.end(), "recent") != regions.end(),
           "the regions must include \"recent\" (where generated tokens go)");
  WM_CHECK(reserve_tokens >= 0, "reserve_tokens must be >= 0, got ", reserve_tokens);
  memory.validate();
}

void GenerateOptions::validate() const {
  sampling.validate();
  WM_CHECK(max_new_tokens > 0, "max_new_tokens must be > 0, got ", max_new_tokens);
  WM_CHECK(top_logprobs >= 0 && top_logprobs <= kMaxTopLogprobs, "top_logprobs must be in [0, ", kMaxTopLogprobs,
           "], got ", top_logprobs);
  WM_CHECK(logprobs || top_logprobs == 0, "top_logprobs needs logprobs");
}

LlmSession::LlmSession(LlmModel model, Tokenizer tokenizer, at::Device device, at::ScalarType dtype,
                       SessionOptions opt)
    : model_(std::move(model)),
      tok_(std::move(tokenizer)),
      device_(device),
      opt_((opt.validate(), opt)),
      memory_(model_->kv_spec(device, dtype), opt_.regions, opt_.bank),
      policy_(make_text_policy(opt_.memory)) {
  if (opt_.reserve_tokens > 0) memory_.window().reserve(opt_.reserve_tokens);
}

int64_t LlmSession::tokens_per_layer() const {
  const KvWindow& w = memory_.window();
  int64_t total = 0;
  for (int l = 0; l < w.spec().n_layers; ++l) total += w.size(l);
  return total / w.spec().n_layers;
}

SessionSnapshot LlmSession::snapshot() const {
  SessionSnapshot s;
  const KvWindow& w = memory_.window();
  const KvSpec& spec = w.spec();
  nlohmann::json window = nlohmann::json::array(), bank = nlohmann::json::array();
  for (const auto& region : w.layout().region_names())
    for (const auto& seg : w.layout().segments(w.layout().region(region))) {
      window.push_back({region, seg.id});
      s.window.push_back(w.extract(seg.id).to(at::kCPU));
    }
  for (const auto& id : memory_.bank().ids()) {
    bank.push_back(id);
    s.bank.push_back(memory_.bank().peek(id).to(at::kCPU));
  }
  s.state = {{"version", 1},
             {"policy", policy_->name()},
             {"n_layers", spec.n_layers},
             {"n_kv_heads", spec.n_kv_heads},
             {"head_dim", spec.head_dim},
             {"kv_dtype", c10::toString(spec.dtype)},
             {"next_pos", next_pos_},
             {"pending", pending_ ? nlohmann::json(*pending_) : nlohmann::json(nullptr)},
             {"generations", generations_},
             {"peak_tokens", peak_tokens_},
             {"window", window},
             {"bank", bank},
             {"policy_state", policy_->save_state()}};
  return s;
}

void LlmSession::restore(const SessionSnapshot& snap) {
  const nlohmann::json& j = snap.state;
  const KvSpec& spec = memory_.window().spec();
  try {
    WM_CHECK(j.is_object() && j.value("version", 0) == 1, "a session snapshot of an unknown version");
    const std::string policy = j.at("policy").get<std::string>();
    WM_CHECK(policy == policy_->name(), "the snapshot was taken with memory policy '", policy, "', this session runs '",
             policy_->name(), "'");
    WM_CHECK(j.at("n_layers").get<int>() == spec.n_layers && j.at("n_kv_heads").get<int64_t>() == spec.n_kv_heads &&
                 j.at("head_dim").get<int64_t>() == spec.head_dim,
             "the snapshot's K/V are ", j.at("n_layers").dump(), " layers x ", j.at("n_kv_heads").dump(), " heads x ",
             j.at("head_dim").dump(), ", this model's ", spec.n_layers, " x ", spec.n_kv_heads, " x ", spec.head_dim);
    WM_CHECK(j.at("kv_dtype").get<std::string>() == c10::toString(spec.dtype), "the snapshot's K/V are ",
             j.at("kv_dtype").get<std::string>(), ", this session keeps ", c10::toString(spec.dtype));
  } catch (const nlohmann::json::exception& e) {
    throw CorruptData(str_cat("a malformed session snapshot: ", e.what()));
  }
  reset();
  memory_.clear();
  try {
    const auto& window = j.at("window");
    const auto& bank = j.at("bank");
    if (window.size() != snap.window.size() || bank.size() != snap.bank.size())
      throw CorruptData(str_cat("the session snapshot lists ", window.size(), " window and ", bank.size(),
                                " bank blocks and holds ", snap.window.size(), " and ", snap.bank.size()));
    MemoryPlan plan;
    for (size_t i = 0; i < snap.window.size(); ++i) {
      const std::string region = window[i].at(0).get<std::string>(), id = window[i].at(1).get<std::string>();
      if (snap.window[i].id != id)
        throw CorruptData(str_cat("window block ", i, " is '", snap.window[i].id, "', the snapshot lists '", id, "'"));
      plan.insert(region, snap.window[i].to(device_));
    }
    for (size_t i = 0; i < snap.bank.size(); ++i) {
      if (snap.bank[i].id != bank[i].get<std::string>())
        throw CorruptData(str_cat("bank block ", i, " is '", snap.bank[i].id, "', the snapshot lists ", bank[i].dump()));
      plan.store(snap.bank[i], Tier::Device);
    }
    memory_.apply(std::move(plan));
    next_pos_ = j.at("next_pos").get<int64_t>();
    if (!j.at("pending").is_null()) pending_ = j.at("pending").get<int64_t>();
    generations_ = j.at("generations").get<int64_t>();
    peak_tokens_ = j.at("peak_tokens").get<int64_t>();
    policy_->load_state(j.at("policy_state"), memory_);
  } catch (const nlohmann::json::exception& e) {
    reset();
    memory_.clear();
    throw CorruptData(str_cat("a malformed session snapshot: ", e.what()));
  } catch (...) {
    reset();
    memory_.clear();
    throw;
  }
}

void LlmSession::reset() {
  memory_.window().clear();
  policy_->reset();
  next_pos_ = 0;
  peak_tokens_ = 0;
  pstats_ = PredictStats{};
  pending_.reset();
  last_logits_ = at::Tensor();
}

at::Tensor LlmSession::run(const std::vector<int64_t>& ids, const std::string& region, const std::string& segment,
                          int64_t chunk, std::vector<int64_t>* argmax) {
  const int64_t V = model_->config().vocab_size;
  for (int64_t id : ids) WM_CHECK(id >= 0 && id < V, "token id ", id, " is outside the vocabulary [0, ", V, ")");
  torch::NoGradGuard no_grad;
  StepOptions so;
  so.region = region;
  so.segment = segment.empty() ? region : segment;
  so.all_logits = argmax != nullptr;
  const StepNeeds needs = policy_->step_needs();
  so.capture_mass = needs.key_mass;
  so.mass_queries = needs.mass_queries;
  so.capture_query = needs.query;
  if (chunk <= 0) chunk = opt_.prefill_chunk;
  const int64_t n_text = std::min<int64_t>(tok_.vocab_size(), V);
  at::Tensor all = at::tensor(ids, at::kLong);
  at::Tensor logits;
  const int64_t n = static_cast<int64_t>(ids.size());
  for (int64_t s = 0; s < n; s += chunk) {
    const int64_t c = std::min(chunk, n - s);
    at::Tensor pos = at::arange(next_pos_, next_pos_ + c, at::kLong);
    StepResult r = model_->step(all.narrow(0, s, c).to(device_), pos, memory_.window(), so);
    logits = r.logits;
    if (argmax) {
      at::Tensor am = (n_text < V ? logits.narrow(1, 0, n_text) : logits).argmax(-1).to(at::kCPU);
      argmax->insert(argmax->end(), am.data_ptr<int64_t>(), am.data_ptr<int64_t>() + am.numel());
      for (size_t k = 0; k < lp_at_.size(); ++k) {
        const int64_t row = lp_at_[k] - lp_base_;
        if (row >= 0 && row < c)
          lp_[k] = (n_text < V ? logits[row].narrow(0, 0, n_text) : logits[row]).to(at::kCPU, at::kFloat).log_softmax(0);
      }
      lp_base_ += c;
    }
    observe_step(r, all.narrow(0, s, c), c, so.segment);
    if (on_chunk_) on_chunk_(s + c, n);
  }
  return logits[-1].reshape({-1}).to(at::kCPU, at::kFloat);
}

void LlmSession::observe_step(StepResult& r, const at::Tensor& tokens, int64_t c, const std::string& segment) {
  const StepNeeds needs = policy_->step_needs();
  StepView view;
  view.fresh = c;
  view.segment = segment;
  view.tokens = tokens;
  if (needs.hidden) view.hidden = r.hidden;
  view.key_mass = std::move(r.key_mass);
  view.query = std::move(r.query);
  memory_.apply(policy_->observe(memory_, view));
  next_pos_ = policy_->next_position(memory_.window(), next_pos_ + c);
  peak_tokens_ = std::max(peak_tokens_, tokens_per_layer());
  pstats_.peak_window_bytes = std::max(pstats_.peak_window_bytes, memory_.window().bytes_used());
}

StepOptions LlmSession::decode_options() const {
  StepOptions so;
  so.region = "recent";
  so.segment = "recent";
  const StepNeeds needs = policy_->step_needs();
  so.capture_mass = needs.key_mass;
  so.mass_queries = needs.mass_queries;
  so.capture_query = needs.query;
  return so;
}

at::Tensor LlmSession::step_token(int64_t token) {
  WM_CHECK(pending_ && *pending_ == token, "step_token(", token, ") runs the pending token only");
  last_logits_ = run({token}, "recent", "recent");
  pending_.reset();
  return last_logits_;
}

at::Tensor LlmSession::after_step(int64_t token, StepResult r) {
  WM_CHECK(pending_ && *pending_ == token, "after_step(", token, ") takes the pending token's step only");
  observe_step(r, at::full({1}, token, at::kLong), 1, "recent");
  last_logits_ = r.logits[-1].reshape({-1}).to(at::kCPU, at::kFloat);
  pending_.reset();
  return last_logits_;
}

std::vector<int64_t> LlmSession::predict(const std::vector<int64_t>& ids, const std::vector<int64_t>& cuts) {
  const int64_t n = static_cast<int64_t>(ids.size());
  std::vector<PromptPiece> pieces;
  for (int64_t c : cuts) pieces.push_back({c, "", false, false});
  const int64_t last = cuts.empty() ? n : cuts.back();
  if (last < n || pieces.empty()) pieces.push_back({n, "", false, last < n});
  return predict_pieces(ids, pieces);
}

std::vector<int64_t> LlmSession::predict_pieces(const std::vector<int64_t>& ids, const std::vector<PromptPiece>& pieces) {
  const int64_t n = static_cast<int64_t>(ids.size());
  WM_CHECK(n > 0, "predict() needs at least one token");
  int64_t prev = 0;
  for (const auto& p : pieces) {
    WM_CHECK(p.end > prev && p.end <= n, "pieces must end strictly increasing within [1, ", n, "], got ", p.end,
             " after ", prev);
    prev = p.end;
  }
  WM_CHECK(prev == n, "the pieces end at ", prev, ", the ids at ", n);
  WM_CHECK(!pending_, "predict() needs a context without a pending generated token (feed it first)");
  std::vector<int64_t> out;
  out.reserve(ids.size());
  for (int64_t i : lp_at_) WM_CHECK(i >= 0 && i < n, "log-probabilities asked after token ", i, " of ", n);
  lp_.assign(lp_at_.size(), at::Tensor());
  lp_base_ = 0;
  int64_t begin = 0;
  for (const auto& p : pieces) {
    const auto t0 = Clock::now();
    const std::vector<int64_t> part(ids.begin() + begin, ids.begin() + p.end);
    last_logits_ = piece(part, p, &out);
    // The prompt's time runs until the first stepwise token; from there every piece is decoding's.
    if (p.stepwise || pstats_.step_tokens > 0) {
      pstats_.step_tokens += static_cast<int64_t>(part.size());
      pstats_.step_s += seconds_since(t0);
    } else {
      pstats_.prompt_tokens += static_cast<int64_t>(part.size());
      pstats_.prompt_s += seconds_since(t0);
    }
    begin = p.end;
  }
  return out;
}

at::Tensor LlmSession::piece(const std::vector<int64_t>& part, const PromptPiece& p, std::vector<int64_t>* argmax) {
  feed_breadcrumbs();
  if (p.message) recall_for(part);
  const std::string region = !p.region.empty() ? p.region : p.segment.empty() ? "recent" : "blocks";
  const std::string segment = p.segment.empty() ? region : p.segment;
  if ((!p.kind.empty() || p.priority != 0.0 || p.pinned) && memory_.window().layout().find(segment).first < 0) {
    // A new block's tags go on first (its segment made, empty): the policy sees them from its first step.
    BlockMeta meta;
    meta.kind = p.kind, meta.priority = p.priority, meta.pinned = p.pinned;
    memory_.apply(MemoryPlan().tag(segment, std::move(meta), region));
  }
  return run(part, region, segment, p.stepwise ? 1 : 0, argmax);
}

at::Tensor LlmSession::feed_piece(const std::vector<int64_t>& ids, const PromptPiece& p) {
  WM_CHECK(!ids.empty(), "nothing to feed");
  feed_pending();
  last_logits_ = piece(ids, p, nullptr);
  return last_logits_;
}

void LlmSession::feed_pending() {
  if (!pending_) return;
  last_logits_ = run({*pending_}, "recent", "recent");
  pending_.reset();
}

void LlmSession::seal_recent(const std::string& id, const std::string& kind) {
  KvWindow& w = memory_.window();
  const auto& layout = w.layout();
  WM_CHECK(layout.find(id).first < 0, "seal_recent: the window holds a segment '", id, "' already");
  feed_pending();
  std::vector<std::string> segs;
  for (const auto& seg : layout.segments(layout.region("recent")))
    if (layout.segment_len(0, seg.id) > 0) segs.push_back(seg.id);
  for (const auto& sid : segs) {
    Block b = w.extract(sid);
    b.id = segs.size() == 1 ? id : str_cat(id, ".", sid);
    b.meta.kind = kind;
    memory_.apply(MemoryPlan().drop(sid).insert("blocks", std::move(b)));
  }
}

std::vector<at::Tensor> LlmSession::take_log_probs() {
  std::vector<at::Tensor> out = std::move(lp_);
  lp_.clear();
  lp_at_.clear();
  return out;
}

void LlmSession::feed_breadcrumbs() {
  // Feeding may drop more blocks, and so leave more breadcrumbs (never for a breadcrumb).
  for (auto crumbs = policy_->take_breadcrumbs(); !crumbs.empty(); crumbs = policy_->take_breadcrumbs())
    for (const auto& [id, text] : crumbs) run(tok_.encode(text, false), "blocks", id);
}

void LlmSession::recall_for(const std::vector<int64_t>& message) {
  if (!policy_->wants_recall() || message.empty()) return;
  const int64_t V = model_->config().vocab_size;
  for (int64_t id : message) WM_CHECK(id >= 0 && id < V, "token id ", id, " is outside the vocabulary [0, ", V, ")");
  torch::NoGradGuard no_grad;
  StepOptions so;
  so.append = false;
  so.capture_query = true;
  so.capture_queries = true;
  const int64_t c = static_cast<int64_t>(message.size());
  StepResult r = model_->step(at::tensor(message, at::kLong).to(device_), at::arange(next_pos_, next_pos_ + c, at::kLong),
                              memory_.window(), so);
  StepView view;
  view.fresh = c;
  view.tokens = at::tensor(message, at::kLong);
  view.hidden = r.hidden;
  view.query = std::move(r.query);
  view.queries = std::move(r.queries);
  memory_.apply(policy_->recall(memory_, view));
  next_pos_ = policy_->next_position(memory_.window(), next_pos_);
  peak_tokens_ = std::max(peak_tokens_, tokens_per_layer());
}

at::Tensor LlmSession::feed(const std::vector<int64_t>& ids, const std::string& region, const std::string& segment) {
  if (!pending_) feed_breadcrumbs();
  std::vector<int64_t> all;
  if (pending_) all.push_back(*pending_);
  all.insert(all.end(), ids.begin(), ids.end());
  WM_CHECK(!all.empty(), "nothing to feed");
  last_logits_ = run(all, region, segment);  // throws before any change on a bad id or region
  pending_.reset();
  return last_logits_;
}

Decoding::Decoding(LlmSession& s, const GenerateOptions& opt, PieceCallback on_piece, uint64_t seed)
    : s_(&s),
      opt_(opt),
      on_piece_(std::move(on_piece)),
      sampler_([&] {
        SamplingOptions so = opt.sampling;
        so.seed = seed;
        return so;
      }()),
      stops_(opt.stop_strings),
      stream_(s.tokenizer(), false, /*valid_utf8=*/true) {
  // Ids the model has but the tokenizer lacks (padding rows of a larger embedding) are never drawn.
  n_text_ = std::min<int64_t>(s.tokenizer().vocab_size(), s.model().config().vocab_size);
  g_.stop_reason = "max_tokens";
}

int64_t Decoding::token() const {
  WM_CHECK(!done_ && !g_.tokens.empty(), "this generation is done: no token to run");
  return g_.tokens.back();
}

void Decoding::emit(std::string text) {
  TextPiece p;
  p.text = std::move(text);
  p.first = covered_;
  p.end = covered_ = static_cast<int64_t>(g_.tokens.size());
  if (opt_.logprobs) p.logprobs.assign(g_.logprobs.begin() + p.first, g_.logprobs.begin() + p.end);
  g_.text += p.text;
  if (on_piece_) on_piece_(p);
}

void Decoding::take(const at::Tensor& logits) {
  const at::Tensor row = n_text_ < logits.size(0) ? logits.narrow(0, 0, n_text_) : logits;
  const int64_t tok = sampler_.sample(row);
  if (opt_.logprobs) g_.logprobs.push_back(token_logprob(row, tok, opt_.top_logprobs));
  g_.tokens.push_back(tok);
  t_token_ = std::chrono::steady_clock::now();
  if (g_.tokens.size() == 1) g_.stats.ttft_s = std::chrono::duration<double>(t_token_ - t0_).count();
  s_->pending_ = tok;
  if (std::find(opt_.stop_tokens.begin(), opt_.stop_tokens.end(), tok) != opt_.stop_tokens.end()) {
    g_.stop_reason = "stop_token";
    done_ = true;
    return;
  }
  std::string text = stops_.feed(stream_.push(tok));
  if (!text.empty()) emit(std::move(text));
  if (stops_.stopped()) {
    g_.stop_reason = "stop_string";
    done_ = true;
    return;
  }
  if (static_cast<int64_t>(g_.tokens.size()) == opt_.max_new_tokens) done_ = true;
}

void Decoding::advance(const at::Tensor& logits) {
  WM_CHECK(!done_, "this generation is done: nothing to advance");
  WM_CHECK(!s_->pending_, "advance() takes the logits after token() went through the model");
  decode_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t_token_).count();
  take(logits);
}

void Decoding::cancel() {
  if (done_) return;
  done_ = true;
  g_.stop_reason = "cancelled";
}

Generation Decoding::finish() {
  WM_CHECK(done_ && !finished_, finished_ ? "finish() was called already" : "the generation is not done");
  finished_ = true;
  if (!stops_.stopped()) {
    std::string tail = stops_.feed(stream_.flush());
    if (stops_.stopped()) g_.stop_reason = "stop_string";  // completed by the last bytes
    tail += stops_.flush();
    if (!tail.empty()) emit(std::move(tail));
  }
  // The tokens no piece showed (a stop token, ...): a last piece without text.
  if (covered_ < static_cast<int64_t>(g_.tokens.size())) emit("");
  g_.stats.new_tokens = static_cast<int64_t>(g_.tokens.size());
  g_.stats.decode_s = decode_s_;
  g_.stats.kv_bytes_used = s_->window().bytes_used();
  g_.stats.kv_bytes_allocated = s_->window().bytes_allocated();
  g_.stats.kv_tokens = s_->tokens_per_layer();
  g_.stats.kv_tokens_peak = s_->peak_tokens();
  return std::move(g_);
}

Decoding LlmSession::begin(const std::vector<int64_t>& prompt, const GenerateOptions& opt,
                           const PieceCallback& on_piece) {
  opt.validate();
  const auto t0 = Clock::now();
  const int64_t prompt_tokens = static_cast<int64_t>(prompt.size()) + (pending_ ? 1 : 0);
  at::Tensor logits;
  if (prompt_tokens > 0) {
    struct Reset {
      std::function<void(int64_t, int64_t)>& f;
      ~Reset() { f = nullptr; }
    } reset{on_chunk_};
    on_chunk_ = opt.on_prefill;
    logits = feed(prompt);
  } else {
    WM_CHECK(last_logits_.defined(), "generation needs a prompt or a context fed before");
    logits = last_logits_;
  }
  // Each generation of the session draws a stream of its own from the seed.
  const uint64_t seed = opt.sampling.seed + 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(generations_++);
  Decoding d(*this, opt, on_piece, seed);
  d.t0_ = t0;
  d.g_.stats.prompt_tokens = prompt_tokens;
  d.g_.stats.prefill_s = seconds_since(t0);
  d.g_.prompt_logits = logits;
  d.take(logits);
  return d;
}

Generation LlmSession::generate(const std::vector<int64_t>& prompt, const GenerateOptions& opt,
                                const TextCallback& on_text) {
  PieceCallback on_piece;
  if (on_text)
    on_piece = [&on_text](const TextPiece& p) {
      if (!p.text.empty()) on_text(p.text);
    };
  Decoding d = begin(prompt, opt, on_piece);
  while (!d.done()) d.advance(step_token(d.token()));
  return d.finish();
}

void decode_together(const std::vector<Decoding*>& ds) {
  std::vector<Decoding*> live;
  for (Decoding* d : ds)
    if (d != nullptr && !d->done()) live.push_back(d);
  if (live.empty()) return;
  LlmModelImpl& model = live.front()->session().model();
  std::vector<KvWindow*> windows;
  std::vector<int64_t> tokens, pos;
  // What any of the sessions' policies wants captured (a decode step's one query makes the mass
  // window irrelevant; captures a policy did not ask for are ignored by after_step).
  StepOptions so = live.front()->session().decode_options();
  for (Decoding* d : live) {
    LlmSession& s = d->session();
    WM_CHECK(&s.model() == &model, "decode_together: the sessions run different models");
    const StepOptions own = s.decode_options();
    so.capture_mass = so.capture_mass || own.capture_mass;
    so.capture_query = so.capture_query || own.capture_query;
    windows.push_back(&s.window());
    tokens.push_back(d->token());
    pos.push_back(s.next_position() - 1);
  }
  const at::Device dev = live.front()->session().device();
  std::vector<StepResult> rs =
      model.step_batch(at::tensor(tokens, at::kLong).to(dev), at::tensor(pos, at::kLong), windows, so);
  for (size_t i = 0; i < live.size(); ++i)
    live[i]->advance(live[i]->session().after_step(tokens[i], std::move(rs[i])));
}

}  // namespace wm::llm
