#include "llmkv/serve_engine.h"

#include <algorithm>
#include <cstdio>

namespace wm::llm {

namespace {
using Clock = std::chrono::steady_clock;
double elapsed_s(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

void count(std::vector<int64_t>& buckets, const std::vector<double>& bounds, double v) {
  for (size_t i = 0; i < bounds.size(); ++i)
    if (v <= bounds[i]) ++buckets[i];
}

// What a session keeps of its last request for a retry with the same idempotency key.
nlohmann::json replay_json(const std::string& key, const Generation& g) {
  return {{"key", key},
          {"text", g.text},
          {"stop_reason", g.stop_reason},
          {"prompt_tokens", g.stats.prompt_tokens},
          {"new_tokens", g.stats.new_tokens}};
}
void replay_from(const nlohmann::json& j, std::string* key, Generation* g) {
  if (!j.is_object()) return;
  try {
    *key = j.at("key").get<std::string>();
    g->text = j.at("text").get<std::string>();
    g->stop_reason = j.at("stop_reason").get<std::string>();
    g->stats.prompt_tokens = j.at("prompt_tokens").get<int64_t>();
    g->stats.new_tokens = j.at("new_tokens").get<int64_t>();
  } catch (const nlohmann::json::exception&) {
    key->clear();  // a note of another shape: no replay, the request runs
  }
}
}  // namespace

void ServeOptions::validate() const {
  WM_CHECK(parallel >= 1 && parallel <= 64, "parallel must be in [1, 64], got ", parallel);
  WM_CHECK(queue_limit >= 0, "queue_limit must be >= 0, got ", queue_limit);
  WM_CHECK(max_sessions >= 1, "max_sessions must be >= 1");
  session.validate();
}

const std::vector<double>& ServeEngine::ttft_bounds() {
  static const std::vector<double> b = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};
  return b;
}
const std::vector<double>& ServeEngine::token_bounds() {
  static const std::vector<double> b = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1};
  return b;
}

ServeEngine::ServeEngine(LlmModel model, Tokenizer tokenizer, at::Device device, at::ScalarType dtype,
                         ServeOptions opt)
    : model_(std::move(model)), tok_(std::move(tokenizer)), device_(device), dtype_(dtype), opt_(std::move(opt)) {
  opt_.validate();
  counters_.ttft_buckets.assign(ttft_bounds().size(), 0);
  counters_.token_buckets.assign(token_bounds().size(), 0);
  if (!opt_.state_dir.empty()) {
    // A policy whose state a snapshot cannot hold would fail at every save: said now.
    LlmSession probe(model_, tok_, device_, dtype_, opt_.session);
    (void)probe.snapshot();
    SessionFolderOptions fo;
    fo.max_bytes = opt_.state_max_bytes;
    // Beyond the folder's budget a session in use or with a write under way stays (files_mu_ is
    // held, then mu_: the order of the load path).
    fo.pinned = [this](const std::string& n) {
      std::lock_guard<std::mutex> lk(mu_);
      auto it = held_.find(n);
      return it != held_.end() && (it->second.busy || it->second.saving > 0);
    };
    files_ = std::make_unique<SessionFiles>(opt_.state_dir, [this](const std::string& m) { warn(m); }, fo);
    for (const auto& [id, st] : files_->found()) {
      Held& h = held_[id];
      h.incarnation = ++incarnations_;
      h.stored = true;
      h.position = st.next_position;
      h.turns = st.note.value("turns", int64_t{0});
      h.note = st.note.contains("note") ? st.note["note"] : nlohmann::json();
      if (st.note.contains("replay")) replay_from(st.note["replay"], &h.last_key, &h.last);
      lru_.push_back(id);
    }
  }
  if (files_) writer_ = std::thread([this] { writer_loop(); });
  thread_ = std::thread([this] { loop(); });
}

void ServeEngine::warn(const std::string& msg) const {
  if (opt_.log)
    opt_.log(msg);
  else
    std::fprintf(stderr, "serve: %s\n", msg.c_str());
}

ServeEngine::~ServeEngine() {
  drain();
  if (thread_.joinable()) thread_.join();
  {
    std::lock_guard<std::mutex> lk(w_mu_);
    w_stop_ = true;
    w_cv_.notify_all();
  }
  if (writer_.joinable()) writer_.join();
}

