#include "train/generate.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <numeric>
#include <optional>
#include <ostream>
#include <sstream>
#include <stdexcept>

#include "data/chat_template.h"
#include "kernels/cpu/threads.h"
#include "train/device_choice.h"
#include "train/export.h"
#include "train/memory_estimate.h"
#include "train/run_log.h"
#include "train/train.h"

namespace q4t {

namespace {

std::string number(double x) {
  std::ostringstream s;
  s << x;
  return s.str();
}

// Higher logit first, then the lower id: the order top-k keeps and greedy takes the first of.
struct ByLogit {
  std::span<const float> logits;
  bool operator()(int32_t a, int32_t b) const {
    return logits[size_t(a)] > logits[size_t(b)] || (logits[size_t(a)] == logits[size_t(b)] && a < b);
  }
};

}  // namespace

void check_sample_options(const SampleOptions& o) {
  if (o.max_tokens < 0) throw std::invalid_argument("--max-tokens must be non-negative, not " + std::to_string(o.max_tokens));
  if (!(o.temperature >= 0) || !std::isfinite(o.temperature))
    throw std::invalid_argument("--temperature must be a non-negative number, not " + number(o.temperature));
  if (o.top_k < 0) throw std::invalid_argument("--top-k must be non-negative (0: off), not " + std::to_string(o.top_k));
  if (!(o.top_p > 0 && o.top_p <= 1))
    throw std::invalid_argument("--top-p must lie in (0, 1] (1: off), not " + number(o.top_p));
}

int32_t sample_token(std::span<const float> logits, const SampleOptions& o, std::mt19937_64& rng) {
  const size_t V = logits.size();
  if (V == 0) throw std::invalid_argument("sample_token: no logits");
  for (float x : logits)
    if (!std::isfinite(x)) throw std::runtime_error("the model produced a non-finite logit; cannot sample");
  if (o.temperature == 0) {
    int32_t best = 0;
    for (size_t i = 1; i < V; ++i)
      if (logits[i] > logits[size_t(best)]) best = int32_t(i);
    return best;
  }
  const size_t k = o.top_k > 0 ? std::min(V, size_t(o.top_k)) : V;
  std::vector<int32_t> ids(V);
  std::iota(ids.begin(), ids.end(), 0);
  std::partial_sort(ids.begin(), ids.begin() + long(k), ids.end(), ByLogit{logits});
  ids.resize(k);

  std::vector<double> p(k);  // unnormalised softmax of logit / temperature over the k candidates
  const double top = logits[size_t(ids[0])];
  double sum = 0;
  for (size_t i = 0; i < k; ++i) sum += p[i] = std::exp((double(logits[size_t(ids[i])]) - top) / o.temperature);
  if (o.top_p < 1) {
    size_t n = 0;
    double kept = 0;
    while (n < k && kept < o.top_p * sum) kept += p[n++];
    p.resize(n);
    sum = kept;
  }
  const double u = double(rng() >> 11) * 0x1.0p-53 * sum;  // uniform in [0, sum)
  double acc = 0;
  for (size_t i = 0; i < p.size(); ++i)
    if ((acc += p[i]) > u) return ids[i];
  return ids[p.size() - 1];  // u within rounding of sum
}

size_t complete_utf8_prefix(const std::string& s) {
  // Find the last lead byte among the final 4; cut before it if its character is not complete.
  for (size_t back = 1; back <= std::min<size_t>(4, s.size()); ++back) {
    const auto c = static_cast<unsigned char>(s[s.size() - back]);
    if ((c & 0xC0) == 0x80) continue;  // a continuation byte
    const size_t len = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 1;
    return back < len ? s.size() - back : s.size();
  }
  return s.size();  // only continuation bytes: not UTF-8 we could wait for
}

namespace {

// Streams the continuation's text. Decoders concatenate per-token pieces (SentencePiece drops the leading space
// of the very first token only), so the text of prompt + generated ids starts with the prompt's text and the
// rest is the continuation; decoding the ids together keeps byte-fallback tokens of one character together.
class TextStream {
 public:
  TextStream(const tok::Tokenizer& tok, const std::vector<int32_t>& prompt_ids, std::string stop, std::ostream* out)
      : tok_(tok), ids_(prompt_ids), prompt_bytes_(tok.decode(prompt_ids).size()), stop_(std::move(stop)), out_(out) {}

