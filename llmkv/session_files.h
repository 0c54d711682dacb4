#pragma once
// Sessions kept in a folder, so that a server restarted on the same folder finds them again:
// one file per session (its snapshot, llmkv/session.h, with the caller's note beside it) and an
// index naming them.
//
// A session file: the magic "WMSESS2\n", a little-endian u64 header length, the JSON header
// ({"name", "note", "state", "blocks": [[kind, offset, bytes], ...]}, kind "window" or "bank"),
// the blocks in the spill files' format (runtime/spill_file.h, each checksummed), then a u64
// XXH64 of everything before it. The index, "index.json": {"version": 1, "sessions": {name:
// file}}. Both are written to a temporary file, flushed to the disk (fsync) and renamed over the
// old one, the folder flushed after: a reader finds the old version or the new one, whole,
// whenever the writer was killed. A session's file is written before the index that names it,
// and the index that no longer names one is written before its file is removed; files the index
// does not name (a write cut short) are removed when the folder is opened.
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "llmkv/session.h"

namespace wm::llm {

// What opening a folder found of one session (its file checked whole: sizes, checksums, header).
struct StoredSession {
  std::string file;    // the file's name in the folder
  nlohmann::json note; // the caller's note, as saved
  int64_t next_position = 0;  // the position the session's next token takes
};

class SessionFiles {
 public:
  // Opens (or makes) the folder and reads its index. A session whose file is missing or damaged
  // is reported through `log`, left out of the index and its file removed: that session starts
  // afresh, its damaged state never used. Throws wm::Error when the folder cannot be made or
  // written, wm::CorruptData when the index itself is damaged (the folder is then left as it is:
  // nothing of it is removed).
  SessionFiles(std::string dir, std::function<void(const std::string&)> log);

  // The sessions found when the folder was opened, by name.
  const std::map<std::string, StoredSession>& found() const { return found_; }

  // Writes the session's snapshot and note under `name`, then the index. Returns the file's
  // bytes. Throws wm::Error on an I/O failure (the session saved before, if any, then stays), and
  // what LlmSession::snapshot() throws.
  size_t save(const std::string& name, const LlmSession& session, const nlohmann::json& note);
  // The same from a snapshot taken before (LlmSession::snapshot), so that another thread writes it.
  size_t save(const std::string& name, const SessionSnapshot& snap, const nlohmann::json& note);
  // Restores the session saved under `name` into `session` and returns its note. Throws
  // wm::Error when no session of that name is saved, wm::CorruptData when its file is damaged
  // (the session is then empty), and what LlmSession::restore() throws.
  nlohmann::json load(const std::string& name, LlmSession& session);
  // Forgets the session: the index without it, then its file removed. False when none was saved.
  bool erase(const std::string& name);
  bool has(const std::string& name) const { return index_.count(name) > 0; }
  const std::string& dir() const { return dir_; }
  size_t size() const { return index_.size(); }

  // The file format alone (tests, tools): a session file's bytes and their reading back. decode
  // throws wm::CorruptData naming `where` on damaged bytes.
  static std::string encode(const std::string& name, const SessionSnapshot& snap, const nlohmann::json& note);
  static SessionSnapshot decode(const std::string& bytes, const std::string& where, std::string* name,
                                nlohmann::json* note);

 private:
  void write_index();
  std::string path_of(const std::string& file) const { return dir_ + "/" + file; }

  std::string dir_;
  std::function<void(const std::string&)> log_;
  std::map<std::string, std::string> index_;  // name -> file
  std::map<std::string, StoredSession> found_;
};

}  // namespace wm::llm
