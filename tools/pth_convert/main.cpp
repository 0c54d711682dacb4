// wm_pth_convert: the state dict of a torch.save checkpoint (.pth) as a safetensors file, read by
// the project's own restricted reader (runtime/pth.h): nothing in the file is executed.
//   wm_pth_convert Wan2.1_VAE.pth vae.safetensors
//   wm_pth_convert clip.pth clip_visual.safetensors --only visual. --dtype bf16
// Tensors are read and written one at a time (memory stays at the largest tensor); the output
// is written under a temporary name and renamed at the end, so a failed run leaves nothing.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "runtime/error.h"
#include "runtime/pth.h"
#include "runtime/safetensors.h"
#include "tools/cli/cleanup.h"
#include "tools/cli/error_text.h"
#include "tools/cli/output_file.h"
#include "tools/cli/progress.h"

// Each program's code is in a namespace of its own: wm_tools, the one binary of the programs,
// compiles several of them in one unit (tools/README.md, "Building").
namespace wm_tool_pth_convert {

namespace {

struct Args {
  std::string in, out;
  std::string prefix, strip_prefix;
  std::vector<std::string> only;
  std::string dtype = "keep";
};

struct Planned {
  size_t index = 0;  // in the .pth's tensors
  std::string name;  // in the output
  at::ScalarType dtype = at::kFloat;
  uint64_t bytes = 0;
};

bool is_float(at::ScalarType t) {
  return t == at::kFloat || t == at::kHalf || t == at::kBFloat16 || t == at::kDouble;
}

at::ScalarType target_dtype(at::ScalarType saved, const std::string& choice) {
  if (choice == "keep" || !is_float(saved)) return saved;
  if (choice == "f32") return at::kFloat;
  if (choice == "f16") return at::kHalf;
  return at::kBFloat16;
}

int run(const Args& a) {
  namespace fs = std::filesystem;
  std::error_code e1, e2, e3;
  const fs::path canon_in = fs::weakly_canonical(a.in, e1), canon_out = fs::weakly_canonical(a.out, e2);
  if (fs::equivalent(a.in, a.out, e3) || (!e1 && !e2 && canon_in == canon_out))
    throw wm::Error(wm::str_cat("refuses to write ", a.out, ": it is the input"));
  wm::cli::OutputFile out(a.out);  // opened first: a bad output path fails before the work

  const wm::PthFile pth = wm::PthFile::open(a.in);
  const auto& infos = pth.tensors();
  std::vector<Planned> plan;
  std::set<std::string> names;
  uint64_t offset = 0;
  nlohmann::json header = nlohmann::json::object();
  for (size_t i = 0; i < infos.size(); ++i) {
    const wm::PthTensorInfo& t = infos[i];
    bool keep = a.only.empty();
    for (const auto& s : a.only) keep = keep || t.name.find(s) != std::string::npos;
    if (!keep) continue;
    Planned p;
    p.index = i;
    p.name = t.name;
    if (!a.strip_prefix.empty() && p.name.compare(0, a.strip_prefix.size(), a.strip_prefix) == 0)
      p.name.erase(0, a.strip_prefix.size());
    p.name = a.prefix + p.name;
    if (p.name.empty()) throw wm::Error(wm::str_cat("tensor '", t.name, "' would have an empty name"));
    if (!names.insert(p.name).second)
      throw wm::Error(wm::str_cat("two tensors would be named '", p.name, "' (check --strip-prefix and --prefix)"));
    p.dtype = target_dtype(t.dtype, a.dtype);
    int64_t numel = 1;
    for (int64_t d : t.shape) numel *= d;
    p.bytes = static_cast<uint64_t>(numel) * c10::elementSize(p.dtype);
    header[p.name] = {{"dtype", wm::safetensors_dtype_name(p.dtype)}, {"shape", t.shape},
                      {"data_offsets", {offset, offset + p.bytes}}};
    offset += p.bytes;
    plan.push_back(std::move(p));
  }
  if (plan.empty()) {
    std::string words;
    for (const auto& s : a.only) words += " '" + s + "'";
    throw wm::Error(infos.empty() ? wm::str_cat(a.in, " holds no tensors")
                                  : wm::str_cat("no tensor name of ", a.in, " contains any of", words));
  }
  header["__metadata__"] = {{"format", "pt"}, {"source", fs::path(a.in).filename().string()}};
  std::string h = header.dump();
  while (h.size() % 8 != 0) h.push_back(' ');

  std::ostream& os = out.stream();
  unsigned char len[8];
  for (int k = 0; k < 8; ++k) len[k] = static_cast<unsigned char>(static_cast<uint64_t>(h.size()) >> (8 * k));
  os.write(reinterpret_cast<const char*>(len), 8);
  os.write(h.data(), static_cast<std::streamsize>(h.size()));
  wm::cli::ProgressLine progress(15);
  const bool show_progress = offset >= (64ull << 20);  // small files are done before a line would help
  const double total_mb = static_cast<double>(offset) / 1e6;
  uint64_t done = 0;
  for (size_t k = 0; k < plan.size(); ++k) {
    const Planned& p = plan[k];
    at::Tensor t = pth.get(p.index).to(p.dtype).contiguous();
    os.write(static_cast<const char*>(t.data_ptr()), static_cast<std::streamsize>(p.bytes));
    if (!os) throw wm::Error(wm::str_cat("writing ", a.out, " failed (disk full?)"));
    done += p.bytes;
    if (show_progress)
      progress.show(k + 1 == plan.size(), "wm_pth_convert: %zu/%zu tensors, %.1f/%.1f MB", k + 1, plan.size(),
                  static_cast<double>(done) / 1e6, total_mb);
  }
  progress.finish();
  out.commit();
  std::printf("wrote %zu of %zu tensors (%.1f MB) to %s%s\n", plan.size(), infos.size(), total_mb, a.out.c_str(),
              pth.state_dict_key().empty() ? "" : wm::str_cat(" (the state dict under '", pth.state_dict_key(), "')").c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "wm_pth_convert: the state dict of a torch.save checkpoint (.pth, zip format) as a safetensors file. "
      "The pickle is read by a restricted interpreter that knows tensors and plain containers only; a file "
      "that names any other Python object is refused, nothing is executed."};
  Args a;
  app.add_option("IN", a.in, "the .pth checkpoint")->required()->check(CLI::ExistingFile);
  app.add_option("OUT", a.out, "the safetensors file to write (replaced if it exists; never the input)")->required();
  app.add_option("--only", a.only,
                 "keep only the tensors whose name contains one of these strings (give IN and OUT first, or "
                 "repeat --only)")
      ->expected(1, -1);
  app.add_option("--strip-prefix", a.strip_prefix, "remove this from the start of the names that have it");
  app.add_option("--prefix", a.prefix, "put this before every name (after --strip-prefix)");
  app.add_option("--dtype", a.dtype, "floating-point tensors as f32, f16 or bf16, or keep as saved (others are kept)")
      ->capture_default_str()
      ->check(CLI::IsMember({"f32", "f16", "bf16", "keep"}));
  CLI11_PARSE(app, argc, argv);
  wm::cli::remove_temporaries_on_signal();
  try {
    return run(a);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "wm_pth_convert: error: %s\n", wm::cli::error_text(e).c_str());
    return 1;
  }
}

}  // namespace wm_tool_pth_convert
