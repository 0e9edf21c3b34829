#include "train/run_log.h"

#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <utility>

#include "data/atomic_file.h"

namespace q4t::train {

namespace {

using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;

// printf into a std::string (the numbers of the chart and the progress line).
template <typename... Args>
std::string format(const char* fmt, Args... args) {
  char buf[128];
  const int n = std::snprintf(buf, sizeof(buf), fmt, args...);
  if (n < int(sizeof(buf))) return std::string(buf, size_t(std::max(n, 0)));
  std::string out(size_t(n) + 1, '\0');
  std::snprintf(out.data(), out.size(), fmt, args...);
  out.resize(size_t(n));
  return out;
}

// ---- metrics.jsonl ----

struct MetricsLine {
  std::string_view text;  // without its '\n'
  json value;
  int64_t step;
};

// The lines of a metrics.jsonl that end with '\n' (the last one may have been cut off by a kill) and are JSON
// objects with an integer "step".
std::vector<MetricsLine> complete_metrics_lines(std::string_view contents) {
  std::vector<MetricsLine> lines;
  size_t begin = 0;
  for (size_t end; (end = contents.find('\n', begin)) != std::string_view::npos; begin = end + 1) {
    const std::string_view text = contents.substr(begin, end - begin);
    json value = json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (!value.is_object()) continue;  // also what a parse error gives (discarded)
    const auto step = value.find("step");
    if (step == value.end() || !step->is_number_integer()) continue;
    const int64_t s = step->get<int64_t>();
    lines.push_back({text, std::move(value), s});
  }
  return lines;
}

std::optional<double> finite_number(const json& line, const char* key) {
  const auto it = line.find(key);
  if (it == line.end() || !it->is_number()) return std::nullopt;
  const double v = it->get<double>();
  if (!std::isfinite(v)) return std::nullopt;
  return v;
}

void add_points(LossSeries& series, const MetricsLine& line) {
  if (const auto loss = finite_number(line.value, "loss")) series.train.push_back({line.step, *loss});
  if (const auto lr = finite_number(line.value, "lr")) series.lr.push_back({line.step, *lr});
  if (const auto val = finite_number(line.value, "val_loss")) series.val.push_back({line.step, *val});
}

std::string read_whole_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path + ": " + std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw std::runtime_error("cannot read " + path);
  return ss.str();
}

// The fixed fields first (in this order), then extra's.
ordered_json metrics_line(ordered_json fixed, const json& extra) {
  if (extra.is_null()) return fixed;
  if (!extra.is_object())
    throw std::invalid_argument("metrics line: extra fields must be a JSON object, got " +
                                std::string(extra.type_name()));
  for (const auto& [key, value] : extra.items()) {
    if (fixed.contains(key))
      throw std::invalid_argument("metrics line: extra field '" + key + "' repeats a fixed field");
    fixed[key] = ordered_json(value);
  }
  return fixed;
}

// The JSON text of v with every floating-point number written as %.6g (a valid JSON number when finite: digits,
// a point, an exponent like e-05) and every non-finite one as null.
void append_rounded_json(std::string& out, const ordered_json& v) {
  const auto dump = [](const ordered_json& x) { return x.dump(-1, ' ', false, ordered_json::error_handler_t::replace); };
  if (v.is_number_float()) {
    const double d = v.get<double>();
    out += std::isfinite(d) ? format("%.6g", d) : "null";
  } else if (v.is_object()) {
    out += '{';
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (it != v.begin()) out += ',';
      out += dump(it.key());
      out += ':';
      append_rounded_json(out, it.value());
    }
    out += '}';
  } else if (v.is_array()) {
    out += '[';
    for (size_t i = 0; i < v.size(); ++i) {
      if (i > 0) out += ',';
      append_rounded_json(out, v[i]);
    }
    out += ']';
  } else {
    out += dump(v);
  }
}

