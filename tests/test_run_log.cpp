// The run log: metrics.jsonl lines and their truncation on resume, the TensorBoard events files (read back by a
// reader of the test's own), the loss chart's SVG for 0, 1, flat and very many points with its smoothed curve and
// learning-rate axis, and the progress display on a terminal and on a plain stream.
#include "train/run_log.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>

#include "scratch_dir.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace q4t::train {
namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_file(const std::string& path, const std::string& contents) {
  std::ofstream(path, std::ios::binary) << contents;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

class RunLogTest : public ::testing::Test {
 protected:
  // Steps 1..n of train lines, with an eval line after every 5th step.
  void log_steps(MetricsLog& log, int64_t first, int64_t last) {
    for (int64_t s = first; s <= last; ++s) {
      log.log_train(s, 3.0 - 0.01 * double(s), 1e-4, 1500.0, {{"grad_norm", 0.5}, {"tokens", 512 * s}});
      if (s % 5 == 0) log.log_eval(s, 2.9 - 0.01 * double(s));
    }
  }

  const q4t::test::TempDir tmp_{"q4t_runlog_"};
  const std::string dir_ = tmp_.path(), metrics_ = dir_ + "/metrics.jsonl";
};

// ---- metrics.jsonl ----

TEST_F(RunLogTest, EveryMetricsLineIsAJsonObjectWithItsFields) {
  {
    MetricsLog log = MetricsLog::open(metrics_);
    log.log_train(1, 2.5, 3e-4, 1234.5, {{"grad_norm", 1.25}, {"elapsed_s", 0.8}});
    log.log_eval(1, 2.0);
    // Visible before the log is closed: each line is written through, not buffered.
    EXPECT_EQ(lines_of(read_file(metrics_)).size(), 2u);
  }
  const std::vector<std::string> lines = lines_of(read_file(metrics_));
  ASSERT_EQ(lines.size(), 2u);
  const json train = json::parse(lines[0]), eval = json::parse(lines[1]);
  EXPECT_EQ(train["type"], "train");
  EXPECT_EQ(train["step"], 1);
  EXPECT_DOUBLE_EQ(train["loss"].get<double>(), 2.5);
  EXPECT_DOUBLE_EQ(train["lr"].get<double>(), 3e-4);
  EXPECT_DOUBLE_EQ(train["tokens_per_s"].get<double>(), 1234.5);
  EXPECT_DOUBLE_EQ(train["grad_norm"].get<double>(), 1.25);
  EXPECT_DOUBLE_EQ(train["elapsed_s"].get<double>(), 0.8);
  EXPECT_EQ(lines[0].rfind(R"({"type":"train","step":1,"loss")", 0), 0u) << "fixed fields first, in order";
  EXPECT_EQ(eval["type"], "eval");
  EXPECT_EQ(eval["step"], 1);
  EXPECT_DOUBLE_EQ(eval["val_loss"].get<double>(), 2.0);
  EXPECT_NEAR(eval["val_ppl"].get<double>(), std::exp(2.0), 1e-5);  // 6 significant digits
}

TEST_F(RunLogTest, MetricsFloatsAreWrittenWithAtMostSixSignificantDigits) {
  MetricsLog log = MetricsLog::open(metrics_);
  const double lr = 0.0002 * 3;  // 0.0006000000000000001 in full
  log.log_train(1, 2.123456789, lr, 1234.5678, {{"grad_norm", 1.0 / 3}, {"tokens", 512}, {"tiny", 1.5e-5}});
  log.log_eval(1, 2.0, {{"val_tokens", 77}});
  const std::vector<std::string> lines = lines_of(read_file(metrics_));
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0], R"({"type":"train","step":1,"loss":2.12346,"lr":0.0006,"tokens_per_s":1234.57,)"
                      R"("grad_norm":0.333333,"tiny":1.5e-05,"tokens":512})");
  EXPECT_EQ(lines[1], R"({"type":"eval","step":1,"val_loss":2,"val_ppl":7.38906,"val_tokens":77})");
  // Still numbers to a JSON reader; the series in memory keeps the full values.
  EXPECT_DOUBLE_EQ(json::parse(lines[0])["lr"].get<double>(), 0.0006);
  EXPECT_DOUBLE_EQ(log.series().lr.at(0).value, lr);
  EXPECT_DOUBLE_EQ(read_loss_series(metrics_).lr.at(0).value, 0.0006);
}

TEST_F(RunLogTest, ANonFiniteLossIsWrittenAsNullAndLeftOutOfTheSeries) {
  MetricsLog log = MetricsLog::open(metrics_);
  log.log_train(1, std::nan(""), 1e-4, 10.0);
  log.log_train(2, 1.5, 1e-4, 10.0);
  const std::vector<std::string> lines = lines_of(read_file(metrics_));
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_TRUE(json::parse(lines[0])["loss"].is_null());
  ASSERT_EQ(log.series().train.size(), 1u);
  EXPECT_EQ(log.series().train[0].step, 2);
  EXPECT_EQ(read_loss_series(metrics_).train.size(), 1u);
}

