// Llama / Qwen2 decoders and their tokenizers from GGUF files (llmkv/gguf_model.h,
// llmkv/gguf_tokenizer.h): files written here from random models as llama.cpp's converter writes
// them (Q/K rows permuted for Llama), the refusals, and SmolLM2-135M-Instruct's file when
// tools/get_model.sh has put it in the cache.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "llm_test_util.h"
#include "llmkv/byte_level.h"
#include "llmkv/gguf_model.h"
#include "llmkv/gguf_tokenizer.h"
#include "runtime/error.h"
#include "runtime/gguf.h"
#include "tests/temp_dir.h"

namespace wm::llm::gguf_model_test {

namespace fs = std::filesystem;

// A GGUF file (version 3) built from typed keys and float32 tensors.
class GgufBuilder {
 public:
  GgufBuilder& u32(const std::string& k, uint32_t v) { return kv(k, 4, pod(v)); }
  GgufBuilder& f32(const std::string& k, float v) { return kv(k, 6, pod(v)); }
  GgufBuilder& boolean(const std::string& k, bool v) { return kv(k, 7, std::string(1, v ? '\1' : '\0')); }
  GgufBuilder& str(const std::string& k, const std::string& v) { return kv(k, 8, lp(v)); }
  GgufBuilder& strings(const std::string& k, const std::vector<std::string>& v) {
    std::string b = pod(uint32_t{8}) + pod(uint64_t{v.size()});
    for (const auto& s : v) b += lp(s);
    return kv(k, 9, b);
  }
  GgufBuilder& i32s(const std::string& k, const std::vector<int32_t>& v) {
    std::string b = pod(uint32_t{5}) + pod(uint64_t{v.size()});
    for (int32_t x : v) b += pod(x);
    return kv(k, 9, b);
  }
  // A float32 tensor of torch shape `t.sizes()`, or any type's raw blocks with `type`.
  GgufBuilder& tensor(const std::string& name, const at::Tensor& t) {
    const at::Tensor c = t.to(at::kFloat).contiguous();
    return raw_tensor(name, c.sizes().vec(), 0, std::string(static_cast<const char*>(c.data_ptr()), c.numel() * 4));
  }
  // A tensor added again replaces the first one, in its place.
  GgufBuilder& raw_tensor(const std::string& name, std::vector<int64_t> shape, uint32_t type, std::string bytes) {
    for (auto& t : tensors_)
      if (t.name == name) {
        t = {name, std::move(shape), type, std::move(bytes)};
        return *this;
      }
    tensors_.push_back({name, std::move(shape), type, std::move(bytes)});
    return *this;
  }
  void write(const std::string& path) const {
    std::string out = "GGUF" + pod(uint32_t{3}) + pod(uint64_t{tensors_.size()}) + pod(uint64_t{kvs_.size()});
    for (const auto& [k, v] : kvs_) out += lp(k) + v;
    uint64_t offset = 0;
    for (const auto& t : tensors_) {
      out += lp(t.name) + pod(static_cast<uint32_t>(t.shape.size()));
      for (auto it = t.shape.rbegin(); it != t.shape.rend(); ++it) out += pod(static_cast<uint64_t>(*it));
      out += pod(t.type) + pod(offset);
      offset += (t.bytes.size() + 31) / 32 * 32;
    }
    out.resize((out.size() + 31) / 32 * 32, '\0');
    for (const auto& t : tensors_) {
      out += t.bytes;
      out.resize((out.size() + 31) / 32 * 32, '\0');
    }
    std::ofstream(path, std::ios::binary | std::ios::trunc) << out;
  }

