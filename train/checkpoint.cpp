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
  if (!marker.is_object() || !marker.contains("format") || marker["format"] != kFormat) {
    throw std::runtime_error(marker_path + ": not a q4tune checkpoint marker (its \"format\" must be \"" + kFormat +
                             "\")");
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

// Hidden directories PREFIX-step-N-XXXXXX beside the step-N ones: ".tmp" a checkpoint being built (after a
// re-save, the copy it replaced), ".old" a copy moved aside by a re-save where the file system cannot exchange
// two names, ".pruned" a checkpoint being deleted.
constexpr const char* kBuilding = ".tmp";
constexpr const char* kMovedAside = ".old";
constexpr const char* kPruned = ".pruned";

std::string make_hidden_dir(const std::string& root, const char* prefix, int64_t step) {
  std::string templ = root + "/" + prefix + "-step-" + std::to_string(step) + "-XXXXXX";
  if (::mkdtemp(templ.data()) == nullptr) {
    throw std::runtime_error("cannot create checkpoint directory " + templ + ": " + sys_error());
  }
  return templ;
}

// The N of a hidden name PREFIX-step-N-XXXXXX, or nullopt.
std::optional<int64_t> hidden_step(const std::string& name, const char* prefix) {
  const std::string head = std::string(prefix) + "-";
  const size_t dash = name.rfind('-');
  if (name.rfind(head, 0) != 0 || dash == std::string::npos || dash <= head.size()) return std::nullopt;
  return parse_step_name(name.substr(head.size(), dash - head.size()));
}

bool is_hidden_name(const std::string& name) {
  for (const char* prefix : {kBuilding, kMovedAside, kPruned}) {
    if (hidden_step(name, prefix)) return true;
  }
  return false;
}

// Why the checkpoint in dir, the directory of step, cannot be resumed from; "" when it is complete and verified.
std::string damage_of(const std::string& dir, int64_t step) {
  try {
    const int64_t recorded = load_checkpoint(dir).step;
    if (recorded != step) return dir + "/" + kMarker + ": records step " + std::to_string(recorded);
    return "";
  } catch (const std::runtime_error& e) {
    return e.what();
  }
}

// Swaps two directories in one rename; false, changing nothing, where the file system cannot.
bool exchange(const std::string& a, const std::string& b) {
  if (::renameat2(AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), RENAME_EXCHANGE) == 0) return true;
  if (errno == EINVAL || errno == ENOSYS || errno == EOPNOTSUPP) return false;
  throw std::runtime_error("cannot swap " + a + " with " + b + ": " + sys_error());
}

// Puts the finished temp directory at final_dir. A step saved again is swapped with its earlier copy in one
// rename, so that a complete final_dir exists at every moment; the earlier copy, now under the temp name, is
// removed after. Where the file system cannot swap, the earlier copy is moved aside first: a kill between the
// two renames leaves both copies hidden, and recover_checkpoints puts one back.
void install(const std::string& tmp, const std::string& final_dir, const std::string& root, int64_t step) {
  struct stat st;
  const bool again = ::lstat(final_dir.c_str(), &st) == 0;
  if (again && !S_ISDIR(st.st_mode)) {
    throw std::runtime_error("cannot save checkpoint: " + final_dir + " exists and is not a directory");
  }
  std::error_code ec;
  if (again && exchange(tmp, final_dir)) {
    fsync_dir(root);
    fs::remove_all(tmp, ec);  // a leftover is removed by the next save's pruning or the next start
    return;
  }
  std::string old;
  if (again) {
    old = make_hidden_dir(root, kMovedAside, step);  // empty: the rename replaces it
    if (::rename(final_dir.c_str(), old.c_str()) != 0) {
      const std::string err = sys_error();
      fs::remove_all(old, ec);
      throw std::runtime_error("cannot move the previous " + final_dir + " aside: " + err);
    }
  }
  if (::rename(tmp.c_str(), final_dir.c_str()) != 0) {
    const std::string err = sys_error();
    if (!old.empty()) ::rename(old.c_str(), final_dir.c_str());
    throw std::runtime_error("cannot rename " + tmp + " to " + final_dir + ": " + err);
  }
  fsync_dir(root);
  if (!old.empty()) fs::remove_all(old, ec);
}

// Deletes a checkpoint by renaming it to a hidden name first: a kill midway then leaves no step-N that is
// partly deleted (which would read as damaged), only a leftover.
void remove_checkpoint(const std::string& root, const std::string& path, int64_t step,
                       std::vector<std::string>* errors) {
  std::error_code ec;
  try {
    const std::string doomed = make_hidden_dir(root, kPruned, step);
    if (::rename(path.c_str(), doomed.c_str()) != 0) {
      errors->push_back("cannot remove " + path + ": " + sys_error());
      fs::remove(doomed, ec);
      return;
    }
    fs::remove_all(doomed, ec);
    if (ec) errors->push_back("cannot remove " + doomed + ": " + ec.message());
  } catch (const std::runtime_error& e) {
    errors->push_back(e.what());
  }
}

