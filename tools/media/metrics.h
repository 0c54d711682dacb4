#pragma once
// Full-reference fidelity metrics between two RGB8 images of the same size.
#include "dit/image.h"
#include "runtime/error.h"

namespace wm::media {

// Mean squared error over every pixel and channel, in [0, 255^2]. Throws wm::Error when the
// sizes differ (expected vs got) or an image is empty.
double mse(const wm::Image& a, const wm::Image& b);

// Peak signal-to-noise ratio in dB, data range 255: 10 log10(255^2 / MSE), MSE averaged over
// all channels. Identical images (MSE 0) give +infinity (std::numeric_limits<double>::infinity()).
// Throws wm::Error when the sizes differ.
double psnr(const wm::Image& a, const wm::Image& b);

// PSNR of a given MSE (data range 255); +infinity when mse == 0.
double psnr_from_mse(double mse);

// The cap on PSNR where the programs average it (wm_revisit_bench, wm_train's evaluation):
// identical frames give +infinity, which would swamp every mean.
inline constexpr double kPsnrCap = 60.0;

// min(kPsnrCap, psnr(a, b)). Throws wm::Error when the sizes differ.
double capped_psnr(const wm::Image& a, const wm::Image& b);

// Structural similarity (Wang et al. 2004) as scikit-image computes it with
// structural_similarity(a, b, gaussian_weights=True, sigma=1.5, use_sample_covariance=False,
// data_range=255, channel_axis=-1): Gaussian window sigma 1.5 truncated at 3.5 sigma (11 taps),
// K1 0.01, K2 0.03, local statistics in float64, the SSIM map averaged per channel over the
// pixels at least 5 from every border (skimage crops that border, so only windows lying wholly
// inside the image count and no padding rule is ever used), then the mean of the R, G, B values.
// Result in [-1, 1]; identical images give exactly 1. Throws wm::Error when the sizes differ or
// a side is shorter than 11 pixels (skimage refuses those too).
double ssim(const wm::Image& a, const wm::Image& b);

}  // namespace wm::media
