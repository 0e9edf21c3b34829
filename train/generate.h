// Text generation: sampling (temperature, top-k, top-p, seed) over a Decoder, streaming each piece of text as
// soon as it is complete UTF-8; `q4tune generate` on top of it, and the call a trainer makes to print a sample
// with the adapters it is training:
//   model::Decoder dec(model, model::adapter_weights(model_graph), /*max_context=*/512);  // once
//   generate(dec, tokenizer, "Once upon a time", sample_options, &std::cout);              // at every sample
// (the decoder shares the adapters' tensors, so each sample sees the current weights).
#pragma once
#include <cstdint>
#include <iosfwd>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "data/chat_template.h"
#include "data/tokenizer.h"
#include "train/model/decoder.h"

namespace q4t {

struct DeviceChoice;

struct SampleOptions {
  int64_t max_tokens = 128;  // new tokens at most
  double temperature = 0.8;  // 0: greedy (the highest logit, the lowest id among ties)
  int64_t top_k = 40;        // keep the k most likely tokens; 0: all
  double top_p = 0.95;       // then the smallest set of them whose probability reaches p; 1: all
  uint64_t seed = 42;        // the same seed, model and prompt give the same text
  bool stop_at_eos = true;
};

// Throws std::invalid_argument naming the option that is out of range.
void check_sample_options(const SampleOptions& o);

// The next token for logits [V]: temperature 0 is the argmax; otherwise the logits are divided by the temperature,
// cut to top-k, softmaxed (in double), cut to top-p, and one token is drawn with 53 bits of rng.
int32_t sample_token(std::span<const float> logits, const SampleOptions& o, std::mt19937_64& rng);

// The length of the longest prefix of s that does not end inside a multi-byte UTF-8 character.
size_t complete_utf8_prefix(const std::string& s);

struct Generation {
  std::vector<int32_t> prompt_ids;  // BOS first when the tokenizer adds one
  std::vector<int32_t> ids;         // the generated tokens, EOS included when it stopped there
  std::string text;                 // the generated text (the continuation, without the prompt)
  bool stopped_at_eos = false;
  bool stopped_at_stop = false;     // the text reached PromptOptions::stop (not part of text)
};

struct PromptOptions {
  bool parse_special = false;  // control tokens written in the prompt ("<|im_start|>") are read as such
  std::string stop;            // generation ends where the text would contain this (a chat turn's end marker)
};

// The prompt's ids: BOS first when tok.add_bos() (unless the text's first token is BOS), then the text's. Throws
// std::length_error when they do not fit in dec's context (and std::invalid_argument when there are none).
std::vector<int32_t> encode_prompt(const tok::Tokenizer& tok, const std::string& prompt, const model::Decoder& dec,
                                   bool parse_special = false);

// A conversation (ending with a user message) as the prompt of the assistant's next turn in template t, with
// tok's BOS and EOS texts, and the options that read its control tokens and end the generation with the turn.
struct ChatPrompt {
  std::string text;
  PromptOptions options;
};
ChatPrompt chat_prompt(chat::Template t, const tok::Tokenizer& tok, const std::vector<chat::Message>& msgs);

// Resets dec and feeds it the prompt (encode_prompt), then samples up to o.max_tokens tokens (fewer when EOS comes
// or the context is full, or the text reaches p.stop). Each piece of text goes to *stream (when given) as soon as
// it forms complete UTF-8 characters that cannot be the start of p.stop.
Generation generate(model::Decoder& dec, const tok::Tokenizer& tok, const std::string& prompt, const SampleOptions& o,
                    std::ostream* stream = nullptr, const PromptOptions& p = {});

struct GenerateOptions {
  std::string model, prompt, adapter;
  std::string run;  // a training run's --out (or a checkpoint): its model, chat template and newest adapters
  double adapter_scale = 1.0;
  int64_t seq_len = 0;  // context: prompt + generated tokens; 0: the model's context length
  // Chat: the prompt is a user message in the chat template (chat_template, else the adapter's or run's, else
  // the model's), after a system message when `system` is given; with no prompt, user messages come from
  // `input`, one per line, and the conversation is kept.
  bool chat = false;
  std::string system, chat_template;
  SampleOptions sample;
  std::string device = "auto";  // as --device of the other commands (see choose_device)
  std::string precision = "auto";  // as --precision of the other commands (DeviceChoice::set_precision)
  int threads = 0;              // CPU worker threads; 0: one per core
};
// q4tune generate on dev: prints the prompt, then the generated text as it comes, then a newline. With o.chat,
// prints only the assistant's replies; an interactive chat reads user lines from `input` until its end.
int run_generate(const GenerateOptions& o, const DeviceChoice& dev, std::ostream& out, std::istream& input);
// The same on the device that o.device and o.threads name, reading std::cin.
int run_generate(const GenerateOptions& o, std::ostream& out);

}  // namespace q4t