// A metrics line's finite numbers but its step, tagged prefix + field name, with strip taken off a name that
// starts with it.
std::vector<TfScalar> event_scalars(const ordered_json& line, const std::string& prefix, std::string_view strip) {
  std::vector<TfScalar> scalars;
  for (auto it = line.begin(); it != line.end(); ++it) {
    std::string_view name = it.key();
    if (name == "step" || !it->is_number()) continue;
    const double v = it->get<double>();
    if (!std::isfinite(v)) continue;
    if (!strip.empty() && name.substr(0, strip.size()) == strip) name.remove_prefix(strip.size());
    scalars.push_back({prefix + std::string(name), float(v)});
  }
  return scalars;
}

}  // namespace

MetricsLog MetricsLog::open(const std::string& path, std::optional<int64_t> resume_step) {
  LossSeries series;
  if (resume_step && std::filesystem::exists(path)) {
    const std::string contents = read_whole_file(path);
    std::string kept;
    for (const MetricsLine& line : complete_metrics_lines(contents)) {
      if (line.step > *resume_step) continue;
      kept.append(line.text).push_back('\n');
      add_points(series, line);
    }
    write_file_atomic(path, kept);
  }
  const int flags = O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | (resume_step ? 0 : O_TRUNC);
  const int fd = ::open(path.c_str(), flags, 0644);
  if (fd < 0) throw std::runtime_error("cannot open " + path + " for writing: " + std::strerror(errno));
  return MetricsLog(path, fd, std::move(series));
}

MetricsLog::MetricsLog(std::string path, int fd, LossSeries series)
    : path_(std::move(path)), fd_(fd), series_(std::move(series)) {}

MetricsLog::MetricsLog(MetricsLog&& other) noexcept
    : path_(std::move(other.path_)),
      fd_(std::exchange(other.fd_, -1)),
      series_(std::move(other.series_)),
      events_(std::move(other.events_)) {}

MetricsLog& MetricsLog::operator=(MetricsLog&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(other.path_);
    fd_ = std::exchange(other.fd_, -1);
    series_ = std::move(other.series_);
    events_ = std::move(other.events_);
  }
  return *this;
}

MetricsLog::~MetricsLog() {
  if (fd_ >= 0) ::close(fd_);
}

void MetricsLog::log_train(int64_t step, double loss, double lr, double tokens_per_s, const json& extra) {
  const ordered_json line = metrics_line(
      {{"type", "train"}, {"step", step}, {"loss", loss}, {"lr", lr}, {"tokens_per_s", tokens_per_s}}, extra);
  append_line(line);
  if (events_) events_->write_scalars(step, event_scalars(line, "train/", ""));
  if (std::isfinite(loss)) series_.train.push_back({step, loss});
  if (std::isfinite(lr)) series_.lr.push_back({step, lr});
}

void MetricsLog::log_eval(int64_t step, double val_loss, const json& extra) {
  const ordered_json line = metrics_line(
      {{"type", "eval"}, {"step", step}, {"val_loss", val_loss}, {"val_ppl", std::exp(val_loss)}}, extra);
  append_line(line);
  if (events_) events_->write_scalars(step, event_scalars(line, "eval/", "val_"));
  if (std::isfinite(val_loss)) series_.val.push_back({step, val_loss});
}

// One write() per line: with O_APPEND the line lands whole at the end unless the process dies inside the call.
void MetricsLog::append_line(const ordered_json& line) {
  if (fd_ < 0) throw std::runtime_error("metrics log " + path_ + " is closed");
  std::string text;
  append_rounded_json(text, line);
  text += '\n';
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd_, text.data() + done, text.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw std::runtime_error("cannot append to " + path_ + ": " + std::strerror(errno));
    }
    done += size_t(n);
  }
}

LossSeries read_loss_series(const std::string& path) {
  const std::string contents = read_whole_file(path);
  LossSeries series;
  for (const MetricsLine& line : complete_metrics_lines(contents)) add_points(series, line);
  return series;
}

// ---- the loss chart ----

