// Linear layers on GGUF's quantized blocks (llmkv/quant_gemv.h): every type and ISA path against
// runtime/gguf_quants' dequantized weights, in both activation modes; llama.cpp's activation
// quantization (rounding, fp16 scales, Q8_1's s, Q8_K's sign and sums); the paths and the row
// counts agreeing bit for bit in the 8-bit mode; the sizes refused; SmolLM2's own rows.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "llmkv/gemv.h"
#include "llmkv/quant_gemv.h"
#include "llmkv/quant_kernels.h"
#include "runtime/error.h"
#include "runtime/gguf.h"
#include "runtime/gguf_quants.h"

namespace wm::llm::quant_gemv_test {

struct PathGuard {
  explicit PathGuard(GemvPath p) : old(gemv_path()) { set_gemv_path(p); }
  ~PathGuard() { set_gemv_path(old); }
  GemvPath old;
};

struct ActsGuard {
  explicit ActsGuard(QuantActivations a) : old(quant_activations()) { set_quant_activations(a); }
  ~ActsGuard() { set_quant_activations(old); }
  QuantActivations old;
};

const GgmlType kTypes[] = {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K};

bool is_k(GgmlType t) { return t == GgmlType::Q4_K || t == GgmlType::Q6_K; }

uint16_t half_bits(float v) { return c10::Half(v).x; }
float half_value(float v) { return static_cast<float>(c10::Half(v)); }

void put_half(uint8_t* p, float v) {
  const uint16_t h = half_bits(v);
  p[0] = static_cast<uint8_t>(h & 0xff);
  p[1] = static_cast<uint8_t>(h >> 8);
}

float get_half(const uint8_t* p) {
  c10::Half h;
  h.x = static_cast<uint16_t>(p[0] | (p[1] << 8));
  return static_cast<float>(h);
}

// Where a block's fp16 scale and min (or dmin) lie; -1: none.
int d_offset(GgmlType t) { return t == GgmlType::Q6_K ? 208 : 0; }
int min_offset(GgmlType t) { return t == GgmlType::Q4_1 || t == GgmlType::Q4_K ? 2 : -1; }

// Random blocks [out, row bytes]: random bytes (every nibble, 6-bit scale and quant), with fp16
// scales of a realistic size (and signed mins).
at::Tensor random_blocks(GgmlType t, int64_t out, int64_t in) {
  const QuantBlock qb = quant_block(t);
  const int64_t rb = static_cast<int64_t>(quant_bytes(t, in)), nblk = out * (in / qb.values);
  at::Tensor b = at::randint(0, 256, {out, rb}, at::TensorOptions().dtype(at::kByte));
  const at::Tensor d = at::rand({nblk}) * 0.02 + 0.001, mn = at::randn({nblk}) * 0.05;
  uint8_t* p = b.data_ptr<uint8_t>();
  for (int64_t i = 0; i < nblk; ++i) {
    uint8_t* blk = p + i * qb.bytes;
    put_half(blk + d_offset(t), d[i].item<float>() / (is_k(t) ? 16.f : 1.f));
    if (min_offset(t) >= 0) put_half(blk + min_offset(t), t == GgmlType::Q4_K ? std::abs(mn[i].item<float>()) / 16.f : mn[i].item<float>());
  }
  return b;
}

QuantWeight random_weight(GgmlType t, int64_t out, int64_t in) {
  return QuantWeight::from_blocks(t, out, in, random_blocks(t, out, in));
}

// x [m, in]: normal values, each 32 scaled by its own factor (a wide spread of block scales),
// one block of zeros.
at::Tensor random_x(int64_t m, int64_t in) {
  at::Tensor x = at::randn({m, in / 32, 32}) * at::exp(at::randn({m, in / 32, 1}));
  if (in >= 64) x.select(1, 1).zero_();
  return x.reshape({m, in});
}

// The weight with its min fields (Q4_1's m, Q4_K's dmin) zeroed, or its scale zeroed: the two
// parts of w = scale part + min part, as dequantized.
at::Tensor weight_part(const QuantWeight& w, bool min_part) {
  at::Tensor b = w.blocks.clone();
  const QuantBlock qb = quant_block(w.type);
  uint8_t* p = b.data_ptr<uint8_t>();
  const int off = min_part ? d_offset(w.type) : min_offset(w.type);
  if (off < 0) return min_part ? at::zeros({w.out, w.in}) : w.dequantize();
  for (int64_t i = 0; i < b.numel() / qb.bytes; ++i) p[i * qb.bytes + off] = p[i * qb.bytes + off + 1] = 0;
  return QuantWeight::from_blocks(w.type, w.out, w.in, b).dequantize();
}

// Largest |y - ref| / scale.
double worst(const at::Tensor& y, const at::Tensor& ref, const at::Tensor& scale) {
  return ((y.to(at::kDouble) - ref).abs() / (scale + 1e-30)).max().item<double>();
}

// |x| |w|^T and x w^T in float64.
std::pair<at::Tensor, at::Tensor> reference(const at::Tensor& x, const at::Tensor& w) {
  const at::Tensor xd = x.to(at::kDouble), wd = w.to(at::kDouble);
  return {at::matmul(xd, wd.t()), at::matmul(xd.abs(), wd.abs().t())};
}

// x quantized as the 8-bit mode does for t (the quantizer of `f`), and x rebuilt from it (q * d);
// d and s block-major ([blocks, m]), as the kernels take them.
struct Quantized {
  std::vector<int8_t> q;
  std::vector<float> d, s;
  std::vector<int16_t> bsums;
  at::Tensor xhat;  // [m, in] float64
};

gemv::QuantKind kind(GgmlType t) {
  switch (t) {
    case GgmlType::Q4_0: return gemv::QuantKind::Q4_0;
    case GgmlType::Q4_1: return gemv::QuantKind::Q4_1;
    case GgmlType::Q8_0: return gemv::QuantKind::Q8_0;
    case GgmlType::Q4_K: return gemv::QuantKind::Q4_K;
    default: return gemv::QuantKind::Q6_K;
  }
}

Quantized quantize_acts(GgmlType t, const at::Tensor& x, const gemv::QuantFns& f) {
  const int64_t m = x.size(0), in = x.size(1), blk = is_k(t) ? 256 : 32;
  Quantized r;
  r.q.resize(m * in);
  r.d.resize(m * in / blk);
  r.s.resize(m * in / 32);
  r.bsums.resize(m * in / 16);
  gemv::QActs a{r.q.data(), r.d.data(), r.s.data(), r.bsums.data(), m};
  const at::Tensor xc = x.contiguous();
  for (int64_t i = 0; i < m; ++i) f.quantize(kind(t), xc.data_ptr<float>(), in, a, i);
  r.xhat = at::empty({m, in}, at::kDouble);
  auto xh = r.xhat.accessor<double, 2>();
  for (int64_t i = 0; i < m; ++i)
    for (int64_t c = 0; c < in; ++c) xh[i][c] = double(r.q[i * in + c]) * r.d[(c / blk) * m + i];
  return r;
}

// Q4_1's mins m [out, in / 32] (float64), read from the blocks (bytes 2-3, fp16).
at::Tensor q4_1_mins(const QuantWeight& w) {
  const int64_t nb = w.in / 32;
  at::Tensor mins = at::empty({w.out, nb}, at::kDouble);
  auto mn = mins.accessor<double, 2>();
  const uint8_t* p = w.blocks.data_ptr<uint8_t>();
  for (int64_t o = 0; o < w.out; ++o)
    for (int64_t b = 0; b < nb; ++b) mn[o][b] = get_half(p + o * w.row_bytes() + b * 20 + 2);
  return mins;
}

// What the 8-bit mode computes, in float64: w . xhat, plus for Q4_1 the difference between
// llama.cpp's s (fp16(d32 * sum q)) and the rebuilt block's sum (fp16(d32) * sum q) times m.
at::Tensor q8_reference(const QuantWeight& w, const at::Tensor& x, const Quantized& qa) {
  at::Tensor ref = at::matmul(qa.xhat, w.dequantize().to(at::kDouble).t());
  if (w.type != GgmlType::Q4_1) return ref;
  const int64_t m = x.size(0), nb = w.in / 32;
  at::Tensor corr = at::zeros({m, nb}, at::kDouble);
  auto c = corr.accessor<double, 2>();
  for (int64_t i = 0; i < m; ++i)
    for (int64_t b = 0; b < nb; ++b) {
      int sum = 0;
      for (int j = 0; j < 32; ++j) sum += qa.q[i * w.in + b * 32 + j];
      c[i][b] = double(qa.s[b * m + i]) - double(qa.d[b * m + i]) * sum;
    }
  return ref + at::matmul(corr, q4_1_mins(w).t());
}

// The bound on |8-bit mode - exact product with float x| derived in llmkv/README.md: per block of
// the activations' quantization, E_b sum_{i in b} |w_i| with E_b = 0.5625 amax_b / 127 (Q8_0 and
// Q8_1: half a step, plus 127 steps' fp16 rounding of d) or 0.5001 amax_b / 127 (Q8_K, float32 d);
// plus for Q4_1 |m| amax_b / 32 (s's two fp16 roundings over 32 quants of at most 127).
at::Tensor q8_bound(const QuantWeight& w, const at::Tensor& x) {
  const int64_t blk = is_k(w.type) ? 256 : 32, m = x.size(0), nb = w.in / blk;
  const at::Tensor amax = x.to(at::kDouble).abs().reshape({m, nb, blk}).amax(-1);  // [m, nb]
  const at::Tensor e = amax * ((is_k(w.type) ? 0.5001 : 0.5625) / 127.0);
  const at::Tensor wabs = w.dequantize().to(at::kDouble).abs().reshape({w.out, nb, blk}).sum(-1);  // [out, nb]
  at::Tensor bound = at::matmul(e, wabs.t());
  if (w.type == GgmlType::Q4_1) bound = bound + at::matmul(amax / 32.0, q4_1_mins(w).abs().t());
  return bound;
}

// Shapes per type: `in` not a multiple of 256 for the 32-value types, one super-block and more
// for the K types; `out` not a multiple of 8 or of the threads' split.
std::vector<std::pair<int64_t, int64_t>> shapes(GgmlType t) {
  if (is_k(t)) return {{256, 37}, {512, 130}, {1536, 64}};
  // 2432 x 1200: rows longer than a chunk of scales (76 blocks), and at one row of x a thread's
  // share of rows long enough to be read as runs (quant_kernels.inl's kRunsFrom).
  return {{32, 11}, {96, 37}, {608, 130}, {1536, 64}, {2432, 1200}};
}

gemv::QuantFns fns_of(const std::string& path) {
  if (path == "avx512") return gemv::quant_avx512();
  if (path == "avx2") return gemv::quant_avx2();
  return gemv::quant_scalar();
}

class QuantGemvPaths : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    guard_ = std::make_unique<PathGuard>(parse_gemv_path(GetParam()));
    if (std::string(quant_active_name()) != GetParam()) GTEST_SKIP() << "this CPU or build has no " << GetParam();
  }
  std::unique_ptr<PathGuard> guard_;
};

