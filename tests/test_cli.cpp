// The q4tune binary as a user runs it: exit codes, one-line errors, selftest and the bench's JSON.
#include <cmath>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <string>

#include "data/gguf.h"
#include "kernels/cpu/linear.h"
#include "malformed_gguf.h"
#include "shell.h"

namespace {

using q4t::test::CmdResult;

CmdResult run(const std::string& args, const std::string& env = "") {
  return q4t::test::run_shell(env + " " + std::string(Q4TUNE_BIN) + " " + args);
}

int count_lines(const std::string& s) { return int(std::count(s.begin(), s.end(), '\n')); }

// A run of q4tune <args> --json FILE: its result, and what it wrote to FILE (null when it wrote nothing). FILE is
// this process's own temp file, removed after.
struct JsonRun {
  CmdResult r;
  nlohmann::json j;
};
JsonRun run_json(const std::string& args) {
  const auto path = std::filesystem::temp_directory_path() / ("q4tune_test_cli_" + std::to_string(getpid()) + ".json");
  std::filesystem::remove(path);
  JsonRun out{run(args + " --json " + path.string()), nullptr};
  if (std::ifstream f(path); f) out.j = nlohmann::json::parse(f);
  std::filesystem::remove(path);
  return out;
}

// q4tune <args> fails, and its output says `says`.
void expect_refused(const std::string& args, const std::string& says) {
  const CmdResult r = run(args);
  EXPECT_NE(r.code, 0) << args;
  EXPECT_NE(r.out.find(says), std::string::npos) << args << ": " << r.out;
}

TEST(Cli, SelftestPassesOnTheCpu) {
  const CmdResult r = run("selftest --device cpu");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("q4_0_gemv"), std::string::npos);
  EXPECT_NE(r.out.find("selftest passed"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("FAIL"), std::string::npos) << r.out;
}

TEST(Cli, SelftestPassesOnVulkan) {
  const CmdResult r = run("selftest --device vulkan");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("selftest passed"), std::string::npos) << r.out;
  // lavapipe has 8-bit integer dot products and f16 arithmetic: the GEMVs' integer-dot path is checked too, and
  // the one-token dx both with its f16 decode and with the f32 decode of devices without f16.
  if (r.out.find("llvmpipe") != std::string::npos)
    for (const char* line : {"q4_0_gemv (dot)", "q4_k_gemv (dot)", "q6_k_gemv (dot)", "q4_0_dx (pairs)",
                             "q4_0_dx (f32 decode)", "q4_k_dx (f32 decode)"})
      EXPECT_NE(r.out.find(line), std::string::npos) << line << "\n" << r.out;
}

