#include "llmkv/session_store.h"

#include <nlohmann/json.hpp>
#include <set>

#include "runtime/error.h"
#include "runtime/hash.h"

namespace wm::llm {

namespace {

constexpr const char kMagic[] = "WMSESS1\n";  // then 16 hex digits of the body's XXH64, '\n', the body
constexpr size_t kMagicLen = sizeof kMagic - 1;

// The manifest under `key`: its body, or null when absent. Throws wm::Error when the store
// failed, wm::CorruptData when the value is damaged.
nlohmann::json read_manifest(RemoteStore& store, const std::string& key, const std::string& name) {
  bool failed = false;
  const std::optional<std::string> v = store.get_value(key, &failed);
  if (failed)
    throw Error(str_cat("session '", name, "': the kv store ", store.endpoint().url,
                        " did not answer; the session is neither loaded nor started afresh"));
  if (!v) return nullptr;
  const std::string where = str_cat("session '", name, "' (", key, ")");
  if (v->size() < kMagicLen + 17 || v->compare(0, kMagicLen, kMagic) != 0 || (*v)[kMagicLen + 16] != '\n')
    throw CorruptData(where + ": not a session manifest");
  const std::string body = v->substr(kMagicLen + 17);
  if (v->compare(kMagicLen, 16, hex64(xxh64(body.data(), body.size()))) != 0)
    throw CorruptData(where + ": the manifest's checksum does not match");
  try {
    nlohmann::json j = nlohmann::json::parse(body);
    if (!j.is_object() || !j.contains("state") || !j.contains("window") || !j.contains("bank"))
      throw CorruptData(where + ": the manifest lacks state, window or bank");
    return j;
  } catch (const nlohmann::json::exception& e) {
    throw CorruptData(str_cat(where, ": the manifest is not JSON: ", e.what()));
  }
}

// Keys a manifest lists (window and bank blocks).
std::set<std::string> keys_of(const nlohmann::json& manifest) {
  std::set<std::string> out;
  if (manifest.is_null()) return out;
  for (const char* part : {"window", "bank"})
    for (const auto& e : manifest.at(part)) out.insert(e.at(1).get<std::string>());
  return out;
}

}  // namespace

void save_session(const LlmSession& session, RemoteStore& store, const std::string& name) {
  const SessionSnapshot snap = session.snapshot();
  const std::string key = store.key_for("session", name);
  nlohmann::json old;
  try {
    old = read_manifest(store, key, name);
  } catch (const CorruptData&) {
    old = nullptr;  // replaced below
  }
  const std::set<std::string> had = keys_of(old);
  std::vector<RemoteStore::Put> puts;
  nlohmann::json window = nlohmann::json::array(), bank = nlohmann::json::array();
  std::set<std::string> listed;
  auto add = [&](const Block& b, nlohmann::json& list) {
    RemoteStore::Put p = store.put_of(b);
    p.kind = "session";
    list.push_back({b.id, p.key});
    listed.insert(p.key);
    if (!had.count(p.key)) puts.push_back(std::move(p));  // a block saved before is there already
  };
  for (const auto& b : snap.window) add(b, window);
  for (const auto& b : snap.bank) add(b, bank);
  if (!store.put_many(std::move(puts)))
    throw Error(str_cat("session '", name, "': the kv store ", store.endpoint().url,
                        " did not take its blocks; the session saved before stays"));
  const std::string body = nlohmann::json{{"name", name}, {"state", snap.state}, {"window", window}, {"bank", bank}}.dump();
  if (!store.put_value(key, kMagic + hex64(xxh64(body.data(), body.size())) + "\n" + body))
    throw Error(str_cat("session '", name, "': the kv store ", store.endpoint().url,
                        " did not take its manifest; the session saved before stays"));
  std::vector<std::string> stale;
  for (const auto& k : had)
    if (!listed.count(k)) stale.push_back(k);
  store.erase(stale);  // best effort: the budget or the TTL reclaims what an outage leaves
}

bool load_session(LlmSession& session, RemoteStore& store, const std::string& name) {
  const nlohmann::json m = read_manifest(store, store.key_for("session", name), name);
  if (m.is_null()) return false;
  SessionSnapshot snap;
  snap.state = m.at("state");
  std::vector<std::string> keys, ids;
  try {
    for (const char* part : {"window", "bank"})
      for (const auto& e : m.at(part)) ids.push_back(e.at(0).get<std::string>()), keys.push_back(e.at(1).get<std::string>());
  } catch (const nlohmann::json::exception& e) {
    throw CorruptData(str_cat("session '", name, "': a malformed block list: ", e.what()));
  }
  std::vector<std::optional<Block>> got = store.get_many(keys, ids);
  const size_t n_window = m.at("window").size();
  for (size_t i = 0; i < got.size(); ++i) {
    if (!got[i]) {
      session.reset();
      throw LostData(str_cat("session '", name, "': its block '", ids[i], "' (", keys[i],
                             ") is gone from the kv store or damaged (expired, evicted, or the store is unreachable)"));
    }
    (i < n_window ? snap.window : snap.bank).push_back(std::move(*got[i]));
  }
  session.restore(snap);
  return true;
}

bool erase_session(RemoteStore& store, const std::string& name) {
  const std::string key = store.key_for("session", name);
  nlohmann::json m;
  try {
    m = read_manifest(store, key, name);
  } catch (const CorruptData&) {
    m = nullptr;
    if (!store.erase({key})) throw Error(str_cat("session '", name, "': the kv store did not answer"));
    return true;
  }
  if (m.is_null()) return false;
  std::vector<std::string> keys{key};
  for (const auto& k : keys_of(m)) keys.push_back(k);
  if (!store.erase(keys)) throw Error(str_cat("session '", name, "': the kv store did not answer"));
  return true;
}

}  // namespace wm::llm
