#pragma once
// Sessions kept in a folder, so that a server restarted on the same folder finds them again:
// one file per session (its snapshot, llmkv/session.h, with the caller's note beside it), an
// index naming them and a lock file. Every file in the folder is treated as hostile, and
// nothing the folder's owner put there is removed.
//
// The folder's own names, and nothing else, are written, renamed or removed:
//   s-<16 hex>.wmsess           a session's file, always file_of(its name) (the XXH64 of the name)
//   index.json                  {"version": 1, "sessions": {name: file}}
//   .wmsess.lock                held (flock) while a SessionFiles is open; holds the holder's pid
//   <one of the above>.tmp-<16 hex>   a temporary (O_CREAT|O_EXCL|O_NOFOLLOW), renamed over its
//                               target or, left behind by a writer killed, removed at the next open
//   s-<16 hex>.wmsess.damaged-<UTC time>[-N]   a damaged or unreadable session file, moved aside
//                               (never deleted); the folder's owner decides what to do with it
// Files are opened relative to the folder's descriptor, never through a symbolic link
// (O_NOFOLLOW: a link where a session file should be is damaged, not read through).
//
// A session file (format 3): the magic "WMSESS3\n", then records, each a 4-byte tag ("BLOB" or
// "MANI"), a little-endian u64 payload length, a u64 XXH64 of tag and length, the payload and a
// u64 XXH64 of the payload. A BLOB holds a block's piece in the spill files' format
// (runtime/spill_file.h): a block's metadata alone (its "head"), or a run of its tokens in every
// layer. A MANI (manifest) is JSON {"name", "note", "state", "blocks": [{"kind": "window" or
// "bank", "head": [offset, bytes, xxh64], "pieces": [[offset, bytes, xxh64, [tokens per layer]],
// ...], "stats": [attn_ema's bits, last_use, uses]}]}: the block is its pieces' tokens in order.
// The last whole manifest wins; a tail after it (a save cut short) is ignored and cut off by the
// next save. A save appends only the pieces the file does not hold yet (a block that grew
// appends its new tokens; a block unchanged appends nothing), flushed (fdatasync) before the
// manifest that names them is appended and flushed, so a reader finds the old version or the new
// one, whole, whenever the writer was killed. When the dead bytes (pieces no manifest names any
// more, old manifests) would exceed the live ones, or the file is of an older format, the file is
// written whole instead: a temporary, flushed, renamed over it, the folder flushed after. The
// index is written the same way. A session's file is written before the index that names it; a
// file is removed before the index that no longer names it is written.
//
// Format 2 (magic "WMSESS2\n", written by encode()): a u64 header length, the JSON header
// ({"name", "note", "state", "blocks": [[kind, offset, bytes], ...]}), the blocks in the spill
// files' format, then a u64 XXH64 of everything before it. Still read; rewritten in format 3 at
// the session's next save.
//
// Not thread-safe: one caller at a time (the server holds a mutex around every call).
#include <cstdint>
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

struct SessionFolderOptions {
  // Bytes the session files may take together; 0: unbounded. A save that leaves them above it
  // erases the least recently saved or loaded sessions (never the one just saved, nor a pinned
  // one) until they fit or none is left to erase.
  uint64_t max_bytes = 0;
  // Sessions the budget never erases (e.g. those busy in the server). Called during save(); must
  // not call into the SessionFiles.
  std::function<bool(const std::string& name)> pinned;
};

// What one save did.
struct SaveReport {
  uint64_t written = 0;     // bytes written to the disk by this save (the file's, the index's not counted)
  uint64_t file_bytes = 0;  // the session file's size after it
  bool rewritten = false;   // the file written whole (new, compacted, or of an older format)
  std::vector<std::string> evicted;  // sessions the budget erased, least recently used first
};

class SessionFiles {
 public:
  // Opens (or makes) the folder, takes its lock and finds the sessions there: every file named
  // like a session file is read and checked whole. A damaged or unreadable session file (a
  // symbolic link included) is renamed aside (".damaged-<time>") and reported through `log`,
  // its session left out (it starts afresh). A valid file the index does not name is adopted;
  // a missing index is rebuilt from the files' own headers (each holds its session's name); an
  // index entry naming any other file than file_of(name) is ignored, its path never touched.
  // Temporaries of the folder's own pattern are removed; no other file is touched.
  // Throws wm::Error when the folder cannot be made, opened or locked, or another SessionFiles
  // (in this process or another) holds it (naming the folder and the holder's pid);
  // wm::CorruptData when the index itself is damaged (then nothing in the folder is changed).
  SessionFiles(std::string dir, std::function<void(const std::string&)> log, SessionFolderOptions opt = {});
  ~SessionFiles();  // releases the lock
  SessionFiles(const SessionFiles&) = delete;
  SessionFiles& operator=(const SessionFiles&) = delete;

