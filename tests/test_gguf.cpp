// GGUF reading and writing: every value type round-trips, tensor data is byte-exact and aligned, getters name the
// key and the type on a mismatch, every malformed file is one FormatError pointing at the bad field, and a failed
// write never touches an existing file.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "data/gguf.h"
#include "error_of.h"
#include "malformed_gguf.h"

namespace q4t::gguf {
namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<uint8_t>;

std::string temp_dir() {
  const fs::path d = fs::temp_directory_path() / ("q4t_test_gguf_" + std::to_string(::getpid()));
  fs::create_directories(d);
  return d.string();
}

// Removes temp_dir() when the test program ends.
class RemoveTempDir : public ::testing::Environment {
 public:
  void TearDown() override { fs::remove_all(temp_dir()); }
};
const auto* const kRemoveTempDir = ::testing::AddGlobalTestEnvironment(new RemoveTempDir);

Bytes file_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// Files in dir whose name starts with prefix (temp files left behind would show up here).
std::vector<std::string> files_starting_with(const std::string& dir, const std::string& prefix) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().rfind(prefix, 0) == 0) out.push_back(e.path().filename().string());
  return out;
}

Bytes pattern(size_t n, uint8_t seed) {
  Bytes b(n);
  for (size_t i = 0; i < n; ++i) b[i] = uint8_t(seed + i * 31 + (i >> 8));
  return b;
}

bool same_value(const Value& a, const Value& b) {
  if (a.type != b.type || a.v.index() != b.v.index()) return false;
  if (a.type != ValueType::ARRAY) {
    return std::visit(
        [&](const auto& x) {
          using T = std::decay_t<decltype(x)>;
          if constexpr (std::is_same_v<T, std::vector<Value>>)
            return false;
          else
            return x == std::get<T>(b.v);
        },
        a.v);
  }
  const auto& x = std::get<std::vector<Value>>(a.v);
  const auto& y = std::get<std::vector<Value>>(b.v);
  if (a.elem_type != b.elem_type || x.size() != y.size()) return false;
  for (size_t i = 0; i < x.size(); ++i)
    if (!same_value(x[i], y[i])) return false;
  return true;
}

std::vector<std::pair<std::string, Value>> every_value_type() {
  const auto nested = Value::array(
      ValueType::ARRAY, {Value::array(ValueType::I32, {Value::i32(-1), Value::i32(2)}),
                         Value::array(ValueType::I32, {}),
                         Value::array(ValueType::I32, {Value::i32(std::numeric_limits<int32_t>::min())})});
  return {
      {"t.u8", {ValueType::U8, ValueType::U32, uint64_t(255)}},
      {"t.i8", {ValueType::I8, ValueType::U32, int64_t(-128)}},
      {"t.u16", {ValueType::U16, ValueType::U32, uint64_t(65535)}},
      {"t.i16", {ValueType::I16, ValueType::U32, int64_t(-32768)}},
      {"t.u32", Value::u32(4000000000u)},
      {"t.i32", Value::i32(-2000000000)},
      {"t.f32", Value::f32(1e-5f)},
      {"t.bool_true", Value::boolean(true)},
      {"t.bool_false", Value::boolean(false)},
      {"t.string", Value::str("héllo wörld ▁日本語 🙂")},
      {"t.empty_string", Value::str("")},
      {"t.u64", Value::u64(std::numeric_limits<uint64_t>::max())},
      {"t.i64", {ValueType::I64, ValueType::U32, std::numeric_limits<int64_t>::min()}},
      {"t.f64", {ValueType::F64, ValueType::U32, 1e300}},
      {"t.array_u8", Value::array(ValueType::U8, {{ValueType::U8, ValueType::U32, uint64_t(0)},
                                                  {ValueType::U8, ValueType::U32, uint64_t(200)}})},
      {"t.array_f32", Value::array(ValueType::F32, {Value::f32(0.5f), Value::f32(-3.25f)})},
      {"t.array_bool", Value::array(ValueType::BOOL, {Value::boolean(false), Value::boolean(true)})},
      {"t.array_string", Value::array(ValueType::STRING, {Value::str("<s>"), Value::str("▁über"), Value::str("")})},
      {"t.array_empty", Value::array(ValueType::U64, {})},
      {"t.array_nested", nested},
      {"t.array_nested_twice", Value::array(ValueType::ARRAY, {nested, Value::array(ValueType::ARRAY, {})})},
  };
}

