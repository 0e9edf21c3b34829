#include "train/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string_view>
#include <utility>

#include "data/checksum.h"
#include "data/splitmix.h"

namespace q4t {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

static_assert(std::endian::native == std::endian::little, "checkpoint files are little-endian");

constexpr const char* kMarker = "complete";
constexpr const char* kFormat = "q4tune-checkpoint";
// Version 2 hashes files with XXH3 (data/checksum.h). Version 1, written before, hashed them with checksum_v1
// below; it is still read, and verified with that hash.
constexpr int kFormatVersion = 2;
constexpr char kTensorMagic[8] = {'Q', '4', 'T', 'T', 'E', 'N', 'S', '1'};
constexpr uint32_t kMaxRank = 8;

std::string sys_error() { return std::strerror(errno); }

// The file hash of version 1 checkpoints: FNV-style multiply-xor over 8-byte words in four interleaved lanes, the
// tail bytes FNV-1a, all folded with the length by splitmix64's finalizer.
uint64_t checksum_v1(std::string_view bytes) {
  constexpr uint64_t kPrime = 0x100000001b3ULL;
  constexpr uint64_t kOffset = 0xcbf29ce484222325ULL;
  uint64_t lane[4] = {kOffset, kOffset ^ 1, kOffset ^ 2, kOffset ^ 3};
  size_t at = 0;
  for (; bytes.size() - at >= 32; at += 32) {
    for (int k = 0; k < 4; ++k) {
      uint64_t w;
      std::memcpy(&w, bytes.data() + at + 8 * k, 8);
      lane[k] = std::rotl((lane[k] ^ w) * kPrime, 29);
    }
  }
  uint64_t tail = kOffset;
  for (; at < bytes.size(); ++at) tail = (tail ^ uint8_t(bytes[at])) * kPrime;
  uint64_t h = mix64(bytes.size() ^ tail);
  for (uint64_t l : lane) h = mix64(h ^ l);
  return h;
}

std::string hex64(uint64_t x) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(x));
  return buf;
}

struct FileEntry {
  uint64_t bytes = 0;
  uint64_t hash = 0;
};

// Creates a new file (never overwrites), buffers writes, hashes what it writes; finish() fsyncs and closes.
class SyncedFileWriter {
 public:
  explicit SyncedFileWriter(std::string path) : path_(std::move(path)) {
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd_ < 0) fail("create");
  }
  ~SyncedFileWriter() {
    if (fd_ >= 0) ::close(fd_);
  }
  SyncedFileWriter(const SyncedFileWriter&) = delete;
  SyncedFileWriter& operator=(const SyncedFileWriter&) = delete;

  void write(const void* data, size_t n) {
    hash_.bytes(data, n);
    bytes_ += n;
    const auto* p = static_cast<const char*>(data);
    if (buf_.size() + n <= kBufBytes) {
      buf_.append(p, n);
      return;
    }
    flush();
    if (n >= kBufBytes) {
      write_all(p, n);
    } else {
      buf_.append(p, n);
    }
  }
  template <typename T>
  void write_pod(T x) { write(&x, sizeof(x)); }

  FileEntry finish() {
    flush();
    if (::fsync(fd_) != 0) fail("fsync");
    const int fd = std::exchange(fd_, -1);
    if (::close(fd) != 0) fail("close");
    return {bytes_, hash_.digest()};
  }

 private:
  static constexpr size_t kBufBytes = size_t(1) << 20;
  std::string path_;
  int fd_ = -1;
  std::string buf_;
  Checksum64 hash_;
  uint64_t bytes_ = 0;

  [[noreturn]] void fail(const char* what) const {
    throw std::runtime_error("cannot write " + path_ + " (" + what + "): " + sys_error());
  }
  void flush() {
    write_all(buf_.data(), buf_.size());
    buf_.clear();
  }
  void write_all(const char* p, size_t n) {
    while (n > 0) {
      const ssize_t w = ::write(fd_, p, n);
      if (w < 0) {
        if (errno == EINTR) continue;
        fail("write");
      }
      p += w;
      n -= size_t(w);
    }
  }
};

void fsync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error("cannot open directory " + dir + " to fsync it: " + sys_error());
  const int rc = ::fsync(fd);
  const std::string err = rc != 0 ? sys_error() : "";
  ::close(fd);
  if (rc != 0) throw std::runtime_error("cannot fsync directory " + dir + ": " + err);
}

