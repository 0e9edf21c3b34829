#include "train/tfevents.h"

#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <utility>

namespace q4t::train {

namespace {

// table[b]: the CRC register after shifting byte b through it, one bit at a time (LSB first).
std::array<uint32_t, 256> make_crc32c_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t b = 0; b < 256; ++b) {
    uint32_t r = b;
    for (int k = 0; k < 8; ++k) r = (r >> 1) ^ ((r & 1) ? 0x82F63B78u : 0u);
    table[b] = r;
  }
  return table;
}

// ---- protobuf wire format: tag = field << 3 | wire type ----

enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

void put_varint(std::string& out, uint64_t v) {
  for (; v >= 0x80; v >>= 7) out.push_back(char(uint8_t(v) | 0x80));
  out.push_back(char(uint8_t(v)));
}

void put_tag(std::string& out, uint32_t field, WireType type) { put_varint(out, uint64_t(field) << 3 | type); }

template <typename T>
void put_little_endian(std::string& out, T bits) {
  for (size_t i = 0; i < sizeof(T); ++i) out.push_back(char(uint8_t(bits >> (8 * i))));
}

void put_double(std::string& out, uint32_t field, double v) {
  put_tag(out, field, kFixed64);
  uint64_t bits;
  std::memcpy(&bits, &v, 8);
  put_little_endian(out, bits);
}

void put_float(std::string& out, uint32_t field, float v) {
  put_tag(out, field, kFixed32);
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  put_little_endian(out, bits);
}

// int64 as protobuf encodes it: the two's complement bits as a varint.
void put_int64(std::string& out, uint32_t field, int64_t v) {
  put_tag(out, field, kVarint);
  put_varint(out, uint64_t(v));
}

void put_bytes(std::string& out, uint32_t field, std::string_view bytes) {
  put_tag(out, field, kLengthDelimited);
  put_varint(out, bytes.size());
  out.append(bytes);
}

double unix_seconds_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// The Event fields (tensorflow/core/util/event.proto).
enum EventField : uint32_t { kWallTime = 1, kStep = 2, kFileVersion = 3, kSummary = 5, kSessionLog = 7 };

std::string event_header(double wall_time, int64_t step) {
  std::string e;
  put_double(e, kWallTime, wall_time);
  put_int64(e, kStep, step);
  return e;
}

std::string hostname() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

}  // namespace

uint32_t crc32c(std::string_view data, uint32_t crc) {
  static const std::array<uint32_t, 256> table = make_crc32c_table();
  crc = ~crc;
  for (char c : data) crc = table[(crc ^ uint8_t(c)) & 0xff] ^ (crc >> 8);
  return ~crc;
}

uint32_t masked_crc32c(std::string_view data) {
  const uint32_t crc = crc32c(data);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::string tfrecord(std::string_view data) {
  std::string length;
  put_little_endian(length, uint64_t(data.size()));
  std::string record = length;
  put_little_endian(record, masked_crc32c(length));
  record.append(data);
  put_little_endian(record, masked_crc32c(data));
  return record;
}

std::string scalar_event(double wall_time, int64_t step, const std::vector<TfScalar>& scalars) {
  std::string summary;
  for (const TfScalar& s : scalars) {
    std::string value;
    put_bytes(value, 1, s.tag);      // Value.tag
    put_float(value, 2, s.value);    // Value.simple_value
    put_bytes(summary, 1, value);    // Summary.value
  }
  std::string e = event_header(wall_time, step);
  put_bytes(e, kSummary, summary);
  return e;
}

TfEventsWriter TfEventsWriter::create(const std::string& dir, std::optional<int64_t> resume_step) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec || !std::filesystem::is_directory(dir))
    throw std::runtime_error("cannot create the TensorBoard directory " + dir + (ec ? ": " + ec.message() : ""));
  const double now = unix_seconds_now();
  const std::string base = dir + "/events.out.tfevents." + std::to_string(int64_t(now)) + "." + hostname();
  std::string path = base;
  int fd = -1;
  for (int n = 1; fd < 0; ++n) {
    fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0 && (errno != EEXIST || n > 1000))
      throw std::runtime_error("cannot create " + path + ": " + std::strerror(errno));
    if (fd < 0) path = base + "." + std::to_string(n);
  }
  TfEventsWriter w(path, fd);
  std::string version = event_header(now, 0);
  put_bytes(version, kFileVersion, "brain.Event:2");
  w.write_record(version);
  if (resume_step) {
    std::string session_log;
    put_tag(session_log, 1, kVarint);  // SessionLog.status
    put_varint(session_log, 1);        // START
    std::string restart = event_header(now, *resume_step);
    put_bytes(restart, kSessionLog, session_log);
    w.write_record(restart);
  }
  return w;
}

TfEventsWriter::TfEventsWriter(TfEventsWriter&& other) noexcept
    : path_(std::move(other.path_)), fd_(std::exchange(other.fd_, -1)) {}

TfEventsWriter& TfEventsWriter::operator=(TfEventsWriter&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(other.path_);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

TfEventsWriter::~TfEventsWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void TfEventsWriter::write_scalars(int64_t step, const std::vector<TfScalar>& scalars) {
  write_record(scalar_event(unix_seconds_now(), step, scalars));
}

void TfEventsWriter::write_record(std::string_view event) {
  if (fd_ < 0) throw std::runtime_error("events file " + path_ + " is closed");
  const std::string record = tfrecord(event);
  size_t done = 0;
  while (done < record.size()) {
    const ssize_t n = ::write(fd_, record.data() + done, record.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw std::runtime_error("cannot append to " + path_ + ": " + std::strerror(errno));
    }
    done += size_t(n);
  }
}

}  // namespace q4t::train