namespace {

constexpr double kWidth = 800, kHeight = 450;
// The right margin holds the learning rate's axis.
constexpr double kPlotLeft = 76, kPlotRight = 716, kPlotTop = 44, kPlotBottom = 392;
constexpr const char* kTrainColor = "#1f77b4";
constexpr const char* kValColor = "#d62728";
constexpr const char* kLrColor = "#2ca02c";

struct CurveStyle {
  const char* color;
  double width = 1.5;
  double opacity = 1;
  bool dashed = false;
  bool markers = false;  // a circle per point (draw_curve marks a single point anyway)
};

const CurveStyle kRawTrainStyle{kTrainColor, 1, 0.3};
const CurveStyle kSmoothedStyle{kTrainColor, 2.5};
const CurveStyle kValStyle{kValColor, 1.5, 1, false, true};
const CurveStyle kLrStyle{kLrColor, 1.5, 0.8, true};

// A value range with round tick values; maps values to pixels between pixel_lo and pixel_hi.
struct Axis {
  double lo = 0, hi = 1;
  std::vector<double> ticks;
  int decimals = 0;  // enough to tell the ticks apart
  double pixel_lo = 0, pixel_hi = 1;
  double to_pixel(double v) const { return pixel_lo + (v - lo) / (hi - lo) * (pixel_hi - pixel_lo); }
};

// The 1, 2 or 5 times a power of ten nearest above range / target (rounding error aside: 0.01 / 5 gives 0.002).
double nice_step(double range, int target) {
  const double raw = range / target;
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  const double f = raw / magnitude * (1 - 1e-9);
  return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * magnitude;
}

int decimals_for(double tick_step) {
  return std::clamp(int(-std::floor(std::log10(tick_step) + 1e-9)), 0, 12);
}

// The value axis grows out to the ticks just outside the data, so the curve never touches the frame's top. No
// data gives [0, 1]; a flat curve (equal min and max, up to rounding) is padded by 10% of its value (1 at 0).
Axis value_axis(double lo, double hi) {
  if (lo > hi) {
    lo = 0, hi = 1;
  } else if (hi - lo <= 1e-9 * std::max(std::fabs(lo), std::fabs(hi))) {
    const double pad = lo != 0 ? std::fabs(lo) * 0.1 : 1;
    lo -= pad, hi += pad;
  }
  const double step = nice_step(hi - lo, 5);
  // (the 1e-9 keeps a value that is a tick up to rounding, like 0.01 / 0.002, from adding a tick beyond it)
  const int64_t k_lo = int64_t(std::floor(lo / step + 1e-9)), k_hi = int64_t(std::ceil(hi / step - 1e-9));
  Axis a;
  a.lo = double(k_lo) * step;
  a.hi = double(k_hi) * step;
  for (int64_t k = k_lo; k <= k_hi; ++k) a.ticks.push_back(double(k) * step);
  a.decimals = decimals_for(step);
  return a;
}

// The step axis spans exactly the logged steps ([s-1, s+1] for a single step s, [0, 1] for none); its ticks are
// round integers inside that span.
Axis step_axis(double lo, double hi) {
  if (lo > hi) {
    lo = 0, hi = 1;
  } else if (lo == hi) {
    lo -= 1, hi += 1;
  }
  const double step = std::max(1.0, nice_step(hi - lo, 6));
  Axis a;
  a.lo = lo;
  a.hi = hi;
  for (int64_t k = int64_t(std::ceil(lo / step)); double(k) * step <= hi; ++k) a.ticks.push_back(double(k) * step);
  a.decimals = 0;
  return a;
}

// The finite points, thinned to kMaxChartPoints evenly spaced by index (the first and last kept).
std::vector<LossPoint> plotted_points(const std::vector<LossPoint>& points) {
  std::vector<LossPoint> finite;
  std::copy_if(points.begin(), points.end(), std::back_inserter(finite),
               [](const LossPoint& p) { return std::isfinite(p.value); });
  const size_t n = finite.size();
  if (n <= kMaxChartPoints) return finite;
  std::vector<LossPoint> thinned;
  thinned.reserve(kMaxChartPoints);
  for (size_t k = 0; k < kMaxChartPoints; ++k) thinned.push_back(finite[k * (n - 1) / (kMaxChartPoints - 1)]);
  return thinned;
}

std::string xml_escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default:
        // Control characters other than tab and newline are not allowed in XML 1.0 at all.
        if (static_cast<unsigned char>(c) >= 0x20 || c == '\t' || c == '\n') out += c;
    }
  }
  return out;
}

