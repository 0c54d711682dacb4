// The decoder can learn what needs attention, not only what embeddings and MLPs can fit: a
// 2-layer model trained on random token strings shown twice must learn to copy the second
// half from the first (an induction head), which no model without working attention gradients
// through forward_train() can do. The first half stays unpredictable (chance), so the
// accuracy gap is the property.
#include <gtest/gtest.h>
#include <torch/optim/adamw.h>

#include <cstdio>

#include "llm_test_util.h"
#include "llmkv/model.h"

namespace wm::llm {
namespace {

TEST(LlmLearning, TwoLayersLearnToCopyInContext) {
  at::manual_seed(0);
  LlmConfig c = test::small_config(/*vocab=*/24, /*intermediate=*/128);
  c.hidden_size = 64;
  c.head_dim = 16;
  c.initializer_range = 0.02;
  c.validate();
  LlmModel m(c);
  m->init_weights(1);
  m->train();
  const int64_t B = 32, half = 12, T = 2 * half;
  torch::optim::AdamW opt(m->parameters(), torch::optim::AdamWOptions(3e-3).weight_decay(0.0));
  auto batch = [&] {
    at::Tensor first = at::randint(c.vocab_size, {B, half}, at::kLong);
    return at::cat({first, first}, 1);
  };
  // Accuracy of next-token prediction over [from, to) of the targets.
  auto accuracy = [&](const at::Tensor& logits, const at::Tensor& tok, int64_t from, int64_t to) {
    at::Tensor pred = logits.slice(1, from - 1, to - 1).argmax(-1);
    return (pred == tok.slice(1, from, to)).to(at::kFloat).mean().item<double>();
  };
  const int steps = 400;
  for (int s = 0; s < steps; ++s) {
    at::Tensor tok = batch();
    at::Tensor logits = m->forward_train(tok);
    at::Tensor loss = at::cross_entropy_loss(logits.slice(1, 0, T - 1).reshape({-1, c.vocab_size}),
                                             tok.slice(1, 1).reshape({-1}));
    opt.zero_grad();
    loss.backward();
    opt.step();
  }
  m->eval();
  at::NoGradGuard ng;
  at::Tensor tok = batch();
  at::Tensor logits = m->forward_train(tok);
  // Targets half+1 .. T-1 are copies whose source is visible; target `half` starts the repeat
  // and is a copy too (of token 0), but nothing marks where the repeat begins, so leave it out.
  const double copied = accuracy(logits, tok, half + 1, T);
  const double random = accuracy(logits, tok, 1, half);
  std::printf("[ copy task ] after %d steps: accuracy %.3f on the repeat, %.3f on the random half\n", steps, copied,
              random);
  EXPECT_GT(copied, 0.9);
  EXPECT_LT(random, 0.2);  // chance is 1/24
}

}  // namespace
}  // namespace wm::llm