struct TensorCase {
  std::string name;
  std::vector<int64_t> ne;
  GgmlType type;
};

// One tensor of each layout family, sizes that do not divide the alignment.
const TensorCase kTensors[] = {
    {"a.f32", {3}, GgmlType::F32},        {"b.f16", {5, 3}, GgmlType::F16},
    {"c.q4_0", {64, 3}, GgmlType::Q4_0},  {"d.q8_0", {32, 2, 1}, GgmlType::Q8_0},
    {"e.q4_k", {256, 2}, GgmlType::Q4_K}, {"f.q6_k", {256, 1, 1, 1}, GgmlType::Q6_K},
    {"g.i8", {7}, GgmlType::I8},          {"h.bf16", {9}, GgmlType::BF16},
};

class RoundTrip : public ::testing::TestWithParam<uint32_t> {};

TEST_P(RoundTrip, EveryValueTypeAndTensorComesBackExactly) {
  const uint32_t alignment = GetParam();
  const std::string path = temp_dir() + "/roundtrip_" + std::to_string(alignment) + ".gguf";
  Writer w;
  w.set("general.architecture", Value::str("llama"));
  w.set("general.alignment", Value::u32(alignment));
  const auto values = every_value_type();
  for (const auto& [k, v] : values) w.set(k, v);
  std::vector<Bytes> data;
  for (size_t i = 0; i < std::size(kTensors); ++i) {
    data.push_back(pattern(tensor_bytes(kTensors[i].type, kTensors[i].ne), uint8_t(i)));
    w.add_tensor(kTensors[i].name, kTensors[i].ne, kTensors[i].type, data.back());
  }
  w.write(path);

  const auto f = File::open(path);
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->alignment(), alignment);
  ASSERT_EQ(f->metadata().size(), values.size() + 2);
  EXPECT_EQ(f->metadata()[0].first, "general.architecture");
  EXPECT_EQ(f->metadata()[1].first, "general.alignment");
  for (size_t i = 0; i < values.size(); ++i) {
    EXPECT_EQ(f->metadata()[i + 2].first, values[i].first);
    EXPECT_TRUE(same_value(f->metadata()[i + 2].second, values[i].second)) << values[i].first;
  }
  ASSERT_EQ(f->tensors().size(), std::size(kTensors));
  for (size_t i = 0; i < std::size(kTensors); ++i) {
    const TensorInfo* t = f->tensor(kTensors[i].name);
    ASSERT_NE(t, nullptr) << kTensors[i].name;
    EXPECT_EQ(t->ne, kTensors[i].ne);
    EXPECT_EQ(t->type, kTensors[i].type);
    EXPECT_EQ(t->offset % alignment, 0u);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t->data) % alignment, 0u) << "the mapping is page-aligned";
    ASSERT_EQ(t->bytes, data[i].size());
    EXPECT_EQ(std::memcmp(t->data, data[i].data(), t->bytes), 0) << kTensors[i].name;
  }
  EXPECT_EQ(f->tensor("missing"), nullptr);
  EXPECT_EQ(f->tensors()[2].rows(), 3);
  EXPECT_EQ(f->tensors()[2].cols(), 64);
  // The file ends with the last tensor padded to the alignment.
  EXPECT_EQ(fs::file_size(path) % alignment, 0u);
}

INSTANTIATE_TEST_SUITE_P(Alignments, RoundTrip, ::testing::Values(32u, 64u));

TEST(Gguf, WithoutAlignmentKeyTheDefaultIs32AndNoKeyIsWritten) {
  const std::string path = temp_dir() + "/default_alignment.gguf";
  Writer w;
  w.set("x", Value::u32(1));
  w.set("y", Value::u32(2));
  w.set("x", Value::str("replaced"));  // keeps its first position
  w.add_tensor("t", {2}, GgmlType::F32, pattern(8, 1));
  w.write(path);
  const Bytes b = file_bytes(path);
  ASSERT_GE(b.size(), 24u);
  EXPECT_EQ(std::string(b.begin(), b.begin() + 4), "GGUF");
  EXPECT_EQ(b[4], 3);
  const auto f = File::open(path);
  EXPECT_EQ(f->alignment(), 32u);
  EXPECT_EQ(f->find("general.alignment"), nullptr);
  ASSERT_EQ(f->metadata().size(), 2u);
  EXPECT_EQ(f->metadata()[0].first, "x");
  EXPECT_EQ(f->get_string("x"), "replaced");
  // Header 24 + keys 29 and 17 + tensor info 33 = 103, padded to 128; then 8 data bytes padded to 32.
  EXPECT_EQ(b.size(), 160u);
}

