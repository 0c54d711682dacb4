// PSNR and SSIM against values computed independently in float64 by reference_metrics.py.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "tools/media/metrics.h"

namespace {

using wm::Image;

// The byte source reference_metrics.py uses: s = (s * 1103515245 + 12345) mod 2^31.
struct Lcg {
  uint64_t s;
  int next_byte() {
    s = (s * 1103515245ull + 12345ull) & 0x7FFFFFFFull;
    return static_cast<int>((s >> 16) & 0xFF);
  }
};

void set(Image& img, int x, int y, int c, int v) { img.pixel(x, y)[c] = static_cast<uint8_t>(v); }
int get(const Image& img, int x, int y, int c) { return img.pixel(x, y)[c]; }

// Mirrors make_case() in reference_metrics.py (same loop order: y, x, c).
std::pair<Image, Image> make_case(const std::string& name) {
  if (name == "gradient_noise") {
    Image a(16, 16), b(16, 16);
    Lcg g{1};
    for (int y = 0; y < 16; ++y)
      for (int x = 0; x < 16; ++x)
        for (int c = 0; c < 3; ++c) set(a, x, y, c, (8 * x + 5 * y + 60 * c) % 256);
    for (int y = 0; y < 16; ++y)
      for (int x = 0; x < 16; ++x)
        for (int c = 0; c < 3; ++c)
          set(b, x, y, c, std::min(255, std::max(0, get(a, x, y, c) + g.next_byte() % 41 - 20)));
    return {a, b};
  }
  if (name == "random_pair") {
    Image a(23, 17), b(23, 17);
    Lcg g1{7}, g2{11};
    for (int y = 0; y < 17; ++y)
      for (int x = 0; x < 23; ++x)
        for (int c = 0; c < 3; ++c) set(a, x, y, c, g1.next_byte());
    for (int y = 0; y < 17; ++y)
      for (int x = 0; x < 23; ++x)
        for (int c = 0; c < 3; ++c) set(b, x, y, c, g2.next_byte());
    return {a, b};
  }
  if (name == "contrast") {
    Image a(32, 24), b(32, 24);
    for (int y = 0; y < 24; ++y)
      for (int x = 0; x < 32; ++x)
        for (int c = 0; c < 3; ++c) {
          const int v = ((x / 4 + y / 4) % 2 ? 200 : 40) + 10 * c;
          set(a, x, y, c, v);
          set(b, x, y, c, (v + 128) / 2);
        }
    return {a, b};
  }
  if (name == "shift") {
    Image a(20, 20), b(20, 20);
    Lcg g{3};
    for (int y = 0; y < 20; ++y)
      for (int x = 0; x < 20; ++x)
        for (int c = 0; c < 3; ++c) set(a, x, y, c, (g.next_byte() + 4 * x + 2 * y) % 256);
    for (int y = 0; y < 20; ++y)
      for (int x = 0; x < 20; ++x)
        for (int c = 0; c < 3; ++c) set(b, x, y, c, get(a, (x + 1) % 20, y, c));
    return {a, b};
  }
  throw std::runtime_error("unknown case " + name);
}

struct Reference {
  const char* name;
  double psnr;
  double ssim;
};

// Output of `python3 tests/media/reference_metrics.py` (pure float64 Python). Cross-checked once
// against scikit-image 0.19.3 (Debian python3-skimage): PSNR identical, SSIM within 1.2e-15.
const Reference kReference[] = {
    {"gradient_noise", 26.842193545159358, 0.81579124661312685},
    {"random_pair", 7.7102101062458424, -0.024391705814284192},
    {"contrast", 16.04191324272287, 0.79896995824183437},
    {"shift", 7.6126146661072491, -0.034518763338925486},
};

// Both sides compute in float64 with different summation orders: agreement to ~1e-15 is
// expected; the tolerance leaves room for that, nothing more.
constexpr double kPsnrRelTol = 1e-12;
constexpr double kSsimAbsTol = 1e-10;

Image random_image(int w, int h, uint64_t seed) {
  Image img(w, h);
  Lcg g{seed};
  for (auto& v : img.rgb) v = static_cast<uint8_t>(g.next_byte());
  return img;
}

}  // namespace

