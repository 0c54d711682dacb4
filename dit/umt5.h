#pragma once
// The umT5 text encoder of LingBot-World-Fast, as the upstream code computes it
// (Robbyant/lingbot-world 91ff5f6, wan/modules/t5.py: T5Encoder built by umt5_xxl(encoder_only=True),
// wrapped by T5EncoderModel). Module and parameter names mirror the checkpoint's keys
// (`models_t5_umt5-xxl-enc-bf16.pth`, the encoder's state dict without prefix):
//   token_embedding.weight                        [vocab, dim]
//   blocks.N.norm1.weight, blocks.N.norm2.weight  [dim]           (T5 layer norm: RMS, no bias)
//   blocks.N.attn.{q,k,v}.weight                  [dim_attn, dim] (no bias)
//   blocks.N.attn.o.weight                        [dim, dim_attn]
//   blocks.N.ffn.gate.0.weight, blocks.N.ffn.fc1.weight  [dim_ffn, dim]  (gated GELU, tanh form)
//   blocks.N.ffn.fc2.weight                       [dim, dim_ffn]
//   blocks.N.pos_embedding.embedding.weight       [num_buckets, num_heads]  (umT5: a relative
//                                                 position bias per block, none shared)
//   norm.weight                                   [dim]
// Attention is not scaled (T5), its bias is the block's bucketed relative position embedding
// (bidirectional, 32 buckets, max distance 128) plus the padding mask (finfo.min where mask == 0),
// the softmax runs in float32. Dropout is inference's identity.
#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <string>