// Float mode: within 1e-5 of sum |w x| of the float64 product with the dequantized weights, for
// 1 to 9 rows (the kernels; 9 goes to the tiles) and 40 (tiles of dequantized rows and at::mm).
TEST_P(QuantGemvPaths, FloatModeMatchesDequantizedWeights) {
  ActsGuard acts(QuantActivations::Float);
  at::manual_seed(11);
  for (GgmlType t : kTypes)
    for (auto [in, out] : shapes(t)) {
      const QuantWeight w = random_weight(t, out, in);
      const at::Tensor deq = w.dequantize();
      for (int64_t m : {1, 2, 3, 4, 5, 6, 7, 8, 9, 40}) {
        const at::Tensor x = random_x(m, in);
        const at::Tensor y = linear(x, w, at::Tensor());
        ASSERT_EQ(y.sizes(), (at::IntArrayRef{m, out}));
        const auto [ref, scale] = reference(x, deq);
        EXPECT_LT(worst(y, ref, scale), 1e-5) << ggml_type_name(t) << " in " << in << " out " << out << " m " << m;
      }
    }
}

// 8-bit mode: the product of the weights with the quantized activations as llama.cpp forms it
// (within float32 rounding, 1e-5 of the terms' magnitude), and within the derived bound of the
// product with the float activations.
TEST_P(QuantGemvPaths, Q8ModeMatchesQuantizedActivations) {
  ActsGuard acts(QuantActivations::Q8);
  at::manual_seed(12);
  const gemv::QuantFns f = fns_of(GetParam());
  double most_of_bound = 0;
  for (GgmlType t : kTypes)
    for (auto [in, out] : shapes(t)) {
      const QuantWeight w = random_weight(t, out, in);
      const at::Tensor mag = weight_part(w, false).abs() + weight_part(w, true).abs();
      for (int64_t m : {1, 2, 3, 5, 8, 9, 40}) {
        const at::Tensor x = random_x(m, in);
        const at::Tensor y = linear(x, w, at::Tensor());
        const Quantized qa = quantize_acts(t, x, f);
        const at::Tensor scale = at::matmul(qa.xhat.abs(), mag.to(at::kDouble).t());
        EXPECT_LT(worst(y, q8_reference(w, x, qa), scale), 1e-5) << ggml_type_name(t) << " in " << in << " m " << m;
        const auto [exact, sum_abs] = reference(x, w.dequantize());
        const at::Tensor bound = q8_bound(w, x) + 1e-5 * sum_abs;
        const double ratio = worst(y, exact, bound);
        EXPECT_LE(ratio, 1.0) << ggml_type_name(t) << " in " << in << " m " << m;
        most_of_bound = std::max(most_of_bound, ratio);
      }
    }
  std::printf("8-bit activations: the largest error is %.3f of the derived bound\n", most_of_bound);
}

