// The run log of `q4tune train`: OUT/metrics.jsonl (one JSON object per line), optionally the same scalars as
// TensorBoard events (train/tfevents.h), the loss chart drawn from it (OUT/loss.svg), and the progress display
// of the training loop. Throughout, step is the number of optimizer
// steps completed (1 after the first step).
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "train/tfevents.h"

namespace q4t::train {

struct LossPoint {
  int64_t step = 0;
  double value = 0;
};

// The curves of the chart: the training loss and the learning rate of every logged step, the validation loss of
// every evaluation.
struct LossSeries {
  std::vector<LossPoint> train, val, lr;
};

// OUT/metrics.jsonl. Each line is written with a single unbuffered write(), so `tail -f` sees it at once and a
// SIGKILL loses at most the line being written:
//   {"type":"train","step":10,"loss":2.3456,"lr":0.0003,"tokens_per_s":1234.5, ...extra}
//   {"type":"eval","step":100,"val_loss":2.1,"val_ppl":8.17, ...extra}
// Floating-point numbers are written with at most 6 significant digits (0.0006, not 0.0006000000000000001).
// JSON has no NaN: a non-finite number is written as null, and such a point is left out of series().
class MetricsLog {
 public:
  // Starts the log at path. Without resume_step an existing file is replaced by an empty one. With resume_step N
  // (resuming from the checkpoint of step N) an existing file is rewritten atomically keeping only its lines with
  // step <= N, so the steps the resumed run redoes are not logged twice; a last line without its newline (cut off
  // by a kill) and any line that is not a JSON object with an integer "step" are dropped. A missing file starts
  // empty either way. Throws std::runtime_error naming the path on an I/O failure.
  static MetricsLog open(const std::string& path, std::optional<int64_t> resume_step = std::nullopt);

  MetricsLog(MetricsLog&& other) noexcept;
  MetricsLog& operator=(MetricsLog&& other) noexcept;
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;
  ~MetricsLog();

  // extra (a JSON object, or null for none) adds fields such as grad_norm, tokens, elapsed_s after the fixed ones.
  // Throws std::invalid_argument when extra is not an object or repeats a fixed field, std::runtime_error naming
  // the path when the write fails.
  void log_train(int64_t step, double loss, double lr, double tokens_per_s,
                 const nlohmann::json& extra = nullptr);
  // Writes val_ppl = exp(val_loss) too.
  void log_eval(int64_t step, double val_loss, const nlohmann::json& extra = nullptr);

  // From now on every line's finite numbers (all fields but type and step) are also written to events as one
  // Event at the line's step: a train line's field f as the tag "train/f", an eval line's "val_f" (or f) as
  // "eval/f".
  void tee_tensorboard(TfEventsWriter events) { events_.emplace(std::move(events)); }

  // The kept lines' points plus every point logged since open(), in file order.
  const LossSeries& series() const { return series_; }
  const std::string& path() const { return path_; }

 private:
  MetricsLog(std::string path, int fd, LossSeries series);
  void append_line(const nlohmann::ordered_json& line);

