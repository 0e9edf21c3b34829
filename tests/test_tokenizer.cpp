// The tokenizer algorithms on small hand-built vocabularies: SPM score merging, byte fallback and the space
// prefix; byte-level BPE merge ranks and the pre-tokenizer families (gpt-2, llama-bpe, qwen2, default); special
// tokens; invalid UTF-8; decoding; the errors a user sees. (Agreement with llama.cpp on real vocabularies:
// tests/interop.)
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "data/gguf.h"
#include "data/tokenizer.h"
#include "data/unicode.h"

namespace fs = std::filesystem;
namespace gguf = q4t::gguf;
using gguf::Value;
using gguf::ValueType;
using q4t::tok::Tokenizer;
using q4t::tok::TokenizerError;
using Ids = std::vector<int32_t>;

namespace {

struct Tok {
  std::string text;
  int32_t type = 1;  // NORMAL
  float score = 0;
};

Value strings(const std::vector<std::string>& v) {
  std::vector<Value> out;
  for (const auto& s : v) out.push_back(Value::str(s));
  return Value::array(ValueType::STRING, out);
}

// Writes a GGUF holding only tokenizer keys and opens a tokenizer on it.
std::unique_ptr<Tokenizer> make(const std::string& model, const std::vector<Tok>& toks,
                                const std::vector<std::string>& merges = {}, const std::string& pre = "",
                                bool space_prefix = true) {
  gguf::Writer w;
  std::vector<std::string> texts;
  std::vector<Value> types, scores;
  for (const auto& t : toks) {
    texts.push_back(t.text);
    types.push_back(Value::i32(t.type));
    scores.push_back(Value::f32(t.score));
  }
  w.set("tokenizer.ggml.model", Value::str(model));
  if (!pre.empty()) w.set("tokenizer.ggml.pre", Value::str(pre));
  w.set("tokenizer.ggml.tokens", strings(texts));
  w.set("tokenizer.ggml.token_type", Value::array(ValueType::I32, types));
  if (model == "llama") w.set("tokenizer.ggml.scores", Value::array(ValueType::F32, scores));
  if (model == "gpt2") w.set("tokenizer.ggml.merges", strings(merges));
  if (!space_prefix) w.set("tokenizer.ggml.add_space_prefix", Value::boolean(false));
  const fs::path path = fs::temp_directory_path() / ("q4t-tok-unit-" + std::to_string(getpid()) + ".gguf");
  w.write(path.string());
  auto f = gguf::File::open(path.string());
  auto t = Tokenizer::from_gguf(*f);
  fs::remove(path);
  return t;
}

// <unk> <s> </s>, the 256 <0xXX> byte tokens (ids 3..258), then `extra` from id 259.
std::vector<Tok> spm_vocab(const std::vector<Tok>& extra) {
  std::vector<Tok> v = {{"<unk>", 2}, {"<s>", 3}, {"</s>", 3}};
  for (int b = 0; b < 256; ++b) {
    char hex[8];
    std::snprintf(hex, sizeof hex, "<0x%02X>", b);
    v.push_back({hex, 6});
  }
  v.insert(v.end(), extra.begin(), extra.end());
  return v;
}
constexpr int32_t kSpmExtra = 259;
int32_t byte_id(uint8_t b) { return 3 + b; }

// The 256 single-byte tokens of GPT-2's alphabet (id = byte), then `extra` from id 256.
std::vector<Tok> bpe_vocab(const std::vector<std::string>& extra, bool with_eot = true) {
  std::vector<Tok> v;
  for (int b = 0; b < 256; ++b) v.push_back({q4t::tok::byte_to_unicode(uint8_t(b))});
  for (const auto& e : extra) v.push_back({e});
  if (with_eot) v.push_back({"<|endoftext|>", 3});
  return v;
}

const std::string G = "\xC4\xA0";  // "Ġ": the space byte in GPT-2's alphabet

Ids bytes_of(const std::string& s) {
  Ids ids;
  for (char c : s) ids.push_back(uint8_t(c));
  return ids;
}

}  // namespace

TEST(Spm, MergesTheHighestScoringPairFirst) {
  // "abc": "ab" (score 1) and "bc" (score 2) compete; "bc" wins, leaving a + bc.
  auto t = make("llama", spm_vocab({{"a"}, {"b"}, {"c"}, {"ab", 1, 1.0f}, {"bc", 1, 2.0f}, {"\xE2\x96\x81"}}),
                {}, "", false);
  EXPECT_EQ(t->encode("abc"), (Ids{kSpmExtra, kSpmExtra + 4}));
}

TEST(Spm, BreaksScoreTiesTowardTheLeft) {
  auto t = make("llama", spm_vocab({{"a"}, {"aa", 1, 1.0f}}), {}, "", false);
  EXPECT_EQ(t->encode("aaa"), (Ids{kSpmExtra + 1, kSpmExtra}));
}

