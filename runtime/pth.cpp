#include "runtime/pth.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <deque>
#include <fstream>
#include <functional>
#include <limits>
#include <set>
#include <unordered_map>

#include "runtime/error.h"
#include "runtime/safetensors.h"

namespace wm {
namespace {

// ---------------------------------------------------------------------------------------------
// Limits of a hostile file. Everything else is bounded by the file's own size.

constexpr uint64_t kMaxPickleBytes = 64ull << 20;   // a state dict of 100k tensors pickles to ~10 MiB
constexpr size_t kMaxValues = 8u << 20;             // objects the pickle may build (~100 bytes each)
constexpr size_t kMaxDims = 64;                     // dimensions of one tensor
constexpr size_t kMaxGlobalName = 256;              // bytes of a GLOBAL's module or name line
constexpr size_t kMaxTextNumber = 64;               // bytes of a protocol-0 number line
constexpr uint64_t kExtraTensorBytes = 64ull << 20;   // tensors total <= 4 x file + this

// ---------------------------------------------------------------------------------------------
// Little helpers.

uint16_t le16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
uint32_t le32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) | (static_cast<uint32_t>(p[2]) << 16) |
         (static_cast<uint32_t>(p[3]) << 24);
}
uint64_t le64(const uint8_t* p) { return static_cast<uint64_t>(le32(p)) | (static_cast<uint64_t>(le32(p + 4)) << 32); }

// a + b <= limit, without overflow.
bool fits(uint64_t a, uint64_t b, uint64_t limit) { return a <= limit && b <= limit - a; }

bool host_is_little_endian() {
  const uint16_t one = 1;
  uint8_t b = 0;
  std::memcpy(&b, &one, 1);
  return b == 1;
}

// CRC-32 (the zip / IEEE polynomial, reflected), bytewise with a table.
uint32_t crc32(const uint8_t* p, size_t n) {
  static const auto table = [] {
    std::vector<uint32_t> t(256);
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) c = table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

// True when [p, p + n) is well-formed UTF-8 (no overlong forms, no surrogates, <= U+10FFFF).
bool valid_utf8(const uint8_t* p, size_t n) {
  size_t i = 0;
  while (i < n) {
    const uint8_t c = p[i];
    size_t len = 0;
    uint32_t cp = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      len = 2, cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3, cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4, cp = c & 0x07;
    } else {
      return false;
    }
    if (n - i < len) return false;
    for (size_t k = 1; k < len; ++k) {
      if ((p[i + k] & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (p[i + k] & 0x3F);
    }
    if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) || cp > 0x10FFFF ||
        (cp >= 0xD800 && cp <= 0xDFFF))
      return false;
    i += len;
  }
  return true;
}

// A name as a message shows it: printable ASCII kept, other bytes as \xNN, long ones cut.
std::string shown(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size() && i < 120; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7F) {
      out.push_back(static_cast<char>(c));
    } else {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02x", c);
      out += b;
    }
  }
  if (s.size() > 120) out += "...";
  return out;
}

std::string dtype_text(at::ScalarType t) { return c10::toString(t); }

// The torch storage classes a state dict may name, and their element types.
const std::vector<std::pair<std::string, at::ScalarType>>& storage_types() {
  static const std::vector<std::pair<std::string, at::ScalarType>> t = {
      {"FloatStorage", at::kFloat},  {"HalfStorage", at::kHalf},   {"BFloat16Storage", at::kBFloat16},
      {"DoubleStorage", at::kDouble}, {"LongStorage", at::kLong},  {"IntStorage", at::kInt},
      {"ShortStorage", at::kShort},  {"CharStorage", at::kChar},   {"ByteStorage", at::kByte},
      {"BoolStorage", at::kBool}};
  return t;
}

// The pickled magic number that starts torch's legacy (pre-1.6) format: PROTO 2, LONG1 of 10
// bytes holding 0x1950a86a20f9469cfc6c.
constexpr uint8_t kLegacyMagic[] = {0x80, 0x02, 0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19};

// ---------------------------------------------------------------------------------------------
// The zip archive: the end-of-central-directory record (zip64 when present), the central
// directory, and each entry's local header for where its bytes start.

struct ZipEntry {
  std::string name;
  uint64_t data = 0;  // file offset of the entry's bytes
  uint64_t size = 0;  // uncompressed size
  uint64_t compressed = 0;
  uint16_t method = 0;
  uint16_t flags = 0;
  uint32_t crc = 0;
};

class ZipDirectory {
 public:
  ZipDirectory(const uint8_t* b, uint64_t n, const std::string& path) : path_(path) { read(b, n); }

  const ZipEntry* find(const std::string& name) const {
    auto it = index_.find(name);
    return it == index_.end() ? nullptr : &entries_[it->second];
  }
  const std::vector<ZipEntry>& entries() const { return entries_; }

  // Why entry `e` cannot be read as it is ("" when it is stored uncompressed and unencrypted).
  static std::string problem(const ZipEntry& e) {
    if (e.flags & 1) return str_cat("entry '", shown(e.name), "' is encrypted");
    if (e.method != 0)
      return str_cat("entry '", shown(e.name), "' is compressed (zip method ", e.method,
                     "); torch.save stores entries uncompressed and only those are read (re-pack the archive "
                     "without compression, e.g. `zip -0`)");
    return {};
  }

  // The entry `name`, which must be stored uncompressed and unencrypted. Throws CorruptData.
  const ZipEntry& stored(const std::string& name) const {
    const ZipEntry* e = find(name);
    if (e == nullptr) throw CorruptData(str_cat(path_, ": the archive has no entry '", shown(name), "'"));
    const std::string why = problem(*e);
    if (!why.empty()) throw CorruptData(str_cat(path_, ": ", why));
    return *e;
  }

 private:
  [[noreturn]] void bad(const std::string& what) const {
    throw CorruptData(str_cat(path_, ": not a readable zip archive: ", what));
  }