TEST_F(RunLogTest, ExtraFieldsMustBeAnObjectAndNotRepeatAFixedField) {
  MetricsLog log = MetricsLog::open(metrics_);
  EXPECT_THROW(log.log_train(1, 1.0, 1e-4, 1.0, json::array({1, 2})), std::invalid_argument);
  EXPECT_THROW(log.log_train(1, 1.0, 1e-4, 1.0, {{"loss", 2.0}}), std::invalid_argument);
  EXPECT_THROW(log.log_eval(1, 1.0, {{"val_ppl", 2.0}}), std::invalid_argument);
  EXPECT_EQ(read_file(metrics_), "");
}

TEST_F(RunLogTest, OpeningWithoutResumeReplacesAnExistingLog) {
  write_file(metrics_, R"({"type":"train","step":1,"loss":9})" "\n");
  MetricsLog log = MetricsLog::open(metrics_);
  EXPECT_TRUE(log.series().train.empty());
  log.log_train(1, 1.0, 1e-4, 1.0);
  const std::vector<std::string> lines = lines_of(read_file(metrics_));
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_DOUBLE_EQ(json::parse(lines[0])["loss"].get<double>(), 1.0);
}

TEST_F(RunLogTest, ResumingKeepsOnlyTheStepsUpToTheCheckpointAndDropsACutOffLastLine) {
  {
    MetricsLog log = MetricsLog::open(metrics_);
    log_steps(log, 1, 12);
  }
  // A kill in the middle of writing step 13's line.
  std::ofstream(metrics_, std::ios::binary | std::ios::app) << R"({"type":"train","step":13,"loss":2.8)";

  MetricsLog log = MetricsLog::open(metrics_, 10);
  std::vector<std::string> lines = lines_of(read_file(metrics_));
  ASSERT_EQ(lines.size(), 12u);  // 10 train lines, evals at 5 and 10
  for (const std::string& line : lines) EXPECT_LE(json::parse(line)["step"].get<int64_t>(), 10) << line;
  EXPECT_EQ(log.series().train.size(), 10u);
  EXPECT_EQ(log.series().val.size(), 2u);
  EXPECT_EQ(log.series().train.back().step, 10);

  log_steps(log, 11, 12);  // the resumed run redoes 11 and 12
  lines = lines_of(read_file(metrics_));
  ASSERT_EQ(lines.size(), 14u);
  std::vector<int64_t> train_steps;
  for (const std::string& line : lines) {
    const json j = json::parse(line);
    if (j["type"] == "train") train_steps.push_back(j["step"].get<int64_t>());
  }
  EXPECT_EQ(train_steps, (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}));
  EXPECT_EQ(log.series().train.size(), 12u);
  EXPECT_EQ(read_loss_series(metrics_).train.size(), 12u);
  EXPECT_EQ(read_loss_series(metrics_).val.size(), 2u);
}

TEST_F(RunLogTest, ResumingDropsALastLineWithoutItsNewlineEvenIfItParses) {
  write_file(metrics_, R"({"type":"train","step":1,"loss":2})" "\n"
                       R"(not json)" "\n"
                       R"({"type":"train","step":2,"loss":1.5})");
  MetricsLog log = MetricsLog::open(metrics_, 100);
  EXPECT_EQ(read_file(metrics_), R"({"type":"train","step":1,"loss":2})" "\n");
  ASSERT_EQ(log.series().train.size(), 1u);
  EXPECT_DOUBLE_EQ(log.series().train[0].value, 2.0);
}

TEST_F(RunLogTest, ResumingWithoutAnExistingLogStartsAnEmptyOne) {
  MetricsLog log = MetricsLog::open(metrics_, 50);
  EXPECT_TRUE(fs::exists(metrics_));
  EXPECT_TRUE(log.series().train.empty());
  EXPECT_TRUE(log.series().val.empty());
}

TEST_F(RunLogTest, ReadingAMissingMetricsFileNamesIt) {
  try {
    read_loss_series(dir_ + "/nope.jsonl");
    FAIL() << "expected an exception";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("nope.jsonl"), std::string::npos) << e.what();
  }
}

// ---- the loss chart ----

struct SvgSummary {
  std::map<std::string, size_t> polyline_points;  // by id
  size_t circles = 0;
  size_t texts = 0;
};

