// Writing a GGUF v3 file: the header (metadata in insertion order, tensor infos with offsets padded to the
// alignment) is serialised in memory and checked first; then header and tensor data (each produced tensor made
// just before it is written) stream into PATH.tmp-XXXXXXXX in the same directory, which is fsynced and renamed
// over PATH. On any failure the temp file is removed, so an
// existing PATH is never touched.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstring>
#include <random>

#include "data/gguf.h"

namespace q4t::gguf {

namespace {

using Bytes = std::vector<uint8_t>;

template <class T>
void put(Bytes& out, T x) {
  const auto* p = reinterpret_cast<const uint8_t*>(&x);
  out.insert(out.end(), p, p + sizeof(T));
}

void put_string(Bytes& out, const std::string& s) {
  put<uint64_t>(out, s.size());
  out.insert(out.end(), s.begin(), s.end());
}

uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

// Serialises one value, checking that what it holds matches its type; `where` names the key for errors.
class ValueWriter {
 public:
  ValueWriter(Bytes& out, const std::string& where) : out_(out), where_(where) {}

  void value(const Value& v) {
    switch (v.type) {
      case ValueType::U8: put<uint8_t>(out_, uint8_t(unsigned_in(v, UINT8_MAX))); return;
      case ValueType::U16: put<uint16_t>(out_, uint16_t(unsigned_in(v, UINT16_MAX))); return;
      case ValueType::U32: put<uint32_t>(out_, uint32_t(unsigned_in(v, UINT32_MAX))); return;
      case ValueType::U64: put<uint64_t>(out_, unsigned_in(v, UINT64_MAX)); return;
      case ValueType::I8: put<int8_t>(out_, int8_t(signed_in(v, INT8_MIN, INT8_MAX))); return;
      case ValueType::I16: put<int16_t>(out_, int16_t(signed_in(v, INT16_MIN, INT16_MAX))); return;
      case ValueType::I32: put<int32_t>(out_, int32_t(signed_in(v, INT32_MIN, INT32_MAX))); return;
      case ValueType::I64: put<int64_t>(out_, signed_in(v, INT64_MIN, INT64_MAX)); return;
      case ValueType::F32: put<float>(out_, float(holds<double>(v))); return;
      case ValueType::F64: put<double>(out_, holds<double>(v)); return;
      case ValueType::BOOL: put<uint8_t>(out_, holds<bool>(v) ? 1 : 0); return;
      case ValueType::STRING: put_string(out_, holds<std::string>(v)); return;
      case ValueType::ARRAY: array(v); return;
    }
    fail("unknown value type " + std::to_string(uint32_t(v.type)));
  }

 private:
  void array(const Value& v) {
    const auto& items = holds<std::vector<Value>>(v);
    if (uint32_t(v.elem_type) > uint32_t(ValueType::F64))
      fail("unknown array element type " + std::to_string(uint32_t(v.elem_type)));
    put<uint32_t>(out_, uint32_t(v.elem_type));
    put<uint64_t>(out_, items.size());
    for (const Value& item : items) {
      if (item.type != v.elem_type)
        fail(std::string("an array of ") + value_type_name(v.elem_type) + " holds a " + value_type_name(item.type));
      value(item);
    }
  }

  template <class T>
  const T& holds(const Value& v) {
    const T* x = std::get_if<T>(&v.v);
    if (!x) fail(std::string("a ") + value_type_name(v.type) + " value holds the wrong C++ type");
    return *x;
  }
  uint64_t unsigned_in(const Value& v, uint64_t max) {
    const uint64_t x = holds<uint64_t>(v);
    if (x > max) fail(std::to_string(x) + " does not fit in a " + value_type_name(v.type));
    return x;
  }
  int64_t signed_in(const Value& v, int64_t min, int64_t max) {
    const int64_t x = holds<int64_t>(v);
    if (x < min || x > max) fail(std::to_string(x) + " does not fit in an " + value_type_name(v.type));
    return x;
  }
  [[noreturn]] void fail(const std::string& what) { throw std::runtime_error(where_ + ": " + what); }

  Bytes& out_;
  const std::string& where_;
};

// PATH.tmp-XXXXXXXX, created exclusively (mode 0666 less the umask, like any new file); removed by the
// destructor unless commit() renamed it over PATH.
class TempFile {
 public:
  explicit TempFile(const std::string& path) : path_(path) {
    std::random_device rd;
    for (int attempt = 0; attempt < 100 && fd_ < 0; ++attempt) {
      char suffix[16];
      std::snprintf(suffix, sizeof suffix, ".tmp-%08x", unsigned(rd()));
      tmp_ = path + suffix;
      fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
      if (fd_ < 0 && errno != EEXIST) break;
    }
    if (fd_ < 0) fail("create");
  }
  ~TempFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(tmp_.c_str());
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;

  void write(const uint8_t* p, size_t n) {
    while (n > 0) {
      const ssize_t w = ::write(fd_, p, n);
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) fail("write");
      p += w;
      n -= size_t(w);
    }
  }
  void write_zeros(size_t n) {
    static const uint8_t zeros[4096] = {};
    for (size_t k; n > 0; n -= k) {
      k = n < sizeof zeros ? n : sizeof zeros;
      write(zeros, k);
    }
  }

