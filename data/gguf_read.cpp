// Reading a GGUF file: map it read-only, then walk header, metadata and tensor infos with a cursor that checks
// every read against the end of the file. Every problem is one FormatError
// "PATH: <field> at byte offset N: <what is wrong>", where N is where that field starts.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstring>

#include "data/gguf.h"

namespace q4t::gguf {

static_assert(std::endian::native == std::endian::little, "GGUF is little-endian; this reader copies bytes as is");

namespace {

constexpr uint64_t kMinKvBytes = 8 + 4 + 1;              // key length, value type, the smallest value
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 8 + 4 + 8;  // name length, n_dims, ne[0], type, offset
constexpr int kMaxArrayDepth = 8;
// All metadata array elements together. Each costs a Value (~48 bytes) in memory against as little as one byte
// in the file; real vocabularies (tokens, scores, types, merges) stay far below this.
constexpr uint64_t kMaxArrayElements = uint64_t(1) << 24;

std::string num(uint64_t x) { return std::to_string(x); }

bool valid_value_type(uint32_t t) { return t <= uint32_t(ValueType::F64); }

// Smallest encoding of one value of this type: what an array count is checked against.
uint64_t min_value_bytes(ValueType t) {
  switch (t) {
    case ValueType::U8: case ValueType::I8: case ValueType::BOOL: return 1;
    case ValueType::U16: case ValueType::I16: return 2;
    case ValueType::U32: case ValueType::I32: case ValueType::F32: return 4;
    case ValueType::U64: case ValueType::I64: case ValueType::F64: case ValueType::STRING: return 8;
    case ValueType::ARRAY: return 4 + 8;
  }
  return 1;
}

// What the parse produces; File::open moves it into the File.
struct Parsed {
  uint32_t version = 0;
  uint64_t alignment = 32;
  std::vector<std::pair<std::string, Value>> kv;
  std::map<std::string, size_t> kv_index;
  std::vector<TensorInfo> tensors;
  std::map<std::string, size_t> tensor_index;
  std::vector<uint64_t> offset_field_at;  // per tensor: where its offset field is, for error messages
};

// A cursor over the mapped bytes. Field names are passed as callables so that they are only built for an error
// (a vocabulary has ~100k array elements).
class Cursor {
 public:
  Cursor(const std::string& path, const uint8_t* data, uint64_t size) : path_(path), data_(data), size_(size) {}

  uint64_t pos() const { return pos_; }
  uint64_t size() const { return size_; }
  uint64_t left() const { return size_ - pos_; }

  [[noreturn]] void fail(uint64_t at, const std::string& field, const std::string& what) const {
    throw FormatError(path_ + ": " + field + " at byte offset " + num(at) + ": " + what);
  }

  template <class Field>
  const uint8_t* take(uint64_t n, Field&& field) {
    if (n > left()) fail(pos_, field(), "truncated: needs " + num(n) + " bytes, only " + num(left()) + " left");
    const uint8_t* p = data_ + pos_;
    pos_ += n;
    return p;
  }

  template <class T, class Field>
  T read(Field&& field) {
    T x;
    std::memcpy(&x, take(sizeof(T), field), sizeof(T));
    return x;
  }

  template <class Field>
  std::string read_string(Field&& field) {
    const uint64_t at = pos_;
    const uint64_t n = read<uint64_t>(field);
    if (n > left())
      fail(at, field(), "string length " + num(n) + " exceeds the " + num(left()) + " bytes left in the file");
    const uint8_t* p = take(n, field);
    return std::string(reinterpret_cast<const char*>(p), n);
  }

  Value read_value(ValueType t, const std::string& name, int depth);

 private:
  template <class Field>
  Value read_scalar(ValueType t, Field&& field);
  Value read_array(const std::string& name, int depth);