 private:
  template <class T>
  static std::string pod(T v) {
    return std::string(reinterpret_cast<const char*>(&v), sizeof v);
  }
  static std::string lp(const std::string& s) { return pod(uint64_t{s.size()}) + s; }
  // A key set again replaces its value (a file holds each key once).
  GgufBuilder& kv(const std::string& k, uint32_t type, const std::string& value) {
    for (auto& e : kvs_)
      if (e.first == k) {
        e.second = pod(type) + value;
        return *this;
      }
    kvs_.emplace_back(k, pod(type) + value);
    return *this;
  }
  struct Tensor {
    std::string name;
    std::vector<int64_t> shape;
    uint32_t type;
    std::string bytes;
  };
  std::vector<std::pair<std::string, std::string>> kvs_;
  std::vector<Tensor> tensors_;
};

// The metadata and tensors llama.cpp's converter writes for `m` (float32, Q/K permuted for Llama).
GgufBuilder gguf_of(LlmModelImpl& m) {
  const LlmConfig& c = m.config();
  const std::string a = c.model_type;
  GgufBuilder b;
  b.str("general.architecture", a).str("general.name", "test model");
  b.u32(a + ".block_count", c.num_hidden_layers).u32(a + ".embedding_length", c.hidden_size);
  b.u32(a + ".feed_forward_length", c.intermediate_size).u32(a + ".attention.head_count", c.num_attention_heads);
  b.u32(a + ".attention.head_count_kv", c.num_key_value_heads).u32(a + ".context_length", c.max_position_embeddings);
  b.f32(a + ".attention.layer_norm_rms_epsilon", static_cast<float>(c.rms_norm_eps));
  b.f32(a + ".rope.freq_base", static_cast<float>(c.rope_theta)).u32(a + ".vocab_size", c.vocab_size);
  b.u32(a + ".rope.dimension_count", c.head_dim).u32(a + ".attention.key_length", c.head_dim);
  const std::map<std::string, std::string> names = {
      {"input_layernorm", "attn_norm"},  {"self_attn.q_proj", "attn_q"},       {"self_attn.k_proj", "attn_k"},
      {"self_attn.v_proj", "attn_v"},    {"self_attn.o_proj", "attn_output"}, {"post_attention_layernorm", "ffn_norm"},
      {"mlp.gate_proj", "ffn_gate"},     {"mlp.up_proj", "ffn_up"},           {"mlp.down_proj", "ffn_down"}};
  for (const auto& p : m.named_parameters(true)) {
    const std::string& n = p.key();
    at::Tensor t = p.value().detach();
    std::string g;
    if (n == "model.embed_tokens.weight") g = "token_embd.weight";
    else if (n == "model.norm.weight") g = "output_norm.weight";
    else if (n == "lm_head.weight") g = "output.weight";
    else {
      const size_t l0 = std::strlen("model.layers."), dot = n.find('.', l0), last = n.rfind('.');
      g = "blk." + n.substr(l0, dot - l0) + "." + names.at(n.substr(dot + 1, last - dot - 1)) + n.substr(last);
    }
    if (a == "llama" && n.find("q_proj") != std::string::npos) t = permute_qk_rows(t, c.num_attention_heads);
    if (a == "llama" && n.find("k_proj") != std::string::npos) t = permute_qk_rows(t, c.num_key_value_heads);
    b.tensor(g, t);
  }
  return b;
}

LlmConfig llama_config() {
  LlmConfig c = test::small_config(61);
  c.model_type = "llama";
  c.attention_bias = false;
  c.tie_word_embeddings = false;
  c.validate();
  return c;
}

class GgufModel : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = wm::testing::make_temp_dir("wm_gguf_model_test_");
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  // The error loading `b` gives (config, tensors and all); fails the test when it loads.
  std::string load_error(const GgufBuilder& b) {
    const std::string p = path("bad.gguf");
    b.write(p);
    try {
      load_llm_gguf(GgufFile::open(p), at::kCPU);
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
      return e.what();
    }
    ADD_FAILURE() << "loaded without an error";
    return {};
  }
  fs::path dir_;
};

TEST_F(GgufModel, PermutationPairsRotaryHalvesAndRoundTrips) {
  // One head of 4 rows (HF order: pairs (0, 2) and (1, 3)) becomes 0, 2, 1, 3 in GGUF's order.
  const at::Tensor w = at::arange(8, at::kFloat).reshape({4, 2});
  const at::Tensor p = permute_qk_rows(w, 1);
  EXPECT_TRUE(at::equal(p.select(1, 0), at::tensor({0.f, 4.f, 2.f, 6.f})));
  const at::Tensor r = at::randn({3 * 8, 5});
  EXPECT_TRUE(at::equal(unpermute_qk_rows(permute_qk_rows(r, 3), 3), r));
  EXPECT_FALSE(at::equal(unpermute_qk_rows(r, 3), r));
  const at::Tensor bias = at::randn({16});
  EXPECT_TRUE(at::equal(unpermute_qk_rows(permute_qk_rows(bias, 2), 2), bias));
  EXPECT_THROW(unpermute_qk_rows(at::randn({6, 2}), 2), Error);  // 3 rows a head: no pairs
}