  void read(const uint8_t* b, uint64_t n) {
    if (n < 22) bad(str_cat("the file is ", n, " bytes, too short for the end-of-directory record"));
    // The end-of-central-directory record: the last one within the final 64 KiB + 22 bytes.
    uint64_t eocd = n;
    const uint64_t lowest = n > 22 + 0xFFFF ? n - 22 - 0xFFFF : 0;
    for (uint64_t p = n - 22 + 1; p-- > lowest;) {
      if (le32(b + p) == 0x06054b50u && p + 22 + le16(b + p + 20) <= n) {
        eocd = p;
        break;
      }
    }
    if (eocd == n) bad("no end-of-central-directory record (the file may be truncated)");
    const uint8_t* e = b + eocd;
    uint64_t count = le16(e + 10);
    uint64_t cd_size = le32(e + 12);
    uint64_t cd_offset = le32(e + 16);
    if (le16(e + 4) != 0 && le16(e + 4) != 0xFFFF) bad("a multi-disk archive");
    uint64_t cd_limit = eocd;  // the central directory ends before this
    // zip64: a locator right before the record points at the zip64 record.
    if (eocd >= 20 && le32(b + eocd - 20) == 0x07064b50u) {
      const uint64_t z = le64(b + eocd - 20 + 8);
      if (!fits(z, 56, eocd - 20) || le32(b + z) != 0x06064b50u) bad("the zip64 end-of-directory record is missing");
      count = le64(b + z + 32);
      cd_size = le64(b + z + 40);
      cd_offset = le64(b + z + 48);
      cd_limit = z;
    } else if (count == 0xFFFF || cd_size == 0xFFFFFFFFu || cd_offset == 0xFFFFFFFFu) {
      bad("zip64 sizes without a zip64 end-of-directory locator");
    }
    if (!fits(cd_offset, cd_size, cd_limit))
      bad(str_cat("the central directory [", cd_offset, ", +", cd_size, ") lies outside the file (", n,
                  " bytes); the file may be truncated"));
    if (count > cd_size / 46) bad(str_cat(count, " entries do not fit a central directory of ", cd_size, " bytes"));
    entries_.reserve(static_cast<size_t>(count));
    const uint64_t cd_end = cd_offset + cd_size;
    uint64_t p = cd_offset;
    for (uint64_t i = 0; i < count; ++i) {
      if (!fits(p, 46, cd_end) || le32(b + p) != 0x02014b50u) bad(str_cat("central directory entry ", i, " is damaged"));
      const uint8_t* c = b + p;
      ZipEntry z;
      z.flags = le16(c + 8);
      z.method = le16(c + 10);
      z.crc = le32(c + 16);
      z.compressed = le32(c + 20);
      z.size = le32(c + 24);
      const uint64_t name_len = le16(c + 28), extra_len = le16(c + 30), comment_len = le16(c + 32);
      uint64_t local = le32(c + 42);
      if (!fits(p + 46, name_len + extra_len + comment_len, cd_end))
        bad(str_cat("central directory entry ", i, " runs past the directory"));
      z.name.assign(reinterpret_cast<const char*>(c + 46), static_cast<size_t>(name_len));
      // The zip64 extra field holds, in this order, the fields whose 32-bit slot is all ones.
      const uint8_t* x = c + 46 + name_len;
      for (uint64_t q = 0; q + 4 <= extra_len;) {
        const uint16_t id = le16(x + q), len = le16(x + q + 2);
        if (q + 4 + len > extra_len) bad(str_cat("entry '", shown(z.name), "': an extra field runs past its end"));
        if (id == 0x0001) {
          const uint8_t* f = x + q + 4;
          uint64_t used = 0;
          auto next = [&](uint64_t& field) {
            if (used + 8 > len) bad(str_cat("entry '", shown(z.name), "': the zip64 extra field is too short"));
            field = le64(f + used);
            used += 8;
          };
          if (z.size == 0xFFFFFFFFu) next(z.size);
          if (z.compressed == 0xFFFFFFFFu) next(z.compressed);
          if (local == 0xFFFFFFFFu) next(local);
        }
        q += 4 + len;
      }
      // The local header: its own name and extra lengths decide where the bytes start.
      if (!fits(local, 30, n) || le32(b + local) != 0x04034b50u)
        bad(str_cat("entry '", shown(z.name), "': no local header at offset ", local));
      const uint64_t data = local + 30 + le16(b + local + 26) + le16(b + local + 28);
      if (!fits(data, z.compressed, cd_offset))
        bad(str_cat("entry '", shown(z.name), "': its ", z.compressed, " bytes at offset ", data,
                    " run past the archive's data (", cd_offset, " bytes); the file may be truncated"));
      if (z.method == 0 && z.compressed != z.size)
        bad(str_cat("entry '", shown(z.name), "' is stored but its sizes differ (", z.compressed, " and ", z.size, ")"));
      z.data = data;
      if (!index_.emplace(z.name, entries_.size()).second) bad(str_cat("entry '", shown(z.name), "' appears twice"));
      entries_.push_back(std::move(z));
      p += 46 + name_len + extra_len + comment_len;
    }
  }

  std::string path_;
  std::vector<ZipEntry> entries_;
  std::unordered_map<std::string, size_t> index_;
};

// ---------------------------------------------------------------------------------------------
// The restricted unpickler. Objects live in an arena and refer to each other by index, so a
// pickle that makes a list contain itself builds no ownership cycle and no recursion.

enum class Kind : uint8_t { None, Bool, Int, Float, Str, Bytes, Tuple, List, Dict, Global, Storage, Tensor };

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::None: return "None";
    case Kind::Bool: return "a bool";
    case Kind::Int: return "an int";
    case Kind::Float: return "a float";
    case Kind::Str: return "a str";
    case Kind::Bytes: return "bytes";
    case Kind::Tuple: return "a tuple";
    case Kind::List: return "a list";
    case Kind::Dict: return "a dict";
    case Kind::Global: return "a class or function";
    case Kind::Storage: return "a storage";
    case Kind::Tensor: return "a tensor";
  }
  return "an object";
}

// The globals a state dict may name.
enum class Global : uint8_t {
  OrderedDict,
  RebuildTensor,
  RebuildTensorV2,
  RebuildParameter,
  RebuildParameterWithState,
  StorageType
};

struct Value {
  Kind kind = Kind::None;
  Global global = Global::OrderedDict;  // Kind::Global
  at::ScalarType dtype = at::kFloat;    // Kind::Global with StorageType
  int64_t i = 0;                        // Int, Bool; Storage and Tensor: index into their tables
  double f = 0;                         // Float
  std::string s;                        // Str, Bytes; Global: "module.name"
  std::vector<uint32_t> items;          // Tuple, List; Dict: key, value, key, value, ...
  std::unique_ptr<std::unordered_map<std::string, size_t>> str_keys;  // Dict: str key -> pair index
};

struct StorageRef {
  std::string key;
  at::ScalarType dtype = at::kFloat;
  int64_t numel = 0;
  uint64_t begin = 0;  // file offset of its bytes
};

struct TensorDesc {
  size_t storage = 0;
  int64_t offset = 0;
  std::vector<int64_t> shape, stride;
  int64_t numel = 0;
  int64_t last = 0;  // highest storage element it reads (numel > 0)
};

class Unpickler {
 public:
  // `storage(key, dtype, numel)` validates a storage reference against the archive and returns
  // its index in `storages`.
  Unpickler(const uint8_t* data, size_t size, std::string where,
            std::function<size_t(const std::string&, at::ScalarType, int64_t)> storage)
      : p_(data), n_(size), where_(std::move(where)), storage_(std::move(storage)) {}

  // Runs to STOP; returns the index of the pickled object.
  uint32_t run();

  const Value& at(uint32_t i) const { return vals_[i]; }
  const std::vector<TensorDesc>& tensors() const { return tensors_; }

 private:
  [[noreturn]] void bad(const std::string& what) const {
    throw CorruptData(str_cat(where_, " at byte ", op_pos_, ": ", what));
  }

