#pragma once
// Sessions kept in the remote store (runtime/remote_store.h), so that a conversation goes on in
// another process, or in this one after a restart: the session's snapshot (llmkv/session.h,
// LlmSession::snapshot) as its blocks, each a value under the content key of its bytes, and a
// manifest under the session's name listing them, with the snapshot's state and a checksum.
//
// Saving writes the blocks the previous manifest did not list, then the new manifest (one SET:
// a reader sees the old session or the new one, never a mix), then deletes the blocks only the
// old one listed. Loading checks the manifest's checksum and every block's (the store's own
// checks), and a damaged or incomplete session is reported, never used.
#include <string>

#include "llmkv/session.h"
#include "runtime/remote_store.h"

namespace wm::llm {

// Saves the session under `name`. Throws wm::Error when the store cannot take it (unreachable,
// slow, refusing), the previously saved session then staying as it was; and what
// LlmSession::snapshot() throws.
void save_session(const LlmSession& session, RemoteStore& store, const std::string& name);

// Restores the session saved under `name`: true when found and restored, false when no session of
// that name is in the store. Throws wm::Error when the store is unreachable (a conversation is
// not silently started afresh), wm::CorruptData when the manifest is damaged and wm::LostData
// when a block it lists is gone or damaged (the session is then empty); and what
// LlmSession::restore() throws.
bool load_session(LlmSession& session, RemoteStore& store, const std::string& name);

// Deletes the session saved under `name` (its manifest and blocks); false when there was none.
// Throws wm::Error when the store is unreachable.
bool erase_session(RemoteStore& store, const std::string& name);

}  // namespace wm::llm