// Usage mistakes: a did-you-mean for commands and options, each one line, and exit code 2 for every usage error;
// help with no arguments and from `q4tune help [COMMAND]`, with usage lines that start with q4tune.
TEST(Cli, TyposGetADidYouMeanAndEveryUsageErrorExitsWith2) {
  struct Case {
    const char* args;
    const char* message;
  };
  for (const Case& c : {
           Case{"trian", "q4tune: error: unknown command 'trian' (did you mean 'train'?); q4tune help lists the commands"},
           Case{"help trian", "q4tune: error: help: unknown command 'trian' (did you mean 'train'?)"},
           Case{"init-model --out never.gguf --dimm 8",
                "q4tune: error: q4tune init-model has no option '--dimm' (did you mean '--dim'?); q4tune help "
                "init-model lists them"},
           Case{"train --model never.gguf --lora-rnak 8", "has no option '--lora-rnak' (did you mean '--lora-rank'?)"},
           Case{"bench train --shap small", "q4tune bench train has no option '--shap' (did you mean '--shape'?)"},
           Case{"logits", "q4tune: error: logits: a model: -m/--model FILE.gguf (or MODEL) is required"},
           Case{"--bogus", "q4tune: error: unknown option '--bogus'; q4tune help lists the commands"},
           Case{"init-model --out never.gguf --qwerty 1", "q4tune init-model has no option '--qwerty'; q4tune help"},
       }) {
    const CmdResult r = run(c.args);
    EXPECT_EQ(r.code, 2) << c.args << "\n" << r.out;
    EXPECT_NE(r.out.find(c.message), std::string::npos) << c.args << "\n" << r.out;
    EXPECT_EQ(count_lines(r.out), 1) << c.args << "\n" << r.out;
  }
  EXPECT_FALSE(std::filesystem::exists("never.gguf"));
  struct Help {
    const char* args;
    const char* usage;
    const char* mentions;
  };
  for (const Help& h : {Help{"", "Usage: q4tune [OPTIONS] SUBCOMMAND", "init-model"},
                        Help{"help", "Usage: q4tune [OPTIONS] SUBCOMMAND", "generate"},
                        Help{"help train", "Usage: q4tune train [OPTIONS]", "--lora-rank"},
                        Help{"help bench train", "Usage: q4tune bench train [OPTIONS]", "--batch-sizes"}}) {
    const CmdResult r = run(h.args);
    EXPECT_EQ(r.code, 0) << h.args << "\n" << r.out;
    EXPECT_NE(r.out.find(h.usage), std::string::npos) << h.args << "\n" << r.out;
    EXPECT_NE(r.out.find(h.mentions), std::string::npos) << h.args << "\n" << r.out;
  }
}

TEST(Cli, ABadDeviceStringIsOneClearError) {
  const CmdResult r = run("selftest --device gpu0");
  EXPECT_NE(r.code, 0);
  EXPECT_EQ(count_lines(r.out), 1) << r.out;
  EXPECT_NE(r.out.find("'gpu0' is not one of auto, cpu, vulkan, vulkan:N"), std::string::npos) << r.out;
}

TEST(Cli, AMissingVulkanDeviceIsOneClearError) {
  const CmdResult r = run("selftest --device vulkan:57");
  EXPECT_NE(r.code, 0);
  EXPECT_EQ(count_lines(r.out), 1) << r.out;
  EXPECT_NE(r.out.find("vulkan:57"), std::string::npos) << r.out;
}

TEST(Cli, NoVulkanDriverAtAllIsOneClearError) {
  // Point the loader at a driver list that does not exist: what a machine without any Vulkan driver sees.
  const CmdResult r = run("selftest --device vulkan", "VK_DRIVER_FILES=/nonexistent.json VK_ICD_FILENAMES=/nonexistent.json");
  EXPECT_NE(r.code, 0);
  EXPECT_EQ(count_lines(r.out), 1) << r.out;
  EXPECT_NE(r.out.find("no Vulkan device found"), std::string::npos) << r.out;
}

TEST(Cli, AutoFallsBackToTheCpuWithoutAVulkanDriver) {
  const CmdResult r = run("selftest", "VK_DRIVER_FILES=/nonexistent.json VK_ICD_FILENAMES=/nonexistent.json");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("selftest on cpu"), std::string::npos) << r.out;
}

TEST(Cli, BenchRejectsUnknownKernelsAndBadShapes) {
  expect_refused("bench --device cpu --kernels q4_0_gemv,q9", "unknown kernel 'q9'");
  expect_refused("bench --device cpu --shapes 64x48", "n_in = 48 is not a multiple of 32");
  expect_refused("bench --device cpu --shapes 64by64", "'64by64' is not N_OUTxN_IN");
}

