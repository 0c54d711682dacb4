#pragma once
// A BERT encoder (transformers' BertModel, as sentence-transformers' all-MiniLM-L6-v2 uses it):
// its config.json, the network, and its weights read from a model.safetensors by name.
//
// Submodule names mirror the checkpoint's keys: embeddings.{word,position,token_type}_embeddings,
// embeddings.LayerNorm, encoder.layer.N.attention.self.{query,key,value},
// encoder.layer.N.attention.output.{dense,LayerNorm}, encoder.layer.N.intermediate.dense,
// encoder.layer.N.output.{dense,LayerNorm}. The pooler is not built.
//
// Post-LN layers, as BERT:
//   e = LayerNorm(word[ids] + position[0..T) + token_type[type_ids])
//   a = LayerNorm(x + dense(attention(query(x), key(x), value(x), padding mask)))
//   y = LayerNorm(a + dense(act(intermediate.dense(a))))
// with act GELU (erf; "gelu_new" / "gelu_pytorch_tanh": the tanh approximation).
#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>

#include <nlohmann/json_fwd.hpp>

#include <string>

namespace wm::llm {

struct BertConfig {
  int64_t vocab_size = 0;               // [1, 2^24]
  int64_t hidden_size = 0;              // [1, 65536], a multiple of num_attention_heads
  int64_t num_hidden_layers = 0;        // [1, 1024]
  int64_t num_attention_heads = 0;      // [1, 1024]
  int64_t intermediate_size = 0;        // [1, 2^20]
  int64_t max_position_embeddings = 0;  // [1, 2^20]: the longest input
  int64_t type_vocab_size = 2;          // [1, 1024]
  double layer_norm_eps = 1e-12;        // (0, 1)
  std::string hidden_act = "gelu";      // "gelu" (erf), "gelu_new" or "gelu_pytorch_tanh" (tanh)

  int64_t head_dim() const { return hidden_size / num_attention_heads; }

  // Reads a Hugging Face config object of model_type "bert". Throws wm::Error
  // "<where>: field '<name>': ..." on a missing, mistyped or out-of-range value and on what this
  // encoder does not implement: another model_type, position_embedding_type other than
  // "absolute", is_decoder or add_cross_attention true, another hidden_act.
  static BertConfig from_json(const nlohmann::json& j, const std::string& where = "config");
  // Reads a config.json file; errors name the file.
  static BertConfig load(const std::string& path);
};

struct BertEmbeddingsImpl : torch::nn::Module {
  explicit BertEmbeddingsImpl(const BertConfig& c);
  // ids, type_ids [B, T] int64 -> [B, T, hidden]. T <= max_position_embeddings (unchecked here).
  at::Tensor forward(const at::Tensor& ids, const at::Tensor& type_ids);
  torch::nn::Embedding word_embeddings{nullptr}, position_embeddings{nullptr}, token_type_embeddings{nullptr};
  torch::nn::LayerNorm LayerNorm{nullptr};
};
TORCH_MODULE(BertEmbeddings);

struct BertSelfAttentionImpl : torch::nn::Module {
  explicit BertSelfAttentionImpl(const BertConfig& c);
  torch::nn::Linear query{nullptr}, key{nullptr}, value{nullptr};  // [hidden, hidden], biased
};
TORCH_MODULE(BertSelfAttention);

// A dense projection followed by LayerNorm of (projection + residual): BertSelfOutput and
// BertOutput, which differ only in the projection's input width.
struct BertResidualOutputImpl : torch::nn::Module {
  BertResidualOutputImpl(int64_t in, const BertConfig& c);
  // x [..., in], residual [..., hidden] -> [..., hidden]
  at::Tensor forward(const at::Tensor& x, const at::Tensor& residual);
  torch::nn::Linear dense{nullptr};
  torch::nn::LayerNorm LayerNorm{nullptr};
};
TORCH_MODULE(BertResidualOutput);

struct BertAttentionImpl : torch::nn::Module {
  explicit BertAttentionImpl(const BertConfig& c);
  BertSelfAttention self{nullptr};
  BertResidualOutput output{nullptr};
};
TORCH_MODULE(BertAttention);

struct BertIntermediateImpl : torch::nn::Module {
  explicit BertIntermediateImpl(const BertConfig& c);
  torch::nn::Linear dense{nullptr};  // [intermediate, hidden]
};
TORCH_MODULE(BertIntermediate);

struct BertLayerImpl : torch::nn::Module {
  explicit BertLayerImpl(const BertConfig& c);
  BertAttention attention{nullptr};
  BertIntermediate intermediate{nullptr};
  BertResidualOutput output{nullptr};
};
TORCH_MODULE(BertLayer);

struct BertEncoderImpl : torch::nn::Module {
  explicit BertEncoderImpl(const BertConfig& c);
  torch::nn::ModuleList layer{nullptr};  // of BertLayer
};
TORCH_MODULE(BertEncoder);

class BertModelImpl : public torch::nn::Module {
 public:
  explicit BertModelImpl(const BertConfig& c);

  // The last hidden states. ids, type_ids, mask [B, T] int64 on any device (moved to the
  // parameters'); mask 1 for a token, 0 for padding (keys that are padding get no attention).
  // Returns [B, T, hidden] in the parameters' dtype on their device. Throws wm::Error on
  // mismatched shapes, T = 0 or T > max_position_embeddings.
  at::Tensor forward(const at::Tensor& ids, const at::Tensor& type_ids, const at::Tensor& mask);

  const BertConfig& config() const { return config_; }
  at::Device device() const;

  BertEmbeddings embeddings{nullptr};
  BertEncoder encoder{nullptr};

 private:
  at::Tensor layer_forward(BertLayerImpl& l, const at::Tensor& x, const at::Tensor& bias);
  BertConfig config_;
};
TORCH_MODULE(BertModel);

// Copies the tensors of a safetensors file into `model` by name, converted to the parameters'
// dtype (float32, float16 and bfloat16 are read) and device. Names may carry a "bert." prefix
// (all of them or none); "pooler.*" and "embeddings.position_ids" are accepted and unused.
// Everything is checked before any parameter changes. Throws wm::CorruptData naming the file for
// a damaged file; wm::Error naming the tensor and the file for a missing, unexpected or
// mis-shaped tensor (with both shapes), an unsupported stored dtype, or non-finite values.
void load_bert_weights(BertModelImpl& model, const std::string& safetensors_path);

}  // namespace wm::llm