INSTANTIATE_TEST_SUITE_P(, QuantGemvPaths, ::testing::Values("avx512", "avx2", "scalar"),
                         [](const auto& info) { return info.param; });

// The paths available give the same bits in the 8-bit mode (the float mode: the same to 1e-5).
TEST(QuantGemv, PathsAgreeBitForBit) {
  std::vector<std::string> paths;
  for (const char* p : {"avx512", "avx2", "scalar"}) {
    PathGuard g(parse_gemv_path(p));
    if (std::string(quant_active_name()) == p) paths.push_back(p);
  }
  if (paths.size() < 2) GTEST_SKIP() << "one kernel path on this CPU";
  at::manual_seed(13);
  for (GgmlType t : kTypes)
    for (auto [in, out] : shapes(t)) {
      const QuantWeight w = random_weight(t, out, in);
      for (int64_t m : {1, 3, 8, 20}) {
        const at::Tensor x = random_x(m, in);
        at::Tensor first_q8, first_f;
        for (const std::string& p : paths) {
          PathGuard g(parse_gemv_path(p));
          at::Tensor q8, fl;
          {
            ActsGuard a(QuantActivations::Q8);
            q8 = linear(x, w, at::Tensor());
          }
          {
            ActsGuard a(QuantActivations::Float);
            fl = linear(x, w, at::Tensor());
          }
          if (!first_q8.defined()) {
            first_q8 = q8, first_f = fl;
            continue;
          }
          EXPECT_TRUE(at::equal(q8, first_q8)) << ggml_type_name(t) << " " << p << " vs " << paths[0] << " in " << in << " m " << m
                                                << ": max diff " << (q8 - first_q8).abs().max().item<float>();
          const auto [ref, scale] = reference(x, w.dequantize());
          EXPECT_LT(worst(fl, first_f.to(at::kDouble), scale), 1e-5) << ggml_type_name(t) << " " << p;
        }
      }
    }
}