TEST(Gguf, VersionTwoIsReadable) {
  const std::string path = temp_dir() + "/v2.gguf";
  test::write_tiny_llama_gguf(path);
  Bytes b = file_bytes(path);
  b[4] = 2;
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(reinterpret_cast<char*>(b.data()), long(b.size()));
  const auto f = File::open(path);
  EXPECT_EQ(f->version(), 2u);
  EXPECT_EQ(f->get_string("general.architecture"), "llama");
}

TEST(Gguf, TheTinyLlamaHasTheKeysAndTensorsOfALlamaModel) {
  const std::string path = temp_dir() + "/tiny_llama.gguf";
  test::write_tiny_llama_gguf(path);
  const auto f = File::open(path);
  EXPECT_EQ(f->get_uint("llama.embedding_length"), 32u);
  EXPECT_EQ(f->get_array("tokenizer.ggml.tokens", ValueType::STRING).size(), 32u);
  EXPECT_NEAR(f->get_float("llama.attention.layer_norm_rms_epsilon"), 1e-5, 1e-12);
  EXPECT_TRUE(f->get_bool("tokenizer.ggml.add_bos_token"));
  ASSERT_EQ(f->tensors().size(), 12u);
  const TensorInfo* q = f->tensor("blk.0.attn_q.weight");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->type, GgmlType::Q4_0);
  EXPECT_EQ(q->ne, (std::vector<int64_t>{32, 32}));
  EXPECT_EQ(q->bytes, 32u * 18u);
  EXPECT_EQ(f->tensor("output_norm.weight")->type, GgmlType::F32);
}

// The substring of a getter's FormatError, which also names the file.
template <class F>
void expect_key_error(const File& f, F&& call, const std::string& what) {
  try {
    call();
    ADD_FAILURE() << "no error; expected: " << what;
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).rfind(f.path() + ": ", 0), 0u) << e.what();
  }
}

