// The tiny llama GGUF and its malformed variants. A variant is the valid file with a few bytes overwritten, cut
// off, or spliced (with the data section re-padded so that only the intended defect remains). The expected
// message parts carry the byte offsets found by scanning the valid file, so the tests check that the reader
// points at the right field.
#include "malformed_gguf.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "data/gguf.h"

namespace q4t::test {

namespace {

using gguf::GgmlType;
using gguf::Value;
using gguf::ValueType;
using Bytes = std::vector<uint8_t>;

constexpr int64_t kEmbd = 32, kFf = 64, kVocab = 32, kHeads = 4, kKvHeads = 2;
constexpr int64_t kHeadDim = kEmbd / kHeads, kKvOut = kKvHeads * kHeadDim;
constexpr uint64_t kAlign = 32;
constexpr uint64_t kHuge = uint64_t(1) << 60;

// What the gguf_valid cases change in the otherwise usable model.
enum class ModelDefect { None, NoOutputNorm, WrongQShape, BlockCountString, NoEmbeddingLength };

Bytes q4_0_weight(int64_t n_out, int64_t n_in, uint32_t seed) {
  Bytes w(size_t(n_out * n_in / 32 * 18));
  uint32_t s = seed;
  for (size_t i = 0; i < w.size(); ++i) {
    s = s * 1664525u + 1013904223u;
    w[i] = uint8_t(s >> 24);
  }
  for (size_t b = 0; b < w.size(); b += 18) {  // each block's f16 scale d = 0.0625 (0x2c00)
    w[b] = 0x00;
    w[b + 1] = 0x2c;
  }
  return w;
}

Bytes f32_ones(int64_t n) {
  Bytes v(size_t(n) * 4);
  const float one = 1.0f;
  for (int64_t i = 0; i < n; ++i) std::memcpy(&v[size_t(i) * 4], &one, 4);
  return v;
}

void add_vocabulary(gguf::Writer& w) {
  std::vector<Value> tokens, scores, types;
  const char* words[] = {"<unk>", "<s>", "</s>", "▁the", "▁a", "▁of", "▁and", "▁to", "▁in", "▁is", "▁it",
                         "▁that", "▁q", "▁tune", "▁llama", "▁über", "▁naïve", "▁日本", "▁語", "▁🙂", "e", "s",
                         "t", "er", "in", "on", "an", "<0x0A>", "<0x20>", ".", ",", "!"};
  for (int64_t i = 0; i < kVocab; ++i) {
    tokens.push_back(Value::str(words[i]));
    scores.push_back(Value::f32(float(-i)));
    types.push_back(Value::i32(i < 3 ? 3 : i == 27 || i == 28 ? 6 : 1));  // control, byte, normal
  }
  w.set("tokenizer.ggml.model", Value::str("llama"));
  w.set("tokenizer.ggml.tokens", Value::array(ValueType::STRING, std::move(tokens)));
  w.set("tokenizer.ggml.scores", Value::array(ValueType::F32, std::move(scores)));
  w.set("tokenizer.ggml.token_type", Value::array(ValueType::I32, std::move(types)));
  w.set("tokenizer.ggml.bos_token_id", Value::u32(1));
  w.set("tokenizer.ggml.eos_token_id", Value::u32(2));
  w.set("tokenizer.ggml.add_bos_token", Value::boolean(true));
  w.set("tokenizer.chat_template",
        Value::str("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}</s>\n{% endfor %}"));
  // Not a llama key: an array of arrays ([[1, 2, 3], [4], []]), so that nested arrays get malformed too.
  w.set("q4tune.test.nested",
        Value::array(ValueType::ARRAY, {Value::array(ValueType::U32, {Value::u32(1), Value::u32(2), Value::u32(3)}),
                                        Value::array(ValueType::U32, {Value::u32(4)}),
                                        Value::array(ValueType::U32, {})}));
}

// name_pad lengthens general.name, which moves everything after it (used to get padding before the data).
gguf::Writer tiny_llama(ModelDefect defect, size_t name_pad = 0) {
  gguf::Writer w;
  w.set("general.architecture", Value::str("llama"));
  w.set("general.name", Value::str("q4tune tiny llama" + std::string(name_pad, '.')));
  w.set("general.alignment", Value::u32(kAlign));
  w.set("llama.context_length", Value::u32(64));
  if (defect != ModelDefect::NoEmbeddingLength) w.set("llama.embedding_length", Value::u32(kEmbd));
  w.set("llama.block_count", defect == ModelDefect::BlockCountString ? Value::str("1") : Value::u32(1));
  w.set("llama.feed_forward_length", Value::u32(kFf));
  w.set("llama.attention.head_count", Value::u32(kHeads));
  w.set("llama.attention.head_count_kv", Value::u32(kKvHeads));
  w.set("llama.rope.dimension_count", Value::u32(kHeadDim));
  w.set("llama.rope.freq_base", Value::f32(10000.0f));
  w.set("llama.attention.layer_norm_rms_epsilon", Value::f32(1e-5f));
  add_vocabulary(w);

  auto matrix = [&](const std::string& name, int64_t n_out, int64_t n_in, uint32_t seed) {
    w.add_tensor(name, {n_in, n_out}, GgmlType::Q4_0, q4_0_weight(n_out, n_in, seed));
  };
  auto norm = [&](const std::string& name) { w.add_tensor(name, {kEmbd}, GgmlType::F32, f32_ones(kEmbd)); };
  matrix("token_embd.weight", kVocab, kEmbd, 1);
  norm("blk.0.attn_norm.weight");
  matrix("blk.0.attn_q.weight", defect == ModelDefect::WrongQShape ? kKvOut : kEmbd, kEmbd, 2);
  matrix("blk.0.attn_k.weight", kKvOut, kEmbd, 3);
  matrix("blk.0.attn_v.weight", kKvOut, kEmbd, 4);
  matrix("blk.0.attn_output.weight", kEmbd, kEmbd, 5);
  norm("blk.0.ffn_norm.weight");
  matrix("blk.0.ffn_gate.weight", kFf, kEmbd, 6);
  matrix("blk.0.ffn_up.weight", kFf, kEmbd, 7);
  matrix("blk.0.ffn_down.weight", kEmbd, kFf, 8);
  if (defect != ModelDefect::NoOutputNorm) norm("output_norm.weight");
  matrix("output.weight", kVocab, kEmbd, 9);
  return w;
}

Bytes read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

void write_bytes(const std::string& path, const Bytes& b) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
  if (!f) throw std::runtime_error("cannot write " + path);
}

uint64_t align_up(uint64_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

// Where each field of the valid file is (it is our own output, so the walk trusts it).
struct KvAt {
  std::string key;
  uint64_t key_at, type_at, value_at, end;
};
struct TensorAt {
  std::string name;
  uint64_t name_at, dims_at, ne_at, type_at, offset_at;
};
struct Layout {
  std::vector<KvAt> kv;
  std::vector<TensorAt> tensors;
  uint64_t infos_end = 0, data_start = 0;
  const KvAt& key(const std::string& k) const {
    for (const KvAt& e : kv)
      if (e.key == k) return e;
    throw std::logic_error("no key " + k);
  }
  const TensorAt& tensor(const std::string& n) const {
    for (const TensorAt& t : tensors)
      if (t.name == n) return t;
    throw std::logic_error("no tensor " + n);
  }
};

class Walker {
 public:
  explicit Walker(const Bytes& b) : b_(b) {}
  uint64_t pos = 0;
  template <class T>
  T get() {
    if (pos + sizeof(T) > b_.size()) throw std::logic_error("the valid GGUF ends early");
    T x;
    std::memcpy(&x, b_.data() + pos, sizeof(T));
    pos += sizeof(T);
    return x;
  }
  std::string str() {
    const uint64_t n = get<uint64_t>();
    std::string s(b_.begin() + long(pos), b_.begin() + long(pos + n));
    pos += n;
    return s;
  }
  void skip_value(uint32_t type) {
    static const uint64_t kSize[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    if (type == uint32_t(ValueType::STRING)) {
      str();
    } else if (type == uint32_t(ValueType::ARRAY)) {
      const uint32_t elem = get<uint32_t>();
      const uint64_t n = get<uint64_t>();
      for (uint64_t i = 0; i < n; ++i) skip_value(elem);
    } else {
      pos += kSize[type];
    }
  }

 private:
  const Bytes& b_;
};

Layout scan(const Bytes& b) {
  Layout l;
  Walker w(b);
  w.pos = 8;
  const uint64_t n_tensors = w.get<uint64_t>(), n_kv = w.get<uint64_t>();
  for (uint64_t i = 0; i < n_kv; ++i) {
    KvAt k;
    k.key_at = w.pos;
    k.key = w.str();
    k.type_at = w.pos;
    const uint32_t type = w.get<uint32_t>();
    k.value_at = w.pos;
    w.skip_value(type);
    k.end = w.pos;
    l.kv.push_back(k);
  }
  for (uint64_t i = 0; i < n_tensors; ++i) {
    TensorAt t;
    t.name_at = w.pos;
    t.name = w.str();
    t.dims_at = w.pos;
    const uint32_t n_dims = w.get<uint32_t>();
    t.ne_at = w.pos;
    w.pos += 8 * n_dims + 4;
    t.type_at = t.ne_at + 8 * n_dims;
    t.offset_at = w.pos;
    w.pos += 8;
    l.tensors.push_back(t);
  }
  l.infos_end = w.pos;
  l.data_start = align_up(w.pos);
  return l;
}

template <class T>
Bytes le(T x) {
  Bytes b(sizeof(T));
  std::memcpy(b.data(), &x, sizeof(T));
  return b;
}

// "FIELD at byte offset N: WHAT", the form of every reader error.
std::string at(const std::string& field, uint64_t offset, const std::string& what) {
  return field + " at byte offset " + std::to_string(offset) + ": " + what;
}

// The valid file and the edits that make the variants.
struct Surgeon {
  Bytes base;
  Layout l;

  Bytes cut(uint64_t size) const { return Bytes(base.begin(), base.begin() + long(size)); }
  template <class T>
  Bytes with(uint64_t offset, T x) const {
    Bytes b = base;
    std::memcpy(&b.at(offset), &x, sizeof(T));
    return b;
  }
  // Head bytes [from, to) replaced by `bytes`, n_kv changed by kv_delta, the data re-padded after the infos.
  Bytes spliced(uint64_t from, uint64_t to, const Bytes& bytes, int kv_delta = 0) const {
    Bytes b(base.begin(), base.begin() + long(l.infos_end));
    b.erase(b.begin() + long(from), b.begin() + long(to));
    b.insert(b.begin() + long(from), bytes.begin(), bytes.end());
    uint64_t n_kv;
    std::memcpy(&n_kv, &b[16], 8);
    n_kv += uint64_t(int64_t(kv_delta));
    std::memcpy(&b[16], &n_kv, 8);
    b.resize(align_up(b.size()), 0);
    b.insert(b.end(), base.begin() + long(l.data_start), base.end());
    return b;
  }
  template <class T>
  T get(uint64_t offset) const {
    T x;
    std::memcpy(&x, &base.at(offset), sizeof(T));
    return x;
  }
};

struct Case {
  std::string name;
  Bytes bytes;
  std::string expected;
};

void header_cases(const Surgeon& s, std::vector<Case>& out) {
  const uint64_t n_kv = s.l.kv.size();
  out.push_back({"empty_file", {}, at("magic", 0, "truncated: needs 4 bytes, only 0 left")});
  out.push_back({"truncated_in_magic", s.cut(2), at("magic", 0, "truncated: needs 4 bytes, only 2 left")});
  out.push_back({"truncated_in_version", s.cut(6), at("version", 4, "truncated: needs 4 bytes, only 2 left")});
  out.push_back({"truncated_in_n_tensors", s.cut(12), at("n_tensors", 8, "truncated: needs 8 bytes, only 4 left")});
  out.push_back({"truncated_in_n_kv", s.cut(20), at("n_kv", 16, "truncated: needs 8 bytes, only 4 left")});
  out.push_back({"truncated_after_header", s.cut(24),
                 at("n_kv", 16, std::to_string(n_kv) + " metadata entries cannot fit in the 0 bytes left")});
  out.push_back({"bad_magic", s.with<uint32_t>(0, 0x4c4d4747),  // "GGML"
                 at("magic", 0, "not a GGUF file: the first bytes are 47 47 4d 4c")});
  out.push_back({"version_1", s.with<uint32_t>(4, 1), at("version", 4, "GGUF version 1 is not supported")});
  out.push_back({"version_99", s.with<uint32_t>(4, 99), at("version", 4, "GGUF version 99 is not supported")});
  out.push_back({"version_big_endian", s.with<uint32_t>(4, 0x03000000), "is a big-endian GGUF file"});
  out.push_back({"absurd_n_kv", s.with<uint64_t>(16, kHuge),
                 at("n_kv", 16, "1152921504606846976 metadata entries cannot fit")});
  out.push_back({"absurd_n_tensors", s.with<uint64_t>(8, kHuge),
                 at("n_tensors", 8, "1152921504606846976 tensor infos cannot fit")});
}

void metadata_cases(const Surgeon& s, std::vector<Case>& out) {
  const Layout& l = s.l;
  const KvAt& eos = l.key("tokenizer.ggml.eos_token_id");
  const size_t eos_index = size_t(&eos - l.kv.data());
  const uint64_t eos_key_len = s.get<uint64_t>(eos.key_at);
  out.push_back({"truncated_in_key", s.cut(eos.key_at + 8 + 5),
                 at("metadata #" + std::to_string(eos_index) + " key", eos.key_at,
                    "string length " + std::to_string(eos_key_len) + " exceeds the 5 bytes left in the file")});
  out.push_back({"truncated_in_value", s.cut(eos.value_at + 2),
                 at("metadata 'tokenizer.ggml.eos_token_id' value", eos.value_at, "truncated: needs 4 bytes, only 2 left")});
  const KvAt& tmpl = l.key("tokenizer.chat_template");
  out.push_back({"truncated_in_string", s.cut(tmpl.value_at + 8 + 10),
                 at("metadata 'tokenizer.chat_template' value", tmpl.value_at,
                    "string length " + std::to_string(s.get<uint64_t>(tmpl.value_at)) + " exceeds the 10 bytes left")});
  const KvAt& scores = l.key("tokenizer.ggml.scores");
  out.push_back({"truncated_in_array", s.cut(scores.value_at + 12 + 40),
                 at("metadata 'tokenizer.ggml.scores' count", scores.value_at + 4,
                    "32 f32 elements cannot fit in the 40 bytes left in the file")});
  const KvAt& k0 = l.kv[0];
  out.push_back({"absurd_key_length", s.with<uint64_t>(k0.key_at, kHuge),
                 at("metadata #0 key", k0.key_at, "string length 1152921504606846976 exceeds")});
  const KvAt& name = l.key("general.name");
  out.push_back({"absurd_string_length", s.with<uint64_t>(name.value_at, kHuge),
                 at("metadata 'general.name' value", name.value_at, "string length 1152921504606846976 exceeds")});
  const KvAt& tokens = l.key("tokenizer.ggml.tokens");
  out.push_back({"absurd_array_count", s.with<uint64_t>(tokens.value_at + 4, kHuge),
                 at("metadata 'tokenizer.ggml.tokens' count", tokens.value_at + 4,
                    "1152921504606846976 string elements cannot fit")});
  const uint64_t token3 = tokens.value_at + 12 + (8 + 5) + (8 + 3) + (8 + 4);  // after "<unk>", "<s>", "</s>"
  out.push_back({"absurd_string_length_in_array", s.with<uint64_t>(token3, kHuge),
                 at("metadata 'tokenizer.ggml.tokens'[3]", token3, "string length 1152921504606846976 exceeds")});
  out.push_back({"unknown_value_type", s.with<uint32_t>(name.type_at, 13),
                 at("metadata 'general.name' type", name.type_at, "unknown value type 13")});
  out.push_back({"unknown_array_element_type", s.with<uint32_t>(tokens.value_at, 13),
                 at("metadata 'tokenizer.ggml.tokens' element type", tokens.value_at, "unknown array element type 13")});
  const KvAt& bos = l.key("tokenizer.ggml.add_bos_token");
  out.push_back({"bool_not_0_or_1", s.with<uint8_t>(bos.value_at, 2),
                 at("metadata 'tokenizer.ggml.add_bos_token' value", bos.value_at, "bool value 2 is not 0 or 1")});
  const KvAt& dup = l.key("llama.block_count");
  out.push_back({"duplicate_key",
                 s.spliced(l.kv.back().end, l.kv.back().end, Bytes(s.base.begin() + long(dup.key_at),
                                                                    s.base.begin() + long(dup.end)), 1),
                 at("metadata #" + std::to_string(l.kv.size()) + " key", l.kv.back().end,
                    "duplicate key 'llama.block_count'")});
  const KvAt& k1 = l.kv[1];
  out.push_back({"empty_key", s.spliced(k1.key_at, k1.type_at, le<uint64_t>(0)),
                 at("metadata #1 key", k1.key_at, "empty key")});
}

void known_key_and_nested_cases(const Surgeon& s, std::vector<Case>& out) {
  const Layout& l = s.l;
  const KvAt& align = l.key("general.alignment");
  out.push_back({"alignment_0", s.with<uint32_t>(align.value_at, 0),
                 at("metadata 'general.alignment' value", align.value_at, "alignment 0 is not a power of two")});
  out.push_back({"alignment_3", s.with<uint32_t>(align.value_at, 3),
                 at("metadata 'general.alignment' value", align.value_at, "alignment 3 is not a power of two")});
  out.push_back({"alignment_wrong_type", s.with<uint32_t>(align.type_at, uint32_t(ValueType::I32)),
                 at("metadata 'general.alignment' type", align.type_at, "general.alignment must be a u32, found i32")});
  const KvAt& arch = l.key("general.architecture");
  Bytes arch_u32 = le<uint32_t>(uint32_t(ValueType::U32));
  arch_u32.insert(arch_u32.end(), {7, 0, 0, 0});
  out.push_back({"architecture_wrong_type", s.spliced(arch.type_at, arch.end, arch_u32),
                 at("metadata 'general.architecture' type", arch.type_at,
                    "general.architecture must be a string, found u32")});
  // [[1, 2, 3], [4], []]: the inner arrays start 12 bytes into the value, each with its own type and count.
  const KvAt& nested = l.key("q4tune.test.nested");
  const uint64_t inner0 = nested.value_at + 12, inner1 = inner0 + 12 + 3 * 4;
  out.push_back({"nested_array_bad_inner_count", s.with<uint64_t>(inner1 + 4, kHuge),
                 at("metadata 'q4tune.test.nested'[1] count", inner1 + 4, "1152921504606846976 u32 elements cannot fit")});
  out.push_back({"nested_array_unknown_inner_type", s.with<uint32_t>(inner0, 99),
                 at("metadata 'q4tune.test.nested'[0] element type", inner0, "unknown array element type 99")});
  Bytes deep;  // nine levels of one-element arrays around an empty u32 array
  for (int d = 0; d < 9; ++d) {
    const Bytes level = le<uint32_t>(uint32_t(ValueType::ARRAY)), one = le<uint64_t>(1);
    deep.insert(deep.end(), level.begin(), level.end());
    deep.insert(deep.end(), one.begin(), one.end());
  }
  const Bytes u32_empty[] = {le<uint32_t>(uint32_t(ValueType::U32)), le<uint64_t>(0)};
  for (const Bytes& b : u32_empty) deep.insert(deep.end(), b.begin(), b.end());
  out.push_back({"arrays_nested_too_deep", s.spliced(nested.value_at, nested.end, deep),
                 at("metadata 'q4tune.test.nested'[0][0][0][0][0][0][0] element type", nested.value_at + 7 * 12,
                    "arrays nested deeper than 8 levels")});
}

void tensor_info_cases(const Surgeon& s, std::vector<Case>& out) {
  const Layout& l = s.l;
  const TensorAt& q = l.tensor("blk.0.attn_q.weight");
  const std::string tq = "tensor 'blk.0.attn_q.weight'";
  out.push_back({"n_dims_0", s.with<uint32_t>(q.dims_at, 0), at(tq + " n_dims", q.dims_at, "n_dims 0 is not in 1..4")});
  out.push_back({"n_dims_5", s.with<uint32_t>(q.dims_at, 5), at(tq + " n_dims", q.dims_at, "n_dims 5 is not in 1..4")});
  out.push_back({"ne_zero", s.with<uint64_t>(q.ne_at + 8, 0), at(tq + " ne", q.ne_at, "ne[1] = 0 is not positive")});
  out.push_back({"ne_above_int64", s.with<uint64_t>(q.ne_at + 8, uint64_t(1) << 63),
                 at(tq + " ne", q.ne_at + 8, "ne[1] = 9223372036854775808 is larger than 2^63 - 1")});
  Bytes overflow = s.with<uint64_t>(q.ne_at, uint64_t(1) << 32);
  std::memcpy(&overflow[q.ne_at + 8], &overflow[q.ne_at], 8);
  out.push_back({"ne_product_overflow", overflow,
                 at(tq + " ne", q.ne_at, "the element count of ne = [4294967296, 4294967296] overflows 64 bits")});
  const TensorAt& norm = l.tensor("blk.0.attn_norm.weight");
  out.push_back({"byte_size_overflow", s.with<uint64_t>(norm.ne_at, uint64_t(1) << 62),
                 at("tensor 'blk.0.attn_norm.weight' ne", norm.ne_at,
                    "the byte size of 4611686018427387904 f32 elements overflows 64 bits")});
  const TensorAt& emb = l.tensor("token_embd.weight");
  out.push_back({"ne0_not_a_block_multiple", s.with<uint64_t>(emb.ne_at, 48),
                 at("tensor 'token_embd.weight' ne", emb.ne_at, "ne[0] = 48 is not a multiple of the q4_0 block size 32")});
  const TensorAt& fn = l.tensor("blk.0.ffn_norm.weight");
  out.push_back({"unknown_tensor_type", s.with<uint32_t>(fn.type_at, 77),
                 at("tensor 'blk.0.ffn_norm.weight' type", fn.type_at, "unknown tensor type 77")});
  out.push_back({"removed_tensor_type", s.with<uint32_t>(fn.type_at, 4),  // Q4_2, dropped from GGML long ago
                 at("tensor 'blk.0.ffn_norm.weight' type", fn.type_at, "unknown tensor type 4")});
  const TensorAt& k = l.tensor("blk.0.attn_k.weight");
  out.push_back({"duplicate_tensor_name", s.spliced(k.name_at, k.dims_at, Bytes(s.base.begin() + long(q.name_at),
                                                                                 s.base.begin() + long(q.dims_at))),
                 at("tensor #3 name", k.name_at, "duplicate tensor name 'blk.0.attn_q.weight'")});
  out.push_back({"empty_tensor_name", s.spliced(emb.name_at, emb.dims_at, le<uint64_t>(0)),
                 at("tensor #0 name", emb.name_at, "empty tensor name")});
  const uint64_t k_off = s.get<uint64_t>(k.offset_at);
  out.push_back({"misaligned_offset", s.with<uint64_t>(k.offset_at, k_off + 16),
                 at("tensor 'blk.0.attn_k.weight' offset", k.offset_at,
                    "offset " + std::to_string(k_off + 16) + " is not a multiple of the alignment 32")});
  const TensorAt& last = l.tensors.back();
  const uint64_t last_off = s.get<uint64_t>(last.offset_at);
  out.push_back({"offset_past_end", s.with<uint64_t>(last.offset_at, last_off + (1 << 20)),
                 at("tensor 'output.weight' offset", last.offset_at,
                    "offset " + std::to_string(last_off + (1 << 20)) + " points past the end of the file")});
}

void truncated_late_cases(const Surgeon& s, std::vector<Case>& out) {
  const Layout& l = s.l;
  const TensorAt& last = l.tensors.back();
  out.push_back({"truncated_in_tensor_infos", s.cut(last.ne_at + 8 + 3),
                 at("tensor 'output.weight' ne", last.ne_at + 8, "truncated: needs 8 bytes, only 3 left")});
  const uint64_t mid_pad = l.infos_end + (l.data_start - l.infos_end) / 2;
  out.push_back({"truncated_in_padding", s.cut(mid_pad),
                 at("data section", l.data_start,
                    "the data section would start past the end of the file (" + std::to_string(mid_pad) + " bytes)")});
  const uint64_t begin = l.data_start + s.get<uint64_t>(last.offset_at);
  const uint64_t end = begin + gguf::tensor_bytes(GgmlType::Q4_0, {kEmbd, kVocab});
  const uint64_t size = s.base.size() - 10;
  out.push_back({"truncated_in_data", s.cut(size),
                 at("tensor 'output.weight' offset", last.offset_at,
                    "data [" + std::to_string(begin) + ", " + std::to_string(end) +
                        ") extends past the end of the file (" + std::to_string(size) + " bytes)")});
}

// The valid file, with general.name lengthened until the tensor infos end at least 2 bytes before the data
// section, so that there is padding to cut into.
Surgeon valid_base(const std::string& dir) {
  const std::string path = dir + "/base.gguf";
  for (size_t pad = 0;; ++pad) {
    tiny_llama(ModelDefect::None, pad).write(path);
    Surgeon s{read_file(path), {}};
    s.l = scan(s.base);
    if (s.l.data_start - s.l.infos_end >= 2) {
      std::filesystem::remove(path);
      return s;
    }
  }
}

}  // namespace

void write_tiny_llama_gguf(const std::string& path) { tiny_llama(ModelDefect::None).write(path); }

std::vector<MalformedGguf> write_malformed_ggufs(const std::string& dir) {
  std::filesystem::create_directories(dir);
  const Surgeon s = valid_base(dir);
  std::vector<Case> cases;
  header_cases(s, cases);
  metadata_cases(s, cases);
  known_key_and_nested_cases(s, cases);
  tensor_info_cases(s, cases);
  truncated_late_cases(s, cases);

  std::vector<MalformedGguf> out;
  for (const Case& c : cases) {
    const std::string path = dir + "/" + c.name + ".gguf";
    write_bytes(path, c.bytes);
    out.push_back({c.name, path, c.expected, false});
  }
  const std::pair<const char*, ModelDefect> models[] = {{"missing_output_norm", ModelDefect::NoOutputNorm},
                                                        {"wrong_shape_attn_q", ModelDefect::WrongQShape},
                                                        {"block_count_is_a_string", ModelDefect::BlockCountString},
                                                        {"missing_embedding_length", ModelDefect::NoEmbeddingLength}};
  const char* names[] = {"output_norm.weight", "blk.0.attn_q.weight", "llama.block_count", "llama.embedding_length"};
  for (size_t i = 0; i < 4; ++i) {
    const std::string path = dir + "/" + models[i].first + ".gguf";
    tiny_llama(models[i].second).write(path);
    out.push_back({models[i].first, path, names[i], true});
  }
  return out;
}

}  // namespace q4t::test
