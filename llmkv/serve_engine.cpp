#include "llmkv/serve_engine.h"

#include <algorithm>

namespace wm::llm {

namespace {
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

void count(std::vector<int64_t>& buckets, const std::vector<double>& bounds, double v) {
  for (size_t i = 0; i < bounds.size(); ++i)
    if (v <= bounds[i]) ++buckets[i];
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
  // A policy that needs its context as named blocks (evoke) is driven by its own feeding.
  WM_CHECK(!make_text_policy(opt_.session.memory)->block_wise(), "policy ", opt_.session.memory.policy,
           " takes its context as named blocks; the engine feeds each turn as one prompt");
  counters_.ttft_buckets.assign(ttft_bounds().size(), 0);
  counters_.token_buckets.assign(token_bounds().size(), 0);
  thread_ = std::thread([this] { loop(); });
}

ServeEngine::~ServeEngine() {
  drain();
  if (thread_.joinable()) thread_.join();
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
  std::lock_guard<std::mutex> lk(mu_);
  auto it = held_.find(id);
  if (it == held_.end()) return false;
  if (it->second.busy) {
    it->second.doomed = true;
    return true;
  }
  held_.erase(it);
  lru_.remove(id);
  return true;
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

void ServeEngine::drain() {
  std::unique_lock<std::mutex> lk(mu_);
  stopping_ = true;
  cv_.notify_all();
  idle_cv_.wait(lk, [&] { return queue_.empty() && active_ == 0; });
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
size_t ServeEngine::kv_bytes() const {
  std::lock_guard<std::mutex> lk(mu_);
  size_t b = 0;
  for (const auto& [id, h] : held_) b += h.kv_bytes;
  return b;
}

ServeEngine::Held& ServeEngine::held_session(const std::string& id) {
  auto [it, fresh] = held_.try_emplace(id);
  if (!fresh) lru_.remove(id);
  lru_.push_back(id);
  return it->second;
}

void ServeEngine::start_job(std::unique_ptr<Job> job) {
  auto r = std::make_unique<Running>();
  r->job = std::move(job);
  r->t0 = Clock::now();
  LlmSession* s = nullptr;
  const std::string& sid = r->job->req.session;
  if (!sid.empty()) {
    std::lock_guard<std::mutex> lk(mu_);
    r->held = &held_.at(sid);  // made and marked busy when admitted
    if (!r->held->session)
      r->held->session = std::make_unique<LlmSession>(model_, tok_, device_, dtype_, opt_.session);
    s = r->held->session.get();
  } else {
    r->oneshot = std::make_unique<LlmSession>(model_, tok_, device_, dtype_, opt_.session);
    s = r->oneshot.get();
  }
  Running* rp = r.get();
  auto on_text = [rp](const std::string& t) {
    if (!rp->cancelled && rp->job->req.on_text && !rp->job->req.on_text(t)) rp->cancelled = true;
  };
  try {
    r->decoding = std::make_unique<Decoding>(s->begin(r->job->req.prompt, r->job->req.gen, on_text));
  } catch (const std::exception& e) {
    ServeResult res;
    res.error = e.what();
    {
      std::lock_guard<std::mutex> lk(mu_);
      ++counters_.failed;
      --active_;  // its slot is free before anyone hears of the failure
    }
    release(r->held, s);
    r->job->done.set_value(std::move(res));
    return;
  }
  r->t_last = Clock::now();
  {
    std::lock_guard<std::mutex> lk(mu_);
    const double ttft = since(r->t0);
    count(counters_.ttft_buckets, ttft_bounds(), ttft);
    counters_.ttft_sum += ttft;
    ++counters_.ttft_count;
  }
  running_.push_back(std::move(r));
}

void ServeEngine::release(Held* h, LlmSession* s) {
  if (h == nullptr) return;
  std::lock_guard<std::mutex> lk(mu_);
  h->busy = false;
  h->kv_bytes = s != nullptr ? s->window().bytes_used() : 0;
  h->position = s != nullptr ? s->next_position() : 0;
  // Ended while in use, or beyond the session count: idle ones leave, least recently used first.
  for (auto it = held_.begin(); it != held_.end();)
    if (it->second.doomed && !it->second.busy) {
      lru_.remove(it->first);
      it = held_.erase(it);
    } else {
      ++it;
    }
  for (auto it = lru_.begin(); held_.size() > opt_.max_sessions && it != lru_.end();) {
    auto h2 = held_.find(*it);
    if (h2 != held_.end() && !h2->second.busy) {
      held_.erase(h2);
      it = lru_.erase(it);
    } else {
      ++it;
    }
  }
}

void ServeEngine::finish(Running& r) {
  if (!r.decoding->done()) r.decoding->cancel();
  ServeResult res;
  res.generation = r.decoding->finish();
  {
    std::lock_guard<std::mutex> lk(mu_);
    counters_.prompt_tokens += res.generation.stats.prompt_tokens;
    counters_.completion_tokens += res.generation.stats.new_tokens;
    if (res.generation.stop_reason == "cancelled") ++counters_.cancelled;
    --active_;  // its slot is free before the client hears the answer (and sends the next request)
  }
  release(r.held, r.held ? r.held->session.get() : nullptr);
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