TEST(Cli, BenchWritesOneJsonObjectPerCase) {
  const auto [r, j] = run_json("bench --device cpu --shapes 64x96,7x32 --kernels q4_0_gemv,q4_0_dx --seconds 0.01");
  ASSERT_EQ(r.code, 0) << r.out;
  ASSERT_TRUE(j.is_array());
  ASSERT_EQ(j.size(), 1u + 2u * 3u);  // the copy roofline, then per shape gemv + dx at T=1 and T=512
  EXPECT_EQ(j[0]["kernel"], "copy");
  for (const auto& row : j) {
    for (const char* key : {"kernel", "n_out", "n_in", "T", "us", "gbps", "tflops", "roofline_frac", "device"})
      EXPECT_TRUE(row.contains(key)) << key << " missing in " << row.dump();
    EXPECT_GT(row["us"].get<double>(), 0.0);
    EXPECT_EQ(row["device"], "cpu");
  }
  EXPECT_EQ(j[1]["kernel"], "q4_0_gemv");
  EXPECT_EQ(j[1]["n_out"], 64);
  EXPECT_EQ(j[1]["n_in"], 96);
  EXPECT_GT(j[1]["gbps"].get<double>(), 0.0);
  EXPECT_GT(j[1]["roofline_frac"].get<double>(), 0.0);
  EXPECT_GT(j[3]["tflops"].get<double>(), 0.0);  // dx at T=512 is a GEMM: TFLOPS, no copy fraction
  EXPECT_TRUE(j[3]["roofline_frac"].is_null());
}

// The trainable parameter count of LoRA rank r on all seven targets of a llama model: A [r, n_in] and B [n_out, r]
// per adapted matrix.
int64_t lora_params(int64_t r, int64_t dim, int64_t kv_dim, int64_t ff, int64_t layers) {
  auto ab = [&](int64_t n_in, int64_t n_out) { return r * n_in + n_out * r; };
  return layers * (ab(dim, dim) + 2 * ab(dim, kv_dim) + ab(dim, dim) + 2 * ab(dim, ff) + ab(ff, dim));
}

TEST(Cli, BenchTrainTimesEachBatchSizeAndWritesJson) {
  const auto [r, j] = run_json("bench train --device cpu --shape small --seq-len 16 --batch-sizes 1,3 --steps 1 "
                                "--warmup 0 --lora-rank 4");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("small (dim 512, 8 layers, 8/4 heads, ff 1408, vocab 32000)"), std::string::npos) << r.out;
  ASSERT_TRUE(j.is_array());
  ASSERT_EQ(j.size(), 2u);
  EXPECT_EQ(j[0]["batch_size"], 1);
  EXPECT_EQ(j[1]["batch_size"], 3);
  for (const auto& row : j) {
    EXPECT_EQ(row["shape"], "small");
    EXPECT_EQ(row["seq_len"], 16);
    EXPECT_EQ(row["device"], "cpu");
    EXPECT_GT(row["tokens_per_s"].get<double>(), 0.0);
    EXPECT_GT(row["peak_bytes"].get<int64_t>(), row["weight_bytes"].get<int64_t>());
    EXPECT_EQ(row["trainable_params"], lora_params(4, 512, 256, 1408, 8));
    // Random tokens over 32000 ids: the loss of a random model sits near ln(32000) = 10.37.
    EXPECT_NEAR(row["loss"].get<double>(), std::log(32000.0), 1.5);
  }
  // Q4_0 blocks of every matrix: 8 layers of q, k, v, o, gate, up, down, the embedding and the output matrix.
  const int64_t q4_0_bytes = (8 * (2 * 512 * 512 + 2 * 512 * 256 + 3 * 512 * 1408) + 2 * 32000 * 512) / 32 * 18;
  const int64_t norm_bytes = (8 * 2 + 1) * 512 * 4;
  EXPECT_EQ(j[0]["weight_bytes"], q4_0_bytes + norm_bytes);
  EXPECT_EQ(j[0]["grad_checkpoint"], false);
  // Recomputing the layers in the backward changes no number of the step, nor does keeping some layers' ffn
  // gate and up outputs instead of recomputing them. one_row: the run's one JSON row, its output saying `says`.
  auto one_row = [&](const std::string& flags, const std::string& says) {
    const JsonRun one = run_json("bench train --device cpu --shape small --seq-len 16 --batch-sizes 1 --steps 1 "
                                 "--warmup 0 --lora-rank 4 " + flags);
    EXPECT_EQ(one.r.code, 0) << one.r.out;
    EXPECT_NE(one.r.out.find(says), std::string::npos) << one.r.out;
    EXPECT_EQ(one.j.size(), 1u);
    return one.j.at(0);
  };
  const auto again = one_row("--grad-checkpoint", "layers recomputed in the backward");
  EXPECT_EQ(again["grad_checkpoint"], true);
  EXPECT_EQ(again["keep_ffn_layers"], 0);
  EXPECT_EQ(again["loss"], j[0]["loss"]);
  const auto kept = one_row("--grad-checkpoint --keep-ffn-layers 3", "the ffn gate and up outputs of the last 3 kept");
  EXPECT_EQ(kept["keep_ffn_layers"], 3);
  EXPECT_EQ(kept["loss"], j[0]["loss"]);
}

