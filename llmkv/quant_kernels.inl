// The quantized-weight kernels' body (quant_kernels.h), shared by the ISA files after
// decode_kernels.inl, inside their anonymous namespace. Besides the float traits V of
// decode_kernels.inl, each ISA defines an integer traits struct I:
//   bytes (32 bytes), lanes (8 int32), acc (8 float32)
//   load(p): 32 bytes; nibbles(p): the 16 bytes at p as 32 values 0..15, low nibbles first;
//   nibbles_hi(p): the same with the high nibbles kHi (1 or 16) times their value; lo4(b),
//   hi4(b): each byte's low / high nibble; sub8(b): b - 8 bytewise; or_hi2<S>(lo, qh):
//   lo | ((qh >> S) & 3) << 4 bytewise (Q6_K's values); splat8(v), halves8(lo, hi): 32 bytes;
//   bsub(a, b): a - b bytewise; store_bytes(p, b)
//   dot_us(u, s): lane j = sum_{k<4} u[4j+k] * s[4j+k], u unsigned, s signed bytes
//   dot_ss(a, b): the same with both signed (llama.cpp's sign trick)
//   add, sub, mul (lanewise int32), lanes_set1(v), halves(lo, hi): lanes 0-3 lo, 4-7 hi
//   zero(), fma(float d, lanes l, acc a): a + d * float(l) lanewise, fused; unscale_hi(a): lanes
//   4-7 divided by kHi; hsum(acc): ((a4 + a0) + (a6 + a2)) + ((a5 + a1) + (a7 + a3)),
//   hsum_float_8's order; loadu, store (8 floats), mul_s(v, s), fma_s(v, s, c): c + v * s fused
//   h2f(bits): an fp16 as float32; halves_to_float(w, &m): 8 words of two fp16 each (32-byte
//   aligned) as float32, the low halves returned, the high ones in m
//   amax32(x): max |x[0, 32)|; round32(x, id, q): q[i] = round-half-even(x[i] * id) saturated to
//   int8, returns their sum
// Every operation is exact or rounds once in a fixed order, so each ISA gives the same bits.
// Not a header of its own.

inline uint16_t load_u16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }

// float32 to fp16 bits, rounding to nearest even (as F16C's vcvtps2ph with imm 0, which
// ggml's GGML_CPU_FP32_TO_FP16 is on x86): overflow to infinity, subnormal halves kept.
inline uint16_t float_to_half_bits(float f) {
  uint32_t u;
  __builtin_memcpy(&u, &f, 4);
  const uint32_t sign = (u >> 16) & 0x8000u, abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));  // NaN
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // 65520 and up round to inf
  if (abs >= 0x38800000u)                                                  // a normal half
    return static_cast<uint16_t>(sign | ((abs + 0xfffu + ((abs >> 13) & 1u) - 0x38000000u) >> 13));
  if (abs < 0x33000000u) return static_cast<uint16_t>(sign);  // under 2^-25: zero
  const uint32_t e = abs >> 23, m = (abs & 0x7fffffu) | 0x800000u, s = 126u - e;  // in 2^-24 units
  uint32_t q = m >> s;
  const uint32_t rem = m & ((1u << s) - 1u), half = 1u << (s - 1u);
  if (rem > half || (rem == half && (q & 1u))) ++q;
  return static_cast<uint16_t>(sign | q);
}

inline float fp16_round(float f) { return half_bits_to_float(float_to_half_bits(f)); }

