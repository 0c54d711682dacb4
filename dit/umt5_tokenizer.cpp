#include "dit/umt5_tokenizer.h"

#include <algorithm>
#include <utility>

#include "dit/umt5_text.h"
#include "runtime/build_paths.h"
#include "runtime/error.h"

#if WM_HAVE_SENTENCEPIECE
#include <dlfcn.h>

#include <cstdlib>
#endif

namespace wm::dit {

#if WM_HAVE_SENTENCEPIECE

namespace umt5_spm {

// libsentencepiece through the wm_sentencepiece module (dit/sentencepiece_shim.cpp), opened
// privately with deep binding: Debian's libsentencepiece exports a protobuf copy of its own that
// would interpose on libtorch's libprotobuf if the program linked it.
struct SpmModule {
  void* (*load)(const char*, char*, size_t);
  void (*free)(void*);
  long (*encode)(void*, const char*, size_t, int*, size_t, char*, size_t);
  void (*ids)(void*, int*, int*, int*, int*);
  const char* (*piece)(void*, int);
};

// Opens the module named by $WM_SENTENCEPIECE_MODULE, else the one built beside this library.
const SpmModule* open_spm_module() {
  const char* env = std::getenv("WM_SENTENCEPIECE_MODULE");
  const std::string path = env != nullptr && *env != '\0' ? env : WM_SENTENCEPIECE_MODULE;
  void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
  if (lib == nullptr)
    throw Error(str_cat("Umt5Tokenizer: cannot open the SentencePiece module ", path, ": ", dlerror(),
                        " (set WM_SENTENCEPIECE_MODULE to libwm_sentencepiece.so)"));
  auto sym = [&](const char* name) {
    void* p = dlsym(lib, name);
    if (p == nullptr) throw Error(str_cat("Umt5Tokenizer: ", path, " lacks ", name));
    return p;
  };
  auto* m = new SpmModule;
  m->load = reinterpret_cast<decltype(m->load)>(sym("wm_spm_load"));
  m->free = reinterpret_cast<decltype(m->free)>(sym("wm_spm_free"));
  m->encode = reinterpret_cast<decltype(m->encode)>(sym("wm_spm_encode"));
  m->ids = reinterpret_cast<decltype(m->ids)>(sym("wm_spm_ids"));
  m->piece = reinterpret_cast<decltype(m->piece)>(sym("wm_spm_piece"));
  return m;
}

// Opened once (a failed open throws and is retried by the next call).
const SpmModule& spm_module() {
  static const SpmModule* mod = open_spm_module();
  return *mod;
}

}  // namespace umt5_spm

bool umt5_tokenizer_available() { return true; }

struct Umt5Tokenizer::Impl {
  const umt5_spm::SpmModule* mod = nullptr;
  void* sp = nullptr;
  std::string path;
  int pad = -1, eos = -1, unk = -1, size = 0;
  // The added tokens transformers registers for a T5 tokenizer: pad, EOS, unknown (piece, id).
  std::vector<std::pair<std::string, int>> specials;

  ~Impl() {
    if (sp != nullptr) mod->free(sp);
  }