// In the 8-bit mode a row's output does not depend on the rows beside it: 37 rows at once (five
// tiles over the threads) equal each row alone, bit for bit.
TEST(QuantGemv, ManyRowsEqualOneRowAtATime) {
  ActsGuard acts(QuantActivations::Q8);
  at::manual_seed(14);
  for (GgmlType t : kTypes) {
    const auto [in, out] = shapes(t)[1];
    const QuantWeight w = random_weight(t, out, in);
    const at::Tensor x = random_x(37, in);
    const at::Tensor all = linear(x, w, at::Tensor());
    for (int64_t i = 0; i < 37; ++i)
      EXPECT_TRUE(at::equal(all[i], linear(x[i], w, at::Tensor()))) << ggml_type_name(t) << " row " << i;
  }
}

// Several products of one x in one job (Q, K and V; gate and up) equal the separate products bit
// for bit: weights of one type, Q4_1 beside Q8_0 and Q4_0 (one Q8_1 quantization serves all
// three), Q4_K beside Q6_K, and 32-value beside 256-value types (quantized apart); biases; 1, 3
// and 20 rows (tiles); both activation modes; one thread and two.
TEST(QuantGemv, ProductsOfOneXTogetherEqualThemApart) {
  at::manual_seed(23);
  const int saved = at::get_num_threads();
  const std::vector<std::vector<GgmlType>> groups{{GgmlType::Q8_0, GgmlType::Q8_0, GgmlType::Q8_0},
                                                  {GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::Q4_0},
                                                  {GgmlType::Q4_K, GgmlType::Q6_K},
                                                  {GgmlType::Q4_0, GgmlType::Q6_K, GgmlType::Q4_1}};
  const int64_t in = 512;
  for (QuantActivations mode : {QuantActivations::Q8, QuantActivations::Float})
    for (const auto& types : groups) {
      ActsGuard acts(mode);
      std::vector<QuantWeight> ws;
      std::vector<at::Tensor> biases;
      for (size_t i = 0; i < types.size(); ++i) {
        ws.push_back(random_weight(types[i], i == 0 ? 136 : 40 + 8 * static_cast<int64_t>(i), in));
        biases.push_back(i == 1 ? at::Tensor() : at::randn({ws.back().out}));
      }
      for (int threads : {1, 2})
        for (int64_t m : {1, 3, 20}) {
          at::set_num_threads(threads);
          const at::Tensor x = random_x(m, in);
          const std::vector<at::Tensor> ys = linear_many(x, ws, biases);
          ASSERT_EQ(ys.size(), ws.size());
          for (size_t i = 0; i < ws.size(); ++i) {
            const at::Tensor apart = linear(x, ws[i], biases[i]);
            // The float mode's many-row products go through at::mm, which need not give the bits twice.
            if (mode == QuantActivations::Float && m > 8)
              EXPECT_TRUE(at::allclose(ys[i], apart, 1e-5, 1e-5));
            else
              EXPECT_TRUE(at::equal(ys[i], apart)) << quant_activations_name(mode) << " " << ggml_type_name(types[i])
                                                   << " in group " << types.size() << " m " << m << " threads " << threads;
          }
        }
    }
  at::set_num_threads(saved);
  EXPECT_THROW(linear_many(random_x(1, in), std::vector<QuantWeight>{}, {}), wm::Error);
  EXPECT_THROW(linear_many(random_x(1, 64), {random_weight(GgmlType::Q8_0, 8, in)}, {at::Tensor()}), wm::Error);
}