  // Adds a token; false once the text holds the stop string (the text then ends before it).
  bool push(int32_t id) {
    ids_.push_back(id);
    const std::string all = tok_.decode(ids_);
    text_ = all.size() >= prompt_bytes_ ? all.substr(prompt_bytes_) : std::string();
    if (!stop_.empty()) {
      const size_t at = text_.find(stop_);
      if (at != std::string::npos) {
        text_.resize(at);
        return false;
      }
    }
    write(complete_utf8_prefix(text_.substr(0, text_.size() - held_back())));
    return true;
  }
  // The whole continuation, an unfinished character at the end included.
  // A text cut off inside what may be the stop string loses that tail.
  const std::string& finish() {
    text_.resize(text_.size() - held_back());
    write(text_.size());
    return text_;
  }

 private:
  // The bytes at the end of the text that could begin the stop string: not printed until they are decided.
  size_t held_back() const {
    for (size_t k = std::min(stop_.size() - (stop_.empty() ? 0 : 1), text_.size()); k > 0; --k)
      if (text_.compare(text_.size() - k, k, stop_, 0, k) == 0) return k;
    return 0;
  }
  void write(size_t upto) {
    if (!out_ || upto <= printed_) return;
    out_->write(text_.data() + printed_, std::streamsize(upto - printed_));
    out_->flush();
    printed_ = upto;
  }

