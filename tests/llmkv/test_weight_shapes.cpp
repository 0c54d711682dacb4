// The decoder's parameters as a config declares them (llmkv/weight_shapes.h) are the ones LlmModel
// registers, in its order, with its shapes and count; a checkpoint whose shapes disagree with its
// config is refused before a model is built, naming the config's fields; a model built for
// loading starts uninitialised in the asked dtype, one built for use starts as libtorch's own
// modules start theirs; a random-weight model larger than memory is refused naming its fields.
#include <gtest/gtest.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>

#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "llmkv/config.h"
#include "llmkv/model.h"
#include "llmkv/weight_shapes.h"
#include "runtime/error.h"
#include "runtime/safetensors.h"
#include "tests/temp_dir.h"

namespace wm::llm {
namespace {

namespace fs = std::filesystem;

LlmConfig config(const std::string& type, bool tied, bool attention_bias, bool mlp_bias) {
  LlmConfig c;
  c.model_type = type;
  c.vocab_size = 37;
  c.hidden_size = 12;
  c.intermediate_size = 20;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 4;
  c.tie_word_embeddings = tied;
  c.attention_bias = type == "qwen2" || attention_bias;
  c.mlp_bias = mlp_bias;
  c.validate();
  return c;
}

TEST(LlmWeightShapes, TheConfigsParametersAreTheModels) {
  for (const LlmConfig& c : {config("qwen2", true, true, false), config("llama", false, false, false),
                             config("llama", false, true, true), config("llama", true, true, false)}) {
    SCOPED_TRACE(c.to_json().dump());
    LlmModel m(c, ParamAlloc{ParamInit::Uninitialised, at::kFloat});
    const ParameterShapes shapes = llm_parameter_shapes(c);
    const auto params = m->named_parameters(true);
    ASSERT_EQ(shapes.size(), params.size());
    int64_t count = 0;
    for (size_t i = 0; i < shapes.size(); ++i) {
      EXPECT_EQ(shapes[i].first, params[i].key());
      EXPECT_EQ(at::IntArrayRef(shapes[i].second), params[i].value().sizes()) << shapes[i].first;
      count += params[i].value().numel();
    }
    EXPECT_EQ(llm_parameter_count(c), count);
  }
}

TEST(LlmWeightShapes, DefaultStartIsLibtorchsAndLoadingAllocatesUninitialisedInItsDtype) {
  const LlmConfig c = config("llama", false, true, true);
  at::manual_seed(5);
  LlmModel ours(c);
  // libtorch's modules drawn in the model's order from the same seed: the embedding, then the
  // first layer's q_proj (its input norm draws nothing).
  at::manual_seed(5);
  torch::nn::Embedding emb2(c.vocab_size, c.hidden_size);
  torch::nn::Linear q(torch::nn::LinearOptions(c.hidden_size, c.num_attention_heads * c.head_dim).bias(true));
  EXPECT_TRUE(at::equal(ours->model->embed_tokens->weight, emb2->weight));
  const auto& layer = *ours->model->layers[0]->as<LlmLayerImpl>();
  EXPECT_TRUE(at::equal(layer.self_attn->q_proj->weight, q->weight));
  EXPECT_TRUE(at::equal(layer.self_attn->q_proj->bias, q->bias));
  EXPECT_TRUE(at::equal(layer.input_layernorm->weight, at::ones({c.hidden_size})));
  LlmModel blank(c, ParamAlloc{ParamInit::Uninitialised, at::kBFloat16});
  for (const auto& p : blank->named_parameters(true)) {
    EXPECT_EQ(p.value().scalar_type(), at::kBFloat16) << p.key();
    EXPECT_TRUE(p.value().requires_grad()) << p.key();
  }
  EXPECT_EQ(blank->dtype(), at::kBFloat16);
}

TEST(LlmWeightShapes, ACheckpointThatDisagreesIsRefusedNamingTheFields) {
  const LlmConfig c = config("qwen2", true, true, false);
  const fs::path dir = wm::testing::make_temp_dir("wm_weight_shapes_");
  const std::string path = (dir / "model.safetensors").string();
  std::vector<std::pair<std::string, at::Tensor>> ts;
  for (const auto& [name, shape] : llm_parameter_shapes(c)) ts.emplace_back(name, at::zeros(shape));
  save_safetensors(path, ts);
  std::vector<SafeTensors> files;
  files.push_back(SafeTensors::open(path));
  const auto where = check_llm_checkpoint(c, files, {}, "folder", "", "config.json");
  ASSERT_EQ(where.size(), ts.size());
  LlmConfig wide = c;
  wide.vocab_size = 1 << 22;
  try {
    check_llm_checkpoint(wide, files, {}, "folder", "", "config.json");
    ADD_FAILURE() << "a vocabulary of 2^22 beside 37 rows was accepted";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("'model.embed_tokens.weight'"), std::string::npos) << m;
    EXPECT_NE(m.find("config.json: vocab_size 4194304, hidden_size 12"), std::string::npos) << m;
  }
  LlmConfig deeper = c;
  deeper.num_hidden_layers = 3;
  try {
    check_llm_checkpoint(deeper, files, {}, "folder", "", "config.json");
    ADD_FAILURE() << "a missing layer was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("num_hidden_layers 3"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

TEST(LlmWeightShapes, ModelsLargerThanMemoryAreRefusedNamingTheFields) {
  LlmConfig c = config("qwen2", true, true, false);
  c.vocab_size = 1 << 24;
  c.hidden_size = 1 << 16;
  c.validate();
  const uint64_t bytes = static_cast<uint64_t>(llm_parameter_count(c)) * 4;
  ASSERT_GT(bytes, memory_limit_bytes());
  try {
    check_fits_in_memory(bytes, "this model", "config.json: " + llm_size_fields(c));
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("vocab_size 16777216 x hidden_size 65536"), std::string::npos) << m;
    EXPECT_NE(m.find("this model needs"), std::string::npos) << m;
  }
  EXPECT_NO_THROW(check_fits_in_memory(1 << 20, "a MiB", ""));
}

}  // namespace
}  // namespace wm::llm