// Checks that the chart is well-formed enough to trust a browser with it (opens with <svg, closes with </svg>,
// every element closed, no nan or inf anywhere, every coordinate inside the canvas) and counts what it draws.
SvgSummary check_svg(const std::string& svg) {
  SvgSummary sum;
  EXPECT_EQ(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  std::string lower = svg;
  for (char& c : lower) c = char(std::tolower(static_cast<unsigned char>(c)));
  EXPECT_EQ(lower.find("nan"), std::string::npos);
  EXPECT_EQ(lower.find("inf"), std::string::npos);

  // Tags balance: each opening tag is self-closed or closed later.
  std::vector<std::string> open;
  const std::regex tag(R"(<(/?)([a-z]+)([^<>]*?)(/?)>)");
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), tag); it != std::sregex_iterator(); ++it) {
    const std::smatch& m = *it;
    if (m[1] == "/") {
      EXPECT_FALSE(open.empty());
      if (open.empty()) break;
      EXPECT_EQ(open.back(), m[2]);
      open.pop_back();
    } else if (m[4] != "/") {
      open.push_back(m[2]);
    }
    if (m[2] == "circle") ++sum.circles;
    if (m[2] == "text" && m[1] != "/") ++sum.texts;
    if (m[2] == "polyline") {
      const std::string attrs = m[3];
      std::smatch id, points;
      EXPECT_TRUE(std::regex_search(attrs, id, std::regex(R"re(id="([a-z]+)")re")));
      EXPECT_TRUE(std::regex_search(attrs, points, std::regex(R"re(points="([^"]*)")re")));
      std::istringstream in(points[1].str());
      size_t n = 0;
      for (std::string pair; in >> pair; ++n) {
        double x, y;
        char comma;
        std::istringstream p(pair);
        EXPECT_TRUE(p >> x >> comma >> y && comma == ',') << pair;
        EXPECT_TRUE(x >= 0 && x <= 800 && y >= 0 && y <= 450) << pair;
      }
      sum.polyline_points[id[1]] = n;
    }
  }
  EXPECT_TRUE(open.empty());
  // Nothing but tags and text between them: no stray '<' or '>' (a title is escaped).
  EXPECT_EQ(std::regex_replace(svg, tag, "").find_first_of("<>"), std::string::npos);
  return sum;
}

std::vector<LossPoint> curve(int64_t n, int64_t step_every, double start) {
  std::vector<LossPoint> points;
  for (int64_t i = 1; i <= n; ++i) points.push_back({i * step_every, start / std::sqrt(double(i))});
  return points;
}

TEST_F(RunLogTest, ChartDrawsBothCurvesWithTheirPointsAndALegend) {
  const std::string path = dir_ + "/loss.svg";
  write_loss_svg(path, curve(100, 1, 3.0), curve(10, 10, 3.2), "run <a> & \"b\"");
  const std::string svg = read_file(path);
  const SvgSummary sum = check_svg(svg);
  EXPECT_EQ(sum.polyline_points.at("train"), 100u);
  EXPECT_EQ(sum.polyline_points.at("smoothed"), 100u);
  EXPECT_EQ(sum.polyline_points.at("val"), 10u);
  EXPECT_EQ(sum.polyline_points.count("lr"), 0u);
  EXPECT_EQ(svg.find("lr-axis"), std::string::npos) << "no lr points, no lr axis";
  EXPECT_EQ(sum.circles, 10u + 1u);  // a marker per val point, one in the legend
  EXPECT_NE(svg.find("run &lt;a&gt; &amp; &quot;b&quot;"), std::string::npos);
  EXPECT_NE(svg.find(">train</text>"), std::string::npos);
  EXPECT_NE(svg.find(">val</text>"), std::string::npos);
  for (const fs::directory_entry& e : fs::directory_iterator(dir_))
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << "temp file left behind";
}

TEST_F(RunLogTest, ChartTicksAreRoundNumbers) {
  const std::string svg = loss_chart_svg({{1, 2.13}, {37, 1.07}, {250, 0.42}}, {}, "t");
  check_svg(svg);
  std::vector<std::string> labels;
  const std::regex label(R"(>([-0-9.]+)</text>)");
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), label); it != std::sregex_iterator(); ++it)
    labels.push_back((*it)[1]);
  // Loss 0.42 .. 2.13 in steps of 0.5 grows out to 0.0 .. 2.5; steps 1 .. 250 get ticks every 50 inside.
  const std::vector<std::string> expected{"0.0", "0.5", "1.0", "1.5", "2.0", "2.5", "50", "100", "150", "200", "250"};
  EXPECT_EQ(labels, expected);
}

TEST_F(RunLogTest, ChartWithNoPointsIsAValidEmptyChart) {
  const SvgSummary sum = check_svg(loss_chart_svg({}, {}, "empty"));
  EXPECT_TRUE(sum.polyline_points.empty());
  EXPECT_EQ(sum.circles, 0u);
}

TEST_F(RunLogTest, ChartWithASinglePointMarksIt) {
  const SvgSummary sum = check_svg(loss_chart_svg({{1, 2.5}}, {}, "one"));
  EXPECT_EQ(sum.polyline_points.at("train"), 1u);
  EXPECT_EQ(sum.circles, 1u);
  const SvgSummary both = check_svg(loss_chart_svg({{7, 2.5}}, {{7, 2.5}}, "one each"));
  EXPECT_EQ(both.polyline_points.at("train"), 1u);
  EXPECT_EQ(both.polyline_points.at("val"), 1u);
}

TEST_F(RunLogTest, ChartOfAFlatCurveHasAPaddedRange) {
  for (double v : {0.0, 2.0, -1.5, 1e-30}) {
    const std::vector<LossPoint> flat{{1, v}, {2, v}, {3, v}};
    const SvgSummary sum = check_svg(loss_chart_svg(flat, flat, "flat"));
    EXPECT_EQ(sum.polyline_points.at("train"), 3u) << v;
    EXPECT_EQ(sum.polyline_points.at("val"), 3u) << v;
  }
}

TEST_F(RunLogTest, ChartSkipsNonFiniteValues) {
  const double nan = std::nan(""), inf = INFINITY;
  const SvgSummary sum = check_svg(loss_chart_svg({{1, 2.0}, {2, nan}, {3, inf}, {4, 1.0}}, {{2, -inf}}, "t"));
  EXPECT_EQ(sum.polyline_points.at("train"), 2u);
  EXPECT_EQ(sum.polyline_points.count("val"), 0u);
}