  std::string path_;
  int fd_ = -1;
  LossSeries series_;
  std::optional<TfEventsWriter> events_;
};

// The curves of a metrics.jsonl: "loss" and "lr" of its train lines, "val_loss" of its eval lines. As in open(), a last
// line without its newline (being written, or cut off) and lines that are not JSON objects with an integer "step"
// are skipped, and so are null values. Throws std::runtime_error naming the path when the file cannot be read.
LossSeries read_loss_series(const std::string& path);

// A curve with more points than this is thinned to this many, evenly spaced by index, keeping the first and last.
constexpr size_t kMaxChartPoints = 2000;

// The weight of the train loss's smoothed curve in the chart (TensorBoard's smoothing slider).
constexpr double kSmoothingWeight = 0.9;

// The exponential moving average of the finite points, as TensorBoard smooths: m = weight * m + (1 - weight) * v
// from m = 0, each divided by 1 - weight^k after k points so that the start is not pulled towards 0.
std::vector<LossPoint> ema_smoothed(const std::vector<LossPoint>& points, double weight);

// A self-contained SVG line chart: nice round ticks with labels on the axes, the train curve as a faint line
// (id "train") under its smoothed curve in bold (id "smoothed", ema_smoothed with kSmoothingWeight), the val
// curve as a line with a marker per point, a legend and the title. Given lr points, the learning rate is a
// dashed line (id "lr") on an axis of its own at the right (from 0, labelled "learning rate"). Any number of
// points (0 included) gives a valid chart; non-finite values are skipped; a flat curve or a single step gets a
// padded axis range.
std::string loss_chart_svg(const std::vector<LossPoint>& train, const std::vector<LossPoint>& val,
                           const std::string& title, const std::vector<LossPoint>& lr = {});
// loss_chart_svg written atomically (temp file + rename). Throws std::runtime_error naming the path.
void write_loss_svg(const std::string& path, const std::vector<LossPoint>& train,
                    const std::vector<LossPoint>& val, const std::string& title,
                    const std::vector<LossPoint>& lr = {});

// "1 step", "2 steps": n and the noun, plural (noun + "s") unless n is 1.
std::string plural(int64_t n, std::string_view noun);

// "m:ss" under an hour, "h:mm:ss" from one hour on (seconds rounded down); "?" for a negative, non-finite or
// absurd (over 1e12 s) time.
std::string format_duration(double seconds);
// "1.23 TiB" from one TiB on, "1.23 GiB" from one GiB on, else "12.3 MiB".
std::string fmt_bytes(int64_t bytes);
// The process's peak resident set size so far.
int64_t peak_rss_bytes();

struct ProgressOptions {
  int64_t total_steps = 0;
  int64_t start_step = 0;  // steps already done when this run began (a resume); the ETA uses this run's rate
  double elapsed_before = 0;  // training seconds of the runs this one resumes; the elapsed time continues from it
  int64_t log_every = 1;   // plain mode: a line every log_every steps, plus the first update and the last step
  // Terminal: one line redrawn in place with '\r' and a bar. Plain: whole lines, no '\r', no escape codes.
  // Auto: Terminal when the stream's file descriptor is a terminal.
  enum class Mode { Auto, Terminal, Plain } mode = Mode::Auto;
  double min_redraw_s = 0.1;      // terminal mode: at most one redraw per interval, but always the last step
  std::function<double()> clock;  // monotonic seconds; steady_clock when empty (tests pass a fake)
};

// The progress display of the training loop, written to a stdio stream (usually stderr) and flushed after every
// write. Not thread-safe: call it from the loop's thread.
class Progress {
 public:
  // Throws std::invalid_argument for total_steps < 0, log_every < 1 or start_step outside [0, total_steps].
  Progress(FILE* out, ProgressOptions opts);
  ~Progress();  // finish()
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // After optimizer step `step` (1-based): step/total, loss (4 decimals), lr (%.2e), tokens per second, elapsed
  // training time (elapsed_s()) and the ETA.
  void update(int64_t step, double loss, double lr, double tokens_per_s);
  // A line of its own (an eval result, "checkpoint saved"). In terminal mode the bar is cleared first and
  // redrawn under the message.
  void message(std::string_view line);
  // Shows the latest update if throttling or log_every skipped it, and ends the bar's line. Later calls do nothing.
  void finish();

  bool terminal() const { return terminal_; }
  // The training time so far: elapsed_before plus the time since this Progress was made.
  double elapsed_s() const { return opts_.elapsed_before + (now() - start_time_); }

 private:
  struct Snapshot {
    int64_t step = 0;
    double loss = 0, lr = 0, tokens_per_s = 0, elapsed_s = 0;  // elapsed_s: this run's
  };
  double now() const;
  std::string stats_text(const Snapshot& s) const;
  std::string bar_line(const Snapshot& s) const;
  void draw_bar(const Snapshot& s);
  void print_plain(const Snapshot& s);
  void write(std::string_view text);

  FILE* out_;
  ProgressOptions opts_;
  bool terminal_ = false;
  int columns_ = 100;  // the terminal's width, for keeping the bar on one line
  double start_time_ = 0, last_draw_time_ = 0;
  std::optional<Snapshot> latest_;  // the most recent update
  bool latest_shown_ = false;       // whether latest_ was drawn (terminal) or printed (plain)
  bool bar_visible_ = false;        // terminal: a bar is on the current line
  bool finished_ = false;
};

}  // namespace q4t::train
