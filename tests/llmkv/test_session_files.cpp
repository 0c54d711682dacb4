// The session folder (llmkv/session_files.h): a session saved and loaded into another session
// object continues with the same tokens; every file in the folder is hostile: a crafted index
// never makes it touch a path outside, a symbolic link is never followed, a damaged or
// unreadable file is moved aside (its bytes kept), a missing index is rebuilt from the files, an
// orphan is adopted, files not of the folder's own patterns are never touched; one process
// holds the folder at a time; saves append only what the file lacks and a cut tail falls back
// to the last whole manifest; files of format 2 still load; a byte budget erases the least
// recently used sessions.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "llmkv/hf_folder.h"
#include "llmkv/session_files.h"
#include "runtime/build_paths.h"
#include "runtime/error.h"
#include "tests/temp_dir.h"

namespace wm::llm {
// Named, not anonymous: in the unity build this file shares a unit with suites whose helpers
// have the same names (kVocab, positions(), ...).
namespace session_files_test {

namespace fs = std::filesystem;

struct Fixture {
  std::string dir = std::string(WM_SOURCE_DIR) + "/assets/models/tiny-llm";
  LlmModel model = load_llm(dir, at::kCPU);
  Tokenizer tok = Tokenizer::load(dir + "/tokenizer.json");
  GenerateOptions go() const {
    GenerateOptions g;
    g.max_new_tokens = 10;
    return g;
  }
  // What wm_serve gives every session by default (tools/serve/main.cpp): evoke, compact
  // placement, attention relevance, half the model's positions as budget.
  SessionOptions served() const {
    SessionOptions o;
    o.memory.policy = "evoke";
    o.memory.placement = "compact";
    o.memory.relevance = "attention";
    o.memory.budget = model->config().max_position_embeddings / 2;
    o.memory.reserve = std::min<int64_t>(256, o.memory.budget / 2);
    return o;
  }
  // One chat turn as the serve engine runs it: the user's message a block of its own (block-wise
  // policies), the reply generated after a tail, then sealed into a block.
  void turn(LlmSession& s, int t) const {
    const std::string msg = str_cat("key", t, " ", 1000 + (37 * t) % 9000, "\nRecall key", t / 2, ":");
    const std::vector<int64_t> ids = tok.encode(msg, false);
    const std::vector<int64_t> tail = tok.encode("\n", false);
    if (s.policy().block_wise()) {
      PromptPiece p;
      p.segment = str_cat("t", t, ".0");
      p.kind = "user";
      p.message = true;
      s.feed_piece(ids, p);
      s.generate(tail, go());
      s.seal_recent(str_cat("t", t, ".r"), "assistant");
    } else {
      std::vector<int64_t> prompt = ids;
      prompt.insert(prompt.end(), tail.begin(), tail.end());
      s.generate(prompt, go());
    }
  }
};

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}
void write_bytes(const fs::path& p, const std::string& b) { std::ofstream(p, std::ios::binary | std::ios::trunc) << b; }

void flip_byte(const fs::path& p, size_t at) {
  std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(at));
  const char c = static_cast<char>(f.get());
  f.seekp(static_cast<std::streamoff>(at));
  f.put(static_cast<char>(c ^ 0x10));
}

// Names in the folder that start with `prefix`.
std::vector<std::string> named(const fs::path& d, const std::string& prefix) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(d)) {
    const std::string f = e.path().filename().string();
    if (f.rfind(prefix, 0) == 0) out.push_back(f);
  }
  return out;
}

bool any_has(const std::vector<std::string>& logs, const std::string& s) {
  for (const auto& l : logs)
    if (l.find(s) != std::string::npos) return true;
  return false;
}

// The generation the session gives next (a copy of the state given: the session goes on).
std::vector<int64_t> next_tokens(const Fixture& fx, LlmSession& s) {
  return s.generate(fx.tok.encode("Recall:\nkey1", false), fx.go()).tokens;
}

