// The .pth reader (runtime/pth.h) against files that torch 2.x wrote, with their values as
// safetensors written by the same script (tools/pth_fixtures/make_pth_fixtures.py, run by hand),
// compared bit for bit; bad files refused with the file and the fault in the message; and
// hand-made pickles (tests/runtime/pth_test_zip.h wraps them) for the interpreter's checks.
// The converter program wm_pth_convert is run on the fixtures when it is built.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "runtime/build_paths.h"
#include "runtime/error.h"
#include "runtime/pth.h"
#include "runtime/safetensors.h"
#include "tests/cli/program_runner.h"
#include "tests/runtime/pth_test_zip.h"
#include "tests/temp_dir.h"
#include "test_util.h"

namespace wm {
namespace {

namespace fs = std::filesystem;

const fs::path kDir = fs::path(WM_SOURCE_DIR) / "tests/runtime/fixtures/pth";

std::string fixture(const std::string& name) { return (kDir / name).string(); }

// The names torch.save wrote, in the order of the dict in the script.
const std::vector<std::string> kStateDictNames = {
    "f32", "f16", "bf16", "f64", "i64", "i32", "i16", "i8", "u8", "bool", "scalar", "transposed",
    "view_a", "view_b", "broadcast", "empty", "param", "tied_a", "tied_b"};
const std::vector<std::string> kModuleNames = {"running",     "conv.weight", "conv.bias", "norm.weight",
                                               "norm.bias",   "head.weight", "head.bias"};

// Every loaded tensor equals the reference bit for bit, is contiguous and owns exactly its bytes.
void expect_matches(const std::vector<std::pair<std::string, at::Tensor>>& got, const std::string& expected_file,
                    const std::vector<std::string>& names) {
  const SafeTensors ref = SafeTensors::open(fixture(expected_file));
  ASSERT_EQ(got.size(), names.size());
  for (size_t i = 0; i < got.size(); ++i) {
    const auto& [name, t] = got[i];
    EXPECT_EQ(name, names[i]) << "file order";
    ASSERT_TRUE(ref.contains(name)) << name;
    const at::Tensor want = ref.get(name);
    EXPECT_TRUE(test::bit_equal(t, want)) << name << ": got " << t << " want " << want;
    EXPECT_TRUE(t.is_contiguous()) << name;
    EXPECT_EQ(t.device(), at::Device(at::kCPU)) << name;
    if (t.numel() > 0) {
      EXPECT_EQ(t.storage().nbytes(), static_cast<size_t>(t.numel()) * t.element_size()) << name << " owns more";
      EXPECT_EQ(t.storage_offset(), 0) << name;
    }
  }
}

class PthTemp : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = testing::make_temp_dir(std::string("wm_pth_") + info->name() + "_");
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string write(const std::string& name, const std::string& bytes) const {
    const std::string p = (dir_ / name).string();
    std::ofstream(p, std::ios::binary) << bytes;
    return p;
  }
  fs::path dir_;
};

TEST(PthLoad, StateDictOfEveryDtypeAndLayoutMatchesTorch) {
  expect_matches(load_pth(fixture("state_dict.pth")), "state_dict.expected.safetensors", kStateDictNames);
}

TEST(PthLoad, PickleProtocols1To5AndZip64ReadTheSame) {
  for (const char* f : {"state_dict_p1.pth", "state_dict_p4.pth", "state_dict_p5.pth", "state_dict_zip64.pth"}) {
    SCOPED_TRACE(f);
    expect_matches(load_pth(fixture(f)), "state_dict.expected.safetensors", kStateDictNames);
  }
}

TEST(PthLoad, ModuleOrderedDictWithMetadata) {
  expect_matches(load_pth(fixture("module.pth")), "module.expected.safetensors", kModuleNames);
  EXPECT_EQ(PthFile::open(fixture("module.pth")).state_dict_key(), "");
}

TEST(PthLoad, StateDictNestedInACheckpoint) {
  expect_matches(load_pth(fixture("nested.pth")), "module.expected.safetensors", kModuleNames);
  EXPECT_EQ(PthFile::open(fixture("nested.pth")).state_dict_key(), "state_dict");
}

TEST(PthLoad, TiedNamesShareOneTensorAndViewsAreCopied) {
  const auto sd = load_pth(fixture("state_dict.pth"));
  std::map<std::string, at::Tensor> m(sd.begin(), sd.end());
  EXPECT_EQ(m.at("tied_a").data_ptr(), m.at("tied_b").data_ptr());
  EXPECT_NE(m.at("view_a").data_ptr(), m.at("view_b").data_ptr());
  // view_a and view_b came from one storage: writing one leaves the other as it was.
  const at::Tensor before = m.at("view_b").clone();
  m.at("view_a").fill_(42);
  EXPECT_TRUE(test::bit_equal(m.at("view_b"), before));
}

TEST(PthFileInfo, DescribesTheLayoutAsSaved) {
  const PthFile f = PthFile::open(fixture("state_dict.pth"));
  ASSERT_EQ(f.tensors().size(), kStateDictNames.size());
  std::map<std::string, PthTensorInfo> by;
  for (const auto& t : f.tensors()) by[t.name] = t;
  EXPECT_EQ(by["transposed"].shape, (std::vector<int64_t>{4, 3}));
  EXPECT_EQ(by["transposed"].stride, (std::vector<int64_t>{1, 4}));
  EXPECT_EQ(by["view_a"].storage, by["view_b"].storage);
  EXPECT_EQ(by["view_a"].storage_offset, 2);
  EXPECT_EQ(by["view_b"].storage_offset, 5);
  EXPECT_EQ(by["view_b"].stride, (std::vector<int64_t>{2, 1}));
  EXPECT_EQ(by["view_b"].storage_numel, 10);
  EXPECT_EQ(by["broadcast"].stride, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(by["broadcast"].storage_numel, 4);
  EXPECT_TRUE(by["scalar"].shape.empty());
  EXPECT_EQ(by["bf16"].dtype, at::kBFloat16);
  EXPECT_EQ(by["bool"].dtype, at::kBool);
  EXPECT_EQ(by["tied_a"].object, by["tied_b"].object);
  EXPECT_NE(by["tied_a"].object, by["param"].object);
  EXPECT_THROW(f.get(f.tensors().size()), Error);
}

TEST_F(PthTemp, LoadStateDictGoesByContentNotName) {
  // Each file under the other format's extension.
  const std::string st = (dir_ / "weights.pth").string(), pt = (dir_ / "weights.safetensors").string();
  fs::copy_file(fixture("state_dict.expected.safetensors"), st);
  fs::copy_file(fixture("state_dict.pth"), pt);
  EXPECT_EQ(sniff_checkpoint_format(st), CheckpointFormat::Safetensors);
  EXPECT_EQ(sniff_checkpoint_format(pt), CheckpointFormat::PthZip);
  EXPECT_EQ(sniff_checkpoint_format(fixture("legacy.pth")), CheckpointFormat::PthLegacy);
  EXPECT_EQ(sniff_checkpoint_format(fixture("random.pth")), CheckpointFormat::Unknown);
  const auto a = load_state_dict(st), b = load_state_dict(pt);
  ASSERT_EQ(a.size(), kStateDictNames.size());
  ASSERT_EQ(b.size(), kStateDictNames.size());
  for (const auto& [name, t] : a) EXPECT_TRUE(test::bit_equal(t, b.at(name))) << name;
  for (const char* bad : {"random.pth", "legacy.pth"}) {
    try {
      load_state_dict(fixture(bad));
      ADD_FAILURE() << bad << " must be refused";
    } catch (const CorruptData& e) {
      EXPECT_NE(std::string(e.what()).find(fixture(bad)), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(load_state_dict(fixture("absent.pth")), Error);
}

// Each bad fixture is refused with wm::CorruptData naming the file and the fault.
TEST(PthBadFiles, EachIsRefusedWithTheFileAndTheFault) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"truncated.pth", "truncated"},
      {"forbidden_global.pth", "refuses the Python object 'posix.system'"},
      {"compressed.pth", "is compressed"},
      {"storage_past_entry.pth", "reads element 4 of storage '0', which holds 4"},
      {"storage_size_mismatch.pth", "holds 16 bytes, but is referenced as 8 elements"},
      {"bad_crc.pth", "CRC-32"},
      {"big_endian.pth", "big-endian"},
      {"legacy.pth", "legacy format"},
      {"torchscript.pt", "TorchScript"},
      {"random.pth", "not a readable zip archive"},
  };
  for (const auto& [file, fault] : cases) {
    try {
      load_pth(fixture(file));
      ADD_FAILURE() << file << " was read";
    } catch (const CorruptData& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(fixture(file)), std::string::npos) << file << ": " << m;
      EXPECT_NE(m.find(fault), std::string::npos) << file << ": " << m;
    }
  }
  try {
    load_pth(fixture("absent.pth"));
    ADD_FAILURE() << "a missing file was read";
  } catch (const CorruptData&) {
    ADD_FAILURE() << "a missing file is not corrupt data";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("absent.pth"), std::string::npos) << e.what();
  }
}

