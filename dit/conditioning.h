#pragma once
// Per-frame camera and action conditioning of the DiT, and the per-token camera-ray features.
//
// Pose per frame: [x, y, yaw_deg] in the world's convention (x east, y south, in cells; yaw in
// degrees, 0 facing +x, +90 facing +y: positive yaw turns right). The ray through patch column j
// of a grid_w-wide frame has world yaw
//   yaw + atan((2 (j + 0.5) / grid_w - 1) * tan(hfov / 2))
// (the raycaster's camera plane points to the right of the heading, so columns to the right
// look at larger yaw).
// Features (float64 inside, returned as float32):
//   position: (sin, cos)(2^k * pi * p / pos_scale) for p in {x, y}, k = 0..pos_bands-1
//   yaw:      (sin, cos)(m * yaw) for m = 1..yaw_harmonics
#include <ATen/ATen.h>

#include "dit/config.h"

namespace wm::dit {

// The conditioning of F frames (or B x F). Undefined tensors mean zeros.
struct FrameCond {
  at::Tensor pose;    // [F, 3] or [B, F, 3] float: x, y, yaw_deg
  at::Tensor action;  // [F, action_dim] or [B, F, action_dim] float
  at::Tensor reference;  // [F, C + 1, h, w] or [B, F, C + 1, h, w] float (CondConfig::warp_reference):
                         // per frame, the last clean frame before its chunk turned to the frame's
                         // yaw (warp_reference), then the coverage mask; undefined means zeros (no
                         // reference: context chunks, the refill pass)

  // The frames [begin, begin + n) of every batch entry (a view; undefined stays undefined).
  FrameCond slice(int64_t begin, int64_t n) const;
};

// Number of features per frame (pose) or per patch column (ray): 4 * pos_bands + 2 * yaw_harmonics.
int64_t n_camera_features(const CondConfig& c);

// pose [B, F, 3] -> camera features [B, F, n_camera_features] float32 (on pose's device).
at::Tensor pose_features(const at::Tensor& pose, const CondConfig& c);

// pose [B, F, 3] -> ray features [B, F, grid_w, n_camera_features] float32: the camera's position
// features and the yaw features of the ray through each patch column.
at::Tensor ray_features(const at::Tensor& pose, const CondConfig& c, int64_t grid_w);

// World yaw (degrees) of every token's ray: pose [B, F, 3] -> [B, F * grid_h * grid_w] float64,
// tokens row-major per frame.
at::Tensor token_ray_yaw_deg(const at::Tensor& pose, const CondConfig& c, int64_t grid_h, int64_t grid_w);

// Rotates channel pairs [first, first + 2 * pairs) of x [B, H, n, d] (interleaved pairs) by
// m * yaw (m = 1..pairs) for yaw_deg [B, n]: the dot product of two tokens' rotated vectors
// then depends on the difference of their world yaws. Returns a new tensor of x's dtype.
at::Tensor apply_yaw_rope(const at::Tensor& x, const at::Tensor& yaw_deg, int64_t first, int64_t pairs);

// World yaw (degrees) of the ray through each patch column, [grid_w] float64, relative to the
// camera's yaw: atan((2 (j + 0.5) / grid_w - 1) * tan(hfov / 2)).
at::Tensor column_yaw_offsets_deg(const CondConfig& c, int64_t grid_w);

// The reference frames of CondConfig::warp_reference: the latent frame src [C, h, w] seen at yaw
// src_yaw_deg, turned to each target yaw yaw_deg [F] as a pure rotation of the camera (the
// raycaster's columns are evenly spaced in tan(ray angle), its rows do not depend on yaw).
// Target column j looks at src_yaw + delta + offset_j (column_yaw_offsets_deg over the latent
// width, delta = target yaw - src_yaw), which source column u = w / 2 * (1 + tan(delta + offset_j)
// / tan(hfov / 2)) - 0.5 sees; its values are interpolated linearly between the two nearest source
// columns. Columns whose ray the source does not see (u outside [-0.5, w - 0.5], or facing away)
// are zero with mask 0. Returns [F, C + 1, h, w] float32 on src's device: the warped latents,
// then the mask (1 where covered). Translation is not modelled: the model learns it.
at::Tensor warp_reference(const at::Tensor& src, double src_yaw_deg, const at::Tensor& yaw_deg, const CondConfig& c);

}  // namespace wm::dit