TEST(Gguf, GettersNameTheKeyAndBothTypesOnAMismatch) {
  const std::string path = temp_dir() + "/getters.gguf";
  Writer w;
  for (const auto& [k, v] : every_value_type()) w.set(k, v);
  w.set("t.positive_i32", Value::i32(7));
  w.write(path);
  const auto f = File::open(path);
  EXPECT_EQ(f->get_uint("t.u8"), 255u);
  EXPECT_EQ(f->get_uint("t.positive_i32"), 7u);
  EXPECT_EQ(f->get_uint("t.u64"), std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(f->get_float("t.i32"), -2000000000.0);
  EXPECT_EQ(f->get_float("t.f64"), 1e300);
  EXPECT_FALSE(f->get_bool("t.bool_false"));
  EXPECT_EQ(f->get_string("t.empty_string"), "");
  EXPECT_EQ(f->get_array("t.array_nested", ValueType::ARRAY).size(), 3u);
  EXPECT_EQ(f->get_uint_or("absent", 9), 9u);
  EXPECT_EQ(f->get_float_or("absent", 0.5), 0.5);
  EXPECT_TRUE(f->get_bool_or("absent", true));
  EXPECT_EQ(f->get_uint_or("t.u16", 9), 65535u);

  expect_key_error(*f, [&] { f->get_string("t.u32"); }, "key 't.u32' is a u32, expected a string");
  expect_key_error(*f, [&] { f->get_uint("t.string"); }, "key 't.string' is a string, expected an integer");
  expect_key_error(*f, [&] { f->get_uint("t.f32"); }, "key 't.f32' is an f32, expected an integer");
  expect_key_error(*f, [&] { f->get_uint("t.i32"); }, "key 't.i32' is -2000000000, expected a non-negative integer");
  expect_key_error(*f, [&] { f->get_float("t.bool_true"); }, "key 't.bool_true' is a bool, expected a number");
  expect_key_error(*f, [&] { f->get_bool("t.u8"); }, "key 't.u8' is a u8, expected a bool");
  expect_key_error(*f, [&] { f->get_array("t.array_string", ValueType::U32); },
                   "key 't.array_string' is an array of string, expected an array of u32");
  expect_key_error(*f, [&] { f->get_array("t.i8", ValueType::I8); }, "key 't.i8' is an i8, expected an array of i8");
  expect_key_error(*f, [&] { f->get_string("absent"); }, "key 'absent' is missing");
  expect_key_error(*f, [&] { f->get_uint_or("t.string", 1); }, "key 't.string' is a string, expected an integer");
  expect_key_error(*f, [&] { f->get_float_or("t.array_f32", 1); }, "key 't.array_f32' is an array of f32");
  expect_key_error(*f, [&] { f->get_bool_or("t.string", false); }, "key 't.string' is a string, expected a bool");
}

TEST(Gguf, TypeLayoutsMatchGgml) {
  int64_t elems = 0, bytes = 0;
  ASSERT_TRUE(type_layout(GgmlType::Q4_0, &elems, &bytes));
  EXPECT_EQ(elems, 32);
  EXPECT_EQ(bytes, 18);
  ASSERT_TRUE(type_layout(GgmlType::Q8_K, &elems, &bytes));
  EXPECT_EQ(bytes, 292);
  EXPECT_FALSE(type_layout(GgmlType(77), &elems, &bytes));
  EXPECT_STREQ(type_name(GgmlType::Q6_K), "q6_K");
  EXPECT_STREQ(type_name(GgmlType(77)), "type 77");
  EXPECT_EQ(tensor_bytes(GgmlType::Q4_K, {512, 3}), 2u * 144u * 3u);
  EXPECT_EQ(tensor_bytes(GgmlType::Q5_1, {64}), 2u * 24u);
  EXPECT_EQ(tensor_bytes(GgmlType::F64, {3, 2}), 48u);
  EXPECT_THROW(tensor_bytes(GgmlType(77), {32}), FormatError);
  EXPECT_THROW(tensor_bytes(GgmlType::Q4_0, {48}), FormatError);
  EXPECT_THROW(tensor_bytes(GgmlType::F32, {}), FormatError);
  EXPECT_THROW(tensor_bytes(GgmlType::F32, {1, 1, 1, 1, 1}), FormatError);
}

TEST(Gguf, EveryMalformedFileIsOneFormatErrorNamingTheFieldAndOffset) {
  const auto cases = test::write_malformed_ggufs(temp_dir() + "/malformed");
  size_t malformed = 0;
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    if (c.gguf_valid) {
      EXPECT_NO_THROW(File::open(c.path));
      continue;
    }
    ++malformed;
    try {
      File::open(c.path);
      ADD_FAILURE() << "opened without an error";
    } catch (const FormatError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(c.expected_error_substring), std::string::npos) << msg << "\nexpected: " << c.expected_error_substring;
      EXPECT_EQ(msg.rfind(c.path + ": ", 0), 0u) << msg;
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    }
  }
  EXPECT_GE(malformed, 30u);
  EXPECT_EQ(cases.size() - malformed, 4u);
}

TEST(Gguf, AMissingFileOrADirectoryIsAnErrorNamingThePath) {
  const std::string dir = temp_dir();
  try {
    File::open(dir + "/does_not_exist.gguf");
    ADD_FAILURE() << "opened a missing file";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find(dir + "/does_not_exist.gguf: cannot open: No such file or directory"),
              std::string::npos)
        << e.what();
  }
  try {
    File::open(dir);
    ADD_FAILURE() << "opened a directory";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find(dir + ": not a regular file"), std::string::npos) << e.what();
  }
}

TEST(GgufWriter, RejectsTensorsWhoseDataDoesNotMatchTheShape) {
  Writer w;
  EXPECT_THROW(w.add_tensor("a", {32, 2}, GgmlType::Q4_0, Bytes(35)), std::invalid_argument);
  EXPECT_THROW(w.add_tensor("b", {33}, GgmlType::Q4_0, Bytes(18)), std::invalid_argument);
  EXPECT_THROW(w.add_tensor("c", {0}, GgmlType::F32, Bytes()), std::invalid_argument);
  EXPECT_THROW(w.add_tensor("", {1}, GgmlType::F32, Bytes(4)), std::invalid_argument);
  w.add_tensor("d", {1}, GgmlType::F32, Bytes(4));
  EXPECT_THROW(w.add_tensor("d", {1}, GgmlType::F32, Bytes(4)), std::invalid_argument);
  try {
    w.add_tensor("blk.0.attn_q.weight", {32, 2}, GgmlType::Q4_0, Bytes(35));
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("'blk.0.attn_q.weight' (q4_0, ne = [32, 2]) needs 36 bytes of data, got 35"),
              std::string::npos)
        << e.what();
  }
}

