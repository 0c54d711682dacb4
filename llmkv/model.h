#pragma once
// A decoder of the Llama / Qwen2 family on the shared KV core.
//
// Submodule names mirror Hugging Face checkpoint keys: model.embed_tokens,
// model.layers.N.{input_layernorm, self_attn.{q,k,v,o}_proj, post_attention_layernorm,
// mlp.{gate,up,down}_proj}, model.norm, lm_head (absent when the embeddings are tied).
//
// Layer (pre-norm):
//   h = x + o_proj(attn(rope(q_proj(rms(x))), rope(k_proj(rms(x))), v_proj(rms(x))))
//   y = h + down_proj(silu(gate_proj(rms(h))) * up_proj(rms(h)))
// RoPE is Hugging Face's "rotate half" pairing (RopeStyle::Half) over the whole head dim with
// the config's rope_theta; keys are stored in the window already rotated. GQA: n_heads is a
// multiple of n_kv_heads; K/V are never repeated in memory.
//
// Two ways to run it: step() over a KvWindow (inference: prefill in chunks, decode token by
// token, with the KV appended to a named region), and forward_train() over a batch of whole
// sequences with autograd (training). The per-layer pieces are public so that callers can run a
// layer at a time (beam search over a beam table, selective recompute).
//
// Dtype and device: the model computes in its parameters' dtype on their device (float32 on the
// CPU); norms take their statistics in float32 as Hugging Face does; logits come back float32.
// Inputs (token ids, positions) may live on any device and are moved where they are needed.
#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/pimpl.h>

#include <string>
#include <vector>

#include "llmkv/config.h"
#include "llmkv/gemv.h"
#include "llmkv/quant_gemv.h"
#include "runtime/attention.h"
#include "runtime/kv_spec.h"
#include "runtime/window.h"

namespace wm::llm {

// Attention of q [H, c, d] (the current tokens' queries) over a staged window layer whose kv
// heads see different tokens (st.head_logw defined: per-head selection): one call per kv head,
// its H / KH query heads over its keys with the window's log-weights plus its own, so a token
// the head does not see weighs exactly 0; the decode kernels when one_token and they apply.
// Outputs [H, c, d] and key masses [KH, n] (ao.capture_mass) as one call over all heads gives.
AttentionResult attend_per_head(const at::Tensor& q, const KvWindow::Staged& st, const AttentionOptions& ao,
                                bool one_token);

// How a model's parameters start: as libtorch's modules start theirs (Linear's Kaiming-uniform
// weights and uniform biases, Embedding's standard normal, norms at 1), or allocated and left
// uninitialised, for weights that are about to be loaded (hf_folder.h): a checkpoint's size in
// random numbers drawn for nothing otherwise.
enum class ParamInit { Default, Uninitialised };

// How parameters are made: their start and dtype (float32, float16 or bfloat16; on the CPU).
struct ParamAlloc {
  ParamInit init = ParamInit::Default;
  at::ScalarType dtype = at::kFloat;
};

// RMSNorm as Llama: x * rsqrt(mean(x^2) + eps) * weight, computed in float32.
// As Hugging Face: weight * (x_f32 * rsqrt(mean(x_f32^2) + eps)).to(x's dtype).
struct LlmRmsNormImpl : torch::nn::Module {
  LlmRmsNormImpl(int64_t dim, double eps, ParamAlloc alloc = {});
  at::Tensor forward(const at::Tensor& x);  // [..., dim] -> same shape and dtype
  at::Tensor weight;                         // [dim]
  double eps;
};
TORCH_MODULE(LlmRmsNorm);

// y = x W^T + b: weight [out, in], bias [out] (undefined without one), as torch::nn::Linear
// registers them. A few rows of x on the CPU (decode) go through the decode kernels (gemv.h).
// After quantize_int8() the weight lives in q8 (int8 with block scales) and `weight` is emptied;
// after set_quant() it lives in qw (GGUF blocks as stored, quant_gemv.h), `weight` emptied too.
struct LlmLinearImpl : torch::nn::Module {
  LlmLinearImpl(int64_t in, int64_t out, bool bias, ParamAlloc alloc = {});
  at::Tensor forward(const at::Tensor& x);  // [..., in] -> [..., out]
  void quantize_int8();
  // Takes `w` (its shape the weight's: wm::Error otherwise) as the weight from now on.
  void set_quant(QuantWeight w);
  at::Tensor weight, bias;
  Int8Weight q8;
  QuantWeight qw;
};
TORCH_MODULE(LlmLinear);

// The token embeddings: weight [vocab, hidden] (rows looked up by LlmModelImpl::embed).
struct LlmEmbeddingImpl : torch::nn::Module {
  LlmEmbeddingImpl(int64_t vocab, int64_t dim, ParamAlloc alloc = {});
  at::Tensor weight;
};
TORCH_MODULE(LlmEmbedding);

// q_proj [n_heads * head_dim, hidden], k/v_proj [n_kv_heads * head_dim, hidden] (biases per
// LlmConfig::qkv_bias), o_proj [hidden, n_heads * head_dim] (bias per LlmConfig::o_proj_bias).
struct LlmAttentionImpl : torch::nn::Module {
  explicit LlmAttentionImpl(const LlmConfig& c, ParamAlloc alloc = {});
  LlmLinear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
};
TORCH_MODULE(LlmAttention);

struct LlmMlpImpl : torch::nn::Module {
  explicit LlmMlpImpl(const LlmConfig& c, ParamAlloc alloc = {});
  at::Tensor forward(const at::Tensor& x);  // SwiGLU: down(silu(gate(x)) * up(x)), x [..., hidden]
  LlmLinear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};  // biases iff mlp_bias
};
TORCH_MODULE(LlmMlp);