// The team's two kinds of jobs interleaved on more threads than cores (threads start late, are
// descheduled mid-job, jobs run alone while one has not acknowledged the last): every product
// equals the one-thread product, quantized (units taken in turn) and float (a static split).
TEST(QuantGemv, TeamJobsOnMoreThreadsThanCores) {
  at::manual_seed(19);
  const QuantWeight w = random_weight(GgmlType::Q4_1, 520, 576);
  const at::Tensor wf = at::randn({300, 576});
  const at::Tensor x = random_x(3, 576), x20 = random_x(20, 576);
  const int saved = at::get_num_threads();
  at::set_num_threads(1);
  const at::Tensor ref = linear(x, w, at::Tensor()), ref20 = linear(x20, w, at::Tensor());
  const at::Tensor reff = linear(x, wf, at::Tensor());
  at::set_num_threads(5);
  int wrong = 0;
  for (int i = 0; i < 400; ++i) {
    wrong += !at::equal(linear(x, w, at::Tensor()), ref);
    wrong += !at::allclose(linear(x, wf, at::Tensor()), reff, 1e-5, 1e-5);
    if (i % 20 == 0) wrong += !at::equal(linear(x20, w, at::Tensor()), ref20);
  }
  at::set_num_threads(saved);
  EXPECT_EQ(wrong, 0);
}