// An existing file at the target, and a check that a failed write left it and nothing else behind.
class WriterFailure : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = temp_dir() + "/atomic_" + ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    path_ = dir_ + "/model.gguf";
    test::write_tiny_llama_gguf(path_);
    before_ = file_bytes(path_);
  }
  void expect_untouched() {
    EXPECT_EQ(file_bytes(path_), before_) << "the existing file changed";
    EXPECT_EQ(files_starting_with(dir_, "model.gguf"), std::vector<std::string>{"model.gguf"}) << "a temp file was left";
  }
  // w.write(path) throws a std::runtime_error that names the path and says `says`.
  static void expect_write_error(const Writer& w, const std::string& path, const std::string& says = "") {
    const std::string error = test::error_of<std::runtime_error>([&] { w.write(path); });
    EXPECT_NE(error.find(path), std::string::npos) << error;
    EXPECT_NE(error.find(says), std::string::npos) << error;
  }
  std::string dir_, path_;
  Bytes before_;
};

TEST_F(WriterFailure, ADirectoryThatDoesNotExistThrowsNamingThePath) {
  Writer w;
  w.set("a", Value::u32(1));
  const std::string bad = dir_ + "/no_such_dir/out.gguf";
  expect_write_error(w, bad);
  EXPECT_FALSE(fs::exists(dir_ + "/no_such_dir"));
  expect_untouched();
}

TEST_F(WriterFailure, AFailedTensorSizeCheckLeavesTheOldFile) {
  Writer w;
  w.set("general.architecture", Value::str("llama"));
  EXPECT_THROW(w.add_tensor("t", {32}, GgmlType::Q4_0, Bytes(17)), std::invalid_argument);
  expect_untouched();
}

TEST_F(WriterFailure, AValueThatDoesNotFitItsTypeLeavesTheOldFile) {
  Writer w;
  w.set("general.architecture", Value::str("llama"));
  w.set("bad.u8", {ValueType::U8, ValueType::U32, uint64_t(300)});
  expect_write_error(w, path_, "key 'bad.u8': 300 does not fit in a u8");
  Writer mixed;
  mixed.set("bad.array", Value::array(ValueType::U32, {Value::u32(1), Value::str("two")}));
  EXPECT_THROW(mixed.write(path_), std::runtime_error);
  Writer align;
  align.set("general.alignment", Value::u32(48));
  EXPECT_THROW(align.write(path_), std::runtime_error);
  expect_untouched();
}

TEST_F(WriterFailure, AWriteErrorHalfwayRemovesTheTempFileAndLeavesTheOldFile) {
  // RLIMIT_FSIZE makes write() fail with EFBIG once the temp file reaches 4 KiB (SIGXFSZ ignored).
  Writer w;
  w.set("general.architecture", Value::str("llama"));
  w.add_tensor("big", {16384}, GgmlType::F32, pattern(65536, 3));
  struct rlimit old_limit;
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old_limit), 0);
  auto* old_handler = signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = old_limit;
  small.rlim_cur = 4096;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  expect_write_error(w, path_, "File too large");
  setrlimit(RLIMIT_FSIZE, &old_limit);
  signal(SIGXFSZ, old_handler);
  expect_untouched();
}

TEST_F(WriterFailure, AFailedRenameRemovesTheTempFile) {
  // The target is a non-empty directory: everything but the rename succeeds.
  const std::string target = dir_ + "/model.gguf.d";
  fs::create_directories(target + "/inside");
  Writer w;
  w.set("a", Value::u32(1));
  expect_write_error(w, target, "cannot rename");
  EXPECT_TRUE(fs::is_directory(target + "/inside"));
  fs::remove_all(target);
  expect_untouched();
}

TEST_F(WriterFailure, ASuccessfulWriteReplacesTheFileWholly) {
  Writer w;
  w.set("general.architecture", Value::str("llama"));
  w.add_tensor("only", {4}, GgmlType::F32, pattern(16, 9));
  w.write(path_);
  const auto f = File::open(path_);
  ASSERT_EQ(f->tensors().size(), 1u);
  EXPECT_EQ(f->tensors()[0].name, "only");
  EXPECT_EQ(files_starting_with(dir_, "model.gguf"), std::vector<std::string>{"model.gguf"});
}

}  // namespace
}  // namespace q4t::gguf