struct LlmLayerImpl : torch::nn::Module {
  explicit LlmLayerImpl(const LlmConfig& c, ParamAlloc alloc = {});
  LlmRmsNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
  LlmAttention self_attn{nullptr};
  LlmMlp mlp{nullptr};
};
TORCH_MODULE(LlmLayer);

// The inner "model." part of the checkpoint.
struct LlmBodyImpl : torch::nn::Module {
  explicit LlmBodyImpl(const LlmConfig& c, ParamAlloc alloc = {});
  LlmEmbedding embed_tokens{nullptr};
  torch::nn::ModuleList layers{nullptr};
  LlmRmsNorm norm{nullptr};
};
TORCH_MODULE(LlmBody);

// Options of one step() over the window.
struct StepOptions {
  std::string region = "recent";  // where the tokens' K/V are appended
  std::string segment;            // segment id in that region (created if new); empty: "tail"
  bool all_logits = false;        // logits for every token (else for the last one only)
  bool capture_mass = false;      // per layer, the attention mass each key received
  int64_t mass_queries = 0;       // ... from the last mass_queries tokens only (0: from all)
  bool capture_query = false;     // per layer, the last token's query (rotated), per kv head
  bool capture_queries = false;   // per layer, every token's query (rotated), per kv head
  bool append = true;             // false: attend over window + tokens but leave the window as it was
};

struct StepResult {
  at::Tensor logits;                   // [n, vocab] or [1, vocab], float32
  at::Tensor hidden;                   // [n, hidden] after the final norm, float32
  std::vector<at::Tensor> key_mass;    // per layer [n_kv_heads, n_window + n] float32 (if captured)
  std::vector<at::Tensor> query;       // per layer [n_kv_heads, head_dim] float32: the last token's
                                       // query, its group's query heads averaged (if captured)
  std::vector<at::Tensor> queries;     // per layer [n_kv_heads, n, head_dim] float32: every token's,
                                       // averaged alike (if captured)
};

// Per-layer projections of a layer's input x [..., n, hidden] at positions pos [n] (int64):
// q [..., n_heads, n, head_dim] and k [..., n_kv_heads, n, head_dim] rotated, v unrotated, all in
// the model's dtype on its device (views of the projections; not necessarily contiguous).
struct Qkv {
  at::Tensor q, k, v;
};

class LlmModelImpl : public torch::nn::Module {
 public:
  // Throws wm::Error (from cfg.validate()) on an invalid config. Parameters are made on the CPU
  // as `alloc` says (by default libtorch's defaults in float32); load weights (hf_folder.h) or
  // call init_weights(). Parameters of llm_parameter_shapes(cfg) (weight_shapes.h), in its order.
  explicit LlmModelImpl(LlmConfig cfg, ParamAlloc alloc = {});

  const LlmConfig& config() const { return cfg_; }
  const RopeSpec& rope() const { return rope_; }
  at::Device device() const;        // of the parameters
  at::ScalarType dtype() const;     // of the parameters
  // The KV layout this model writes: layers, kv heads, head dim, a 1-axis text RoPE (Half).
  KvSpec kv_spec(at::Device device, at::ScalarType dtype = at::kFloat) const;

  // Runs tokens [n] (int64) at positions pos [n] (int64, CPU) over everything in `window` plus
  // themselves (causal among themselves), every layer, and appends their K/V (rotated) to
  // opt.region / opt.segment of every layer. Chunked prefill = several step() calls; decode =
  // step() with n = 1. Runs without autograd. The window must be on the model's device; its
  // dtype may differ (K/V are stored in the window's dtype, attention runs in it). Throws
  // wm::Error on shapes, token ids outside the vocabulary, or a window of another layout or
  // device.
  StepResult step(const at::Tensor& tokens, const at::Tensor& pos, KvWindow& window, const StepOptions& opt = {});

