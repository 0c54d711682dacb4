#include "tools/media/metrics.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

namespace wm::media {

namespace {

void check_pair(const char* fn, const wm::Image& a, const wm::Image& b) {
  auto dims = [](const wm::Image& i) { return std::to_string(i.width) + "x" + std::to_string(i.height); };
  if (a.empty() || b.empty()) throw wm::Error(std::string(fn) + ": empty image");
  if (a.width != b.width || a.height != b.height) {
    throw wm::Error(std::string(fn) + ": image sizes differ: " + dims(a) + " vs " + dims(b));
  }
  const size_t n = static_cast<size_t>(a.width) * a.height * 3;
  if (a.rgb.size() != n || b.rgb.size() != n) {
    throw wm::Error(std::string(fn) + ": pixel buffer does not match " + dims(a) + "x3");
  }
}

constexpr int kRadius = 5;  // int(3.5 * 1.5 + 0.5): scipy's truncate=3.5 at sigma 1.5
constexpr int kWin = 2 * kRadius + 1;

// Normalised 1-D Gaussian, sigma 1.5, 11 taps (scipy.ndimage.gaussian_filter's kernel).
std::array<double, kWin> gaussian_taps() {
  std::array<double, kWin> w{};
  double sum = 0;
  for (int i = -kRadius; i <= kRadius; ++i) {
    w[i + kRadius] = std::exp(-0.5 * i * i / (1.5 * 1.5));
    sum += w[i + kRadius];
  }
  for (double& v : w) v /= sum;
  return w;
}

}  // namespace

double mse(const wm::Image& a, const wm::Image& b) {
  check_pair("mse", a, b);
  const size_t n = a.rgb.size();
  uint64_t acc = 0;  // exact: at most 65025 * n
  for (size_t i = 0; i < n; ++i) {
    const int d = static_cast<int>(a.rgb[i]) - static_cast<int>(b.rgb[i]);
    acc += static_cast<uint64_t>(d * d);
  }
  return static_cast<double>(acc) / static_cast<double>(n);
}

double psnr_from_mse(double m) {
  if (m <= 0) return std::numeric_limits<double>::infinity();
  return 10.0 * std::log10(255.0 * 255.0 / m);
}

double psnr(const wm::Image& a, const wm::Image& b) { return psnr_from_mse(mse(a, b)); }

double capped_psnr(const wm::Image& a, const wm::Image& b) { return std::min(kPsnrCap, psnr(a, b)); }

double ssim(const wm::Image& a, const wm::Image& b) {
  check_pair("ssim", a, b);
  const int W = a.width, H = a.height;
  if (W < kWin || H < kWin) {
    throw wm::Error("ssim: image " + std::to_string(W) + "x" + std::to_string(H) +
                    " is smaller than the 11x11 window");
  }
  static const std::array<double, kWin> g = gaussian_taps();
  const double C1 = (0.01 * 255) * (0.01 * 255);
  const double C2 = (0.03 * 255) * (0.03 * 255);
  const int OW = W - 2 * kRadius, OH = H - 2 * kRadius;  // pixels whose window is inside

  // Horizontal pass for all rows, valid columns only: five moments per pixel, interleaved.
  std::vector<double> horiz(static_cast<size_t>(H) * OW * 5);
  std::vector<double> xa(W), xb(W);
  double total = 0;
  for (int c = 0; c < 3; ++c) {
    for (int y = 0; y < H; ++y) {
      const uint8_t* pa = a.pixel(0, y) + c;
      const uint8_t* pb = b.pixel(0, y) + c;
      for (int x = 0; x < W; ++x) {
        xa[x] = pa[3 * x];
        xb[x] = pb[3 * x];
      }
      double* out = horiz.data() + static_cast<size_t>(y) * OW * 5;
      for (int x = 0; x < OW; ++x) {
        double sa = 0, sb = 0, saa = 0, sbb = 0, sab = 0;
        for (int k = 0; k < kWin; ++k) {
          const double u = xa[x + k], v = xb[x + k], w = g[k];
          sa += w * u;
          sb += w * v;
          saa += w * u * u;
          sbb += w * v * v;
          sab += w * u * v;
        }
        double* o = out + 5 * x;
        o[0] = sa, o[1] = sb, o[2] = saa, o[3] = sbb, o[4] = sab;
      }
    }
    // Vertical pass on valid rows, then the SSIM map, summed.
    double channel_sum = 0;
    std::vector<double> acc(static_cast<size_t>(OW) * 5);
    for (int y = 0; y < OH; ++y) {
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int k = 0; k < kWin; ++k) {
        const double w = g[k];
        const double* row = horiz.data() + static_cast<size_t>(y + k) * OW * 5;
        for (int i = 0; i < OW * 5; ++i) acc[i] += w * row[i];
      }
      for (int x = 0; x < OW; ++x) {
        const double* m = acc.data() + 5 * x;
        const double ux = m[0], uy = m[1];
        const double vx = m[2] - ux * ux, vy = m[3] - uy * uy, vxy = m[4] - ux * uy;
        const double num = (2 * ux * uy + C1) * (2 * vxy + C2);
        const double den = (ux * ux + uy * uy + C1) * (vx + vy + C2);
        channel_sum += num / den;
      }
    }
    total += channel_sum / (static_cast<double>(OW) * OH);
  }
  return total / 3.0;
}

}  // namespace wm::media