// The GPU profiles of bench train: per op and per kernel (each command timed alone), or per level (the kernels
// that run side by side between two barriers), each table ending in its sum.
TEST(Cli, BenchTrainProfilesByOpKernelAndLevelOnVulkan) {
  const std::string train = "bench train --device vulkan --shape small --seq-len 16 --batch-sizes 1 --steps 1 "
                            "--warmup 0 --lora-rank 4 ";
  const CmdResult kernels = run(train + "--profile --profile-kernels");
  ASSERT_EQ(kernels.code, 0) << kernels.out;
  for (const char* says : {"lora_linear", "kernel (each command alone)", "\n    lora_rows ", "\n    rms_norm_forward ",
                           "(sum)"})
    EXPECT_NE(kernels.out.find(says), std::string::npos) << says << "\n" << kernels.out;
  const CmdResult levels = run(train + "--profile-levels");
  ASSERT_EQ(levels.code, 0) << levels.out;
  EXPECT_NE(levels.out.find("level (its kernels, side by side)"), std::string::npos) << levels.out;
  EXPECT_NE(levels.out.find("(sum)"), std::string::npos) << levels.out;
  EXPECT_NE(levels.out.find("lora_rows"), std::string::npos) << levels.out;
  EXPECT_EQ(levels.out.find("lora_linear"), std::string::npos) << "no op times under --profile-levels\n" << levels.out;
  expect_refused(train + "--profile-kernels", "--profile-kernels requires --profile");
  expect_refused(train + "--profile --profile-levels", "--profile excludes --profile-levels");
}

TEST(Cli, BenchTrainRejectsAnUnknownShapeAndBadCounts) {
  const std::pair<const char*, const char*> cases[] = {
      {"--shape tiny", "--shape: unknown shape 'tiny' (known: small, tinyllama-1.1b, llama-7b)"},
      {"--steps 0", "--steps: must be at least 1"},
      {"--batch-sizes 2,0", "--batch-sizes: 0 is not a positive batch size"},
      {"--grad-checkpoint --keep-ffn-layers 9", "--keep-ffn-layers: 9 is outside 0..8 (the shape's layers)"},
      {"--keep-ffn-layers 2", "--keep-ffn-layers: applies only with --grad-checkpoint"},
  };
  for (const auto& [args, says] : cases) expect_refused(std::string("bench train --device cpu ") + args, says);
}