TEST(Spm, PrefixesASpaceAndEscapesSpaces) {
  auto t = make("llama", spm_vocab({{"\xE2\x96\x81"}, {"h"}, {"i"}, {"\xE2\x96\x81h", 1, 1}, {"\xE2\x96\x81hi", 1, 2}}));
  EXPECT_EQ(t->encode("hi hi"), (Ids{kSpmExtra + 4, kSpmExtra + 4}));
  EXPECT_EQ(t->decode(t->encode("hi hi")), "hi hi");
  EXPECT_TRUE(t->encode("").empty()) << "no prefix space for the empty text";
}

TEST(Spm, FallsBackToByteTokensForUnknownCharacters) {
  auto t = make("llama", spm_vocab({{"\xE2\x96\x81"}}), {}, "", false);
  EXPECT_EQ(t->encode("\xC3\xA9"), (Ids{byte_id(0xC3), byte_id(0xA9)}));
  EXPECT_EQ(t->decode(Ids{byte_id(0xC3), byte_id(0xA9)}), "\xC3\xA9");
}

TEST(Spm, KeepsInvalidUtf8AsByteTokens) {
  // As in llama.cpp, a symbol is as long as its lead byte claims: 0xFF swallows the next byte ("\xFFa"), which
  // is no token, so both fall back to byte tokens.
  auto t = make("llama", spm_vocab({{"a"}}), {}, "", false);
  EXPECT_EQ(t->encode("a\xFF" "a"), (Ids{kSpmExtra, byte_id(0xFF), byte_id('a')}));
  EXPECT_EQ(t->decode(t->encode("a\xFF" "a")), "a\xFF" "a");
}

TEST(Spm, RecognisesControlTokensOnlyWhenAsked) {
  auto t = make("llama", spm_vocab({{"\xE2\x96\x81"}, {"x"}}));
  const int32_t sp = kSpmExtra, x = kSpmExtra + 1;
  EXPECT_EQ(t->encode("x<s>x", true), (Ids{sp, x, 1, sp, x})) << "text after a special token gets a prefix space";
  const Ids literal = t->encode("<s>", false);
  EXPECT_EQ(literal.size(), 4u) << "\"<s>\" spelt with byte tokens: ▁ < s >";
  EXPECT_EQ(t->decode(Ids{sp, x, 2}), "x") << "the prefix space is dropped; control tokens render as nothing";
  EXPECT_EQ(t->decode(Ids{1, sp, x}), " x") << "as llama.cpp: only the very first token loses its space";
}

TEST(Bpe, MergesByRankLowestFirst) {
  // "abc" with merges [b c] (rank 0), [a b] (rank 1): bc first, then no merge for a + bc.
  auto t = make("gpt2", bpe_vocab({"bc", "ab"}), {"b c", "a b"}, "gpt-2");
  EXPECT_EQ(t->encode("abc"), (Ids{'a', 256}));
  auto u = make("gpt2", bpe_vocab({"bc", "ab"}), {"a b", "b c"}, "gpt-2");
  EXPECT_EQ(u->encode("abc"), (Ids{257, 'c'}));
}

TEST(Bpe, Gpt2SplitsWordsBeforeMerging) {
  // The merge "o Ġ" never applies: the space starts the next word.
  auto t = make("gpt2", bpe_vocab({"o" + G, G + "w"}), {"o " + G, G + " w"}, "gpt-2");
  EXPECT_EQ(t->encode("o w"), (Ids{'o', 257}));
  EXPECT_EQ(t->decode(t->encode("o w")), "o w");
}

TEST(Bpe, Gpt2ContractionsAreLowercaseOnly) {
  auto t = make("gpt2", bpe_vocab({"'s", "'S"}), {"' s", "' S"}, "gpt-2");
  EXPECT_EQ(t->encode("'s"), (Ids{256}));
  EXPECT_EQ(t->encode("'S"), (Ids{'\'', 'S'})) << "' and S fall into different words";
  auto l3 = make("gpt2", bpe_vocab({"'s", "'S"}), {"' s", "' S"}, "llama-bpe");
  EXPECT_EQ(l3->encode("'S"), (Ids{257})) << "Llama 3 folds case";
}

TEST(Bpe, DigitGroupsFollowThePreTokenizer) {
  const std::vector<std::string> merges = {"1 2", "12 3", "123 4"};
  const auto vocab = bpe_vocab({"12", "123", "1234"});
  EXPECT_EQ(make("gpt2", vocab, merges, "gpt-2")->encode("1234"), (Ids{258}));
  EXPECT_EQ(make("gpt2", vocab, merges, "llama-bpe")->encode("1234"), (Ids{257, '4'}));
  EXPECT_EQ(make("gpt2", vocab, merges, "qwen2")->encode("1234"), (Ids{'1', '2', '3', '4'}));
}