TEST(SessionFiles, SavedSessionContinuesWithTheSameTokens) {
  Fixture fx;
  const fs::path scratch = wm::testing::make_temp_dir("wm_session_files_a_");
  const fs::path d = scratch / "sessions";
  LlmSession a(fx.model, fx.tok, at::kCPU);
  a.generate(fx.tok.encode("rode 42\nsora 17\n", false), fx.go());
  std::vector<std::string> logs;
  {
    SessionFiles files(d.string(), [&](const std::string& m) { logs.push_back(m); });
    EXPECT_GT(files.save("conv", a, {{"turns", 1}}), 1000u);
    EXPECT_EQ(files.total_bytes(), fs::file_size(d / SessionFiles::file_of("conv")));
  }
  SessionFiles files(d.string(), [&](const std::string& m) { logs.push_back(m); });
  EXPECT_TRUE(logs.empty()) << ::testing::PrintToString(logs);
  ASSERT_EQ(files.found().count("conv"), 1u);
  EXPECT_EQ(files.found().at("conv").file, SessionFiles::file_of("conv"));
  EXPECT_EQ(files.found().at("conv").next_position, a.next_position());
  LlmSession b(fx.model, fx.tok, at::kCPU);
  EXPECT_EQ(files.load("conv", b)["turns"], 1);
  const std::vector<int64_t> next = fx.tok.encode("Recall:\nrode", false);
  EXPECT_EQ(a.generate(next, fx.go()).tokens, b.generate(next, fx.go()).tokens);
  EXPECT_THROW(files.load("other", b), Error);
  EXPECT_TRUE(files.erase("conv"));
  EXPECT_FALSE(files.erase("conv"));
  EXPECT_FALSE(fs::exists(d / files.found().at("conv").file));
  EXPECT_EQ(files.total_bytes(), 0u);
  fs::remove_all(scratch);
}

TEST(SessionFiles, DamagedFilesAreMovedAsideWithTheirBytesAndNeverUsed) {
  Fixture fx;
  const fs::path scratch = wm::testing::make_temp_dir("wm_session_files_b_");
  const fs::path d = scratch / "sessions";
  LlmSession a(fx.model, fx.tok, at::kCPU);
  a.feed(fx.tok.encode("rode 42\nsora 17\n", false));
  {
    SessionFiles files(d.string(), {});
    files.save("one", a, nullptr);
    files.save("two", a, nullptr);
  }
  const fs::path one = d / SessionFiles::file_of("one");
  flip_byte(one, fs::file_size(one) - 100);
  const std::string damaged = read_bytes(one);
  EXPECT_THROW(SessionFiles::decode(damaged, one, nullptr, nullptr), CorruptData);
  EXPECT_THROW(SessionFiles::decode(damaged.substr(0, damaged.size() / 2), one, nullptr, nullptr), CorruptData);
  // A file named like a session's that holds no session (a first write cut short, or anything).
  write_bytes(d / "s-0123456789abcdef.wmsess", "cut short");
  std::vector<std::string> logs;
  {
    SessionFiles files(d.string(), [&](const std::string& m) { logs.push_back(m); });
    EXPECT_EQ(files.found().count("one"), 0u);
    EXPECT_EQ(files.found().count("two"), 1u);
    EXPECT_TRUE(any_has(logs, "is not used")) << ::testing::PrintToString(logs);
    EXPECT_TRUE(any_has(logs, "moved aside")) << ::testing::PrintToString(logs);
    // Moved aside, never deleted: the same bytes under a new name.
    EXPECT_FALSE(fs::exists(one));
    EXPECT_FALSE(fs::exists(d / "s-0123456789abcdef.wmsess"));
    const auto aside = named(d, one.filename().string() + ".damaged-");
    ASSERT_EQ(aside.size(), 1u);
    EXPECT_EQ(read_bytes(d / aside[0]), damaged);
    const auto aside2 = named(d, "s-0123456789abcdef.wmsess.damaged-");
    ASSERT_EQ(aside2.size(), 1u);
    EXPECT_EQ(read_bytes(d / aside2[0]), "cut short");
  }
  // Reopened: "two" alone, nothing to report (what was moved aside is no session file).
  logs.clear();
  {
    SessionFiles files(d.string(), [&](const std::string& m) { logs.push_back(m); });
    EXPECT_TRUE(logs.empty()) << ::testing::PrintToString(logs);
    EXPECT_EQ(files.size(), 1u);
    // Damaged while the folder is open: load refuses it, moves it aside and forgets it.
    const fs::path two = d / SessionFiles::file_of("two");
    flip_byte(two, 200);
    const std::string bytes = read_bytes(two);
    LlmSession b(fx.model, fx.tok, at::kCPU);
    EXPECT_THROW(files.load("two", b), CorruptData);
    EXPECT_FALSE(files.has("two"));
    EXPECT_FALSE(files.erase("two"));
    const auto aside = named(d, two.filename().string() + ".damaged-");
    ASSERT_EQ(aside.size(), 1u);
    EXPECT_EQ(read_bytes(d / aside[0]), bytes);
  }
  // A damaged index: refused, the folder left as it is.
  std::ofstream(d / "index.json", std::ios::trunc) << "{\"version\": 1, \"sessions\": ";
  const size_t n_files = static_cast<size_t>(std::distance(fs::directory_iterator(d), fs::directory_iterator()));
  EXPECT_THROW(SessionFiles(d.string(), {}), CorruptData);
  EXPECT_EQ(static_cast<size_t>(std::distance(fs::directory_iterator(d), fs::directory_iterator())), n_files);
  fs::remove_all(scratch);
}

