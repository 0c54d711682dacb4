#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "runtime/error.h"
#include "runtime/onednn.h"

namespace wm {
namespace onednn_test {

#define WM_NEED_NATIVE_BF16() \
  if (!onednn::native_bf16()) GTEST_SKIP() << "no oneDNN in this build or no bfloat16 units on this CPU"

// The largest |x - y| over the largest |y|.
double rel_diff(const at::Tensor& x, const at::Tensor& y) {
  const at::Tensor yd = y.to(at::kDouble);
  return (x.to(at::kDouble) - yd).abs().max().item<double>() / yd.abs().max().item<double>();
}

// Products of bfloat16 values are exact in float32 and summed in float32: the float32 result is
// the float64 one within float32 rounding over K terms; a bfloat16 result is it rounded. The
// operands are views as the attention passes them: a slice of a head's rows (a batch that is
// not dense), a transposed key matrix read in place, an offset slice of the keys.
TEST(OneDnn, ProductsOfSlicesAndTransposedViewsEqualFloat64) {
  WM_NEED_NATIVE_BF16();
  at::manual_seed(31);
  const at::Tensor q = at::randn({3, 50, 96}).to(at::kBFloat16), k = at::randn({3, 70, 96}).to(at::kBFloat16);
  const at::Tensor a = q.narrow(1, 7, 37);                        // [3, 37, 96], batch stride 50 * 96
  const at::Tensor b = k.narrow(1, 5, 61).transpose(1, 2);         // [3, 96, 61], unit stride in rows
  const at::Tensor ref = at::matmul(a.to(at::kDouble), b.to(at::kDouble)) * 0.125;
  at::Tensor c32 = at::full({3, 37, 61}, std::numeric_limits<float>::quiet_NaN());
  onednn::bmm_into(a, b, c32, 0.125f);
  EXPECT_LT(rel_diff(c32, ref), 1e-6);
  at::Tensor c16 = at::empty({3, 37, 61}, at::kBFloat16);
  onednn::bmm_into(a, b, c16, 0.125f);
  // One bfloat16 rounding of each element: within 2^-8 of its own magnitude.
  const at::Tensor err = (c16.to(at::kDouble) - ref).abs(), allowed = ref.abs() * std::ldexp(1.0, -8) + 1e-6;
  EXPECT_TRUE(err.le(allowed).all().item<bool>()) << "worst " << (err - allowed).max().item<double>();
  // Without a scale, and with a second operand that is plain [n, K, N].
  const at::Tensor v = at::randn({3, 61, 40}).to(at::kBFloat16);
  at::Tensor o = at::empty({3, 37, 40});
  onednn::bmm_into(c16, v, o);
  EXPECT_LT(rel_diff(o, at::matmul(c16.to(at::kDouble), v.to(at::kDouble))), 1e-6);
}

// softmax_into is the float32 softmax rounded once to bfloat16 (to nearest: within 2^-8 of each
// probability), -inf entries give 0.
TEST(OneDnn, SoftmaxIsTheFloatSoftmaxRounded) {
  WM_NEED_NATIVE_BF16();
  at::manual_seed(32);
  at::Tensor s = at::randn({2, 9, 300}) * 6;
  s.masked_fill_(at::rand(s.sizes()).lt(0.2), -std::numeric_limits<double>::infinity());
  s.select(2, 0).fill_(1.0);
  const at::Tensor ref = at::softmax(s.to(at::kDouble), -1), hidden = s.isinf();
  at::Tensor p = at::empty(s.sizes(), at::kBFloat16);
  onednn::softmax_into(s, p);
  EXPECT_LT(rel_diff(s, ref), 1e-6);  // s holds the float32 softmax
  const at::Tensor err = (p.to(at::kDouble) - ref).abs(), allowed = ref * std::ldexp(1.0, -8) + 1e-7;
  EXPECT_TRUE(err.le(allowed).all().item<bool>()) << "worst " << (err - allowed).max().item<double>();
  EXPECT_TRUE(p.masked_select(hidden).eq(0).all().item<bool>());
}

TEST(OneDnn, RefusesWhatItCannotMultiply) {
  WM_NEED_NATIVE_BF16();
  const at::Tensor a = at::ones({2, 4, 8}, at::kBFloat16), b = at::ones({2, 8, 5}, at::kBFloat16);
  at::Tensor c = at::empty({2, 4, 5});
  EXPECT_THROW(onednn::bmm_into(a.to(at::kFloat), b, c), Error);                       // not bfloat16
  EXPECT_THROW(onednn::bmm_into(a, b.narrow(1, 0, 7), c), Error);                      // K differs
  EXPECT_THROW(onednn::bmm_into(a, b, at::empty({2, 5, 4}).transpose(1, 2)), Error);   // c strided
  EXPECT_THROW(onednn::bmm_into(a, b, at::empty({2, 4, 5}, at::kDouble)), Error);      // c's dtype
  EXPECT_THROW(onednn::bmm_into(a.unsqueeze(0), b.unsqueeze(0), c.unsqueeze(0)), Error);  // rank
  EXPECT_THROW(onednn::softmax_into(c, at::empty({2, 4, 6}, at::kBFloat16)), Error);   // shapes
  // A matrix with no unit stride (every other element) is copied, not refused.
  const at::Tensor wide = at::randn({2, 4, 16}).to(at::kBFloat16), sparse = wide.slice(2, 0, 16, 2);
  at::Tensor d = at::empty({2, 4, 5});
  onednn::bmm_into(sparse, b, d);
  EXPECT_TRUE(at::allclose(d, at::matmul(sparse.to(at::kFloat), b.to(at::kFloat)), 1e-5, 1e-5));
  EXPECT_THROW(onednn::softmax_into(a, at::empty({2, 4, 8}, at::kBFloat16)), Error);   // s not float32
  EXPECT_NO_THROW(onednn::bmm_into(a, b, c));
  EXPECT_TRUE(c.eq(8).all().item<bool>());
}

}  // namespace onednn_test
}  // namespace wm