std::string read_whole_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error("cannot read " + path + ": " + sys_error());
  std::string out;
  struct stat st;
  if (::fstat(fd, &st) == 0 && st.st_size > 0) out.reserve(size_t(st.st_size));
  char chunk[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, chunk, sizeof(chunk));
    if (n < 0) {
      if (errno == EINTR) continue;
      const std::string err = sys_error();
      ::close(fd);
      throw std::runtime_error("cannot read " + path + ": " + err);
    }
    if (n == 0) break;
    out.append(chunk, size_t(n));
  }
  ::close(fd);
  return out;
}

// ---- tensors ----

void check_tensors(const std::vector<NamedTensor>& ts, const char* group) {
  for (const NamedTensor& t : ts) {
    if (t.shape.size() > kMaxRank) {
      throw std::invalid_argument(std::string("checkpoint ") + group + " tensor '" + t.name + "' has rank " +
                                  std::to_string(t.shape.size()) + ", at most 8 is supported");
    }
    uint64_t n = 1;
    for (int64_t d : t.shape) {
      if (d < 0 || (d > 0 && n > UINT64_MAX / uint64_t(d))) {
        throw std::invalid_argument(std::string("checkpoint ") + group + " tensor '" + t.name +
                                    "' has an invalid shape");
      }
      n *= uint64_t(d);
    }
    if (n != t.values.size()) {
      throw std::invalid_argument(std::string("checkpoint ") + group + " tensor '" + t.name + "' has " +
                                  std::to_string(t.values.size()) + " values, its shape needs " +
                                  std::to_string(n));
    }
  }
}

FileEntry write_tensors(const std::string& path, const std::vector<NamedTensor>& ts) {
  SyncedFileWriter w(path);
  w.write(kTensorMagic, sizeof(kTensorMagic));
  w.write_pod<uint64_t>(ts.size());
  for (const NamedTensor& t : ts) {
    w.write_pod<uint32_t>(uint32_t(t.name.size()));
    w.write(t.name.data(), t.name.size());
    w.write_pod<uint32_t>(uint32_t(t.shape.size()));
    w.write(t.shape.data(), t.shape.size() * sizeof(int64_t));
    w.write(t.values.data(), t.values.size() * sizeof(float));
  }
  return w.finish();
}

// Bounds-checked little-endian reads from a file's bytes; errors name the file and the byte offset.
class ByteReader {
 public:
  ByteReader(const std::string& path, const std::string& bytes) : path_(path), bytes_(bytes) {}

  void read(void* out, size_t n, const char* what) {
    if (n > bytes_.size() - pos_) {
      throw std::runtime_error(path_ + ": truncated at byte " + std::to_string(pos_) + " reading " + what);
    }
    std::memcpy(out, bytes_.data() + pos_, n);
    pos_ += n;
  }
  template <typename T>
  T pod(const char* what) {
    T x;
    read(&x, sizeof(x), what);
    return x;
  }
  size_t remaining() const { return bytes_.size() - pos_; }
  size_t pos() const { return pos_; }
  [[noreturn]] void fail(const std::string& msg) const {
    throw std::runtime_error(path_ + ": " + msg + " at byte " + std::to_string(pos_));
  }

 private:
  const std::string& path_;
  const std::string& bytes_;
  size_t pos_ = 0;
};

NamedTensor read_tensor(ByteReader& r) {
  NamedTensor t;
  t.name.resize(r.pod<uint32_t>("a tensor name length"));
  r.read(t.name.data(), t.name.size(), "a tensor name");
  const uint32_t rank = r.pod<uint32_t>("a tensor rank");
  if (rank > kMaxRank) r.fail("tensor '" + t.name + "' has rank " + std::to_string(rank) + " (at most 8)");
  t.shape.resize(rank);
  r.read(t.shape.data(), rank * sizeof(int64_t), "a tensor shape");
  uint64_t n = 1;
  for (int64_t d : t.shape) {
    if (d < 0 || (d > 0 && n > UINT64_MAX / uint64_t(d))) r.fail("tensor '" + t.name + "' has an invalid shape");
    n *= uint64_t(d);
  }
  if (n > r.remaining() / sizeof(float)) {
    r.fail("tensor '" + t.name + "' needs " + std::to_string(n) + " values, the file is shorter");
  }
  t.values.resize(n);
  r.read(t.values.data(), n * sizeof(float), "tensor values");
  return t;
}

