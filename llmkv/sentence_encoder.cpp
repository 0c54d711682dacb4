#include "llmkv/sentence_encoder.h"

#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>

#include "llmkv/json_file.h"
#include "runtime/error.h"

namespace wm::llm {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;


// sentence_bert_config.json's max_seq_length, or 0 when the file or the field is absent.
int64_t sentence_bert_max_length(const std::string& folder) {
  const std::string path = (fs::path(folder) / "sentence_bert_config.json").string();
  if (!fs::exists(path)) return 0;
  const json j = read_json_file(path);
  auto it = j.find("max_seq_length");
  if (it == j.end() || it->is_null()) return 0;
  if (!it->is_number_integer() || it->get<int64_t>() < 1)
    throw Error(str_cat(path, ": field 'max_seq_length': must be a positive integer, got ", it->dump()));
  return it->get<int64_t>();
}

// A sentence-transformers pooling config, when the folder has one, must be mean pooling alone.
void check_pooling(const std::string& folder) {
  const std::string path = (fs::path(folder) / "1_Pooling" / "config.json").string();
  if (!fs::exists(path)) return;
  const json j = read_json_file(path);
  if (!j.is_object()) throw Error(str_cat(path, ": expected a JSON object"));
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key().rfind("pooling_mode_", 0) != 0 || !it->is_boolean()) continue;
    const bool want = it.key() == "pooling_mode_mean_tokens";
    if (it->get<bool>() != want)
      throw Error(str_cat(path, ": field '", it.key(), "' is ", it->dump(), "; this encoder pools by mean only"));
  }
}

}  // namespace

SentenceEncoder SentenceEncoder::load(const std::string& folder, at::Device device, int64_t max_length) {
  if (!fs::is_directory(folder)) throw Error(str_cat(folder, ": not a folder"));
  auto file = [&](const char* name) {
    const std::string p = (fs::path(folder) / name).string();
    if (!fs::exists(p)) throw Error(str_cat(folder, ": no ", name));
    return p;
  };
  const BertConfig config = BertConfig::load(file("config.json"));
  const std::string weights = (fs::path(folder) / "model.safetensors").string();
  if (!fs::exists(weights)) {
    const bool other = fs::exists(fs::path(folder) / "pytorch_model.bin") ||
                       fs::exists(fs::path(folder) / "model.safetensors.index.json");
    throw Error(str_cat(folder, ": no model.safetensors",
                        other ? " (pytorch_model.bin and sharded checkpoints are not read; save one model.safetensors)" : ""));
  }
  WordPieceTokenizer tokenizer = WordPieceTokenizer::load(file("tokenizer.json"));
  if (tokenizer.vocab_size() > config.vocab_size)
    throw Error(str_cat(tokenizer.origin(), ": ids up to ", tokenizer.vocab_size() - 1, " but the model's vocab_size is ",
                        config.vocab_size));
  for (int64_t t : tokenizer.encode("", true).type_ids)
    if (t >= config.type_vocab_size)
      throw Error(str_cat(tokenizer.origin(), ": the post-processor gives token type ", t, " but the model's type_vocab_size is ",
                          config.type_vocab_size));
  check_pooling(folder);

  if (max_length == 0) max_length = sentence_bert_max_length(folder);
  if (max_length == 0) max_length = config.max_position_embeddings;
  if (max_length < 1 || max_length > config.max_position_embeddings)
    throw Error(str_cat(folder, ": max_length ", max_length, " must be in [1, ", config.max_position_embeddings,
                        "] (max_position_embeddings)"));
  if (max_length <= tokenizer.n_template_tokens())
    throw Error(str_cat(folder, ": max_length ", max_length, " leaves no room beside the ", tokenizer.n_template_tokens(),
                        " template tokens"));

  BertModel model(config);
  load_bert_weights(*model, weights);
  model->to(device);
  model->eval();
  return SentenceEncoder(std::move(model), std::move(tokenizer), max_length);
}

void SentenceEncoder::set_batch_size(int64_t n) {
  WM_CHECK(n >= 1, "batch size must be >= 1, got ", n);
  batch_size_ = n;
}

at::Tensor SentenceEncoder::embed_ids(const at::Tensor& ids, const at::Tensor& type_ids, const at::Tensor& mask) const {
  at::NoGradGuard no_grad;
  const at::Tensor h = model_.ptr()->forward(ids, type_ids, mask).to(at::kFloat);  // [B, T, dim]
  const at::Tensor m = mask.to(h.device()).ne(0).to(at::kFloat).unsqueeze(-1);    // [B, T, 1]
  const at::Tensor mean = (h * m).sum(1) / m.sum(1).clamp_min(1e-9);              // as sentence-transformers
  return mean / mean.norm(2, 1, true).clamp_min(1e-12);                            // as torch's F.normalize
}

at::Tensor SentenceEncoder::embed(const std::vector<std::string>& texts) const {
  const auto n = static_cast<int64_t>(texts.size());
  const at::Device dev = device();
  at::Tensor out = at::empty({n, dim()}, at::TensorOptions().dtype(at::kFloat).device(dev));
  if (n == 0) return out;
  std::vector<WordPieceEncoding> enc;
  enc.reserve(texts.size());
  for (const auto& t : texts) enc.push_back(tokenizer_.encode(t, true, max_length_));
  std::vector<int64_t> order(n);  // longest first, so that a batch pads little
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return enc[a].ids.size() > enc[b].ids.size(); });

  const int64_t pad = tokenizer_.pad_id();
  for (int64_t b0 = 0, rows = 0; b0 < n; b0 += rows) {
    // A batch ends at batch_size texts, or before a text less than half as long as its first:
    // padding then costs at most as much as the tokens themselves.
    const auto longest = static_cast<int64_t>(enc[order[b0]].ids.size());
    rows = 1;
    while (b0 + rows < n && rows < batch_size_ && 2 * static_cast<int64_t>(enc[order[b0 + rows]].ids.size()) >= longest) ++rows;
    const int64_t T = longest;
    at::Tensor ids = at::full({rows, T}, pad, at::kLong), types = at::zeros({rows, T}, at::kLong),
               mask = at::zeros({rows, T}, at::kLong);
    auto ia = ids.accessor<int64_t, 2>(), ta = types.accessor<int64_t, 2>(), ma = mask.accessor<int64_t, 2>();
    for (int64_t r = 0; r < rows; ++r) {
      const WordPieceEncoding& e = enc[order[b0 + r]];
      for (size_t j = 0; j < e.ids.size(); ++j) {
        ia[r][j] = e.ids[j];
        ta[r][j] = e.type_ids[j];
        ma[r][j] = 1;
      }
    }
    const at::Tensor rows_out = embed_ids(ids, types, mask);
    const at::Tensor where = at::tensor(std::vector<int64_t>(order.begin() + b0, order.begin() + b0 + rows), at::kLong);
    out.index_copy_(0, where.to(dev), rows_out);
  }
  return out;
}

TextEmbedder sentence_embedder(std::shared_ptr<const SentenceEncoder> encoder, Tokenizer decoder_tokenizer) {
  WM_CHECK(encoder != nullptr, "sentence_embedder needs an encoder");
  return [encoder = std::move(encoder), tok = std::move(decoder_tokenizer)](const std::vector<std::vector<int64_t>>& ids) {
    std::vector<std::string> texts;
    texts.reserve(ids.size());
    for (const auto& t : ids) texts.push_back(tok.decode(t, /*skip_special=*/true));
    return encoder->embed(texts).to(at::kCPU);
  };
}

}  // namespace wm::llm
