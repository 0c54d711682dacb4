#pragma once
// Policies registered by name: a table of (name, factory) pairs in the order programs list them,
// and the look-up every registry shares (an unknown name is a wm::Error listing the known ones).
#include <string>
#include <utility>
#include <vector>

#include "runtime/error.h"

namespace wm {

template <class Factory>
using NamedFactories = std::vector<std::pair<std::string, Factory>>;

template <class Factory>
std::vector<std::string> registered_names(const NamedFactories<Factory>& table) {
  std::vector<std::string> out;
  out.reserve(table.size());
  for (const auto& entry : table) out.push_back(entry.first);
  return out;
}

// The factory registered under `name`; `what` names the kind in the error ("memory policy").
template <class Factory>
Factory find_registered(const NamedFactories<Factory>& table, const std::string& name, const std::string& what) {
  for (const auto& entry : table)
    if (entry.first == name) return entry.second;
  std::string known;
  for (const auto& entry : table) known += (known.empty() ? "" : ", ") + entry.first;
  throw Error(str_cat("unknown ", what, " '", name, "' (known: ", known, ")"));
}

}  // namespace wm
