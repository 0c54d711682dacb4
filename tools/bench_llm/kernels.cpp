#include "tools/bench_llm/kernels.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>

#include "llmkv/gemv.h"
#include "llmkv/quant_gemv.h"
#include "runtime/error.h"
#include "runtime/gguf.h"
#include "runtime/gguf_quants.h"

namespace wm::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct Shape {
  const char* name;
  const char* tensor;  // SmolLM2's tensor of this shape (blk.0's); --gguf reads it
  int64_t in, out;
  GgmlType type;
  int per_step;  // products of this shape in a decode step (every layer's, the head once)
};

// SmolLM2-135M-Instruct's file: Q4_1 projections, the Q8_0 embedding as the tied head (30 layers).
const std::vector<Shape> kSmollm2 = {
    {"q, o 576->576", "blk.0.attn_q.weight", 576, 576, GgmlType::Q4_1, 60},
    {"k, v 576->192", "blk.0.attn_k.weight", 576, 192, GgmlType::Q4_1, 60},
    {"gate, up 576->1536", "blk.0.ffn_gate.weight", 576, 1536, GgmlType::Q4_1, 60},
    {"down 1536->576", "blk.0.ffn_down.weight", 1536, 576, GgmlType::Q4_1, 30},
    {"head 576->49152", "token_embd.weight", 576, 49152, GgmlType::Q8_0, 1},
};
// Qwen2-0.5B's shape in Q8_0 (24 layers, the tied head), as tools/bench_llm/vs_llamacpp.py writes
// it: random blocks only.
const std::vector<Shape> kQwen2 = {
    {"q, o 896->896", "", 896, 896, GgmlType::Q8_0, 48},
    {"k, v 896->128", "", 896, 128, GgmlType::Q8_0, 48},
    {"gate, up 896->4864", "", 896, 4864, GgmlType::Q8_0, 48},
    {"down 4864->896", "", 4864, 896, GgmlType::Q8_0, 24},
    {"head 896->151936", "", 896, 151936, GgmlType::Q8_0, 1},
};

// --kernel-shapes: a model's products and the name the tables print.
struct ShapeSet {
  const char* model;
  const std::vector<Shape>& shapes;
};

ShapeSet shapes_of(const std::string& name) {
  if (name == "smollm2") return {"SmolLM2-135M", kSmollm2};
  WM_CHECK(name == "qwen2-0.5b", "--kernel-shapes must be smollm2 or qwen2-0.5b, got '", name, "'");
  return {"Qwen2-0.5B (Q8_0)", kQwen2};
}

enum Kind { kQ8, kQFloat, kF32, kI8, kKinds };
const char* const kKindNames[kKinds] = {"q8", "q-float", "f32", "int8"};

// Decode-sized products cycle through this many bytes of copies of a weight (above the L3).
constexpr int64_t kColdBytes = int64_t{96} << 20;

// Random blocks of a type with fp16 scales of a realistic size (the speed does not depend on them).
llm::QuantWeight random_weight(GgmlType t, int64_t out, int64_t in) {
  const QuantBlock qb = quant_block(t);
  at::Tensor b = at::randint(0, 256, {out, static_cast<int64_t>(quant_bytes(t, in))}, at::TensorOptions().dtype(at::kByte));
  uint8_t* p = b.data_ptr<uint8_t>();
  for (int64_t i = 0; i < b.numel() / qb.bytes; ++i) {
    const uint16_t d = c10::Half(0.01f).x, m = c10::Half(-0.05f).x;
    p[i * qb.bytes] = d & 0xff, p[i * qb.bytes + 1] = d >> 8;
    if (t == GgmlType::Q4_1) p[i * qb.bytes + 2] = m & 0xff, p[i * qb.bytes + 3] = m >> 8;
  }
  return llm::QuantWeight::from_blocks(t, out, in, b);
}

// The weights of one shape in every kind, `copies` of each kind (see kColdBytes).
struct Weights {
  std::vector<llm::QuantWeight> q;
  std::vector<at::Tensor> f;
  std::vector<llm::Int8Weight> i8;
  int64_t bytes[kKinds] = {};
};

Weights make_weights(const Shape& s, const std::shared_ptr<const GgufFile>& file, bool cold) {
  llm::QuantWeight base = file ? llm::QuantWeight::from_gguf(file, s.tensor) : random_weight(s.type, s.out, s.in);
  WM_CHECK(base.type == s.type && base.in == s.in && base.out == s.out, file ? file->path() : "random", ": ", s.tensor, " is ",
           ggml_type_name(base.type), " [", base.out, ", ", base.in, "], not SmolLM2-135M's");
  const at::Tensor wf = base.dequantize();
  const llm::Int8Weight wi = llm::Int8Weight::quantize(wf);
  Weights w;
  w.bytes[kQ8] = w.bytes[kQFloat] = base.bytes();
  w.bytes[kF32] = wf.numel() * 4;
  w.bytes[kI8] = wi.bytes();
  auto copies = [&](int64_t bytes) { return cold ? std::max<int64_t>(1, (kColdBytes + bytes - 1) / bytes) : 1; };
  for (int64_t c = 0; c < copies(base.bytes()); ++c)
    w.q.push_back(llm::QuantWeight::from_blocks(base.type, base.out, base.in, base.blocks.clone()));
  for (int64_t c = 0; c < copies(w.bytes[kF32]); ++c) w.f.push_back(wf.clone());
  for (int64_t c = 0; c < copies(wi.bytes()); ++c) w.i8.push_back({wi.q.clone(), wi.scale.clone()});
  return w;
}