  // One decode step of several independent sequences at once (continuous batching): tokens [B]
  // int64, positions pos [B] (int64, CPU), windows[b] sequence b's window (distinct windows;
  // each gets its token's K/V appended as step() appends). The projections, MLPs and LM head run
  // as one product over the B rows (on the CPU the decode kernels read each weight once for up
  // to 8 rows), attention per sequence over its own window and policy layout. Result b is what
  // step() gives for sequence b alone (logits [1, vocab], hidden [1, hidden], key_mass / query
  // when asked), up to the rounding of batched products. Throws wm::Error as step() does, or on
  // all_logits / capture_queries (one token a sequence).
  std::vector<StepResult> step_batch(const at::Tensor& tokens, const at::Tensor& pos,
                                     const std::vector<KvWindow*>& windows, const StepOptions& opt = {});
  // Training: tokens [B, T] (int64) at positions 0..T-1, causal attention, autograd on.
  // Returns logits [B, T, vocab] (float32).
  at::Tensor forward_train(const at::Tensor& tokens);

  // The pieces of a layer. x [..., n, hidden] in the model's dtype on its device.
  // tokens [...] int64 (any device) -> [..., hidden]. Throws wm::Error on an id outside the vocabulary.
  at::Tensor embed(const at::Tensor& tokens);
  // Applies the layer's input norm, then its q/k/v projections and RoPE (see Qkv).
  Qkv project(int layer, const at::Tensor& x, const at::Tensor& pos);
  // As project(), with cos/sin [n, head_dim / 2] from rope_cos_sin() (one computation shared by
  // every layer).
  Qkv project(int layer, const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);
  // cos and sin [n, head_dim / 2] in the model's dtype on its device for positions pos [n] int64.
  std::pair<at::Tensor, at::Tensor> rope_cos_sin(const at::Tensor& pos) const;
  // attn [..., n_heads, n, head_dim] (attention output) -> the layer's output [..., n, hidden]
  // given its input x: x + o_proj(attn) followed by the MLP block.
  at::Tensor finish(int layer, const at::Tensor& x, const at::Tensor& attn);
  // Final norm and LM head: x [..., hidden] -> (normed hidden, logits [..., vocab] float32).
  std::pair<at::Tensor, at::Tensor> head(const at::Tensor& x);

  // Int8 weight-only mode: every projection's weight (and the LM head's) quantised to int8 with
  // a float32 scale per block of 32 inputs (gemv.h), the float copies of the projections freed;
  // activations, norms, the embedding lookup and the KV stay in the model's dtype. CPU only;
  // inference only (forward_train refuses). Idempotent.
  void quantize_int8();
  bool weights_int8() const { return int8_; }
  // Keeps the parameter `name` ("model.layers.3.mlp.down_proj.weight", "lm_head.weight",
  // "model.embed_tokens.weight") as GGUF blocks from now on (gguf_model.h), its float copy freed:
  // projections multiply by the blocks, embedding lookups decode the rows they need, and with tied
  // embeddings the LM head multiplies by the embedding's blocks. CPU and float32 only; inference
  // only. Throws wm::Error on another name, a shape that is not the parameter's, or int8 weights.
  void set_quant_weight(const std::string& name, QuantWeight w);
  bool weights_quantized() const { return quant_; }
  const QuantWeight& quant_embedding() const { return embed_q_; }
  // Bytes a decode step reads in weights: the projections and the LM head as stored (int8 and
  // scales after quantize_int8()), plus the norms.
  int64_t decode_weight_bytes() const;

  // Random initialisation as Hugging Face (normal(0, initializer_range), zero biases, norms 1),
  // drawn on the CPU in float32 from `seed` (the same weights on any device).
  void init_weights(uint64_t seed);

  LlmBody model{nullptr};
  LlmLinear lm_head{nullptr};  // null when tie_word_embeddings

 private:
  LlmLayerImpl& layer(int l);
  at::Tensor logits(const at::Tensor& normed);  // the LM head: [..., hidden] -> [..., vocab] float32
  LlmConfig cfg_;
  RopeSpec rope_;
  bool int8_ = false;
  bool quant_ = false;
  QuantWeight embed_q_;  // the embedding as GGUF blocks (set_quant_embedding), or undefined
  Int8Weight lm_head_q8_;  // the LM head's int8 copy (tied embeddings keep their float rows for lookup)
};
TORCH_MODULE(LlmModel);

}  // namespace wm::llm