TEST(Bpe, Llama3TakesAWholeWordTokenWithoutMerging) {
  // "abc" is a token but no merge path reaches it: llama-bpe (ignore_merges) still emits it, gpt-2 cannot.
  const auto vocab = bpe_vocab({"abc"});
  EXPECT_EQ(make("gpt2", vocab, {}, "llama-bpe")->encode("abc"), (Ids{256}));
  EXPECT_EQ(make("gpt2", vocab, {}, "gpt-2")->encode("abc"), (Ids{'a', 'b', 'c'}));
}

TEST(Bpe, WhitespaceRunsLeaveTheLastSpaceToTheNextWord) {
  auto t = make("gpt2", bpe_vocab({G + G, G + "x"}), {G + " " + G, G + " x"}, "gpt-2");
  EXPECT_EQ(t->encode("   x"), (Ids{256, 257})) << "\"  \" then \" x\"";
  EXPECT_EQ(t->encode("x   "), (Ids{'x', 256, ' '})) << "a trailing run is one word";
}

TEST(Bpe, InvalidUtf8BecomesTheReplacementCharacter) {
  auto t = make("gpt2", bpe_vocab({}), {}, "gpt-2");
  EXPECT_EQ(t->encode("a\xFF"), (Ids{'a', 0xEF, 0xBF, 0xBD}));
}

TEST(Bpe, SpecialTokens) {
  auto t = make("gpt2", bpe_vocab({}), {}, "gpt-2");
  const int32_t eot = 256;
  EXPECT_EQ(t->encode("a<|endoftext|>", true), (Ids{'a', eot}));
  EXPECT_EQ(t->encode("<|endoftext|>", false), bytes_of("<|endoftext|>")) << "spelt out without parse_special";
  EXPECT_EQ(t->decode(Ids{'a', eot, 'b'}), "ab");
}

TEST(Bpe, UserDefinedTokensAreAlwaysRecognised) {
  auto v = bpe_vocab({});
  v.push_back({"<tool>", 4});
  auto t = make("gpt2", v, {}, "gpt-2");
  EXPECT_EQ(t->encode("x<tool>", false), (Ids{'x', 257})) << "llama.cpp matches user-defined tokens always";
  EXPECT_EQ(t->decode(Ids{257}), "<tool>");
}

TEST(Tokenizer, UnknownPreTokenizerIsNamed) {
  try {
    make("gpt2", bpe_vocab({}), {}, "foo");
    FAIL() << "no error";
  } catch (const TokenizerError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("tokenizer.ggml.pre 'foo' is not supported (supported: gpt-2, llama-bpe"), std::string::npos) << m;
    EXPECT_NE(m.find(".gguf: "), std::string::npos) << m;
  }
}

TEST(Tokenizer, UnknownModelIsNamed) {
  try {
    make("bert", bpe_vocab({}));
    FAIL() << "no error";
  } catch (const TokenizerError& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer.ggml.model 'bert' is not supported"), std::string::npos) << e.what();
  }
}

TEST(Tokenizer, ContentHashFollowsTheVocabulary) {
  const auto a = make("gpt2", bpe_vocab({"ab"}), {"a b"}, "gpt-2");
  const auto b = make("gpt2", bpe_vocab({"ab"}), {"a b"}, "gpt-2");
  const auto c = make("gpt2", bpe_vocab({"ab"}), {"a b"}, "qwen2");
  EXPECT_EQ(a->content_hash(), b->content_hash());
  EXPECT_NE(a->content_hash(), c->content_hash());
}

TEST(Unicode, ClassesMatchTheRegexCategories) {
  using q4t::tok::char_class;
  EXPECT_TRUE(char_class(U'é').letter);
  EXPECT_TRUE(char_class(U'中').letter);
  EXPECT_TRUE(char_class(U'½').number);
  EXPECT_TRUE(char_class(0x3000).space);
  EXPECT_FALSE(char_class(0x1C).space) << "not White_Space, though Python's str.isspace says so";
  EXPECT_FALSE(char_class(0x0301).letter) << "combining marks are \\p{M}";
  EXPECT_TRUE(char_class(0x20000).letter) << "CJK extension B, outside the BMP table";
}

TEST(Unicode, PunctuationIsGeneralCategoryP) {
  using q4t::tok::char_class;
  EXPECT_TRUE(char_class('!').punct);
  EXPECT_TRUE(char_class(0x00AB).punct) << "« is Pi";
  EXPECT_TRUE(char_class(0x3002).punct) << "。 is Po";
  EXPECT_FALSE(char_class('$').punct) << "Sc is a symbol";
  EXPECT_FALSE(char_class(0x20AC).punct) << "€ is a symbol";
  EXPECT_FALSE(char_class('a').punct);
}

