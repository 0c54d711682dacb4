// A prompt to LingBot-World-Fast's text context (dit/umt5_prompt.h): the files found where the hub
// puts them, and the context equal to the library's tokenizer and encoder called directly as
// upstream's T5EncoderModel.__call__ calls them (the padded batch through the masked encoder, each
// sequence cut to its tokens). A random umT5 encoder (dim 16, 2 blocks, tools/bench_dit/random_umt5.h)
// with one row per piece of the tokenizer fixture (tests/dit/fixtures/lingbot/umt5_spiece.model,
// 300 pieces).
#include <gtest/gtest.h>

#include <ATen/core/grad_mode.h>

#include <unistd.h>

#include <filesystem>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "dit/umt5.h"
#include "dit/umt5_prompt.h"
#include "dit/umt5_tokenizer.h"
#include "runtime/build_paths.h"
#include "runtime/error.h"
#include "runtime/safetensors.h"
#include "tests/gpu/cuda_test_util.h"
#include "tests/temp_dir.h"
#include "tools/bench_dit/random_umt5.h"

namespace wm::dit {
namespace umt5_prompt_test {
namespace fs = std::filesystem;

std::string fixture(const std::string& name) { return std::string(WM_SOURCE_DIR) + "/tests/dit/fixtures/lingbot/" + name; }

class Umt5PromptFolder : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = wm::testing::make_temp_dir(std::string("wm_umt5_prompt_") + info->name() + "_");
  }
  void TearDown() override { fs::remove_all(dir_); }

  // The hub's layout: the encoder (converted name) and google/umt5-xxl/spiece.model.
  void write_hub(int64_t vocab) {
    save_safetensors((dir_ / kUmt5ConvertedCheckpoint).string(),
                     bench::random_umt5(bench::small_umt5_config(16, vocab), 7));
    fs::create_directories(dir_ / kUmt5TokenizerDir);
    fs::copy_file(fixture("umt5_spiece.model"), dir_ / kUmt5TokenizerDir / kUmt5SpieceModel);
  }

  fs::path dir_;
};

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST_F(Umt5PromptFolder, FilesAreFoundAsTheHubLaysThemOutAndMissingOnesNamed) {
  const std::string none = error_of([&] { find_umt5_files(dir_.string()); });
  EXPECT_NE(none.find(dir_.string()), std::string::npos) << none;
  EXPECT_NE(none.find("no umT5 text encoder (models_t5_umt5-xxl-enc-bf16.pth"), std::string::npos) << none;
  EXPECT_NE(none.find("no umT5 tokenizer (google/umt5-xxl/spiece.model)"), std::string::npos) << none;
  write_hub(300);
  Umt5Files f = find_umt5_files(dir_.string());
  EXPECT_EQ(f.encoder, (dir_ / kUmt5ConvertedCheckpoint).string());
  EXPECT_EQ(f.tokenizer, (dir_ / "google" / "umt5-xxl" / "spiece.model").string());
  // The hub's own .pth is preferred to a converted file.
  fs::copy_file(fixture("umt5_tiny_enc_bf16.pth"), dir_ / kUmt5Checkpoint);
  EXPECT_EQ(find_umt5_files(dir_.string()).encoder, (dir_ / kUmt5Checkpoint).string());
  fs::remove(dir_ / kUmt5TokenizerDir / kUmt5SpieceModel);
  const std::string no_tok = error_of([&] { find_umt5_files(dir_.string()); });
  EXPECT_NE(no_tok.find("no umT5 tokenizer (google/umt5-xxl/spiece.model)"), std::string::npos) << no_tok;
  EXPECT_EQ(no_tok.find("text encoder"), std::string::npos) << no_tok;
}

