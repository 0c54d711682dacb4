#include "dit/umt5_prompt.h"

#include <ATen/core/grad_mode.h>

#include <filesystem>

#include "runtime/error.h"

namespace wm::dit {
namespace fs = std::filesystem;

Umt5Files find_umt5_files(const std::string& checkpoint_dir) {
  const fs::path dir(checkpoint_dir);
  const fs::path pth = dir / kUmt5Checkpoint, converted = dir / kUmt5ConvertedCheckpoint;
  const fs::path spiece = dir / kUmt5TokenizerDir / kUmt5SpieceModel;
  std::error_code ec;
  Umt5Files f;
  f.encoder = (fs::is_regular_file(pth, ec) || !fs::is_regular_file(converted, ec) ? pth : converted).string();
  f.tokenizer = spiece.string();
  std::string missing;
  if (!fs::is_regular_file(f.encoder, ec))
    missing = str_cat("no umT5 text encoder (", kUmt5Checkpoint, ", or ", kUmt5ConvertedCheckpoint,
                      " converted by wm_pth_convert)");
  if (!fs::is_regular_file(spiece, ec))
    missing += str_cat(missing.empty() ? "no" : " and no", " umT5 tokenizer (", kUmt5TokenizerDir, "/",
                       kUmt5SpieceModel, ")");
  if (!missing.empty())
    throw Error(str_cat(checkpoint_dir, ": ", missing, ", which --prompt needs; the hub's "
                        "lingbot-world-base-cam folder holds them beside lingbot_world_fast/"));
  return f;
}

at::Tensor umt5_prompt_context(const Umt5Tokenizer& tokenizer, Umt5EncoderImpl& encoder, const std::string& prompt,
                               int64_t text_len) {
  const Umt5Tokenizer::Batch b = tokenizer({prompt}, text_len);
  const int64_t n = b.mask.ne(0).sum().item<int64_t>();
  const int64_t top = b.ids.max().item<int64_t>();
  if (top >= encoder.config.vocab)
    throw Error(str_cat("umT5: token id ", top, " is past the encoder's vocabulary of ", encoder.config.vocab,
                        " (the tokenizer does not belong to this encoder)"));
  at::NoGradGuard ng;
  return umt5_context(encoder, b.ids, b.mask)[0].narrow(0, 0, n);
}

Umt5Prompt encode_umt5_prompt(const std::string& prompt, const Umt5Files& files, int64_t text_len, at::Device device,
                              at::ScalarType dtype) {
  const Umt5Tokenizer tokenizer(files.tokenizer);
  Umt5Prompt p;
  p.config = umt5_config_from_checkpoint(files.encoder);
  if (tokenizer.vocab_size() > p.config.vocab)
    throw Error(str_cat(files.tokenizer, ": ", tokenizer.vocab_size(), " pieces, but the encoder ", files.encoder,
                        " has ", p.config.vocab, " token embeddings"));
  p.prompt_tokens = int64_t(tokenizer.encode(prompt).size());
  Umt5Encoder encoder = load_umt5_encoder(files.encoder, device, dtype);
  p.context = umt5_prompt_context(tokenizer, *encoder, prompt, text_len);
  p.tokens = p.context.size(0);
  return p;
}

}  // namespace wm::dit
