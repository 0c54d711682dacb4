#pragma once
// Spill files: one block per file, checksummed. Layout: the magic "WMKVBLK1", a little-endian
// u64 header length, a JSON header (identity, metadata, statistics, and per tensor its dtype,
// shape and byte range), the payload, then a u64 XXH64 of header and payload. A damaged or
// truncated file is reported (wm::CorruptData naming the file), never loaded as garbage.
#include <string>

#include "runtime/block.h"

namespace wm {

// Writes the block (tensors copied to the CPU as needed) to `path` through a temporary file
// and a rename. Returns the bytes written. Throws wm::Error on an I/O failure.
size_t write_spill_file(const std::string& path, const Block& block);

// Reads a block back onto the CPU, bit-exact. Throws wm::CorruptData if the magic, sizes or
// checksum are wrong, wm::Error if the file cannot be read.
Block read_spill_file(const std::string& path);

}  // namespace wm