void draw_grid_and_ticks(std::string& svg, const Axis& x, const Axis& y) {
  svg += "<g stroke=\"#e3e3e3\" stroke-width=\"1\">\n";
  for (double t : y.ticks) {
    svg += format("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n", kPlotLeft, y.to_pixel(t),
                  kPlotRight, y.to_pixel(t));
  }
  for (double t : x.ticks) {
    svg += format("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n", x.to_pixel(t), kPlotTop,
                  x.to_pixel(t), kPlotBottom);
  }
  svg += "</g>\n<g fill=\"#333\">\n";
  for (double t : y.ticks) {
    svg += format("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%.*f</text>\n", kPlotLeft - 6,
                  y.to_pixel(t) + 4, y.decimals, t);
  }
  for (double t : x.ticks) {
    svg += format("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%.0f</text>\n", x.to_pixel(t),
                  kPlotBottom + 18, t);
  }
  svg += "</g>\n";
  svg += format("<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" stroke=\"#555\"/>\n",
                kPlotLeft, kPlotTop, kPlotRight - kPlotLeft, kPlotBottom - kPlotTop);
  svg += format("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">step</text>\n",
                (kPlotLeft + kPlotRight) / 2, kPlotBottom + 40);
  svg += format("<text x=\"16\" y=\"%.1f\" text-anchor=\"middle\" transform=\"rotate(-90 16 %.1f)\">loss</text>\n",
                (kPlotTop + kPlotBottom) / 2, (kPlotTop + kPlotBottom) / 2);
}

// The stroke attributes of a style.
std::string stroke(const CurveStyle& style) {
  return format("stroke=\"%s\" stroke-width=\"%.1f\"", style.color, style.width) +
         (style.opacity < 1 ? format(" stroke-opacity=\"%.2f\"", style.opacity) : "") +
         (style.dashed ? " stroke-dasharray=\"6 3\"" : "");
}

// The learning rate's axis at the right of the frame: ticks, their labels and the axis title, in its color.
void draw_lr_axis(std::string& svg, const Axis& r) {
  svg += format("<g id=\"lr-axis\" fill=\"%s\" stroke=\"none\">\n", kLrColor);
  for (double t : r.ticks) {
    svg += format("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\"/>\n", kPlotRight,
                  r.to_pixel(t), kPlotRight + 4, r.to_pixel(t), kLrColor);
    svg += format("<text x=\"%.1f\" y=\"%.1f\">%g</text>\n", kPlotRight + 6, r.to_pixel(t) + 4, t);
  }
  const double mid = (kPlotTop + kPlotBottom) / 2;
  svg += format("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" transform=\"rotate(90 %.1f %.1f)\">learning "
                "rate</text>\n</g>\n",
                kWidth - 14, mid, kWidth - 14, mid);
}

// A polyline with the given id, plus a marker per point when the style has markers (or when there is a single
// point, which a polyline alone would not show).
void draw_curve(std::string& svg, const std::vector<LossPoint>& points, const Axis& x, const Axis& y,
                const char* id, const CurveStyle& style) {
  if (points.empty()) return;
  svg += format("<polyline id=\"%s\" fill=\"none\" ", id) + stroke(style) + " points=\"";
  for (size_t i = 0; i < points.size(); ++i) {
    svg += format(i == 0 ? "%.1f,%.1f" : " %.1f,%.1f", x.to_pixel(double(points[i].step)),
                  y.to_pixel(points[i].value));
  }
  svg += "\"/>\n";
  if (!style.markers && points.size() > 1) return;
  svg += format("<g id=\"%s-markers\" fill=\"%s\">\n", id, style.color);
  for (const LossPoint& p : points) {
    svg += format("<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\"/>\n", x.to_pixel(double(p.step)), y.to_pixel(p.value));
  }
  svg += "</g>\n";
}

