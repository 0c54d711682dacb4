#pragma once
// The remote KV tier's options, shared by the programs that can use it (--kv-store URL and its
// budget, TTL and deadline), and the store they open. Header-only; only the programs include it.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <memory>
#include <string>

#include "runtime/error.h"
#include "runtime/remote_store.h"
#include "tools/cli/validators.h"

namespace wm::cli {

struct KvStoreOptions {
  std::string url;          // empty: no remote tier
  double mib = 0;           // the namespace's budget in the store (0: none)
  double ttl_s = 0;         // keys expire this long after their last write (0: never)
  int deadline_ms = 200;    // an operation's limit; a later answer is a miss and the block is recomputed
};

// `what`: what the store holds for this program, for --help ("the chunk cache's entries").
inline void add_kv_store_options(CLI::App& app, KvStoreOptions& o, const std::string& what) {
  app.add_option("--kv-store", o.url,
                 "a Redis server for " + what +
                     ", shared with other processes of the same model: redis://HOST[:PORT][/DB] or "
                     "unix:///PATH[?db=N]; a password comes from $WM_KV_STORE_PASSWORD, never the command line. "
                     "Unreachable or lost: the run goes on with its local tiers and recomputes");
  app.add_option("--kv-store-mib", o.mib, "--kv-store: this model's budget in the store in MiB, beyond which its "
                                          "least recently used values are deleted (0: none)")
      ->capture_default_str()
      ->check(FiniteRange(0.0, 1e9));
  app.add_option("--kv-store-ttl", o.ttl_s, "--kv-store: seconds a value lives after its last write (0: forever)")
      ->capture_default_str()
      ->check(FiniteRange(0.0, 1e9));
  app.add_option("--kv-store-deadline-ms", o.deadline_ms,
                 "--kv-store: the longest one store operation may take; a later answer counts as a miss")
      ->capture_default_str()
      ->check(CLI::Range(1, 600000));
}

// The store for namespace `ns` (the model's identity), or null without --kv-store. A store that
// is unreachable now is a warning (its first operations are misses), a bad URL a wm::Error.
inline std::shared_ptr<RemoteStore> open_kv_store(const KvStoreOptions& o, const std::string& ns) {
  if (o.url.empty()) return nullptr;
  RemoteConfig rc;
  rc.url = o.url;
  rc.ns = ns;
  if (o.mib > 0) rc.budget = static_cast<size_t>(o.mib * 1048576.0);
  rc.ttl_ms = static_cast<int64_t>(o.ttl_s * 1000.0);
  rc.deadline_ms = o.deadline_ms;
  return std::make_shared<RemoteStore>(rc);
}

}  // namespace wm::cli