// Seconds of one product of `kind` (the mean over the weight's copies).
double time_product(const Weights& w, Kind kind, const at::Tensor& x) {
  llm::set_quant_activations(kind == kQFloat ? llm::QuantActivations::Float : llm::QuantActivations::Q8);
  const auto t0 = Clock::now();
  int64_t n = 0;
  if (kind == kQ8 || kind == kQFloat)
    for (const auto& q : w.q) (void)llm::linear(x, q, at::Tensor()), ++n;
  else if (kind == kF32)
    for (const auto& f : w.f) (void)llm::linear(x, f, at::Tensor()), ++n;
  else
    for (const auto& i : w.i8) (void)llm::linear(x, i, at::Tensor()), ++n;
  return std::chrono::duration<double>(Clock::now() - t0).count() / static_cast<double>(n);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

// One shape at `rows` rows and `threads` threads: each kind's median ms a product.
void bench_shape(const Shape& s, const Weights& w, int64_t rows, int rounds, double (&ms)[kKinds]) {
  const at::Tensor x = at::randn({rows, s.in});
  std::vector<double> t[kKinds];
  for (int r = 0; r <= rounds; ++r)
    for (int k = 0; k < kKinds; ++k) {
      const double sec = time_product(w, static_cast<Kind>(k), x);
      if (r > 0) t[k].push_back(sec);
    }
  for (int k = 0; k < kKinds; ++k) ms[k] = 1000.0 * median(t[k]);
}

void print_header(const char* model, int64_t rows, int threads) {
  std::printf("\nkernels: %s's products, %lld row%s, %d thread%s (quantized kernels %s, decode kernels %s): "
              "ms a product (GB/s of weights)\n",
              model, static_cast<long long>(rows), rows == 1 ? "" : "s", threads, threads == 1 ? "" : "s",
              llm::quant_active_name(), llm::gemv_active_name());
  std::printf("%-20s %-5s", "shape", "type");
  for (const char* k : kKindNames) std::printf(" %18s", k);
  std::printf(" %9s\n", "q8 / f32");
}

}  // namespace

nlohmann::json bench_kernels(const KernelBenchOptions& o) {
  WM_CHECK(o.rounds >= 1 && !o.rows.empty() && !o.threads.empty(), "--kernels needs rows, threads and rounds");
  std::shared_ptr<const GgufFile> file;
  const ShapeSet set = shapes_of(o.shapes);
  const std::vector<Shape>& shapes = set.shapes;
  WM_CHECK(o.gguf.empty() || o.shapes == "smollm2", "--gguf reads SmolLM2-135M's blocks: it goes with --kernel-shapes smollm2");
  if (!o.gguf.empty()) file = std::make_shared<const GgufFile>(GgufFile::open(o.gguf));
  const llm::QuantActivations saved = llm::quant_activations();
  const int saved_threads = at::get_num_threads();
  nlohmann::json out = nlohmann::json::array();
  for (int64_t rows : o.rows) {
    WM_CHECK(rows >= 1, "--kernel-rows must be positive, got ", rows);
    std::vector<Weights> weights;
    at::manual_seed(o.seed);
    for (const Shape& s : shapes) weights.push_back(make_weights(s, file, rows <= 8));
    for (int threads : o.threads) {
      WM_CHECK(threads >= 1, "--kernel-threads must be positive, got ", threads);
      at::set_num_threads(threads);
      print_header(set.model, rows, threads);
      double step[kKinds] = {};
      for (size_t i = 0; i < weights.size(); ++i) {
        const Shape& s = shapes[i];
        double ms[kKinds];
        bench_shape(s, weights[i], rows, o.rounds, ms);
        std::printf("%-20s %-5s", s.name, ggml_type_name(s.type).c_str());
        for (int k = 0; k < kKinds; ++k) {
          const double gbps = weights[i].bytes[k] / (ms[k] * 1e6);
          std::printf(" %9.4f (%5.1f)", ms[k], gbps);
          step[k] += s.per_step * ms[k];
          out.push_back({{"shape", s.name}, {"rows", rows}, {"threads", threads}, {"kind", kKindNames[k]},
                         {"ms", ms[k]}, {"weight_bytes", weights[i].bytes[k]}, {"gbps", gbps}});
        }
        std::printf(" %8.2fx\n", ms[kF32] / ms[kQ8]);
      }
      std::printf("%-26s", rows == 1 ? "a decode step's products" : "a prompt's products");
      for (int k = 0; k < kKinds; ++k) std::printf(" %9.2f ms%6s", step[k], "");
      std::printf("\n%-26s", "  as tokens/s");
      for (int k = 0; k < kKinds; ++k) std::printf(" %12.1f%7s", 1000.0 * static_cast<double>(rows) / step[k], "");
      std::printf("\n");
      std::fflush(stdout);
    }
  }
  llm::set_quant_activations(saved);
  at::set_num_threads(saved_threads);
  return out;
}

}  // namespace wm::bench