std::vector<NamedTensor> parse_tensors(const std::string& path, const std::string& bytes) {
  ByteReader r(path, bytes);
  char magic[sizeof(kTensorMagic)];
  r.read(magic, sizeof(magic), "the magic");
  if (std::memcmp(magic, kTensorMagic, sizeof(magic)) != 0) r.fail("not a q4tune tensor file (bad magic)");
  const uint64_t count = r.pod<uint64_t>("the tensor count");
  if (count > r.remaining() / 8) r.fail("tensor count " + std::to_string(count) + " exceeds the file size");
  std::vector<NamedTensor> out;
  out.reserve(count);
  for (uint64_t i = 0; i < count; ++i) out.push_back(read_tensor(r));
  if (r.remaining() != 0) r.fail(std::to_string(r.remaining()) + " trailing bytes");
  return out;
}

// ---- state.json ----

std::string encode_state(const CheckpointState& s) {
  json j;
  j["step"] = s.step;
  j["adam_t"] = s.adam_t;
  j["lr_base_bits"] = std::bit_cast<uint64_t>(s.lr_base);  // exact; "lr_base" is for people reading the file
  j["lr_base"] = s.lr_base;
  j["rng_state"] = s.rng_state;
  j["cursor"] = {{"epoch", s.cursor.epoch}, {"index", s.cursor.index}, {"seed", s.cursor.seed}};
  j["schedule_json"] = s.schedule_json;
  j["config_json"] = s.config_json;
  j["elapsed_s"] = std::isfinite(s.elapsed_s) ? s.elapsed_s : 0.0;  // JSON has no NaN or infinity
  return j.dump(2) + "\n";
}

FileEntry write_text(const std::string& path, const std::string& text) {
  SyncedFileWriter w(path);
  w.write(text.data(), text.size());
  return w.finish();
}

template <typename T>
T json_field(const json& j, const char* key, const std::string& path) {
  if (!j.contains(key)) throw std::runtime_error(path + ": missing field '" + key + "'");
  try {
    return j.at(key).get<T>();
  } catch (const json::exception& e) {
    throw std::runtime_error(path + ": field '" + key + "' has the wrong type: " + e.what());
  }
}

void parse_state(const std::string& path, const std::string& text, CheckpointState* s) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw std::runtime_error(path + ": not valid JSON: " + e.what());
  }
  if (!j.is_object()) throw std::runtime_error(path + ": expected a JSON object");
  s->step = json_field<int64_t>(j, "step", path);
  s->adam_t = json_field<int64_t>(j, "adam_t", path);
  s->lr_base = std::bit_cast<double>(json_field<uint64_t>(j, "lr_base_bits", path));
  s->rng_state = json_field<std::vector<uint64_t>>(j, "rng_state", path);
  const json cursor = json_field<json>(j, "cursor", path);
  s->cursor.epoch = json_field<uint64_t>(cursor, "epoch", path);
  s->cursor.index = json_field<uint64_t>(cursor, "index", path);
  s->cursor.seed = json_field<uint64_t>(cursor, "seed", path);
  s->schedule_json = json_field<std::string>(j, "schedule_json", path);
  s->config_json = json_field<std::string>(j, "config_json", path);
  s->elapsed_s = j.contains("elapsed_s") ? json_field<double>(j, "elapsed_s", path) : 0.0;
}

// ---- the marker and verification ----

const std::vector<std::string>& payload_files() {
  static const std::vector<std::string> names = {"state.json", "lora.bin", "adam_m.bin", "adam_v.bin"};
  return names;
}

std::string encode_marker(int64_t step, const std::vector<std::pair<std::string, FileEntry>>& files) {
  json j;
  j["format"] = kFormat;
  j["version"] = kFormatVersion;
  j["step"] = step;
  json list = json::object();
  for (const auto& [name, e] : files) list[name] = {{"bytes", e.bytes}, {"hash", hex64(e.hash)}};
  j["files"] = list;
  return j.dump(2) + "\n";
}

