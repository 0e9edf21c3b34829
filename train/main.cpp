// q4tune: LoRA fine-tuning of quantized GGUF models on Vulkan GPUs or the CPU. Entry point: the table of commands
// (each registers itself next to its code: train/commands.h) and what they share: usage errors in one line with a
// did-you-mean and exit code 2, `q4tune help [COMMAND]`, and a command's error as one line with exit code 1.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>

#include "train/cli_common.h"
#include "train/commands.h"
#include "train/distributed.h"
#include "train/suggest.h"
#include "train/train.h"

using q4t::Command;
using q4t::did_you_mean;

namespace {

constexpr int kUsageError = 2;

// `q4tune train` with neither --config nor --model runs the embedded configs/demo.toml.
std::vector<std::string> with_demo_config(int argc, char** argv) {
  std::vector<std::string> args(argv, argv + argc);
  if (args.size() < 2 || args[1] != "train") return args;
  for (size_t i = 2; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") return args;
    if (a == "-m" || a.rfind("-m=", 0) == 0) return args;
    for (const char* name : {"--config", "--model"})
      if (a == name || a.rfind(std::string(name) + "=", 0) == 0) return args;
  }
  args.push_back("--config");
  args.push_back(q4t::demo_config_path());
  return args;
}

std::vector<CLI::App*> subcommands_of(CLI::App& app) {
  return app.get_subcommands([](CLI::App*) { return true; });
}

std::vector<std::string> names_of(const std::vector<CLI::App*>& apps) {
  std::vector<std::string> n;
  for (const CLI::App* a : apps) n.push_back(a->get_name());
  return n;
}

// The help of app or of the command the words name ("bench train"); an unknown word is a usage error.
int show_help(CLI::App& app, const std::vector<std::string>& words) {
  CLI::App* topic = &app;
  std::string usage = "q4tune";
  for (const std::string& word : words) {
    const std::vector<CLI::App*> subs = subcommands_of(*topic);
    auto it = std::find_if(subs.begin(), subs.end(), [&](CLI::App* a) { return a->get_name() == word; });
    if (it == subs.end()) {
      std::cerr << "q4tune: error: help: unknown command '" << word << "'" << did_you_mean(word, names_of(subs)) << "\n";
      return kUsageError;
    }
    topic = *it;
    usage += " " + word;
  }
  // The formatter itself: App::help() would describe the help command, the one parsed.
  std::cout << topic->get_formatter()->make_help(topic, usage, CLI::AppFormatMode::Normal);
  return 0;
}

Command add_help(CLI::App& app) {
  auto topic = std::make_shared<std::vector<std::string>>();
  auto* cmd = app.add_subcommand("help", "Show the commands, or a command's options: q4tune help [COMMAND]");
  cmd->add_option("COMMAND", *topic, "a command (bench train: the training benchmark)");
  q4t::set_examples(cmd, "  q4tune help train");
  return {cmd, [&app, topic] { return show_help(app, *topic); }};
}

// The deepest subcommand the parse reached (app itself when none), and its words ("bench train") in *path.
CLI::App* parsed_command(CLI::App& app, std::string* path) {
  for (CLI::App* sub : subcommands_of(app))
    if (sub->parsed()) {
      *path += (path->empty() ? "" : " ") + sub->get_name();
      return parsed_command(*sub, path);
    }
  return &app;
}

// The first argument after the command's own name that names no option of it: "--lr=1" is checked as "--lr".
std::string first_unknown_option(CLI::App& cmd, const std::vector<std::string>& args,
                                 std::vector<std::string>* option_names) {
  for (const CLI::Option* o : cmd.get_options()) {
    for (const std::string& l : o->get_lnames()) option_names->push_back("--" + l);
    for (const std::string& sn : o->get_snames()) option_names->push_back("-" + sn);
  }
  for (const std::string& a : args) {
    if (a.size() < 2 || a[0] != '-' || (a[1] >= '0' && a[1] <= '9') || a[1] == '.') continue;  // not negative numbers
    const std::string name = a.substr(0, a.find('='));
    if (std::find(option_names->begin(), option_names->end(), name) == option_names->end()) return name;
  }
  return "";
}

// Parses the arguments (the program name left out) into app. Returns the exit code where the parse itself ends
// the run (--help, --version, a usage error: one line naming what was meant), and nothing where a command runs.
std::optional<int> parse(CLI::App& app, const std::vector<std::string>& in_order) {
  // A first word that is no command is a typo far more often than anything else: say which command was meant.
  const std::vector<std::string> commands = names_of(subcommands_of(app));
  const std::string& first = in_order.front();
  if (first[0] != '-' && std::find(commands.begin(), commands.end(), first) == commands.end()) {
    std::cerr << "q4tune: error: unknown command '" << first << "'" << did_you_mean(first, commands)
              << "; q4tune help lists the commands\n";
    return kUsageError;
  }
  std::vector<std::string> args(in_order.rbegin(), in_order.rend());  // CLI11 takes the arguments last first
  try {
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    std::string path;
    CLI::App* cmd = parsed_command(app, &path);
    const std::string where = cmd == &app ? "q4tune" : "q4tune " + path;
    const std::string what = cmd == &app ? "" : path + ": ";
    std::vector<std::string> option_names;
    const std::string unknown = first_unknown_option(*cmd, in_order, &option_names);
    if (dynamic_cast<const CLI::ExtrasError*>(&e) && !unknown.empty())
      std::cerr << "q4tune: error: " << where << " has no option '" << unknown << "'"
                << did_you_mean(unknown, option_names) << "; q4tune help"
                << (cmd == &app ? std::string() : " " + path) << " lists them\n";
    else if (cmd == &app && !unknown.empty())
      std::cerr << "q4tune: error: unknown option '" << unknown << "'; q4tune help lists the commands\n";
    else
      std::cerr << "q4tune: error: " << what << e.what() << "\n";
    return kUsageError;
  }
  return std::nullopt;
}

// A failure of this rank alone in a data-parallel run: the others would wait for it, so the job ends.
[[noreturn]] void rank_failed(const std::string& what) {
  const q4t::dist::World& w = q4t::dist::World::get();
  std::cerr << "q4tune: error: rank " << w.rank() << " (on " << w.host() << "): " << what
            << "; stopping every rank (the last complete checkpoint is kept)\n";
  w.abort(1);
}

// Runs the command that was parsed; its error is one line on stderr and exit code 1.
int run_parsed(const std::vector<Command>& commands) {
  try {
    for (const Command& c : commands)
      if (*c.cmd) return c.run();
  } catch (const q4t::dist::JobError& e) {  // every rank has it: rank 0 says it
    std::fflush(stdout);
    if (q4t::dist::launched_rank() == 0) std::cerr << "q4tune: error: " << e.what() << "\n";
    return 1;
  } catch (const std::bad_alloc&) {
    std::fflush(stdout);
    if (q4t::dist::World::get().distributed()) rank_failed("out of host memory");
    std::cerr << "q4tune: error: out of host memory: the model, --seq-len or --batch-size asks for more than this "
                 "machine has\n";
    return 1;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    if (q4t::dist::World::get().distributed()) rank_failed(e.what());
    std::cerr << "q4tune: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"q4tune: fine-tune LoRA adapters for quantized GGUF models on any Vulkan GPU or the CPU"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "q4tune 0.1.0");
  // In the order `q4tune help` lists them.
  const std::vector<Command> commands = {
      q4t::add_devices(app), q4t::add_selftest(app), q4t::add_gradcheck(app), q4t::add_info(app),
      q4t::add_init_model(app), q4t::add_quantize(app), q4t::add_merge(app), q4t::add_logits(app),
      q4t::add_tokenize(app), q4t::add_bench(app), q4t::add_train(app), q4t::add_eval(app),
      q4t::add_export(app), q4t::add_generate(app), add_help(app)};

  std::vector<std::string> args = with_demo_config(argc, argv);
  args.erase(args.begin());  // the program name
  if (args.empty()) {  // no command: what there is to run
    std::cout << app.get_formatter()->make_help(&app, "q4tune", CLI::AppFormatMode::Normal);
    return 0;
  }
  if (const std::optional<int> exit_code = parse(app, args)) return *exit_code;
  return run_parsed(commands);
}