  // The sessions found when the folder was opened, by name.
  const std::map<std::string, StoredSession>& found() const { return found_; }

  // Writes the session's snapshot and note under `name` (appending what the file lacks, or the
  // file whole; see above), then the index if the name is new, then applies the budget.
  // Throws wm::Error on an I/O failure (the session's previous state, if any, then stays whole
  // in its file; a failed eviction is reported through `log`, not thrown).
  SaveReport store(const std::string& name, const SessionSnapshot& snap, const nlohmann::json& note);
  // store(), returning the bytes written (SaveReport::written). Also throws what
  // LlmSession::snapshot() throws.
  uint64_t save(const std::string& name, const LlmSession& session, const nlohmann::json& note);
  uint64_t save(const std::string& name, const SessionSnapshot& snap, const nlohmann::json& note);
  // Restores the session saved under `name` into `session` and returns its note. Throws
  // wm::Error when no session of that name is saved, wm::CorruptData when its file is damaged
  // (a symbolic link included) and wm::Error when it cannot be read: the file is then moved
  // aside (never deleted) and the session forgotten (has() false; a file gone is forgotten too;
  // out of descriptors or memory, nothing changes), `session` left empty; and what
  // LlmSession::restore() throws (the file then stays).
  nlohmann::json load(const std::string& name, LlmSession& session);
  // Forgets the session: its file removed, then the index without it. False when none was saved.
  // Throws wm::Error when the file cannot be removed (the session then stays).
  bool erase(const std::string& name);
  bool has(const std::string& name) const { return entries_.count(name) > 0; }
  const std::string& dir() const { return dir_; }
  size_t size() const { return entries_.size(); }
  // The bytes of the sessions' files together (what max_bytes bounds).
  uint64_t total_bytes() const;

  // The session file's name for `name`: "s-" + 16 hex digits of its XXH64 + ".wmsess".
  static std::string file_of(const std::string& name);
  // The file formats alone (tests, tools). encode gives a session file of format 2 (the format
  // before; still read). decode reads either format's bytes: the snapshot, *name and *note.
  // Throws wm::CorruptData naming `where` on damaged bytes.
  static std::string encode(const std::string& name, const SessionSnapshot& snap, const nlohmann::json& note);
  static SessionSnapshot decode(const std::string& bytes, const std::string& where, std::string* name,
                                nlohmann::json* note);

  // A piece of a block as a file of format 3 holds it (public for the implementation's helpers).
  struct Piece {
    uint64_t offset = 0, bytes = 0, sum = 0;  // the BLOB's payload: where, how long, its XXH64
    std::vector<int64_t> tokens;              // per layer (empty for a head)
  };
  // What a session's file of format 3 holds, as far as the next save needs it.
  struct Layout {
    bool current = false;  // format 3 (else the next save writes the file whole)
    uint64_t end = 0;      // the end of the last manifest's record: where the next save appends
    uint64_t live = 0;     // bytes the last manifest uses (magic, its records, itself)
    std::map<std::string, std::vector<Piece>> chains;   // "window:" or "bank:" + block id -> its pieces
    std::map<std::pair<uint64_t, uint64_t>, uint64_t> blobs;  // (xxh64, bytes) -> offset, every valid BLOB
  };

 private:
  struct Entry {
    uint64_t bytes = 0;  // the file's size
    uint64_t used = 0;   // the clock at its last save or load (least recently used first)
    Layout layout;
  };
  void write_index();
  // Moves a session file aside (never deletes it); returns the new name, or "" after logging
  // why it could not be moved.
  std::string quarantine(const std::string& file, const std::string& why);
  void remove_file(const std::string& file);  // the session file, then the folder flushed
  std::vector<std::string> apply_budget(const std::string& saved);
  // Takes the folder's lock (one owner at a time) and writes this process's id into the lock
  // file. Throws wm::Error naming the holder's pid when another process holds it.
  void lock_folder();
  // Reads session file f of the folder into found_ and entries_: its session's name, *mtime its
  // modification time in ns. A file gone meanwhile gives ""; a damaged one is moved aside (logged)
  // and gives "". Throws wm::Error when out of resources (not a fault of the file).
  std::string adopt_file(const std::string& f, int64_t* mtime);
  void say(const std::string& msg) const {
    if (log_) log_(msg);
  }

  struct Fd {
    int fd = -1;
    Fd() = default;
    Fd(const Fd&) = delete;
    Fd& operator=(const Fd&) = delete;
    ~Fd();
  };

  std::string dir_;
  std::function<void(const std::string&)> log_;
  SessionFolderOptions opt_;
  Fd dirfd_;   // the folder, opened once
  Fd lockfd_;  // .wmsess.lock, flock'ed for this object's life
  std::map<std::string, Entry> entries_;  // name -> its file's state (the file is file_of(name))
  uint64_t clock_ = 0;
  std::map<std::string, StoredSession> found_;
};

}  // namespace wm::llm
