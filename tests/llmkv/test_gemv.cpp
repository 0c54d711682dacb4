// The decode kernels (llmkv/gemv.h): every ISA path and weight kind against a float64 reference,
// int8 quantisation's round trip, and a decoder's steps with the kernels against libtorch's path.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <array>
#include <cmath>
#include <iostream>
#include <string>
#include <tuple>

#include "llm_test_util.h"
#include "llmkv/decode_kernels.h"
#include "llmkv/gemv.h"
#include "runtime/attention.h"
#include "runtime/error.h"
#include "runtime/window.h"

namespace wm::llm {
namespace {

// Sets the process-wide path for one test, restores the previous one after.
struct PathGuard {
  explicit PathGuard(GemvPath p) : old(gemv_path()) { set_gemv_path(p); }
  ~PathGuard() { set_gemv_path(old); }
  GemvPath old;
};

// Largest |y - ref| / (sum_i |x_i w_i| + 1e-30) over the outputs: float32 accumulation of n
// terms stays within a few n * 2^-24 of that scale.
double scaled_error(const at::Tensor& y, const at::Tensor& x, const at::Tensor& w) {
  at::Tensor xd = x.to(at::kDouble).reshape({-1, x.size(-1)}), wd = w.to(at::kDouble);
  at::Tensor ref = at::matmul(xd, wd.t());
  at::Tensor scale = at::matmul(xd.abs(), wd.abs().t()) + 1e-30;
  return ((y.to(at::kDouble).reshape(ref.sizes()) - ref).abs() / scale).max().item<double>();
}

class GemvPaths : public ::testing::TestWithParam<std::tuple<std::string, at::ScalarType>> {};

TEST_P(GemvPaths, MatchesFloat64Reference) {
  const auto [path_name, wdt] = GetParam();
  PathGuard guard(parse_gemv_path(path_name));
  if (std::string(gemv_active_name()) != path_name) GTEST_SKIP() << "this CPU or build has no " << path_name;
  at::manual_seed(3);
  for (auto [in, out] : {std::pair<int64_t, int64_t>{37, 13}, {896, 130}, {64, 1}, {5, 9}}) {
    at::Tensor w = at::randn({out, in}).to(wdt);
    at::Tensor bias = at::randn({out});
    for (int64_t m : {1, 2, 3, 5, 8}) {
      at::Tensor x = at::randn({m, in});
      ASSERT_TRUE(gemv_applies(x, w));
      at::Tensor y = linear(x, w, at::Tensor());
      ASSERT_EQ(y.sizes(), (at::IntArrayRef{m, out}));
      EXPECT_LT(scaled_error(y, x, w), 1e-5) << path_name << " " << wdt << " in " << in << " out " << out << " m " << m;
      // The bias goes on after the sum.
      at::Tensor yb = linear(x, w, bias);
      EXPECT_TRUE(at::allclose(yb, y + bias, 1e-6, 1e-6));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(, GemvPaths,
                         ::testing::Combine(::testing::Values("avx512", "avx2", "scalar"),
                                            ::testing::Values(at::kFloat, at::kBFloat16, at::kHalf)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" + c10::toString(std::get<1>(info.param));
                         });

// A bfloat16 model's products: bfloat16 weights times bfloat16 x. On AVX-512 BF16 CPUs the
// avx512 path multiplies them by vdpbf16ps (each product exact, summed in float32); the other
// kernels convert the weights to float32 (x too, or x split into even and odd elements). Every
// kernel's float32 sums within 1e-5 of sum |x w| of the float64 product of the same bfloat16
// values: the bfloat16 dot rounds no activation.
TEST(Gemv, Bf16KernelsOnBf16Activations) {
  const bool has_dot = [] {
    PathGuard g(GemvPath::Avx512);
    return gemv_bf16_dot_active();
  }();
  if (!has_dot) std::cout << "[ INFO ] this CPU or build has no AVX-512 BF16: vdpbf16ps untested\n";
  auto has = [](GemvPath path) {
    PathGuard g(path);
    return std::string(gemv_active_name()) == gemv_path_name(path);
  };
  std::vector<std::pair<const char*, gemv::RowsFn>> fns{{"scalar", gemv::rows_scalar()}};
  if (has(GemvPath::Avx2)) fns.push_back({"avx2", gemv::rows_avx2()});
  if (has(GemvPath::Avx512)) fns.push_back({"avx512", gemv::rows_avx512()});
  if (has_dot) fns.push_back({"avx512 bf16 dot", gemv::rows_avx512_bf16()});
  at::manual_seed(9);
  for (auto [in, out] : {std::pair<int64_t, int64_t>{37, 13}, {896, 130}, {64, 1}, {5, 9}, {4864, 20}, {70, 40}}) {
    const at::Tensor w = at::randn({out, in}).to(at::kBFloat16);
    for (int64_t m : {1, 2, 3, 8}) {
      const at::Tensor xb = at::randn({m, in}).to(at::kBFloat16), x = xb.to(at::kFloat);
      const at::Tensor xe = x.slice(1, 0, in / 2 * 2, 2).contiguous(), xo = x.slice(1, 1, in / 2 * 2, 2).contiguous();
      for (auto [name, fn] : fns) {
        at::Tensor y = at::full({m, out}, std::nanf(""));
        gemv::Problem p;
        p.kind = gemv::WeightKind::BF16;
        p.w = w.data_ptr();
        p.x = x.data_ptr<float>();
        p.xb = static_cast<const uint16_t*>(xb.data_ptr());
        if (in % 2 == 0) p.xe = xe.data_ptr<float>(), p.xo = xo.data_ptr<float>();
        p.y = y.data_ptr<float>();
        p.m = m;
        p.in = in;
        p.out = out;
        gemv::run_rows(fn, p, 2);
        EXPECT_LT(scaled_error(y, x, w), 1e-5) << name << " in " << in << " out " << out << " m " << m;
      }
    }
  }
  // Through linear(): the kernel the path picks, with the dot switched on and off.
  PathGuard guard(GemvPath::Auto);
  const at::Tensor w = at::randn({300, 896}).to(at::kBFloat16), x = at::randn({1, 896}).to(at::kBFloat16);
  const at::Tensor ref = at::matmul(x.to(at::kFloat), w.to(at::kFloat).t());
  for (bool dot : {true, false}) {
    set_gemv_bf16_dot(dot);
    EXPECT_EQ(gemv_bf16_dot_active(), dot && has_dot);
    const at::Tensor y = linear(x, w, at::Tensor());
    EXPECT_EQ(y.scalar_type(), at::kBFloat16);
    EXPECT_TRUE(at::allclose(y.to(at::kFloat), ref, 1e-2, 1e-2)) << "dot " << dot;  // bfloat16's rounding of y
  }
  set_gemv_bf16_dot(true);
}

// Several products of one x as one job of the team equal the separate products: float32,
// bfloat16 (bfloat16 x) and float16 weights, int8 weights, biases or none, 1 to 8 rows, 1 and 2
// threads; weights of mixed dtypes and prefill-sized x go one by one.
TEST(Gemv, ProductsOfOneXTogetherEqualThemApart) {
  PathGuard guard(GemvPath::Auto);
  at::manual_seed(10);
  const int saved = at::get_num_threads();
  for (at::ScalarType dt : {at::kFloat, at::kBFloat16, at::kHalf})
    for (int threads : {1, 2})
      for (int64_t m : {1, 3, 8, 12}) {
        if (dt == at::kHalf && m > 8) continue;  // libtorch 1.13 has no float16 GEMM on the CPU
        at::set_num_threads(threads);
        const std::vector<at::Tensor> ws{at::randn({896, 896}).to(dt), at::randn({128, 896}).to(dt),
                                         at::randn({72, 896}).to(dt)};
        const std::vector<at::Tensor> bs{at::randn({896}).to(dt), at::Tensor(), at::randn({72}).to(dt)};
        const at::Tensor x = at::randn({m, 896}).to(dt);
        const std::vector<at::Tensor> ys = linear_many(x, ws, bs);
        for (size_t i = 0; i < ws.size(); ++i)
          EXPECT_TRUE(at::equal(ys[i], linear(x, ws[i], bs[i]))) << dt << " m " << m << " threads " << threads << " i " << i;
        std::vector<Int8Weight> q8;
        for (const at::Tensor& w : ws) q8.push_back(Int8Weight::quantize(w));
        const std::vector<at::Tensor> yq = linear_many(x, q8, bs);
        for (size_t i = 0; i < ws.size(); ++i)
          EXPECT_TRUE(at::allclose(yq[i], linear(x, q8[i], bs[i]), 1e-5, 1e-5)) << "int8 " << dt << " m " << m << " i " << i;
      }
  at::set_num_threads(saved);
  const at::Tensor x = at::randn({1, 64});
  const std::vector<at::Tensor> mixed{at::randn({16, 64}), at::randn({8, 64}).to(at::kBFloat16)};
  const std::vector<at::Tensor> ym = linear_many(x, mixed, {at::Tensor(), at::Tensor()});
  EXPECT_TRUE(at::equal(ym[1], linear(x, mixed[1], at::Tensor())));
  EXPECT_THROW(linear_many(x, mixed, {at::Tensor()}), wm::Error);
}

class GemvInt8Paths : public ::testing::TestWithParam<std::string> {};

TEST_P(GemvInt8Paths, MatchesItsDequantisedWeights) {
  const std::string path_name = GetParam();
  PathGuard guard(parse_gemv_path(path_name));
  if (std::string(gemv_active_name()) != path_name) GTEST_SKIP() << "this CPU or build has no " << path_name;
  at::manual_seed(4);
  for (auto [in, out] : {std::pair<int64_t, int64_t>{37, 13}, {896, 70}, {32, 3}}) {
    Int8Weight q = Int8Weight::quantize(at::randn({out, in}));
    at::Tensor deq = q.dequantize();
    for (int64_t m : {1, 4, 8}) {
      at::Tensor x = at::randn({m, in});
      EXPECT_LT(scaled_error(linear(x, q, at::Tensor()), x, deq), 1e-5) << path_name << " in " << in << " m " << m;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(, GemvInt8Paths, ::testing::Values("avx512", "avx2", "scalar"));

// The decode attention against the general one (wm::attention, a causal mask whose one query
// sees every key): GQA, log-weights, the key mass, heads lying apart in a larger buffer, K/V in
// each dtype, key counts that split into several ranges; head sizes of 2, 4 and 8 AVX-512
// registers (the blocked pieces, query heads in groups of 8, 4 and 2, a last group smaller, an
// odd key count) and others.
class DecodeAttentionPaths : public ::testing::TestWithParam<std::tuple<std::string, at::ScalarType>> {};

TEST_P(DecodeAttentionPaths, MatchesTheGeneralAttention) {
  const auto [path_name, kvdt] = GetParam();
  PathGuard guard(parse_gemv_path(path_name));
  if (std::string(gemv_active_name()) != path_name) GTEST_SKIP() << "this CPU or build has no " << path_name;
  at::manual_seed(8);
  for (auto [H, KH, nk, d] : {std::array<int64_t, 4>{4, 2, 9, 8}, {14, 2, 1500, 64}, {8, 1, 3000, 32},
                              {6, 3, 700, 20}, {9, 3, 301, 64}, {12, 2, 333, 128}}) {
    // The window's layout: [KH, capacity, d] buffers, the first nk rows used.
    at::Tensor kbuf = at::randn({KH, nk + 37, d}).to(kvdt), vbuf = at::randn({KH, nk + 37, d}).to(kvdt);
    at::Tensor k = kbuf.narrow(1, 0, nk), v = vbuf.narrow(1, 0, nk);
    at::Tensor q = at::randn({H, 1, d}) * 2;
    at::Tensor logw = at::randn({nk}) * 0.5;
    AttentionOptions ao;
    ao.mask.kind = AttentionMask::Causal;
    ao.n_window = nk - 1;
    ao.capture_mass = true;
    AttentionResult ref = wm::attention(q, k.to(at::kFloat), v.to(at::kFloat), logw, ao);
    ASSERT_TRUE(decode_attention_applies(q, k, v));
    auto [out, mass] = decode_attention(q, k, v, logw, true);
    EXPECT_LT((out - ref.out).abs().max().item<double>(), 2e-5) << path_name << " H " << H << " nk " << nk;
    EXPECT_LT((mass - ref.key_mass).abs().max().item<double>(), 2e-5) << path_name << " H " << H << " nk " << nk;
    auto [out2, none] = decode_attention(q, k, v, at::Tensor(), false);
    EXPECT_FALSE(none.defined());
    at::Tensor ref2 = wm::attention(q, k.to(at::kFloat), v.to(at::kFloat), at::Tensor(), ao).out;
    EXPECT_LT((out2 - ref2).abs().max().item<double>(), 2e-5);
  }
  // Scores far apart: the softmax stays finite (everything on the largest key).
  at::Tensor k = at::zeros({1, 300, 8}), v = at::randn({1, 300, 8});
  k[0][123].fill_(100.0);
  auto [out, mass] = decode_attention(at::ones({2, 1, 8}) * 10, k, v, at::Tensor(), true);
  EXPECT_TRUE(at::allclose(out[0][0], v[0][123], 1e-5, 1e-5));
  EXPECT_NEAR(mass[0][123].item<float>(), 2.0f, 1e-5);
}

INSTANTIATE_TEST_SUITE_P(, DecodeAttentionPaths,
                         ::testing::Combine(::testing::Values("avx512", "avx2", "scalar"),
                                            ::testing::Values(at::kFloat, at::kBFloat16, at::kHalf)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" + c10::toString(std::get<1>(info.param));
                         });

TEST(Gemv, Int8QuantisationRoundTrip) {
  at::manual_seed(5);
  at::Tensor w = at::randn({7, 75}) * 3;
  w[2].zero_();                    // an all-zero row: scale 0, q 0, exact
  w[4].narrow(0, 32, 32).zero_();  // one all-zero block inside a row
  Int8Weight q = Int8Weight::quantize(w);
  ASSERT_EQ(q.q.sizes(), (at::IntArrayRef{7, 75}));
  ASSERT_EQ(q.scale.sizes(), (at::IntArrayRef{7, 3}));  // 32 + 32 + 11
  EXPECT_EQ(q.bytes(), 7 * 75 + 7 * 3 * 4);
  EXPECT_LE(q.q.abs().max().item<int>(), 127);
  // Each block's largest |w| maps to +-127 exactly, every element within half a step.
  at::Tensor step = q.scale.repeat_interleave(32, 1).narrow(1, 0, 75);
  at::Tensor err = (q.dequantize() - w).abs();
  EXPECT_TRUE((err <= step * 0.5 + 1e-6).all().item<bool>());
  EXPECT_TRUE(q.dequantize()[2].eq(0).all().item<bool>());
  EXPECT_TRUE(q.dequantize()[4].narrow(0, 32, 32).eq(0).all().item<bool>());
  EXPECT_FLOAT_EQ(q.scale[0][0].item<float>(), w[0].narrow(0, 0, 32).abs().max().item<float>() / 127.f);
}

TEST(Gemv, Int8PrefillGoesThroughTheDequantisedWeights) {
  at::manual_seed(6);
  Int8Weight q = Int8Weight::quantize(at::randn({20, 64}));
  at::Tensor x = at::randn({3, 11, 64}), bias = at::randn({20});
  at::Tensor y = linear(x, q, bias);
  ASSERT_EQ(y.sizes(), (at::IntArrayRef{3, 11, 20}));
  EXPECT_TRUE(at::allclose(y, at::linear(x, q.dequantize(), bias), 1e-5, 1e-5));
}

TEST(Gemv, OnlyDecodeSizedInferenceTakesTheKernels) {
  PathGuard guard(GemvPath::Auto);
  at::Tensor w = at::randn({8, 16});
  EXPECT_TRUE(gemv_applies(at::randn({1, 16}), w));
  EXPECT_TRUE(gemv_applies(at::randn({2, 4, 16}), w));    // 8 rows
  EXPECT_FALSE(gemv_applies(at::randn({9, 16}), w));      // prefill-sized
  EXPECT_FALSE(gemv_applies(at::randn({1, 15}), w));      // wrong width
  EXPECT_FALSE(gemv_applies(at::randn({1, 16}), w.t()));  // not contiguous [out, in]
  at::Tensor wg = w.clone().requires_grad_(true);
  EXPECT_FALSE(gemv_applies(at::randn({1, 16}), wg));  // autograd wanted
  {
    at::NoGradGuard no_grad;
    EXPECT_TRUE(gemv_applies(at::randn({1, 16}), wg));
  }
  set_gemv_path(GemvPath::Libtorch);
  EXPECT_FALSE(gemv_applies(at::randn({1, 16}), w));
  EXPECT_THROW(parse_gemv_path("sse9"), wm::Error);
}

// Greedy decode logits of a small model: prefill 6 tokens, then 5 single-token steps.
at::Tensor decode_logits(LlmModel& m, at::ScalarType dt) {
  KvWindow w(m->kv_spec(at::kCPU, dt), {"recent"});
  at::Tensor tokens = at::tensor({3, 14, 15, 9, 26, 5}, at::kLong);
  StepResult r = m->step(tokens, at::arange(6, at::kLong), w);
  std::vector<at::Tensor> out{r.logits};
  for (int64_t i = 0; i < 5; ++i) {
    at::Tensor next = r.logits.argmax(-1).reshape({1});
    r = m->step(next, at::tensor({6 + i}, at::kLong), w);
    out.push_back(r.logits);
  }
  return at::cat(out);
}

TEST(Gemv, DecoderStepsMatchLibtorch) {
  for (at::ScalarType dt : {at::kFloat, at::kBFloat16}) {
    LlmModel m = test::random_model(61, 11);
    m->to(dt);
    at::Tensor ref, got;
    {
      PathGuard g(GemvPath::Libtorch);
      ref = decode_logits(m, dt);
    }
    {
      PathGuard g(GemvPath::Auto);
      got = decode_logits(m, dt);
    }
    const double rel = ((got - ref).abs().max() / ref.abs().max()).item<double>();
    EXPECT_LT(rel, dt == at::kFloat ? 1e-5 : 2e-2) << c10::toString(dt);
  }
}

// An int8 model computes what a float model holding its dequantised weights computes.
TEST(Gemv, Int8ModelEqualsItsDequantisedFloatModel) {
  LlmConfig c = test::small_config(61);
  c.tie_word_embeddings = false;
  LlmModel q(c), f(c);
  q->init_weights(12);
  f->init_weights(12);
  q->quantize_int8();
  EXPECT_TRUE(q->weights_int8());
  EXPECT_THROW(q->forward_train(at::zeros({1, 4}, at::kLong)), wm::Error);
  {
    at::NoGradGuard no_grad;
    auto copy = [](LlmLinearImpl& to, const LlmLinearImpl& from) {
      EXPECT_EQ(from.weight.numel(), 0) << "the float copy is freed";
      to.weight.copy_(from.q8.dequantize());
    };
    for (int l = 0; l < 2; ++l) {
      auto& lq = *q->model->layers[l]->as<LlmLayerImpl>();
      auto& lf = *f->model->layers[l]->as<LlmLayerImpl>();
      copy(*lf.self_attn->q_proj, *lq.self_attn->q_proj);
      copy(*lf.self_attn->k_proj, *lq.self_attn->k_proj);
      copy(*lf.self_attn->v_proj, *lq.self_attn->v_proj);
      copy(*lf.self_attn->o_proj, *lq.self_attn->o_proj);
      copy(*lf.mlp->gate_proj, *lq.mlp->gate_proj);
      copy(*lf.mlp->up_proj, *lq.mlp->up_proj);
      copy(*lf.mlp->down_proj, *lq.mlp->down_proj);
    }
    copy(*f->lm_head, *q->lm_head);
  }
  at::Tensor lq = decode_logits(q, at::kFloat), lf = decode_logits(f, at::kFloat);
  const double rel = ((lq - lf).abs().max() / lf.abs().max()).item<double>();
  EXPECT_LT(rel, 1e-5);
  // Weight bytes a step reads: int8 and scales instead of float32.
  EXPECT_LT(q->decode_weight_bytes() * 3, f->decode_weight_bytes());
}

// A tied model keeps float embedding rows for lookup and reads an int8 copy for its head.
TEST(Gemv, Int8TiedHeadIsTheQuantisedEmbedding) {
  LlmModel q = test::random_model(61, 13);
  const at::Tensor head = Int8Weight::quantize(q->model->embed_tokens->weight).dequantize();
  const at::Tensor rows = q->model->embed_tokens->weight.clone();
  q->quantize_int8();
  EXPECT_TRUE(at::equal(q->model->embed_tokens->weight, rows));
  KvWindow w(q->kv_spec(at::kCPU, at::kFloat), {"recent"});
  StepResult r = q->step(at::tensor({3, 1, 4}, at::kLong), at::arange(3, at::kLong), w);
  at::Tensor expect = at::matmul(r.hidden.narrow(0, 2, 1), head.t());
  EXPECT_TRUE(at::allclose(r.logits, expect, 1e-4, 1e-4));
}

}  // namespace
}  // namespace wm::llm