  // Reading the stream.
  const uint8_t* take(uint64_t k) {
    if (k > n_ - pos_) bad(str_cat("the pickle ends inside an opcode (needs ", k, " more bytes, ", n_ - pos_, " left)"));
    const uint8_t* r = p_ + pos_;
    pos_ += static_cast<size_t>(k);
    return r;
  }
  uint8_t u8() { return *take(1); }
  std::string line(size_t max_len);
  int64_t parse_text_int(const std::string& s);

  // Objects.
  uint32_t make(Value v) {
    if (vals_.size() >= kMaxValues) bad(str_cat("more than ", kMaxValues, " objects"));
    vals_.push_back(std::move(v));
    return static_cast<uint32_t>(vals_.size() - 1);
  }
  uint32_t make_kind(Kind k) {
    Value v;
    v.kind = k;
    return make(std::move(v));
  }
  uint32_t make_int(int64_t i, Kind k = Kind::Int) {
    Value v;
    v.kind = k;
    v.i = i;
    return make(std::move(v));
  }
  uint32_t make_str(const uint8_t* s, uint64_t len, Kind k);

  // The stack.
  void push(uint32_t v) {
    if (stack_.size() >= kMaxValues) bad(str_cat("the stack grows past ", kMaxValues, " objects"));
    stack_.push_back(v);
  }
  uint32_t pop() {
    if (stack_.size() <= floor()) bad("the stack is empty (or only a MARK is left)");
    const uint32_t v = stack_.back();
    stack_.pop_back();
    return v;
  }
  uint32_t& top() {
    if (stack_.size() <= floor()) bad("the stack is empty (or only a MARK is left)");
    return stack_.back();
  }
  size_t floor() const { return marks_.empty() ? 0 : marks_.back(); }
  // The items above the last MARK, which is removed.
  std::vector<uint32_t> pop_mark() {
    if (marks_.empty()) bad("an opcode needs a MARK and there is none");
    const size_t m = marks_.back();
    marks_.pop_back();
    std::vector<uint32_t> items(stack_.begin() + static_cast<std::ptrdiff_t>(m), stack_.end());
    stack_.resize(m);
    return items;
  }
  Value& expect(uint32_t i, Kind k, const char* what) {
    Value& v = vals_[i];
    if (v.kind != k) bad(str_cat(what, " must be ", kind_name(k), ", got ", kind_name(v.kind)));
    return v;
  }
  int64_t expect_int(uint32_t i, const char* what) { return expect(i, Kind::Int, what).i; }

  void dict_set(uint32_t dict, uint32_t key, uint32_t value);
  void list_append(uint32_t list, const std::vector<uint32_t>& items);
  uint32_t global(const std::string& module, const std::string& name);
  uint32_t reduce(uint32_t callable, uint32_t args);
  uint32_t persistent_load(uint32_t pid);
  uint32_t rebuild_tensor(const std::vector<uint32_t>& args);

  // The opcodes by family (pickletools' names in the comments): each reads one opcode `op` of
  // its family and returns true, or returns false for an opcode of another family.
  bool load_control(uint8_t op);    // PROTO, FRAME, MARK, POP, POP_MARK, DUP
  bool load_scalar(uint8_t op);     // None, booleans, integers, floats
  bool load_string(uint8_t op);     // str (UTF-8 checked) and bytes
  bool load_container(uint8_t op);  // tuples, lists and dicts, and their items
  bool load_memo(uint8_t op);       // PUT and GET, binary and text
  bool load_object(uint8_t op);     // GLOBAL, REDUCE, NEWOBJ, BUILD, BINPERSID
  uint32_t load_long(uint8_t op);   // LONG1 or LONG4: a little-endian two's complement integer
  uint32_t new_object(uint8_t op);  // NEWOBJ or NEWOBJ_EX: only an empty OrderedDict
  void memo_put(uint64_t key) {
    if (stack_.empty()) bad("memoizing with an empty stack");
    if (memo_.size() >= kMaxValues) bad(str_cat("the memo grows past ", kMaxValues, " objects"));
    memo_[key] = stack_.back();
  }
  uint32_t memo_get(uint64_t key) {
    auto it = memo_.find(key);
    if (it == memo_.end()) bad(str_cat("memo key ", key, " was never stored"));
    return it->second;
  }

  const uint8_t* p_;
  size_t n_;
  size_t pos_ = 0, op_pos_ = 0;
  std::string where_;
  std::function<size_t(const std::string&, at::ScalarType, int64_t)> storage_;
  std::deque<Value> vals_;
  std::vector<uint32_t> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint64_t, uint32_t> memo_;
  std::vector<TensorDesc> tensors_;
};

std::string Unpickler::line(size_t max_len) {
  const size_t start = pos_;
  while (pos_ < n_ && p_[pos_] != '\n') {
    if (pos_ - start >= max_len) bad(str_cat("a text argument is longer than ", max_len, " bytes"));
    ++pos_;
  }
  if (pos_ >= n_) bad("the pickle ends inside a text argument");
  std::string s(reinterpret_cast<const char*>(p_ + start), pos_ - start);
  ++pos_;  // the newline
  return s;
}

int64_t Unpickler::parse_text_int(const std::string& s0) {
  std::string s = s0;
  if (!s.empty() && s.back() == 'L') s.pop_back();  // protocol 0's LONG
  size_t i = 0;
  bool neg = false;
  if (i < s.size() && (s[i] == '-' || s[i] == '+')) neg = s[i++] == '-';
  if (i == s.size()) bad(str_cat("'", shown(s0), "' is not an integer"));
  uint64_t v = 0;
  for (; i < s.size(); ++i) {
    if (s[i] < '0' || s[i] > '9') bad(str_cat("'", shown(s0), "' is not an integer"));
    const uint64_t d = static_cast<uint64_t>(s[i] - '0');
    if (v > (static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) + 1 - d) / 10)
      bad(str_cat("integer '", shown(s0), "' does not fit 64 bits"));
    v = v * 10 + d;
  }
  if (!neg && v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    bad(str_cat("integer '", shown(s0), "' does not fit 64 bits"));
  return neg ? static_cast<int64_t>(0 - v) : static_cast<int64_t>(v);
}

uint32_t Unpickler::make_str(const uint8_t* s, uint64_t len, Kind k) {
  if (k == Kind::Str && !valid_utf8(s, static_cast<size_t>(len))) bad("a string is not valid UTF-8");
  Value v;
  v.kind = k;
  v.s.assign(reinterpret_cast<const char*>(s), static_cast<size_t>(len));
  return make(std::move(v));
}

void Unpickler::dict_set(uint32_t dict, uint32_t key, uint32_t value) {
  Value& d = vals_[dict];
  if (d.kind != Kind::Dict) bad(str_cat("SETITEM on ", kind_name(d.kind), ", not a dict"));
  const Value& k = vals_[key];
  if (k.kind == Kind::Str) {  // a repeated key replaces the value in place, as in Python
    if (!d.str_keys) d.str_keys = std::make_unique<std::unordered_map<std::string, size_t>>();
    auto [it, fresh] = d.str_keys->emplace(k.s, d.items.size() / 2);
    if (!fresh) {
      d.items[2 * it->second + 1] = value;
      return;
    }
  }
  d.items.push_back(key);
  d.items.push_back(value);
}