  // SentencePiece's ids of a text holding no special-token string.
  void encode_plain(const std::string& text, std::vector<int64_t>& out) const {
    std::vector<int> ids(text.size() + 8);
    char err[512];
    long n = mod->encode(sp, text.data(), text.size(), ids.data(), ids.size(), err, sizeof err);
    if (n > static_cast<long>(ids.size())) {
      ids.resize(static_cast<size_t>(n));
      n = mod->encode(sp, text.data(), text.size(), ids.data(), ids.size(), err, sizeof err);
    }
    if (n < 0) throw Error(str_cat("Umt5Tokenizer: ", path, ": encoding failed: ", err));
    out.insert(out.end(), ids.begin(), ids.begin() + n);
  }
};

Umt5Tokenizer::Umt5Tokenizer(const std::string& spiece_model) : impl_(std::make_unique<Impl>()) {
  impl_->mod = &umt5_spm::spm_module();
  impl_->path = spiece_model;
  char err[512];
  impl_->sp = impl_->mod->load(spiece_model.c_str(), err, sizeof err);
  if (impl_->sp == nullptr)
    throw Error(str_cat("Umt5Tokenizer: ", spiece_model, ": cannot load the SentencePiece model: ", err));
  impl_->mod->ids(impl_->sp, &impl_->pad, &impl_->eos, &impl_->unk, &impl_->size);
  if (impl_->eos < 0 || impl_->pad < 0)
    throw Error(str_cat("Umt5Tokenizer: ", spiece_model, ": the model has no ", impl_->eos < 0 ? "EOS" : "pad",
                        " piece (T5's have pad 0, EOS 1)"));
  for (int id : {impl_->pad, impl_->eos, impl_->unk})
    if (id >= 0) impl_->specials.emplace_back(impl_->mod->piece(impl_->sp, id), id);
}

Umt5Tokenizer::~Umt5Tokenizer() = default;
Umt5Tokenizer::Umt5Tokenizer(Umt5Tokenizer&&) noexcept = default;
Umt5Tokenizer& Umt5Tokenizer::operator=(Umt5Tokenizer&&) noexcept = default;

std::vector<int64_t> Umt5Tokenizer::encode(const std::string& text, bool clean) const {
  const std::string s = clean ? umt5_clean_whitespace(text) : text;
  std::vector<int64_t> ids;
  size_t pos = 0, plain = 0;
  while (pos < s.size()) {
    // The longest special-token string starting here (transformers matches leftmost-longest).
    const std::pair<std::string, int>* best = nullptr;
    for (const auto& sp : impl_->specials)
      if (!sp.first.empty() && s.compare(pos, sp.first.size(), sp.first) == 0 &&
          (best == nullptr || sp.first.size() > best->first.size()))
        best = &sp;
    if (best == nullptr) {
      ++pos;
      continue;
    }
    impl_->encode_plain(s.substr(plain, pos - plain), ids);
    ids.push_back(best->second);
    pos += best->first.size();
    plain = pos;
  }
  impl_->encode_plain(s.substr(plain), ids);
  ids.push_back(impl_->eos);
  return ids;
}

int64_t Umt5Tokenizer::pad_id() const { return impl_->pad; }
int64_t Umt5Tokenizer::eos_id() const { return impl_->eos; }
int64_t Umt5Tokenizer::vocab_size() const { return impl_->size; }

#else  // WM_HAVE_SENTENCEPIECE

bool umt5_tokenizer_available() { return false; }

// Without SentencePiece no tokenizer can be constructed; the members below are never reached.
struct Umt5Tokenizer::Impl {};

Umt5Tokenizer::Umt5Tokenizer(const std::string& spiece_model) {
  throw Error(str_cat("Umt5Tokenizer: ", spiece_model,
                      ": this build has no SentencePiece (install libsentencepiece-dev: tools/setup.sh, "
                      "then reconfigure)"));
}
Umt5Tokenizer::~Umt5Tokenizer() = default;
Umt5Tokenizer::Umt5Tokenizer(Umt5Tokenizer&&) noexcept = default;
Umt5Tokenizer& Umt5Tokenizer::operator=(Umt5Tokenizer&&) noexcept = default;
std::vector<int64_t> Umt5Tokenizer::encode(const std::string&, bool) const { return {}; }
int64_t Umt5Tokenizer::pad_id() const { return 0; }
int64_t Umt5Tokenizer::eos_id() const { return 1; }
int64_t Umt5Tokenizer::vocab_size() const { return 0; }

#endif  // WM_HAVE_SENTENCEPIECE

Umt5Tokenizer::Batch Umt5Tokenizer::operator()(const std::vector<std::string>& texts, int64_t text_len) const {
  WM_CHECK(text_len >= 1, "text_len must be at least 1, got ", text_len);
  const auto b = static_cast<int64_t>(texts.size());
  Batch out{at::full({b, text_len}, pad_id(), at::kLong), at::zeros({b, text_len}, at::kLong)};
  auto ids = out.ids.accessor<int64_t, 2>();
  auto mask = out.mask.accessor<int64_t, 2>();
  for (int64_t i = 0; i < b; ++i) {
    std::vector<int64_t> t = encode(texts[static_cast<size_t>(i)]);
    if (static_cast<int64_t>(t.size()) > text_len) {
      t.resize(static_cast<size_t>(text_len - 1));
      t.push_back(eos_id());
    }
    for (size_t j = 0; j < t.size(); ++j) {
      ids[i][static_cast<int64_t>(j)] = t[j];
      mask[i][static_cast<int64_t>(j)] = 1;
    }
  }
  return out;
}

}  // namespace wm::dit