// --precision: mixed on the CPU runs where the CPU has the integer loops (and its first line says what it does),
// else it is one line naming the flag; gradcheck's mixed check is the Vulkan device's. auto is mixed only where the
// device has cooperative matrices, which `devices` says per device.
TEST(Cli, PrecisionMixedOnTheCpuSaysWhatItDoesOrIsOneClearErrorAndDevicesSayTheDefault) {
  const bool cpu_mixed = q4t::cpu::has_mixed(q4t::Format::Q4_0);
  const auto out_dir = std::filesystem::temp_directory_path() / ("q4t-cli-mixed-" + std::to_string(getpid()));
  for (const std::string& cmd : {"train --device cpu --precision mixed --steps 1 --out " + out_dir.string(),
                                std::string("gradcheck --device cpu --precision mixed")}) {
    CmdResult r = run(cmd);
    // The first command of a fresh machine may make the demo model first and say so on a line of its own.
    if (r.out.rfind("making the demo model", 0) == 0) r.out = r.out.substr(r.out.find('\n') + 1);
    const bool refused = !cpu_mixed || cmd.rfind("gradcheck", 0) == 0;
    if (refused) {
      EXPECT_NE(r.code, 0) << cmd;
      EXPECT_EQ(count_lines(r.out), 1) << cmd << ": " << r.out;
      EXPECT_NE(r.out.find("--precision mixed: "), std::string::npos) << cmd << ": " << r.out;
    } else {
      EXPECT_EQ(r.code, 0) << cmd << ": " << r.out;
      EXPECT_NE(r.out.find("rounded to 8-bit blocks"), std::string::npos) << cmd << ": " << r.out;
    }
  }
  std::filesystem::remove_all(out_dir);
  const CmdResult bad = run("eval --device cpu --precision half --model x.gguf --data y.txt");
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.out.find("--precision"), std::string::npos) << bad.out;
  const CmdResult d = run("devices");
  ASSERT_EQ(d.code, 0) << d.out;
  EXPECT_NE(d.out.find("cpu          the CPU kernels"), std::string::npos) << d.out;
  if (d.out.find("llvmpipe") != std::string::npos)
    EXPECT_NE(d.out.find("no tensor cores: --precision auto is f32"), std::string::npos) << d.out;
}

// The kernel bench in mixed precision on any Vulkan device (lavapipe: the portable kernels), and the plain f16
// GEMM as each product's ceiling where the device has tensor cores; the mixed kernels need a Vulkan device.
TEST(Cli, BenchRunsTheMixedProductsOnVulkanOnly) {
  const auto [r, j] = run_json("bench --device vulkan --precision mixed --tokens 40 --seconds 0.01 "
                                "--kernels q4_0_gemm,q4_k_mixed_dx,q8_0_decoded_gemm,lora_hs,q4_k_decode,"
                                "q6_k_decode_d4,rows_to_f16_u2 --shapes 70x256");
  ASSERT_EQ(r.code, 0) << r.out;
  std::set<std::string> kernels;
  for (const auto& row : j) {
    const std::string k = row["kernel"].get<std::string>();
    kernels.insert(k);
    const bool first_pass = k == "q4_k_decode" || k == "q6_k_decode_d4" || k == "rows_to_f16_u2";
    if (row["T"] == 40 && k != "lora_hs" && !first_pass) EXPECT_GT(row["tflops"].get<double>(), 0.0) << row.dump();
    // The decode and the f16 rows are judged against the copy, whatever their tokens.
    if (first_pass) EXPECT_GT(row["roofline_frac"].get<double>(), 0.0) << row.dump();
  }
  for (const char* k : {"copy", "q4_0_gemm", "q4_k_mixed_dx", "q8_0_decoded_gemm", "lora_hs", "q4_k_decode",
                        "q6_k_decode_d4", "rows_to_f16_u2"})
    EXPECT_TRUE(kernels.count(k)) << k << " missing: " << r.out;
  for (const char* k : {"f16_coop_gemm", "q4_0_decode", "rows_to_f16"})
    expect_refused(std::string("bench --device cpu --kernels ") + k, std::string(k) + " runs on Vulkan devices only");
  expect_refused("bench --device cpu --kernels q4_0_fused_gemm", "unknown kernel 'q4_0_fused_gemm'");
  expect_refused("bench --device vulkan --kernels q4_0_decode_r3",
                 "q4_0_decode_r3: the decode's rows per workgroup must be a power of two up to 128");
  expect_refused("bench --device vulkan --kernels rows_to_f16_u17", "rows_to_f16_u17: the loads in flight must be 1 to 16");
}