  void commit() {
    if (::fsync(fd_) != 0) fail("fsync");
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) fail("close");
    if (::rename(tmp_.c_str(), path_.c_str()) != 0) fail("rename");
    committed_ = true;
    sync_directory();
  }

 private:
  // "PATH: cannot write PATH.tmp-1a2b3c4d: No space left on device"
  [[noreturn]] void fail(const char* action) {
    const int err = errno;
    throw std::runtime_error(path_ + ": cannot " + action + " " + tmp_ + ": " + std::strerror(err));
  }
  // Makes the rename itself durable; the file is complete either way, so a failure here is not reported.
  void sync_directory() {
    const size_t slash = path_.rfind('/');
    const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path_.substr(0, slash);
    const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return;
    ::fsync(fd);
    ::close(fd);
  }

  std::string path_, tmp_;
  int fd_ = -1;
  bool committed_ = false;
};

std::string ne_string(const std::vector<int64_t>& ne) {
  std::string s = "[";
  for (size_t i = 0; i < ne.size(); ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
  return s + "]";
}

}  // namespace

void Writer::set(const std::string& key, Value v) {
  for (auto& [k, old] : kv_) {
    if (k == key) {
      old = std::move(v);
      return;
    }
  }
  kv_.emplace_back(key, std::move(v));
}

uint64_t Writer::checked_bytes(const std::string& name, const std::vector<int64_t>& ne, GgmlType type) const {
  const std::string what = "gguf writer: tensor '" + name + "'";
  if (name.empty()) throw std::invalid_argument("gguf writer: empty tensor name");
  for (const PendingTensor& t : tensors_)
    if (t.name == name) throw std::invalid_argument(what + " added twice");
  try {
    return tensor_bytes(type, ne);
  } catch (const FormatError& e) {
    throw std::invalid_argument(what + ": " + e.what());
  }
}

void Writer::add_tensor(const std::string& name, std::vector<int64_t> ne, GgmlType type, std::vector<uint8_t> data) {
  const uint64_t want = checked_bytes(name, ne, type);
  if (data.size() != want)
    throw std::invalid_argument("gguf writer: tensor '" + name + "' (" + type_name(type) + ", ne = " + ne_string(ne) +
                                ") needs " + std::to_string(want) + " bytes of data, got " + std::to_string(data.size()));
  tensors_.push_back({name, std::move(ne), type, want, std::move(data), nullptr});
}

void Writer::add_tensor(const std::string& name, std::vector<int64_t> ne, GgmlType type,
                        std::function<std::vector<uint8_t>()> produce) {
  const uint64_t want = checked_bytes(name, ne, type);
  tensors_.push_back({name, std::move(ne), type, want, {}, std::move(produce)});
}

void Writer::write(const std::string& path) const {
  uint64_t alignment = 32;
  Bytes head;
  head.reserve(4096);
  put<uint32_t>(head, 0x46554747);  // "GGUF" read as a little-endian u32
  put<uint32_t>(head, 3);
  put<uint64_t>(head, tensors_.size());
  put<uint64_t>(head, kv_.size());
  for (const auto& [key, v] : kv_) {
    const std::string where = path + ": key '" + key + "'";
    if (key.empty()) throw std::runtime_error(path + ": empty metadata key");
    if (key == "general.alignment") {
      const uint64_t* a = std::get_if<uint64_t>(&v.v);
      if (v.type != ValueType::U32 || !a || !std::has_single_bit(*a) || *a > UINT32_MAX)
        throw std::runtime_error(where + ": must be a u32 power of two");
      alignment = *a;
    }
    put_string(head, key);
    put<uint32_t>(head, uint32_t(v.type));
    ValueWriter(head, where).value(v);
  }
  uint64_t offset = 0;
  for (const PendingTensor& t : tensors_) {
    put_string(head, t.name);
    put<uint32_t>(head, uint32_t(t.ne.size()));
    for (int64_t d : t.ne) put<int64_t>(head, d);
    put<uint32_t>(head, uint32_t(t.type));
    put<uint64_t>(head, offset);
    offset = align_up(offset + t.bytes, alignment);
  }
  head.resize(align_up(head.size(), alignment), 0);

  TempFile out(path);
  out.write(head.data(), head.size());
  for (const PendingTensor& t : tensors_) {
    if (t.produce) {
      const std::vector<uint8_t> data = t.produce();
      if (data.size() != t.bytes)
        throw std::runtime_error(path + ": tensor '" + t.name + "' was made with " + std::to_string(data.size()) +
                                 " bytes, not its " + std::to_string(t.bytes));
      out.write(data.data(), data.size());
    } else {
      out.write(t.data.data(), t.data.size());
    }
    out.write_zeros(align_up(t.bytes, alignment) - t.bytes);
  }
  out.commit();
}

}  // namespace q4t::gguf
