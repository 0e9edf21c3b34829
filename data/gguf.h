// GGUF files (version 3; version 2 readable): metadata key/values, tensor infos, and memory-mapped tensor data.
// The reader treats the file as hostile: every count, length, offset and ne product is bounds- and
// overflow-checked before use, and a bad file gives one FormatError naming the file, the field and the byte
// offset — never a crash or a huge allocation. The writer builds a file in memory order and writes it
// atomically (temp file, fsync, rename), so a failure never leaves a partial file under the final name.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

namespace q4t::gguf {

struct FormatError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

enum class ValueType : uint32_t {
  U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, BOOL = 7, STRING = 8, ARRAY = 9, U64 = 10,
  I64 = 11, F64 = 12,
};
const char* value_type_name(ValueType t);

// One metadata value. Integers of every width are held as int64/uint64, floats as double; arrays keep their
// element type (nested arrays allowed).
struct Value {
  ValueType type = ValueType::U32;
  ValueType elem_type = ValueType::U32;  // arrays only
  std::variant<uint64_t, int64_t, double, bool, std::string, std::vector<Value>> v;

  static Value u32(uint32_t x) { return {ValueType::U32, ValueType::U32, uint64_t(x)}; }
  static Value i32(int32_t x) { return {ValueType::I32, ValueType::U32, int64_t(x)}; }
  static Value u64(uint64_t x) { return {ValueType::U64, ValueType::U32, x}; }
  static Value f32(float x) { return {ValueType::F32, ValueType::U32, double(x)}; }
  static Value boolean(bool x) { return {ValueType::BOOL, ValueType::U32, x}; }
  static Value str(std::string s) { return {ValueType::STRING, ValueType::U32, std::move(s)}; }
  static Value array(ValueType elem, std::vector<Value> items) { return {ValueType::ARRAY, elem, std::move(items)}; }
};

// GGML tensor types (the numbering of the format). The ones q4tune computes with are F32 and the formats of
// kernels/formats.h (the same numbers); the rest are still read (info prints them) and rejected by the model loader.
enum class GgmlType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9, Q2_K = 10, Q3_K = 11, Q4_K = 12,
  Q5_K = 13, Q6_K = 14, Q8_K = 15, IQ2_XXS = 16, IQ2_XS = 17, IQ3_XXS = 18, IQ1_S = 19, IQ4_NL = 20, IQ3_S = 21,
  IQ2_S = 22, IQ4_XS = 23, I8 = 24, I16 = 25, I32 = 26, I64 = 27, F64 = 28, IQ1_M = 29, BF16 = 30,
  TQ1_0 = 34, TQ2_0 = 35,
};
const char* type_name(GgmlType t);  // "q4_0", ...; "type 77" for unknown numbers
// Elements per block and bytes per block; false for a type number this reader does not know.
bool type_layout(GgmlType t, int64_t* block_elems, int64_t* block_bytes);

struct TensorInfo {
  std::string name;
  std::vector<int64_t> ne;  // ne[0] is the fastest dimension: a weight W[n_out, n_in] has ne = {n_in, n_out}
  GgmlType type;
  uint64_t offset;          // from the start of the data section
  uint64_t bytes;
  const uint8_t* data;      // into the mapping
  int64_t rows() const;     // product of ne[1..]
  int64_t cols() const { return ne.empty() ? 1 : ne[0]; }
};

class File {
 public:
  // Maps and validates the whole file; throws FormatError.
  static std::unique_ptr<File> open(const std::string& path);
  ~File();
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  // Keys in file order.
  const std::vector<std::pair<std::string, Value>>& metadata() const { return kv_; }
  const Value* find(const std::string& key) const;
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* tensor(const std::string& name) const;

  // Typed getters: a missing key or a value of the wrong type throws FormatError naming the file and the key
  // ("model.gguf: key 'llama.block_count' is a string, expected an integer").
  std::string get_string(const std::string& key) const;
  uint64_t get_uint(const std::string& key) const;  // any non-negative integer type
  double get_float(const std::string& key) const;   // f32/f64 (integers accepted)
  bool get_bool(const std::string& key) const;
  const std::vector<Value>& get_array(const std::string& key, ValueType elem) const;
  // Same, with a default when the key is absent (a present key of the wrong type still throws).
  uint64_t get_uint_or(const std::string& key, uint64_t def) const;
  double get_float_or(const std::string& key, double def) const;
  bool get_bool_or(const std::string& key, bool def) const;

  // A LoRA adapter (general.type "adapter") rather than a model.
  bool is_adapter() const;
  // Throw FormatError saying what the file is and where it goes when a LoRA adapter is given as the model, or a
  // model (no general.type "adapter", a token_embd.weight or a tokenizer) as the adapter.
  void expect_model() const;
  void expect_adapter() const;

 private:
  File() = default;
  std::string path_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  std::vector<std::pair<std::string, Value>> kv_;
  std::map<std::string, size_t> kv_index_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t> tensor_index_;
  void* map_ = nullptr;
  size_t map_size_ = 0;
};

class Writer {
 public:
  void set(const std::string& key, Value v);  // replaces an existing key, keeps first-insertion order
  // data must hold exactly the bytes of a tensor of this type and ne (checked).
  void add_tensor(const std::string& name, std::vector<int64_t> ne, GgmlType type, std::vector<uint8_t> data);
  // A tensor whose bytes `produce` makes while write() streams the file, one tensor at a time, so that a file
  // larger than memory can be written (checked for size then).
  void add_tensor(const std::string& name, std::vector<int64_t> ne, GgmlType type,
                  std::function<std::vector<uint8_t>()> produce);
  // Writes version 3 with general.alignment (default 32) atomically; throws std::runtime_error naming the path.
  void write(const std::string& path) const;

 private:
  struct PendingTensor {
    std::string name;
    std::vector<int64_t> ne;
    GgmlType type;
    uint64_t bytes;
    std::vector<uint8_t> data;                      // or, when empty and produce is set,
    std::function<std::vector<uint8_t>()> produce;  // what makes it at write time
  };
  uint64_t checked_bytes(const std::string& name, const std::vector<int64_t>& ne, GgmlType type) const;
  std::vector<std::pair<std::string, Value>> kv_;
  std::vector<PendingTensor> tensors_;
};

// Bytes of a tensor of this type and shape; throws FormatError for unknown types or ne[0] not a multiple of
// the block size.
uint64_t tensor_bytes(GgmlType t, const std::vector<int64_t>& ne);

}  // namespace q4t::gguf
