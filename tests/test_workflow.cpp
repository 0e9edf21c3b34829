// q4tune as a fine-tuner uses it from the command line: a chat round trip (train on conversations, then talk to
// the adapter), a run directory as the argument of eval, generate and export, one spelling of each option,
// files given in each other's place, and the base model id a PEFT export names.
#include <gtest/gtest.h>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "data/gguf.h"
#include "scratch_dir.h"
#include "shell.h"

namespace fs = std::filesystem;

namespace {

using q4t::test::CmdResult;

// Runs `q4tune ARGS` in dir (with `input` on stdin when given).
CmdResult q4tune(const std::string& args, const fs::path& dir, const std::string& input = "") {
  if (!input.empty()) std::ofstream(dir / "stdin.txt") << input;
  const std::string in = input.empty() ? " < /dev/null" : " < " + q4t::test::quoted(dir / "stdin.txt");
  return q4t::test::run_shell("cd " + q4t::test::quoted(dir) + " && " + std::string(Q4TUNE_BIN) + " " + args + in);
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

const fs::path& scratch() {
  static const fs::path d = q4t::test::process_scratch_dir("q4t_workflow_");
  return d;
}

// One chat run shared by the tests: a tiny random llama trained on four one-turn conversations and one two-turn
// conversation in the chatml template, on the CPU (greedy decoding is then deterministic).
struct ChatRun {
  fs::path dir = scratch() / "chat";
  CmdResult train;
  ChatRun() {
    fs::create_directories(dir);
    EXPECT_EQ(q4tune("init-model -o m.gguf", dir).code, 0);
    std::ofstream f(dir / "chat.jsonl");
    auto turn = [](const char* role, const char* content) {
      return nlohmann::json{{"role", role}, {"content", content}};
    };
    for (auto [q, a] : {std::pair{"What sound does a cow make?", "Moo."}, {"What sound does a dog make?", "Woof."},
                        {"What sound does a cat make?", "Meow."}, {"What sound does a duck make?", "Quack."}})
      f << nlohmann::json{{"messages", {turn("user", q), turn("assistant", a)}}}.dump() << "\n";
    f << nlohmann::json{{"messages",
                         {turn("user", "What sound does a cat make?"), turn("assistant", "Meow."),
                          turn("user", "And a duck?"), turn("assistant", "Quack.")}}}
             .dump()
      << "\n";
    f.close();
    train = q4tune("train -m m.gguf --data chat.jsonl --chat-template chatml -o run --steps 160 --save-every 80 "
                   "--lr 1e-2 --batch-size 5 --seq-len 160 --device cpu --sample-prompt 'What sound does a dog make?' "
                   "--sample-max-tokens 20",
                   dir);
  }
};

const ChatRun& chat_run() {
  static const ChatRun r;
  return r;
}

// The acceptance round trip: trained on chatml conversations, `generate --chat` answers a training question.
TEST(ChatRoundTrip, GenerateChatAnswersATrainingQuestionWithTheAdapter) {
  const ChatRun& r = chat_run();
  ASSERT_EQ(r.train.code, 0) << r.train.out;
  // The run's own sample is a user turn in the template it trained with, beside the base model's answer.
  EXPECT_TRUE(has(r.train.out, "samples (greedy, chatml template), by the base model and with the adapter:\n"
                               "  What sound does a dog make?\n    base model:   "))
      << r.train.out;
  EXPECT_TRUE(has(r.train.out, "\n    with adapter: Woof.\n")) << r.train.out;
  // adapter.gguf records the template.
  const auto adapter = q4t::gguf::File::open((r.dir / "run" / "adapter.gguf").string());
  EXPECT_EQ(adapter->get_string("q4tune.chat_template"), "chatml");

  const std::string greedy = " --chat -n 24 --temperature 0 --device cpu";
  CmdResult g = q4tune("generate -m m.gguf --lora run/adapter.gguf -p 'What sound does a cow make?'" + greedy, r.dir);
  EXPECT_EQ(g.code, 0) << g.out;
  EXPECT_EQ(g.out, "Moo.\n");
  // Without the adapter, the same model answers otherwise.
  g = q4tune("generate -m m.gguf --chat-template chatml -p 'What sound does a cow make?'" + greedy, r.dir);
  EXPECT_EQ(g.code, 0) << g.out;
  EXPECT_NE(g.out, "Moo.\n");
  // --run: the run's model, template and newest checkpoint's adapters.
  g = q4tune("generate --run run -p 'What sound does a dog make?'" + greedy, r.dir);
  EXPECT_EQ(g.out, "Woof.\n");
  // Interactive: one user message per line, the conversation kept.
  g = q4tune("generate --run run" + greedy, r.dir, "What sound does a cat make?\nAnd a duck?\n");
  EXPECT_EQ(g.code, 0) << g.out;
  EXPECT_EQ(g.out, "Meow.\nQuack.\n");
}

TEST(ChatRoundTrip, GenerateChatWithoutATemplateIsOneClearError) {
  const ChatRun& r = chat_run();
  const CmdResult g = q4tune("generate -m m.gguf --chat -p hi --device cpu", r.dir);
  EXPECT_EQ(g.code, 1);
  EXPECT_EQ(g.out,
            "q4tune: error: --chat: the model carries no chat template and no adapter is given: pass --chat-template "
            "NAME (chatml, llama3, llama2, mistral, zephyr, gemma, phi3)\n");
}

// eval and export take the run directory; export takes its newest complete checkpoint.
TEST(Runs, EvalAndExportTakeTheRunDirectory) {
  const ChatRun& r = chat_run();
  ASSERT_EQ(r.train.code, 0) << r.train.out;
  CmdResult e = q4tune("eval --run run --data chat.jsonl --device cpu", r.dir);
  EXPECT_EQ(e.code, 0) << e.out;
  EXPECT_TRUE(has(e.out, "160 tokens")) << "the run's seq-len\n" << e.out;
  EXPECT_TRUE(has(e.out, "batches, adapters of run/checkpoints/step-160)")) << e.out;
  const CmdResult base = q4tune("eval -m m.gguf --chat-template chatml --data chat.jsonl --device cpu", r.dir);
  EXPECT_TRUE(has(base.out, "no adapter)")) << base.out;
  auto loss = [](const std::string& out) { return std::stod(out.substr(out.rfind("loss ") + 5)); };
  EXPECT_LT(loss(e.out), 0.5 * loss(base.out)) << e.out << base.out;

  // A copy of the run whose newest checkpoint is incomplete: export takes the one before it.
  fs::copy(r.dir / "run", r.dir / "run-copy", fs::copy_options::recursive);
  fs::remove(r.dir / "run-copy" / "checkpoints" / "step-160" / "complete");
  CmdResult x = q4tune("export run-copy", r.dir);
  EXPECT_EQ(x.code, 0) << x.out;
  EXPECT_TRUE(has(x.out, "wrote run-copy/checkpoints/step-80/adapter.gguf (GGUF LoRA, run-copy/checkpoints/step-80, "
                         "step 80)"))
      << x.out;
  x = q4tune("export --run run-copy --format peft -o peft-out --hf-base-model my-org/my-model", r.dir);
  EXPECT_EQ(x.code, 0) << x.out;
  const nlohmann::json cfg = nlohmann::json::parse(std::ifstream(r.dir / "peft-out" / "adapter_config.json"));
  EXPECT_EQ(cfg["base_model_name_or_path"], "my-org/my-model");
  x = q4tune("export m.gguf", r.dir);
  EXPECT_EQ(x.code, 1);
  EXPECT_TRUE(has(x.out, "--run: 'm.gguf' is not a directory")) << x.out;
  fs::remove_all(r.dir / "run-copy" / "checkpoints");
  x = q4tune("eval --run run-copy --data chat.jsonl", r.dir);
  EXPECT_EQ(x.code, 1);
  EXPECT_TRUE(has(x.out, "run-copy: no complete checkpoint under run-copy/checkpoints")) << x.out;
}

// A model where an adapter belongs, and an adapter where the model belongs: each one line saying what the file is.
TEST(MixUps, AModelAsTheAdapterAndAnAdapterAsTheModelSayWhatTheFileIs) {
  const ChatRun& r = chat_run();
  ASSERT_EQ(r.train.code, 0) << r.train.out;
  const std::string as_model =
      "q4tune: error: run/adapter.gguf is a LoRA adapter (general.type = adapter), not a model: give it as --adapter "
      "(or --lora) and the base model it was trained on as --model\n";
  for (const char* cmd : {"generate -m run/adapter.gguf -p hi", "eval -m run/adapter.gguf --data chat.jsonl",
                          "train -m run/adapter.gguf --data chat.jsonl -o x", "logits -m run/adapter.gguf --ids 1"}) {
    const CmdResult c = q4tune(std::string(cmd) + " --device cpu", r.dir);
    EXPECT_EQ(c.code, 1) << cmd;
    EXPECT_TRUE(has(c.out, as_model)) << cmd << "\n" << c.out;
    EXPECT_FALSE(fs::exists(r.dir / "x")) << "a failed start leaves no output directory";
  }
  const std::string as_adapter =
      "q4tune: error: m.gguf is a model (it has token_embd.weight), not a LoRA adapter: give it as --model; "
      "an adapter is the adapter.gguf a training run writes (general.type = adapter)\n";
  for (const char* cmd : {"generate -m m.gguf --lora m.gguf -p hi", "eval -m m.gguf --adapter m.gguf --data chat.jsonl "
                                                                      "--chat-template chatml"}) {
    const CmdResult c = q4tune(std::string(cmd) + " --device cpu", r.dir);
    EXPECT_EQ(c.code, 1) << cmd;
    EXPECT_EQ(c.out.substr(c.out.find("q4tune: error")), as_adapter) << cmd;
  }
}

// -m/--model on every command that reads a model, the positional form still taken; the short flags llama.cpp users
// type; one name per concept.
TEST(Spelling, EveryCommandTakesDashMAndThePositionalModel) {
  const fs::path d = scratch() / "spelling";
  fs::create_directories(d);
  ASSERT_EQ(q4tune("init-model -o m.gguf", d).code, 0);
  for (const std::string cmd : {"info", "tokenize", "logits"}) {
    const std::string rest = cmd == "tokenize" ? " hello" : cmd == "logits" ? " --ids 1,2 --device cpu" : "";
    const CmdResult flag = q4tune(cmd + " -m m.gguf" + rest, d), pos = q4tune(cmd + " m.gguf" + rest, d),
                    long_flag = q4tune(cmd + " --model m.gguf" + rest, d);
    EXPECT_EQ(flag.code, 0) << cmd << flag.out;
    EXPECT_EQ(flag.out, pos.out) << cmd;
    EXPECT_EQ(flag.out, long_flag.out) << cmd;
    const CmdResult both = q4tune(cmd + " -m m.gguf m.gguf" + (cmd == "tokenize" ? " hello" : rest), d);
    EXPECT_EQ(both.code, 2) << cmd << both.out;
    EXPECT_TRUE(has(both.out, "the model is given twice: as MODEL ('m.gguf') and as -m/--model ('m.gguf')"))
        << cmd << both.out;
    const CmdResult none = q4tune(cmd + (cmd == "logits" ? " --ids 1" : ""), d);
    EXPECT_EQ(none.code, 2) << cmd << none.out;
    EXPECT_TRUE(has(none.out, "-m/--model")) << cmd << none.out;
  }
  // -p, -n, -c and --lora on generate; -o on logits; -c on eval; the old names are gone.
  CmdResult g = q4tune("generate -m m.gguf -p 'ab' -n 3 -c 16 --temperature 0 --device cpu", d);
  EXPECT_EQ(g.code, 0) << g.out;
  EXPECT_EQ(g.out.substr(0, 2), "ab");
  g = q4tune("generate -m m.gguf -p 'a\\nb' -n 0 --device cpu", d);
  EXPECT_EQ(g.out, "a\nb\n") << "\\n in the prompt is a newline";
  EXPECT_EQ(q4tune("logits -m m.gguf --ids 1 -o l.json --device cpu", d).code, 0);
  EXPECT_TRUE(fs::exists(d / "l.json"));
  for (const char* old : {"generate -m m.gguf -p a --ctx 8", "eval -m m.gguf --data x.txt --max-batches 1",
                          "train -m m.gguf --data x.txt --sample-tokens 3", "init-model -o n.gguf --ctx 64"}) {
    const CmdResult c = q4tune(old, d);
    EXPECT_EQ(c.code, 2) << old << c.out;
  }
  EXPECT_EQ(q4tune("init-model -o n.gguf --context-length 64", d).code, 0);
  // init-model's Q4_K_M mix works with its own default dims.
  const CmdResult km = q4tune("init-model -o km.gguf --type q4_k_m", d);
  EXPECT_EQ(km.code, 0) << km.out;
}

// Every command's help ends with an example that starts with q4tune and the command.
TEST(Spelling, EveryHelpHasAnExample) {
  const fs::path d = scratch() / "help";
  fs::create_directories(d);
  for (const std::string cmd : {"devices", "selftest", "gradcheck", "info", "init-model", "quantize", "logits",
                                "tokenize", "bench", "bench train", "train", "eval", "export", "generate", "merge", "help"}) {
    const CmdResult h = q4tune("help " + cmd, d);
    EXPECT_EQ(h.code, 0) << cmd;
    EXPECT_TRUE(has(h.out, "Example:\n  q4tune " + cmd)) << cmd << "\n" << h.out;
    EXPECT_TRUE(has(h.out, "\nUsage: q4tune " + cmd + " ")) << h.out;
  }
}

}  // namespace