// Reads the marker and every payload file of dir, checking sizes and hashes; returns the payload contents by
// name and the marker's step.
std::vector<std::pair<std::string, std::string>> read_verified(const std::string& dir, int64_t* step) {
  const std::string marker_path = dir + "/" + kMarker;
  if (!fs::exists(marker_path)) {
    throw std::runtime_error(marker_path + ": missing (the checkpoint was not completed)");
  }
  json marker;
  try {
    marker = json::parse(read_whole_file(marker_path));
  } catch (const json::exception& e) {
    throw std::runtime_error(marker_path + ": not valid JSON: " + e.what());
  }
  if (!marker.is_object() || marker.value("format", "") != kFormat) {
    throw std::runtime_error(marker_path + ": not a q4tune checkpoint marker");
  }
  const int version = json_field<int>(marker, "version", marker_path);
  if (version < 1 || version > kFormatVersion) {
    throw std::runtime_error(marker_path + ": checkpoint format version " + std::to_string(version) +
                             ", but this q4tune reads versions 1 to " + std::to_string(kFormatVersion) +
                             (version > kFormatVersion ? " (a newer q4tune wrote it)" : ""));
  }
  *step = json_field<int64_t>(marker, "step", marker_path);
  const json files = json_field<json>(marker, "files", marker_path);
  std::vector<std::pair<std::string, std::string>> out;
  for (const std::string& name : payload_files()) {
    const std::string path = dir + "/" + name;
    if (!files.contains(name)) throw std::runtime_error(marker_path + ": does not list " + name);
    const json entry = files.at(name);
    const uint64_t want_bytes = json_field<uint64_t>(entry, "bytes", marker_path);
    const std::string want_hash = json_field<std::string>(entry, "hash", marker_path);
    std::string bytes = read_whole_file(path);
    if (bytes.size() != want_bytes) {
      throw std::runtime_error(path + ": " + std::to_string(bytes.size()) + " bytes, the marker says " +
                               std::to_string(want_bytes) + " (truncated or overwritten)");
    }
    const uint64_t hash = version == 1 ? checksum_v1(bytes) : checksum64(bytes.data(), bytes.size());
    if (hex64(hash) != want_hash) {
      throw std::runtime_error(path + ": checksum mismatch (the file is corrupted)");
    }
    out.emplace_back(name, std::move(bytes));
  }
  return out;
}

// ---- directory layout ----

std::string checkpoints_root(const std::string& out_dir) { return out_dir + "/checkpoints"; }

// The N of a directory named exactly "step-N" (canonical decimal), or nullopt.
std::optional<int64_t> parse_step_name(const std::string& name) {
  const std::string prefix = "step-";
  if (name.compare(0, prefix.size(), prefix) != 0) return std::nullopt;
  const char* first = name.data() + prefix.size();
  const char* last = name.data() + name.size();
  int64_t n = 0;
  const auto [ptr, ec] = std::from_chars(first, last, n);
  if (ec != std::errc() || ptr != last || n < 0 || std::to_string(n) != std::string(first, last)) {
    return std::nullopt;
  }
  return n;
}

// step-N directories under root, newest first.
std::vector<std::pair<int64_t, std::string>> step_dirs(const std::string& root) {
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    const std::optional<int64_t> step = parse_step_name(it->path().filename().string());
    if (step && it->is_directory(ec)) out.emplace_back(*step, it->path().string());
  }
  if (ec) throw std::runtime_error("cannot list " + root + ": " + ec.message());
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return out;
}

std::string make_temp_dir(const std::string& root, int64_t step) {
  std::string templ = root + "/.tmp-step-" + std::to_string(step) + "-XXXXXX";
  if (::mkdtemp(templ.data()) == nullptr) {
    throw std::runtime_error("cannot create checkpoint directory " + templ + ": " + sys_error());
  }
  return templ;
}

// Renames the finished temp directory to final_dir. An existing step-N directory is renamed aside first and
// removed only after the new one is in place.
void install(const std::string& tmp, const std::string& final_dir, const std::string& root) {
  struct stat st;
  std::string old;
  if (::lstat(final_dir.c_str(), &st) == 0) {
    if (!S_ISDIR(st.st_mode)) {
      throw std::runtime_error("cannot save checkpoint: " + final_dir + " exists and is not a directory");
    }
    old = root + "/.old-" + fs::path(tmp).filename().string().substr(5);  // ".tmp-step-N-XXXXXX" -> ".old-..."
    if (::rename(final_dir.c_str(), old.c_str()) != 0) {
      throw std::runtime_error("cannot move the previous " + final_dir + " aside: " + sys_error());
    }
  }
  if (::rename(tmp.c_str(), final_dir.c_str()) != 0) {
    const std::string err = sys_error();
    if (!old.empty()) ::rename(old.c_str(), final_dir.c_str());
    throw std::runtime_error("cannot rename " + tmp + " to " + final_dir + ": " + err);
  }
  fsync_dir(root);
  if (!old.empty()) {
    std::error_code ec;
    fs::remove_all(old, ec);  // a leftover is removed by the next save's pruning
  }
}