void Unpickler::list_append(uint32_t list, const std::vector<uint32_t>& items) {
  Value& l = vals_[list];
  if (l.kind != Kind::List) bad(str_cat("APPEND on ", kind_name(l.kind), ", not a list"));
  l.items.insert(l.items.end(), items.begin(), items.end());
}

uint32_t Unpickler::global(const std::string& module, const std::string& name) {
  Value v;
  v.kind = Kind::Global;
  v.s = module + "." + name;
  if (module == "collections" && name == "OrderedDict") {
    v.global = Global::OrderedDict;
  } else if (module == "torch._utils" && name == "_rebuild_tensor_v2") {
    v.global = Global::RebuildTensorV2;
  } else if (module == "torch._utils" && name == "_rebuild_tensor") {
    v.global = Global::RebuildTensor;
  } else if (module == "torch._utils" && name == "_rebuild_parameter") {
    v.global = Global::RebuildParameter;
  } else if (module == "torch._utils" && name == "_rebuild_parameter_with_state") {
    v.global = Global::RebuildParameterWithState;
  } else {
    bool storage = false;
    if (module == "torch")
      for (const auto& [n, t] : storage_types())
        if (n == name) storage = true, v.dtype = t;
    if (!storage)
      bad(str_cat("refuses the Python object '", shown(v.s), "' (only tensors and plain containers are read)"));
    v.global = Global::StorageType;
  }
  return make(std::move(v));
}

uint32_t Unpickler::persistent_load(uint32_t pid) {
  const Value& t = vals_[pid];
  if (t.kind != Kind::Tuple || t.items.size() != 5 || vals_[t.items[0]].kind != Kind::Str ||
      vals_[t.items[0]].s != "storage")
    bad("a persistent id must be ('storage', storage type, key, location, numel)");
  const Value& type = vals_[t.items[1]];
  if (type.kind != Kind::Global || type.global != Global::StorageType)
    bad(str_cat("a persistent id names ", type.kind == Kind::Global ? "'" + shown(type.s) + "'" : kind_name(type.kind),
                " where a torch storage type belongs"));
  const Value& key = vals_[t.items[2]];
  if (key.kind != Kind::Str) bad(str_cat("a storage key must be a str, got ", kind_name(key.kind)));
  if (vals_[t.items[3]].kind != Kind::Str) bad("a storage location must be a str");
  const Value& numel = vals_[t.items[4]];
  if (numel.kind != Kind::Int || numel.i < 0) bad("a storage's element count must be an int >= 0");
  const at::ScalarType dtype = type.dtype;
  const std::string k = key.s;
  const int64_t count = numel.i;
  size_t index = 0;
  try {
    index = storage_(k, dtype, count);
  } catch (const CorruptData& e) {
    bad(e.what());
  }
  Value v;
  v.kind = Kind::Storage;
  v.i = static_cast<int64_t>(index);
  v.dtype = dtype;
  return make(std::move(v));
}

uint32_t Unpickler::rebuild_tensor(const std::vector<uint32_t>& a) {
  const Value& st = vals_[a[0]];
  if (st.kind != Kind::Storage) bad(str_cat("a tensor's storage must be a storage, got ", kind_name(st.kind)));
  TensorDesc d;
  d.storage = static_cast<size_t>(st.i);
  d.offset = expect_int(a[1], "a tensor's storage offset");
  const Value& size = vals_[a[2]];
  const Value& stride = vals_[a[3]];
  if (size.kind != Kind::Tuple || stride.kind != Kind::Tuple) bad("a tensor's size and stride must be tuples");
  if (size.items.size() != stride.items.size())
    bad(str_cat("a tensor's size has ", size.items.size(), " dimensions, its stride ", stride.items.size()));
  if (size.items.size() > kMaxDims) bad(str_cat("a tensor has ", size.items.size(), " dimensions (at most ", kMaxDims, ")"));
  const std::vector<uint32_t> size_items = size.items, stride_items = stride.items;
  for (size_t k = 0; k < size_items.size(); ++k) {
    d.shape.push_back(expect_int(size_items[k], "a tensor's size"));
    d.stride.push_back(expect_int(stride_items[k], "a tensor's stride"));
  }
  const std::string what = str_cat(" (size ", c10::IntArrayRef(d.shape), ", stride ", c10::IntArrayRef(d.stride),
                                   ", offset ", d.offset, ")");
  if (d.offset < 0) bad("a negative storage offset" + what);
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  bool empty = false;
  for (size_t k = 0; k < d.shape.size(); ++k) {
    if (d.shape[k] < 0 || d.stride[k] < 0) bad("a negative size or stride" + what);
    empty = empty || d.shape[k] == 0;
  }
  // Elements, and the highest storage element a non-empty tensor reads, without overflow.
  d.numel = empty ? 0 : 1;
  int64_t last = d.offset;
  for (size_t k = 0; k < d.shape.size() && !empty; ++k) {
    if (d.numel > kMax / d.shape[k]) bad("the tensor's element count overflows" + what);
    d.numel *= d.shape[k];
    const int64_t span_k = d.shape[k] - 1;
    if (span_k > 0 && d.stride[k] > (kMax - last) / span_k) bad("the tensor's extent overflows" + what);
    last += span_k * d.stride[k];
  }
  d.last = last;
  const size_t elsize = c10::elementSize(st.dtype);
  if (d.numel > kMax / static_cast<int64_t>(elsize)) bad("the tensor's byte count overflows" + what);
  tensors_.push_back(std::move(d));
  Value v;
  v.kind = Kind::Tensor;
  v.i = static_cast<int64_t>(tensors_.size() - 1);
  v.dtype = st.dtype;
  return make(std::move(v));
}

uint32_t Unpickler::reduce(uint32_t callable, uint32_t args_i) {
  const Value& c = vals_[callable];
  if (c.kind != Kind::Global) bad(str_cat("REDUCE calls ", kind_name(c.kind), ", which is not callable"));
  const std::vector<uint32_t> a = expect(args_i, Kind::Tuple, "REDUCE's arguments").items;
  switch (c.global) {
    case Global::OrderedDict:
      if (!a.empty()) bad("collections.OrderedDict is only read when built empty");
      return make_kind(Kind::Dict);
    case Global::RebuildTensorV2:
      if (a.size() != 6 && a.size() != 7) bad(str_cat("_rebuild_tensor_v2 takes 6 or 7 arguments, got ", a.size()));
      return rebuild_tensor(a);
    case Global::RebuildTensor:
      if (a.size() != 4) bad(str_cat("_rebuild_tensor takes 4 arguments, got ", a.size()));
      return rebuild_tensor(a);
    case Global::RebuildParameter:
    case Global::RebuildParameterWithState: {
      const size_t want = c.global == Global::RebuildParameter ? 3 : 4;
      if (a.size() != want) bad(str_cat(shown(c.s), " takes ", want, " arguments, got ", a.size()));
      expect(a[0], Kind::Tensor, "a parameter's data");
      return a[0];  // a parameter is read as its tensor
    }
    case Global::StorageType: break;
  }
  bad(str_cat("'", shown(c.s), "' is not called by a state dict"));
}