namespace wm::dit {

struct Umt5Config {
  int64_t vocab = 256384;
  int64_t dim = 4096;
  int64_t dim_attn = 4096;
  int64_t dim_ffn = 10240;
  int64_t num_heads = 64;
  int64_t num_layers = 24;
  int64_t num_buckets = 32;
  int64_t max_dist = 128;  // T5RelativeEmbedding's default (not in the checkpoint)
  double eps = 1e-6;       // T5LayerNorm's default (not in the checkpoint)
  int64_t head_dim() const { return dim_attn / num_heads; }
};

// Upstream's umt5_xxl() encoder config (the defaults above).
Umt5Config umt5_xxl_config();

// T5RelativeEmbedding._relative_position_bucket: rel_pos (int64, any shape; key position minus
// query position) -> bucket ids (int64, same shape), with upstream's float32 log arithmetic.
at::Tensor umt5_relative_position_bucket(const at::Tensor& rel_pos, int64_t num_buckets, bool bidirectional,
                                         int64_t max_dist);

// A bias-free linear layer whose weight [out, in] is left uninitialised (the checkpoint fills it).
struct Umt5LinearImpl : torch::nn::Module {
  Umt5LinearImpl(int64_t in, int64_t out, const at::TensorOptions& opt);
  at::Tensor forward(const at::Tensor& x);
  at::Tensor weight;
};
TORCH_MODULE(Umt5Linear);

// An embedding table [rows, dim], uninitialised.
struct Umt5EmbeddingImpl : torch::nn::Module {
  Umt5EmbeddingImpl(int64_t rows, int64_t dim, const at::TensorOptions& opt);
  at::Tensor forward(const at::Tensor& ids);
  at::Tensor weight;
};
TORCH_MODULE(Umt5Embedding);

// T5LayerNorm: x * rsqrt(mean(x^2 in float32) + eps), cast to the weight's dtype when that is
// float16/bfloat16, times the weight.
struct Umt5LayerNormImpl : torch::nn::Module {
  Umt5LayerNormImpl(int64_t dim, double eps, const at::TensorOptions& opt);
  at::Tensor forward(const at::Tensor& x);
  at::Tensor weight;
  double eps;
};
TORCH_MODULE(Umt5LayerNorm);

// T5RelativeEmbedding (bidirectional): forward(lq, lk) -> [1, heads, lq, lk] in the weight's dtype.
struct Umt5RelativeEmbeddingImpl : torch::nn::Module {
  Umt5RelativeEmbeddingImpl(const Umt5Config& c, const at::TensorOptions& opt);
  at::Tensor forward(int64_t lq, int64_t lk);
  Umt5Embedding embedding{nullptr};
  int64_t num_buckets, max_dist;
};
TORCH_MODULE(Umt5RelativeEmbedding);

// T5Attention (self-attention): x [B, L, dim], mask [B, L] (1 = attend) or undefined, pos_bias
// [1, heads, L, L] or undefined -> [B, L, dim].
struct Umt5AttentionImpl : torch::nn::Module {
  Umt5AttentionImpl(const Umt5Config& c, const at::TensorOptions& opt);
  at::Tensor forward(const at::Tensor& x, const at::Tensor& mask, const at::Tensor& pos_bias);
  Umt5Linear q{nullptr}, k{nullptr}, v{nullptr}, o{nullptr};
  int64_t num_heads, head_dim;
};
TORCH_MODULE(Umt5Attention);

// T5FeedForward: fc2(fc1(x) * gelu_tanh(gate.0(x))).
struct Umt5FeedForwardImpl : torch::nn::Module {
  Umt5FeedForwardImpl(const Umt5Config& c, const at::TensorOptions& opt);
  at::Tensor forward(const at::Tensor& x);
  torch::nn::Sequential gate{nullptr};
  Umt5Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(Umt5FeedForward);

// T5SelfAttention with shared_pos=False: its own relative position bias.
struct Umt5BlockImpl : torch::nn::Module {
  Umt5BlockImpl(const Umt5Config& c, const at::TensorOptions& opt);
  // x [B, L, dim], mask [B, L] or undefined -> [B, L, dim].
  at::Tensor forward(const at::Tensor& x, const at::Tensor& mask);
  Umt5LayerNorm norm1{nullptr}, norm2{nullptr};
  Umt5Attention attn{nullptr};
  Umt5FeedForward ffn{nullptr};
  Umt5RelativeEmbedding pos_embedding{nullptr};
};
TORCH_MODULE(Umt5Block);

// T5Encoder. Parameters are created uninitialised in `opt`'s dtype and device (the full model in
// float32 would take 23 GB): load weights before use (load_umt5_weights).
struct Umt5EncoderImpl : torch::nn::Module {
  explicit Umt5EncoderImpl(const Umt5Config& c, const at::TensorOptions& opt = at::TensorOptions(at::kFloat));
  // ids [B, L] int64, mask [B, L] (any integer or bool dtype; 1 = a real token) or undefined (all
  // real) -> [B, L, dim] in the parameters' dtype, the final norm applied. Rows at masked positions
  // are computed as upstream computes them (attending to the real tokens) and are not zero.
  at::Tensor forward(const at::Tensor& ids, const at::Tensor& mask = {});
  Umt5Config config;
  Umt5Embedding token_embedding{nullptr};
  torch::nn::ModuleList blocks{nullptr};
  Umt5LayerNorm norm{nullptr};
};
TORCH_MODULE(Umt5Encoder);

// The config of an encoder checkpoint read from its tensors' shapes (a safetensors file or a
// torch.save .pth, by content): vocab and dim from token_embedding, dim_attn from blocks.0.attn.q,
// dim_ffn from blocks.0.ffn.fc1, buckets and heads from blocks.0.pos_embedding, the block count
// from the blocks.N keys. Throws wm::Error naming the file and the key when one is missing or the
// bias is shared (a top-level pos_embedding: T5, not umT5).
Umt5Config umt5_config_from_checkpoint(const std::string& path);

// Copies the checkpoint (safetensors or .pth) into the encoder by name, one tensor at a time.
// Strict, checked before anything is copied: a key of the encoder the file lacks, an extra key, a
// wrong shape or a non-float tensor throws wm::Error naming the file and the key. A tensor holding
// NaN or inf throws during the copy.
void load_umt5_weights(Umt5EncoderImpl& enc, const std::string& path);

// Config from the checkpoint, the encoder built on `device` in `dtype` (float32, bfloat16 or
// float16; upstream runs it in bfloat16), weights loaded, eval mode.
Umt5Encoder load_umt5_encoder(const std::string& path, at::Device device = at::kCPU,
                              at::ScalarType dtype = at::kFloat);

// The text context the DiT takes: T5EncoderModel.__call__ (the encoder over ids and mask, each
// sequence cut to its length) then WanModelFast's zero padding. ids, mask [B, L] as
// Umt5Tokenizer gives them (mask 1 on a prefix of each row, at least one token) -> [B, L, dim]
// in the encoder's dtype: the encoder's rows for the real tokens, zeros after. Each sequence runs
// at its own length without a mask: upstream's masked run over all L positions gives its masked
// keys a weight of exactly zero, so the rows are the same values, summed over fewer terms.
at::Tensor umt5_context(Umt5EncoderImpl& enc, const at::Tensor& ids, const at::Tensor& mask);

}  // namespace wm::dit