struct LegendEntry {
  const char* label;
  const CurveStyle* style;
};

void draw_legend(std::string& svg, const std::vector<LegendEntry>& entries) {
  const double x = kPlotRight - 136;
  double y = kPlotTop + 18;
  if (entries.empty()) {
    svg += format("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" fill=\"#888\">no data yet</text>\n",
                  (kPlotLeft + kPlotRight) / 2, (kPlotTop + kPlotBottom) / 2);
    return;
  }
  svg += format("<rect x=\"%.1f\" y=\"%.1f\" width=\"128\" height=\"%d\" fill=\"white\" fill-opacity=\"0.85\" "
                "stroke=\"#bbb\"/>\n",
                x - 6, y - 12, int(entries.size()) * 18 + 6);
  for (const LegendEntry& e : entries) {
    svg += format("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" ", x, y - 4, x + 24, y - 4) +
           stroke(*e.style) + "/>\n";
    if (e.style->markers)
      svg += format("<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n", x + 12, y - 4, e.style->color);
    svg += format("<text x=\"%.1f\" y=\"%.1f\">%s</text>\n", x + 30, y, e.label);
    y += 18;
  }
}

}  // namespace

std::vector<LossPoint> ema_smoothed(const std::vector<LossPoint>& points, double weight) {
  if (!(weight >= 0 && weight < 1)) throw std::invalid_argument("ema_smoothed: weight must lie in [0, 1)");
  std::vector<LossPoint> smoothed;
  double average = 0, weight_k = 1;  // weight_k: weight to the power of the points averaged so far
  for (const LossPoint& p : points) {
    if (!std::isfinite(p.value)) continue;
    average = weight * average + (1 - weight) * p.value;
    weight_k *= weight;
    smoothed.push_back({p.step, average / (1 - weight_k)});
  }
  return smoothed;
}

std::string loss_chart_svg(const std::vector<LossPoint>& train, const std::vector<LossPoint>& val,
                           const std::string& title, const std::vector<LossPoint>& lr) {
  const std::vector<LossPoint> t = plotted_points(train), v = plotted_points(val), r = plotted_points(lr);
  // Smoothed over every point, then thinned like the others; a single point has nothing to smooth.
  const std::vector<LossPoint> smooth = t.size() > 1 ? plotted_points(ema_smoothed(train, kSmoothingWeight))
                                                     : std::vector<LossPoint>{};
  double step_lo = std::numeric_limits<double>::infinity(), step_hi = -step_lo;
  double value_lo = step_lo, value_hi = -step_lo;
  for (const auto* points : {&t, &v}) {
    for (const LossPoint& p : *points) {
      step_lo = std::min(step_lo, double(p.step));
      step_hi = std::max(step_hi, double(p.step));
      value_lo = std::min(value_lo, p.value);
      value_hi = std::max(value_hi, p.value);
    }
  }
  double lr_lo = 0, lr_hi = 0;  // the lr axis includes 0, so a warmup or a decay reads as a fraction of the peak
  for (const LossPoint& p : r) {
    step_lo = std::min(step_lo, double(p.step));
    step_hi = std::max(step_hi, double(p.step));
    lr_lo = std::min(lr_lo, p.value);
    lr_hi = std::max(lr_hi, p.value);
  }
  Axis x = step_axis(step_lo, step_hi), y = value_axis(value_lo, value_hi), lr_axis = value_axis(lr_lo, lr_hi);
  x.pixel_lo = kPlotLeft, x.pixel_hi = kPlotRight;
  y.pixel_lo = lr_axis.pixel_lo = kPlotBottom, y.pixel_hi = lr_axis.pixel_hi = kPlotTop;

  std::string svg = format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" "
      "font-family=\"sans-serif\" font-size=\"12\">\n",
      kWidth, kHeight, kWidth, kHeight);
  svg += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  svg += format("<text x=\"%.1f\" y=\"26\" text-anchor=\"middle\" font-size=\"15\">", kWidth / 2) +
         xml_escape(title) + "</text>\n";
  draw_grid_and_ticks(svg, x, y);
  if (!r.empty()) {
    draw_lr_axis(svg, lr_axis);
    draw_curve(svg, r, x, lr_axis, "lr", kLrStyle);
  }
  draw_curve(svg, t, x, y, "train", kRawTrainStyle);
  draw_curve(svg, smooth, x, y, "smoothed", kSmoothedStyle);
  draw_curve(svg, v, x, y, "val", kValStyle);
  std::vector<LegendEntry> legend;
  if (!t.empty()) legend.push_back({"train", &kRawTrainStyle});
  if (!smooth.empty()) legend.push_back({"train (smoothed)", &kSmoothedStyle});
  if (!v.empty()) legend.push_back({"val", &kValStyle});
  if (!r.empty()) legend.push_back({"learning rate", &kLrStyle});
  draw_legend(svg, legend);
  svg += "</svg>\n";
  return svg;
}