TEST(SessionFiles, ACraftedIndexNeverTouchesAPathOutside) {
  Fixture fx;
  const fs::path scratch = wm::testing::make_temp_dir("wm_session_files_c_");
  const fs::path d = scratch / "sessions";
  const fs::path sentinel = scratch / "wm_session_files_c_sentinel";
  write_bytes(sentinel, "not the folder's");
  fs::create_directories(d);
  const nlohmann::json index = {
      {"version", 1},
      {"sessions",
       {{"x", "../../../../../../../../.." + sentinel.string()}, {"y", sentinel.string()}, {"z", 42}}}};
  write_bytes(d / "index.json", index.dump());
  std::vector<std::string> logs;
  {
    SessionFiles files(d.string(), [&](const std::string& m) { logs.push_back(m); });
    EXPECT_EQ(files.size(), 0u);
    EXPECT_TRUE(any_has(logs, "the entry is ignored")) << ::testing::PrintToString(logs);
    LlmSession a(fx.model, fx.tok, at::kCPU);
    a.feed(fx.tok.encode("rode 42\n", false));
    files.save("x", a, nullptr);
    EXPECT_TRUE(files.erase("x"));
  }
  EXPECT_EQ(read_bytes(sentinel), "not the folder's");
  // The index rewritten without the crafted entries.
  EXPECT_EQ(read_bytes(d / "index.json").find(sentinel.filename().string()), std::string::npos);
  fs::remove_all(scratch);
}

TEST(SessionFiles, SymbolicLinksAreNeverFollowed) {
  Fixture fx;
  const fs::path scratch = wm::testing::make_temp_dir("wm_session_files_d_");
  const fs::path d = scratch / "sessions";
  const fs::path outside = scratch / "wm_session_files_d_outside";
  fs::create_directories(d);
  write_bytes(outside, "outside");
  const std::string f = SessionFiles::file_of("conv");
  // Links where a writer of the format before put its temporaries.
  fs::create_symlink(outside, d / (f + ".tmp"));
  fs::create_symlink(outside, d / "index.json.tmp");
  LlmSession a(fx.model, fx.tok, at::kCPU);
  a.feed(fx.tok.encode("rode 42\nsora 17\n", false));
  std::string saved;
  {
    SessionFiles files(d.string(), {});
    files.save("conv", a, nullptr);
    EXPECT_EQ(read_bytes(outside), "outside");
    // A link planted over the session file while the folder is open: the next save replaces the
    // link, never writes through it.
    fs::remove(d / f);
    fs::create_symlink(outside, d / f);
    a.feed(fx.tok.encode("kilo 7\n", false));
    files.save("conv", a, nullptr);
    EXPECT_EQ(read_bytes(outside), "outside");
    EXPECT_FALSE(fs::is_symlink(d / f));
    saved = read_bytes(d / f);
  }
  EXPECT_TRUE(fs::is_symlink(d / (f + ".tmp")));  // not the folder's own name: left alone
  // A link to a valid session file outside: not read through, moved aside (the link itself).
  write_bytes(outside, saved);
  fs::remove(d / f);
  fs::create_symlink(outside, d / f);
  std::vector<std::string> logs;
  {
    SessionFiles files(d.string(), [&](const std::string& m) { logs.push_back(m); });
    EXPECT_EQ(files.found().count("conv"), 0u);
    EXPECT_TRUE(any_has(logs, "symbolic link")) << ::testing::PrintToString(logs);
  }
  EXPECT_EQ(read_bytes(outside), saved);
  const auto aside = named(d, f + ".damaged-");
  ASSERT_EQ(aside.size(), 1u);
  EXPECT_TRUE(fs::is_symlink(d / aside[0]));
  fs::remove_all(scratch);
}