TEST(Metrics, PsnrMatchesReference) {
  for (const Reference& r : kReference) {
    auto [a, b] = make_case(r.name);
    EXPECT_NEAR(wm::media::psnr(a, b), r.psnr, kPsnrRelTol * r.psnr) << r.name;
  }
}

TEST(Metrics, SsimMatchesReference) {
  for (const Reference& r : kReference) {
    auto [a, b] = make_case(r.name);
    EXPECT_NEAR(wm::media::ssim(a, b), r.ssim, kSsimAbsTol) << r.name;
  }
}

TEST(Metrics, SymmetricInArguments) {
  for (const Reference& r : kReference) {
    auto [a, b] = make_case(r.name);
    EXPECT_DOUBLE_EQ(wm::media::psnr(a, b), wm::media::psnr(b, a)) << r.name;
    EXPECT_NEAR(wm::media::ssim(a, b), wm::media::ssim(b, a), 1e-12) << r.name;
  }
}

TEST(Metrics, IdenticalImagesGiveInfinityAndOne) {
  Image a = random_image(64, 48, 5);
  EXPECT_EQ(wm::media::psnr(a, a), std::numeric_limits<double>::infinity());
  EXPECT_EQ(wm::media::mse(a, a), 0.0);
  EXPECT_EQ(wm::media::ssim(a, a), 1.0);  // exactly: numerator and denominator are bitwise equal
}

// The programs' means use capped_psnr: identical frames count kPsnrCap (60 dB), others their PSNR.
TEST(Metrics, CappedPsnrCapsOnlyAboveTheCap) {
  EXPECT_EQ(wm::media::kPsnrCap, 60.0);
  Image a = random_image(64, 48, 5), b = random_image(64, 48, 6);
  EXPECT_EQ(wm::media::capped_psnr(a, a), wm::media::kPsnrCap);
  EXPECT_EQ(wm::media::capped_psnr(a, b), wm::media::psnr(a, b));
  EXPECT_THROW(wm::media::capped_psnr(a, random_image(32, 48, 7)), wm::Error);
}

TEST(Metrics, UniformOffsetGivesKnownPsnr) {
  for (int d : {1, 3, 10, 50}) {
    Image a(40, 30), b(40, 30);
    for (size_t i = 0; i < a.rgb.size(); ++i) {
      a.rgb[i] = static_cast<uint8_t>(100 + (i % 7));
      b.rgb[i] = static_cast<uint8_t>(a.rgb[i] + d);
    }
    const double expected = 10.0 * std::log10(255.0 * 255.0 / (double(d) * d));
    EXPECT_NEAR(wm::media::psnr(a, b), expected, 1e-12) << "offset " << d;
    EXPECT_DOUBLE_EQ(wm::media::mse(a, b), double(d) * d);
  }
}

TEST(Metrics, RejectsMismatchedAndTinyImages) {
  Image a(16, 16), b(16, 17), tiny(10, 20);
  try {
    wm::media::psnr(a, b);
    FAIL() << "no throw";
  } catch (const wm::Error& e) {
    EXPECT_NE(std::string(e.what()).find("16x16 vs 16x17"), std::string::npos) << e.what();
  }
  EXPECT_THROW(wm::media::ssim(a, b), wm::Error);
  try {
    wm::media::ssim(tiny, tiny);
    FAIL() << "no throw";
  } catch (const wm::Error& e) {
    EXPECT_NE(std::string(e.what()).find("11x11"), std::string::npos) << e.what();
  }
  EXPECT_THROW(wm::media::psnr(Image(), Image()), wm::Error);
}

TEST(Metrics, LargeImagesIndependentNoiseNearZeroIdentityOne) {
  Image a = random_image(512, 512, 1), b = random_image(512, 512, 2);
  EXPECT_LT(std::abs(wm::media::ssim(a, b)), 0.05);  // independent noise
  EXPECT_NEAR(wm::media::ssim(a, a), 1.0, 1e-9);
}