void ServeEngine::queue_file_op(FileOp op) {
  std::lock_guard<std::mutex> lk(w_mu_);
  w_queue_.push_back(std::move(op));
  w_cv_.notify_one();
}

void ServeEngine::writer_loop() {
  while (true) {
    FileOp op;
    {
      std::unique_lock<std::mutex> lk(w_mu_);
      w_cv_.wait(lk, [&] { return w_stop_ || !w_queue_.empty(); });
      if (w_queue_.empty()) return;  // stopping, nothing left
      op = std::move(w_queue_.front());
      w_queue_.pop_front();
    }
    if (op.erase) {
      try {
        std::lock_guard<std::mutex> fl(files_mu_);
        files_->erase(op.id);
      } catch (const std::exception& e) {
        warn(str_cat("session '", op.id, "': its file could not be removed: ", e.what()));
      }
      for (auto& w : op.erased) w->set_value();
    } else {
      bool ok = false;
      size_t bytes = 0;
      std::vector<std::string> evicted;
      try {
        std::lock_guard<std::mutex> fl(files_mu_);
        SaveReport rep = files_->store(op.id, op.snap, op.note);
        bytes = rep.written;
        evicted = std::move(rep.evicted);
        ok = true;
      } catch (const std::exception& e) {
        // The file keeps the state before (a restart finds that); the session stays in memory.
        warn(str_cat("session '", op.id, "' could not be saved to ", opt_.state_dir, ": ", e.what()));
      }
      {
        std::lock_guard<std::mutex> lk(mu_);
        auto it = held_.find(op.id);
        if (it != held_.end() && it->second.incarnation == op.incarnation) {
          --it->second.saving;
          it->second.stored = ok;
        }
        op.result.saved = ok;
        // Saved sessions the folder's budget ended: one in memory lives on there (unsaved), one
        // only on disk is gone.
        for (const auto& n : evicted) {
          auto e = held_.find(n);
          if (e == held_.end()) continue;
          ++counters_.state_evicted;
          if (e->second.session) {
            e->second.stored = false;
          } else {
            held_.erase(e);
            lru_.remove(n);
          }
        }
        if (ok) {
          ++counters_.saves;
          counters_.save_bytes += static_cast<int64_t>(bytes);
        } else {
          ++counters_.save_failed;
        }
        trim();
      }
      op.job->done.set_value(std::move(op.result));
      std::lock_guard<std::mutex> lk(mu_);
      --pending_writes_;
      idle_cv_.notify_all();
    }
  }
}

std::future<ServeResult> ServeEngine::submit(ServeRequest req) {
  auto job = std::make_unique<Job>();
  job->req = std::move(req);
  std::future<ServeResult> f = job->done.get_future();
  std::lock_guard<std::mutex> lk(mu_);
  if (stopping_) throw Error("the engine is stopping: no new requests");
  if (static_cast<int64_t>(queue_.size()) >= opt_.queue_limit + std::max<int64_t>(0, opt_.parallel - active_)) {
    ++counters_.refused;
    throw ServeBusy(str_cat(queue_.size(), " requests wait already (queue limit ", opt_.queue_limit, ")"));
  }
  ++counters_.requests;
  queue_.push_back(std::move(job));
  cv_.notify_one();
  return f;
}

bool ServeEngine::erase_session(const std::string& id) {
  std::future<void> done;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = held_.find(id);
    if (it == held_.end()) return false;
    if (it->second.busy) {
      it->second.doomed = true;  // ends, file and all, when its request does (release)
      auto w = std::make_shared<std::promise<void>>();
      done = w->get_future();
      it->second.erase_waiters.push_back(std::move(w));
    } else {
      const bool on_file = it->second.stored || it->second.saving > 0;
      held_.erase(it);
      lru_.remove(id);
      if (!on_file) return true;
      // After any write of it still waiting; the caller hears once the file is gone.
      FileOp op;
      op.id = id;
      op.erase = true;
      op.erased.push_back(std::make_shared<std::promise<void>>());
      done = op.erased.back()->get_future();
      queue_file_op(std::move(op));
    }
  }
  done.wait();
  return true;
}

std::optional<ServeEngine::SessionInfo> ServeEngine::session_info(const std::string& id) const {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = held_.find(id);
  if (it == held_.end() || it->second.doomed) return std::nullopt;
  SessionInfo i;
  i.turns = it->second.turns;
  i.position = it->second.position;
  i.in_memory = it->second.session != nullptr;
  i.kv_bytes = it->second.kv_bytes;
  i.note = it->second.note;
  return i;
}