TEST(SessionFiles, AMissingIndexIsRebuiltAndOrphansAreAdopted) {
  Fixture fx;
  const fs::path scratch = wm::testing::make_temp_dir("wm_session_files_e_");
  const fs::path d = scratch / "sessions";
  LlmSession a(fx.model, fx.tok, at::kCPU);
  a.feed(fx.tok.encode("rode 42\nsora 17\n", false));
  {
    SessionFiles files(d.string(), {});
    files.save("one", a, {{"n", 1}});
    files.save("two", a, {{"n", 2}});
  }
  fs::remove(d / "index.json");
  std::vector<std::string> logs;
  {
    SessionFiles files(d.string(), [&](const std::string& m) { logs.push_back(m); });
    EXPECT_EQ(files.size(), 2u);
    ASSERT_EQ(files.found().count("two"), 1u);
    EXPECT_EQ(files.found().at("two").note["n"], 2);
    EXPECT_TRUE(any_has(logs, "rebuilt")) << ::testing::PrintToString(logs);
  }
  ASSERT_TRUE(fs::exists(d / "index.json"));
  // An index that names one of them (a save cut short between the file and the index).
  write_bytes(d / "index.json",
              nlohmann::json{{"version", 1}, {"sessions", {{"one", SessionFiles::file_of("one")}}}}.dump());
  logs.clear();
  {
    SessionFiles files(d.string(), [&](const std::string& m) { logs.push_back(m); });
    EXPECT_EQ(files.size(), 2u);
    EXPECT_TRUE(any_has(logs, "adopted 1")) << ::testing::PrintToString(logs);
    LlmSession b(fx.model, fx.tok, at::kCPU);
    EXPECT_EQ(files.load("two", b)["n"], 2);
  }
  logs.clear();
  {
    SessionFiles files(d.string(), [&](const std::string& m) { logs.push_back(m); });
    EXPECT_TRUE(logs.empty()) << ::testing::PrintToString(logs);
  }
  fs::remove_all(scratch);
}

TEST(SessionFiles, FilesNotOfTheFoldersOwnPatternsAreNeverTouched) {
  Fixture fx;
  const fs::path scratch = wm::testing::make_temp_dir("wm_session_files_f_");
  const fs::path d = scratch / "sessions";
  fs::create_directories(d);
  const std::vector<std::string> theirs = {"s-notes.txt", "foo.tmp", "index.json.tmp", "s-0123456789abcdef.wmsess.bak",
                                           "s-0123456789ABCDEF.wmsess", "index.json.tmp-0123456789abcdeg",
                                           "s-0123456789abcdef.wmsess.tmp"};
  for (const auto& f : theirs) write_bytes(d / f, "theirs: " + f);
  // A temporary of the folder's own pattern, left by a writer killed: removed.
  write_bytes(d / "index.json.tmp-0123456789abcdef", "{");
  write_bytes(d / "s-0123456789abcdef.wmsess.tmp-fedcba9876543210", "half");
  std::vector<std::string> logs;
  {
    SessionFiles files(d.string(), [&](const std::string& m) { logs.push_back(m); });
    EXPECT_TRUE(any_has(logs, "removed 2 temporary")) << ::testing::PrintToString(logs);
    LlmSession a(fx.model, fx.tok, at::kCPU);
    a.feed(fx.tok.encode("rode 42\n", false));
    files.save("conv", a, nullptr);
    files.erase("conv");
  }
  { SessionFiles files(d.string(), {}); }
  for (const auto& f : theirs) EXPECT_EQ(read_bytes(d / f), "theirs: " + f) << f;
  EXPECT_FALSE(fs::exists(d / "index.json.tmp-0123456789abcdef"));
  EXPECT_FALSE(fs::exists(d / "s-0123456789abcdef.wmsess.tmp-fedcba9876543210"));
  fs::remove_all(scratch);
}