bool is_leftover_name(const std::string& name) {
  return name.rfind(".tmp-step-", 0) == 0 || name.rfind(".old-step-", 0) == 0;
}

// Removes complete checkpoints beyond the newest keep_last and leftovers of interrupted saves; returns the
// failures, one line each.
std::vector<std::string> prune(const std::string& root, int keep_last) {
  std::vector<std::string> errors;
  std::error_code ec;
  std::vector<std::string> leftovers;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    if (is_leftover_name(it->path().filename().string())) leftovers.push_back(it->path().string());
  }
  if (ec) return {"cannot list " + root + ": " + ec.message()};
  std::vector<std::string> doomed = leftovers;
  if (keep_last > 0) {
    int kept = 0;
    for (const auto& [step, path] : step_dirs(root)) {
      if (!fs::exists(path + "/" + kMarker, ec)) continue;  // never counted, never deleted
      if (++kept > keep_last) doomed.push_back(path);
    }
  }
  for (const std::string& path : doomed) {
    fs::remove_all(path, ec);
    if (ec) errors.push_back("cannot remove " + path + ": " + ec.message());
  }
  return errors;
}

}  // namespace

void save_checkpoint(const std::string& out_dir, const CheckpointState& s, int keep_last) {
  if (s.step < 0) throw std::invalid_argument("checkpoint step must be >= 0, got " + std::to_string(s.step));
  check_tensors(s.lora, "lora");
  check_tensors(s.adam_m, "adam_m");
  check_tensors(s.adam_v, "adam_v");

  const std::string root = checkpoints_root(out_dir);
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec) throw std::runtime_error("cannot create checkpoint directory " + root + ": " + ec.message());

  const std::string final_dir = root + "/step-" + std::to_string(s.step);
  const std::string tmp = make_temp_dir(root, s.step);
  try {
    std::vector<std::pair<std::string, FileEntry>> files;
    files.emplace_back("state.json", write_text(tmp + "/state.json", encode_state(s)));
    files.emplace_back("lora.bin", write_tensors(tmp + "/lora.bin", s.lora));
    files.emplace_back("adam_m.bin", write_tensors(tmp + "/adam_m.bin", s.adam_m));
    files.emplace_back("adam_v.bin", write_tensors(tmp + "/adam_v.bin", s.adam_v));
    write_text(tmp + "/" + kMarker, encode_marker(s.step, files));
    fsync_dir(tmp);
    install(tmp, final_dir, root);
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }

  const std::vector<std::string> errors = prune(root, keep_last);
  if (!errors.empty()) {
    std::string msg = "checkpoint " + final_dir + " was saved, but pruning old checkpoints failed:";
    for (const std::string& e : errors) msg += "\n  " + e;
    throw std::runtime_error(msg);
  }
}

std::optional<std::string> newest_checkpoint(const std::string& out_dir, std::vector<std::string>* warnings) {
  const std::string root = checkpoints_root(out_dir);
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return std::nullopt;
  for (const auto& [step, path] : step_dirs(root)) {
    try {
      int64_t marker_step = 0;
      read_verified(path, &marker_step);
      if (marker_step != step) {
        throw std::runtime_error(path + "/" + kMarker + ": records step " + std::to_string(marker_step));
      }
      return path;
    } catch (const std::runtime_error& e) {
      if (warnings) warnings->push_back("skipping checkpoint " + path + ": " + e.what());
    }
  }
  return std::nullopt;
}

CheckpointState load_checkpoint(const std::string& dir) {
  int64_t marker_step = 0;
  const auto files = read_verified(dir, &marker_step);
  CheckpointState s;
  for (const auto& [name, bytes] : files) {
    const std::string path = dir + "/" + name;
    if (name == "state.json") parse_state(path, bytes, &s);
    if (name == "lora.bin") s.lora = parse_tensors(path, bytes);
    if (name == "adam_m.bin") s.adam_m = parse_tensors(path, bytes);
    if (name == "adam_v.bin") s.adam_v = parse_tensors(path, bytes);
  }
  if (s.step != marker_step) {
    throw std::runtime_error(dir + "/state.json: step " + std::to_string(s.step) + " but the marker says " +
                             std::to_string(marker_step));
  }
  return s;
}

}  // namespace q4t