bool ServeEngine::has_session(const std::string& id) const {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = held_.find(id);
  return it != held_.end() && !it->second.doomed;
}

int64_t ServeEngine::session_position(const std::string& id) const {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = held_.find(id);
  return it == held_.end() || it->second.doomed ? 0 : it->second.position;
}

void ServeEngine::drain(double seconds) {
  std::unique_lock<std::mutex> lk(mu_);
  stopping_ = true;
  cv_.notify_all();
  auto idle = [&] { return queue_.empty() && active_ == 0 && pending_writes_ == 0; };
  if (seconds < 0 || idle_cv_.wait_for(lk, std::chrono::duration<double>(seconds), idle)) {
    idle_cv_.wait(lk, idle);
    return;
  }
  // Out of time: what waits is refused, what runs ends at the next step.
  for (auto& j : queue_) {
    ServeResult r;
    r.error = "the server stopped before this request ran";
    r.stopped = true;
    ++counters_.failed;
    j->done.set_value(std::move(r));
  }
  queue_.clear();
  cut_ = true;
  cv_.notify_all();
  idle_cv_.wait(lk, idle);
}

ServeCounters ServeEngine::counters() const {
  std::lock_guard<std::mutex> lk(mu_);
  return counters_;
}
int64_t ServeEngine::active() const {
  std::lock_guard<std::mutex> lk(mu_);
  return active_;
}
int64_t ServeEngine::queued() const {
  std::lock_guard<std::mutex> lk(mu_);
  return static_cast<int64_t>(queue_.size());
}
int64_t ServeEngine::sessions() const {
  std::lock_guard<std::mutex> lk(mu_);
  return static_cast<int64_t>(held_.size());
}
int64_t ServeEngine::sessions_in_memory() const {
  std::lock_guard<std::mutex> lk(mu_);
  int64_t n = 0;
  for (const auto& [id, h] : held_) n += h.session != nullptr;
  return n;
}
size_t ServeEngine::kv_bytes() const {
  std::lock_guard<std::mutex> lk(mu_);
  size_t b = 0;
  for (const auto& [id, h] : held_)
    b += h.kv_bytes - h.bank_bytes[static_cast<int>(Tier::Device)] - h.bank_bytes[static_cast<int>(Tier::Host)];
  return b;
}

std::array<size_t, kTiers> ServeEngine::bank_bytes() const {
  std::lock_guard<std::mutex> lk(mu_);
  std::array<size_t, kTiers> b{};
  for (const auto& [id, h] : held_)
    for (int t = 0; t < kTiers; ++t) b[t] += h.bank_bytes[t];
  return b;
}

ServeEngine::Held& ServeEngine::held_session(const std::string& id) {
  auto [it, fresh] = held_.try_emplace(id);
  if (fresh) it->second.incarnation = ++incarnations_;
  if (!fresh) lru_.remove(id);
  lru_.push_back(id);
  return it->second;
}

std::string ServeEngine::bring_back(Running& r, LlmSession* s) {
  const std::string& sid = r.job->req.session;
  // Back from the folder. A file damaged since the folder was opened is reported; the session
  // starts afresh and this request fails (its prompt was made for the lost context).
  try {
    std::lock_guard<std::mutex> fl(files_mu_);
    (void)files_->load(sid, *s);
    std::lock_guard<std::mutex> lk(mu_);
    ++counters_.loads;
    return "";
  } catch (const std::exception& e) {
    const std::string why = str_cat("session '", sid, "' could not be brought back from ", opt_.state_dir, ": ",
                                    e.what(), "; it starts afresh: send the whole conversation again");
    warn(why);
    s->reset();
    {
      std::lock_guard<std::mutex> fl(files_mu_);
      try {
        files_->erase(sid);
      } catch (const std::exception&) {
      }
    }
    std::lock_guard<std::mutex> lk(mu_);
    ++counters_.load_failed;
    r.held->stored = false;
    r.held->turns = 0;
    r.held->position = 0;
    r.held->note = nullptr;
    r.held->last_key.clear();
    return why;
  }
}

