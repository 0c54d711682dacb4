// wm_compare: full-reference fidelity between two images or two videos (frame by frame).
//   wm_compare a.png b.png
//   wm_compare rollout.mp4 ground_truth.mp4 --csv metrics.csv --lpips lpips_alex.safetensors
#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/error.h"
#include "tools/cli/cleanup.h"
#include "tools/cli/error_text.h"
#include "tools/cli/output_file.h"
#include "tools/media/metrics.h"
#include "tools/media/mp4_reader.h"
#include "tools/media/png.h"
#ifdef WM_HAVE_LPIPS
#include "tools/media/lpips.h"
#endif

// Each program's code is in a namespace of its own: wm_tools, the one binary of the programs,
// compiles several of them in one unit (tools/README.md, "Building").
namespace wm_tool_compare {

namespace {

struct Row {
  double mse, psnr, ssim;
  std::optional<double> lpips;
};

std::string fmt(double v, int prec) {
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", prec, v);
  return buf;
}

// Computes the metrics of one pair of frames.
class Scorer {
 public:
  explicit Scorer(const std::string& lpips_weights) {
    if (lpips_weights.empty()) return;
#ifdef WM_HAVE_LPIPS
    lpips_ = std::make_unique<wm::media::Lpips>(wm::media::Lpips::load(lpips_weights));
#else
    throw wm::Error("--lpips: this build of wm_compare has no LPIPS support (wm_lpips not built)");
#endif
  }
  bool has_lpips() const {
#ifdef WM_HAVE_LPIPS
    return lpips_ != nullptr;
#else
    return false;
#endif
  }
  Row score(const wm::Image& a, const wm::Image& b) const {
    Row r;
    r.mse = wm::media::mse(a, b);
    r.psnr = wm::media::psnr_from_mse(r.mse);
    r.ssim = wm::media::ssim(a, b);
#ifdef WM_HAVE_LPIPS
    if (lpips_) r.lpips = lpips_->distance(a, b);
#endif
    return r;
  }

 private:
#ifdef WM_HAVE_LPIPS
  std::unique_ptr<wm::media::Lpips> lpips_;
#endif
};

void print_header(bool lpips) {
  std::printf("%6s  %10s  %8s%s\n", "frame", "PSNR(dB)", "SSIM", lpips ? "     LPIPS" : "");
}

void print_row(const std::string& label, const Row& r) {
  std::printf("%6s  %10s  %8s", label.c_str(), fmt(r.psnr, 3).c_str(), fmt(r.ssim, 5).c_str());
  if (r.lpips) std::printf("  %8s", fmt(*r.lpips, 5).c_str());
  std::printf("\n");
}

void write_csv(wm::cli::OutputFile& file, const std::vector<Row>& rows, const Row& mean, bool lpips) {
  std::ofstream& out = file.stream();
  out << "frame,psnr_db,ssim,mse" << (lpips ? ",lpips" : "") << "\n";
  auto line = [&](const std::string& label, const Row& r) {
    out << label << "," << fmt(r.psnr, 6) << "," << fmt(r.ssim, 8) << "," << fmt(r.mse, 6);
    if (lpips) out << "," << (r.lpips ? fmt(*r.lpips, 8) : "");
    out << "\n";
  };
  for (size_t i = 0; i < rows.size(); ++i) line(std::to_string(i), rows[i]);
  line("mean", mean);
  file.commit();
}

std::string dims(const wm::Image& i) { return std::to_string(i.width) + "x" + std::to_string(i.height); }

std::vector<Row> compare_videos(const std::string& a_path, const std::string& b_path, const Scorer& scorer,
                                int64_t max_frames) {
  wm::media::VideoReader a(a_path), b(b_path);
  if (a.width() != b.width() || a.height() != b.height()) {
    throw wm::Error("frame sizes differ: " + a_path + " is " + std::to_string(a.width()) + "x" +
                    std::to_string(a.height()) + ", " + b_path + " is " + std::to_string(b.width()) + "x" +
                    std::to_string(b.height()));
  }
  if (max_frames < 0 && a.frame_count() >= 0 && b.frame_count() >= 0 && a.frame_count() != b.frame_count()) {
    throw wm::Error("frame counts differ: " + a_path + " has " + std::to_string(a.frame_count()) + ", " +
                    b_path + " has " + std::to_string(b.frame_count()) + " (use --frames N to compare the first N)");
  }
  if (a.fps_num() * int64_t(b.fps_den()) != b.fps_num() * int64_t(a.fps_den())) {
    std::fprintf(stderr, "warning: frame rates differ (%g vs %g fps); comparing frame by frame\n", a.fps(), b.fps());
  }
  std::vector<Row> rows;
  wm::Image fa, fb;
  print_header(scorer.has_lpips());
  while (max_frames < 0 || static_cast<int64_t>(rows.size()) < max_frames) {
    const bool ha = a.read(&fa), hb = b.read(&fb);
    if (!ha && !hb) break;
    if (ha != hb) {
      const std::string& shorter = ha ? b_path : a_path;
      throw wm::Error("frame counts differ: " + shorter + " ends after " + std::to_string(rows.size()) +
                      " frames, the other video has more (use --frames N to compare the first N)");
    }
    if (fa.width != fb.width || fa.height != fb.height) {
      throw wm::Error("frame " + std::to_string(rows.size()) + " sizes differ: " + dims(fa) + " vs " + dims(fb));
    }
    rows.push_back(scorer.score(fa, fb));
    print_row(std::to_string(rows.size() - 1), rows.back());
  }
  if (rows.empty()) throw wm::Error("no frames to compare in " + a_path + " and " + b_path);
  return rows;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "wm_compare: PSNR and SSIM (and LPIPS with user-supplied weights) between two images, or two\n"
      "videos frame by frame. PSNR: data range 255, MSE over all channels, 'inf' for identical\n"
      "frames. SSIM: Gaussian window 11 (sigma 1.5), K1 0.01, K2 0.03, per RGB channel, as\n"
      "scikit-image's structural_similarity(gaussian_weights=True, use_sample_covariance=False)."};
  std::string a_path, b_path, lpips_path, csv_path;
  int64_t max_frames = -1;
  app.add_option("A", a_path, "first image (.png .jpg ...) or video (.mp4 ...)")->required()->check(CLI::ExistingFile);
  app.add_option("B", b_path, "second image or video, same size (and frame count)")->required()->check(CLI::ExistingFile);
  app.add_option("--lpips", lpips_path,
                 "LPIPS AlexNet weights as one safetensors file (names: net.slice1.0.weight ... "
                 "lin4.model.1.weight); without it LPIPS is skipped")
      ->check(CLI::ExistingFile);
  app.add_option("--csv", csv_path, "also write per-frame values and the mean to this CSV file");
  app.add_option("--frames", max_frames, "compare only the first N frames of two videos")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  wm::cli::remove_temporaries_on_signal();