void write_loss_svg(const std::string& path, const std::vector<LossPoint>& train, const std::vector<LossPoint>& val,
                    const std::string& title, const std::vector<LossPoint>& lr) {
  write_file_atomic(path, loss_chart_svg(train, val, title, lr));
}

std::string plural(int64_t n, std::string_view noun) {
  return std::to_string(n) + " " + std::string(noun) + (n == 1 ? "" : "s");
}

// ---- progress ----

std::string fmt_bytes(int64_t b) {
  char s[32];
  if (b >= (int64_t(1) << 40))
    std::snprintf(s, sizeof s, "%.2f TiB", double(b) / double(int64_t(1) << 40));
  else if (b >= (int64_t(1) << 30))
    std::snprintf(s, sizeof s, "%.2f GiB", double(b) / double(int64_t(1) << 30));
  else
    std::snprintf(s, sizeof s, "%.1f MiB", double(b) / double(1 << 20));
  return s;
}

int64_t peak_rss_bytes() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return int64_t(ru.ru_maxrss) * 1024;
}

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0 || seconds > 1e12) return "?";
  const int64_t s = int64_t(seconds);
  if (s < 3600) return format("%lld:%02lld", (long long)(s / 60), (long long)(s % 60));
  return format("%lld:%02lld:%02lld", (long long)(s / 3600), (long long)(s / 60 % 60), (long long)(s % 60));
}

namespace {

std::string format_tokens_per_s(double v) { return format(v < 1000 ? "%.1f" : "%.0f", v); }

}  // namespace