TEST(SessionFiles, UnreadableFilesAreMovedAsideNotDeleted) {
  Fixture fx;
  const fs::path scratch = wm::testing::make_temp_dir("wm_session_files_g_");
  const fs::path d = scratch / "sessions";
  LlmSession a(fx.model, fx.tok, at::kCPU);
  a.feed(fx.tok.encode("rode 42\n", false));
  {
    SessionFiles files(d.string(), {});
    files.save("conv", a, nullptr);
  }
  // Not a regular file where a session's should be: a folder with the owner's file in it.
  const std::string dirlike = "s-1111111111111111.wmsess";
  fs::create_directories(d / dirlike);
  write_bytes(d / dirlike / "mine.txt", "mine");
  const fs::path conv = d / SessionFiles::file_of("conv");
  const std::string bytes = read_bytes(conv);
  const bool root = ::geteuid() == 0;  // root reads a file of mode 000: that case is then not run
  if (!root) fs::permissions(conv, fs::perms::none);
  std::vector<std::string> logs;
  {
    SessionFiles files(d.string(), [&](const std::string& m) { logs.push_back(m); });
    EXPECT_EQ(files.found().count("conv"), root ? 1u : 0u);
    EXPECT_TRUE(any_has(logs, "not a regular file")) << ::testing::PrintToString(logs);
  }
  const auto aside = named(d, dirlike + ".damaged-");
  ASSERT_EQ(aside.size(), 1u);
  EXPECT_EQ(read_bytes(d / aside[0] / "mine.txt"), "mine");
  if (!root) {
    const auto aside2 = named(d, conv.filename().string() + ".damaged-");
    ASSERT_EQ(aside2.size(), 1u);
    fs::permissions(d / aside2[0], fs::perms::owner_read);
    EXPECT_EQ(read_bytes(d / aside2[0]), bytes);
  }
  fs::remove_all(scratch);
}

TEST(SessionFiles, OneOwnerAtATime) {
  const fs::path scratch = wm::testing::make_temp_dir("wm_session_files_h_");
  const fs::path d = scratch / "sessions";
  {
    auto first = std::make_unique<SessionFiles>(d.string(), nullptr);
    try {
      SessionFiles second(d.string(), {});
      ADD_FAILURE() << "a second owner opened the folder";
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(d.string()), std::string::npos) << m;
      EXPECT_NE(m.find(str_cat("pid ", ::getpid())), std::string::npos) << m;
    }
    first.reset();
    EXPECT_NO_THROW(SessionFiles(d.string(), {}));
  }
  fs::remove_all(scratch);
}

// Saves after the first append what the file lacks; the file loads to the same session.
void check_incremental(const Fixture& fx, const SessionOptions& so, const std::string& tag) {
  const fs::path scratch = wm::testing::make_temp_dir("wm_session_files_i_" + tag + "_");
  const fs::path d = scratch / "sessions";
  LlmSession a(fx.model, fx.tok, at::kCPU, at::kFloat, so);
  SessionFiles files(d.string(), {});
  fx.turn(a, 0);
  const SaveReport r0 = files.store("conv", a.snapshot(), {{"turns", 1}});
  EXPECT_TRUE(r0.rewritten);
  EXPECT_EQ(r0.written, r0.file_bytes);
  size_t prev = SessionFiles::encode("conv", a.snapshot(), {{"turns", 1}}).size();
  for (int t = 1; t < 4; ++t) {
    fx.turn(a, t);
    const SessionSnapshot snap = a.snapshot();
    const SaveReport r = files.store("conv", snap, {{"turns", t + 1}});
    const size_t whole = SessionFiles::encode("conv", snap, {{"turns", t + 1}}).size();
    EXPECT_FALSE(r.rewritten) << tag << " turn " << t;
    // The turn's tokens and a manifest, not the session's: at most the growth of the whole
    // file and a few KB (the whole file grows by about as much as the session).
    EXPECT_LT(r.written, whole - prev + 8192) << tag << " turn " << t;
    EXPECT_LT(r.written, whole * 2 / 3) << tag << " turn " << t;
    prev = whole;
    EXPECT_EQ(r.file_bytes, fs::file_size(d / SessionFiles::file_of("conv")));
    EXPECT_EQ(files.total_bytes(), r.file_bytes);
  }
  LlmSession b(fx.model, fx.tok, at::kCPU, at::kFloat, so);
  EXPECT_EQ(files.load("conv", b)["turns"], 4);
  EXPECT_EQ(b.next_position(), a.next_position());
  EXPECT_EQ(next_tokens(fx, a), next_tokens(fx, b)) << tag;
  fs::remove_all(scratch);
}