// Removes leftovers of interrupted saves and every checkpoint older than the newest keep_last complete ones;
// returns the failures, one line each. Only complete, verified checkpoints count: were damaged ones counted,
// a run whose checkpoints are all damaged would delete each new one right after saving it. A damaged one newer
// than the last kept is left alone. The checkpoint just saved (saved_step) is known to be complete.
std::vector<std::string> prune(const std::string& root, int keep_last, int64_t saved_step) {
  std::vector<std::string> errors;
  std::error_code ec;
  std::vector<std::string> leftovers;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    if (is_hidden_name(it->path().filename().string())) leftovers.push_back(it->path().string());
  }
  if (ec) return {"cannot list " + root + ": " + ec.message()};
  for (const std::string& path : leftovers) {
    fs::remove_all(path, ec);
    if (ec) errors.push_back("cannot remove " + path + ": " + ec.message());
  }
  if (keep_last <= 0) return errors;
  int kept = 0;
  for (const auto& [step, path] : step_dirs(root)) {
    if (kept == keep_last) {
      remove_checkpoint(root, path, step, &errors);
    } else if (step == saved_step || damage_of(path, step).empty()) {
      ++kept;
    }
  }
  return errors;
}

// A step-N directory that a kill while deleting it (by an older q4tune, which deleted in place) left without its
// marker: it holds nothing but files a checkpoint holds.
bool is_partly_deleted(const std::string& dir) {
  std::error_code ec;
  if (fs::exists(dir + "/" + kMarker, ec)) return false;
  const std::vector<std::string>& names = payload_files();
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!it->is_regular_file(ec) || std::find(names.begin(), names.end(), name) == names.end()) return false;
  }
  return !ec;
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
  const std::string tmp = make_hidden_dir(root, kBuilding, s.step);
  try {
    std::vector<std::pair<std::string, FileEntry>> files;
    files.emplace_back("state.json", write_text(tmp + "/state.json", encode_state(s)));
    files.emplace_back("lora.bin", write_tensors(tmp + "/lora.bin", s.lora));
    files.emplace_back("adam_m.bin", write_tensors(tmp + "/adam_m.bin", s.adam_m));
    files.emplace_back("adam_v.bin", write_tensors(tmp + "/adam_v.bin", s.adam_v));
    write_text(tmp + "/" + kMarker, encode_marker(s.step, files));
    fsync_dir(tmp);
    install(tmp, final_dir, root, s.step);
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }

  const std::vector<std::string> errors = prune(root, keep_last, s.step);
  if (!errors.empty()) {
    std::string msg = "checkpoint " + final_dir + " was saved, but pruning old checkpoints failed:";
    for (const std::string& e : errors) msg += "\n  " + e;
    throw std::runtime_error(msg);
  }
}

CheckpointRepair recover_checkpoints(const std::string& out_dir) {
  const std::string root = checkpoints_root(out_dir);
  CheckpointRepair repair;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return repair;
  std::vector<std::pair<int64_t, std::string>> copies;  // hidden copies of a step that may be whole
  std::vector<std::string> leftovers;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string(), path = it->path().string();
    for (const char* prefix : {kBuilding, kMovedAside}) {
      if (const std::optional<int64_t> step = hidden_step(name, prefix)) copies.emplace_back(*step, path);
    }
    std::error_code kind;
    if (is_hidden_name(name) || (parse_step_name(name) && it->is_directory(kind) && is_partly_deleted(path))) {
      leftovers.push_back(path);
    }
  }
  if (ec) throw std::runtime_error("cannot list " + root + ": " + ec.message());
  std::sort(copies.begin(), copies.end());
  for (const auto& [step, path] : copies) {
    const std::string final_dir = root + "/step-" + std::to_string(step);
    if (fs::exists(final_dir, ec) || !damage_of(path, step).empty()) continue;
    if (::rename(path.c_str(), final_dir.c_str()) != 0) {
      throw std::runtime_error("cannot move " + path + " back to " + final_dir + ": " + sys_error());
    }
    fsync_dir(root);
    repair.recovered.push_back(final_dir);
    leftovers.erase(std::find(leftovers.begin(), leftovers.end(), path));
  }
  for (const std::string& path : leftovers) {
    fs::remove_all(path, ec);  // one that cannot be removed is tried again by the next save's pruning
    if (!ec) repair.removed.push_back(path);
  }
  return repair;
}

std::optional<std::string> newest_checkpoint(const std::string& out_dir, std::vector<std::string>* warnings) {
  const std::string root = checkpoints_root(out_dir);
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return std::nullopt;
  for (const auto& [step, path] : step_dirs(root)) {
    const std::string damage = damage_of(path, step);
    if (damage.empty()) return path;
    if (warnings) warnings->push_back("skipping checkpoint " + path + ": " + damage);
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