// bench train --type makes the random model's weights of each mix; a Q4_K_M matrix whose rows are not whole
// super-blocks is one error naming it (llama-quantize would write another type there).
TEST(Cli, BenchTrainTakesEachWeightMix) {
  for (const char* type : {"q8_0", "f16"}) {
    const auto [r, j] = run_json(std::string("bench train --device cpu --shape small --seq-len 8 --batch-sizes 1 "
                                             "--steps 1 --warmup 0 --lora-rank 2 --type ") + type);
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find(std::string("random ") + type + " weights"), std::string::npos) << r.out;
    EXPECT_EQ(j.at(0)["type"], type);
    EXPECT_EQ(j.at(0)["precision"], "f32");
    EXPECT_NEAR(j.at(0)["loss"].get<double>(), std::log(32000.0), 1.5);
  }
  expect_refused("bench train --device cpu --shape small --type q4_k_m --steps 1",
                 "blk.0.ffn_down.weight has rows of 1408 values, not a multiple of the 256 of a q6_k block");
  expect_refused("bench train --device cpu --type q5_0", "--type");
}

TEST(Cli, InfoOnEachMalformedGgufIsOneLineNamingTheProblem) {
  const auto dir = std::filesystem::temp_directory_path() / ("q4tune_test_info_" + std::to_string(getpid()));
  const auto cases = q4t::test::write_malformed_ggufs(dir.string());
  for (const auto& c : cases) {
    const CmdResult r = run("info " + c.path);
    if (c.gguf_valid) {  // a bad model but a good GGUF: info shows it
      EXPECT_EQ(r.code, 0) << c.name << ": " << r.out;
      continue;
    }
    EXPECT_NE(r.code, 0) << c.name;
    EXPECT_EQ(count_lines(r.out), 1) << c.name << ": " << r.out;
    EXPECT_EQ(r.out.rfind("q4tune: error: " + c.path + ": ", 0), 0u) << c.name << ": " << r.out;
    EXPECT_NE(r.out.find(c.expected_error_substring), std::string::npos) << c.name << ": " << r.out;
  }
  std::filesystem::remove_all(dir);
}

