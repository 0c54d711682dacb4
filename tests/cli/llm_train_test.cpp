// wm_llm_train end to end on a model small enough for seconds: a run writes a model folder that
// loads, and --init-from starts a new run from that folder's weights (not a fresh
// initialisation), recorded in its trainer state, at the folder's RoPE base or at --rope-theta's. Skipped when the program is not built.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "llmkv/hf_folder.h"
#include "llmkv/model.h"
#include "runtime/build_paths.h"
#include "tests/cli/program_runner.h"
#include "tests/temp_dir.h"

namespace wm::testing {
namespace {

double max_param_diff(llm::LlmModelImpl& a, llm::LlmModelImpl& b) {
  auto pa = a.named_parameters(true), pb = b.named_parameters(true);
  double worst = 0;
  for (const auto& item : pa) {
    const at::Tensor* other = pb.find(item.key());
    if (other == nullptr) return INFINITY;
    worst = std::max(worst, (item.value() - *other).abs().max().item<double>());
  }
  return worst;
}

TEST(LlmTrainRun, InitFromStartsFromTheFolderWeights) {
  const std::string exe = program_path("wm_llm_train");
  if (exe.empty()) GTEST_SKIP() << "wm_llm_train is not built";
  const fs::path dir = make_temp_dir("wm_llm_train_run_");
  const fs::path cfg = dir / "config.json";
  std::ofstream(cfg) << R"({"model_type": "qwen2", "hidden_size": 32, "intermediate_size": 64,
    "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16,
    "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": 512,
    "tie_word_embeddings": true, "initializer_range": 0.02, "vocab_size": 500})";
  const std::string tok = std::string(WM_SOURCE_DIR) + "/tests/llmkv/fixtures/tokenizer/cpp_trained.tokenizer.json";
  const std::vector<std::string> common = {"--curriculum", "64:2", "--batch-tokens", "256", "--eval-every", "2",
                                           "--eval-samples", "1", "--threads", "1", "--warmup", "1"};
  auto run = [&](std::vector<std::string> args) {
    std::vector<std::string> argv = {exe};
    argv.insert(argv.end(), args.begin(), args.end());
    argv.insert(argv.end(), common.begin(), common.end());
    return run_program(argv, dir, WM_SOURCE_DIR, 120);
  };
  const std::string a = (dir / "a").string(), b = (dir / "b").string(), c = (dir / "c").string(),
                    d = (dir / "d").string();
  RunResult ra = run({"-o", a, "--config", cfg.string(), "--tokenizer", tok, "--tasks", "recall", "--qk-init", "0.05"});
  ASSERT_TRUE(ra.exited && ra.code == 0) << ra.err;
  // A new run from a's weights at a learning rate too small to move them measurably, and one
  // from a fresh initialisation (another seed) as the contrast.
  RunResult rb = run({"-o", b, "--init-from", a, "--tasks", "recall,mqar", "--lr", "1e-7", "--min-lr", "0"});
  ASSERT_TRUE(rb.exited && rb.code == 0) << rb.err;
  RunResult rc = run({"-o", c, "--config", cfg.string(), "--tokenizer", tok, "--tasks", "recall", "--seed", "9",
                      "--lr", "1e-7", "--min-lr", "0"});
  ASSERT_TRUE(rc.exited && rc.code == 0) << rc.err;
  // The same from a's weights at another RoPE base: the saved model carries the new base.
  RunResult rd = run({"-o", d, "--init-from", a, "--tasks", "recall", "--rope-theta", "100000", "--lr", "1e-7",
                      "--min-lr", "0"});
  ASSERT_TRUE(rd.exited && rd.code == 0) << rd.err;

  const at::Device cpu(at::kCPU);
  llm::LlmModel ma = llm::load_llm(a, cpu), mb = llm::load_llm(b, cpu), mc = llm::load_llm(c, cpu);
  // Two AdamW steps of 1e-7 move a parameter by about 2e-7; another initialisation differs by ~0.02.
  EXPECT_LT(max_param_diff(*ma, *mb), 1e-5);
  EXPECT_GT(max_param_diff(*ma, *mc), 1e-2);
  EXPECT_EQ(read_text(fs::path(a) / "tokenizer.json"), read_text(fs::path(b) / "tokenizer.json"));
  const auto state = nlohmann::json::parse(read_text(fs::path(b) / "checkpoint/trainer_state.json"));
  EXPECT_EQ(state.at("init_from"), a);
  EXPECT_EQ(state.at("step"), 2);
  EXPECT_EQ(state.at("tasks"), "recall,mqar");
  EXPECT_EQ(state.at("rope_theta"), 10000.0);
  llm::LlmModel md = llm::load_llm(d, cpu);
  EXPECT_EQ(md->config().rope_theta, 100000.0);
  EXPECT_EQ(ma->config().rope_theta, 10000.0);
  EXPECT_LT(max_param_diff(*ma, *md), 1e-5);
  EXPECT_EQ(nlohmann::json::parse(read_text(fs::path(d) / "checkpoint/trainer_state.json")).at("rope_theta"), 100000.0);
  // Grown by a layer: a's layers as they were, the new one's output projections (near) zero, so
  // the grown model's logits are a's; the new layer's other matrices are drawn, not zero.
  const std::string e = (dir / "e").string();
  RunResult re = run({"-o", e, "--init-from", a, "--grow-layers", "1", "--tasks", "recall", "--lr", "1e-7",
                      "--min-lr", "0"});
  ASSERT_TRUE(re.exited && re.code == 0) << re.err;
  llm::LlmModel me = llm::load_llm(e, cpu);
  ASSERT_EQ(me->config().num_hidden_layers, 3);
  auto pe = me->named_parameters(true);
  for (const auto& item : ma->named_parameters(true))
    EXPECT_LT((item.value() - pe[item.key()]).abs().max().item<double>(), 1e-5) << item.key();
  EXPECT_LT(pe["model.layers.2.self_attn.o_proj.weight"].abs().max().item<double>(), 1e-5);
  EXPECT_LT(pe["model.layers.2.mlp.down_proj.weight"].abs().max().item<double>(), 1e-5);
  EXPECT_GT(pe["model.layers.2.self_attn.q_proj.weight"].abs().max().item<double>(), 1e-3);
  const at::Tensor ids = at::randint(0, 400, {1, 24}, at::kLong);
  EXPECT_LT((ma->forward_train(ids) - me->forward_train(ids)).abs().max().item<double>(), 1e-3);
  EXPECT_EQ(nlohmann::json::parse(read_text(fs::path(e) / "checkpoint/trainer_state.json")).at("grow_layers"), 1);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace wm::testing