// The file gives back the model it was written from: the same config and, through the Q/K
// permutation and back, the same logits to the bit.
TEST_F(GgufModel, AFloatFileGivesTheLogitsOfTheModelItWasWrittenFrom) {
  for (const LlmConfig& cfg : {llama_config(), test::small_config(61)}) {
    SCOPED_TRACE(cfg.model_type);
    LlmModel src(cfg);
    src->init_weights(7);
    src->eval();
    const std::string p = path(cfg.model_type + ".gguf");
    gguf_of(*src).write(p);
    const GgufFile f = GgufFile::open(p);
    const LlmConfig got = llm_config_from_gguf(f);
    EXPECT_EQ(got.model_type, cfg.model_type);
    EXPECT_EQ(got.num_key_value_heads, 2);
    EXPECT_EQ(got.tie_word_embeddings, cfg.tie_word_embeddings);
    EXPECT_EQ(got.qkv_bias(), cfg.qkv_bias());
    EXPECT_EQ(gguf_model_name(f), "test model");
    LlmModel m = load_llm_gguf(f, at::kCPU);
    const at::Tensor tokens = at::randint(0, 61, {1, 12}, at::kLong);
    at::NoGradGuard ng;
    const at::Tensor want = src->forward_train(tokens), have = m->forward_train(tokens);
    EXPECT_TRUE(at::equal(want, have)) << (want - have).abs().max().item<float>();
  }
}

TEST_F(GgufModel, RefusesWhatItCannotRunNamingTheKeyOrTensor) {
  LlmModel src(llama_config());
  src->init_weights(3);
  auto with = [&](const std::function<void(GgufBuilder&)>& edit) {
    GgufBuilder b = gguf_of(*src);
    edit(b);
    return load_error(b);
  };
  EXPECT_NE(with([](GgufBuilder& b) { b.str("llama.rope.scaling.type", "linear"); }).find("llama.rope.scaling.type"),
            std::string::npos);
  EXPECT_NE(with([](GgufBuilder& b) { b.u32("llama.rope.dimension_count", 4); }).find("RoPE over part"),
            std::string::npos);
  EXPECT_NE(with([](GgufBuilder& b) { b.tensor("blk.9.attn_q.weight", at::zeros({2, 32})); }).find("blk.9.attn_q.weight"),
            std::string::npos);
  EXPECT_NE(with([](GgufBuilder& b) { b.tensor("rope_freqs.weight", at::ones({4})); }).find("rope_freqs"),
            std::string::npos);
  // A model with no place for output.weight's shape, and a type nothing decodes (Q5_0).
  GgufBuilder shaped;
  {
    LlmConfig c = llama_config();
    c.vocab_size = 62;
    LlmModel other(c);
    shaped = gguf_of(*other);
    shaped.u32("llama.vocab_size", 61);  // the metadata says 61, the tensors 62
  }
  EXPECT_NE(load_error(shaped).find("[62, 32]"), std::string::npos);
  GgufBuilder q5 = gguf_of(*src);
  q5.raw_tensor("blk.0.attn_norm.weight", {32}, 6, std::string(22, '\0'));
  EXPECT_NE(load_error(q5).find("'blk.0.attn_norm.weight' is stored as Q5_0"), std::string::npos);
  GgufBuilder arch;
  arch.str("general.architecture", "gpt2");
  EXPECT_NE(load_error(arch).find("architecture 'gpt2'"), std::string::npos);
}

// NaN or inf anywhere refuses the file, naming the tensor: in a float tensor's last row (the check
// goes a slice of rows at a time) and in a Q8_0 block's scale, kept as stored or decoded.
TEST_F(GgufModel, RefusesNonFiniteValuesInAnyRowAndAnyType) {
  LlmModel src(llama_config());
  src->init_weights(5);
  GgufBuilder nan_row = gguf_of(*src);
  at::Tensor emb = src->named_parameters(true)["model.embed_tokens.weight"].detach().clone();
  emb[emb.size(0) - 1][3] = std::numeric_limits<float>::quiet_NaN();
  nan_row.tensor("token_embd.weight", emb);
  const std::string e1 = load_error(nan_row);
  EXPECT_NE(e1.find("'token_embd.weight' holds 1 non-finite"), std::string::npos) << e1;
  // ffn_down [32, 48]: 32 rows of 48 values... not whole 32-value blocks; ffn_up [48, 32] is.
  std::string blocks;
  for (int b = 0; b < 48; ++b) blocks += std::string("\x00\x3c", 2) + std::string(32, '\1');  // d = 1.0
  blocks[7 * 34 + 1] = '\x7c';  // block 7's scale 0x7c00: +inf
  for (GgufWeights w : {GgufWeights::Stored, GgufWeights::Float}) {
    GgufBuilder b = gguf_of(*src);
    b.raw_tensor("blk.1.ffn_up.weight", {48, 32}, 8, blocks);
    const std::string p = path("inf.gguf");
    b.write(p);
    try {
      load_llm_gguf(GgufFile::open(p), at::kCPU, at::kFloat, w);
      ADD_FAILURE() << "loaded a file with an inf scale";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("'blk.1.ffn_up.weight' holds 32 non-finite"), std::string::npos) << e.what();
    }
  }
}