  try {
    std::unique_ptr<wm::cli::OutputFile> csv;  // opened first: a bad path fails before the work
    if (!csv_path.empty()) {
      try {
        csv = std::make_unique<wm::cli::OutputFile>(csv_path);
      } catch (const wm::Error& e) {
        throw wm::Error(std::string("--csv: ") + e.what());
      }
    }
    Scorer scorer(lpips_path);
    if (!scorer.has_lpips()) std::printf("LPIPS: skipped (no --lpips WEIGHTS.safetensors given)\n");
    const bool a_img = wm::media::is_image_path(a_path), b_img = wm::media::is_image_path(b_path);
    if (a_img != b_img) {
      throw wm::Error("cannot compare an image with a video: " + a_path + " is " + (a_img ? "an image" : "a video") +
                      ", " + b_path + " is " + (b_img ? "an image" : "a video"));
    }
    std::vector<Row> rows;
    if (a_img) {
      wm::Image a = wm::media::read_image(a_path), b = wm::media::read_image(b_path);
      if (a.width != b.width || a.height != b.height) {
        throw wm::Error("image sizes differ: " + a_path + " is " + dims(a) + ", " + b_path + " is " + dims(b));
      }
      rows.push_back(scorer.score(a, b));
    } else {
      rows = compare_videos(a_path, b_path, scorer, max_frames);
    }
    // Mean of the per-frame values; PSNR is also given from the mean MSE, which stays finite
    // when some (not all) frames are identical.
    Row mean{0, 0, 0, std::nullopt};
    double lp = 0;
    for (const Row& r : rows) {
      mean.mse += r.mse;
      mean.psnr += r.psnr;
      mean.ssim += r.ssim;
      if (r.lpips) lp += *r.lpips;
    }
    const double n = static_cast<double>(rows.size());
    mean.mse /= n;
    mean.psnr /= n;
    mean.ssim /= n;
    if (scorer.has_lpips()) mean.lpips = lp / n;
    if (a_img) {
      std::printf("PSNR: %s dB\nSSIM: %s\n", fmt(mean.psnr, 3).c_str(), fmt(mean.ssim, 5).c_str());
      if (mean.lpips) std::printf("LPIPS: %s\n", fmt(*mean.lpips, 5).c_str());
    } else {
      print_row("mean", mean);
      std::printf("frames: %zu; PSNR of the mean MSE: %s dB\n", rows.size(),
                  fmt(wm::media::psnr_from_mse(mean.mse), 3).c_str());
    }
    if (csv) write_csv(*csv, rows, mean, scorer.has_lpips());
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "wm_compare: error: %s\n", wm::cli::error_text(e).c_str());
    return 1;
  }
  return 0;
}

}  // namespace wm_tool_compare
