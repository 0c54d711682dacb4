// The prose corpus: the Debian Administrator's Handbook's paragraphs, split by file (prose.h).
#include "tools/llm_tasks/prose.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>

#include "runtime/error.h"
#include "runtime/utf8.h"
#include "tools/llm_tasks/sample.h"

namespace wm::llmtasks {

namespace {

// Decodes the entity starting at s[i] == '&' into out; returns the bytes it took (0: not one).
size_t decode_entity(const std::string& s, size_t i, std::string& out) {
  const size_t semi = s.find(';', i);
  if (semi == std::string::npos || semi - i > 10) return 0;
  const std::string name = s.substr(i + 1, semi - i - 1);
  static const std::map<std::string, std::string> kNamed = {
      {"amp", "&"},       {"lt", "<"},        {"gt", ">"},        {"quot", "\""},     {"apos", "'"},
      {"nbsp", " "},      {"ndash", "\u2013"}, {"mdash", "\u2014"}, {"lsquo", "\u2018"}, {"rsquo", "\u2019"},
      {"ldquo", "\u201C"}, {"rdquo", "\u201D"}, {"hellip", "\u2026"}, {"copy", "\u00A9"}, {"reg", "\u00AE"},
      {"trade", "\u2122"}};
  if (name.size() > 1 && name[0] == '#') {
    const bool hex = name[1] == 'x' || name[1] == 'X';
    const std::string digits = name.substr(hex ? 2 : 1);
    if (digits.empty() || digits.find_first_not_of(hex ? "0123456789abcdefABCDEF" : "0123456789") != std::string::npos)
      return 0;
    const unsigned long cp = std::stoul(digits, nullptr, hex ? 16 : 10);
    if (cp == 0 || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;  // no surrogate as UTF-8
    append_utf8(out, cp == 0xA0 ? 0x20 : static_cast<uint32_t>(cp));
    return semi - i + 1;
  }
  const auto it = kNamed.find(name);
  if (it == kNamed.end()) return 0;
  out += it->second;
  return semi - i + 1;
}

bool is_space(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

// The flat <div class="para"> elements of one HTML page, as text.
std::vector<std::string> page_paragraphs(const std::string& page) {
  static const std::string kOpen = "<div class=\"para\">", kClose = "</div>";
  std::vector<std::string> out;
  for (size_t at = page.find(kOpen); at != std::string::npos; at = page.find(kOpen, at)) {
    const size_t begin = at + kOpen.size();
    const size_t end = page.find(kClose, begin);
    if (end == std::string::npos) break;
    at = end;
    const std::string inner = page.substr(begin, end - begin);
    if (inner.find("<div") != std::string::npos || inner.find("<pre") != std::string::npos) continue;
    std::string text = html_to_text(inner);
    size_t words = 0;
    std::istringstream ws(text);
    for (std::string w; ws >> w;) ++words;
    if (words >= 8) out.push_back(std::move(text));
  }
  return out;
}

}  // namespace

ProseSplit prose_split_of(uint64_t seed) {
  return is_heldout(seed) && (seed & ~kHeldoutBit) >= kTestFirst ? ProseSplit::Test : ProseSplit::Dev;
}

const char* prose_split_name(ProseSplit split) { return split == ProseSplit::Test ? "test" : "dev"; }

std::string html_to_text(const std::string& html) {
  std::string raw;
  raw.reserve(html.size());
  for (size_t i = 0; i < html.size();) {
    if (html[i] == '<') {
      const size_t close = html.find('>', i);
      if (close == std::string::npos) break;
      i = close + 1;
      continue;
    }
    if (html[i] == '&') {
      const size_t took = decode_entity(html, i, raw);
      if (took > 0) {
        i += took;
        continue;
      }
    }
    raw += html[i++];
  }
  std::string out;
  bool space = false;
  for (unsigned char c : raw) {
    if (is_space(c)) {
      space = !out.empty();
      continue;
    }
    if (space) out += ' ';
    space = false;
    out += static_cast<char>(c);
  }
  return out;
}

ProseCorpus::ProseCorpus(std::vector<Document> documents, std::string source) : source_(std::move(source)) {
  std::map<std::string, int> seen;
  for (const Document& d : documents)
    for (const std::string& p : d.paragraphs) ++seen[p];
  for (size_t i = 0; i < documents.size(); ++i) {
    const int split = static_cast<int>(i % 2);
    documents_[split].push_back(documents[i].name);
    for (const std::string& p : documents[i].paragraphs)
      if (seen[p] == 1) paragraphs_[split].push_back(p);
  }
  for (ProseSplit s : {ProseSplit::Dev, ProseSplit::Test})
    if (paragraphs(s).empty())
      throw Error(str_cat("prose corpus ", source_, ": no paragraphs for the ", prose_split_name(s), " split (",
                          documents.size(), " documents)"));
}

const std::vector<std::string>& ProseCorpus::paragraphs(ProseSplit split) const {
  return paragraphs_[split == ProseSplit::Test ? 1 : 0];
}

const std::vector<std::string>& ProseCorpus::documents(ProseSplit split) const {
  return documents_[split == ProseSplit::Test ? 1 : 0];
}

ProseCorpus ProseCorpus::load_html_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::vector<std::string> names;
  if (fs::is_directory(dir, ec))
    for (const auto& e : fs::directory_iterator(dir, ec))
      if (e.is_regular_file() && e.path().extension() == ".html") names.push_back(e.path().filename().string());
  if (names.empty()) throw Error(str_cat("prose corpus: no .html files in ", dir));
  std::sort(names.begin(), names.end());
  // Bounded: the folder is outside the project (a package's, or $WM_PROSE_DIR).
  constexpr size_t kMaxFiles = 20000;
  constexpr uintmax_t kMaxFileBytes = uintmax_t{16} << 20;
  if (names.size() > kMaxFiles)
    throw Error(str_cat("prose corpus: ", dir, " holds ", names.size(), " .html files, more than ", kMaxFiles));
  std::vector<Document> docs;
  for (const std::string& n : names) {
    const fs::path path = fs::path(dir) / n;
    const uintmax_t bytes = fs::file_size(path, ec);
    if (ec || bytes > kMaxFileBytes)
      throw Error(str_cat("prose corpus: ", path.string(), ec ? " cannot be sized" : " is larger than 16 MiB"));
    std::ifstream in(path, std::ios::binary);
    if (!in) throw Error(str_cat("prose corpus: cannot read ", dir, "/", n));
    std::ostringstream page;
    page << in.rdbuf();
    docs.push_back({n, page_paragraphs(page.str())});
  }
  return ProseCorpus(std::move(docs), dir);
}

std::string normalize_answer(const std::string& text) {
  std::string out;
  bool gap = false;
  for (unsigned char c : text) {
    if (std::isalnum(c) && c < 0x80) {
      if (gap && !out.empty()) out += ' ';
      gap = false;
      out += static_cast<char>(std::tolower(c));
    } else {
      gap = true;
    }
  }
  return out;
}

bool answer_in_reply(const std::string& reply, const std::string& answer) {
  const std::string a = normalize_answer(answer);
  if (a.empty()) return false;
  const std::string r = " " + normalize_answer(reply) + " ";
  return r.find(" " + a + " ") != std::string::npos;
}

std::string default_prose_dir() {
  const char* env = std::getenv("WM_PROSE_DIR");
  return env && *env ? env : "/usr/share/doc/debian-handbook/html/en-US";
}

std::shared_ptr<const ProseCorpus> default_prose_corpus() {
  static std::mutex mu;
  static std::shared_ptr<const ProseCorpus> corpus;
  std::lock_guard<std::mutex> lock(mu);
  if (!corpus) {
    const std::string dir = default_prose_dir();
    if (!std::filesystem::is_directory(dir))
      throw Error(str_cat("the prose tasks read the Debian Administrator's Handbook from ", dir,
                          ", which is missing: install Debian's package debian-handbook (tools/setup.sh does) or "
                          "set WM_PROSE_DIR to a folder of its HTML files"));
    corpus = std::make_shared<const ProseCorpus>(ProseCorpus::load_html_dir(dir));
  }
  return corpus;
}

}  // namespace wm::llmtasks