// ---- The tokenizer from tokenizer.ggml.* ----

// A byte-level vocabulary: the 256 byte symbols (id = byte), then "he", "Ġt", "12", a control
// token and a user-defined one.
GgufBuilder tokenizer_file(const std::string& model, const std::string& pre, bool add_bos = false) {
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) tokens.push_back(utf8_encode(byte_to_unicode(static_cast<uint8_t>(b))));
  const std::string sp = utf8_encode(byte_to_unicode(' '));
  for (const std::string& t : {std::string("he"), sp + "t", std::string("12"), std::string("<|im_start|>"),
                               std::string("<tag>")})
    tokens.push_back(t);
  std::vector<int32_t> types(tokens.size(), 1);
  types[259] = 3;
  types[260] = 4;
  GgufBuilder b;
  b.str("tokenizer.ggml.model", model).str("tokenizer.ggml.pre", pre).strings("tokenizer.ggml.tokens", tokens);
  b.i32s("tokenizer.ggml.token_type", types).strings("tokenizer.ggml.merges", {"h e", sp + " t", "1 2"});
  b.u32("tokenizer.ggml.bos_token_id", 259).boolean("tokenizer.ggml.add_bos_token", add_bos);
  return b;
}

class GgufTokenizer : public GgufModel {
 protected:
  Tokenizer load(const GgufBuilder& b) {
    const std::string p = path("tok.gguf");
    b.write(p);
    return tokenizer_from_gguf(GgufFile::open(p));
  }
  std::string error(const GgufBuilder& b) {
    try {
      load(b);
    } catch (const Error& e) {
      return e.what();
    }
    ADD_FAILURE() << "loaded without an error";
    return {};
  }
};

TEST_F(GgufTokenizer, PreTokenizersSplitDigitsAsLlamaCppNamesThem) {
  using Ids = std::vector<int64_t>;
  const Ids he_12 = {256, ' ', 258};                // gpt2: " 12" is one piece, merged
  const Ids he_1_2 = {256, ' ', '1', '2'};          // smollm / qwen2: digits one by one
  EXPECT_EQ(load(tokenizer_file("gpt2", "gpt2")).encode("he 12"), he_12);
  EXPECT_EQ(load(tokenizer_file("gpt2", "smollm")).encode("he 12"), he_1_2);
  EXPECT_EQ(load(tokenizer_file("gpt2", "qwen2")).encode("he 12"), he_1_2);
  EXPECT_EQ(load(tokenizer_file("gpt2", "llama-bpe")).encode("he 12"), he_12);
  EXPECT_EQ(load(tokenizer_file("gpt2", "smollm")).encode(" the"), (Ids{257, 256}));
}

TEST_F(GgufTokenizer, ControlTokensAreSpecialUserDefinedOnesAlwaysMatch) {
  const Tokenizer t = load(tokenizer_file("gpt2", "smollm"));
  EXPECT_EQ(t.encode("<|im_start|>he"), (std::vector<int64_t>{259, 256}));
  EXPECT_EQ(t.encode("<|im_start|>he", false).size(), 13u);  // as plain bytes: < | i m _ s t a r t | > he
  EXPECT_TRUE(t.is_special(259));
  EXPECT_FALSE(t.is_special(260));
  EXPECT_EQ(t.encode("he<tag>", false), (std::vector<int64_t>{256, 260}));
  EXPECT_EQ(t.decode({259, 256, 260}), "<|im_start|>he<tag>");
  EXPECT_EQ(t.decode({259, 256}, true), "he");
}

TEST_F(GgufTokenizer, AddsBosWhenTheFileAsks) {
  EXPECT_EQ(load(tokenizer_file("gpt2", "smollm", true)).encode("he", true, true), (std::vector<int64_t>{259, 256}));
  EXPECT_EQ(load(tokenizer_file("gpt2", "smollm", false)).encode("he", true, true), (std::vector<int64_t>{256}));
}

TEST_F(GgufTokenizer, RefusesOtherModelsAndUnknownPreTokenizers) {
  EXPECT_NE(error(tokenizer_file("llama", "default")).find("tokenizer.ggml.model"), std::string::npos);
  EXPECT_NE(error(tokenizer_file("gpt2", "falcon")).find("\"falcon\""), std::string::npos);
  GgufBuilder b = tokenizer_file("gpt2", "smollm");
  b.i32s("tokenizer.ggml.token_type", {1, 1});
  EXPECT_NE(error(b).find("token_type"), std::string::npos);
}

}  // namespace wm::llm::gguf_model_test