TEST(SessionFiles, SavesAppendOnlyWhatTheFileLacksUnderEvoke) {
  Fixture fx;
  check_incremental(fx, fx.served(), "evoke");
}

TEST(SessionFiles, SavesAppendOnlyWhatTheFileLacksUnderFull) {
  Fixture fx;
  check_incremental(fx, SessionOptions{}, "full");
}

TEST(SessionFiles, ACutTailFallsBackToTheLastWholeManifest) {
  Fixture fx;
  const fs::path scratch = wm::testing::make_temp_dir("wm_session_files_j_");
  const fs::path d = scratch / "sessions";
  const SessionOptions so = fx.served();
  LlmSession a(fx.model, fx.tok, at::kCPU, at::kFloat, so);
  const fs::path f = d / SessionFiles::file_of("conv");
  fx.turn(a, 0);
  const SessionSnapshot first = a.snapshot();
  const int64_t pos1 = a.next_position();
  uint64_t size1 = 0, size2 = 0;
  {
    SessionFiles files(d.string(), {});
    size1 = files.store("conv", first, {{"turns", 1}}).file_bytes;
    fx.turn(a, 1);
    size2 = files.store("conv", a.snapshot(), {{"turns", 2}}).file_bytes;
  }
  ASSERT_GT(size2, size1);
  // Every cut inside the second save's bytes gives the first state back.
  for (uint64_t cut : {size2 - 1, size2 - 30, (size1 + size2) / 2, size1 + 5}) {
    const std::string whole = read_bytes(f);
    fs::resize_file(f, cut);
    std::vector<std::string> logs;
    {
      SessionFiles files(d.string(), [&](const std::string& m) { logs.push_back(m); });
      EXPECT_TRUE(logs.empty()) << cut << ": " << ::testing::PrintToString(logs);
      ASSERT_EQ(files.found().count("conv"), 1u) << cut;
      EXPECT_EQ(files.found().at("conv").next_position, pos1) << cut;
      EXPECT_EQ(files.found().at("conv").note["turns"], 1) << cut;
    }
    write_bytes(f, whole);
  }
  // Garbage after the last manifest is ignored too; the next save cuts it off and appends.
  {
    std::ofstream(f, std::ios::binary | std::ios::app) << std::string(100, 'M') << "MANI" << std::string(50, '\x07');
    SessionFiles files(d.string(), {});
    EXPECT_EQ(files.found().at("conv").next_position, a.next_position());
    fx.turn(a, 2);
    const SaveReport r = files.store("conv", a.snapshot(), {{"turns", 3}});
    EXPECT_FALSE(r.rewritten);
    EXPECT_EQ(r.file_bytes, fs::file_size(f));
  }
  {
    SessionFiles files(d.string(), {});
    EXPECT_EQ(files.found().at("conv").note["turns"], 3);
    LlmSession b(fx.model, fx.tok, at::kCPU, at::kFloat, so);
    files.load("conv", b);
    LlmSession c(fx.model, fx.tok, at::kCPU, at::kFloat, so);
    c.restore(a.snapshot());
    EXPECT_EQ(next_tokens(fx, b), next_tokens(fx, c));
  }
  // A bit flipped in a block the last manifest uses: damaged, not an older state.
  flip_byte(f, 200);
  {
    std::vector<std::string> logs;
    SessionFiles files(d.string(), [&](const std::string& m) { logs.push_back(m); });
    EXPECT_EQ(files.found().count("conv"), 0u);
    EXPECT_TRUE(any_has(logs, "moved aside")) << ::testing::PrintToString(logs);
  }
  fs::remove_all(scratch);
}

