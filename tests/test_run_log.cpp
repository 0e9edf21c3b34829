// The run log: metrics.jsonl lines and their truncation on resume, the loss chart's SVG for 0, 1, flat and very
// many points, and the progress display on a terminal and on a plain stream.
#include "train/run_log.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>

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
  void SetUp() override {
    std::string templ = testing::TempDir() + "/q4t_runlog_XXXXXX";
    ASSERT_NE(mkdtemp(templ.data()), nullptr);
    dir_ = templ;
    metrics_ = dir_ + "/metrics.jsonl";
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Steps 1..n of train lines, with an eval line after every 5th step.
  void log_steps(MetricsLog& log, int64_t first, int64_t last) {
    for (int64_t s = first; s <= last; ++s) {
      log.log_train(s, 3.0 - 0.01 * double(s), 1e-4, 1500.0, {{"grad_norm", 0.5}, {"tokens", 512 * s}});
      if (s % 5 == 0) log.log_eval(s, 2.9 - 0.01 * double(s));
    }
  }

  std::string dir_, metrics_;
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
  EXPECT_NEAR(eval["val_ppl"].get<double>(), std::exp(2.0), 1e-12);
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
  EXPECT_EQ(sum.polyline_points.at("val"), 10u);
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
  EXPECT_EQ(m[2], "776.0");
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

}  // namespace
}  // namespace q4t::train