uint32_t Unpickler::run() {
  while (true) {
    op_pos_ = pos_;
    const uint8_t op = u8();
    if (op == '.') {  // STOP
      if (stack_.size() != 1 || !marks_.empty())
        bad(str_cat("STOP with ", stack_.size(), " objects on the stack and ", marks_.size(), " marks (expected 1 and 0)"));
      return stack_.back();
    }
    if (!load_control(op) && !load_scalar(op) && !load_string(op) && !load_container(op) && !load_memo(op) &&
        !load_object(op))
      bad(str_cat("unsupported pickle opcode 0x", [&] {
            char b[4];
            std::snprintf(b, sizeof b, "%02x", op);
            return std::string(b);
          }(), op >= 0x20 && op < 0x7f ? str_cat(" ('", static_cast<char>(op), "')") : std::string(),
          " (a state dict does not use it)"));
  }
}

bool Unpickler::load_control(uint8_t op) {
  switch (op) {
    case 0x80: {  // PROTO
      const uint8_t v = u8();
      if (v > 5) bad(str_cat("pickle protocol ", int(v), " (at most 5 is read)"));
      return true;
    }
    case 0x95: {  // FRAME: a length hint; the frame's opcodes follow inline
      const uint64_t len = le64(take(8));
      if (len > n_ - pos_) bad(str_cat("a frame of ", len, " bytes runs past the pickle"));
      return true;
    }
    case '(':  // MARK
      if (marks_.size() >= kMaxValues) bad("too many marks");
      marks_.push_back(stack_.size());
      return true;
    case '0': pop(); return true;        // POP
    case '1': pop_mark(); return true;   // POP_MARK
    case '2': push(top()); return true;  // DUP
    default: return false;
  }
}

uint32_t Unpickler::load_long(uint8_t op) {
  const uint64_t len = op == 0x8a ? u8() : le32(take(4));
  const uint8_t* b = take(len);
  uint64_t v = 0;
  for (uint64_t k = 0; k < len && k < 8; ++k) v |= static_cast<uint64_t>(b[k]) << (8 * k);
  const bool neg = len > 0 && (b[len - 1] & 0x80);
  if (len > 0 && len < 8 && neg) v |= ~0ull << (8 * len);  // sign-extend
  for (uint64_t k = 8; k < len; ++k)
    if (b[k] != (neg ? 0xFF : 0x00)) bad("an integer does not fit 64 bits");
  if (len > 8 && ((v >> 63) != 0) != neg) bad("an integer does not fit 64 bits");
  return make_int(static_cast<int64_t>(v));
}

bool Unpickler::load_scalar(uint8_t op) {
  switch (op) {
    case 'N': push(make_kind(Kind::None)); return true;
    case 0x88: push(make_int(1, Kind::Bool)); return true;  // NEWTRUE
    case 0x89: push(make_int(0, Kind::Bool)); return true;  // NEWFALSE
    case 'K': push(make_int(u8())); return true;                         // BININT1
    case 'M': push(make_int(le16(take(2)))); return true;                // BININT2
    case 'J': push(make_int(static_cast<int32_t>(le32(take(4))))); return true;  // BININT
    case 0x8a:  // LONG1
    case 0x8b:  // LONG4
      push(load_long(op));
      return true;
    case 'I': {  // INT (protocol 0/1; "01" and "00" are True and False)
      const std::string s = line(kMaxTextNumber);
      if (s == "01" || s == "00") push(make_int(s == "01", Kind::Bool));
      else push(make_int(parse_text_int(s)));
      return true;
    }
    case 'L': push(make_int(parse_text_int(line(kMaxTextNumber)))); return true;  // LONG (text)
    case 'G': {  // BINFLOAT: big-endian double
      const uint8_t* b = take(8);
      uint64_t bits = 0;
      for (int k = 0; k < 8; ++k) bits = (bits << 8) | b[k];
      Value v;
      v.kind = Kind::Float;
      std::memcpy(&v.f, &bits, 8);
      push(make(std::move(v)));
      return true;
    }
    case 'F': {  // FLOAT (text)
      const std::string s = line(kMaxTextNumber);
      char* end = nullptr;
      Value v;
      v.kind = Kind::Float;
      v.f = std::strtod(s.c_str(), &end);
      if (s.empty() || end != s.c_str() + s.size()) bad(str_cat("'", shown(s), "' is not a float"));
      push(make(std::move(v)));
      return true;
    }
    default: return false;
  }
}

bool Unpickler::load_string(uint8_t op) {
  uint64_t len = 0;
  Kind kind = Kind::Str;
  switch (op) {
    case 'X': len = le32(take(4)); break;     // BINUNICODE
    case 0x8c: len = u8(); break;             // SHORT_BINUNICODE
    case 0x8d: len = le64(take(8)); break;    // BINUNICODE8
    case 'T':  // BINSTRING (a Python 2 str, read as bytes)
    case 'B':  // BINBYTES
      len = le32(take(4));
      if (op == 'T' && (len >> 31)) bad("a negative string length");
      kind = Kind::Bytes;
      break;
    case 'U':  // SHORT_BINSTRING
    case 'C':  // SHORT_BINBYTES
      len = u8();
      kind = Kind::Bytes;
      break;
    case 0x8e:  // BINBYTES8
      len = le64(take(8));
      kind = Kind::Bytes;
      break;
    default: return false;
  }
  push(make_str(take(len), len, kind));
  return true;
}

bool Unpickler::load_container(uint8_t op) {
  switch (op) {
    case '}': push(make_kind(Kind::Dict)); return true;   // EMPTY_DICT
    case ']': push(make_kind(Kind::List)); return true;   // EMPTY_LIST
    case ')': push(make_kind(Kind::Tuple)); return true;  // EMPTY_TUPLE
    case 't':    // TUPLE
    case 'l': {  // LIST
      Value v;
      v.kind = op == 't' ? Kind::Tuple : Kind::List;
      v.items = pop_mark();
      push(make(std::move(v)));
      return true;
    }
    case 0x85:    // TUPLE1
    case 0x86:    // TUPLE2
    case 0x87: {  // TUPLE3
      const size_t k = static_cast<size_t>(op - 0x84);
      if (stack_.size() < floor() + k) bad(str_cat("TUPLE", k, " needs ", k, " objects on the stack"));
      Value v;
      v.kind = Kind::Tuple;
      v.items.assign(stack_.end() - static_cast<std::ptrdiff_t>(k), stack_.end());
      stack_.resize(stack_.size() - k);
      push(make(std::move(v)));
      return true;
    }
    case 'd': {  // DICT
      const std::vector<uint32_t> items = pop_mark();
      if (items.size() % 2) bad("DICT needs key, value pairs");
      const uint32_t d = make_kind(Kind::Dict);
      for (size_t k = 0; k < items.size(); k += 2) dict_set(d, items[k], items[k + 1]);
      push(d);
      return true;
    }
    case 's': {  // SETITEM
      const uint32_t v = pop(), k = pop();
      dict_set(top(), k, v);
      return true;
    }
    case 'u': {  // SETITEMS
      const std::vector<uint32_t> items = pop_mark();
      if (items.size() % 2) bad("SETITEMS needs key, value pairs");
      const uint32_t d = top();
      for (size_t k = 0; k < items.size(); k += 2) dict_set(d, items[k], items[k + 1]);
      return true;
    }
    case 'a': {  // APPEND
      const uint32_t v = pop();
      list_append(top(), {v});
      return true;
    }
    case 'e': {  // APPENDS
      const std::vector<uint32_t> items = pop_mark();
      list_append(top(), items);
      return true;
    }
    default: return false;
  }
}

