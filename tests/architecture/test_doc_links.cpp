// Every relative link in the project's Markdown pages resolves: the file or folder it names
// exists inside the tree, and a `#anchor` into a .md page names one of its headings, by GitHub's
// rule for heading anchors (lowercase; spaces to '-'; punctuation other than '-' and '_'
// dropped; a repeated heading gets -1, -2, ...). Pages are found by walking the source tree
// (WM_SOURCE_DIR), skipping build*/ at the top, out/ and runs/ (ignored outputs) and hidden
// folders (.git, .gl, .whl, .dev, ...). Links inside code (fenced blocks, `spans`) are text,
// not links; links with a scheme (https:, mailto:) are not checked.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <system_error>
#include <vector>

#include "runtime/build_paths.h"
#include "tests/temp_dir.h"

namespace {

namespace fs = std::filesystem;

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    lines.push_back(line);
  }
  return lines;
}

// A fence line (``` or ~~~, any indent): its character and length, or {0, 0}.
std::pair<char, size_t> fence_of(const std::string& line) {
  size_t i = line.find_first_not_of(" \t");
  if (i == std::string::npos || (line[i] != '`' && line[i] != '~')) return {0, 0};
  const char c = line[i];
  size_t n = 0;
  while (i + n < line.size() && line[i + n] == c) ++n;
  if (n < 3) return {0, 0};
  return {c, n};
}

// The lines of a page outside fenced code blocks (the others come back empty, so that line
// numbers stay those of the file).
std::vector<std::string> prose_lines(const std::string& text) {
  std::vector<std::string> lines = split_lines(text);
  std::pair<char, size_t> open{0, 0};
  for (std::string& line : lines) {
    const auto f = fence_of(line);
    if (open.first == 0) {
      if (f.first != 0) {
        open = f;
        line.clear();
      }
    } else {
      // A closing fence: the same character, at least as long, nothing after it.
      if (f.first == open.first && f.second >= open.second &&
          line.find_first_not_of(std::string(" \t") + f.first) == std::string::npos)
        open = {0, 0};
      line.clear();
    }
  }
  return lines;
}

// The line with its code spans removed (a run of N backticks up to the next run of exactly N);
// an unmatched run stays as text.
std::string without_code_spans(const std::string& line) {
  std::string out;
  size_t i = 0;
  while (i < line.size()) {
    if (line[i] != '`') {
      out += line[i++];
      continue;
    }
    size_t n = 0;
    while (i + n < line.size() && line[i + n] == '`') ++n;
    size_t j = i + n, close = std::string::npos;
    while (j < line.size()) {
      if (line[j] != '`') {
        ++j;
        continue;
      }
      size_t m = 0;
      while (j + m < line.size() && line[j + m] == '`') ++m;
      if (m == n) {
        close = j;
        break;
      }
      j += m;
    }
    if (close == std::string::npos) {
      out.append(line, i, n);
      i += n;
    } else {
      out += ' ';
      i = close + n;
    }
  }
  return out;
}