TEST(SessionFiles, DeadBytesBeyondTheLiveOnesAreCompactedAway) {
  Fixture fx;
  const fs::path scratch = wm::testing::make_temp_dir("wm_session_files_k_");
  const fs::path d = scratch / "sessions";
  SessionFiles files(d.string(), {});
  LlmSession a(fx.model, fx.tok, at::kCPU);
  bool compacted = false;
  uint64_t most = 0;
  for (int i = 0; i < 6; ++i) {
    a.reset();  // nothing in common with what the file holds
    a.feed(fx.tok.encode(str_cat("round ", i, "\nkey", i, " ", 100 + i, "\n"), false));
    const SessionSnapshot snap = a.snapshot();
    const SaveReport r = files.store("conv", snap, {{"round", i}});
    if (i > 0) compacted = compacted || r.rewritten;
    most = std::max<uint64_t>(most, SessionFiles::encode("conv", snap, {{"round", i}}).size());
    EXPECT_LE(r.file_bytes, 2 * most + 4096) << i;
  }
  EXPECT_TRUE(compacted);
  LlmSession b(fx.model, fx.tok, at::kCPU);
  EXPECT_EQ(files.load("conv", b)["round"], 5);
  EXPECT_EQ(next_tokens(fx, a), next_tokens(fx, b));
  fs::remove_all(scratch);
}

TEST(SessionFiles, FilesOfTheFormatBeforeStillLoad) {
  Fixture fx;
  const fs::path scratch = wm::testing::make_temp_dir("wm_session_files_l_");
  const fs::path d = scratch / "sessions";
  fs::create_directories(d);
  LlmSession a(fx.model, fx.tok, at::kCPU);
  a.generate(fx.tok.encode("rode 42\nsora 17\n", false), fx.go());
  // What the folder's writer before this format wrote: format 2 and its index.
  write_bytes(d / SessionFiles::file_of("old"), SessionFiles::encode("old", a.snapshot(), {{"turns", 7}}));
  write_bytes(d / "index.json",
              nlohmann::json{{"version", 1}, {"sessions", {{"old", SessionFiles::file_of("old")}}}}.dump());
  SessionFiles files(d.string(), {});
  ASSERT_EQ(files.found().count("old"), 1u);
  EXPECT_EQ(files.found().at("old").next_position, a.next_position());
  LlmSession b(fx.model, fx.tok, at::kCPU);
  EXPECT_EQ(files.load("old", b)["turns"], 7);
  EXPECT_EQ(next_tokens(fx, a), next_tokens(fx, b));
  // Its next save writes the file whole, in format 3; the one after appends.
  fx.turn(b, 1);
  EXPECT_TRUE(files.store("old", b.snapshot(), {{"turns", 8}}).rewritten);
  EXPECT_EQ(read_bytes(d / SessionFiles::file_of("old")).substr(0, 8), "WMSESS3\n");
  fx.turn(b, 2);
  EXPECT_FALSE(files.store("old", b.snapshot(), {{"turns", 9}}).rewritten);
  LlmSession c(fx.model, fx.tok, at::kCPU);
  EXPECT_EQ(files.load("old", c)["turns"], 9);
  EXPECT_EQ(next_tokens(fx, b), next_tokens(fx, c));
  fs::remove_all(scratch);
}