bool Unpickler::load_memo(uint8_t op) {
  switch (op) {
    case 'q': memo_put(u8()); return true;          // BINPUT
    case 'r': memo_put(le32(take(4))); return true;  // LONG_BINPUT
    case 0x94: memo_put(memo_.size()); return true;  // MEMOIZE
    case 'h': push(memo_get(u8())); return true;          // BINGET
    case 'j': push(memo_get(le32(take(4)))); return true;  // LONG_BINGET
    case 'p':    // PUT (text)
    case 'g': {  // GET (text)
      const int64_t k = parse_text_int(line(kMaxTextNumber));
      if (k < 0) bad("a negative memo key");
      if (op == 'p')
        memo_put(static_cast<uint64_t>(k));
      else
        push(memo_get(static_cast<uint64_t>(k)));
      return true;
    }
    default: return false;
  }
}

bool Unpickler::load_object(uint8_t op) {
  switch (op) {
    case 'c': {  // GLOBAL "module\nname\n"
      const std::string module = line(kMaxGlobalName);
      const std::string name = line(kMaxGlobalName);
      push(global(module, name));
      return true;
    }
    case 0x93: {  // STACK_GLOBAL
      const uint32_t name = pop(), module = pop();
      if (vals_[name].kind != Kind::Str || vals_[module].kind != Kind::Str)
        bad("STACK_GLOBAL needs a module and a name as str");
      push(global(vals_[module].s, vals_[name].s));
      return true;
    }
    case 'R': {  // REDUCE
      const uint32_t args = pop(), callable = pop();
      push(reduce(callable, args));
      return true;
    }
    case 0x81:  // NEWOBJ
    case 0x92:  // NEWOBJ_EX
      push(new_object(op));
      return true;
    case 'b': {  // BUILD: an OrderedDict's attributes (_metadata) or a tensor's state, ignored
      pop();
      const Kind k = vals_[top()].kind;
      if (k != Kind::Dict && k != Kind::Tensor) bad(str_cat("BUILD on ", kind_name(k), " (only dicts and tensors)"));
      return true;
    }
    case 'Q': push(persistent_load(pop())); return true;  // BINPERSID
    default: return false;
  }
}

uint32_t Unpickler::new_object(uint8_t op) {
  if (op == 0x92) {
    const uint32_t kwargs = pop();
    if (vals_[kwargs].kind != Kind::Dict || !vals_[kwargs].items.empty()) bad("NEWOBJ_EX with keyword arguments");
  }
  const uint32_t args = pop(), cls = pop();
  const Value& c = vals_[cls];
  if (c.kind != Kind::Global || c.global != Global::OrderedDict)
    bad(str_cat("NEWOBJ of ", c.kind == Kind::Global ? "'" + shown(c.s) + "'" : kind_name(c.kind),
                " (only collections.OrderedDict is built this way)"));
  if (!expect(args, Kind::Tuple, "NEWOBJ's arguments").items.empty())
    bad("collections.OrderedDict is only read when built empty");
  return make_kind(Kind::Dict);
}

// ---------------------------------------------------------------------------------------------

std::string storage_entry(const std::string& prefix, const std::string& key) { return prefix + "data/" + key; }

}  // namespace

namespace {

// A read-only mapping of the whole file while open() reads the archive's directory and the
// pickle; gone when open() returns (tensor bytes are read with pread, so a multi-GB file is not
// left mapped and counted in the process's resident memory).
struct ScopedMap {
  void* base = MAP_FAILED;
  size_t size = 0;
  ~ScopedMap() {
    if (base != MAP_FAILED && size > 0) munmap(base, size);
  }
};

// True when the strides are those of a contiguous tensor of this shape (size-1 dimensions aside).
bool contiguous_layout(const std::vector<int64_t>& shape, const std::vector<int64_t>& stride) {
  int64_t expect = 1;
  for (size_t k = shape.size(); k-- > 0;) {
    if (shape[k] != 1 && stride[k] != expect) return false;
    expect *= shape[k];
  }
  return true;
}

// The folder of a torch.save archive: whatever precedes its one data.pkl ("" or "name/"). Throws
// wm::CorruptData for no or several data.pkl, a TorchScript archive, or a big-endian file.
std::string archive_prefix(const ZipDirectory& zip, const uint8_t* b, const std::string& path) {
  std::string prefix;
  int found = 0;
  for (const ZipEntry& e : zip.entries()) {
    const std::string& s = e.name;
    if (s == "data.pkl" || (s.size() > 9 && s.compare(s.size() - 9, 9, "/data.pkl") == 0 &&
                            s.find('/') == s.size() - 9)) {
      prefix = s.substr(0, s.size() - 8);
      ++found;
    }
  }
  if (found != 1)
    throw CorruptData(str_cat(path, ": ", found == 0 ? "no" : "more than one", " <archive>/data.pkl entry (", found,
                              "); not a torch.save checkpoint"));
  for (const ZipEntry& e : zip.entries())
    if (e.name == prefix + "constants.pkl" || e.name.compare(0, prefix.size() + 5, prefix + "code/") == 0)
      throw CorruptData(str_cat(path, ": a TorchScript archive (torch.jit.save), not a torch.save state dict"));
  if (zip.find(prefix + "byteorder") != nullptr) {
    const ZipEntry& e = zip.stored(prefix + "byteorder");
    const std::string order(reinterpret_cast<const char*>(b + e.data), static_cast<size_t>(std::min<uint64_t>(e.size, 16)));
    if (order == "big") throw CorruptData(str_cat(path, ": saved big-endian; only little-endian files are read"));
    if (order != "little") throw CorruptData(str_cat(path, ": byteorder entry holds '", shown(order), "'"));
  }
  return prefix;
}

// The storages the pickle references, each checked against its archive entry once.
struct StorageTable {
  const ZipDirectory& zip;
  std::string prefix;
  std::vector<StorageRef> storages;
  std::unordered_map<std::string, size_t> index;  // key -> its place in storages

