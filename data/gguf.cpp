// GGUF type tables, tensor sizes, and the File's lookups and typed getters. Parsing is in gguf_read.cpp, writing
// in gguf_write.cpp.
#include <sys/mman.h>

#include <cstdio>

#include "data/gguf.h"

namespace q4t::gguf {

namespace {

struct TypeLayout {
  GgmlType type;
  const char* name;
  int64_t block_elems, block_bytes;
};

// Block sizes as in ggml-common.h (sizeof(block_*) and its QK).
constexpr TypeLayout kLayouts[] = {
    {GgmlType::F32, "f32", 1, 4},           {GgmlType::F16, "f16", 1, 2},
    {GgmlType::Q4_0, "q4_0", 32, 18},       {GgmlType::Q4_1, "q4_1", 32, 20},
    {GgmlType::Q5_0, "q5_0", 32, 22},       {GgmlType::Q5_1, "q5_1", 32, 24},
    {GgmlType::Q8_0, "q8_0", 32, 34},       {GgmlType::Q8_1, "q8_1", 32, 36},
    {GgmlType::Q2_K, "q2_K", 256, 84},      {GgmlType::Q3_K, "q3_K", 256, 110},
    {GgmlType::Q4_K, "q4_K", 256, 144},     {GgmlType::Q5_K, "q5_K", 256, 176},
    {GgmlType::Q6_K, "q6_K", 256, 210},     {GgmlType::Q8_K, "q8_K", 256, 292},
    {GgmlType::IQ2_XXS, "iq2_xxs", 256, 66}, {GgmlType::IQ2_XS, "iq2_xs", 256, 74},
    {GgmlType::IQ3_XXS, "iq3_xxs", 256, 98}, {GgmlType::IQ1_S, "iq1_s", 256, 50},
    {GgmlType::IQ4_NL, "iq4_nl", 32, 18},   {GgmlType::IQ3_S, "iq3_s", 256, 110},
    {GgmlType::IQ2_S, "iq2_s", 256, 82},    {GgmlType::IQ4_XS, "iq4_xs", 256, 136},
    {GgmlType::I8, "i8", 1, 1},             {GgmlType::I16, "i16", 1, 2},
    {GgmlType::I32, "i32", 1, 4},           {GgmlType::I64, "i64", 1, 8},
    {GgmlType::F64, "f64", 1, 8},           {GgmlType::IQ1_M, "iq1_m", 256, 56},
    {GgmlType::BF16, "bf16", 1, 2},         {GgmlType::TQ1_0, "tq1_0", 256, 54},
    {GgmlType::TQ2_0, "tq2_0", 256, 66},
};

const TypeLayout* find_layout(GgmlType t) {
  for (const TypeLayout& l : kLayouts)
    if (l.type == t) return &l;
  return nullptr;
}

std::string ne_string(const std::vector<int64_t>& ne) {
  std::string s = "[";
  for (size_t i = 0; i < ne.size(); ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
  return s + "]";
}

// "a string", "an i32", "an array of u8": how a getter's error names what it found or wanted.
std::string with_article(ValueType t, ValueType elem) {
  if (t == ValueType::ARRAY) return std::string("an array of ") + value_type_name(elem);
  const char* name = value_type_name(t);
  const bool vowel_sound = name[0] == 'i' || name[0] == 'f';
  return std::string(vowel_sound ? "an " : "a ") + name;
}

[[noreturn]] void key_error(const std::string& path, const std::string& key, const std::string& what) {
  throw FormatError(path + ": key '" + key + "' " + what);
}

bool is_unsigned(ValueType t) {
  return t == ValueType::U8 || t == ValueType::U16 || t == ValueType::U32 || t == ValueType::U64;
}
bool is_signed(ValueType t) {
  return t == ValueType::I8 || t == ValueType::I16 || t == ValueType::I32 || t == ValueType::I64;
}
bool is_float(ValueType t) { return t == ValueType::F32 || t == ValueType::F64; }

}  // namespace

const char* value_type_name(ValueType t) {
  switch (t) {
    case ValueType::U8: return "u8";
    case ValueType::I8: return "i8";
    case ValueType::U16: return "u16";
    case ValueType::I16: return "i16";
    case ValueType::U32: return "u32";
    case ValueType::I32: return "i32";
    case ValueType::F32: return "f32";
    case ValueType::BOOL: return "bool";
    case ValueType::STRING: return "string";
    case ValueType::ARRAY: return "array";
    case ValueType::U64: return "u64";
    case ValueType::I64: return "i64";
    case ValueType::F64: return "f64";
  }
  return "unknown";
}

// For an unknown number the name lives in a per-thread buffer, valid until the next such call on the thread.
const char* type_name(GgmlType t) {
  if (const TypeLayout* l = find_layout(t)) return l->name;
  thread_local char buf[24];
  std::snprintf(buf, sizeof buf, "type %u", unsigned(t));
  return buf;
}

bool type_layout(GgmlType t, int64_t* block_elems, int64_t* block_bytes) {
  const TypeLayout* l = find_layout(t);
  if (!l) return false;
  *block_elems = l->block_elems;
  *block_bytes = l->block_bytes;
  return true;
}

uint64_t tensor_bytes(GgmlType t, const std::vector<int64_t>& ne) {
  int64_t block_elems, block_bytes;
  if (!type_layout(t, &block_elems, &block_bytes)) throw FormatError(std::string("unknown tensor type ") + type_name(t));
  if (ne.empty() || ne.size() > 4) throw FormatError("a tensor has 1 to 4 dimensions, not " + std::to_string(ne.size()));
  int64_t n = 1;
  for (size_t d = 0; d < ne.size(); ++d) {
    if (ne[d] <= 0)
      throw FormatError("ne[" + std::to_string(d) + "] = " + std::to_string(ne[d]) + " is not positive");
    if (__builtin_mul_overflow(n, ne[d], &n))
      throw FormatError("the element count of ne = " + ne_string(ne) + " overflows 64 bits");
  }
  if (ne[0] % block_elems != 0)
    throw FormatError("ne[0] = " + std::to_string(ne[0]) + " is not a multiple of the " + type_name(t) +
                      " block size " + std::to_string(block_elems));
  uint64_t bytes;
  if (__builtin_mul_overflow(uint64_t(n / block_elems), uint64_t(block_bytes), &bytes))
    throw FormatError("the byte size of " + std::to_string(n) + " " + type_name(t) + " elements overflows 64 bits");
  return bytes;
}

int64_t TensorInfo::rows() const {
  int64_t r = 1;
  for (size_t d = 1; d < ne.size(); ++d) r *= ne[d];
  return r;
}

File::~File() {
  if (map_) munmap(map_, map_size_);
}

const Value* File::find(const std::string& key) const {
  const auto it = kv_index_.find(key);
  return it == kv_index_.end() ? nullptr : &kv_[it->second].second;
}

const TensorInfo* File::tensor(const std::string& name) const {
  const auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

std::string File::get_string(const std::string& key) const {
  const Value* v = find(key);
  if (!v) key_error(path_, key, "is missing");
  if (v->type != ValueType::STRING) key_error(path_, key, "is " + with_article(v->type, v->elem_type) + ", expected a string");
  return std::get<std::string>(v->v);
}

uint64_t File::get_uint(const std::string& key) const {
  const Value* v = find(key);
  if (!v) key_error(path_, key, "is missing");
  if (is_unsigned(v->type)) return std::get<uint64_t>(v->v);
  if (is_signed(v->type)) {
    const int64_t x = std::get<int64_t>(v->v);
    if (x < 0) key_error(path_, key, "is " + std::to_string(x) + ", expected a non-negative integer");
    return uint64_t(x);
  }
  key_error(path_, key, "is " + with_article(v->type, v->elem_type) + ", expected an integer");
}

double File::get_float(const std::string& key) const {
  const Value* v = find(key);
  if (!v) key_error(path_, key, "is missing");
  if (is_float(v->type)) return std::get<double>(v->v);
  if (is_unsigned(v->type)) return double(std::get<uint64_t>(v->v));
  if (is_signed(v->type)) return double(std::get<int64_t>(v->v));
  key_error(path_, key, "is " + with_article(v->type, v->elem_type) + ", expected a number");
}

bool File::get_bool(const std::string& key) const {
  const Value* v = find(key);
  if (!v) key_error(path_, key, "is missing");
  if (v->type != ValueType::BOOL) key_error(path_, key, "is " + with_article(v->type, v->elem_type) + ", expected a bool");
  return std::get<bool>(v->v);
}

const std::vector<Value>& File::get_array(const std::string& key, ValueType elem) const {
  const Value* v = find(key);
  if (!v) key_error(path_, key, "is missing");
  if (v->type != ValueType::ARRAY || v->elem_type != elem)
    key_error(path_, key,
              "is " + with_article(v->type, v->elem_type) + ", expected " + with_article(ValueType::ARRAY, elem));
  return std::get<std::vector<Value>>(v->v);
}

uint64_t File::get_uint_or(const std::string& key, uint64_t def) const { return find(key) ? get_uint(key) : def; }
double File::get_float_or(const std::string& key, double def) const { return find(key) ? get_float(key) : def; }
bool File::get_bool_or(const std::string& key, bool def) const { return find(key) ? get_bool(key) : def; }

bool File::is_adapter() const {
  const Value* t = find("general.type");
  return t && t->type == ValueType::STRING && std::get<std::string>(t->v) == "adapter";
}

void File::expect_model() const {
  if (is_adapter())
    throw FormatError(path_ + " is a LoRA adapter (general.type = adapter), not a model: give it as --adapter (or "
                      "--lora) and the base model it was trained on as --model");
}

void File::expect_adapter() const {
  if (is_adapter()) return;
  if (tensor("token_embd.weight") || find("tokenizer.ggml.model"))
    throw FormatError(path_ + " is a model (it has " +
                      std::string(tensor("token_embd.weight") ? "token_embd.weight" : "a tokenizer") +
                      "), not a LoRA adapter: give it as --model; an adapter is the adapter.gguf a training run "
                      "writes (general.type = adapter)");
}

}  // namespace q4t::gguf