// The context against the library's tokenizer and encoder called directly: the same rows as
// umt5_context's (exactly), and within 1e-5 of upstream's way, the padded batch through the masked
// encoder over all text_len positions, cut to the prompt's tokens. A prompt past text_len is cut
// keeping its EOS; an empty one is EOS alone.
TEST_F(Umt5PromptFolder, ContextIsTheEncoderOverThePromptsTokens) {
  if (!umt5_tokenizer_available()) GTEST_SKIP() << "built without libsentencepiece-dev (tools/setup.sh installs it)";
  write_hub(300);
  const Umt5Files files = find_umt5_files(dir_.string());
  const Umt5Tokenizer tok(files.tokenizer);
  Umt5Encoder enc = load_umt5_encoder(files.encoder, at::kCPU, at::kFloat);
  constexpr int64_t kTextLen = 24;
  std::string long_prompt;
  for (int i = 0; i < 12; ++i) long_prompt += "the quick brown fox jumps over the lazy dog ";
  for (const std::string prompt : {"A red car drives down a rainy street at dusk.", "", long_prompt.c_str()}) {
    SCOPED_TRACE("prompt: '" + prompt + "'");
    const Umt5Prompt p = encode_umt5_prompt(prompt, files, kTextLen, at::kCPU, at::kFloat);
    const Umt5Tokenizer::Batch b = tok({prompt}, kTextLen);
    const int64_t n = b.mask.sum().item<int64_t>();
    EXPECT_EQ(p.tokens, n);
    EXPECT_EQ(p.context.sizes(), (at::IntArrayRef{n, 16}));
    EXPECT_EQ(p.context.scalar_type(), at::kFloat);
    EXPECT_EQ(p.prompt_tokens, int64_t(tok.encode(prompt).size()));
    at::NoGradGuard ng;
    const at::Tensor direct = umt5_context(*enc, b.ids, b.mask);
    EXPECT_TRUE(at::equal(p.context, direct[0].narrow(0, 0, n)));
    EXPECT_TRUE(at::equal(direct[0].narrow(0, n, kTextLen - n), at::zeros({kTextLen - n, 16})));
    const at::Tensor masked = enc->forward(b.ids, b.mask)[0].narrow(0, 0, n);
    EXPECT_LT(test::rel_diff(p.context, masked), 1e-5);
    EXPECT_TRUE(at::equal(p.context, umt5_prompt_context(tok, *enc, prompt, kTextLen)));
  }
  const Umt5Prompt empty = encode_umt5_prompt("", files, kTextLen, at::kCPU, at::kFloat);
  EXPECT_EQ(empty.tokens, 1);
  const Umt5Prompt cut = encode_umt5_prompt(long_prompt, files, kTextLen, at::kCPU, at::kFloat);
  EXPECT_EQ(cut.tokens, kTextLen);
  EXPECT_GT(cut.prompt_tokens, kTextLen);
  EXPECT_EQ(tok({long_prompt}, kTextLen).ids[0][kTextLen - 1].item<int64_t>(), tok.eos_id());
  // In bfloat16 (upstream's dtype): that dtype, near the float32 context.
  const Umt5Prompt bf = encode_umt5_prompt(long_prompt, files, kTextLen, at::kCPU, at::kBFloat16);
  EXPECT_EQ(bf.context.scalar_type(), at::kBFloat16);
  EXPECT_LT(test::rel_diff(bf.context.to(at::kFloat), cut.context), 5e-2);
}

TEST_F(Umt5PromptFolder, ATokenizerWithMorePiecesThanTheEncoderIsRefused) {
  if (!umt5_tokenizer_available()) GTEST_SKIP() << "built without libsentencepiece-dev (tools/setup.sh installs it)";
  write_hub(256);
  const std::string e =
      error_of([&] { encode_umt5_prompt("a prompt", find_umt5_files(dir_.string()), 16, at::kCPU, at::kFloat); });
  EXPECT_NE(e.find("spiece.model: 300 pieces, but the encoder"), std::string::npos) << e;
  EXPECT_NE(e.find("has 256 token embeddings"), std::string::npos) << e;
}

}  // namespace umt5_prompt_test
}  // namespace wm::dit