TEST(SessionFiles, TheBudgetErasesTheLeastRecentlyUsed) {
  Fixture fx;
  const fs::path scratch = wm::testing::make_temp_dir("wm_session_files_m_");
  const fs::path d = scratch / "sessions";
  LlmSession a(fx.model, fx.tok, at::kCPU);
  a.feed(fx.tok.encode("rode 42\nsora 17\n", false));
  const SessionSnapshot snap = a.snapshot();
  uint64_t one = 0;
  {
    SessionFiles probe(d.string(), {});
    one = probe.store("p", snap, nullptr).file_bytes;
    probe.erase("p");
  }
  SessionFolderOptions opt;
  opt.max_bytes = 3 * one + one / 2;  // three sessions fit
  opt.pinned = [](const std::string& n) { return n == "p"; };
  {
    SessionFiles files(d.string(), {}, opt);
    EXPECT_TRUE(files.store("p", snap, nullptr).evicted.empty());
    EXPECT_TRUE(files.store("a", snap, nullptr).evicted.empty());
    EXPECT_TRUE(files.store("b", snap, nullptr).evicted.empty());
    EXPECT_EQ(files.total_bytes(), 3 * one);
    LlmSession b(fx.model, fx.tok, at::kCPU);
    files.load("a", b);  // "a" used after "b": "b" is now the least recently used but "p" (pinned)
    const SaveReport r = files.store("c", snap, nullptr);
    EXPECT_EQ(r.evicted, std::vector<std::string>{"b"});
    EXPECT_FALSE(files.has("b"));
    EXPECT_FALSE(fs::exists(d / SessionFiles::file_of("b")));
    EXPECT_LE(files.total_bytes(), opt.max_bytes);
  }
  // Reopened with room for one: "a" goes; the pinned one and the one just saved stay, above it.
  opt.max_bytes = one;
  {
    SessionFiles files(d.string(), {}, opt);
    EXPECT_EQ(files.size(), 3u);
    const SaveReport r = files.store("c", snap, {{"again", true}});
    EXPECT_EQ(r.evicted, std::vector<std::string>{"a"});
    EXPECT_TRUE(files.has("p"));
    EXPECT_TRUE(files.has("c"));
    EXPECT_GT(files.total_bytes(), opt.max_bytes);
  }
  {
    SessionFiles files(d.string(), {});
    EXPECT_EQ(files.size(), 2u);
  }
  fs::remove_all(scratch);
}

// The bytes a 60-turn chat writes per save, in format 2 (the file whole each time, as the folder
// wrote before format 3) and in format 3 (what store() appends). A measurement, not a check:
//   wm_tests --gtest_also_run_disabled_tests --gtest_filter='SessionFiles.DISABLED_BytesPerTurn*'
TEST(SessionFiles, DISABLED_BytesPerTurnOfASixtyTurnChat) {
  Fixture fx;
  for (const int64_t budget : {int64_t{0}, int64_t{256}, int64_t{-1}}) {  // -1: full
    const bool evoke = budget >= 0;
    SessionOptions so = evoke ? fx.served() : SessionOptions{};
    if (budget > 0) so.memory.budget = budget, so.memory.reserve = budget / 4;
    const std::string tag = evoke ? str_cat("evoke budget ", so.memory.budget) : std::string("full");
    const fs::path scratch = wm::testing::make_temp_dir(std::string("wm_session_files_z_") + (evoke ? "evoke_" : "full_"));
    const fs::path d = scratch / "sessions";
    LlmSession a(fx.model, fx.tok, at::kCPU, at::kFloat, so);
    SessionFiles files(d.string(), {});
    uint64_t before = 0, after = 0, rewrites = 0;
    for (int t = 0; t < 60; ++t) {
      fx.turn(a, t);
      const SessionSnapshot snap = a.snapshot();
      const nlohmann::json note = {{"turns", t + 1}};
      const size_t whole = SessionFiles::encode("conv", snap, note).size();
      const SaveReport r = files.store("conv", snap, note);
      before += whole;
      after += r.written;
      rewrites += r.rewritten ? 1 : 0;
      if (t % 10 == 9 || t < 3)
        std::printf("%s turn %2d: tokens %5lld  whole %9zu  written %8llu  file %9llu%s\n", tag.c_str(),
                    t + 1, static_cast<long long>(a.next_position()), whole,
                    static_cast<unsigned long long>(r.written), static_cast<unsigned long long>(r.file_bytes),
                    r.rewritten ? "  (whole)" : "");
    }
    std::printf("%s: 60 turns: format 2 wrote %llu bytes (%.0f a turn), format 3 %llu (%.0f a turn), %llu whole "
                "writes; file %llu bytes (format 2: the last whole)\n",
                tag.c_str(), static_cast<unsigned long long>(before), before / 60.0,
                static_cast<unsigned long long>(after), after / 60.0, static_cast<unsigned long long>(rewrites),
                static_cast<unsigned long long>(files.total_bytes()));
    LlmSession b(fx.model, fx.tok, at::kCPU, at::kFloat, so);
    files.load("conv", b);
    EXPECT_EQ(next_tokens(fx, a), next_tokens(fx, b));
    fs::remove_all(scratch);
  }
}

}  // namespace session_files_test
}  // namespace wm::llm
