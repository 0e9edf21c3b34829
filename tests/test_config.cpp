// q4tune train --config FILE.toml as a user runs it: TOML 1.0 as people write it, --print-config (which loads
// back to the same options), and every mistake in a file as one line "FILE:LINE:COL: message" with exit code 2.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "scratch_dir.h"
#include "shell.h"

namespace fs = std::filesystem;

namespace {

using q4t::test::CmdResult;

CmdResult run(const std::string& args) { return q4t::test::run_shell(std::string(Q4TUNE_BIN) + " " + args); }

std::vector<std::string> lines_of(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

std::string scratch() { return q4t::test::process_scratch_dir("q4t_config_"); }

std::string write_config(const std::string& name, const std::string& text) {
  const std::string path = scratch() + "/" + name;
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

// The value after "key = " in --print-config output.
std::string printed(const std::string& out, const std::string& key) {
  for (const std::string& l : lines_of(out))
    if (l.rfind(key + " = ", 0) == 0) return l.substr(key.size() + 3);
  return "(no line for " + key + ")";
}

// Tables, dotted keys, inline tables, multi-line arrays with a trailing comma, 1_000, comments, literal strings
// and escapes: every one arrives at its option, and the command line still wins.
TEST(ConfigFile, EveryTomlFeatureReachesItsOption) {
  const std::string never = scratch() + "/never-written";
  const std::string path = write_config("features.toml", R"(# a comment line
model = "m.gguf"   # a comment after a value
data = 'C:\data\train.jsonl'
out = ")" + never + R"("
steps = 1_000
lr = 1e-4
batch-size = 2
pack = true
grad.clip = 0.5
lora-targets = [
  "q",
  "v",  # a comment inside an array
  "down",
]
chat.template = "Q:\tA \"quoted\"\n"
warmup = { steps = 5, ratio = 0.1 }

[lora]
rank = 8
alpha = 16.5

[adam]
beta2 = 0.95
)");
  const CmdResult r = run("train --config " + path + " --print-config --batch-size 3");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(printed(r.out, "model"), "\"m.gguf\"");
  EXPECT_EQ(printed(r.out, "data"), R"("C:\\data\\train.jsonl")");
  EXPECT_EQ(printed(r.out, "steps"), "1000");
  EXPECT_EQ(printed(r.out, "lr"), "1e-04");
  EXPECT_EQ(printed(r.out, "batch-size"), "3") << "the command line wins over the file";
  EXPECT_EQ(printed(r.out, "pack"), "true");
  EXPECT_EQ(printed(r.out, "grad-clip"), "0.5");
  EXPECT_EQ(printed(r.out, "lora-targets"), R"(["q", "v", "down"])");
  EXPECT_EQ(printed(r.out, "chat-template"), R"("Q:\tA \"quoted\"\n")");
  EXPECT_EQ(printed(r.out, "warmup-steps"), "5");
  EXPECT_EQ(printed(r.out, "warmup-ratio"), "0.1");
  EXPECT_EQ(printed(r.out, "lora-rank"), "8");
  EXPECT_EQ(printed(r.out, "lora-alpha"), "16.5");
  EXPECT_EQ(printed(r.out, "adam-beta2"), "0.95");
  // Options the file does not name keep their defaults.
  EXPECT_EQ(printed(r.out, "seq-len"), "512");
  EXPECT_EQ(printed(r.out, "lora-dropout"), "0.0");
  EXPECT_EQ(printed(r.out, "precision"), "\"auto\"");
  EXPECT_EQ(printed(r.out, "rslora"), "false");
  EXPECT_EQ(printed(r.out, "resume"), "false");
  for (const std::string& l : lines_of(r.out)) {
    EXPECT_NE(l.find(" = "), std::string::npos) << "not a key = value line: " << l;
    for (const char* never_printed : {"config = ", "help = ", "print-config = "})
      EXPECT_NE(l.rfind(never_printed, 0), 0u) << l;
  }
  EXPECT_FALSE(fs::exists(never)) << "--print-config wrote the output directory";
}

// What --print-config prints is a config that loads back to the same options.
TEST(ConfigFile, PrintedConfigLoadsBackToTheSameOptions) {
  const std::string path = write_config("source.toml",
                                        "lora = { rank = 4, targets = [\"k\", \"o\"] }\nlr = 3e-4\nresume = "
                                        "\"ckpt/step-4\"\nval-data = 'a\\b.jsonl'\nseed = 7\nprecision = \"f32\"\n");
  const CmdResult first = run("train --config " + path + " --print-config --min-lr 1e-5 --grad-checkpoint");
  ASSERT_EQ(first.code, 0) << first.out;
  EXPECT_EQ(printed(first.out, "resume"), "\"ckpt/step-4\"");
  EXPECT_EQ(printed(first.out, "val-data"), R"("a\\b.jsonl")");
  EXPECT_EQ(printed(first.out, "min-lr"), "1e-05");
  EXPECT_EQ(printed(first.out, "grad-checkpoint"), "true");
  const std::string again = write_config("printed.toml", first.out);
  const CmdResult second = run("train --config " + again + " --print-config");
  ASSERT_EQ(second.code, 0) << second.out;
  EXPECT_EQ(second.out, first.out);
}

// --resume with no directory is `resume = true`; false leaves it off.
TEST(ConfigFile, ResumeTakesTrueFalseOrADirectory) {
  const CmdResult on = run("train --config " + write_config("resume_on.toml", "resume = true\n") + " --print-config");
  ASSERT_EQ(on.code, 0) << on.out;
  EXPECT_EQ(printed(on.out, "resume"), "true");
  const CmdResult off = run("train --config " + write_config("resume_off.toml", "resume = false\n") + " --print-config");
  ASSERT_EQ(off.code, 0) << off.out;
  EXPECT_EQ(printed(off.out, "resume"), "false");
}

TEST(ConfigFile, EveryShippedConfigLoads) {
  int n = 0;
  for (const auto& e : fs::directory_iterator(fs::path(Q4T_SOURCE_DIR) / "configs")) {
    if (e.path().extension() != ".toml") continue;
    ++n;
    const CmdResult r = run("train --config " + e.path().string() + " --print-config");
    EXPECT_EQ(r.code, 0) << e.path() << ": " << r.out;
    EXPECT_EQ(printed(r.out, "pack"), "true") << e.path();
  }
  EXPECT_GE(n, 3);
}

// A broken config: where the mistake is and what the one line of the error says.
struct Broken {
  const char* name;
  const char* text;
  int line, column;
  const char* message;  // a part of the message after "FILE:LINE:COL: "
};

const Broken kBroken[] = {
    {"unterminated_string", "lora-rank = 8\nmodel = \"m.gguf", 2, 16, "Error while parsing string"},
    {"string_across_lines", "model = \"m.gguf\nsteps = 3\n", 1, 16, "unterminated string"},
    {"number_too_large", "threads = 10_000_000_000\n", 1, 11, "'threads' cannot hold the integer 10000000000"},
    {"missing_equals", "lora-rank = 8\nsteps 10\n", 2, 7, "expected '='"},
    {"bad_number", "steps = 1__000\n", 1, 11, "underscores may only follow digits"},
    {"duplicate_key", "lora-rank = 8\nlr = 1e-3\nlora-rank = 16\n", 3, 13, "cannot redefine existing integer 'lora-rank'"},
    {"duplicate_through_a_table", "lora-rank = 8\n\n[lora]\nrank = 16\n", 4, 1,
     "'lora-rank' is given twice (first at line 1, column 1)"},
    {"unknown_key", "lora-rank = 8\nlora-rnak = 8\n", 2, 1, "unknown key 'lora-rnak' (did you mean 'lora-rank'?)"},
    {"unknown_key_in_a_table", "[lora]\nrank = 8\nalpah = 16\n", 3, 1,
     "unknown key 'lora-alpah' (did you mean 'lora-alpha'?)"},
    {"string_for_a_number", "steps = \"ten\"\n", 1, 9, "'steps' wants an integer, not the string \"ten\""},
    {"float_for_an_integer", "seq-len = 512.5\n", 1, 11, "'seq-len' wants an integer, not the number 512.5"},
    {"array_for_a_scalar", "lora-rank = [8, 16]\n", 1, 13, "'lora-rank' wants an integer, not an array"},
    {"number_for_a_flag", "pack = 1\n", 1, 8, "'pack' wants true or false, not the integer 1"},
    {"table_for_a_scalar", "lora-rank = { value = 8 }\n", 1, 13, "'lora-rank' wants an integer, not a table"},
    {"number_in_a_list", "lora-targets = [\n  \"q\",\n  7,\n]\n", 3, 3,
     "'lora-targets' wants a string in its array, not the integer 7"},
    {"negative_seed", "seed = -1\n", 1, 8, "'seed' wants a non-negative integer, not the integer -1"},
    {"out_of_range", "[lora]\nrank = 0\n", 2, 8, "'lora-rank': "},
    {"not_a_choice", "precision = \"f64\"\n", 1, 13, "'precision': "},
    {"config_in_a_config", "config = \"other.toml\"\n", 1, 1, "'config' cannot be set in a config file"},
};

TEST(ConfigFile, EveryMistakeIsOneLineWithFileLineAndColumn) {
  for (const Broken& b : kBroken) {
    SCOPED_TRACE(b.name);
    const std::string path = write_config(std::string(b.name) + ".toml", b.text);
    const CmdResult r = run("train --config " + path + " --print-config");
    EXPECT_EQ(r.code, 2) << r.out;
    const std::vector<std::string> l = lines_of(r.out);
    ASSERT_EQ(l.size(), 1u) << r.out;
    const std::string where =
        "q4tune: error: train: " + path + ":" + std::to_string(b.line) + ":" + std::to_string(b.column) + ": ";
    EXPECT_EQ(l[0].rfind(where, 0), 0u) << "want " << where << "\n got " << l[0];
    EXPECT_NE(l[0].find(b.message, where.size()), std::string::npos) << "'" << b.message << "' not in: " << l[0];
  }
}

// The checks of the options themselves (a range, a set of names) say what they accept.
TEST(ConfigFile, RejectedValuesSayWhatIsAccepted) {
  const CmdResult range = run("train --print-config --config " + write_config("rank0.toml", "lora-rank = 0\n"));
  EXPECT_EQ(range.code, 2);
  EXPECT_NE(range.out.find("65536"), std::string::npos) << range.out;
  const CmdResult choice = run("train --print-config --config " + write_config("f64.toml", "precision = 'f64'\n"));
  EXPECT_EQ(choice.code, 2);
  EXPECT_NE(choice.out.find("mixed"), std::string::npos) << choice.out;
}

TEST(ConfigFile, MissingFileIsOneLine) {
  const std::string path = scratch() + "/none.toml";
  const CmdResult r = run("train --config " + path + " --print-config");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.out, "q4tune: error: train: " + path + ": no such config file\n");
}

}  // namespace