// Quantized activations as llama.cpp's x86 code forms them: Q8_0/Q8_1's d is fp16(amax / 127)
// rounded to nearest even (subnormal halves and overflow to inf included), q = x * (127 / amax)
// rounded half to even, s = fp16(d32 * sum q); every path the same bits.
TEST(QuantGemv, Q8ActivationsRoundAsLlamaCpp) {
  const int64_t n = 64;
  at::manual_seed(15);
  // Block b: amax spread from 1e-9 to 1e7 (fp16 zero, subnormal, normal, inf for d).
  at::Tensor x = at::randn({n, 32}) * at::pow(10.0, at::linspace(-9, 7, n)).unsqueeze(1);
  x[3].zero_();
  // Ties: amax 127 makes x * 127 / amax = x; halves round to even.
  x[5] = at::tensor({127.f, 0.5f, 1.5f, 2.5f, -0.5f, -1.5f, -2.5f, 3.5f}).repeat({4});
  x = x.reshape({1, n * 32}).contiguous();
  std::vector<Quantized> all;
  for (const char* p : {"avx512", "avx2", "scalar"}) {
    const gemv::QuantFns f = fns_of(p);
    PathGuard g(parse_gemv_path(p));
    if (!f.defined() || std::string(quant_active_name()) != p) continue;
    all.push_back(quantize_acts(GgmlType::Q4_1, x, f));
  }
  ASSERT_FALSE(all.empty());
  const Quantized& r = all.back();
  const float* xs = x.data_ptr<float>();
  for (int64_t b = 0; b < n; ++b) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::abs(xs[b * 32 + j]));
    const float d = amax / 127.f, id = amax != 0 ? 127.f / amax : 0.f;
    int sum = 0;
    for (int j = 0; j < 32; ++j) {
      const int q = static_cast<int>(std::nearbyint(xs[b * 32 + j] * id));
      ASSERT_EQ(r.q[b * 32 + j], q) << "block " << b << " value " << j;
      sum += q;
    }
    EXPECT_EQ(half_bits(r.d[b]), half_bits(d)) << "block " << b << " amax " << amax;
    EXPECT_EQ(half_bits(r.s[b]), half_bits(d * static_cast<float>(sum))) << "block " << b;
  }
  EXPECT_EQ(r.q[5 * 32 + 1], 0);
  EXPECT_EQ(r.q[5 * 32 + 2], 2);
  EXPECT_EQ(r.q[5 * 32 + 3], 2);
  EXPECT_EQ(r.q[5 * 32 + 6], -2);
  EXPECT_EQ(r.d[3], 0.f);
  for (const Quantized& o : all) {
    EXPECT_EQ(o.q, r.q);
    for (int64_t b = 0; b < n; ++b) EXPECT_EQ(half_bits(o.d[b]), half_bits(r.d[b]));
    for (int64_t b = 0; b < n; ++b) EXPECT_EQ(half_bits(o.s[b]), half_bits(r.s[b]));
  }
}