// Q4_K's 6-bit scale and min of sub-block j from its 12 packed bytes (ggml's get_scale_min_k4).
inline void scale_min_k4(int j, const uint8_t* q, int* sc, int* mn) {
  if (j < 4) {
    *sc = q[j] & 63;
    *mn = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *mn = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

inline int8_t saturate_i8(float r) {
  if (r != r) return -128;  // NaN, as cvtps2dq's "integer indefinite" packs
  return static_cast<int8_t>(r < -128.f ? -128.f : (r > 127.f ? 127.f : r));
}

// ---------------------------------------------------------------- activation quantization

// Q8_K (quantize_row_q8_K_ref, which ggml-cpu runs on x86): one super-block.
inline void quantize_q8_k_block(const float* x, int8_t* q, float* d, int16_t* bsums) {
  float amax = 0.f, mx = 0.f;
  for (int j = 0; j < kQK; ++j) {
    const float ax = __builtin_fabsf(x[j]);
    if (ax > amax) {
      amax = ax;
      mx = x[j];
    }
  }
  if (amax == 0.f) {
    *d = 0.f;
    for (int j = 0; j < kQK; ++j) q[j] = 0;
    for (int j = 0; j < kQK / 16; ++j) bsums[j] = 0;
    return;
  }
  const float iscale = -127.f / mx;
  for (int j = 0; j < kQK; ++j) {
    const float v = iscale * x[j];
    const int8_t r = saturate_i8(__builtin_rintf(v));  // ggml's nearest_int: round half to even
    q[j] = r > 127 ? int8_t(127) : r;
  }
  for (int j = 0; j < kQK / 16; ++j) {
    int sum = 0;
    for (int i = 0; i < 16; ++i) sum += q[16 * j + i];
    bsums[j] = static_cast<int16_t>(sum);
  }
  *d = 1.f / iscale;
}

// Row `row` of x quantized for weights of `kind` (quantize_row_q8_0 / q8_1's x86 code for the
// 32-value kinds: d = amax / 127 rounded to fp16, x * (127 / amax) rounded half to even).
template <class I>
void quantize_row(QuantKind kind, const float* x, int64_t in, const QActs& a, int64_t row) {
  x += row * in;
  int8_t* q = a.q + row * in;
  int16_t* bsums = a.bsums ? a.bsums + row * (in / 16) : nullptr;
  // This row's scales: its tile's, then its place in the tile (quant_kernels.h).
  const int64_t at = a.tile ? (row / kMaxRows) * a.tile + row % kMaxRows : row;
  float* d = a.d + at;
  float* s = a.s ? a.s + at : nullptr;
  if (quant_kind_is_k(kind)) {
    const int64_t nb = in / kQK;
    for (int64_t b = 0; b < nb; ++b) quantize_q8_k_block(x + b * kQK, q + b * kQK, d + b * a.ld, bsums + b * 16);
    return;
  }
  const int64_t nb = in / kQ32;
  for (int64_t b = 0; b < nb; ++b) {
    const float amax = I::amax32(x + b * kQ32);
    const float dv = amax / 127.f;
    const float id = amax != 0.f ? 127.f / amax : 0.f;
    const int sum = I::round32(x + b * kQ32, id, q + b * kQ32);
    d[b * a.ld] = fp16_round(dv);
    if (kind == QuantKind::Q4_1) s[b * a.ld] = fp16_round(dv * static_cast<float>(sum));
  }
}

// ---------------------------------------------------------------- 8-bit activations

// Blocks whose scales a kernel forms ahead of its dots, in one pass (see q32_block).
inline constexpr int64_t kScaleChunk = 64;

// Output rows [r0, r0 + R) against M activation rows, weights of 32-value blocks (Q4_0, Q4_1,
// Q8_0): per block, lanes = the integer dot, acc = fma(d_w * d_x, lanes, acc) (ggml's
// vec_dot_q4_0_q8_0, _q4_1_q8_1, _q8_0_q8_0); Q4_1 adds sum_b m_w * s_x after the lanes' sum.
// Blocks go kScaleChunk at a time: first each weight row's d_w * d_x for the M activation rows
// (one multiply a block, stored) and Q4_1's sums (one multiply-add a block, a lane each), then
// the dots, each scaled by a broadcast load of its product: the multiplier units are left to
// the dots and their multiply-adds. A 4-bit block may be dotted with its high nibbles left in
// place (I::kHi = 16): lanes 4-7 then hold 16 times llama.cpp's integers, so that those lanes of
// the accumulator hold 16 times its sums (scaling by 16 commutes with every rounding), divided
// by 16 at the end (unscale_hi).
template <class I, QuantKind K, int M, int R>
void q32_block(const QProblem& p, int64_t r0) {
  constexpr int64_t BB = quant_kind_bytes(K);
  const int64_t nb = p.in / kQ32, ld = p.a.ld;
  typename I::acc acc[R][M], summs[R];
  for (int r = 0; r < R; ++r) {
    summs[r] = I::zero();
    for (int m = 0; m < M; ++m) acc[r][m] = I::zero();
  }
  float sc[R][kScaleChunk][8], mw[R][kScaleChunk];
  for (int64_t b0 = 0; b0 < nb; b0 += kScaleChunk) {
    const int64_t b1 = b0 + kScaleChunk < nb ? b0 + kScaleChunk : nb;
    for (int r = 0; r < R; ++r)
      for (int64_t b = b0; b < b1; ++b) {
        const uint8_t* blk = p.w + (r0 + r) * p.row_bytes + b * BB;
        I::store(sc[r][b - b0], I::mul_s(I::loadu(p.a.d + b * ld), I::h2f(load_u16(blk))));
        if constexpr (K == QuantKind::Q4_1) mw[r][b - b0] = I::h2f(load_u16(blk + 2));
      }
    for (int64_t b = b0; b < b1; ++b) {
      typename I::bytes xq[M];
      for (int m = 0; m < M; ++m) xq[m] = I::load(p.a.q + m * p.in + b * kQ32);
      for (int r = 0; r < R; ++r) {
        const uint8_t* blk = p.w + (r0 + r) * p.row_bytes + b * BB;
        typename I::bytes wq;
        if constexpr (K == QuantKind::Q8_0) {
          wq = I::load(blk + 2);
        } else if constexpr (K == QuantKind::Q4_0) {
          wq = I::sub8(I::nibbles(blk + 2));
        } else {
          wq = I::nibbles_hi(blk + 4);
          // Here, not in the first pass: the sum's chain of multiply-adds hides among the dots.
          summs[r] = I::fma_s(I::loadu(p.a.s + b * ld), mw[r][b - b0], summs[r]);  // exact products
        }
        for (int m = 0; m < M; ++m) {
          const typename I::lanes l = K == QuantKind::Q4_1 ? I::dot_us(wq, xq[m]) : I::dot_ss(wq, xq[m]);
          acc[r][m] = I::fma(sc[r][b - b0][m], l, acc[r][m]);
        }
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    float mins[8];
    I::store(mins, summs[r]);
    for (int m = 0; m < M; ++m) {
      if constexpr (K == QuantKind::Q4_1)
        p.y[m * p.out + r0 + r] = I::hsum(I::unscale_hi(acc[r][m])) + mins[m];
      else
        p.y[m * p.out + r0 + r] = I::hsum(acc[r][m]);
    }
  }
}

// Decoding reads each weight once, and the hardware's prefetchers do not keep ahead of 8 rows
// read side by side: step i of n asks for its share of the `bytes` at `next` (the rows the next
// step reads), so that they arrive while these are computed. `share` is prefetch_step's.
inline int64_t prefetch_step(int64_t bytes, int64_t n) { return ((bytes + n - 1) / n + 63) & ~int64_t{63}; }
inline void prefetch_share(const uint8_t* next, int64_t bytes, int64_t share, int64_t i) {
  const int64_t hi = (i + 1) * share < bytes ? (i + 1) * share : bytes;
  for (int64_t o = i * share; o < hi; o += 64) __builtin_prefetch(next + o);
}

// The same for one activation row and 8 weight rows (the bits are q32_block's), arranged for
// decoding: the blocks' scales and mins read a row at a time (many loads in flight: that pass
// brings the rows into the cache), converted 8 rows at once, d_w * d_x for the 8 rows in one
// multiply, Q4_1's sums one row a lane. Q4_0's - 8 is taken off the lanes after the dot.
template <class I, QuantKind K, int R>
inline void q32_row(int64_t stride, const uint8_t* w, const typename I::bytes& xq, const typename I::lanes& off,
                    const float* sc, typename I::acc* acc) {
  typename I::lanes l;
  if constexpr (K == QuantKind::Q8_0)
    l = I::dot_ss(I::load(w + R * stride + 2), xq);
  else if constexpr (K == QuantKind::Q4_0)
    l = I::sub(I::dot_us(I::nibbles_hi(w + R * stride + 2), xq), off);
  else
    l = I::dot_us(I::nibbles_hi(w + R * stride + 4), xq);
  acc[R] = I::fma(sc[R], l, acc[R]);
}

// Rows r0 + k * run (k < 8) side by side; run > 1 is a caller's runs layout (qrows_m): each of
// the 8 rows then continues, in the next call, with the row after it, so that the 8 are streams
// read front to back, which the hardware prefetches; run == 1 asks for the next 8 rows itself.
template <class I, QuantKind K>
void q32_decode8(const QProblem& p, int64_t r0, int64_t run) {
  constexpr int64_t BB = quant_kind_bytes(K);
  const int64_t nb = p.in / kQ32, stride = run * p.row_bytes;
  const uint8_t* w0 = p.w + r0 * p.row_bytes;
  const typename I::bytes eight = I::halves8(8, 8 * I::kHi);  // Q4_0's offset: 8, kHi * 8 for the high lanes
  typename I::acc acc[8], summs = I::zero();
  for (int r = 0; r < 8; ++r) acc[r] = I::zero();
  const int64_t share = prefetch_step(8 * p.row_bytes, nb);
  float sc[kScaleChunk][8], mw[kScaleChunk][8];
  alignas(32) uint32_t dm[kScaleChunk][8];
  for (int64_t b0 = 0; b0 < nb; b0 += kScaleChunk) {
    const int64_t b1 = b0 + kScaleChunk < nb ? b0 + kScaleChunk : nb;
    // The 8 rows' first 4 bytes of each block (the fp16 scale, and Q4_1's min), gathered a row
    // at a time by plain loads (many in flight: the rows' lines are asked for early), then
    // converted 8 at a time.
    for (int r = 0; r < 8; ++r)
      for (int64_t b = b0; b < b1; ++b) __builtin_memcpy(&dm[b - b0][r], w0 + r * stride + b * BB, 4);
    for (int64_t b = b0; b < b1; ++b) {
      typename I::acc mins;
      I::store(sc[b - b0], I::mul_s(I::halves_to_float(dm[b - b0], &mins), p.a.d[b * p.a.ld]));
      if constexpr (K == QuantKind::Q4_1) I::store(mw[b - b0], mins);
      // The next 8 rows (bytes past the matrix's end are never read: prefetches do not fault).
      if (run == 1) prefetch_share(w0 + 8 * p.row_bytes, 8 * p.row_bytes, share, b);
    }
    for (int64_t b = b0; b < b1; ++b) {
      const uint8_t* w = w0 + b * BB;
      // Long rows: the 8 rows' next chunk, asked for while this one is computed.
      if (b + kScaleChunk < nb)
        for (int r = 0; r < 8; ++r) __builtin_prefetch(w + r * stride + kScaleChunk * BB);
      const typename I::bytes xq = I::load(p.a.q + b * kQ32);
      typename I::lanes off{};
      if constexpr (K == QuantKind::Q4_0) off = I::dot_us(eight, xq);
      if constexpr (K == QuantKind::Q4_1) summs = I::fma_s(I::loadu(mw[b - b0]), p.a.s[b * p.a.ld], summs);  // exact products
      const float* s = sc[b - b0];
      q32_row<I, K, 0>(stride, w, xq, off, s, acc);
      q32_row<I, K, 1>(stride, w, xq, off, s, acc);
      q32_row<I, K, 2>(stride, w, xq, off, s, acc);
      q32_row<I, K, 3>(stride, w, xq, off, s, acc);
      q32_row<I, K, 4>(stride, w, xq, off, s, acc);
      q32_row<I, K, 5>(stride, w, xq, off, s, acc);
      q32_row<I, K, 6>(stride, w, xq, off, s, acc);
      q32_row<I, K, 7>(stride, w, xq, off, s, acc);
    }
  }
  float mins[8];
  I::store(mins, summs);
  for (int r = 0; r < 8; ++r) {
    float v = I::hsum(K == QuantKind::Q8_0 ? acc[r] : I::unscale_hi(acc[r]));
    if constexpr (K == QuantKind::Q4_1) v += mins[r];
    p.y[r0 + r * run] = v;
  }
}

// Q4_K against Q8_K (ggml's vec_dot_q4_K_q8_K): per super-block, lanes = sum over its 8
// sub-blocks of scale * dot, acc = fma(d_x * d_w, lanes, acc); the mins in four more lanes,
// accm[k] = fma(-d_x * dmin_w, m[2k] * (sum of sub-block 2k) + m[2k+1] * (... 2k+1), accm[k]),
// summed (a0 + a2) + (a1 + a3) and added after the lanes' sum.
template <class I, int M>
inline void q4k_super(const QProblem& p, const uint8_t* blk, int64_t sb, typename I::acc* acc, float (*accm)[4]) {
  const int64_t nb = p.in / kQK;
  const float dw = I::h2f(load_u16(blk)), dminw = I::h2f(load_u16(blk + 2));
  int sc[8], mn[8];
  for (int j = 0; j < 8; ++j) scale_min_k4(j, blk + 4, &sc[j], &mn[j]);
  typename I::bytes w[4];
  for (int j = 0; j < 4; ++j) w[j] = I::load(blk + 16 + 32 * j);
  for (int m = 0; m < M; ++m) {
    const int8_t* xq = p.a.q + m * p.in + sb * kQK;
    const int16_t* bs = p.a.bsums + m * (p.in / 16) + sb * 16;
    const float xd = p.a.d[sb * p.a.ld + m];
    typename I::lanes sum = I::lanes_set1(0);
    for (int j = 0; j < 4; ++j) {
      const typename I::lanes lo = I::mul(I::dot_us(I::lo4(w[j]), I::load(xq + 64 * j)), I::lanes_set1(sc[2 * j]));
      const typename I::lanes hi = I::mul(I::dot_us(I::hi4(w[j]), I::load(xq + 64 * j + 32)), I::lanes_set1(sc[2 * j + 1]));
      sum = I::add(sum, I::add(lo, hi));
    }
    acc[m] = I::fma(xd * dw, sum, acc[m]);
    const float dmin = -xd * dminw;
    for (int k = 0; k < 4; ++k) {
      const int prod = mn[2 * k] * int16_t(bs[4 * k] + bs[4 * k + 1]) + mn[2 * k + 1] * int16_t(bs[4 * k + 2] + bs[4 * k + 3]);
      accm[m][k] = __builtin_fmaf(dmin, static_cast<float>(prod), accm[m][k]);
    }
  }
}

// Q6_K against Q8_K (ggml's vec_dot_q6_K_q8_K): lanes = sum over 16-value groups of
// scale * (dot(q, x) - 32 * sum x), acc = fma(d_x * d_w, lanes, acc).
template <class I, int M>
inline void q6k_super(const QProblem& p, const uint8_t* blk, int64_t sb, typename I::acc* acc) {
  const int64_t nb = p.in / kQK;
  const int8_t* scales = reinterpret_cast<const int8_t*>(blk + 192);
  const float dw = I::h2f(load_u16(blk + 208));
  typename I::bytes w[8];
  for (int h = 0; h < 2; ++h) {
    const typename I::bytes l0 = I::load(blk + 64 * h), l1 = I::load(blk + 64 * h + 32);
    const typename I::bytes qh = I::load(blk + 128 + 32 * h);
    w[4 * h + 0] = I::template or_hi2<0>(I::lo4(l0), qh);
    w[4 * h + 1] = I::template or_hi2<2>(I::lo4(l1), qh);
    w[4 * h + 2] = I::template or_hi2<4>(I::hi4(l0), qh);
    w[4 * h + 3] = I::template or_hi2<6>(I::hi4(l1), qh);
  }
  const typename I::bytes k32 = I::splat8(32);
  for (int m = 0; m < M; ++m) {
    const int8_t* xq = p.a.q + m * p.in + sb * kQK;
    typename I::lanes sum = I::lanes_set1(0);
    for (int c = 0; c < 8; ++c) {
      const typename I::bytes xv = I::load(xq + 32 * c);
      const typename I::lanes d = I::sub(I::dot_us(w[c], xv), I::dot_us(k32, xv));
      sum = I::add(sum, I::mul(d, I::halves(scales[2 * c], scales[2 * c + 1])));
    }
    acc[m] = I::fma(p.a.d[sb * p.a.ld + m] * dw, sum, acc[m]);
  }
}

template <class I, QuantKind K, int M, int R>
void qk_block(const QProblem& p, int64_t r0) {
  const int64_t nb = p.in / kQK;
  typename I::acc acc[R][M];
  float accm[R][M][4] = {};
  const int64_t share = prefetch_step(R * p.row_bytes, nb);
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < M; ++m) acc[r][m] = I::zero();
  for (int64_t sb = 0; sb < nb; ++sb) {
    if constexpr (M == 1) prefetch_share(p.w + (r0 + R) * p.row_bytes, R * p.row_bytes, share, sb);
    for (int r = 0; r < R; ++r) {
      const uint8_t* blk = p.w + (r0 + r) * p.row_bytes + sb * quant_kind_bytes(K);
      if constexpr (K == QuantKind::Q4_K)
        q4k_super<I, M>(p, blk, sb, acc[r], accm[r]);
      else
        q6k_super<I, M>(p, blk, sb, acc[r]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < M; ++m) {
      float v = I::hsum(acc[r][m]);
      if constexpr (K == QuantKind::Q4_K) v += (accm[r][m][0] + accm[r][m][2]) + (accm[r][m][1] + accm[r][m][3]);
      p.y[m * p.out + r0 + r] = v;
    }
}

// ---------------------------------------------------------------- float32 activations

// One weight block as its integers (int8) and, per group of `group` values, the float32 factor
// of their dot with x; per 32 values the factor of x's sum (Q4_1's m, Q4_K's -dmin * min; 0 for
// the others). Returns the group size.
template <class I>
inline int unpack_block(QuantKind k, const uint8_t* b, int8_t* q, float* scale, float* minf) {
  switch (k) {
    case QuantKind::Q8_0:
    case QuantKind::Q4_0:
    case QuantKind::Q4_1:
      I::store_bytes(q, k == QuantKind::Q8_0 ? I::load(b + 2) : k == QuantKind::Q4_0 ? I::sub8(I::nibbles(b + 2)) : I::nibbles(b + 4));
      scale[0] = I::h2f(load_u16(b));
      minf[0] = k == QuantKind::Q4_1 ? I::h2f(load_u16(b + 2)) : 0.f;
      return 32;
    case QuantKind::Q4_K: {
      const float d = I::h2f(load_u16(b)), dmin = I::h2f(load_u16(b + 2));
      for (int s = 0; s < 8; ++s) {
        int sc, mn;
        scale_min_k4(s, b + 4, &sc, &mn);
        scale[s] = d * static_cast<float>(sc);
        minf[s] = -(dmin * static_cast<float>(mn));
      }
      for (int j = 0; j < 4; ++j) {
        const typename I::bytes w = I::load(b + 16 + 32 * j);
        I::store_bytes(q + 64 * j, I::lo4(w));
        I::store_bytes(q + 64 * j + 32, I::hi4(w));
      }
      return 32;
    }
    case QuantKind::Q6_K: {
      const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
      const float d = I::h2f(load_u16(b + 208));
      const typename I::bytes k32 = I::splat8(32);
      for (int h = 0; h < 2; ++h) {
        const typename I::bytes l0 = I::load(b + 64 * h), l1 = I::load(b + 64 * h + 32), qh = I::load(b + 128 + 32 * h);
        I::store_bytes(q + 128 * h, I::bsub(I::template or_hi2<0>(I::lo4(l0), qh), k32));
        I::store_bytes(q + 128 * h + 32, I::bsub(I::template or_hi2<2>(I::lo4(l1), qh), k32));
        I::store_bytes(q + 128 * h + 64, I::bsub(I::template or_hi2<4>(I::hi4(l0), qh), k32));
        I::store_bytes(q + 128 * h + 96, I::bsub(I::template or_hi2<6>(I::hi4(l1), qh), k32));
      }
      for (int g = 0; g < 16; ++g) scale[g] = d * static_cast<float>(sc[g]);
      for (int c = 0; c < 8; ++c) minf[c] = 0.f;
      return 16;
    }
  }
  return 32;
}

// Output rows [r0, r0 + R) against M float rows: per group, t = sum q x (float32 lanes), acc =
// fma(t, scale, acc); the min terms added per 32 values in scalar; the lanes summed at the end.
template <class I, class V, QuantKind K, int M, int R>
void qfloat_block(const QProblem& p, int64_t r0) {
  constexpr int64_t NV = quant_kind_values(K), BB = quant_kind_bytes(K);
  const int64_t nb = p.in / NV, n32 = p.in / kQ32;
  typename V::reg acc[R][M];
  float mins[R][M] = {};
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < M; ++m) acc[r][m] = V::zero();
  alignas(64) int8_t q[NV];
  float scale[16], minf[8];
  for (int64_t b = 0; b < nb; ++b)
    for (int r = 0; r < R; ++r) {
      const int G = unpack_block<I>(K, p.w + (r0 + r) * p.row_bytes + b * BB, q, scale, minf);
      for (int g = 0; g < NV / G; ++g)
        for (int m = 0; m < M; ++m) {
          const float* x = p.x + m * p.in + b * NV + g * G;
          typename V::reg t = V::zero();
          for (int u = 0; u < G; u += V::L) t = V::fma(V::template w<WeightKind::I8>(q, g * G + u), V::loadx(x + u), t);
          acc[r][m] = V::fma(t, V::set1(scale[g]), acc[r][m]);
        }
      if constexpr (K == QuantKind::Q4_1 || K == QuantKind::Q4_K)
        for (int c = 0; c < NV / kQ32; ++c)
          for (int m = 0; m < M; ++m) mins[r][m] += minf[c] * p.xsum[m * n32 + b * (NV / kQ32) + c];
    }
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < M; ++m) p.y[m * p.out + r0 + r] = V::sum(acc[r][m]) + mins[r][m];
}

// ---------------------------------------------------------------- dispatch

template <class I, class V, QuantKind K, int M, int R>
void qrow_block(const QProblem& p, int64_t r0) {
  if (p.float_x) return qfloat_block<I, V, K, M, R>(p, r0);
  if constexpr (quant_kind_is_k(K))
    qk_block<I, K, M, R>(p, r0);
  else
    q32_block<I, K, M, R>(p, r0);
}

// Decoding reads 8 weight rows side by side. When a thread's share of rows is long enough that
// each of 8 runs of consecutive rows is 16 KiB or more, they are read as those runs (8 streams,
// each front to back) instead of 8 consecutive rows at a time with the next 8 prefetched: on
// Zen 4 with 2 threads, Qwen2-0.5B's Q8_0 decode step went from 39.7-40.6 to 43.1-44.7 tokens/s
// (its FFN products and tied head); shorter shares (its q, k, v, o) were slower as runs.
inline constexpr int64_t kRunsFrom = 16384;

template <class I, class V, QuantKind K, int M>
void qrows_m(const QProblem& p, int64_t r0, int64_t r1) {
  constexpr int R = rows_at_once<M>();
  int64_t r = r0;
  // One row of x against 32-value blocks: 8 weight rows at a time, their scales gathered (with
  // 32-bit offsets).
  if constexpr (M == 1 && !quant_kind_is_k(K))
    if (!p.float_x && p.row_bytes <= (int64_t{1} << 28)) {
      const int64_t run = (r1 - r0) / 8;
      if (run * p.row_bytes >= kRunsFrom)
        for (int64_t i = 0; i < run; ++i) q32_decode8<I, K>(p, r0 + i, run);
      else
        for (int64_t i = 0; i < run; ++i) q32_decode8<I, K>(p, r0 + 8 * i, 1);
      r = r0 + 8 * run;
    }
  for (; r + R <= r1; r += R) qrow_block<I, V, K, M, R>(p, r);
  for (; r < r1; ++r) qrow_block<I, V, K, M, 1>(p, r);
}

template <class I, class V, QuantKind K>
void qrows_k(const QProblem& p, int64_t r0, int64_t r1) {
  switch (p.m) {
    case 1: return qrows_m<I, V, K, 1>(p, r0, r1);
    case 2: return qrows_m<I, V, K, 2>(p, r0, r1);
    case 3: return qrows_m<I, V, K, 3>(p, r0, r1);
    case 4: return qrows_m<I, V, K, 4>(p, r0, r1);
    case 5: return qrows_m<I, V, K, 5>(p, r0, r1);
    case 6: return qrows_m<I, V, K, 6>(p, r0, r1);
    case 7: return qrows_m<I, V, K, 7>(p, r0, r1);
    case 8: return qrows_m<I, V, K, 8>(p, r0, r1);
    default: return;
  }
}

template <class I, class V>
void qrows_impl(const QProblem& p, int64_t r0, int64_t r1) {
  switch (p.kind) {
    case QuantKind::Q4_0: return qrows_k<I, V, QuantKind::Q4_0>(p, r0, r1);
    case QuantKind::Q4_1: return qrows_k<I, V, QuantKind::Q4_1>(p, r0, r1);
    case QuantKind::Q8_0: return qrows_k<I, V, QuantKind::Q8_0>(p, r0, r1);
    case QuantKind::Q4_K: return qrows_k<I, V, QuantKind::Q4_K>(p, r0, r1);
    case QuantKind::Q6_K: return qrows_k<I, V, QuantKind::Q6_K>(p, r0, r1);
  }
}
