#pragma once
// Few-step flow-matching sampling: a schedule (a small strategy) plus a free step function that
// takes a denoise callback, then the refill pass that turns the clean chunk into its K/V.
//
// Convention (rectified flow, as Wan / Self-Forcing): x_t = (1 - t) * x0 + t * noise with
// t in [0, 1] (1 = pure noise), and the model predicts the velocity v = noise - x0, so
// x0 = x_t - t * v and an Euler step from t to t_next is x <- x + (t_next - t) * v.
#include <ATen/ATen.h>

#include <functional>
#include <vector>

#include "dit/conditioning.h"
#include "dit/model.h"
#include "runtime/block.h"
#include "runtime/window.h"

namespace wm::dit {

// How each step takes x from t to t_next, given the model's velocity v at (x, t).
enum class SamplingMethod {
  Euler,    // the ODE step x <- x + (t_next - t) * v; deterministic
  Renoise,  // Self-Forcing / CausVid: predict x0 = x - t * v, then x <- (1 - t_next) * x0 +
            // t_next * fresh noise (the last step, to t = 0, lands on x0); draws noise
};

struct SamplerConfig {
  // The schedule (flow_schedule): the steps start at these times, shifted, and end at 0.
  std::vector<double> timesteps{1.0, 0.75, 0.5, 0.25};  // descending in (0, 1]; the last step goes to 0
  double shift = 1.0;    // t -> shift * t / (1 + (shift - 1) * t) (Wan / SD3 shift; 1 = none)
  SamplingMethod method = SamplingMethod::Euler;
  bool refill = true;    // run the t = 0 pass on the clean chunk and return its K/V
  double context_t = 0;  // > 0: the refill pass sees the chunk re-noised to this t (labelled so),
                         // as the trainer's context-noise augmentation does, so that later chunks
                         // do not take the model's own small errors for clean ground truth
};

// A sampler of n evenly spaced steps: t = 1, 1 - 1/n, ..., 1/n (the rest as default). Throws
// wm::Error if n < 1.
SamplerConfig sampler_with_steps(int n);

// The shifted schedule t_0 > t_1 > ... > t_{N-1} > t_N = 0 (N + 1 values). Throws wm::Error on
// an empty, non-descending or out-of-range list.
std::vector<double> flow_schedule(const SamplerConfig& cfg);

// v = denoise(x_t, t): the model's velocity at x_t [..] and time t.
using Denoiser = std::function<at::Tensor(const at::Tensor& x_t, double t)>;

// One step from t to t_next given the velocity v at (x, t): Euler, or (SamplingMethod::Renoise)
// the x0 prediction re-noised with `noise` (same shape as x) when it is given. Returns x at t_next.
at::Tensor flow_step(const at::Tensor& x, const at::Tensor& v, double t, double t_next,
                     const at::Tensor& noise = at::Tensor());

// Runs the whole schedule from x = noise at schedule[0] by cfg.method; returns x at t = 0. gen
// draws the re-noising noise (Renoise only: without gen it throws wm::Error).
at::Tensor sample_flow(const at::Tensor& noise, const SamplerConfig& cfg, const Denoiser& denoise,
                       at::Generator* gen = nullptr);

// Training pair of the convention above: x_t = (1 - t) * x0 + t * noise and the velocity target
// v = noise - x0, for x0 and noise [..., T, C, h, w] and per-frame t [..., T] (or a scalar).
struct FlowPair {
  at::Tensor x_t, v;
};
FlowPair make_flow_pair(const at::Tensor& x0, const at::Tensor& t, const at::Tensor& noise);

// Standard normal noise of `shape` drawn on the CPU from gen (the same numbers on every device),
// then moved to `device`, float32.
at::Tensor seeded_noise(at::IntArrayRef shape, at::Generator& gen, at::Device device);

struct ChunkResult {
  at::Tensor latents;        // [F, C, h, w] float32, clean (t = 0)
  std::vector<LayerKv> kv;   // per layer K (rotated) / V [n_heads, F * tokens_per_frame, head_dim],
                             // positions, log-weights; empty if refill is off
};

// Generates one chunk of frames_per_chunk frames at absolute frame first_frame: noise from gen,
// the sampler's steps through model.forward_chunk with the window as context, then (refill) the
// t = 0 pass on the clean latents returning its per-layer K/V for the caller to place in the
// window. cond holds the chunk's frames ([F, 3] pose, [F, A] action, and for a warp_reference
// model the reference, which the refill pass goes without). Runs without autograd.
ChunkResult generate_chunk(CausalDit& model, KvWindow* window, const FrameCond& cond, int64_t first_frame,
                           const SamplerConfig& cfg, at::Generator& gen);

}  // namespace wm::dit