  const std::string& path_;
  const uint8_t* data_;
  uint64_t size_;
  uint64_t pos_ = 0;
  uint64_t array_elements_ = 0;
};

// name: "metadata 'KEY'" or, inside an array, "metadata 'KEY'[i]".
Value Cursor::read_value(ValueType t, const std::string& name, int depth) {
  if (t == ValueType::ARRAY) return read_array(name, depth);
  return read_scalar(t, [&] { return name + " value"; });
}

template <class Field>
Value Cursor::read_scalar(ValueType t, Field&& field) {
  const uint64_t at = pos_;
  constexpr ValueType none = ValueType::U32;  // elem_type of a non-array
  switch (t) {
    case ValueType::U8: return {t, none, uint64_t(read<uint8_t>(field))};
    case ValueType::I8: return {t, none, int64_t(read<int8_t>(field))};
    case ValueType::U16: return {t, none, uint64_t(read<uint16_t>(field))};
    case ValueType::I16: return {t, none, int64_t(read<int16_t>(field))};
    case ValueType::U32: return {t, none, uint64_t(read<uint32_t>(field))};
    case ValueType::I32: return {t, none, int64_t(read<int32_t>(field))};
    case ValueType::U64: return {t, none, read<uint64_t>(field)};
    case ValueType::I64: return {t, none, read<int64_t>(field)};
    case ValueType::F32: return {t, none, double(read<float>(field))};
    case ValueType::F64: return {t, none, read<double>(field)};
    case ValueType::STRING: return {t, none, read_string(field)};
    case ValueType::BOOL: {
      const uint8_t b = read<uint8_t>(field);
      if (b > 1) fail(at, field(), "bool value " + num(b) + " is not 0 or 1");
      return {t, none, b == 1};
    }
    case ValueType::ARRAY: break;
  }
  fail(at, field(), "internal: not a scalar type");
}

Value Cursor::read_array(const std::string& name, int depth) {
  const uint64_t type_at = pos_;
  const uint32_t elem = read<uint32_t>([&] { return name + " element type"; });
  if (!valid_value_type(elem)) fail(type_at, name + " element type", "unknown array element type " + num(elem));
  const ValueType et = ValueType(elem);
  if (et == ValueType::ARRAY && depth + 1 >= kMaxArrayDepth)
    fail(type_at, name + " element type", "arrays nested deeper than " + num(kMaxArrayDepth) + " levels");
  const uint64_t count_at = pos_;
  const uint64_t n = read<uint64_t>([&] { return name + " count"; });
  if (n > left() / min_value_bytes(et))
    fail(count_at, name + " count",
         num(n) + " " + value_type_name(et) + " elements cannot fit in the " + num(left()) + " bytes left in the file");
  array_elements_ += n;
  if (array_elements_ > kMaxArrayElements)
    fail(count_at, name + " count",
         "the metadata arrays hold more than " + num(kMaxArrayElements) + " elements in all (q4tune's limit)");
  std::vector<Value> items;
  items.reserve(n);
  for (uint64_t i = 0; i < n; ++i) {
    if (et == ValueType::ARRAY)
      items.push_back(read_array(name + "[" + num(i) + "]", depth + 1));
    else
      items.push_back(read_scalar(et, [&] { return name + "[" + num(i) + "]"; }));
  }
  return {ValueType::ARRAY, et, std::move(items)};
}

void read_header(Cursor& c, Parsed& r, uint64_t* n_tensors, uint64_t* n_kv) {
  const uint8_t* magic = c.take(4, [] { return std::string("magic"); });
  if (std::memcmp(magic, "GGUF", 4) != 0) {
    char shown[32];
    std::snprintf(shown, sizeof shown, "%02x %02x %02x %02x", magic[0], magic[1], magic[2], magic[3]);
    c.fail(0, "magic", std::string("not a GGUF file: the first bytes are ") + shown + ", expected \"GGUF\"");
  }
  r.version = c.read<uint32_t>([] { return std::string("version"); });
  if (r.version != 2 && r.version != 3) {
    const uint32_t swapped = __builtin_bswap32(r.version);
    if (swapped >= 1 && swapped <= 3)
      c.fail(4, "version", "version " + num(r.version) + " is a big-endian GGUF file, which q4tune cannot read");
    c.fail(4, "version", "GGUF version " + num(r.version) + " is not supported (q4tune reads versions 2 and 3)");
  }
  *n_tensors = c.read<uint64_t>([] { return std::string("n_tensors"); });
  *n_kv = c.read<uint64_t>([] { return std::string("n_kv"); });
  if (*n_kv > c.left() / kMinKvBytes)
    c.fail(16, "n_kv",
           num(*n_kv) + " metadata entries cannot fit in the " + num(c.left()) + " bytes left in the file");
  if (*n_tensors > c.left() / kMinTensorInfoBytes)
    c.fail(8, "n_tensors",
           num(*n_tensors) + " tensor infos cannot fit in the " + num(c.left()) + " bytes left in the file");
}

// The keys whose type this reader relies on are checked as soon as their type field is read.
void check_known_key_type(Cursor& c, const std::string& key, ValueType t, uint64_t type_at) {
  const std::string field = "metadata '" + key + "' type";
  if (key == "general.alignment" && t != ValueType::U32)
    c.fail(type_at, field, std::string("general.alignment must be a u32, found ") + value_type_name(t));
  if (key == "general.architecture" && t != ValueType::STRING)
    c.fail(type_at, field, std::string("general.architecture must be a string, found ") + value_type_name(t));
}

void read_kv(Cursor& c, Parsed& r, uint64_t i) {
  const uint64_t key_at = c.pos();
  auto key_field = [&] { return "metadata #" + num(i) + " key"; };
  std::string key = c.read_string(key_field);
  if (key.empty()) c.fail(key_at, key_field(), "empty key");
  if (r.kv_index.count(key)) c.fail(key_at, key_field(), "duplicate key '" + key + "'");
  const std::string name = "metadata '" + key + "'";
  const uint64_t type_at = c.pos();
  const uint32_t type = c.read<uint32_t>([&] { return name + " type"; });
  if (!valid_value_type(type)) c.fail(type_at, name + " type", "unknown value type " + num(type));
  check_known_key_type(c, key, ValueType(type), type_at);
  const uint64_t value_at = c.pos();
  Value v = c.read_value(ValueType(type), name, 0);
  if (key == "general.alignment") {
    const uint64_t a = std::get<uint64_t>(v.v);
    if (!std::has_single_bit(a)) c.fail(value_at, name + " value", "alignment " + num(a) + " is not a power of two");
    r.alignment = a;
  }
  r.kv_index.emplace(key, r.kv.size());
  r.kv.emplace_back(std::move(key), std::move(v));
}

void read_tensor_info(Cursor& c, Parsed& r, uint64_t i) {
  const uint64_t name_at = c.pos();
  auto name_field = [&] { return "tensor #" + num(i) + " name"; };
  std::string tname = c.read_string(name_field);
  if (tname.empty()) c.fail(name_at, name_field(), "empty tensor name");
  if (r.tensor_index.count(tname)) c.fail(name_at, name_field(), "duplicate tensor name '" + tname + "'");
  const std::string t = "tensor '" + tname + "'";
  const uint64_t dims_at = c.pos();
  const uint32_t n_dims = c.read<uint32_t>([&] { return t + " n_dims"; });
  if (n_dims < 1 || n_dims > 4) c.fail(dims_at, t + " n_dims", "n_dims " + num(n_dims) + " is not in 1..4");
  const uint64_t ne_at = c.pos();
  std::vector<int64_t> ne(n_dims);
  for (uint32_t d = 0; d < n_dims; ++d) {
    const uint64_t x = c.read<uint64_t>([&] { return t + " ne"; });
    if (x > uint64_t(INT64_MAX))
      c.fail(ne_at + 8 * d, t + " ne", "ne[" + num(d) + "] = " + num(x) + " is larger than 2^63 - 1");
    ne[d] = int64_t(x);
  }
  const uint64_t type_at = c.pos();
  const uint32_t type = c.read<uint32_t>([&] { return t + " type"; });
  int64_t block_elems, block_bytes;
  if (!type_layout(GgmlType(type), &block_elems, &block_bytes))
    c.fail(type_at, t + " type", "unknown tensor type " + num(type));
  uint64_t bytes = 0;
  try {
    bytes = tensor_bytes(GgmlType(type), ne);
  } catch (const FormatError& e) {
    c.fail(ne_at, t + " ne", e.what());
  }
  const uint64_t offset_at = c.pos();
  const uint64_t offset = c.read<uint64_t>([&] { return t + " offset"; });
  if (offset % r.alignment != 0)
    c.fail(offset_at, t + " offset",
           "offset " + num(offset) + " is not a multiple of the alignment " + num(r.alignment));
  r.tensor_index.emplace(tname, r.tensors.size());
  r.tensors.push_back({std::move(tname), std::move(ne), GgmlType(type), offset, bytes, nullptr});
  r.offset_field_at.push_back(offset_at);
}

// The data section starts at the first multiple of the alignment after the tensor infos; every tensor's bytes
// must lie inside the file.
void place_tensors(Cursor& c, Parsed& r, const uint8_t* data) {
  if (r.tensors.empty()) return;
  const uint64_t start = (c.pos() + r.alignment - 1) / r.alignment * r.alignment;
  const uint64_t size = c.size();
  if (start > size)
    c.fail(start, "data section", "the data section would start past the end of the file (" + num(size) + " bytes)");
  for (size_t i = 0; i < r.tensors.size(); ++i) {
    TensorInfo& t = r.tensors[i];
    const std::string field = "tensor '" + t.name + "' offset";
    if (t.offset > size - start)
      c.fail(r.offset_field_at[i], field,
             "offset " + num(t.offset) + " points past the end of the file (" + num(size) +
                 " bytes, data section at byte " + num(start) + ")");
    const uint64_t begin = start + t.offset;
    if (t.bytes > size - begin) {
      const unsigned __int128 end = (unsigned __int128)begin + t.bytes;  // may not fit 64 bits
      const std::string end_str = end >> 64 ? num(begin) + " + " + num(t.bytes) : num(uint64_t(end));
      c.fail(r.offset_field_at[i], field,
             "data [" + num(begin) + ", " + end_str + ") extends past the end of the file (" + num(size) + " bytes)");
    }
    t.data = data + begin;
  }
}

Parsed parse(const std::string& path, const uint8_t* data, uint64_t size) {
  Cursor c(path, data, size);
  Parsed r;
  uint64_t n_tensors, n_kv;
  read_header(c, r, &n_tensors, &n_kv);
  r.kv.reserve(n_kv);
  for (uint64_t i = 0; i < n_kv; ++i) read_kv(c, r, i);
  r.tensors.reserve(n_tensors);
  for (uint64_t i = 0; i < n_tensors; ++i) read_tensor_info(c, r, i);
  place_tensors(c, r, data);
  return r;
}

// I/O failures are FormatErrors too, so that callers handle "cannot use this file" in one place.
[[noreturn]] void io_error(const std::string& path, const char* what) {
  const int err = errno;
  throw FormatError(path + ": " + what + ": " + std::strerror(err));
}

struct FdCloser {
  int fd;
  ~FdCloser() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

std::unique_ptr<File> File::open(const std::string& path) {
  std::unique_ptr<File> f(new File());
  f->path_ = path;
  const FdCloser fd{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (fd.fd < 0) io_error(path, "cannot open");
  struct stat st;
  if (fstat(fd.fd, &st) != 0) io_error(path, "cannot stat");
  if (!S_ISREG(st.st_mode)) throw FormatError(path + ": not a regular file");
  const uint64_t size = uint64_t(st.st_size);
  if (size > 0) {  // mmap of 0 bytes fails; an empty file is reported by the parser as truncated
    void* m = mmap(nullptr, size_t(size), PROT_READ, MAP_PRIVATE, fd.fd, 0);
    if (m == MAP_FAILED) io_error(path, "cannot map");
    f->map_ = m;
    f->map_size_ = size_t(size);
  }
  Parsed r = parse(path, static_cast<const uint8_t*>(f->map_), size);
  f->version_ = r.version;
  f->alignment_ = r.alignment;
  f->kv_ = std::move(r.kv);
  f->kv_index_ = std::move(r.kv_index);
  f->tensors_ = std::move(r.tensors);
  f->tensor_index_ = std::move(r.tensor_index);
  return f;
}

}  // namespace q4t::gguf