// Every truncation and every single-byte change of a good file gives a tensor dict or a
// wm::Error: never a crash or another exception (the fuzz target explores further).
TEST_F(PthTemp, TruncationsAndByteFlipsAreErrorsOrLoads) {
  std::ifstream in(fixture("module.pth"), std::ios::binary);
  const std::string good((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_GT(good.size(), 1000u);
  int refused = 0, read = 0;
  for (size_t n = 0; n < good.size(); n += 17) {
    EXPECT_THROW(load_pth(write("t.pth", good.substr(0, n))), CorruptData) << n;
  }
  for (size_t i = 0; i < good.size(); i += 11) {
    std::string bad = good;
    bad[i] = static_cast<char>(bad[i] ^ 0x5A);
    try {
      load_pth(write("f.pth", bad));
      ++read;
    } catch (const Error&) {
      ++refused;
    }
  }
  EXPECT_GT(refused, 0);
  EXPECT_GT(read, 0);  // changes inside the storages' bytes are not detected (as in torch)
}

// ---- hand-made pickles in torch's layout ----

std::string le(uint64_t v, int bytes) {
  std::string s;
  for (int k = 0; k < bytes; ++k) s.push_back(static_cast<char>((v >> (8 * k)) & 0xFF));
  return s;
}
std::string uni(const std::string& s) { return "X" + le(s.size(), 4) + s; }
std::string glob(const std::string& m, const std::string& n) { return "c" + m + "\n" + n + "\n"; }
std::string i64(int64_t v) { return "\x8a\x08" + le(static_cast<uint64_t>(v), 8); }
std::string tuple(const std::vector<int64_t>& v) {
  std::string s = "(";
  for (int64_t x : v) s += i64(x);
  return s + "t";
}
// _rebuild_tensor_v2(storage, offset, size, stride, False, OrderedDict()).
std::string tensor(const std::string& key, const std::string& type, int64_t numel, int64_t offset,
                   const std::vector<int64_t>& size, const std::vector<int64_t>& stride) {
  return glob("torch._utils", "_rebuild_tensor_v2") + "((" + uni("storage") + glob("torch", type) + uni(key) +
         uni("cpu") + i64(numel) + "tQ" + i64(offset) + tuple(size) + tuple(stride) + "\x89" +
         glob("collections", "OrderedDict") + ")Rt" + "R";
}
// {name: tensor, ...} as protocol 2.
std::string dict_pickle(const std::vector<std::pair<std::string, std::string>>& items) {
  std::string s = "\x80\x02}(";
  for (const auto& [k, v] : items) s += uni(k) + v;
  return s + "u.";
}
std::string floats(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

TEST_F(PthTemp, UnalignedStoragesReadRight) {
  // The storage's bytes start at each offset modulo 4 (bytes after STOP are ignored).
  const std::vector<float> values = {1.5f, -2.f, 3.25f, 4.f, 5.f, 6.f};
  for (int pad = 0; pad < 4; ++pad) {
    const std::string pkl = dict_pickle({{"w", tensor("0", "FloatStorage", 6, 1, {2, 2}, {1, 2})}}) +
                            std::string(static_cast<size_t>(pad), '\0');
    const auto sd = load_pth(write("u.pth", test::pth_archive(pkl, {{"0", floats(values)}})));
    ASSERT_EQ(sd.size(), 1u);
    // Storage elements [[1, 3], [2, 4]]: [[-2, 4], [3.25, 5]].
    const at::Tensor want = at::tensor(values, at::kFloat).as_strided({2, 2}, {1, 2}, 1);
    EXPECT_TRUE(test::bit_equal(sd[0].second, want.contiguous())) << "pad " << pad;
  }
}

TEST_F(PthTemp, HandMadePicklesAreRefusedWithTheirFault) {
  const std::string f4 = floats({1, 2, 3, 4});
  const std::vector<std::pair<std::string, std::string>> one = {{"0", f4}};
  struct Case {
    std::string what, pickle, fault;
  };
  const std::vector<Case> cases = {
      {"size overflow", dict_pickle({{"w", tensor("0", "FloatStorage", 4, 0, {1ll << 40, 1ll << 40}, {1, 1})}}),
       "overflows"},
      {"negative stride", dict_pickle({{"w", tensor("0", "FloatStorage", 4, 0, {2}, {-1})}}), "negative"},
      {"offset past the storage", dict_pickle({{"w", tensor("0", "FloatStorage", 4, 4, {1}, {1})}}),
       "reads element 4"},
      {"huge broadcast", dict_pickle({{"w", tensor("0", "FloatStorage", 4, 0, {1ll << 20, 1ll << 20}, {0, 0})}}),
       "out of proportion"},
      {"one storage as two types",
       dict_pickle({{"a", tensor("0", "FloatStorage", 4, 0, {4}, {1})}, {"b", tensor("0", "HalfStorage", 8, 0, {8}, {1})}}),
       "referenced as"},
      {"a storage without its entry", dict_pickle({{"w", tensor("7", "FloatStorage", 4, 0, {4}, {1})}}),
       "has no entry 'archive/data/7'"},
      {"a string past the end", "\x80\x02}(X" + le(1u << 30, 4) + "ab", "ends inside an opcode"},
      {"an unknown memo key", std::string("\x80\x02h\x05.", 5), "memo key 5 was never stored"},
      {"an unsupported opcode", "\x80\x02(i__main__\nX\n.", "unsupported pickle opcode 0x69 ('i')"},
      {"eval by STACK_GLOBAL", "\x80\x04\x8c\x08" "builtins\x8c\x04" "eval\x93.", "'builtins.eval'"},
      {"a non-tensor value", "\x80\x02}(" + uni("w") + "K\x01u.", "not a state dict"},
      {"a self-containing list", std::string("\x80\x02]q\x00h\x00" "a.", 9), "holds a list"},
      {"no STOP", "\x80\x02}", "ends inside an opcode"},
      {"two objects left", "\x80\x02}}.", "STOP with 2 objects"},
      {"a protocol from the future", "\x80\x09}.", "pickle protocol 9"},
      {"an integer past 64 bits", "\x80\x02\x8a\x09" + std::string(8, '\xff') + "\x7f.", "does not fit 64 bits"},
      {"invalid UTF-8 in a name", "\x80\x02}(X" + le(2, 4) + "\xc3\x28" + "Nu.", "UTF-8"},
      {"OrderedDict called with arguments", "\x80\x02" + glob("collections", "OrderedDict") + "(K\x01tR.",
       "only read when built empty"},
      {"a storage type called", "\x80\x02" + glob("torch", "FloatStorage") + ")R.", "not called"},
      {"BUILD on an int", "\x80\x02K\x01}b.", "BUILD on an int"},
  };
  for (const Case& c : cases) {
    const std::string path = write("h.pth", test::pth_archive(c.pickle, one));
    try {
      load_pth(path);
      ADD_FAILURE() << c.what << ": was read";
    } catch (const CorruptData& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(path), std::string::npos) << c.what << ": " << m;
      EXPECT_NE(m.find(c.fault), std::string::npos) << c.what << ": " << m;
    }
  }
}

TEST_F(PthTemp, BoolBytesOtherThanZeroOrOneAreRefused) {
  const std::string pkl = dict_pickle({{"b", tensor("0", "BoolStorage", 3, 0, {3}, {1})}});
  const PthFile ok = PthFile::open(write("ok.pth", test::pth_archive(pkl, {{"0", std::string("\x01\x00\x01", 3)}})));
  EXPECT_TRUE(test::bit_equal(ok.get(0), at::tensor({1, 0, 1}, at::kByte).to(at::kBool)));
  const PthFile bad = PthFile::open(write("bad.pth", test::pth_archive(pkl, {{"0", std::string("\x01\x02\x01", 3)}})));
  EXPECT_THROW(bad.get(0), CorruptData);
}

// ---- wm_pth_convert ----

class PthConvert : public PthTemp {
 protected:
  testing::RunResult convert(std::vector<std::string> args) {
    exe_ = testing::program_path("wm_pth_convert");
    if (exe_.empty()) return {};
    args.insert(args.begin(), exe_);
    return testing::run_program(args, dir_, fs::path(WM_SOURCE_DIR), 60);
  }
  std::string exe_;
};

TEST_F(PthConvert, WritesTheStateDictAsSafetensors) {
  const std::string out = (dir_ / "out.safetensors").string();
  const auto r = convert({fixture("state_dict.pth"), out});
  if (exe_.empty()) GTEST_SKIP() << "wm_pth_convert is not built";
  ASSERT_EQ(r.code, 0) << r.err;
  const SafeTensors got = SafeTensors::open(out), ref = SafeTensors::open(fixture("state_dict.expected.safetensors"));
  EXPECT_EQ(got.names(), ref.names());
  for (const auto& n : ref.names()) EXPECT_TRUE(test::bit_equal(got.get(n), ref.get(n))) << n;
  EXPECT_EQ(got.metadata().at("format"), "pt");
}

TEST_F(PthConvert, SelectsRenamesAndCasts) {
  const std::string out = (dir_ / "out.safetensors").string();
  const auto r = convert({fixture("nested.pth"), out, "--only", "norm.", "running", "--strip-prefix", "norm.",
                          "--prefix", "vae.", "--dtype", "bf16"});
  if (exe_.empty()) GTEST_SKIP() << "wm_pth_convert is not built";
  ASSERT_EQ(r.code, 0) << r.err;
  const SafeTensors got = SafeTensors::open(out), ref = SafeTensors::open(fixture("module.expected.safetensors"));
  EXPECT_EQ(got.names(), (std::vector<std::string>{"vae.bias", "vae.running", "vae.weight"}));
  EXPECT_TRUE(test::bit_equal(got.get("vae.weight"), ref.get("norm.weight").to(at::kBFloat16)));
  EXPECT_TRUE(test::bit_equal(got.get("vae.running"), ref.get("running").to(at::kBFloat16)));
}

TEST_F(PthConvert, BadInputsFailWithOneLineAndNoOutput) {
  const std::string out = (dir_ / "out.safetensors").string();
  const std::string copy = (dir_ / "in.pth").string();
  fs::copy_file(fixture("state_dict.pth"), copy);
  struct Case {
    std::vector<std::string> args;
    std::string names;
  };
  const std::vector<Case> cases = {
      {{fixture("forbidden_global.pth"), out}, "posix.system"},
      {{fixture("state_dict.pth"), out, "--only", "nothing-has-this"}, "nothing-has-this"},
      {{copy, copy}, "it is the input"},
  };
  for (const Case& c : cases) {
    const auto r = convert(c.args);
    if (exe_.empty()) GTEST_SKIP() << "wm_pth_convert is not built";
    SCOPED_TRACE(c.names);
    EXPECT_TRUE(r.exited);
    EXPECT_NE(r.code, 0);
    EXPECT_NE(r.err.find(c.names), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("terminate called"), std::string::npos) << r.err;
    EXPECT_FALSE(fs::exists(out));
  }
  EXPECT_EQ(fs::file_size(copy), fs::file_size(fixture("state_dict.pth")));
  for (const auto& e : fs::directory_iterator(dir_))  // no temporary file left behind
    EXPECT_TRUE(e.path().filename() == "in.pth" || e.path().filename().string().rfind(".run.", 0) == 0) << e.path();
}

}  // namespace
}  // namespace wm