// llama.cpp's default pre-tokenizer: [\p{P}\$\+<=>\^~\|]+, then GPT-2's regex, then \p{N}+, then [0-9]{3}, each
// inside the words of the one before. A merge that would cross a word edge never applies, so the ids show it.
TEST(BpeDefault, DigitsGoInThreesFromTheLeftAndLoseTheirSpace) {
  const std::vector<std::string> merges = {"1 2", "12 3", "4 5", "45 6", G + " 1", "3 4"};
  const auto vocab = bpe_vocab({"12", "123", "45", "456", G + "1", "34"});
  auto t = make("gpt2", vocab, merges, "default");
  EXPECT_EQ(t->encode("1234567"), (Ids{257, 259, '7'})) << "123 456 7; \"3 4\" would cross a word edge";
  EXPECT_EQ(t->encode(" 1"), (Ids{' ', '1'})) << "\\p{N}+ cuts \" 1\" into \" \" and \"1\"";
  EXPECT_EQ(make("gpt2", vocab, merges, "gpt-2")->encode(" 1"), (Ids{260})) << "gpt-2 keeps the space";
}

TEST(BpeDefault, PunctuationRunsAreWordsOfTheirOwn) {
  const std::vector<std::string> merges = {G + " .", "! `", "$ +", "! ?"};
  const auto vocab = bpe_vocab({G + ".", "!`", "$+", "!?"});
  auto t = make("gpt2", vocab, merges, "default");
  EXPECT_EQ(t->encode(" ."), (Ids{' ', '.'})) << "the space does not join the punctuation";
  EXPECT_EQ(t->encode("!?"), (Ids{259}));
  EXPECT_EQ(t->encode("$+"), (Ids{258})) << "$ + < = > ^ ~ | count as punctuation";
  EXPECT_EQ(t->encode("!`"), (Ids{'!', '`'})) << "the backtick does not";
  auto g = make("gpt2", vocab, merges, "gpt-2");
  EXPECT_EQ(g->encode(" ."), (Ids{256}));
  EXPECT_EQ(g->encode("!`"), (Ids{257}));
}

TEST(BpeDefault, ContractionsAreCutAtTheApostrophe) {
  // The apostrophe is punctuation, so the first regex separates it before GPT-2's 's|'t|... can match.
  const auto vocab = bpe_vocab({"'s"});
  EXPECT_EQ(make("gpt2", vocab, {"' s"}, "default")->encode("it's"), (Ids{'i', 't', '\'', 's'}));
  EXPECT_EQ(make("gpt2", vocab, {"' s"}, "gpt-2")->encode("it's"), (Ids{'i', 't', 256}));
}

TEST(BpeDefault, WhitespaceRunsSplitAsInGpt2) {
  auto t = make("gpt2", bpe_vocab({G + G, G + "b"}), {G + " " + G, G + " b"}, "default");
  EXPECT_EQ(t->encode("a  b"), (Ids{'a', ' ', 257})) << "\"a\" \" \" \" b\"";
  EXPECT_EQ(t->encode("a   "), (Ids{'a', 256, ' '})) << "a trailing run is one word, merged from the left";
}

TEST(BpeDefault, IsWhatAFileWithoutPreTokenizerKeyGets) {
  const auto vocab = bpe_vocab({"'s"});
  auto t = make("gpt2", vocab, {"' s"}, "");
  EXPECT_EQ(t->encode("it's 1234"), make("gpt2", vocab, {"' s"}, "default")->encode("it's 1234"));
  EXPECT_EQ(t->encode("it's"), (Ids{'i', 't', '\'', 's'}));
}

// A vocabulary may mark as a byte token a text that names no byte; decoding it is a tokenizer error that names
// the token, not a number-parsing exception.
TEST(Spm, AByteTokenThatNamesNoByteIsAnErrorNamingTheToken) {
  auto t = make("llama", spm_vocab({{"<0xZZ>", 6}, {"<0x4G>", 6}, {"<0x41)", 6}}));
  EXPECT_EQ(t->decode(Ids{byte_id('A')}), "A");
  for (int32_t id : {kSpmExtra, kSpmExtra + 1, kSpmExtra + 2}) {
    try {
      t->decode(Ids{id});
      ADD_FAILURE() << "no error for token " << id;
    } catch (const TokenizerError& e) {
      EXPECT_EQ(std::string(e.what()), "token " + std::to_string(id) + " '" + t->token_text(id) +
                                           "' is a byte token, but its text is not <0x00>..<0xFF>");
    }
  }
}