TEST_F(RunLogTest, ChartOfALongRunIsThinnedKeepingTheFirstAndLastPoints) {
  const std::vector<LossPoint> train = curve(100000, 1, 4.0);
  const std::string svg = loss_chart_svg(train, curve(500, 200, 4.1), "long");
  const SvgSummary sum = check_svg(svg);
  EXPECT_EQ(sum.polyline_points.at("train"), kMaxChartPoints);
  EXPECT_EQ(sum.polyline_points.at("val"), 500u);
  // The first point sits on the frame's left edge and the last on its right edge.
  std::smatch m;
  ASSERT_TRUE(std::regex_search(svg, m, std::regex(R"re(id="train"[^>]*points="([0-9.]+),[^"]* ([0-9.]+),[0-9.]+")re")));
  EXPECT_EQ(m[1], "76.0");
  EXPECT_EQ(m[2], "716.0");
}

TEST_F(RunLogTest, ChartRedrawnFromMetricsMatchesTheLoggedCurves) {
  {
    MetricsLog log = MetricsLog::open(metrics_);
    log_steps(log, 1, 20);
  }
  const LossSeries series = read_loss_series(metrics_);
  ASSERT_EQ(series.train.size(), 20u);
  ASSERT_EQ(series.val.size(), 4u);
  EXPECT_EQ(series.val[3].step, 20);
  EXPECT_DOUBLE_EQ(series.val[3].value, 2.9 - 0.2);
  const SvgSummary sum = check_svg(loss_chart_svg(series.train, series.val, "redrawn"));
  EXPECT_EQ(sum.polyline_points.at("train"), 20u);
  EXPECT_EQ(sum.polyline_points.at("val"), 4u);
}

// The pixel points of the polyline with the given id.
std::vector<std::pair<double, double>> polyline(const std::string& svg, const std::string& id) {
  std::smatch m;
  EXPECT_TRUE(std::regex_search(svg, m, std::regex("<polyline id=\"" + id + "\"[^>]*points=\"([^\"]*)\"")));
  std::vector<std::pair<double, double>> points;
  std::istringstream in(m[1].str());
  double x, y;
  char comma;
  while (in >> x >> comma >> y) points.emplace_back(x, y);
  return points;
}

// The value -> pixel map of an axis, read from the first and last of its tick labels (value and baseline y; a
// label's baseline sits 4 px below its tick). Both are rounded to 0.1 px, so a mapped value is good to ~0.15 px.
struct TickScale {
  double v0 = 0, y0 = 0, v1 = 1, y1 = 1;
  double to_pixel(double v) const { return y0 + (v - v0) / (v1 - v0) * (y1 - y0); }
};
TickScale tick_scale(const std::string& svg_part, const std::string& label_attrs) {
  const std::regex label("<text x=\"[0-9.]+\" y=\"([0-9.]+)\"" + label_attrs + ">([-0-9.e+]+)</text>");
  std::vector<std::pair<double, double>> ticks;  // (value, pixel)
  for (auto it = std::sregex_iterator(svg_part.begin(), svg_part.end(), label); it != std::sregex_iterator(); ++it)
    ticks.emplace_back(std::stod((*it)[2]), std::stod((*it)[1]) - 4);
  EXPECT_GE(ticks.size(), 2u);
  if (ticks.size() < 2) return {};
  return {ticks.front().first, ticks.front().second, ticks.back().first, ticks.back().second};
}

TEST_F(RunLogTest, ChartSmoothsTheTrainCurveAndDrawsTheLearningRateOnItsOwnAxis) {
  const std::vector<LossPoint> train{{1, 2.0}, {2, 0.0}, {3, 2.0}, {4, 0.0}, {5, 2.0}};
  const std::vector<LossPoint> lr{{1, 1e-4}, {2, 2e-4}, {3, 2e-4}, {4, 1.5e-4}, {5, 5e-5}};
  const std::string svg = loss_chart_svg(train, {}, "smooth", lr);
  const SvgSummary sum = check_svg(svg);
  EXPECT_EQ(sum.polyline_points.at("train"), 5u);
  EXPECT_EQ(sum.polyline_points.at("smoothed"), 5u);
  EXPECT_EQ(sum.polyline_points.at("lr"), 5u);

  // The raw curve is faint and thin, the smoothed one bold and drawn after it (on top).
  std::smatch raw, smooth;
  ASSERT_TRUE(std::regex_search(svg, raw, std::regex(R"re(<polyline id="train"[^>]*stroke-width="([0-9.]+)" stroke-opacity="([0-9.]+)")re")));
  ASSERT_TRUE(std::regex_search(svg, smooth, std::regex(R"re(<polyline id="smoothed"[^>]*stroke-width="([0-9.]+)")re")));
  EXPECT_LT(std::stod(raw[2]), 0.5);
  EXPECT_GT(std::stod(smooth[1]), std::stod(raw[1]));
  EXPECT_LT(svg.find("id=\"train\""), svg.find("id=\"smoothed\""));
  EXPECT_NE(svg.find(">train (smoothed)</text>"), std::string::npos);

  // The steps span the frame exactly: step 1 at the left edge (76), step 5 at the right (716).
  const std::vector<double> xs{76, 236, 396, 556, 716};
  // The smoothed values as weighted averages: point k averages v_1..v_k with weights 0.9^(k-i), normalised.
  const TickScale loss_scale = tick_scale(svg, R"( text-anchor="end")");
  const std::vector<std::pair<double, double>> smoothed = polyline(svg, "smoothed");
  ASSERT_EQ(smoothed.size(), 5u);
  for (size_t k = 0; k < 5; ++k) {
    double sum_wv = 0, sum_w = 0;
    for (size_t i = 0; i <= k; ++i) {
      const double w = std::pow(0.9, double(k - i));
      sum_wv += w * train[i].value;
      sum_w += w;
    }
    EXPECT_NEAR(smoothed[k].first, xs[k], 0.051) << k;
    EXPECT_NEAR(smoothed[k].second, loss_scale.to_pixel(sum_wv / sum_w), 0.15) << k;
  }
  EXPECT_NEAR(smoothed[0].second, loss_scale.to_pixel(2.0), 0.15) << "the first point is not pulled towards 0";

  // The lr axis: its own labels at the right, from 0, titled; the lr curve follows it, not the loss axis.
  const size_t axis_begin = svg.find("<g id=\"lr-axis\"");
  ASSERT_NE(axis_begin, std::string::npos);
  const std::string axis = svg.substr(axis_begin, svg.find("</g>", axis_begin) - axis_begin);
  EXPECT_NE(axis.find(">learning rate</text>"), std::string::npos);
  EXPECT_NE(axis.find(">0</text>"), std::string::npos);
  const TickScale lr_scale = tick_scale(axis, "");
  EXPECT_EQ(lr_scale.v0, 0.0);
  EXPECT_GE(lr_scale.v1, 2e-4);
  EXPECT_NEAR(lr_scale.y0, 392, 0.051) << "0 sits on the frame's bottom";
  const std::vector<std::pair<double, double>> lr_points = polyline(svg, "lr");
  ASSERT_EQ(lr_points.size(), 5u);
  for (size_t k = 0; k < 5; ++k) {
    EXPECT_NEAR(lr_points[k].first, xs[k], 0.051) << k;
    EXPECT_NEAR(lr_points[k].second, lr_scale.to_pixel(lr[k].value), 0.15) << k;
  }
}

TEST(EmaSmoothed, MatchesTensorBoardsDebiasedAverageAndSkipsNonFiniteValues) {
  const std::vector<LossPoint> s = ema_smoothed({{1, 4.0}, {2, std::nan("")}, {3, 2.0}, {4, 1.0}}, 0.5);
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[1].step, 3);
  EXPECT_DOUBLE_EQ(s[0].value, 4.0);
  EXPECT_DOUBLE_EQ(s[1].value, (0.5 * 4.0 + 2.0) / 1.5);
  EXPECT_DOUBLE_EQ(s[2].value, (0.25 * 4.0 + 0.5 * 2.0 + 1.0) / 1.75);
  EXPECT_EQ(ema_smoothed({{1, 3.0}}, 0.0)[0].value, 3.0);
  EXPECT_THROW(ema_smoothed({}, 1.0), std::invalid_argument);
}

TEST(Plural, SaysOneStepAndTwoSteps) {
  EXPECT_EQ(plural(1, "step"), "1 step");
  EXPECT_EQ(plural(2, "step"), "2 steps");
  EXPECT_EQ(plural(0, "checkpoint"), "0 checkpoints");
}

// ---- progress ----

TEST(FormatDuration, UsesMinutesUnderAnHourAndHoursFromThenOn) {
  EXPECT_EQ(format_duration(0), "0:00");
  EXPECT_EQ(format_duration(9.99), "0:09");
  EXPECT_EQ(format_duration(61), "1:01");
  EXPECT_EQ(format_duration(3599.5), "59:59");
  EXPECT_EQ(format_duration(3600), "1:00:00");
  EXPECT_EQ(format_duration(3600 * 27 + 62), "27:01:02");
  EXPECT_EQ(format_duration(-1), "?");
  EXPECT_EQ(format_duration(std::nan("")), "?");
  EXPECT_EQ(format_duration(INFINITY), "?");
}

// Captures what a Progress writes, with a clock the test moves.
struct ProgressCapture {
  char* buf = nullptr;
  size_t size = 0;
  FILE* stream = open_memstream(&buf, &size);
  double time = 100.0;

  ~ProgressCapture() {
    std::fclose(stream);
    std::free(buf);
  }
  ProgressOptions options(ProgressOptions::Mode mode, int64_t total, int64_t log_every) {
    ProgressOptions o;
    o.total_steps = total;
    o.log_every = log_every;
    o.mode = mode;
    o.clock = [this] { return time; };
    return o;
  }
  std::string text() {
    std::fflush(stream);
    return std::string(buf, size);
  }
};

TEST(Progress, PlainStreamGetsOneLinePerLogEveryStepsPlusTheFirstAndLast) {
  ProgressCapture cap;
  {
    Progress p(cap.stream, cap.options(ProgressOptions::Mode::Auto, 23, 10));
    EXPECT_FALSE(p.terminal()) << "a memory stream is not a terminal";
    for (int64_t s = 1; s <= 23; ++s) {
      cap.time += 0.5;
      p.update(s, 2.0 / double(s), 3e-4, 1234.56);
      if (s == 15) p.message("eval: val_loss 1.2345");
    }
    p.finish();
  }
  const std::string out = cap.text();
  EXPECT_EQ(out.find('\r'), std::string::npos);
  EXPECT_EQ(out.find('\x1b'), std::string::npos);
  const std::vector<std::string> lines = lines_of(out);
  ASSERT_EQ(lines.size(), 5u) << out;
  EXPECT_EQ(lines[0], "step 1/23  loss 2.0000  lr 3.00e-04  1235 tok/s  elapsed 0:00  eta 0:11");
  EXPECT_EQ(lines[1], "step 10/23  loss 0.2000  lr 3.00e-04  1235 tok/s  elapsed 0:05  eta 0:06");
  EXPECT_EQ(lines[2], "eval: val_loss 1.2345");
  EXPECT_EQ(lines[3].rfind("step 20/23  loss 0.1000", 0), 0u) << lines[3];
  EXPECT_EQ(lines[4], "step 23/23  loss 0.0870  lr 3.00e-04  1235 tok/s  elapsed 0:11  eta 0:00");
}

TEST(Progress, PlainFinishPrintsAnUnloggedLastStepOnce) {
  ProgressCapture cap;
  {
    Progress p(cap.stream, cap.options(ProgressOptions::Mode::Plain, 100, 10));
    for (int64_t s = 1; s <= 13; ++s) p.update(s, 1.0, 1e-3, 12.34);
    p.finish();
    p.finish();
  }  // the destructor's finish() adds nothing either
  const std::vector<std::string> lines = lines_of(cap.text());
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[2].rfind("step 13/100  loss 1.0000  lr 1.00e-03  12.3 tok/s", 0), 0u) << lines[2];
}

TEST(Progress, EtaExtrapolatesOnlyTheStepsOfThisRun) {
  ProgressCapture cap;
  ProgressOptions o = cap.options(ProgressOptions::Mode::Plain, 1000, 1);
  o.start_step = 500;  // resumed
  Progress p(cap.stream, o);
  cap.time += 20;
  p.update(510, 1.0, 1e-4, 100.0);  // 10 steps in 20 s, 490 to go
  EXPECT_NE(cap.text().find("elapsed 0:20  eta 16:20"), std::string::npos) << cap.text();
}

TEST(Progress, ElapsedTimeContinuesFromTheResumedRuns) {
  ProgressCapture cap;
  ProgressOptions o = cap.options(ProgressOptions::Mode::Plain, 1000, 1);
  o.start_step = 500;
  o.elapsed_before = 125;  // 2:05 of training before the resume
  Progress p(cap.stream, o);
  cap.time += 20;
  p.update(510, 1.0, 1e-4, 100.0);  // 10 steps in 20 s, 490 to go
  EXPECT_NE(cap.text().find("elapsed 2:25  eta 16:20"), std::string::npos) << cap.text();
  EXPECT_DOUBLE_EQ(p.elapsed_s(), 145.0);
  o.elapsed_before = -1;
  EXPECT_THROW(Progress(cap.stream, o), std::invalid_argument);
}

TEST(Progress, TerminalRedrawsOneLineThrottledAndAlwaysShowsTheLastStep) {
  ProgressCapture cap;
  {
    Progress p(cap.stream, cap.options(ProgressOptions::Mode::Terminal, 50, 10));
    EXPECT_TRUE(p.terminal());
    for (int64_t s = 1; s <= 50; ++s) {
      cap.time += 0.01;  // 100 steps per second: most redraws are skipped
      p.update(s, 1.0 / double(s), 2e-4, 25000.0);
    }
    p.finish();
  }
  const std::string out = cap.text();
  const size_t redraws = size_t(std::count(out.begin(), out.end(), '\r'));
  EXPECT_GE(redraws, 5u);   // the first, about one per 0.1 s, the last
  EXPECT_LE(redraws, 8u);
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << "one line, ended by finish()";
  // The final state, complete bar and all, is what stays on screen.
  const std::string last = out.substr(out.rfind('\r') + 1);
  EXPECT_TRUE(std::regex_match(
      last, std::regex(R"(\[=+\] 50/50  loss 0\.0200  lr 2\.00e-04  25000 tok/s  elapsed 0:00  eta 0:00\x1b\[K\n)")))
      << last;
}

TEST(Progress, TerminalMessageClearsTheBarPrintsAndRedrawsIt) {
  ProgressCapture cap;
  Progress p(cap.stream, cap.options(ProgressOptions::Mode::Terminal, 10, 1));
  cap.time += 1;
  p.update(4, 1.5, 1e-4, 99.0);
  const size_t before = cap.text().size();
  p.message("checkpoint saved: step-4");
  const std::string after = cap.text().substr(before);
  EXPECT_EQ(after.rfind("\r\x1b[Kcheckpoint saved: step-4\n\r[", 0), 0u) << after;
  EXPECT_NE(after.find("4/10  loss 1.5000"), std::string::npos) << after;
  EXPECT_EQ(after.back(), 'K') << "the bar is redrawn, its line left open";
  p.finish();
  EXPECT_EQ(cap.text().back(), '\n');
}

TEST(Progress, TerminalFinishShowsAThrottledUpdate) {
  ProgressCapture cap;
  Progress p(cap.stream, cap.options(ProgressOptions::Mode::Terminal, 100, 1));
  p.update(1, 2.0, 1e-4, 10.0);
  p.update(2, 1.9876, 1e-4, 10.0);  // no time has passed: not drawn yet
  EXPECT_EQ(cap.text().find("2/100"), std::string::npos);
  p.finish();
  const std::string out = cap.text();
  EXPECT_NE(out.find("2/100  loss 1.9876"), std::string::npos) << out;
  EXPECT_EQ(out.back(), '\n');
}

TEST(Progress, RejectsImpossibleOptions) {
  ProgressCapture cap;
  EXPECT_THROW(Progress(cap.stream, cap.options(ProgressOptions::Mode::Plain, -1, 1)), std::invalid_argument);
  EXPECT_THROW(Progress(cap.stream, cap.options(ProgressOptions::Mode::Plain, 10, 0)), std::invalid_argument);
  ProgressOptions o = cap.options(ProgressOptions::Mode::Plain, 10, 1);
  o.start_step = 11;
  EXPECT_THROW(Progress(cap.stream, o), std::invalid_argument);
}

// ---- TensorBoard events ----

// A reader of events files written for these tests alone, bit by bit from the TFRecord and protobuf formats.

uint32_t bitwise_crc32c(std::string_view data) {
  uint32_t crc = 0xFFFFFFFFu;
  for (unsigned char byte : data) {
    crc ^= byte;
    for (int bit = 0; bit < 8; ++bit) crc = (crc & 1) ? (crc >> 1) ^ 0x82F63B78u : crc >> 1;
  }
  return ~crc;
}

uint32_t masked(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

uint64_t little_endian(std::string_view bytes) {
  uint64_t v = 0;
  for (size_t i = bytes.size(); i-- > 0;) v = v << 8 | static_cast<unsigned char>(bytes[i]);
  return v;
}

// The records' data, each checked against its two CRCs.
std::vector<std::string> read_tfrecords(const std::string& contents) {
  std::vector<std::string> records;
  size_t pos = 0;
  while (pos < contents.size()) {
    EXPECT_GE(contents.size() - pos, 12u) << "a cut-off record header at byte " << pos;
    if (contents.size() - pos < 12) break;
    const std::string_view header(contents.data() + pos, 8);
    const uint64_t length = little_endian(header);
    EXPECT_EQ(little_endian(std::string_view(contents.data() + pos + 8, 4)), masked(bitwise_crc32c(header)));
    EXPECT_GE(contents.size() - pos - 12, length + 4) << "a cut-off record at byte " << pos;
    if (contents.size() - pos - 12 < length + 4) break;
    const std::string data = contents.substr(pos + 12, length);
    EXPECT_EQ(little_endian(std::string_view(contents.data() + pos + 12 + length, 4)), masked(bitwise_crc32c(data)));
    records.push_back(data);
    pos += 12 + length + 4;
  }
  return records;
}

struct ProtoField {
  uint32_t number = 0;
  uint64_t scalar = 0;  // a varint, or the bits of a fixed64 / fixed32
  std::string bytes;    // a length-delimited field
};

uint64_t read_varint(const std::string& msg, size_t& pos) {
  uint64_t v = 0;
  for (int shift = 0; pos < msg.size(); shift += 7) {
    const auto byte = static_cast<unsigned char>(msg[pos++]);
    v |= uint64_t(byte & 0x7f) << shift;
    if (!(byte & 0x80)) return v;
  }
  ADD_FAILURE() << "a varint runs past the message";
  return v;
}

std::vector<ProtoField> read_proto(const std::string& msg) {
  std::vector<ProtoField> fields;
  size_t pos = 0;
  while (pos < msg.size()) {
    const uint64_t key = read_varint(msg, pos);
    ProtoField f;
    f.number = uint32_t(key >> 3);
    const size_t width = (key & 7) == 1 ? 8 : (key & 7) == 5 ? 4 : 0;
    if ((key & 7) == 0) {
      f.scalar = read_varint(msg, pos);
    } else if (width > 0 && pos + width <= msg.size()) {
      f.scalar = little_endian(std::string_view(msg.data() + pos, width));
      pos += width;
    } else if ((key & 7) == 2) {
      const uint64_t n = read_varint(msg, pos);
      f.bytes = msg.substr(pos, n);
      pos += n;
    } else {
      ADD_FAILURE() << "unexpected wire type " << (key & 7);
      break;
    }
    fields.push_back(f);
  }
  return fields;
}

struct DecodedEvent {
  double wall_time = 0;
  int64_t step = -1;
  std::string file_version;
  std::map<std::string, float> scalars;  // by tag
  int64_t session_status = -1;           // SessionLog.status, when the event is one
};

DecodedEvent decode_event(const std::string& data) {
  DecodedEvent e;
  for (const ProtoField& f : read_proto(data)) {
    if (f.number == 1) e.wall_time = std::bit_cast<double>(f.scalar);
    if (f.number == 2) e.step = int64_t(f.scalar);
    if (f.number == 3) e.file_version = f.bytes;
    if (f.number == 7) e.session_status = int64_t(read_proto(f.bytes).at(0).scalar);
    if (f.number != 5) continue;
    for (const ProtoField& value : read_proto(f.bytes)) {
      EXPECT_EQ(value.number, 1u);
      std::string tag;
      float v = NAN;
      for (const ProtoField& vf : read_proto(value.bytes)) {
        if (vf.number == 1) tag = vf.bytes;
        const auto bits = uint32_t(vf.scalar);
        if (vf.number == 2) v = std::bit_cast<float>(bits);
      }
      e.scalars[tag] = v;
    }
  }
  return e;
}

std::vector<std::string> events_files(const std::string& dir) {
  std::vector<std::string> files;
  for (const fs::directory_entry& e : fs::directory_iterator(dir)) files.push_back(e.path().string());
  std::sort(files.begin(), files.end());
  return files;
}

TEST(TfEvents, Crc32cHasTheStandardCheckValue) {
  EXPECT_EQ(bitwise_crc32c("123456789"), 0xE3069283u) << "the test's own reference";
  EXPECT_EQ(crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(crc32c(""), 0u);
  EXPECT_EQ(crc32c("56789", crc32c("1234")), 0xE3069283u) << "continuing a CRC";
  const std::string bytes("\x00\xff\x80 events", 10);
  EXPECT_EQ(masked_crc32c(bytes), masked(bitwise_crc32c(bytes)));
}

TEST_F(RunLogTest, TensorBoardEventsHoldTheMetricsScalarsInValidRecords) {
  const std::string tb = dir_ + "/tb/run";  // created with its parents
  const double before = double(std::time(nullptr));
  {
    MetricsLog log = MetricsLog::open(metrics_);
    log.tee_tensorboard(TfEventsWriter::create(tb));
    log.log_train(1, 2.5, 3e-4, 1234.5, {{"grad_norm", 0.75}, {"tokens", 512}});
    // Written through: a reader sees the event before the log is closed.
    EXPECT_EQ(read_tfrecords(read_file(events_files(tb).at(0))).size(), 2u);
    log.log_eval(1, 2.25, {{"val_tokens", 100}});
    log.log_train(2, std::nan(""), 2e-4, 1000.0);
  }
  const std::vector<std::string> files = events_files(tb);
  ASSERT_EQ(files.size(), 1u);
  char host[256] = {};
  ASSERT_EQ(gethostname(host, sizeof(host) - 1), 0);
  const std::string name = fs::path(files[0]).filename().string();
  EXPECT_TRUE(std::regex_match(name, std::regex(R"(events\.out\.tfevents\.[0-9]{10}\.)" + std::string(host))))
      << name;

  const std::vector<std::string> records = read_tfrecords(read_file(files[0]));
  ASSERT_EQ(records.size(), 4u);
  const DecodedEvent version = decode_event(records[0]);
  EXPECT_EQ(version.file_version, "brain.Event:2");
  EXPECT_GE(version.wall_time, before);
  EXPECT_LT(version.wall_time, before + 60);

  const DecodedEvent train = decode_event(records[1]);
  EXPECT_EQ(train.step, 1);
  EXPECT_GE(train.wall_time, version.wall_time);
  const std::map<std::string, float> train_scalars{{"train/loss", 2.5f},          {"train/lr", float(3e-4)},
                                                   {"train/tokens_per_s", 1234.5f}, {"train/grad_norm", 0.75f},
                                                   {"train/tokens", 512.f}};
  EXPECT_EQ(train.scalars, train_scalars);

  const DecodedEvent eval = decode_event(records[2]);
  EXPECT_EQ(eval.step, 1);
  const std::map<std::string, float> eval_scalars{
      {"eval/loss", 2.25f}, {"eval/ppl", float(std::exp(2.25))}, {"eval/tokens", 100.f}};
  EXPECT_EQ(eval.scalars, eval_scalars);

  // A non-finite loss (null in metrics.jsonl) is left out, like the chart leaves it out.
  const DecodedEvent second = decode_event(records[3]);
  EXPECT_EQ(second.step, 2);
  EXPECT_EQ(second.scalars.count("train/loss"), 0u);
  EXPECT_FLOAT_EQ(second.scalars.at("train/lr"), 2e-4f);
}

TEST_F(RunLogTest, ResumedTensorBoardEventsGoToANewFileThatRestartsAtTheResumeStep) {
  const std::string tb = dir_ + "/tb";
  {
    TfEventsWriter first = TfEventsWriter::create(tb);
    first.write_scalars(5, {{"train/loss", 1.0f}});
  }
  TfEventsWriter resumed = TfEventsWriter::create(tb, 3);
  resumed.write_scalars(4, {{"train/loss", 0.5f}});
  const std::vector<std::string> files = events_files(tb);
  ASSERT_EQ(files.size(), 2u) << "within the same second too";
  EXPECT_EQ(read_tfrecords(read_file(files[0])).size() + read_tfrecords(read_file(files[1])).size(), 2u + 3u);

  const std::vector<std::string> records = read_tfrecords(read_file(resumed.path()));
  ASSERT_EQ(records.size(), 3u);
  EXPECT_EQ(decode_event(records[0]).file_version, "brain.Event:2");
  const DecodedEvent restart = decode_event(records[1]);
  EXPECT_EQ(restart.step, 3);
  EXPECT_EQ(restart.session_status, 1) << "SessionLog START";
  EXPECT_EQ(decode_event(records[2]).step, 4);
  EXPECT_FLOAT_EQ(decode_event(records[2]).scalars.at("train/loss"), 0.5f);
}

TEST_F(RunLogTest, TensorBoardDirectoryThatCannotBeCreatedIsNamed) {
  write_file(dir_ + "/file", "x");
  try {
    TfEventsWriter::create(dir_ + "/file/tb");
    FAIL() << "expected an exception";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(dir_ + "/file/tb"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace q4t::train
