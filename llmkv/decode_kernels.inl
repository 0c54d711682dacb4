// The kernels' body, shared by the ISA files: each defines a vector traits struct V
//   reg; L (float lanes); zero(); loadx(const float*); fma(a, b, c); mul(a, b); set1(float);
//   sum(reg); w<WeightKind>(const void* base, int64_t element_index) -> L floats;
//   bf16_pairs(base, e, even, odd): 2L bfloat16 from e as float32, even and odd elements apart;
//   add, sub, max, hmax, store, exp, sum8(a[8], out): out[k] = sum(a[k]) (the attention);
//   kDotBf16: whether it has dot_bf16(acc, w, x): acc + the products of 2L bfloat16 pairs (lane
//   j: w[2j] x[2j] + w[2j+1] x[2j+1], exact products summed in float32)
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

// Accumulates R weight rows (r0 + r * step) against M activation rows over [i0, i1) (a multiple
// of V::L long) into acc[R][M].
template <class V, WeightKind K, int M, int R>
inline void accumulate(const Problem& p, int64_t r0, int64_t step, int64_t i0, int64_t i1,
                       typename V::reg (&acc)[R][M]) {
  const int64_t in = p.in;
  for (int64_t i = i0; i < i1; i += V::L) {
    typename V::reg xv[M];
    for (int m = 0; m < M; ++m) xv[m] = V::loadx(p.x + m * in + i);
    for (int r = 0; r < R; ++r) {
      const typename V::reg w = V::template w<K>(p.w, (r0 + r * step) * in + i);
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

// bfloat16 weights two at a time: a register of 2L raw bfloat16 holds, as 32-bit lanes, the
// even elements in its low halves and the odd ones in its high halves; each becomes float32 in
// one operation (a shift, a mask) against x split the same way (p.xe, p.xo). Over [0, i1), i1 a
// multiple of 2L.
template <class V, int M, int R>
inline void accumulate_bf16_pairs(const Problem& p, int64_t r0, int64_t step, int64_t i1, typename V::reg (&acc)[R][M]) {
  const int64_t in = p.in, half = in / 2;
  for (int64_t i = 0; i < i1; i += 2 * V::L) {
    typename V::reg xe[M], xo[M];
    for (int m = 0; m < M; ++m) {
      xe[m] = V::loadx(p.xe + m * half + i / 2);
      xo[m] = V::loadx(p.xo + m * half + i / 2);
    }
    for (int r = 0; r < R; ++r) {
      typename V::reg we, wo;
      V::bf16_pairs(p.w, (r0 + r * step) * in + i, we, wo);
      for (int m = 0; m < M; ++m) acc[r][m] = V::fma(wo, xo[m], V::fma(we, xe[m], acc[r][m]));
    }
  }
}

// bfloat16 weights against bfloat16 x (p.xb) by the CPU's bfloat16 dot, over [0, i1), i1 a
// multiple of 2L.
template <class V, int M, int R>
inline void accumulate_bf16_dot(const Problem& p, int64_t r0, int64_t step, int64_t i1, typename V::reg (&acc)[R][M]) {
  if constexpr (V::kDotBf16) {
    const uint16_t* w = static_cast<const uint16_t*>(p.w) + r0 * p.in;
    for (int64_t i = 0; i < i1; i += 2 * V::L)
      for (int r = 0; r < R; ++r)
        for (int m = 0; m < M; ++m) acc[r][m] = V::dot_bf16(acc[r][m], w + r * step * p.in + i, p.xb + m * p.in + i);
  }
}

// Output rows r0 + r * step (r < R), all M activation rows.
template <class V, WeightKind K, int M, int R>
void row_block(const Problem& p, int64_t r0, int64_t step) {
  const int64_t in = p.in;
  float out[R][M] = {};
  if constexpr (K != WeightKind::I8) {
    typename V::reg acc[R][M];
    for (int r = 0; r < R; ++r)
      for (int m = 0; m < M; ++m) acc[r][m] = V::zero();
    int64_t nv;
    if (K == WeightKind::BF16 && V::kDotBf16 && p.xb) {
      nv = in / (2 * V::L) * (2 * V::L);
      accumulate_bf16_dot<V, M, R>(p, r0, step, nv, acc);
    } else if (K == WeightKind::BF16 && p.xe) {
      nv = in / (2 * V::L) * (2 * V::L);
      accumulate_bf16_pairs<V, M, R>(p, r0, step, nv, acc);
    } else {
      nv = in / V::L * V::L;
      accumulate<V, K, M, R>(p, r0, step, 0, nv, acc);
    }
    for (int r = 0; r < R; ++r)
      for (int m = 0; m < M; ++m) out[r][m] = V::sum(acc[r][m]);
    for (int64_t i = nv; i < in; ++i)
      for (int r = 0; r < R; ++r) {
        const float w = scalar_w<K>(p.w, (r0 + r * step) * in + i);
        for (int m = 0; m < M; ++m) out[r][m] += w * p.x[m * in + i];
      }
  } else {
    // Per block: the integer weights times x in float32, then scaled into the accumulator.
    // Whole blocks a fixed number of registers long; the last, shorter block (if any) as it comes.
    const int64_t nb = (in + kInt8Block - 1) / kInt8Block, full = in / kInt8Block;
    constexpr int U = static_cast<int>(kInt8Block) / V::L;
    typename V::reg acc[R][M];
    for (int r = 0; r < R; ++r)
      for (int m = 0; m < M; ++m) acc[r][m] = V::zero();
    for (int64_t b = 0; b < full; ++b) {
      const int64_t i0 = b * kInt8Block;
      typename V::reg xv[U][M];
      for (int u = 0; u < U; ++u)
        for (int m = 0; m < M; ++m) xv[u][m] = V::loadx(p.x + m * in + i0 + u * V::L);
      for (int r = 0; r < R; ++r) {
        const int8_t* wq = static_cast<const int8_t*>(p.w) + (r0 + r * step) * in + i0;
        typename V::reg w[U];
        for (int u = 0; u < U; ++u) w[u] = V::template w<K>(wq, u * V::L);
        const typename V::reg sv = V::set1(p.scales[(r0 + r * step) * nb + b]);
        for (int m = 0; m < M; ++m) {
          typename V::reg t = V::mul(w[0], xv[0][m]);
          for (int u = 1; u < U; ++u) t = V::fma(w[u], xv[u][m], t);
          acc[r][m] = V::fma(t, sv, acc[r][m]);
        }
      }
    }
    for (int64_t b = full; b < nb; ++b) {
      const int64_t i0 = b * kInt8Block;
      for (int r = 0; r < R; ++r) {
        const float s = p.scales[(r0 + r * step) * nb + b];
        for (int64_t i = i0; i < in; ++i) {
          const float w = scalar_w<K>(p.w, (r0 + r * step) * in + i) * s;
          for (int m = 0; m < M; ++m) out[r][m] += w * p.x[m * in + i];
        }
      }
    }
    for (int r = 0; r < R; ++r)
      for (int m = 0; m < M; ++m) out[r][m] += V::sum(acc[r][m]);
  }
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < M; ++m) p.y[m * p.out + r0 + r * step] = out[r][m];
}

// Rows at a time: enough independent weight streams to keep the loads in flight, few enough
// accumulators (R x M) to stay in registers.
template <int M>
inline constexpr int rows_at_once() {
  return M == 1 ? 8 : (M == 2 ? 4 : (M <= 4 ? 2 : 1));
}

// Rows [r0, r1) cut into R runs of consecutive rows read side by side, row i of each run
// together (a run's rows lie one after another: R streams, each read front to back, which the
// hardware prefetches as such); the rows left over one at a time. On the machine measured (Zen 4,
// 2 threads, weights from memory) this read bfloat16 weights by vdpbf16ps at 43-46 GB/s where R
// consecutive rows side by side (R streams restarting every R rows) reached 25, and float32 at
// 43-46 against 37-42.
template <class V, WeightKind K, int M>
void rows_m(const Problem& p, int64_t r0, int64_t r1) {
  constexpr int R = rows_at_once<M>();
  const int64_t run = (r1 - r0) / R;
  for (int64_t i = 0; i < run; ++i) row_block<V, K, M, R>(p, r0 + i, run);
  for (int64_t r = r0 + R * run; r < r1; ++r) row_block<V, K, M, 1>(p, r, 1);
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

// ---------------------------------------------------------------- attention (one query a head)

// The attention's blocked pieces for heads of C registers (d = C * V::L), GN query heads of a kv
// head at a time: their queries (GN * C registers) or their outputs' sums (GN * C) stay in
// registers over the keys, each key's row read once a group. Rows: scratch rows from row0, the
// queries q0 and outputs o0 d apart.

// Scores of GN query heads against keys [j0, j1) of kv head h: q.k * scale + logw, the sums of
// 8 / GN keys formed together (V::sum8).
template <class V, WeightKind K, int C, int GN>
void qk_block(const AttnProblem& p, int64_t h, int64_t row0, const float* q0, int64_t j0, int64_t j1) {
  constexpr int KB = 8 / GN;  // keys a batch
  const int64_t d = p.d, nk = p.nk, base = h * p.head_stride;
  typename V::reg q[GN][C];
  for (int g = 0; g < GN; ++g)
    for (int c = 0; c < C; ++c) q[g][c] = V::loadx(q0 + g * d + c * V::L);
  for (int64_t j = j0; j < j1; j += KB) {
    const int kb = j1 - j < KB ? static_cast<int>(j1 - j) : KB;
    typename V::reg acc[8];
    for (auto& a : acc) a = V::zero();
    for (int k = 0; k < KB; ++k) {
      if (k >= kb) break;
      for (int c = 0; c < C; ++c) {
        const typename V::reg kv = V::template w<K>(p.k, base + (j + k) * d + c * V::L);
        for (int g = 0; g < GN; ++g) acc[k * GN + g] = V::fma(kv, q[g][c], acc[k * GN + g]);
      }
    }
    float sc[8];
    V::sum8(acc, sc);
    for (int k = 0; k < kb; ++k) {
      const float lw = p.logw ? p.logw[h * p.logw_head_stride + j + k] : 0.f;
      for (int g = 0; g < GN; ++g) p.scratch[(row0 + g) * nk + j + k] = sc[k * GN + g] * p.scale + lw;
    }
  }
}

// o0[g] = sum_j e[g, j] v_j over keys [j0, j1) for GN query heads (e: their scratch rows).
template <class V, WeightKind K, int C, int GN>
void pv_block(const AttnProblem& p, int64_t h, int64_t row0, float* o0, int64_t j0, int64_t j1) {
  const int64_t d = p.d, nk = p.nk, base = h * p.head_stride;
  typename V::reg acc[GN][C];
  for (int g = 0; g < GN; ++g)
    for (int c = 0; c < C; ++c) acc[g][c] = V::zero();
  for (int64_t j = j0; j < j1; ++j) {
    typename V::reg v[C];
    for (int c = 0; c < C; ++c) v[c] = V::template w<K>(p.v, base + j * d + c * V::L);
    for (int g = 0; g < GN; ++g) {
      const typename V::reg e = V::set1(p.scratch[(row0 + g) * nk + j]);
      for (int c = 0; c < C; ++c) acc[g][c] = V::fma(e, v[c], acc[g][c]);
    }
  }
  for (int g = 0; g < GN; ++g)
    for (int c = 0; c < C; ++c) V::store(o0 + g * d + c * V::L, acc[g][c]);
}

// The G query heads of kv head h in groups of 16 / C: scores (pass 0) or outputs (pass 1).
template <class V, WeightKind K, int C>
void heads_blocked(const AttnProblem& p, int64_t h, int64_t j0, int64_t j1, float* o, int pass) {
  constexpr int GQ = 16 / C < 8 ? 16 / C : 8;
  const int64_t G = p.H / p.KH, d = p.d;
  for (int64_t g0 = 0; g0 < G; g0 += GQ) {
    const int64_t row0 = h * G + g0;
    const float* q0 = p.q + row0 * d;
    float* o0 = o + g0 * d;
    const int64_t gn = G - g0 < GQ ? G - g0 : GQ;
#define WM_HEADS_CASE(N)                                                              \
  case N:                                                                             \
    if constexpr (N <= GQ) {                                                          \
      if (pass == 0) qk_block<V, K, C, N>(p, h, row0, q0, j0, j1);                    \
      else pv_block<V, K, C, N>(p, h, row0, o0, j0, j1);                              \
    }                                                                                 \
    break;
    switch (gn) {
      WM_HEADS_CASE(1) WM_HEADS_CASE(2) WM_HEADS_CASE(3) WM_HEADS_CASE(4)
      WM_HEADS_CASE(5) WM_HEADS_CASE(6) WM_HEADS_CASE(7) WM_HEADS_CASE(8)
      default: break;
    }
#undef WM_HEADS_CASE
  }
}

// Whether kv head rows of d take the blocked pieces (AVX-512's 32 registers; d of 2, 4 or 8
// registers), and runs them.
template <class V, WeightKind K>
bool attn_blocked(const AttnProblem& p, int64_t h, int64_t j0, int64_t j1, float* o, int pass) {
  if constexpr (V::L != 16) return false;
  switch (p.d == 2 * V::L ? 2 : p.d == 4 * V::L ? 4 : p.d == 8 * V::L ? 8 : 0) {
    case 2: heads_blocked<V, K, 2>(p, h, j0, j1, o, pass); return true;
    case 4: heads_blocked<V, K, 4>(p, h, j0, j1, o, pass); return true;
    case 8: heads_blocked<V, K, 8>(p, h, j0, j1, o, pass); return true;
    default: return false;
  }
}

// The softmax's pieces of kv head h's query heads over keys [j0, j1): each score row's largest
// score m[g], its scores replaced by e^(score - m[g]), their sum l[g].
template <class V>
void softmax_rows(const AttnProblem& p, int64_t h, int64_t j0, int64_t j1, float* m, float* l) {
  const int64_t G = p.H / p.KH, nk = p.nk;
  const int64_t n = j1 - j0, nv = n / V::L * V::L;
  for (int64_t g = 0; g < G; ++g) {
    float* s = p.scratch + (h * G + g) * nk + j0;
    float mx = -__builtin_inff();
    typename V::reg mv = V::set1(mx);
    for (int64_t j = 0; j < nv; j += V::L) mv = V::max(mv, V::loadx(s + j));
    mx = V::hmax(mv);
    for (int64_t j = nv; j < n; ++j) mx = s[j] > mx ? s[j] : mx;
    const typename V::reg mvv = V::set1(mx);
    typename V::reg lv = V::zero();
    for (int64_t j = 0; j < nv; j += V::L) {
      const typename V::reg e = V::exp(V::sub(V::loadx(s + j), mvv));
      V::store(s + j, e);
      lv = V::add(lv, e);
    }
    float sum = V::sum(lv);
    for (int64_t j = nv; j < n; ++j) {
      s[j] = __builtin_expf(s[j] - mx);
      sum += s[j];
    }
    m[g] = mx;
    l[g] = sum;
  }
}

template <class V, WeightKind K>
void attn_task_k(const AttnProblem& p, int64_t h, int64_t j0, int64_t j1, float* m, float* l, float* o) {
  const int64_t G = p.H / p.KH, d = p.d, nk = p.nk, dv = d / V::L * V::L;
  const int64_t base = h * p.head_stride;
  constexpr int kMaxG = 16;
  // Small heads (a group's queries and its outputs fit in registers, no tail): the queries are
  // loaded once and the outputs accumulated in registers, key by key.
  constexpr int kRegs = 16;
  const bool blocked = attn_blocked<V, K>(p, h, j0, j1, o, 0);
  const bool small = !blocked && dv == d && G * (d / V::L) <= kRegs;
  if (small) {
    const int64_t C = d / V::L;
    typename V::reg qr[kRegs];
    for (int64_t g = 0; g < G; ++g)
      for (int64_t c = 0; c < C; ++c) qr[g * C + c] = V::loadx(p.q + (h * G + g) * d + c * V::L);
    for (int64_t j = j0; j < j1; ++j) {
      typename V::reg kr[kRegs];
      for (int64_t c = 0; c < C; ++c) kr[c] = V::template w<K>(p.k, base + j * d + c * V::L);
      for (int64_t g = 0; g < G; ++g) {
        typename V::reg acc = V::mul(kr[0], qr[g * C]);
        for (int64_t c = 1; c < C; ++c) acc = V::fma(kr[c], qr[g * C + c], acc);
        p.scratch[(h * G + g) * nk + j] =
            V::sum(acc) * p.scale + (p.logw ? p.logw[h * p.logw_head_stride + j] : 0.f);
      }
    }
  }
  for (int64_t g0 = 0; g0 < G && !small && !blocked; g0 += kMaxG) {
    const int64_t gn = G - g0 < kMaxG ? G - g0 : kMaxG;
    const float* q0 = p.q + (h * G + g0) * d;
    for (int64_t j = j0; j < j1; ++j) {
      typename V::reg acc[kMaxG];
      for (int64_t g = 0; g < gn; ++g) acc[g] = V::zero();
      for (int64_t i = 0; i < dv; i += V::L) {
        const typename V::reg kv = V::template w<K>(p.k, base + j * d + i);
        for (int64_t g = 0; g < gn; ++g) acc[g] = V::fma(kv, V::loadx(q0 + g * d + i), acc[g]);
      }
      for (int64_t g = 0; g < gn; ++g) {
        float s = V::sum(acc[g]);
        for (int64_t i = dv; i < d; ++i) s += scalar_w<K>(p.k, base + j * d + i) * q0[g * d + i];
        p.scratch[(h * G + g0 + g) * nk + j] = s * p.scale + (p.logw ? p.logw[h * p.logw_head_stride + j] : 0.f);
      }
    }
  }
  softmax_rows<V>(p, h, j0, j1, m, l);
  // Values: o[g] = sum_j e[g, j] v_j, each value row read once.
  if (small) {
    const int64_t C = d / V::L;
    typename V::reg acc[kRegs];
    for (int64_t r = 0; r < G * C; ++r) acc[r] = V::zero();
    for (int64_t j = j0; j < j1; ++j) {
      typename V::reg vr[kRegs];
      for (int64_t c = 0; c < C; ++c) vr[c] = V::template w<K>(p.v, base + j * d + c * V::L);
      for (int64_t g = 0; g < G; ++g) {
        const typename V::reg e = V::set1(p.scratch[(h * G + g) * nk + j]);
        for (int64_t c = 0; c < C; ++c) acc[g * C + c] = V::fma(e, vr[c], acc[g * C + c]);
      }
    }
    for (int64_t g = 0; g < G; ++g)
      for (int64_t c = 0; c < C; ++c) V::store(o + g * d + c * V::L, acc[g * C + c]);
    return;
  }
  if (blocked) {
    attn_blocked<V, K>(p, h, j0, j1, o, 1);
    return;
  }
  for (int64_t g = 0; g < G * d; ++g) o[g] = 0.f;
  for (int64_t j = j0; j < j1; ++j) {
    for (int64_t i = 0; i < dv; i += V::L) {
      const typename V::reg vv = V::template w<K>(p.v, base + j * d + i);
      for (int64_t g = 0; g < G; ++g) {
        float* og = o + g * d + i;
        V::store(og, V::fma(V::set1(p.scratch[(h * G + g) * nk + j]), vv, V::loadx(og)));
      }
    }
    for (int64_t i = dv; i < d; ++i) {
      const float vs = scalar_w<K>(p.v, base + j * d + i);
      for (int64_t g = 0; g < G; ++g) o[g * d + i] += p.scratch[(h * G + g) * nk + j] * vs;
    }
  }
}

template <class V>
void attn_task(const AttnProblem& p, int64_t h, int64_t j0, int64_t j1, float* m, float* l, float* o) {
  switch (p.kind) {
    case WeightKind::F32: return attn_task_k<V, WeightKind::F32>(p, h, j0, j1, m, l, o);
    case WeightKind::BF16: return attn_task_k<V, WeightKind::BF16>(p, h, j0, j1, m, l, o);
    case WeightKind::F16: return attn_task_k<V, WeightKind::F16>(p, h, j0, j1, m, l, o);
    case WeightKind::I8: return;
  }
}
