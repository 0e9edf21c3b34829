// TensorBoard event files: `q4tune train --tensorboard DIR` writes the run's scalars to
// DIR/events.out.tfevents.<unix seconds>.<hostname>, which TensorBoard (and anything reading TFRecord files of
// tensorflow.Event protos) shows next to other runs.
//
// The file is a sequence of TFRecords, each
//   u64 length, u32 masked_crc32c(the 8 length bytes), length bytes of data, u32 masked_crc32c(data)
// (little-endian), whose data is one serialised Event:
//   Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5;
//             SessionLog session_log = 7; }
//   Summary { repeated Value value = 1; }   Value { string tag = 1; float simple_value = 2; }
//   SessionLog { enum status = 1 (START = 1); }
// Debian 12 packages no CRC32C library and these few protobuf fields need no protobuf runtime, so the varints,
// the fields and the CRC are encoded here by hand.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace q4t::train {

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78) of data, continuing from crc (0 to start).
uint32_t crc32c(std::string_view data, uint32_t crc = 0);
// The CRC as TFRecord stores it, rotated and offset so that a CRC over data holding CRCs stays well mixed.
uint32_t masked_crc32c(std::string_view data);

// data framed as one TFRecord.
std::string tfrecord(std::string_view data);

struct TfScalar {
  std::string tag;  // "train/loss", "eval/loss", ...
  float value = 0;
};

// The serialised Event {wall_time, step, summary {one simple_value per scalar}}.
std::string scalar_event(double wall_time, int64_t step, const std::vector<TfScalar>& scalars);

// One events file, written through (each record with a single write(), so TensorBoard sees it at once).
class TfEventsWriter {
 public:
  // Creates dir (and its parents) and a new events file in it, named after the current time and the host; if a
  // file of that name exists (a resume within the same second), ".1", ".2", ... is appended. Writes the
  // file_version record; with resume_step N also a SessionLog START at step N, from which TensorBoard drops the
  // steps after N that earlier files of the directory hold (the resumed run writes them again). Throws
  // std::runtime_error naming the path on an I/O failure.
  static TfEventsWriter create(const std::string& dir, std::optional<int64_t> resume_step = std::nullopt);

  TfEventsWriter(TfEventsWriter&& other) noexcept;
  TfEventsWriter& operator=(TfEventsWriter&& other) noexcept;
  TfEventsWriter(const TfEventsWriter&) = delete;
  TfEventsWriter& operator=(const TfEventsWriter&) = delete;
  ~TfEventsWriter();

  // One Event at step with the scalars, stamped with the current wall time. Throws std::runtime_error naming
  // the path when the write fails.
  void write_scalars(int64_t step, const std::vector<TfScalar>& scalars);
  const std::string& path() const { return path_; }

 private:
  TfEventsWriter(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  void write_record(std::string_view event);

  std::string path_;
  int fd_ = -1;
};

}  // namespace q4t::train
