// A C interface to libsentencepiece, built as its own loadable module (wm_sentencepiece) and
// opened by dit/umt5_tokenizer.cpp with dlopen(RTLD_LOCAL | RTLD_DEEPBIND).
//
// Why: Debian's libsentencepiece.so.0 carries its own copy of protobuf-lite and exports its
// symbols; linked into a program beside libtorch (which loads the system libprotobuf through
// ONNX) the two copies interpose and the program crashes while libprotobuf initialises, before
// main. Opened privately with deep binding, SentencePiece resolves to its own copy and the
// program's libprotobuf never sees it.
//
// Only C types cross the boundary; errors come back as a message in the caller's buffer.
#include <sentencepiece_processor.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

namespace {
void set_error(char* err, size_t cap, const std::string& msg) {
  if (err == nullptr || cap == 0) return;
  const size_t n = std::min(cap - 1, msg.size());
  std::memcpy(err, msg.data(), n);
  err[n] = '\0';
}
}  // namespace

extern "C" {

// A processor for the model file, or null with the reason in err.
__attribute__((visibility("default"))) void* wm_spm_load(const char* path, char* err, size_t cap) {
  auto* sp = new sentencepiece::SentencePieceProcessor();
  const auto st = sp->Load(path);
  if (!st.ok()) {
    set_error(err, cap, st.ToString());
    delete sp;
    return nullptr;
  }
  return sp;
}

__attribute__((visibility("default"))) void wm_spm_free(void* h) {
  delete static_cast<sentencepiece::SentencePieceProcessor*>(h);
}

// Encodes text[0, len) into ids; writes at most cap of them to out and returns how many there are
// (call again with a larger buffer when that exceeds cap), or -1 with the reason in err.
__attribute__((visibility("default"))) long wm_spm_encode(void* h, const char* text, size_t len, int* out,
                                                          size_t cap, char* err, size_t err_cap) {
  std::vector<int> ids;
  const auto st = static_cast<sentencepiece::SentencePieceProcessor*>(h)->Encode(std::string(text, len), &ids);
  if (!st.ok()) {
    set_error(err, err_cap, st.ToString());
    return -1;
  }
  std::copy_n(ids.begin(), std::min(cap, ids.size()), out);
  return static_cast<long>(ids.size());
}

// pad, EOS, unknown ids (-1 when the model has none) and the vocabulary size.
__attribute__((visibility("default"))) void wm_spm_ids(void* h, int* pad, int* eos, int* unk, int* size) {
  const auto* sp = static_cast<sentencepiece::SentencePieceProcessor*>(h);
  *pad = sp->pad_id();
  *eos = sp->eos_id();
  *unk = sp->unk_id();
  *size = sp->GetPieceSize();
}

// The piece of id (valid while the processor lives).
__attribute__((visibility("default"))) const char* wm_spm_piece(void* h, int id) {
  return static_cast<sentencepiece::SentencePieceProcessor*>(h)->IdToPiece(id).c_str();
}

}  // extern "C"