  const tok::Tokenizer& tok_;
  std::vector<int32_t> ids_;
  size_t prompt_bytes_, printed_ = 0;
  std::string stop_, text_;
  std::ostream* out_;
};

}  // namespace

std::vector<int32_t> encode_prompt(const tok::Tokenizer& tok, const std::string& prompt, const model::Decoder& dec,
                                   bool parse_special) {
  std::vector<int32_t> ids = tok.encode(prompt, parse_special);
  if (tok.add_bos() && tok.bos() >= 0 && (ids.empty() || ids[0] != tok.bos())) ids.insert(ids.begin(), tok.bos());
  if (ids.empty()) throw std::invalid_argument("the prompt is empty (and the tokenizer adds no BOS)");
  if (int64_t(ids.size()) > dec.max_context())
    throw std::length_error("the prompt is " + train::plural(int64_t(ids.size()), "token") + ", more than the context of " +
                            std::to_string(dec.max_context()) + " (--seq-len, at most the model's context length)");
  return ids;
}

Generation generate(model::Decoder& dec, const tok::Tokenizer& tok, const std::string& prompt, const SampleOptions& o,
                    std::ostream* stream, const PromptOptions& p) {
  check_sample_options(o);
  Generation gen;
  gen.prompt_ids = encode_prompt(tok, prompt, dec, p.parse_special);

  std::mt19937_64 rng(o.seed);
  TextStream text(tok, gen.prompt_ids, p.stop, stream);
  dec.reset();
  dec.reserve(int64_t(gen.prompt_ids.size()) + o.max_tokens);  // the cache for this text, not the whole context
  std::vector<float> logits = dec.feed(gen.prompt_ids);
  for (int64_t i = 0; i < o.max_tokens; ++i) {
    const int32_t id = sample_token(logits, o, rng);
    gen.ids.push_back(id);
    const bool go_on = text.push(id);
    if (o.stop_at_eos && id == tok.eos()) {
      gen.stopped_at_eos = true;
      break;
    }
    if (!go_on) {
      gen.stopped_at_stop = true;
      break;
    }
    if (i + 1 == o.max_tokens || dec.position() == dec.max_context()) break;
    logits = dec.feed(std::span<const int32_t>(&id, 1));
  }
  gen.text = text.finish();
  return gen;
}

ChatPrompt chat_prompt(chat::Template t, const tok::Tokenizer& tok, const std::vector<chat::Message>& msgs) {
  auto text_of = [&](int32_t id) { return id >= 0 ? tok.token_text(id) : std::string(); };
  const std::string eos = text_of(tok.eos());
  return {chat::generation_prompt(t, msgs, text_of(tok.bos()), eos), {true, chat::turn_end(t, eos)}};
}

namespace {

// The chat template generate --chat uses: --chat-template, else the one the adapter (or run) records, else the
// model's own.
chat::Template chat_template_for(const GenerateOptions& o, const std::string& adapter_template,
                                 const tok::Tokenizer& tok) {
  try {
    if (!o.chat_template.empty()) return chat::template_by_name(o.chat_template);
    if (!adapter_template.empty()) return chat::template_by_name(adapter_template);
    if (!tok.chat_template().empty()) return chat::detect_template(tok.chat_template());
  } catch (const chat::TemplateError& e) {
    throw std::invalid_argument(std::string("--chat: ") + e.what() + "; pass --chat-template NAME");
  }
  throw std::invalid_argument("--chat: the model carries no chat template and " +
                              std::string(o.adapter.empty() && o.run.empty() ? "no adapter is given"
                                                                             : "the adapter records none") +
                              ": pass --chat-template NAME (" + chat::known_template_names() + ")");
}

// The decoder's cache for the first reply: the prompt (its bytes, no fewer than its tokens) and --max-tokens.
train::MemoryNeed generate_need(const GenerateOptions& o, const model::ModelConfig& c) {
  const int64_t context = o.seq_len > 0 ? std::min(o.seq_len, c.n_ctx) : c.n_ctx;
  train::MemoryNeed need;
  need.what = "generate -n " + std::to_string(o.sample.max_tokens);
  need.activations = train::kv_cache_bytes(c, std::min(context, int64_t(o.prompt.size() + o.system.size()) + o.sample.max_tokens));
  need.lower = "lower --max-tokens or --seq-len";
  return need;
}

}  // namespace

int run_generate(const GenerateOptions& opt, const DeviceChoice& dev, std::ostream& out, std::istream& input) {
  GenerateOptions o = opt;
  check_sample_options(o.sample);
  if (o.seq_len < 0) throw std::invalid_argument("--seq-len must be non-negative (0: the model's context length)");
  std::optional<RunInfo> run;
  if (!o.run.empty()) {
    run = read_run(o.run);
    if (o.model.empty()) o.model = run->model;
  }
  if (o.model.empty()) throw std::invalid_argument("a model: -m/--model FILE.gguf, or --run DIR of a training run");
  if (!o.chat && o.prompt.empty()) throw std::invalid_argument("-p/--prompt: the text to continue (or --chat)");
  if (!o.chat && !o.system.empty()) throw std::invalid_argument("--system is for --chat");
  auto be = dev.backend();
  const auto file = gguf::File::open(o.model);
  auto m = train::load_model_that_fits(*file, *be, generate_need(o, model::ModelConfig::from_gguf(*file)));
  const auto tok = tok::Tokenizer::from_gguf(*file);
  model::AdapterSet adapters;
  std::string adapter_template;
  if (!o.adapter.empty()) {
    const auto af = gguf::File::open(o.adapter);
    adapters = model::load_adapter_weights(*m, *af, o.adapter_scale);
    const gguf::Value* v = af->find(kAdapterChatTemplateKey);
    if (v && v->type == gguf::ValueType::STRING) adapter_template = std::get<std::string>(v->v);
  } else if (run) {
    ag::Graph g(*be);
    model::ModelGraph mg(*m, g);
    load_run_adapters(mg, *run, o.adapter_scale);
    adapters = model::adapter_weights(mg);
    adapter_template = run_chat_template(*run, *tok);
  }
  model::Decoder dec(*m, std::move(adapters), o.seq_len);
  if (!o.chat) {
    encode_prompt(*tok, o.prompt, dec);  // a prompt that does not fit fails before anything is printed
    out << o.prompt;
    out.flush();
    generate(dec, *tok, o.prompt, o.sample, &out);
    out << "\n";
    return 0;
  }
  const chat::Template t = chat_template_for(o, adapter_template, *tok);
  std::vector<chat::Message> msgs;
  if (!o.system.empty()) msgs.push_back({"system", o.system});
  auto reply = [&](const std::string& user) {
    msgs.push_back({"user", user});
    ChatPrompt prompt;
    try {
      chat::check_conversation(t, msgs);
      prompt = chat_prompt(t, *tok, msgs);
    } catch (const chat::TemplateError& e) {
      throw std::invalid_argument(std::string("--chat: ") + e.what());
    }
    const Generation g = generate(dec, *tok, prompt.text, o.sample, &out, prompt.options);
    out << "\n";
    out.flush();
    msgs.push_back({"assistant", g.text});
  };
  if (!o.prompt.empty()) {
    reply(o.prompt);
    return 0;
  }
  // Interactive: one user message per line until the input ends (Ctrl-D).
  const bool tty = &input == &std::cin && isatty(STDIN_FILENO);
  if (tty) out << "chat with " << o.model << " (" << chat::template_name(t) << " template); Ctrl-D ends\n";
  std::string line;
  while (true) {
    if (tty) out << "> " << std::flush;
    if (!std::getline(input, line)) break;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    reply(line);
  }
  if (tty) out << "\n";
  return 0;
}

int run_generate(const GenerateOptions& o, std::ostream& out) {
  cpu::set_num_threads(o.threads);
  DeviceChoice dev = choose_device(o.device);
  dev.set_precision(o.precision);
  return run_generate(o, dev, out, std::cin);
}

}  // namespace q4t