  // The index of storage `key` of numel x dtype (the Unpickler's storage callback). Throws
  // wm::CorruptData when it has no entry, its entry is unreadable or of another size, or an
  // earlier reference gave it another dtype or count.
  size_t resolve(const std::string& key, at::ScalarType dtype, int64_t numel) {
    auto it = index.find(key);
    if (it != index.end()) {
      const StorageRef& s = storages[it->second];
      if (s.dtype != dtype || s.numel != numel)
        throw CorruptData(str_cat("storage '", shown(key), "' is referenced as ", numel, " x ", dtype_text(dtype),
                                  " and as ", s.numel, " x ", dtype_text(s.dtype)));
      return it->second;
    }
    const std::string name = storage_entry(prefix, key);
    const ZipEntry* e = zip.find(name);
    if (e == nullptr) throw CorruptData(str_cat("storage '", shown(key), "' has no entry '", shown(name), "'"));
    const std::string why = ZipDirectory::problem(*e);
    if (!why.empty()) throw CorruptData(why);
    const uint64_t elsize = c10::elementSize(dtype);
    if (static_cast<uint64_t>(numel) > e->size / elsize || static_cast<uint64_t>(numel) * elsize != e->size)
      throw CorruptData(str_cat("storage '", shown(key), "' holds ", e->size, " bytes, but is referenced as ", numel,
                                " elements of ", dtype_text(dtype), " (", elsize, " bytes each)"));
    storages.push_back({key, dtype, numel, e->data});
    index.emplace(key, storages.size() - 1);
    return storages.size() - 1;
  }
};

// The state dict in the unpickled object `root`: root itself when it maps names to tensors, else
// the value of the first of the usual keys that does, else the one non-empty such dict under its
// keys (*key then names where it was found). Throws wm::CorruptData when there is none.
const Value* find_state_dict(const Unpickler& up, uint32_t root, const std::string& path, std::string* key_out) {
  auto is_tensor_dict = [&](const Value& v) {
    if (v.kind != Kind::Dict) return false;
    for (size_t k = 0; k < v.items.size(); k += 2)
      if (up.at(v.items[k]).kind != Kind::Str || up.at(v.items[k + 1]).kind != Kind::Tensor) return false;
    return true;
  };
  const Value& top = up.at(root);
  if (top.kind != Kind::Dict)
    throw CorruptData(str_cat(path, ": holds ", kind_name(top.kind), ", not a dict of tensors (a state dict)"));
  if (is_tensor_dict(top)) return &top;
  auto value_of = [&](const std::string& key) -> const Value* {
    for (size_t k = 0; k < top.items.size(); k += 2)
      if (up.at(top.items[k]).kind == Kind::Str && up.at(top.items[k]).s == key) return &up.at(top.items[k + 1]);
    return nullptr;
  };
  for (const char* key : {"state_dict", "model_state_dict", "model", "module"}) {
    const Value* v = value_of(key);
    if (v != nullptr && is_tensor_dict(*v)) {
      *key_out = key;
      return v;
    }
  }
  std::vector<size_t> candidates;
  std::string keys;
  for (size_t k = 0; k < top.items.size(); k += 2) {
    const Value& key = up.at(top.items[k]);
    const std::string ks = key.kind == Kind::Str ? "'" + shown(key.s) + "'" : std::string(kind_name(key.kind));
    if (k < 20) keys += (keys.empty() ? "" : ", ") + ks + ": " + kind_name(up.at(top.items[k + 1]).kind);
    const Value& v = up.at(top.items[k + 1]);
    if (key.kind == Kind::Str && is_tensor_dict(v) && !v.items.empty()) candidates.push_back(k);
  }
  if (top.items.size() > 20) keys += ", ...";
  if (candidates.size() != 1)
    throw CorruptData(str_cat(path, ": the top-level dict is not a state dict (name -> tensor) and ",
                              candidates.empty() ? "holds none" : "holds several", " under its keys {", keys, "}"));
  *key_out = up.at(top.items[candidates[0]]).s;
  return &up.at(top.items[candidates[0] + 1]);
}

// Tensor `where` (described by d) reads only elements of its storage s; throws wm::CorruptData.
void check_extent(const TensorDesc& d, const StorageRef& s, const std::string& where) {
  if (d.numel > 0 && d.last >= s.numel)
    throw CorruptData(str_cat(where, " reads element ", d.last, " of storage '", shown(s.key), "', which holds ",
                              s.numel, " ", dtype_text(s.dtype), " elements"));
  if (d.numel == 0 && d.offset > s.numel)
    throw CorruptData(str_cat(where, " starts past storage '", shown(s.key), "' (", s.numel, " elements)"));
}

}  // namespace

struct PthFile::Source {
  int fd = -1;
  ~Source() {
    if (fd >= 0) ::close(fd);
  }
};

PthFile PthFile::open(const std::string& path) {
  if (!host_is_little_endian()) throw Error(str_cat(path, ": .pth files are only read on little-endian hosts"));
  PthFile f;
  f.path_ = path;
  auto src = std::make_shared<Source>();
  src->fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (src->fd < 0) throw Error(str_cat(path, ": cannot open: ", std::strerror(errno)));
  struct stat sb {};
  if (fstat(src->fd, &sb) != 0 || !S_ISREG(sb.st_mode)) throw Error(str_cat(path, ": not a regular file"));
  ScopedMap map;
  map.size = static_cast<size_t>(sb.st_size);
  if (map.size > 0) {
    map.base = mmap(nullptr, map.size, PROT_READ, MAP_PRIVATE, src->fd, 0);
    if (map.base == MAP_FAILED) throw Error(str_cat(path, ": cannot map: ", std::strerror(errno)));
  }
  const uint8_t* b = map.size > 0 ? static_cast<const uint8_t*>(map.base) : reinterpret_cast<const uint8_t*>("");
  const uint64_t n = map.size;
  f.src_ = src;

  if (n >= sizeof kLegacyMagic && std::memcmp(b, kLegacyMagic, sizeof kLegacyMagic) == 0)
    throw CorruptData(str_cat(path, ": saved in torch's legacy format (torch < 1.6, not a zip archive), which is not "
                                    "read; load and save it again with a newer torch"));
  const ZipDirectory zip(b, n, path);
  const std::string prefix = archive_prefix(zip, b, path);
  const ZipEntry& pkl = zip.stored(prefix + "data.pkl");
  if (pkl.size > kMaxPickleBytes)
    throw CorruptData(str_cat(path, ": data.pkl is ", pkl.size, " bytes (at most ", kMaxPickleBytes, " are read)"));
  if (crc32(b + pkl.data, static_cast<size_t>(pkl.size)) != pkl.crc)
    throw CorruptData(str_cat(path, ": data.pkl fails its CRC-32 check (the file is damaged)"));

  StorageTable table{zip, prefix, {}, {}};
  Unpickler up(b + pkl.data, static_cast<size_t>(pkl.size), str_cat(path, ": data.pkl"),
               [&](const std::string& key, at::ScalarType dtype, int64_t numel) { return table.resolve(key, dtype, numel); });
  const uint32_t root = up.run();
  const Value* sd = find_state_dict(up, root, path, &f.state_dict_key_);

  // The tensors, with the bytes they will take checked against the file.
  const auto& descs = up.tensors();
  std::set<size_t> counted;
  uint64_t total = 0;
  const uint64_t budget = (n > (std::numeric_limits<uint64_t>::max() - kExtraTensorBytes) / 4)
                              ? std::numeric_limits<uint64_t>::max()
                              : 4 * n + kExtraTensorBytes;
  for (size_t k = 0; k < sd->items.size(); k += 2) {
    const Value& tv = up.at(sd->items[k + 1]);
    const TensorDesc& d = descs[static_cast<size_t>(tv.i)];
    const StorageRef& s = table.storages[d.storage];
    PthTensorInfo info;
    info.name = up.at(sd->items[k]).s;
    info.dtype = s.dtype;
    info.shape = d.shape;
    info.stride = d.stride;
    info.storage_offset = d.offset;
    info.storage = s.key;
    info.storage_numel = s.numel;
    info.object = static_cast<size_t>(tv.i);
    const std::string where = str_cat(path, ": tensor '", shown(info.name), "' (size ", c10::IntArrayRef(d.shape),
                                      ", stride ", c10::IntArrayRef(d.stride), ", offset ", d.offset, ")");
    check_extent(d, s, where);
    if (counted.insert(info.object).second) {
      const uint64_t bytes = static_cast<uint64_t>(d.numel) * c10::elementSize(s.dtype);
      if (bytes > budget - total)
        throw CorruptData(str_cat(where, ": the tensors would take more than ", budget,
                                  " bytes, out of proportion to the file's ", n));
      total += bytes;
    }
    f.storage_begin_.push_back(s.begin);
    f.tensors_.push_back(std::move(info));
  }
  return f;
}