// Q8_K (quantize_row_q8_K_ref): the scale from the first value of largest magnitude, which
// quantizes to -127 (d negative when it is positive), d = 1 / (-127 / max) in float32, sums of 16.
TEST(QuantGemv, Q8KActivationsAsLlamaCpp) {
  at::manual_seed(16);
  at::Tensor x = at::randn({1, 768});
  x[0][10] = 10.f;
  x[0][20] = -10.f;  // as large, later: the first one sets the sign
  x.narrow(1, 256, 256).zero_();
  x[0][600] = -12.f;
  const Quantized r = quantize_acts(GgmlType::Q4_K, x, gemv::quant_scalar());
  const float is0 = -127.f / 10.f, is2 = -127.f / -12.f;
  EXPECT_EQ(r.d[0], 1.f / is0);
  EXPECT_EQ(r.q[10], -127);
  EXPECT_EQ(r.q[20], 127);
  EXPECT_EQ(r.d[1], 0.f);
  EXPECT_EQ(r.d[2], 1.f / is2);
  EXPECT_EQ(r.q[600], -127);  // the largest value always quantizes to -127
  const float* xs = x.data_ptr<float>();
  for (int64_t i = 0; i < 768; ++i) {
    const float is = i < 256 ? is0 : (i < 512 ? 0.f : is2);
    ASSERT_EQ(r.q[i], i < 256 || i >= 512 ? std::min(127, static_cast<int>(std::nearbyint(is * xs[i]))) : 0) << i;
  }
  for (int64_t g = 0; g < 48; ++g) {
    int sum = 0;
    for (int j = 0; j < 16; ++j) sum += r.q[g * 16 + j];
    EXPECT_EQ(r.bsums[g], sum) << "group " << g;
  }
  for (const char* p : {"avx512", "avx2"}) {
    const gemv::QuantFns f = fns_of(p);
    PathGuard g(parse_gemv_path(p));
    if (!f.defined() || std::string(quant_active_name()) != p) continue;
    const Quantized o = quantize_acts(GgmlType::Q6_K, x, f);
    EXPECT_EQ(o.q, r.q);
    EXPECT_EQ(o.d, r.d);
    EXPECT_EQ(o.bsums, r.bsums);
  }
}

TEST(QuantGemv, BiasShapesAndDtypes) {
  at::manual_seed(17);
  const QuantWeight w = random_weight(GgmlType::Q4_1, 40, 96);
  const at::Tensor bias = at::randn({40});
  for (QuantActivations a : {QuantActivations::Q8, QuantActivations::Float}) {
    ActsGuard g(a);
    const at::Tensor x = random_x(12, 96).reshape({3, 4, 96});
    const at::Tensor y = linear(x, w, at::Tensor());
    ASSERT_EQ(y.sizes(), (at::IntArrayRef{3, 4, 40}));
    EXPECT_TRUE(at::allclose(linear(x, w, bias), y + bias, 1e-6, 1e-6));
    const at::Tensor yb = linear(x.to(at::kBFloat16), w, at::Tensor());
    EXPECT_EQ(yb.scalar_type(), at::kBFloat16);
    EXPECT_EQ(linear(at::empty({0, 96}), w, at::Tensor()).sizes(), (at::IntArrayRef{0, 40}));
  }
  EXPECT_TRUE(at::equal(w.dequantize(), dequantize_tensor(w.type, w.blocks.data_ptr(), w.bytes(), {40, 96})));
  EXPECT_EQ(w.bytes(), 40 * 3 * 20);
  EXPECT_EQ(w.dequantize(at::kHalf).scalar_type(), at::kHalf);
}