void ServeEngine::feed(Running& r, LlmSession* s, const PieceCallback& on_text, bool* too_long) {
  const ServeRequest& req = r.job->req;
  // The context's reach, checked here where the session is this request's alone (a check when
  // the request came would let concurrent requests of one session each pass it).
  int64_t fresh = static_cast<int64_t>(req.prompt.size());
  for (const auto& b : req.blocks) fresh += static_cast<int64_t>(b.tokens.size());
  const int64_t limit = model_->config().max_position_embeddings;
  const int64_t reach = s->next_position() + fresh + req.gen.max_new_tokens;
  if (reach > limit) {
    *too_long = true;
    throw Error(str_cat("the context would reach ", reach, " tokens (the session's ", s->next_position(),
                        ", the prompt's ", fresh, " and max_tokens ", req.gen.max_new_tokens, "), beyond the model's ",
                        limit));
  }
  r.evictions0 = s->policy().evictions();
  r.recoveries0 = s->policy().recoveries();
  std::vector<int64_t> prompt;
  if (s->policy().block_wise()) {
    // Each message a block of its own, named by the session's turn.
    for (size_t i = 0; i < req.blocks.size(); ++i) {
      if (req.blocks[i].tokens.empty()) continue;
      PromptPiece p;
      p.segment = str_cat("t", r.turn, ".", i);
      p.kind = req.blocks[i].kind;
      p.message = req.blocks[i].message;
      s->feed_piece(req.blocks[i].tokens, p);
      r.block_tokens += static_cast<int64_t>(req.blocks[i].tokens.size());
    }
    prompt = req.prompt;
  } else {
    for (const auto& b : req.blocks) prompt.insert(prompt.end(), b.tokens.begin(), b.tokens.end());
    prompt.insert(prompt.end(), req.prompt.begin(), req.prompt.end());
  }
  r.decoding = std::make_unique<Decoding>(s->begin(prompt, req.gen, on_text));
}

void ServeEngine::start_job(std::unique_ptr<Job> job) {
  auto r = std::make_unique<Running>();
  r->job = std::move(job);
  r->t0 = Clock::now();
  LlmSession* s = nullptr;
  const std::string& sid = r->job->req.session;
  std::string load_error;
  if (!sid.empty()) {
    bool load = false;
    std::optional<ServeResult> replay;
    {
      std::lock_guard<std::mutex> lk(mu_);
      r->held = &held_.at(sid);  // made and marked busy when admitted
      const std::string& key = r->job->req.idempotency_key;
      if (!key.empty() && key == r->held->last_key) {
        // A retry of the request that ended last: its answer again, nothing fed or generated.
        replay.emplace();
        replay->generation = r->held->last;
        replay->replayed = true;
        ++counters_.replayed;
        --active_;
      } else {
        load = !r->held->session && r->held->stored;
        if (!r->held->session)
          r->held->session = std::make_unique<LlmSession>(model_, tok_, device_, dtype_, opt_.session);
        s = r->held->session.get();
        r->turn = r->held->turns;
      }
    }
    if (replay) {
      release(sid, r->held, r->held->session.get());
      r->job->done.set_value(std::move(*replay));
      return;
    }
    if (load) load_error = bring_back(*r, s);
  } else {
    r->oneshot = std::make_unique<LlmSession>(model_, tok_, device_, dtype_, opt_.session);
    s = r->oneshot.get();
  }
  Running* rp = r.get();
  auto on_text = [rp](const TextPiece& p) {
    if (!rp->cancelled && rp->job->req.on_text && !rp->job->req.on_text(p)) rp->cancelled = true;
  };
  bool too_long = false;
  try {
    if (!load_error.empty()) throw Error(load_error);
    feed(*r, s, on_text, &too_long);
  } catch (const std::exception& e) {
    ServeResult res;
    res.error = e.what();
    res.bad_request = too_long;
    {
      std::lock_guard<std::mutex> lk(mu_);
      ++counters_.failed;
      if (too_long) ++counters_.too_long;
      --active_;  // its slot is free before anyone hears of the failure
    }
    release(sid, r->held, s);
    r->job->done.set_value(std::move(res));
    return;
  }
  r->t_last = Clock::now();
  {
    std::lock_guard<std::mutex> lk(mu_);
    const double ttft = elapsed_s(r->t0);
    count(counters_.ttft_buckets, ttft_bounds(), ttft);
    counters_.ttft_sum += ttft;
    ++counters_.ttft_count;
  }
  running_.push_back(std::move(r));
}