TEST(Cli, InfoListsTheKeysAndTensorsAndWhichTypesAreSupported) {
  const auto path = std::filesystem::temp_directory_path() / ("q4tune_test_info_" + std::to_string(getpid()) + ".gguf");
  q4t::test::write_tiny_llama_gguf(path.string());
  CmdResult r = run("info " + path.string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("GGUF version 3, alignment 32, 21 metadata keys, 12 tensors"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("tokenizer.ggml.tokens"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("string[32]  [\"<unk>\", \"<s>\""), std::string::npos) << r.out;
  const auto f = q4t::gguf::File::open(path.string());
  for (const auto& t : f->tensors())
    EXPECT_NE(r.out.find("  " + t.name + " "), std::string::npos) << t.name << " not listed:\n" << r.out;
  EXPECT_NE(r.out.find("[32, 16]  q4_0            288 bytes  supported\n"), std::string::npos) << r.out;

  q4t::gguf::Writer w;
  w.set("general.architecture", q4t::gguf::Value::str("llama"));
  w.add_tensor("blk.0.ffn_down.weight", {256, 2}, q4t::gguf::GgmlType::Q4_K, std::vector<uint8_t>(2 * 144));
  w.add_tensor("blk.0.ffn_up.weight", {256, 2}, q4t::gguf::GgmlType::Q5_K, std::vector<uint8_t>(2 * 176));
  w.add_tensor("blk.0.ffn_gate.weight", {256, 2}, q4t::gguf::GgmlType::IQ2_XXS, std::vector<uint8_t>(2 * 66));
  w.write(path.string());
  r = run("info " + path.string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("blk.0.ffn_down.weight  [256, 2]  q4_K            288 bytes  supported\n"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("blk.0.ffn_up.weight    [256, 2]  q5_K            352 bytes  supported\n"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("blk.0.ffn_gate.weight  [256, 2]  iq2_xxs         132 bytes  not supported by q4tune (iq2_xxs)"),
            std::string::npos)
      << r.out;
  std::filesystem::remove(path);
}

// A model with a matrix in a type the format table lacks: one error naming the tensor and its type, while `info`
// still lists the file.
TEST(Cli, AMatrixInATypeTheTableLacksIsOneErrorNamingTheTensorAndItsType) {
  const auto dir = std::filesystem::temp_directory_path() / ("q4t-cli-iq2-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const std::string base = (dir / "base.gguf").string(), bad = (dir / "bad.gguf").string();
  ASSERT_EQ(run("init-model --type q4_k_m --dim 256 --ff 512 --layers 1 --heads 4 --kv-heads 2 --out " + base).code, 0);
  const auto f = q4t::gguf::File::open(base);
  q4t::gguf::Writer w;
  for (const auto& [key, value] : f->metadata())
    if (key != "general.alignment") w.set(key, value);
  for (const auto& t : f->tensors()) {
    if (t.name == "blk.0.ffn_up.weight")
      w.add_tensor(t.name, t.ne, q4t::gguf::GgmlType::IQ2_XXS, std::vector<uint8_t>(size_t(t.ne[1] * t.ne[0] / 256 * 66)));
    else
      w.add_tensor(t.name, t.ne, t.type, std::vector<uint8_t>(t.data, t.data + t.bytes));
  }
  w.write(bad);
  CmdResult r = run("logits " + bad + " --device cpu --ids 1,2,3");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("tensor 'blk.0.ffn_up.weight' has type iq2_xxs, which q4tune cannot use here"), std::string::npos)
      << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
  r = run("info " + bad);
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("not supported by q4tune (iq2_xxs)"), std::string::npos) << r.out;
  std::filesystem::remove_all(dir);
}

// Train and eval say what share of the rows is real tokens; unpacked rows that are mostly padding get the advice
// to --pack, with the rows packing would take.
TEST(Cli, TrainAndEvalReportHowMuchOfTheRowsIsPadding) {
  const auto dir = std::filesystem::temp_directory_path() / ("q4t-cli-padding-" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string model = (dir / "tiny.gguf").string(), data = (dir / "pairs.json").string();
  ASSERT_EQ(run("init-model --out " + model).code, 0);
  {
    std::ofstream f(data);
    f << "[\n";
    for (int i = 0; i < 8; ++i)
      f << (i ? ",\n" : "") << "  {\"instruction\": \"Echo " << i << "\", \"input\": \"\", \"output\": \"" << i << "\"}";
    f << "\n]\n";
  }
  const std::string env = "XDG_CACHE_HOME=" + (dir / "cache").string();
  const std::string common =
      " --model " + model + " --data " + data + " --data-format alpaca --chat-template chatml --seq-len 140 --device cpu";
  const CmdResult train = run("train" + common + " --steps 1 --out " + (dir / "run").string(), env);
  ASSERT_EQ(train.code, 0) << train.out;
  std::smatch m;
  const std::regex advice(R"(rows: (\d+)% real tokens, (\d+)% padding \(--pack would fit the same data in about (\d+) rows? instead of 8\))");
  ASSERT_TRUE(std::regex_search(train.out, m, advice)) << train.out;
  EXPECT_LT(std::stoi(m[1]), 75);
  EXPECT_EQ(std::stoi(m[1]) + std::stoi(m[2]), 100);
  EXPECT_EQ(std::stoi(m[3]), 4);  // each example takes about 70 of the 140 positions

  const CmdResult eval = run("eval" + common + " --pack", env);
  ASSERT_EQ(eval.code, 0) << eval.out;
  const std::regex packed(R"(rows \(packed\): (\d+)% real tokens, (\d+)% padding\n)");
  ASSERT_TRUE(std::regex_search(eval.out, m, packed)) << eval.out;
  EXPECT_GE(std::stoi(m[1]), 75);
  EXPECT_EQ(eval.out.find("--pack would"), std::string::npos) << eval.out;
  std::filesystem::remove_all(dir);
}

}  // namespace
