// `q4tune tokenize`: the model's tokenizer on a text, a file, or a JSON array of strings.
#include <CLI/CLI.hpp>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <ostream>
#include <sstream>
#include <stdexcept>

#include "data/gguf.h"
#include "data/tokenizer.h"
#include "train/cli_common.h"
#include "train/commands.h"

namespace q4t {
namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open '" + path + "'");
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::vector<int32_t> tokenize(const tok::Tokenizer& t, const std::string& text, const TokenizeOptions& o) {
  std::vector<int32_t> ids;
  if (o.add_special && t.add_bos() && t.bos() >= 0) ids.push_back(t.bos());
  const auto body = t.encode(text, o.parse_special);
  ids.insert(ids.end(), body.begin(), body.end());
  if (o.add_special && t.add_eos() && t.eos() >= 0) ids.push_back(t.eos());
  return ids;
}

int run_json(const tok::Tokenizer& t, const TokenizeOptions& o, std::ostream& out) {
  nlohmann::json in;
  try {
    in = nlohmann::json::parse(read_file(o.json_in));
  } catch (const nlohmann::json::parse_error& e) {
    throw std::runtime_error(o.json_in + ": not JSON: " + e.what());
  }
  if (!in.is_array()) throw std::runtime_error(o.json_in + ": expected a JSON array of strings");
  nlohmann::json result = nlohmann::json::array();
  for (size_t i = 0; i < in.size(); ++i) {
    if (!in[i].is_string()) throw std::runtime_error(o.json_in + ": element " + std::to_string(i) + " is not a string");
    result.push_back(tokenize(t, in[i].get<std::string>(), o));
  }
  if (o.out.empty()) {
    out << result.dump() << "\n";
    return 0;
  }
  std::ofstream f(o.out, std::ios::binary);
  f << result.dump() << "\n";
  if (!f.flush()) throw std::runtime_error("cannot write '" + o.out + "'");
  return 0;
}

}  // namespace

int run_tokenize(const TokenizeOptions& o, std::ostream& out) {
  const auto file = gguf::File::open(o.model);
  const auto t = tok::Tokenizer::from_gguf(*file);
  if (!o.json_in.empty()) return run_json(*t, o, out);
  const std::string text = o.file.empty() ? o.text : read_file(o.file);
  const auto ids = tokenize(*t, text, o);
  for (size_t i = 0; i < ids.size(); ++i) out << (i ? " " : "") << ids[i];
  out << "\n";
  if (o.decode) out << t->decode(ids) << "\n";
  return 0;
}

Command add_tokenize(CLI::App& app) {
  auto o = std::make_shared<TokenizeOptions>();
  auto* cmd = app.add_subcommand("tokenize", "Print the token ids of a text with the model's tokenizer");
  add_model_argument(cmd, o->model, "GGUF model", &o->text);
  auto* text = cmd->add_option("TEXT", o->text, "text to tokenize");
  auto* file = cmd->add_option("--file", o->file, "tokenize this file's contents")->excludes(text);
  cmd->add_option("--json-in", o->json_in, "JSON array of strings: write a JSON array of id arrays")
      ->excludes(text)
      ->excludes(file);
  cmd->add_option("-o,--out", o->out, "with --json-in: write here instead of stdout");
  cmd->add_flag("--decode", o->decode, "also print the text the ids decode to");
  cmd->add_flag("--parse-special", o->parse_special, "recognise control tokens (\"<s>\", ...) written in the text");
  cmd->add_flag("--add-special", o->add_special, "add BOS/EOS as the model's add_bos_token/add_eos_token say");
  set_examples(cmd, "  q4tune tokenize -m model.gguf \"Hello world\" --decode");
  return {cmd, [o] { return run_tokenize(*o, std::cout); }};
}

}  // namespace q4t