std::string percent_decoded(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && std::isxdigit(static_cast<unsigned char>(s[i + 1])) &&
        std::isxdigit(static_cast<unsigned char>(s[i + 2]))) {
      out += static_cast<char>(std::stoi(s.substr(i + 1, 2), nullptr, 16));
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

// A few HTML entities as text (`&#124;` in a heading is a '|').
std::string entities_decoded(const std::string& s) {
  static const std::regex numeric("&#([0-9]+);");
  std::string out;
  std::sregex_iterator it(s.begin(), s.end(), numeric), end;
  size_t last = 0;
  for (; it != end; ++it) {
    out.append(s, last, it->position() - last);
    const long cp = std::stol((*it)[1].str());
    out += cp < 128 ? std::string(1, static_cast<char>(cp)) : std::string("?");
    last = it->position() + it->length();
  }
  out.append(s, last, std::string::npos);
  for (const auto& [name, ch] : std::vector<std::pair<std::string, std::string>>{
           {"&lt;", "<"}, {"&gt;", ">"}, {"&quot;", "\""}, {"&nbsp;", " "}, {"&amp;", "&"}}) {
    for (size_t p = out.find(name); p != std::string::npos; p = out.find(name, p + ch.size()))
      out.replace(p, name.size(), ch);
  }
  return out;
}

// GitHub's anchor for a heading's Markdown text: the rendered text (links and images by their
// text, code spans by their content, HTML tags gone), lowercased, every character that is not a
// letter, digit, '-', '_' or space dropped, then each space a '-'. Bytes of multi-byte UTF-8
// characters are kept (GitHub keeps letters of every script).
std::string github_slug(const std::string& heading) {
  static const std::regex link(R"(!?\[([^\]]*)\]\([^)]*\))");
  static const std::regex tag(R"(<[^>]*>)");
  std::string text = std::regex_replace(heading, link, "$1");
  text = std::regex_replace(text, tag, "");
  text = entities_decoded(text);
  std::string slug;
  for (const char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    if (c >= 0x80 || std::isalnum(c) || c == '-' || c == '_')
      slug += static_cast<char>(std::tolower(c));
    else if (c == ' ')
      slug += '-';
  }
  return slug;
}

// Every anchor a page offers: its headings (ATX `#`, and setext: a line under a line of = or -)
// by GitHub's slug with -1, -2, ... for repeats, and `id`/`name` attributes of HTML tags.
std::set<std::string> anchors_of(const std::string& text) {
  static const std::regex atx(R"(^ {0,3}#{1,6}(?:[ \t]+(.*?))?[ \t]*$)");
  static const std::regex setext(R"(^ {0,3}(=+|-+)[ \t]*$)");
  static const std::regex html_id(R"re(<[^>]*\b(?:id|name)="([^"]+)")re");
  std::set<std::string> out;
  std::map<std::string, int> seen;
  auto add = [&](std::string heading) {
    // Closing #s of an ATX heading are not part of its text.
    static const std::regex closing(R"([ \t]+#+$)");
    heading = std::regex_replace(heading, closing, "");
    heading.erase(0, heading.find_first_not_of(" \t"));
    heading.erase(heading.find_last_not_of(" \t") + 1);
    const std::string base = github_slug(heading);
    const int n = seen[base]++;
    out.insert(n == 0 ? base : base + "-" + std::to_string(n));
  };
  const std::vector<std::string> lines = prose_lines(text);
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string& line = lines[i];
    std::smatch m;
    if (std::regex_match(line, m, atx)) {
      // A code span's content counts as text in a heading's anchor.
      std::string h = m[1].str();
      h.erase(std::remove(h.begin(), h.end(), '`'), h.end());
      add(h);
    } else if (i > 0 && std::regex_match(line, setext) && !lines[i - 1].empty() &&
               lines[i - 1].find_first_not_of(" \t") != std::string::npos &&
               lines[i - 1].find('|') == std::string::npos && !std::regex_match(lines[i - 1], atx)) {
      std::string h = lines[i - 1];
      h.erase(std::remove(h.begin(), h.end(), '`'), h.end());
      add(h);
    }
    for (std::sregex_iterator it(line.begin(), line.end(), html_id), end; it != end; ++it)
      out.insert((*it)[1].str());
  }
  return out;
}

struct Link {
  int line = 0;
  std::string target;  // as written
};

// The link targets of a page outside code: inline links and images `[text](target "title")`,
// `<target>` included, reference definitions `[name]: target`, and HTML `href`/`src`.
std::vector<Link> links_of(const std::string& text) {
  static const std::regex reference(R"(^ {0,3}\[[^\]]+\]:[ \t]*<?([^ \t>]+)>?)");
  static const std::regex html(R"re(\b(?:href|src)="([^"]+)")re");
  std::vector<Link> out;
  const std::vector<std::string> lines = prose_lines(text);
  for (size_t i = 0; i < lines.size(); ++i) {
    const int ln = static_cast<int>(i) + 1;
    const std::string line = without_code_spans(lines[i]);
    std::smatch m;
    if (std::regex_search(line, m, reference)) out.push_back({ln, m[1].str()});
    for (std::sregex_iterator it(line.begin(), line.end(), html), end; it != end; ++it)
      out.push_back({ln, (*it)[1].str()});
    for (size_t p = line.find("]("); p != std::string::npos; p = line.find("](", p + 2)) {
      size_t j = p + 2;
      while (j < line.size() && (line[j] == ' ' || line[j] == '\t')) ++j;
      std::string target;
      if (j < line.size() && line[j] == '<') {
        const size_t close = line.find('>', j);
        if (close == std::string::npos) continue;
        target = line.substr(j + 1, close - j - 1);
      } else {
        // Up to whitespace or the ')' that closes the link (parentheses inside balance).
        int depth = 0;
        for (; j < line.size(); ++j) {
          const char c = line[j];
          if (c == ' ' || c == '\t') break;
          if (c == '(') ++depth;
          if (c == ')' && depth-- == 0) break;
          target += c;
        }
      }
      if (!target.empty()) out.push_back({ln, target});
    }
  }
  return out;
}

bool is_external(const std::string& target) {
  static const std::regex scheme(R"(^[A-Za-z][A-Za-z0-9+.-]*:)");
  return std::regex_search(target, scheme) || target.rfind("//", 0) == 0;
}

// The Markdown pages of the tree, sorted.
std::vector<fs::path> markdown_files(const fs::path& root) {
  std::vector<fs::path> out;
  fs::recursive_directory_iterator it(root), end;
  for (; it != end; ++it) {
    const fs::path& p = it->path();
    const std::string name = p.filename().string();
    if (it->is_directory()) {
      const bool top = it.depth() == 0;
      if (name.rfind('.', 0) == 0 || (top && (name.rfind("build", 0) == 0 || name == "out" || name == "runs")))
        it.disable_recursion_pending();
      continue;
    }
    if (it->is_regular_file() && p.extension() == ".md") out.push_back(p);
  }
  std::sort(out.begin(), out.end());
  return out;
}

struct Broken {
  std::string file;  // relative to the root
  int line = 0;
  std::string target;
  std::string why;
};

struct Check {
  std::vector<Broken> broken;
  size_t pages = 0;
  size_t links = 0;    // relative links checked
  size_t anchors = 0;  // of them, with an anchor into a .md page
};

Check check_links(const fs::path& root_in) {
  const fs::path root = fs::weakly_canonical(root_in);
  Check out;
  std::map<fs::path, std::set<std::string>> anchor_cache;
  auto anchors = [&](const fs::path& page) -> const std::set<std::string>& {
    auto it = anchor_cache.find(page);
    if (it == anchor_cache.end()) it = anchor_cache.emplace(page, anchors_of(read_text(page))).first;
    return it->second;
  };
  for (const fs::path& page : markdown_files(root)) {
    ++out.pages;
    const std::string rel_page = page.lexically_relative(root).string();
    for (const Link& link : links_of(read_text(page))) {
      if (is_external(link.target)) continue;
      ++out.links;
      const size_t hash = link.target.find('#');
      const std::string path_part = percent_decoded(link.target.substr(0, hash));
      const std::string anchor = hash == std::string::npos ? "" : percent_decoded(link.target.substr(hash + 1));
      fs::path target = page;
      if (!path_part.empty()) {
        target = path_part[0] == '/' ? root / path_part.substr(1) : page.parent_path() / path_part;
        target = target.lexically_normal();
        const fs::path rel = target.lexically_relative(root);
        if (rel.empty() || *rel.begin() == "..") {
          out.broken.push_back({rel_page, link.line, link.target, "leads outside the repository"});
          continue;
        }
        std::error_code ec;
        if (!fs::exists(target, ec)) {
          out.broken.push_back({rel_page, link.line, link.target, "no such file or folder"});
          continue;
        }
      }
      if (hash == std::string::npos || target.extension() != ".md" || !fs::is_regular_file(target)) continue;
      ++out.anchors;
      if (!anchors(target).count(anchor))
        out.broken.push_back({rel_page, link.line, link.target,
                              "no heading with anchor '" + anchor + "' in " + target.lexically_relative(root).string()});
    }
  }
  return out;
}

std::string describe(const std::vector<Broken>& bs) {
  std::string s;
  for (const Broken& b : bs) s += b.file + ":" + std::to_string(b.line) + ": (" + b.target + "): " + b.why + "\n";
  return s;
}

TEST(DocLinks, GitHubSlugs) {
  EXPECT_EQ(github_slug("Building for a GPU"), "building-for-a-gpu");
  EXPECT_EQ(github_slug("The KV-memory core (runtime/)"), "the-kv-memory-core-runtime");
  EXPECT_EQ(github_slug("wm_bench_core"), "wm_bench_core");
  EXPECT_EQ(github_slug("What it does (measured)"), "what-it-does-measured");
  EXPECT_EQ(github_slug("Memory policies for text (llmkv/text_policy.h, llmkv/policies/)"),
            "memory-policies-for-text-llmkvtext_policyh-llmkvpolicies");
  EXPECT_EQ(github_slug("wm_make_suite, wm_render_world"), "wm_make_suite-wm_render_world");
  EXPECT_EQ(github_slug("See [the tools](tools/README.md) & more"), "see-the-tools--more");
  EXPECT_EQ(github_slug("max &#124;flow&#124;"), "max-flow");
  // Repeated headings, code spans and setext headings.
  const std::set<std::string> a = anchors_of(
      "# Title\n\n## Measured\n\n### Measured\n\n## The `--full` run\n\nSetext\n======\n\n```\n# not a heading\n```\n"
      "<a id=\"custom\"></a>\n");
  EXPECT_EQ(a, (std::set<std::string>{"title", "measured", "measured-1", "the---full-run", "setext", "custom"}));
}

TEST(DocLinks, TheCheckFindsEveryKindOfBrokenLink) {
  // A small tree with good links of every form and one broken link of each kind: the check must
  // name exactly the broken ones.
  const fs::path root = wm::testing::make_temp_dir("wm_doc_links_");
  auto write = [&](const std::string& rel, const std::string& text) {
    fs::create_directories((root / rel).parent_path());
    std::ofstream(root / rel) << text;
  };
  write("a/README.md", "# Page A\n\n## Building for a GPU\n\nSee tools.\n\n## Measured\n\n## Measured\n");
  write("a/pic.png", "png");
  write("code.h", "// code\n");
  write("README.md",
        "# Top\n\n"
        "[good](a/README.md) [dir](a/) [anchor](a/README.md#building-for-a-gpu) [repeat](a/README.md#measured-1)\n"
        "![pic](a/pic.png) [title](a/README.md \"A\") [angle](<a/README.md>) [self](#top) [root](/code.h)\n"
        "[web](https://example.com/x.md) [mail](mailto:x@example.com) [line](code.h#L3)\n"
        "`[in a span](missing-span.md)` and\n"
        "```\n[in a fence](missing-fence.md)\n```\n"
        "[missing](a/nothing.md)\n"                   // line 10
        "[bad anchor](a/README.md#building-for-gpu)\n"  // line 11
        "[bad self](#nowhere)\n"                      // line 12
        "[outside](../../etc/passwd)\n"               // line 13
        "<img src=\"a/none.png\">\n"                  // line 14
        "[ref]: a/gone.md\n");                        // line 15
  write("build/README.md", "[skipped](nothing.md)\n");
  write(".hidden/README.md", "[skipped](nothing.md)\n");
  write("b/nested/page.md", "[up](../../README.md#top) [up bad](../../README.md#bottom)\n");

  const Check c = check_links(root);
  fs::remove_all(root);
  EXPECT_EQ(c.pages, 3u);
  std::vector<std::pair<std::string, int>> got;
  for (const Broken& b : c.broken) got.emplace_back(b.file + " " + b.target, b.line);
  const std::vector<std::pair<std::string, int>> want = {
      {"README.md a/nothing.md", 10},
      {"README.md a/README.md#building-for-gpu", 11},
      {"README.md #nowhere", 12},
      {"README.md ../../etc/passwd", 13},
      {"README.md a/none.png", 14},
      {"README.md a/gone.md", 15},
      {"b/nested/page.md ../../README.md#bottom", 1},
  };
  auto sorted = [](std::vector<std::pair<std::string, int>> v) {
    std::sort(v.begin(), v.end());
    return v;
  };
  EXPECT_EQ(sorted(got), sorted(want)) << describe(c.broken);
}

TEST(DocLinks, EveryRelativeLinkInTheTreeResolves) {
  const Check c = check_links(WM_SOURCE_DIR);
  // Enough pages and links that a scan gone wrong (wrong root, a parser that finds nothing)
  // does not pass quietly.
  EXPECT_GE(c.pages, 10u) << "is WM_SOURCE_DIR the tree?";
  EXPECT_GE(c.links, 20u);
  EXPECT_TRUE(c.broken.empty()) << c.broken.size() << " broken link(s):\n" << describe(c.broken);
}

}  // namespace
