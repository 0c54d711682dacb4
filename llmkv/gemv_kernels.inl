// The kernels' body, shared by the ISA files: each defines a vector traits struct V
//   reg; L (float lanes); zero(); loadx(const float*); fma(a, b, c); mul(a, b); set1(float);
//   sum(reg); w<WeightKind>(const void* base, int64_t element_index) -> L floats
// and includes this file inside an anonymous namespace of its own (internal linkage: no copy
// compiled for one ISA may stand in for another's). Not a header of its own.

inline float bf16_bits_to_float(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}

inline float half_bits_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, u;
  if (exp == 0x1fu) {
    u = sign | 0x7f800000u | (man << 13);  // inf, NaN
  } else if (exp != 0) {
    u = sign | ((exp + 112u) << 23) | (man << 13);
  } else if (man == 0) {
    u = sign;
  } else {  // subnormal: normalise
    int e = -1;
    do {
      man <<= 1;
      ++e;
    } while ((man & 0x400u) == 0);
    u = sign | ((112u - e) << 23) | ((man & 0x3ffu) << 13);
  }
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}

// Accumulates R weight rows against M activation rows over [i0, i1) (a multiple of V::L long)
// into acc[R][M].
template <class V, WeightKind K, int M, int R>
inline void accumulate(const Problem& p, int64_t r0, int64_t i0, int64_t i1,
                                      typename V::reg (&acc)[R][M]) {
  const int64_t in = p.in;
  for (int64_t i = i0; i < i1; i += V::L) {
    typename V::reg xv[M];
    for (int m = 0; m < M; ++m) xv[m] = V::loadx(p.x + m * in + i);
    for (int r = 0; r < R; ++r) {
      const typename V::reg w = V::template w<K>(p.w, (r0 + r) * in + i);
      for (int m = 0; m < M; ++m) acc[r][m] = V::fma(w, xv[m], acc[r][m]);
    }
  }
}

template <WeightKind K>
inline float scalar_w(const void* base, int64_t e) {
  if constexpr (K == WeightKind::F32) return static_cast<const float*>(base)[e];
  if constexpr (K == WeightKind::BF16) return bf16_bits_to_float(static_cast<const uint16_t*>(base)[e]);
  if constexpr (K == WeightKind::F16) return half_bits_to_float(static_cast<const uint16_t*>(base)[e]);
  if constexpr (K == WeightKind::I8) return static_cast<float>(static_cast<const int8_t*>(base)[e]);
  return 0.f;
}

// Output rows [r0, r0 + R), all M activation rows.
template <class V, WeightKind K, int M, int R>
void row_block(const Problem& p, int64_t r0) {
  const int64_t in = p.in;
  float out[R][M] = {};
  if constexpr (K != WeightKind::I8) {
    typename V::reg acc[R][M];
    for (int r = 0; r < R; ++r)
      for (int m = 0; m < M; ++m) acc[r][m] = V::zero();
    const int64_t nv = in / V::L * V::L;
    accumulate<V, K, M, R>(p, r0, 0, nv, acc);
    for (int r = 0; r < R; ++r)
      for (int m = 0; m < M; ++m) out[r][m] = V::sum(acc[r][m]);
    for (int64_t i = nv; i < in; ++i)
      for (int r = 0; r < R; ++r) {
        const float w = scalar_w<K>(p.w, (r0 + r) * in + i);
        for (int m = 0; m < M; ++m) out[r][m] += w * p.x[m * in + i];
      }
  } else {
    // Per block: the integer weights times x in float32, then scaled into the accumulator.
    const int64_t nb = (in + kInt8Block - 1) / kInt8Block;
    typename V::reg acc[R][M];
    for (int r = 0; r < R; ++r)
      for (int m = 0; m < M; ++m) acc[r][m] = V::zero();
    for (int64_t b = 0; b < nb; ++b) {
      const int64_t i0 = b * kInt8Block, i1 = i0 + kInt8Block <= in ? i0 + kInt8Block : in;
      const int64_t iv = i0 + (i1 - i0) / V::L * V::L;
      typename V::reg blk[R][M];
      for (int r = 0; r < R; ++r)
        for (int m = 0; m < M; ++m) blk[r][m] = V::zero();
      accumulate<V, K, M, R>(p, r0, i0, iv, blk);
      for (int r = 0; r < R; ++r) {
        const float s = p.scales[(r0 + r) * nb + b];
        const typename V::reg sv = V::set1(s);
        for (int m = 0; m < M; ++m) acc[r][m] = V::fma(blk[r][m], sv, acc[r][m]);
        for (int64_t i = iv; i < i1; ++i) {
          const float w = scalar_w<K>(p.w, (r0 + r) * in + i) * s;
          for (int m = 0; m < M; ++m) out[r][m] += w * p.x[m * in + i];
        }
      }
    }
    for (int r = 0; r < R; ++r)
      for (int m = 0; m < M; ++m) out[r][m] += V::sum(acc[r][m]);
  }
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < M; ++m) p.y[m * p.out + r0 + r] = out[r][m];
}

// Rows at a time: enough independent weight streams to keep the loads in flight, few enough
// accumulators (R x M) to stay in registers.
template <int M>
inline constexpr int rows_at_once() {
  return M <= 2 ? 4 : (M <= 4 ? 2 : 1);
}

template <class V, WeightKind K, int M>
void rows_m(const Problem& p, int64_t r0, int64_t r1) {
  constexpr int R = rows_at_once<M>();
  int64_t r = r0;
  for (; r + R <= r1; r += R) row_block<V, K, M, R>(p, r);
  for (; r < r1; ++r) row_block<V, K, M, 1>(p, r);
}

template <class V, WeightKind K>
void rows_k(const Problem& p, int64_t r0, int64_t r1) {
  switch (p.m) {
    case 1: return rows_m<V, K, 1>(p, r0, r1);
    case 2: return rows_m<V, K, 2>(p, r0, r1);
    case 3: return rows_m<V, K, 3>(p, r0, r1);
    case 4: return rows_m<V, K, 4>(p, r0, r1);
    case 5: return rows_m<V, K, 5>(p, r0, r1);
    case 6: return rows_m<V, K, 6>(p, r0, r1);
    case 7: return rows_m<V, K, 7>(p, r0, r1);
    case 8: return rows_m<V, K, 8>(p, r0, r1);
    default: return;
  }
}

template <class V>
void rows_impl(const Problem& p, int64_t r0, int64_t r1) {
  switch (p.kind) {
    case WeightKind::F32: return rows_k<V, WeightKind::F32>(p, r0, r1);
    case WeightKind::BF16: return rows_k<V, WeightKind::BF16>(p, r0, r1);
    case WeightKind::F16: return rows_k<V, WeightKind::F16>(p, r0, r1);
    case WeightKind::I8: return rows_k<V, WeightKind::I8>(p, r0, r1);
  }
}
