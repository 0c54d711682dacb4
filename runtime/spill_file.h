#pragma once
// Spill files: one block per file, checksummed. Layout: the magic "WMKVBLK1", a little-endian
// u64 header length, a JSON header (identity, metadata, statistics, and per tensor its dtype,
// shape and byte range), the payload, then a u64 XXH64 of header and payload. The metadata's
// embedding is one more tensor; its BlockPayload, if any, is the header's "meta_payload":
// {"type", "data"} (BlockPayload::to_json), decoded on reading by the decoder registered for
// its type (register_block_payload). A damaged or truncated file is reported (wm::CorruptData
// naming the file), never loaded as garbage.
#include <nlohmann/json_fwd.hpp>
#include <string>

#include "runtime/block.h"

namespace wm {

// Writes the block (tensors copied to the CPU as needed) to `path` through a temporary file
// and a rename. Returns the bytes written. Throws wm::Error on an I/O failure.
size_t write_spill_file(const std::string& path, const Block& block);

// Reads a block back onto the CPU, bit-exact, metadata included. Throws wm::CorruptData if the
// magic, sizes, checksum or payload's JSON are wrong, wm::Error if the file cannot be read or no
// decoder is registered for its payload's type.
Block read_spill_file(const std::string& path);

// The same format in memory (what the remote tier stores as a value). `extra`, when not null,
// goes into the header as "extra" (the remote tier keeps the store's namespace and the block's
// identity there); spill files written by write_spill_file have none.
std::string encode_block(const Block& block, const nlohmann::json& extra);
// A block decoded from encode_block's bytes (or a spill file's), on the CPU, with every check of
// read_spill_file; `where` names the source in errors. Sets *extra to the header's "extra" (null
// when absent) if extra is not null. Throws wm::CorruptData on damaged bytes.
Block decode_block(const void* bytes, size_t size, const std::string& where, nlohmann::json* extra = nullptr);

}  // namespace wm