TEST(QuantGemv, RefusesBadSizes) {
  const at::Tensor ok = random_blocks(GgmlType::Q4_1, 4, 64);
  EXPECT_THROW(QuantWeight::from_blocks(GgmlType::Q4_1, 4, 48, ok), Error);          // not whole blocks
  EXPECT_THROW(QuantWeight::from_blocks(GgmlType::Q4_1, 4, 96, ok), Error);          // blocks too short
  EXPECT_THROW(QuantWeight::from_blocks(GgmlType::Q4_1, 5, 64, ok), Error);          // too few rows
  EXPECT_THROW(QuantWeight::from_blocks(GgmlType::Q4_1, 0, 64, ok.narrow(0, 0, 0)), Error);
  EXPECT_THROW(QuantWeight::from_blocks(GgmlType::Q4_1, 4, 64, ok.to(at::kChar)), Error);
  EXPECT_THROW(QuantWeight::from_blocks(GgmlType::Q4_1, 4, 64, ok.t().contiguous().t()), Error);
  EXPECT_THROW(QuantWeight::from_blocks(GgmlType::Q4_1, 2, 64, ok.reshape({2, 80})), Error);
  EXPECT_THROW(QuantWeight::from_blocks(GgmlType::Q4_K, 4, 384, random_blocks(GgmlType::Q4_K, 4, 256)), Error);
  EXPECT_THROW(QuantWeight::from_blocks(GgmlType::Q5_K, 4, 256, at::zeros({4, 176}, at::kByte)), Error);
  EXPECT_THROW(QuantWeight::from_blocks(GgmlType::F32, 4, 8, at::zeros({4, 32}, at::kByte)), Error);
  EXPECT_THROW(QuantWeight::from_blocks(GgmlType::Q4_1, 4, 64, at::Tensor()), Error);
  EXPECT_FALSE(quant_kernels_support(GgmlType::Q5_K));
  EXPECT_TRUE(quant_kernels_support(GgmlType::Q6_K));
  const QuantWeight w = QuantWeight::from_blocks(GgmlType::Q4_1, 4, 64, ok);
  EXPECT_THROW(linear(at::randn({2, 63}), w, at::Tensor()), Error);
  EXPECT_THROW(linear(at::randn({2, 64}), w, at::randn({5})), Error);
  EXPECT_THROW(linear(at::randint(0, 3, {2, 64}), w, at::Tensor()), Error);
  EXPECT_THROW(linear(at::randn({2, 64}), QuantWeight{}, at::Tensor()), Error);
  EXPECT_THROW(parse_quant_activations("int4"), Error);
  EXPECT_EQ(parse_quant_activations("float"), QuantActivations::Float);
}

// SmolLM2-135M-Instruct's own blocks (Q4_1 projections, the Q8_0 embedding as the tied head),
// wrapped where the file maps them, when tools/get_model.sh has fetched it.
TEST(QuantGemv, SmolLM2Rows) {
  namespace fs = std::filesystem;
  fs::path cache;
  if (const char* c = std::getenv("WM_MODEL_CACHE"); c && *c) cache = c;
  else if (const char* h = std::getenv("HOME"); h && *h) cache = fs::path(h) / ".cache/worldmem/models";
  const fs::path path = cache / "smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!fs::exists(path)) GTEST_SKIP() << path << " is absent: `bash tools/get_model.sh smollm2` fetches it";
  auto file = std::make_shared<const GgufFile>(GgufFile::open(path.string()));
  at::manual_seed(18);
  for (const char* name : {"blk.0.attn_q.weight", "blk.3.ffn_down.weight", "token_embd.weight"}) {
    QuantWeight w = QuantWeight::from_gguf(file, name);
    if (w.out > 2048) w = QuantWeight::from_blocks(w.type, 2048, w.in, w.blocks.narrow(0, 0, 2048));
    const at::Tensor deq = w.dequantize();
    const at::Tensor x = at::randn({3, w.in});
    const auto [exact, sum_abs] = reference(x, deq);
    at::Tensor yf, yq;
    {
      ActsGuard a(QuantActivations::Float);
      yf = linear(x, w, at::Tensor());
    }
    {
      ActsGuard a(QuantActivations::Q8);
      yq = linear(x, w, at::Tensor());
    }
    EXPECT_LT(worst(yf, exact, sum_abs), 1e-5) << name;
    EXPECT_LE(worst(yq, exact, q8_bound(w, x) + 1e-5 * sum_abs), 1.0) << name;
    const double rel = ((yq.to(at::kDouble) - exact).norm() / exact.norm()).item<double>();
    std::printf("%s %s [%ld, %ld]: 8-bit activations' relative error %.2e (RMS over RMS)\n", name,
                ggml_type_name(w.type).c_str(), static_cast<long>(w.out), static_cast<long>(w.in), rel);
  }
  EXPECT_THROW(QuantWeight::from_gguf(file, "output_norm.weight"), Error);  // F32, one dimension
  EXPECT_THROW(QuantWeight::from_gguf(file, "no.such.tensor"), Error);
}

}  // namespace wm::llm::quant_gemv_test
