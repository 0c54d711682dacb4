#pragma once
// A prompt to LingBot-World-Fast's text context, as upstream's pipeline makes it
// (Robbyant/lingbot-world 91ff5f6: WanI2VFast.generate calls T5EncoderModel([prompt], device),
// wan/modules/t5.py): the prompt tokenized by umT5's tokenizer to text_len (512) tokens with its
// mask (dit/umt5_tokenizer.h), the encoder over them (dit/umt5.h), and each sequence cut to its
// real tokens, EOS included: [L, dim] with L <= text_len. The DiT zero-pads it to text_len
// (WanModelFast.forward; LingbotDitImpl::encode_text), so the rows past L are zeros.
//
// The files are where the release's config names them (wan/configs/wan_i2v_A14B.py: t5_checkpoint,
// t5_tokenizer) inside the checkpoint folder, lingbot-world-base-cam, the folder that holds
// lingbot_world_fast/ (the DiT) and Wan2.1_VAE.pth.
#include <ATen/ATen.h>

#include <cstdint>
#include <string>

#include "dit/umt5.h"
#include "dit/umt5_tokenizer.h"

namespace wm::dit {

// The names relative to the checkpoint folder: the encoder as the hub ships it, the same converted
// by wm_pth_convert (or written by wm_bench_dit --lingbot-hub), and the tokenizer folder with its
// SentencePiece model.
inline constexpr const char* kUmt5Checkpoint = "models_t5_umt5-xxl-enc-bf16.pth";
inline constexpr const char* kUmt5ConvertedCheckpoint = "models_t5_umt5-xxl-enc-bf16.safetensors";
inline constexpr const char* kUmt5TokenizerDir = "google/umt5-xxl";
inline constexpr const char* kUmt5SpieceModel = "spiece.model";

struct Umt5Files {
  std::string encoder;    // the .pth, else the converted .safetensors
  std::string tokenizer;  // google/umt5-xxl/spiece.model
};

// The umT5 files in `checkpoint_dir`: the .pth when present, else the .safetensors. Throws
// wm::Error naming the folder and each file that is missing (the encoder, the tokenizer or both).
Umt5Files find_umt5_files(const std::string& checkpoint_dir);

// One prompt's context through a loaded tokenizer and encoder: upstream's T5EncoderModel.__call__
// on [prompt] -> [L, dim] in the encoder's dtype, on its device (L: the prompt's tokens with EOS,
// truncated to text_len keeping the EOS). text_len >= 1. Throws wm::Error when a token id is past
// the encoder's vocabulary, or on invalid UTF-8.
at::Tensor umt5_prompt_context(const Umt5Tokenizer& tokenizer, Umt5EncoderImpl& encoder, const std::string& prompt,
                               int64_t text_len);

struct Umt5Prompt {
  at::Tensor context;         // [L, dim], the encoder's dtype, on its device
  int64_t tokens = 0;         // L
  int64_t prompt_tokens = 0;  // the prompt's tokens with EOS before truncation (> text_len: it was cut)
  Umt5Config config;          // the encoder's
};

// The files loaded (the tokenizer, then the encoder on `device` in `dtype`: float32, bfloat16 or
// float16; upstream runs it in bfloat16), the prompt encoded, the encoder freed on return. The
// vocabularies are checked before the encoder's weights are read. Throws wm::Error naming the file
// (unreadable, or a tokenizer with more pieces than the encoder has rows), as the loaders do.
Umt5Prompt encode_umt5_prompt(const std::string& prompt, const Umt5Files& files, int64_t text_len, at::Device device,
                              at::ScalarType dtype);

}  // namespace wm::dit