at::Tensor PthFile::get(size_t i) const {
  WM_CHECK(i < tensors_.size(), path_, ": tensor index ", i, " out of range (", tensors_.size(), " tensors)");
  const PthTensorInfo& t = tensors_[i];
  const auto opts = at::TensorOptions().dtype(t.dtype);
  int64_t numel = 1, last = t.storage_offset;
  for (size_t k = 0; k < t.shape.size(); ++k) {
    numel *= t.shape[k];
    if (t.shape[k] > 0) last += (t.shape[k] - 1) * t.stride[k];
  }
  if (numel == 0) return at::empty(t.shape, opts);
  const size_t elsize = c10::elementSize(t.dtype);
  const uint64_t begin = storage_begin_[i] + static_cast<uint64_t>(t.storage_offset) * elsize;
  // Reads [begin, begin + bytes) of the file into dst.
  auto read = [&](void* dst, uint64_t bytes) {
    auto* d = static_cast<uint8_t*>(dst);
    for (uint64_t done = 0; done < bytes;) {
      const uint64_t chunk = std::min<uint64_t>(bytes - done, 1ull << 30);
      const ssize_t got = ::pread(src_->fd, d + done, static_cast<size_t>(chunk), static_cast<off_t>(begin + done));
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) throw Error(str_cat(path_, ": reading tensor '", shown(t.name), "' failed: ", std::strerror(errno)));
      if (got == 0)
        throw CorruptData(str_cat(path_, ": the file ends inside tensor '", shown(t.name), "' (it shrank after opening?)"));
      done += static_cast<uint64_t>(got);
    }
  };
  // Bools are read as bytes and checked: a copy as bool would turn a stray 2 into a 1.
  const bool is_bool = t.dtype == at::kBool;
  const auto read_opts = is_bool ? opts.dtype(at::kByte) : opts;
  at::Tensor out;
  if (contiguous_layout(t.shape, t.stride)) {  // straight into the result
    out = at::empty(t.shape, read_opts);
    read(out.data_ptr(), static_cast<uint64_t>(numel) * elsize);
  } else {  // the bytes the view spans, then a contiguous copy of the view
    const uint64_t span = static_cast<uint64_t>(last - t.storage_offset + 1) * elsize;
    at::Tensor buf = at::empty({static_cast<int64_t>(span)}, at::TensorOptions().dtype(at::kByte));
    read(buf.data_ptr(), span);
    out = at::from_blob(buf.data_ptr(), t.shape, t.stride, read_opts).clone(at::MemoryFormat::Contiguous);
  }
  if (is_bool) {
    const auto* p = static_cast<const uint8_t*>(out.data_ptr());
    for (int64_t k = 0; k < numel; ++k)
      if (p[k] > 1)
        throw CorruptData(str_cat(path_, ": tensor '", shown(t.name), "' (bool) holds the byte ", int(p[k]),
                                  " at element ", k, " (only 0 and 1 are bools)"));
    out = out.view(at::kBool);
  }
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> load_pth(const std::string& path) {
  const PthFile f = PthFile::open(path);
  std::vector<std::pair<std::string, at::Tensor>> out;
  std::unordered_map<size_t, at::Tensor> by_object;  // tied names share one tensor
  out.reserve(f.tensors().size());
  for (size_t i = 0; i < f.tensors().size(); ++i) {
    const PthTensorInfo& t = f.tensors()[i];
    auto it = by_object.find(t.object);
    if (it == by_object.end()) it = by_object.emplace(t.object, f.get(i)).first;
    out.emplace_back(t.name, it->second);
  }
  return out;
}

CheckpointFormat sniff_checkpoint_format(const std::string& path) {
  struct stat sb {};
  if (::stat(path.c_str(), &sb) != 0) throw Error(str_cat(path, ": cannot open: ", std::strerror(errno)));
  if (!S_ISREG(sb.st_mode)) throw Error(str_cat(path, ": not a regular file"));
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(str_cat(path, ": cannot open: ", std::strerror(errno)));
  uint8_t h[16] = {0};
  in.read(reinterpret_cast<char*>(h), sizeof h);
  const size_t got = static_cast<size_t>(in.gcount());
  in.clear();
  in.seekg(0, std::ios::end);
  const uint64_t size = static_cast<uint64_t>(in.tellg());
  if (got >= 4 && h[0] == 'P' && h[1] == 'K' && ((h[2] == 3 && h[3] == 4) || (h[2] == 5 && h[3] == 6)))
    return CheckpointFormat::PthZip;
  if (got >= sizeof kLegacyMagic && std::memcmp(h, kLegacyMagic, sizeof kLegacyMagic) == 0)
    return CheckpointFormat::PthLegacy;
  if (got >= 9 && h[8] == '{' && le64(h) <= size - 8) return CheckpointFormat::Safetensors;
  return CheckpointFormat::Unknown;
}

std::map<std::string, at::Tensor> load_state_dict(const std::string& path) {
  std::map<std::string, at::Tensor> out;
  switch (sniff_checkpoint_format(path)) {
    case CheckpointFormat::Safetensors: {
      const SafeTensors st = SafeTensors::open(path);
      for (const auto& name : st.names()) out.emplace(name, st.get(name));
      return out;
    }
    case CheckpointFormat::PthZip:
      for (auto& [name, t] : load_pth(path)) out.emplace(name, std::move(t));
      return out;
    case CheckpointFormat::PthLegacy:
      PthFile::open(path);  // throws its message for the legacy format
      break;
    case CheckpointFormat::Unknown: break;
  }
  throw CorruptData(str_cat(path, ": neither a safetensors file nor a torch.save (.pth) zip archive"));
}

}  // namespace wm