void ServeEngine::release(const std::string& id, Held* h, LlmSession* s) {
  if (h == nullptr) return;
  FileOp end;  // id set: the session ended while in use, its file to remove
  {
    std::lock_guard<std::mutex> lk(mu_);
    h->busy = false;
    h->kv_bytes = 0;
    h->bank_bytes = {};
    if (s != nullptr) {
      for (int t = 0; t < kTiers; ++t) h->bank_bytes[t] = s->memory().bank().bytes(static_cast<Tier>(t));
      h->kv_bytes = s->window().bytes_used() + h->bank_bytes[static_cast<int>(Tier::Device)] +
                    h->bank_bytes[static_cast<int>(Tier::Host)];
    }
    if (s != nullptr) h->position = s->next_position();  // else not in memory: as its file holds it
    if (h->doomed) {
      // Ended while in use: the DELETEs waiting hear once its file is gone (or at once without one).
      if (h->stored || h->saving > 0) {
        end.id = id;
        end.erase = true;
        end.erased = std::move(h->erase_waiters);
      } else {
        for (auto& w : h->erase_waiters) w->set_value();
      }
      lru_.remove(id);
      held_.erase(id);
    }
    trim();
  }
  if (!end.id.empty()) queue_file_op(std::move(end));
}

void ServeEngine::trim() {
  int64_t loaded = 0;
  size_t bytes = 0;
  for (const auto& [id, h] : held_)
    if (h.session) ++loaded, bytes += h.kv_bytes;
  std::vector<std::string> lost;  // ended although a folder is there: their state could not be saved
  for (auto it = lru_.begin();
       it != lru_.end() && (loaded > static_cast<int64_t>(opt_.max_sessions) || bytes > opt_.session_memory);) {
    auto h = held_.find(*it);
    // A session in use, or whose write is under way, stays (the write decides what comes next).
    if (h == held_.end() || h->second.busy || !h->second.session || h->second.saving > 0) {
      ++it;
      continue;
    }
    --loaded;
    bytes -= std::min(bytes, h->second.kv_bytes);
    if (h->second.stored) {
      // Its file holds it as of its last request: memory is freed, the file brings it back.
      h->second.session.reset();
      h->second.kv_bytes = 0;
      h->second.bank_bytes = {};
      ++counters_.unloaded;
      ++it;
    } else {
      // No folder, or its last save failed (a full or read-only disk): the limits hold all the
      // same, and the session ends. Its answers said so (ServeResult::saved).
      if (files_) lost.push_back(*it);
      held_.erase(h);
      it = lru_.erase(it);
      ++counters_.ended;
    }
  }
  for (const auto& id : lost) {
    warn(str_cat("session '", id, "' ended: its state could not be saved to ", opt_.state_dir,
                 " and the memory limits are reached"));
    // A file of an older state of it would bring back a conversation that is not the client's.
    FileOp op;
    op.id = id;
    op.erase = true;
    queue_file_op(std::move(op));
  }
}

