// The dataset pipeline: formats, loss masks, chat templates, batching, shuffling, the validation split, bad
// data, and the tokenized cache. Vocabularies are real GGUF files written by the tests (init-model's
// byte-level SentencePiece vocabulary, plus control tokens for the chat markers).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <iostream>
#include <fstream>
#include <set>
#include <sstream>

#include "data/chat_template.h"
#include "data/dataset.h"
#include "data/dataset_cache.h"
#include "data/gguf.h"
#include "data/tokenizer.h"
#include "data/unicode.h"
#include "train/commands.h"

namespace q4t::data {
namespace {

namespace fs = std::filesystem;
using gguf::Value;
using gguf::ValueType;

fs::path fresh_dir(const std::string& name) {
  fs::path d = fs::path(testing::TempDir()) / ("q4t_dataset_" + name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::string write(const fs::path& p, const std::string& body) {
  std::ofstream(p, std::ios::binary) << body;
  return p.string();
}

std::unique_ptr<tok::Tokenizer> load_tok(const std::string& gguf_path) {
  auto f = gguf::File::open(gguf_path);
  return tok::Tokenizer::from_gguf(*f);
}

// init-model's vocabulary: <unk>, <s>, </s>, <0x00>..<0xFF>.
std::unique_ptr<tok::Tokenizer> byte_tokenizer(const fs::path& dir) {
  InitModelOptions o;
  o.out = (dir / "tiny.gguf").string();
  std::ostringstream log;
  EXPECT_EQ(run_init_model(o, log), 0) << log.str();
  return load_tok(o.out);
}

// The same byte vocabulary with extra CONTROL tokens and a chat template: the markers of chat templates.
std::unique_ptr<tok::Tokenizer> chat_tokenizer(const fs::path& dir, const std::vector<std::string>& controls,
                                               const std::string& jinja) {
  std::vector<Value> tokens, scores, types;
  auto push = [&](const std::string& t, int32_t type) {
    tokens.push_back(Value::str(t));
    scores.push_back(Value::f32(0.0f));
    types.push_back(Value::i32(type));
  };
  push("<unk>", 2);
  push("<s>", 3);
  push("</s>", 3);
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    push(name, 6);
  }
  for (const auto& c : controls) push(c, 3);
  gguf::Writer w;
  w.set("general.architecture", Value::str("llama"));
  w.set("tokenizer.ggml.model", Value::str("llama"));
  w.set("tokenizer.ggml.tokens", Value::array(ValueType::STRING, std::move(tokens)));
  w.set("tokenizer.ggml.scores", Value::array(ValueType::F32, std::move(scores)));
  w.set("tokenizer.ggml.token_type", Value::array(ValueType::I32, std::move(types)));
  w.set("tokenizer.ggml.bos_token_id", Value::u32(1));
  w.set("tokenizer.ggml.eos_token_id", Value::u32(2));
  w.set("tokenizer.ggml.add_bos_token", Value::boolean(true));
  w.set("tokenizer.chat_template", Value::str(jinja));
  std::string path = (dir / "chat.gguf").string();
  w.write(path);
  return load_tok(path);
}

DatasetOptions opts(const fs::path& dir, int64_t seq_len = 64) {
  DatasetOptions o;
  o.seq_len = seq_len;
  o.use_cache = false;
  o.cache_dir = (dir / "cache").string();
  return o;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

const std::vector<chat::Message> kConversation = {
    {"system", "You are terse."}, {"user", "Hi"}, {"assistant", "Hello!"}, {"user", "Bye"}, {"assistant", "Bye!"}};

struct Rendered {
  std::string text, counted;
};

Rendered render(chat::Template t, const std::string& bos = "<s>", const std::string& eos = "</s>") {
  Rendered r;
  for (const auto& s : chat::render(t, kConversation, bos, eos)) {
    r.text += s.text;
    if (s.assistant) r.counted += s.text;
  }
  return r;
}

// generate --chat's prompt: for every family, the conversation up to the last user turn plus the assistant header
// is where the training rendering of the whole conversation continues with the answer, which ends with turn_end.
TEST(ChatTemplate, TheGenerationPromptIsWhereTheTrainedAnswerBegins) {
  const std::vector<chat::Message> asked(kConversation.begin(), kConversation.end() - 1);
  for (chat::Template t : {chat::Template::chatml, chat::Template::llama3, chat::Template::llama2,
                           chat::Template::mistral, chat::Template::zephyr, chat::Template::gemma,
                           chat::Template::phi3}) {
    const std::string full = render(t).text, prompt = chat::generation_prompt(t, asked, "<s>", "</s>");
    ASSERT_EQ(full.rfind(prompt, 0), 0u) << chat::template_name(t) << "\n" << prompt << "\n" << full;
    const std::string answer = full.substr(prompt.size()), end = chat::turn_end(t, "</s>");
    // llama2: "[/INST] Bye! </s>", the spaces belong to the answer.
    const std::string want = t == chat::Template::llama2 ? " Bye! " + end : "Bye!" + end;
    EXPECT_EQ(answer.rfind(want, 0), 0u) << chat::template_name(t) << ": " << answer;
  }
  EXPECT_EQ(chat::generation_prompt(chat::Template::chatml, {{"system", "S"}, {"user", "U"}}, "<s>", "</s>"),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(chat::turn_end(chat::Template::gemma, "</s>"), "<end_of_turn>");
  EXPECT_EQ(chat::turn_end(chat::Template::mistral, "</s>"), "</s>");
}

// Each family renders kConversation as its reference text; the counted bytes are the answers with their end
// markers.
struct RenderCase {
  chat::Template t;
  std::string bos, eos, text, counted;
};

const std::vector<RenderCase> kRenderCases = {
    {chat::Template::chatml, "<s>", "</s>",
     "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
     "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n"
     "<|im_start|>assistant\nBye!<|im_end|>\n",
     "Hello!<|im_end|>Bye!<|im_end|>"},
    {chat::Template::llama3, "<|begin_of_text|>", "<|end_of_text|>",
     "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|>"
     "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
     "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
     "<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>"
     "<|start_header_id|>assistant<|end_header_id|>\n\nBye!<|eot_id|>",
     "Hello!<|eot_id|>Bye!<|eot_id|>"},
    {chat::Template::llama2, "<s>", "</s>",
     "<s>[INST] <<SYS>>\nYou are terse.\n<</SYS>>\n\nHi [/INST] Hello! </s><s>[INST] Bye [/INST] Bye! </s>",
     "Hello! </s>Bye! </s>"},
    {chat::Template::mistral, "<s>", "</s>",
     "<s>[INST] You are terse.\n\nHi [/INST]Hello!</s>[INST] Bye [/INST]Bye!</s>", "Hello!</s>Bye!</s>"},
    {chat::Template::zephyr, "<s>", "</s>",
     "<|system|>\nYou are terse.</s>\n<|user|>\nHi</s>\n<|assistant|>\nHello!</s>\n"
     "<|user|>\nBye</s>\n<|assistant|>\nBye!</s>\n",
     "Hello!</s>Bye!</s>"},
    {chat::Template::gemma, "<bos>", "<eos>",
     "<bos><start_of_turn>user\nYou are terse.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n"
     "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\nBye!<end_of_turn>\n",
     "Hello!<end_of_turn>Bye!<end_of_turn>"},
    {chat::Template::phi3, "<s>", "</s>",
     "<|system|>\nYou are terse.<|end|>\n<|user|>\nHi<|end|>\n<|assistant|>\nHello!<|end|>\n"
     "<|user|>\nBye<|end|>\n<|assistant|>\nBye!<|end|>\n",
     "Hello!<|end|>Bye!<|end|>"},
};

class RendersAThreeTurnConversation : public ::testing::TestWithParam<RenderCase> {};

TEST_P(RendersAThreeTurnConversation, AsItsFamilyDoes) {
  const RenderCase& c = GetParam();
  Rendered r = render(c.t, c.bos, c.eos);
  EXPECT_EQ(r.text, c.text);
  EXPECT_EQ(r.counted, c.counted);
}

INSTANTIATE_TEST_SUITE_P(ChatTemplate, RendersAThreeTurnConversation, ::testing::ValuesIn(kRenderCases),
                         [](const ::testing::TestParamInfo<RenderCase>& info) {
                           return chat::template_name(info.param.t);
                         });

TEST(ChatTemplate, FamiliesAreRecognisedFromTheirJinjaText) {
  using chat::Template;
  EXPECT_EQ(chat::detect_template("{{'<|im_start|>' + message['role']}}"), Template::chatml);
  EXPECT_EQ(chat::detect_template("'<|start_header_id|>' + message['role'] + '<|end_header_id|>'"),
            Template::llama3);
  EXPECT_EQ(chat::detect_template("'[INST] ' + '<<SYS>>\\n' + system"), Template::llama2);
  EXPECT_EQ(chat::detect_template("'[INST] ' + message['content'] + ' [/INST]'"), Template::mistral);
  EXPECT_EQ(chat::detect_template("'<|user|>\\n' ... '<|assistant|>\\n' + eos_token"), Template::zephyr);
  EXPECT_EQ(chat::detect_template("'<start_of_turn>' + role"), Template::gemma);
  EXPECT_EQ(chat::detect_template("'<|user|>' + content + '<|end|>' '<|assistant|>'"), Template::phi3);
  EXPECT_EQ(chat::template_by_name("gemma"), Template::gemma);
}

TEST(ChatTemplate, UnknownTemplatesAreErrorsListingTheKnownNames) {
  std::string e = error_of([] { chat::template_by_name("vicuna"); });
  EXPECT_NE(e.find("unknown chat template 'vicuna'"), std::string::npos) << e;
  EXPECT_NE(e.find("chatml, llama3, llama2, mistral, zephyr, gemma, phi3"), std::string::npos) << e;
  e = error_of([] { chat::detect_template("{{ messages }}"); });
  EXPECT_NE(e.find("chatml, llama3"), std::string::npos) << e;
}

TEST(Dataset, JsonlTextCountsEveryTokenAfterBos) {
  fs::path d = fresh_dir("text");
  auto tok = byte_tokenizer(d);
  std::string f = write(d / "t.jsonl", "{\"text\": \"abc\"}\n\n{\"text\": \"de\"}\n");
  TokenizedFile tf = tokenize_file(f, *tok, opts(d));
  ASSERT_EQ(tf.examples.size(), 2u);
  const Example& e = tf.examples[0];
  std::vector<int32_t> want = {tok->bos()};
  for (int32_t id : tok->encode("abc")) want.push_back(id);
  want.push_back(tok->eos());
  EXPECT_EQ(e.ids, want);
  EXPECT_EQ(e.mask.front(), 0);
  for (size_t t = 1; t < e.mask.size(); ++t) EXPECT_EQ(e.mask[t], 1) << t;
}

TEST(Dataset, PromptCompletionCountsOnlyTheCompletionAndEos) {
  fs::path d = fresh_dir("pc");
  auto tok = byte_tokenizer(d);
  std::string f = write(d / "pc.jsonl", "{\"prompt\": \"Q: two plus two?\\nA:\", \"completion\": \" four\"}\n");
  TokenizedFile tf = tokenize_file(f, *tok, opts(d));
  ASSERT_EQ(tf.examples.size(), 1u);
  std::string shown = show_mask(*tok, tf.examples[0]);
  std::cout << "mask: " << shown << "\n";
  EXPECT_EQ(shown, "<s> Q: two plus two?\nA:[ four</s>]");

  DatasetOptions all = opts(d);
  all.train_on_prompt = true;
  shown = show_mask(*tok, tokenize_file(f, *tok, all).examples[0]);
  EXPECT_EQ(shown, "<s>[ Q: two plus two?\nA: four</s>]");
}

TEST(Dataset, ChatCountsOnlyAssistantTurnsWithTheirEndMarker) {
  fs::path d = fresh_dir("chat");
  auto tok = chat_tokenizer(d, {"<|im_start|>", "<|im_end|>"}, "{{ '<|im_start|>' + message['role'] }}");
  std::string f = write(d / "c.jsonl",
                        "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, "
                        "{\"role\": \"user\", \"content\": \"Hi\"}, {\"role\": \"assistant\", \"content\": \"Hey\"}]}\n");
  TokenizedFile tf = tokenize_file(f, *tok, opts(d, 256));
  ASSERT_EQ(tf.examples.size(), 1u);
  EXPECT_EQ(tf.n_truncated, 0);
  const Example& e = tf.examples[0];
  std::string shown = show_mask(*tok, e);
  std::cout << "mask: " << shown << "\n";
  // The SentencePiece space prefix follows every control token, as in llama.cpp.
  EXPECT_EQ(shown,
            "<s><|im_start|> system\nBe brief.<|im_end|> \n<|im_start|> user\nHi<|im_end|> \n"
            "<|im_start|> assistant\n[Hey<|im_end|>] \n");
  // The markers are single control tokens, not spelt out in bytes.
  int32_t im_end = tok->n_vocab() - 1;
  EXPECT_EQ(std::count(e.ids.begin(), e.ids.end(), im_end), 3);
}

TEST(Dataset, Llama3ChatFromTheGgufTemplateCountsAnswersWithEotId) {
  fs::path d = fresh_dir("llama3");
  auto tok = chat_tokenizer(d, {"<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"},
                            "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>' }}");
  std::string f = write(d / "c.jsonl",
                        "{\"messages\": [{\"role\": \"user\", \"content\": \" Hi \"}, "
                        "{\"role\": \"assistant\", \"content\": \"Yo\"}]}\n");
  const Example e = tokenize_file(f, *tok, opts(d, 256)).examples.at(0);
  EXPECT_EQ(std::count(e.ids.begin(), e.ids.end(), tok->bos()), 1);
  EXPECT_EQ(show_mask(*tok, e),
            "<s><|start_header_id|> user<|end_header_id|> \n\nHi<|eot_id|><|start_header_id|> assistant"
            "<|end_header_id|> \n\n[Yo<|eot_id|>]");
}

TEST(Dataset, Llama2ChatKeepsOneBosAndCountsTheAnswer) {
  fs::path d = fresh_dir("llama2");
  auto tok = chat_tokenizer(d, {}, "{{ bos_token + '[INST] ' + '<<SYS>>\\n' }}");
  std::string f = write(d / "c.jsonl",
                        "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}, "
                        "{\"role\": \"assistant\", \"content\": \"Yo\"}]}\n");
  const Example e = tokenize_file(f, *tok, opts(d)).examples.at(0);
  EXPECT_EQ(std::count(e.ids.begin(), e.ids.end(), tok->bos()), 1);
  EXPECT_EQ(e.ids.front(), tok->bos());
  EXPECT_EQ(e.ids.back(), tok->eos());
  EXPECT_EQ(show_mask(*tok, e), "<s> [INST] Hi [/INST] [Yo </s>]");
}

TEST(Dataset, TextFilesArePackedIntoOverlappingWindows) {
  fs::path d = fresh_dir("txt");
  auto tok = byte_tokenizer(d);
  std::string text = "The quick brown fox.\n\nJumps over the lazy dog.\n";
  std::string f = write(d / "t.txt", text);
  TokenizedFile tf = tokenize_file(f, *tok, opts(d, 8));
  std::vector<int32_t> stream = {tok->bos()};
  for (int32_t id : tok->encode(text)) stream.push_back(id);
  stream.push_back(tok->eos());
  ASSERT_EQ(tf.examples.size(), (stream.size() - 1 + 7) / 8);
  std::vector<int32_t> joined;
  for (size_t i = 0; i < tf.examples.size(); ++i) {
    const auto& ids = tf.examples[i].ids;
    EXPECT_LE(ids.size(), 9u);
    joined.insert(joined.end(), ids.begin() + (i == 0 ? 0 : 1), ids.end());
  }
  EXPECT_EQ(joined, stream);
  // Every token after the first is a label exactly once over an epoch.
  Dataset ds(tf.examples, opts(d, 8), tok->eos());
  EXPECT_EQ(ds.batch_at(0, int64_t(ds.size())).n_label_tokens(), int64_t(stream.size()) - 1);
}

std::unique_ptr<tok::Tokenizer> chatml_tokenizer(const fs::path& dir) {
  return chat_tokenizer(dir, {"<|im_start|>", "<|im_end|>"}, "{{ '<|im_start|>' + message['role'] }}");
}

void expect_same_examples(const TokenizedFile& got, const TokenizedFile& want) {
  ASSERT_EQ(got.examples.size(), want.examples.size());
  for (size_t i = 0; i < got.examples.size(); ++i) {
    EXPECT_EQ(got.examples[i].ids, want.examples[i].ids) << "example " << i;
    EXPECT_EQ(got.examples[i].mask, want.examples[i].mask) << "example " << i;
  }
}

TEST(Formats, AlpacaRecordsAreAUserTurnAndAnAssistantTurn) {
  fs::path d = fresh_dir("alpaca");
  auto tok = chatml_tokenizer(d);
  std::string alpaca = write(d / "a.jsonl",
                             "{\"instruction\": \"Add\", \"input\": \"2 and 3\", \"output\": \"5\"}\n"
                             "{\"instruction\": \"Say hi\", \"input\": \"\", \"output\": \"hi\"}\n"
                             "{\"instruction\": \"Say yo\", \"output\": \"yo\"}\n");
  std::string msgs = write(d / "m.jsonl",
                           "{\"messages\": [{\"role\": \"user\", \"content\": \"Add\\n\\n2 and 3\"}, "
                           "{\"role\": \"assistant\", \"content\": \"5\"}]}\n"
                           "{\"messages\": [{\"role\": \"user\", \"content\": \"Say hi\"}, "
                           "{\"role\": \"assistant\", \"content\": \"hi\"}]}\n"
                           "{\"messages\": [{\"role\": \"user\", \"content\": \"Say yo\"}, "
                           "{\"role\": \"assistant\", \"content\": \"yo\"}]}\n");
  DatasetOptions o = opts(d, 256);
  TokenizedFile a = tokenize_file(alpaca, *tok, o);
  expect_same_examples(a, tokenize_file(msgs, *tok, o));
  EXPECT_EQ(show_mask(*tok, a.examples.at(0)),
            "<s><|im_start|> user\nAdd\n\n2 and 3<|im_end|> \n<|im_start|> assistant\n[5<|im_end|>] \n");
  o.format.format = "alpaca";
  expect_same_examples(tokenize_file(alpaca, *tok, o), a);
  o.format.format = "auto";
  o.train_on_prompt = true;
  TokenizedFile all = tokenize_file(alpaca, *tok, o);
  expect_same_examples(all, tokenize_file(msgs, *tok, o));
  EXPECT_GT(std::count(all.examples[0].mask.begin(), all.examples[0].mask.end(), 1),
            std::count(a.examples[0].mask.begin(), a.examples[0].mask.end(), 1));
}

TEST(Formats, ShareGptConversationsMapHumanAndGptToUserAndAssistant) {
  fs::path d = fresh_dir("sharegpt");
  auto tok = chatml_tokenizer(d);
  std::string sharegpt = write(d / "s.jsonl",
                               "{\"conversations\": [{\"from\": \"system\", \"value\": \"Be brief.\"}, "
                               "{\"from\": \"human\", \"value\": \"Hi\"}, {\"from\": \"gpt\", \"value\": \"Hey\"}, "
                               "{\"from\": \"user\", \"value\": \"Bye\"}, {\"from\": \"assistant\", \"value\": \"Bye!\"}]}\n");
  std::string msgs = write(d / "m.jsonl",
                           "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, "
                           "{\"role\": \"user\", \"content\": \"Hi\"}, {\"role\": \"assistant\", \"content\": \"Hey\"}, "
                           "{\"role\": \"user\", \"content\": \"Bye\"}, {\"role\": \"assistant\", \"content\": \"Bye!\"}]}\n");
  DatasetOptions o = opts(d, 256);
  TokenizedFile s = tokenize_file(sharegpt, *tok, o);
  expect_same_examples(s, tokenize_file(msgs, *tok, o));
  EXPECT_EQ(show_mask(*tok, s.examples.at(0)),
            "<s><|im_start|> system\nBe brief.<|im_end|> \n<|im_start|> user\nHi<|im_end|> \n"
            "<|im_start|> assistant\n[Hey<|im_end|>] \n<|im_start|> user\nBye<|im_end|> \n"
            "<|im_start|> assistant\n[Bye!<|im_end|>] \n");
  o.format.format = "sharegpt";
  expect_same_examples(tokenize_file(sharegpt, *tok, o), s);
}

TEST(Formats, JsonArraysReadEachElementLikeAJsonlLine) {
  fs::path d = fresh_dir("jsonarray");
  auto tok = chatml_tokenizer(d);
  const std::vector<std::string> records = {
      "{\"text\": \"plain [text], {with} \\\"brackets\\\"\"}",
      "{\"prompt\": \"Q?\", \"completion\": \" A\"}",
      "{\"instruction\": \"Add\", \"input\": \"1 and 1\", \"output\": \"2\"}",
      "{\"conversations\": [{\"from\": \"human\", \"value\": \"Hi\"}, {\"from\": \"gpt\", \"value\": \"Yo\"}]}",
      "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}, {\"role\": \"assistant\", \"content\": \"Yo\"}]}"};
  std::string lines, array = "[\n";
  for (size_t i = 0; i < records.size(); ++i) {
    lines += records[i] + "\n";
    array += "  " + records[i] + (i + 1 < records.size() ? ",\n" : "\n");
  }
  array += "]\n";
  DatasetOptions o = opts(d, 256);
  TokenizedFile from_array = tokenize_file(write(d / "r.json", array), *tok, o);
  EXPECT_EQ(from_array.examples.size(), records.size());
  expect_same_examples(from_array, tokenize_file(write(d / "r.jsonl", lines), *tok, o));
}

TEST(Formats, FieldNamesAndTheFormatCanBeMapped) {
  fs::path d = fresh_dir("mapping");
  auto tok = chatml_tokenizer(d);
  DatasetOptions o = opts(d, 256);
  std::string turns = "[{\"role\": \"user\", \"content\": \"Hi\"}, {\"role\": \"assistant\", \"content\": \"Yo\"}]";
  TokenizedFile standard = tokenize_file(write(d / "standard.jsonl",
                                               "{\"text\": \"abc\"}\n{\"prompt\": \"Q?\", \"completion\": \" A\"}\n"
                                               "{\"messages\": " + turns + "}\n"),
                                         *tok, o);
  DatasetOptions mapped = o;
  mapped.format.text_field = "body";
  mapped.format.prompt_field = "q";
  mapped.format.completion_field = "a";
  mapped.format.messages_field = "dialog";
  std::string renamed = write(d / "renamed.jsonl",
                              "{\"body\": \"abc\"}\n{\"q\": \"Q?\", \"a\": \" A\"}\n{\"dialog\": " + turns + "}\n");
  expect_same_examples(tokenize_file(renamed, *tok, mapped), standard);

  // --messages-field also names the list of ShareGPT turns.
  mapped.format.format = "sharegpt";
  std::string sharegpt = write(d / "sharegpt.jsonl",
                               "{\"dialog\": [{\"from\": \"human\", \"value\": \"Hi\"}, {\"from\": \"gpt\", "
                               "\"value\": \"Yo\"}]}\n");
  const Example& chat = standard.examples.at(2);
  EXPECT_EQ(tokenize_file(sharegpt, *tok, mapped).examples.at(0).ids, chat.ids);

  // A fixed format reads its own fields even where auto would pick another shape.
  std::string both = write(d / "both.jsonl", "{\"messages\": " + turns + ", \"text\": \"abc\", \"prompt\": \"Q?\", "
                                             "\"completion\": \" A\"}\n");
  TokenizedFile auto_read = tokenize_file(both, *tok, o);
  EXPECT_EQ(auto_read.examples.at(0).ids, chat.ids);
  DatasetOptions fixed = o;
  fixed.format.format = "text";
  EXPECT_EQ(tokenize_file(both, *tok, fixed).examples.at(0).ids, standard.examples.at(0).ids);
  fixed.format.format = "completion";
  TokenizedFile pc = tokenize_file(both, *tok, fixed);
  EXPECT_EQ(pc.examples.at(0).ids, standard.examples.at(1).ids);
  EXPECT_EQ(pc.examples.at(0).mask, standard.examples.at(1).mask);
}

std::vector<Example> hand_examples() {
  return {{{10, 11, 12, 13}, {0, 0, 1, 1}}, {{20, 21, 22}, {0, 1, 1}}};
}

TEST(Batching, PaddedRowsMaskPaddingAndShiftLabels) {
  DatasetOptions o;
  o.seq_len = 5;
  Dataset ds(hand_examples(), o, 2);
  Batch b = ds.batch_at(0, 2);
  ASSERT_EQ(b.B, 2);
  ASSERT_EQ(b.T, 5);
  EXPECT_EQ(b.ids, (std::vector<int32_t>{10, 11, 12, 2, 2, 20, 21, 2, 2, 2}));
  EXPECT_EQ(b.labels, (std::vector<int32_t>{-100, 12, 13, -100, -100, 21, 22, -100, -100, -100}));
  EXPECT_EQ(b.attn_mask, (std::vector<uint8_t>{1, 1, 1, 0, 0, 1, 1, 0, 0, 0}));
  EXPECT_EQ(b.segment_ids, (std::vector<int32_t>{1, 1, 1, 0, 0, 1, 1, 0, 0, 0}));
  EXPECT_EQ(b.positions, (std::vector<int32_t>{0, 1, 2, 0, 0, 0, 1, 0, 0, 0}));
}

TEST(Batching, PackedRowsKeepExamplesApartWithSegmentsAndPositions) {
  DatasetOptions o;
  o.seq_len = 6;
  o.pack = true;
  Dataset ds(hand_examples(), o, 2);
  ASSERT_EQ(ds.size(), 1u);
  Batch b = ds.batch_at(0, 1);
  EXPECT_EQ(b.ids, (std::vector<int32_t>{10, 11, 12, 20, 21, 2}));
  EXPECT_EQ(b.labels, (std::vector<int32_t>{-100, 12, 13, 21, 22, -100}));
  EXPECT_EQ(b.attn_mask, (std::vector<uint8_t>{1, 1, 1, 1, 1, 0}));
  EXPECT_EQ(b.segment_ids, (std::vector<int32_t>{1, 1, 1, 2, 2, 0}));
  EXPECT_EQ(b.positions, (std::vector<int32_t>{0, 1, 2, 0, 1, 0}));
  o.seq_len = 4;  // 3 + 2 positions no longer fit one row
  EXPECT_EQ(Dataset(hand_examples(), o, 2).size(), 2u);
}

std::vector<Example> numbered_examples(int n) {
  std::vector<Example> ex;
  for (int i = 0; i < n; ++i) ex.push_back({{100 + i, 200 + i}, {0, 1}});
  return ex;
}

std::vector<int32_t> first_ids(Dataset& ds, int batches) {
  std::vector<int32_t> out;
  for (int i = 0; i < batches; ++i) out.push_back(ds.next_batch(1).ids[0]);
  return out;
}

TEST(Shuffle, IsDeterministicPerSeedAndCoversEveryRowEachEpoch) {
  DatasetOptions o;
  o.seq_len = 4;
  Dataset a(numbered_examples(20), o, 2), b(numbered_examples(20), o, 2);
  std::vector<int32_t> ra = first_ids(a, 40), rb = first_ids(b, 40);
  EXPECT_EQ(ra, rb);
  EXPECT_EQ(std::set<int32_t>(ra.begin(), ra.begin() + 20).size(), 20u);
  EXPECT_EQ(std::set<int32_t>(ra.begin() + 20, ra.end()).size(), 20u);
  EXPECT_NE(std::vector<int32_t>(ra.begin(), ra.begin() + 20), std::vector<int32_t>(ra.begin() + 20, ra.end()));
  o.seed = 7;
  Dataset c(numbered_examples(20), o, 2);
  EXPECT_NE(first_ids(c, 20), std::vector<int32_t>(ra.begin(), ra.begin() + 20));
}

TEST(Shuffle, ARestoredCursorResumesExactly) {
  DatasetOptions o;
  o.seq_len = 4;
  Dataset a(numbered_examples(9), o, 2);
  first_ids(a, 13);
  Cursor c = a.cursor();
  EXPECT_EQ(c.epoch, 1u);
  EXPECT_EQ(c.index, 4u);
  std::vector<int32_t> rest = first_ids(a, 12);
  Dataset b(numbered_examples(9), o, 2);
  b.set_cursor(c);
  EXPECT_EQ(first_ids(b, 12), rest);
  c.seed = 99;
  EXPECT_NE(error_of([&] { b.set_cursor(c); }).find("seed 99"), std::string::npos);
}

std::string numbered_jsonl(int n) {
  std::string s;
  for (int i = 0; i < n; ++i) s += "{\"text\": \"example " + std::to_string(i) + "\"}\n";
  return s;
}

TEST(Split, ValidationFractionIsDeterministicAndDisjoint) {
  fs::path d = fresh_dir("split");
  auto tok = byte_tokenizer(d);
  std::string f = write(d / "s.jsonl", numbered_jsonl(8));
  DatasetOptions o = opts(d);
  o.val_fraction = 0.25;
  std::ostringstream log;
  Datasets a = load_datasets(f, *tok, o, log), b = load_datasets(f, *tok, o, log);
  ASSERT_TRUE(a.val.has_value());
  EXPECT_EQ(a.train.examples().size(), 6u);
  EXPECT_EQ(a.val->examples().size(), 2u);
  std::set<std::vector<int32_t>> seen;
  for (const auto& e : a.train.examples()) seen.insert(e.ids);
  for (const auto& e : a.val->examples()) seen.insert(e.ids);
  EXPECT_EQ(seen.size(), 8u);
  for (size_t i = 0; i < 2; ++i) EXPECT_EQ(a.val->examples()[i].ids, b.val->examples()[i].ids);
  EXPECT_NE(log.str().find("validation split: 2 examples"), std::string::npos) << log.str();
}

TEST(Split, ASeparateValidationFileIsUsedWhole) {
  fs::path d = fresh_dir("valfile");
  auto tok = byte_tokenizer(d);
  DatasetOptions o = opts(d);
  o.val_file = write(d / "v.jsonl", numbered_jsonl(3));
  o.val_fraction = 0.5;
  std::ostringstream log;
  Datasets ds = load_datasets(write(d / "t.jsonl", numbered_jsonl(5)), *tok, o, log);
  EXPECT_EQ(ds.train.examples().size(), 5u);
  ASSERT_TRUE(ds.val.has_value());
  EXPECT_EQ(ds.val->examples().size(), 3u);
}

// Each bad file gives one error that names the file and line and says what is wrong.
TEST(BadData, EveryCaseNamesFileAndLine) {
  fs::path d = fresh_dir("bad");
  auto tok = byte_tokenizer(d);
  auto err = [&](const std::string& name, const std::string& body, DatasetOptions o) {
    std::string f = write(d / name, body);
    return error_of([&] { tokenize_file(f, *tok, o); });
  };
  DatasetOptions o = opts(d, 16);
  std::string p = (d / "").string();
  std::string e = err("a.jsonl", "{\"text\": \"ok\"}\n{\"text\": \"ok\"\n", o);
  EXPECT_EQ(e.rfind(p + "a.jsonl:2: malformed JSON", 0), 0u) << e;
  e = err("b.jsonl", "{\"text\": \"ok\"}\n\n{\"prompt\": \"p\"}\n", o);
  EXPECT_EQ(e, p + "b.jsonl:3: missing field 'completion'");
  e = err("c.jsonl", "{\"text\": 5}\n", o);
  EXPECT_EQ(e, p + "c.jsonl:1: field 'text' is number, expected a string");
  e = err("d.jsonl", "", o);
  EXPECT_EQ(e, p + "d.jsonl: no examples (the file is empty)");
  e = err("e.txt", "\n\n", o);
  EXPECT_EQ(e, p + "e.txt: the file is empty");
  e = err("f.jsonl", "{\"title\": \"x\"}\n", o);
  EXPECT_EQ(e, p + "f.jsonl:1: expected a field 'text', 'prompt' + 'completion', 'messages', 'conversations' or "
                   "'instruction' + 'output'");
  e = err("g.jsonl", "[1, 2]\n", o);
  EXPECT_EQ(e, p + "g.jsonl:1: expected a JSON object, got array");
  e = err("h.jsonl", "{\"messages\": [{\"role\": \"user\", \"content\": 3}]}\n", o);
  EXPECT_EQ(e, p + "h.jsonl:1: messages[0]: field 'content' is number, expected a string");
  o.chat_template = "vicuna";
  e = err("i.jsonl", "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}\n", o);
  EXPECT_NE(e.find("i.jsonl:1: unknown chat template 'vicuna'; known: chatml, llama3"), std::string::npos) << e;
  o.chat_template = "";
  e = err("j.jsonl", "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}\n", o);
  EXPECT_NE(e.find("j.jsonl:1: the model has no tokenizer.chat_template"), std::string::npos) << e;
  o.chat_template = "mistral";
  e = err("k.jsonl", "{\"messages\": [{\"role\": \"assistant\", \"content\": \"x\"}]}\n", o);
  EXPECT_NE(e.find("k.jsonl:1: the mistral template needs user and assistant turns alternating"),
            std::string::npos) << e;
}

TEST(BadData, LongExamplesAreTruncatedAndCountedOrRejected) {
  fs::path d = fresh_dir("long");
  auto tok = byte_tokenizer(d);
  std::string f = write(d / "l.jsonl", "{\"text\": \"short\"}\n{\"text\": \"" + std::string(40, 'x') + "\"}\n");
  DatasetOptions o = opts(d, 16);
  TokenizedFile tf = tokenize_file(f, *tok, o);
  EXPECT_EQ(tf.n_truncated, 1);
  EXPECT_EQ(tf.examples[1].ids.size(), 17u);
  std::ostringstream log;
  load_datasets(f, *tok, o, log);
  EXPECT_NE(log.str().find("1 truncated to the context"), std::string::npos) << log.str();
  o.no_truncate = true;
  std::string e = error_of([&] { tokenize_file(f, *tok, o); });
  // BOS + "▁" (the dummy prefix, one token) + 40 x + EOS = 43
  EXPECT_EQ(e, f + ":2: example has 43 tokens, more than the context of 16 + 1 (no_truncate is set)");
}

TEST(BadData, FormatErrorsNameTheFileTheLineTheRecordAndTheField) {
  fs::path d = fresh_dir("badformat");
  auto tok = chatml_tokenizer(d);
  DatasetOptions o = opts(d, 64);
  auto err = [&](const std::string& name, const std::string& body, const DatasetOptions& with) {
    std::string f = write(d / name, body);
    return error_of([&] { tokenize_file(f, *tok, with); });
  };
  std::string p = (d / "").string();
  std::string e = err("a.jsonl",
                      "{\"conversations\": [{\"from\": \"human\", \"value\": \"Hi\"}, {\"from\": \"gpt\", \"value\": "
                      "\"Yo\"}]}\n{\"conversations\": [{\"from\": \"human\", \"value\": \"Hi\"}, {\"from\": \"bot\", "
                      "\"value\": \"Yo\"}]}\n",
                      o);
  EXPECT_EQ(e, p + "a.jsonl:2: conversations[1]: unknown 'from' value 'bot'; accepted: system, human, user, gpt, "
                   "assistant");
  e = err("b.jsonl", "{\"instruction\": \"Add\", \"input\": \"1 and 1\"}\n", o);
  EXPECT_EQ(e, p + "b.jsonl:1: missing field 'output'");
  e = err("c.jsonl", "{\"instruction\": \"Add\", \"input\": 7, \"output\": \"2\"}\n", o);
  EXPECT_EQ(e, p + "c.jsonl:1: field 'input' is number, expected a string");

  DatasetOptions sharegpt = o;
  sharegpt.format.format = "sharegpt";
  e = err("d.jsonl", "{\"conversations\": [{\"role\": \"user\", \"content\": \"Hi\"}]}\n", sharegpt);
  EXPECT_EQ(e, p + "d.jsonl:1: conversations[0]: missing field 'from'");
  e = err("e.jsonl", "{\"messages\": []}\n", sharegpt);
  EXPECT_EQ(e, p + "e.jsonl:1: missing field 'conversations'");

  DatasetOptions mapped = o;
  mapped.format.format = "completion";
  mapped.format.prompt_field = "question";
  e = err("f.jsonl", "{\"text\": \"x\"}\n{\"prompt\": \"p\", \"completion\": \"c\"}\n", mapped);
  EXPECT_EQ(e, p + "f.jsonl:1: missing field 'question'");
  mapped.format.format = "text";
  mapped.format.text_field = "body";
  e = err("g.jsonl", "{\"text\": \"x\"}\n", mapped);
  EXPECT_EQ(e, p + "g.jsonl:1: missing field 'body'");
  mapped.format.format = "chat";
  mapped.format.messages_field = "dialog";
  e = err("h.jsonl", "{\"dialog\": \"hello\"}\n", mapped);
  EXPECT_EQ(e, p + "h.jsonl:1: field 'dialog' is string, expected an array of {\"role\", \"content\"} objects");
  mapped.format.format = "xml";
  e = err("i.jsonl", "{\"text\": \"x\"}\n", mapped);
  EXPECT_EQ(e, "unknown data format 'xml'; known: auto, text, completion, chat, alpaca, sharegpt");

  e = err("j.json", "{\"text\": \"x\"}\n", o);
  EXPECT_EQ(e, p + "j.json: expected a top-level JSON array of records, got object (a file of one record per line "
                   "is read as .jsonl)");
  // The line of a record is found past strings holding brackets, commas and escaped quotes.
  e = err("k.json", "[\n  {\"text\": \"a [x], {y} \\\"q\\\" \\\\\"},\n  {\"text\": \"b\"},\n\n  {\"prompt\": \"p\"}\n]\n", o);
  EXPECT_EQ(e, p + "k.json:5: record [2]: missing field 'completion'");
  e = err("l.json", "[{\"text\": \"a\"}, 3]", o);
  EXPECT_EQ(e, p + "l.json:1: record [1]: expected a JSON object, got number");
  e = err("m.json", "[{\"text\": \"a\"},\n", o);
  EXPECT_EQ(e.rfind(p + "m.json: malformed JSON", 0), 0u) << e;
  e = err("n.json", " [ ]\n", o);
  EXPECT_EQ(e, p + "n.json: no examples (the array is empty)");
  e = err("o.csv", "text\nx\n", o);
  EXPECT_EQ(e, p + "o.csv: unknown dataset format; expected a .txt, .jsonl or .json file");
}

TEST(Cache, SecondLoadHitsAndCorruptionIsRebuilt) {
  fs::path d = fresh_dir("cache");
  auto tok = byte_tokenizer(d);
  std::string f = write(d / "c.jsonl", numbered_jsonl(5));
  DatasetOptions o = opts(d);
  o.use_cache = true;
  std::ostringstream log;
  TokenizedFile first = load_tokenized(f, *tok, o, log);
  EXPECT_FALSE(first.from_cache);
  TokenizedFile second = load_tokenized(f, *tok, o, log);
  EXPECT_TRUE(second.from_cache);
  ASSERT_EQ(second.examples.size(), first.examples.size());
  for (size_t i = 0; i < first.examples.size(); ++i) {
    EXPECT_EQ(second.examples[i].ids, first.examples[i].ids);
    EXPECT_EQ(second.examples[i].mask, first.examples[i].mask);
  }

  std::string entry = cache_entry_path(f, *tok, o);
  {
    std::fstream io(entry, std::ios::in | std::ios::out | std::ios::binary);
    io.seekp(60);
    io.put('\x7f');
  }
  TokenizedFile rebuilt = load_tokenized(f, *tok, o, log);
  EXPECT_FALSE(rebuilt.from_cache);
  EXPECT_NE(log.str().find("is corrupt (checksum mismatch); rebuilding it"), std::string::npos) << log.str();
  EXPECT_TRUE(load_tokenized(f, *tok, o, log).from_cache);

  fs::resize_file(entry, fs::file_size(entry) - 3);
  EXPECT_FALSE(load_tokenized(f, *tok, o, log).from_cache);
  EXPECT_TRUE(load_tokenized(f, *tok, o, log).from_cache);
}

TEST(Cache, KeyChangesWithTheTokenizerTheOptionsAndTheFile) {
  fs::path d = fresh_dir("cachekey");
  auto tok = byte_tokenizer(d);
  auto other = chat_tokenizer(d, {"<|im_start|>"}, "");
  std::string f = write(d / "c.jsonl", numbered_jsonl(2));
  DatasetOptions o = opts(d);
  std::string base = cache_entry_path(f, *tok, o);
  EXPECT_EQ(cache_entry_path(f, *tok, o), base);
  EXPECT_NE(cache_entry_path(f, *other, o), base);
  DatasetOptions longer = o;
  longer.seq_len = 128;
  EXPECT_NE(cache_entry_path(f, *tok, longer), base);
  DatasetOptions prompt = o;
  prompt.train_on_prompt = true;
  EXPECT_NE(cache_entry_path(f, *tok, prompt), base);
  write(d / "c.jsonl", numbered_jsonl(3));
  EXPECT_NE(cache_entry_path(f, *tok, o), base);
}

TEST(Cache, KeyChangesWithTheDataFormatAndEachFieldName) {
  fs::path d = fresh_dir("cachekeyformat");
  auto tok = byte_tokenizer(d);
  std::string f = write(d / "c.jsonl", numbered_jsonl(2));
  DatasetOptions o = opts(d);
  std::set<std::string> entries = {cache_entry_path(f, *tok, o)};
  const std::vector<std::function<void(DataFormat&)>> changes = {
      [](DataFormat& m) { m.format = "text"; },           [](DataFormat& m) { m.text_field = "body"; },
      [](DataFormat& m) { m.prompt_field = "q"; },        [](DataFormat& m) { m.completion_field = "a"; },
      [](DataFormat& m) { m.messages_field = "dialog"; }};
  for (const auto& change : changes) {
    DatasetOptions changed = o;
    change(changed.format);
    entries.insert(cache_entry_path(f, *tok, changed));
  }
  EXPECT_EQ(entries.size(), changes.size() + 1);
  // A .json file of the same records has its own entry.
  std::string array = write(d / "c.json", "[{\"text\": \"example 0\"}, {\"text\": \"example 1\"}]");
  EXPECT_EQ(entries.count(cache_entry_path(array, *tok, o)), 0u);
}

TEST(Batching, PaddingReportGivesTheRealShareAndWhenPackingHelps) {
  DatasetOptions o;
  o.seq_len = 5;  // 3 + 2 input positions in 2 rows of 5
  EXPECT_EQ(padding_report(Dataset(hand_examples(), o, 2)),
            "rows: 50% real tokens, 50% padding (--pack would fit the same data in about 1 row instead of 2)");
  o.seq_len = 4;  // 3 + 2 of 8: packing would not fit both examples in one row, so no advice
  EXPECT_EQ(padding_report(Dataset(hand_examples(), o, 2)), "rows: 63% real tokens, 37% padding");
  o.seq_len = 3;  // 3 + 2 of 6: above the 75% where packing is advised
  EXPECT_EQ(padding_report(Dataset(hand_examples(), o, 2)), "rows: 83% real tokens, 17% padding");
  o.seq_len = 6;
  o.pack = true;
  EXPECT_EQ(padding_report(Dataset(hand_examples(), o, 2)), "rows (packed): 83% real tokens, 17% padding");
  o.seq_len = 4;  // packed, yet one example per row
  EXPECT_EQ(padding_report(Dataset(hand_examples(), o, 2)), "rows (packed): 63% real tokens, 37% padding");
}

// GPT-2's byte alphabet (id = byte) plus the chatml markers: the byte-level BPE side of the text checks.
std::unique_ptr<tok::Tokenizer> bpe_chat_tokenizer(const fs::path& dir) {
  std::vector<Value> tokens, types;
  for (int b = 0; b < 256; ++b) {
    tokens.push_back(Value::str(tok::byte_to_unicode(uint8_t(b))));
    types.push_back(Value::i32(1));
  }
  for (const char* c : {"<|im_start|>", "<|im_end|>", "<|endoftext|>"}) {
    tokens.push_back(Value::str(c));
    types.push_back(Value::i32(3));
  }
  gguf::Writer w;
  w.set("general.architecture", Value::str("qwen2"));
  w.set("tokenizer.ggml.model", Value::str("gpt2"));
  w.set("tokenizer.ggml.pre", Value::str("qwen2"));
  w.set("tokenizer.ggml.tokens", Value::array(ValueType::STRING, std::move(tokens)));
  w.set("tokenizer.ggml.token_type", Value::array(ValueType::I32, std::move(types)));
  w.set("tokenizer.ggml.merges", Value::array(ValueType::STRING, {}));
  w.set("tokenizer.ggml.eos_token_id", Value::u32(257));
  std::string path = (dir / "bpe.gguf").string();
  w.write(path);
  return load_tok(path);
}

// "▁" is how SentencePiece writes a space, and <unk> is a token's name, but in a user's text both are ordinary
// characters: every record below trains, and the answer's tokens are the ones counted.
TEST(BadData, SpaceMarksAndUnkInTheTextAreOrdinaryText) {
  fs::path d = fresh_dir("marks");
  const std::string mark = "\xE2\x96\x81";
  const std::string body = "{\"text\": \"a" + mark + "b " + mark + mark + " c\"}\n"
                           "{\"prompt\": \"say " + mark + "\", \"completion\": \" <unk> " + mark + "\"}\n"
                           "{\"messages\": [{\"role\": \"user\", \"content\": \"x <unk> " + mark + "y\"}, "
                           "{\"role\": \"assistant\", \"content\": \"<unk>" + mark + " z\"}]}\n";
  std::string f = write(d / "m.jsonl", body);
  DatasetOptions o = opts(d, 256);
  o.chat_template = "chatml";
  auto spm = chat_tokenizer(d, {"<|im_start|>", "<|im_end|>"}, "");
  auto bpe = bpe_chat_tokenizer(d);
  for (const tok::Tokenizer* t : {spm.get(), bpe.get()}) {
    TokenizedFile tf;
    ASSERT_NO_THROW(tf = tokenize_file(f, *t, o));
    ASSERT_EQ(tf.examples.size(), 3u);
    const std::string chat = show_mask(*t, tf.examples[2]);
    std::cout << "chat mask: " << chat << "\n";
    // The answer is counted from its first token (<unk>, which SentencePiece renders as "▅") to its end
    // marker, and nothing of the user's turn is.
    EXPECT_NE(chat.find(t == spm.get() ? "[\xE2\x96\x85" : "[<unk>"), std::string::npos) << chat;
    EXPECT_NE(chat.find("z<|im_end|>]"), std::string::npos) << chat;
    EXPECT_EQ(chat.find('['), chat.rfind('[')) << chat;
  }
  // The <unk> of a chat turn is the single unknown token of the vocabulary (parsed as a special token, as
  // llama.cpp does), and it is counted in the answer.
  const Example& e = tokenize_file(f, *spm, o).examples[2];
  EXPECT_EQ(std::count(e.ids.begin(), e.ids.end(), 0), 2);
}

// A JSONL record beyond the 64 MiB bound stops the reader at that line, before the rest of it is read; lines of
// every length up to it (across the reader's 64 KiB chunks) read as before.
TEST(BadData, AHugeRecordIsRefusedNamingItsLine) {
  fs::path d = fresh_dir("huge");
  auto tok = byte_tokenizer(d);
  std::string p = (d / "").string();
  std::string f = write(d / "h.jsonl", "{\"text\": \"ok\"}\n{\"text\": \"" + std::string((size_t(64) << 20) + 10, 'y') +
                                           "\"}\n{\"text\": \"after\"}\n");
  EXPECT_EQ(error_of([&] { tokenize_file(f, *tok, opts(d)); }),
            p + "h.jsonl:2: a record of more than 64 MiB; one example is at most that (and keeps at most --seq-len "
                "tokens)");
  std::string body;
  for (size_t n : {size_t(0), size_t(65521), size_t(65522), size_t(65523), size_t(200000)})
    body += "{\"text\": \"" + std::string(n, 'z') + "x\"}\n";
  f = write(d / "edges.jsonl", body + "{\"text\": \"last line, no newline\"}");
  DatasetOptions o = opts(d, 300000);
  const TokenizedFile tf = tokenize_file(f, *tok, o);
  ASSERT_EQ(tf.examples.size(), 6u);
  EXPECT_EQ(tf.examples[2].ids.size(), 65522u + 4);  // a byte token each, the space prefix, BOS and EOS
  EXPECT_EQ(show_mask(*tok, tf.examples[5]), "<s>[ last line, no newline</s>]");
}

// A number a double cannot hold is one line naming the file and the line, and a long one is not echoed whole.
TEST(BadData, NumbersBeyondADoubleNameTheLineAndAreCutShort) {
  fs::path d = fresh_dir("overflow");
  auto tok = byte_tokenizer(d);
  std::string p = (d / "").string();
  std::string f = write(d / "n.jsonl", "{\"text\": \"ok\"}\n{\"text\": \"ok\", \"weight\": 1e999}\n");
  EXPECT_EQ(error_of([&] { tokenize_file(f, *tok, opts(d)); }),
            p + "n.jsonl:2: a number beyond the range of a double (number overflow parsing '1e999')");
  f = write(d / "long.jsonl", "{\"text\": \"ok\", \"n\": 1" + std::string(5000, '7') + "e999}\n");
  std::string e = error_of([&] { tokenize_file(f, *tok, opts(d)); });
  EXPECT_EQ(e.rfind(p + "long.jsonl:1: a number beyond the range of a double (number overflow parsing '1777", 0), 0u)
      << e;
  EXPECT_LT(e.size(), p.size() + 150) << e;
  f = write(d / "a.json", "[{\"text\": \"ok\", \"w\": -1e400}]");
  EXPECT_EQ(error_of([&] { tokenize_file(f, *tok, opts(d)); }),
            p + "a.json: a number beyond the range of a double (number overflow parsing '-1e400')");
}

}  // namespace
}  // namespace q4t::data