Progress::Progress(FILE* out, ProgressOptions opts) : out_(out), opts_(std::move(opts)) {
  if (opts_.total_steps < 0) throw std::invalid_argument("progress: total_steps must be >= 0");
  if (opts_.log_every < 1) throw std::invalid_argument("progress: log_every must be >= 1");
  if (opts_.start_step < 0 || opts_.start_step > opts_.total_steps)
    throw std::invalid_argument("progress: start_step must be in [0, total_steps]");
  if (!(opts_.elapsed_before >= 0 && std::isfinite(opts_.elapsed_before)))
    throw std::invalid_argument("progress: elapsed_before must be a finite number of seconds >= 0");
  const int fd = fileno(out_);
  terminal_ = opts_.mode == ProgressOptions::Mode::Terminal ||
              (opts_.mode == ProgressOptions::Mode::Auto && fd >= 0 && isatty(fd));
  winsize ws{};
  if (terminal_ && fd >= 0 && ioctl(fd, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) columns_ = ws.ws_col;
  start_time_ = now();
  last_draw_time_ = -std::numeric_limits<double>::infinity();
}

Progress::~Progress() { finish(); }

double Progress::now() const {
  if (opts_.clock) return opts_.clock();
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// "loss 2.3456  lr 3.00e-04  1234.5 tok/s  elapsed 0:12  eta 1:48"; elapsed counts the resumed runs' time too,
// the ETA extrapolates this run's rate.
std::string Progress::stats_text(const Snapshot& s) const {
  const int64_t done = s.step - opts_.start_step, remaining = std::max<int64_t>(0, opts_.total_steps - s.step);
  const double eta = remaining == 0 ? 0.0 : done > 0 ? s.elapsed_s / double(done) * double(remaining) : -1.0;
  return format("loss %.4f  lr %.2e  ", s.loss, s.lr) + format_tokens_per_s(s.tokens_per_s) + " tok/s  elapsed " +
         format_duration(opts_.elapsed_before + s.elapsed_s) + "  eta " + format_duration(eta);
}

// "[=========>          ] 45/100  loss ...", the bar narrowed (or dropped) to keep the line within the terminal.
std::string Progress::bar_line(const Snapshot& s) const {
  std::string text = format("%lld/%lld  ", (long long)s.step, (long long)opts_.total_steps) + stats_text(s);
  const int room = columns_ - 1 - int(text.size()) - 3;
  const int width = std::min(30, room);
  if (width < 5) {
    if (int(text.size()) > columns_ - 1) text.resize(size_t(std::max(columns_ - 1, 0)));
    return text;
  }
  const double fraction =
      opts_.total_steps > 0 ? std::clamp(double(s.step) / double(opts_.total_steps), 0.0, 1.0) : 1.0;
  const int filled = int(fraction * width);
  std::string line = "[";
  line.append(size_t(filled), '=');
  if (filled < width) line.append(1, '>').append(size_t(width - filled - 1), ' ');
  return line.append("] ").append(text);
}

void Progress::write(std::string_view text) {
  std::fwrite(text.data(), 1, text.size(), out_);
  std::fflush(out_);
}

// '\r' back to the line's start, the bar, then ESC[K to erase what a longer earlier line left behind.
void Progress::draw_bar(const Snapshot& s) {
  write(std::string("\r").append(bar_line(s)).append("\x1b[K"));
  bar_visible_ = true;
  latest_shown_ = true;
  last_draw_time_ = now();
}

void Progress::print_plain(const Snapshot& s) {
  write(format("step %lld/%lld  ", (long long)s.step, (long long)opts_.total_steps) + stats_text(s) + "\n");
  latest_shown_ = true;
}

void Progress::update(int64_t step, double loss, double lr, double tokens_per_s) {
  const bool first = !latest_, last = step >= opts_.total_steps;
  const double t = now();
  finished_ = false;
  latest_ = Snapshot{step, loss, lr, tokens_per_s, t - start_time_};
  latest_shown_ = false;
  if (terminal_) {
    if (first || last || t - last_draw_time_ >= opts_.min_redraw_s) draw_bar(*latest_);
  } else if (first || last || step % opts_.log_every == 0) {
    print_plain(*latest_);
  }
}

void Progress::message(std::string_view line) {
  if (!terminal_) {
    write(std::string(line) + "\n");
    return;
  }
  const bool redraw = bar_visible_;
  write(std::string(bar_visible_ ? "\r\x1b[K" : "") + std::string(line) + "\n");
  bar_visible_ = false;
  if (redraw && latest_) draw_bar(*latest_);
}

void Progress::finish() {
  if (finished_) return;
  finished_ = true;
  if (latest_ && !latest_shown_) {
    if (terminal_) {
      draw_bar(*latest_);
    } else {
      print_plain(*latest_);
    }
  }
  if (bar_visible_) write("\n");
  bar_visible_ = false;
}

}  // namespace q4t::train