void ServeEngine::finish(Running& r) {
  if (!r.decoding->done()) r.decoding->cancel();
  FileOp save_op;  // id set: the answer waits for this write
  ServeResult res;
  res.generation = r.decoding->finish();
  res.generation.stats.prompt_tokens += r.block_tokens;
  if (r.interrupted && res.generation.stop_reason == "cancelled") res.generation.stop_reason = "interrupted";
  {
    const LlmSession& s = r.decoding->session();
    std::lock_guard<std::mutex> lk(mu_);
    counters_.evictions += std::max<int64_t>(0, s.policy().evictions() - r.evictions0);
    counters_.recoveries += std::max<int64_t>(0, s.policy().recoveries() - r.recoveries0);
  }
  if (r.held) {
    LlmSession& s = *r.held->session;
    if (s.policy().block_wise()) {
      // The tail and the reply: a block of their own, for the policy to bank and bring back.
      try {
        s.seal_recent(str_cat("t", r.turn, ".r"), "assistant");
      } catch (const std::exception& e) {
        warn(str_cat("session '", r.job->req.session, "': its reply stays in region recent: ", e.what()));
      }
    }
    {
      std::lock_guard<std::mutex> lk(mu_);
      ++r.held->turns;
      if (r.job->req.note) r.held->note = r.job->req.note(res.generation, r.held->note);
      r.held->position = s.next_position();
      r.held->last_key = r.job->req.idempotency_key;
      r.held->last = Generation();
      r.held->last.text = res.generation.text;
      r.held->last.stop_reason = res.generation.stop_reason;
      r.held->last.stats = res.generation.stats;
    }
    if (files_) {
      std::lock_guard<std::mutex> lk(mu_);
      if (!r.held->doomed) {
        try {
          save_op.id = r.job->req.session;
          save_op.incarnation = r.held->incarnation;
          save_op.snap = s.snapshot();  // copies: the session goes on while the writer writes
          save_op.note = {{"turns", r.held->turns}, {"note", r.held->note}};
          if (!r.held->last_key.empty()) save_op.note["replay"] = replay_json(r.held->last_key, r.held->last);
          ++r.held->saving;
        } catch (const std::exception& e) {
          // Its file, if any, holds an older state: the session stays in memory (trim).
          save_op.id.clear();
          r.held->stored = false;
          res.saved = false;
          warn(str_cat("session '", r.job->req.session, "' could not be saved: ", e.what()));
          ++counters_.save_failed;
        }
      }
    }
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    counters_.prompt_tokens += res.generation.stats.prompt_tokens;
    counters_.completion_tokens += res.generation.stats.new_tokens;
    if (res.generation.stop_reason == "cancelled") ++counters_.cancelled;
    --active_;  // its slot is free before the client hears the answer (and sends the next request)
    if (!save_op.id.empty()) ++pending_writes_;
  }
  if (!save_op.id.empty()) {
    // Queued before release(): an end of the session that release() queues (a DELETE that came
    // while this request ran) must come after this write, not before it.
    LlmSession* held_session = r.held->session.get();
    const std::string id = r.job->req.session;
    save_op.job = std::move(r.job);
    save_op.result = std::move(res);
    queue_file_op(std::move(save_op));
    release(id, r.held, held_session);
    return;
  }
  release(r.job->req.session, r.held, r.held ? r.held->session.get() : nullptr);
  r.job->done.set_value(std::move(res));
}

void ServeEngine::loop() {
  while (true) {
    std::vector<std::unique_ptr<Job>> admit;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stopping_ || !running_.empty() || !queue_.empty(); });
      if (stopping_ && queue_.empty() && running_.empty()) {
        active_ = 0;
        idle_cv_.notify_all();
        return;
      }
      // Admit waiting requests into free slots, in order, skipping those whose session is in
      // use (a session serves one request at a time).
      for (auto it = queue_.begin();
           it != queue_.end() && static_cast<int>(running_.size() + admit.size()) < opt_.parallel;) {
        const std::string& sid = (*it)->req.session;
        if (!sid.empty()) {
          Held& h = held_session(sid);
          if (h.busy) {
            ++it;
            continue;
          }
          h.busy = true;
          h.doomed = false;
        }
        admit.push_back(std::move(*it));
        it = queue_.erase(it);
      }
      active_ = static_cast<int64_t>(running_.size() + admit.size());
      if (cut_)
        for (auto& r : running_) r->cancelled = r->interrupted = true;
    }
    for (auto& j : admit) start_job(std::move(j));
    std::vector<Decoding*> live;
    for (auto& r : running_)
      if (!r->decoding->done() && !r->cancelled) live.push_back(r->decoding.get());
    if (!live.empty()) {
      try {
        decode_together(live);
      } catch (const std::exception& e) {
        // A step that failed leaves its generations ended where they were.
        for (auto& r : running_) r->cancelled = true;
        std::lock_guard<std::mutex> lk(mu_);
        counters_.failed += static_cast<int64_t>(live.size());
      }
      const auto now = Clock::now();
      std::lock_guard<std::mutex> lk(mu_);
      ++counters_.batched_steps;
      counters_.batched_tokens += static_cast<int64_t>(live.size());
      for (auto& r : running_) {
        if (std::find(live.begin(), live.end(), r->decoding.get()) == live.end()) continue;
        const double dt = std::chrono::duration<double>(now - r->t_last).count();
        r->t_last = now;
        count(counters_.token_buckets, token_bounds(), dt);
        counters_.token_sum += dt;
        ++counters_.token_count;
      }
    }
    for (size_t i = 0; i < running_.size();) {
      if (running_[i]->decoding->done() || running_[i]->cancelled) {
        finish(*running_[i]);
        running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(i));
      } else {
        ++i;
      }
    }
    std::lock_guard<std::mutex> lk(mu_);
    active_ = static_cast<int64_t>(running_.size());
    if (running_.empty() && queue_.empty()) idle_cv_.notify_all();
  }
}

}  // namespace wm::llm
