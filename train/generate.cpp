#include "train/generate.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <ostream>
#include <sstream>
#include <stdexcept>

#include "kernels/cpu/threads.h"
#include "train/device_choice.h"

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
  TextStream(const tok::Tokenizer& tok, const std::vector<int32_t>& prompt_ids, std::ostream* out)
      : tok_(tok), ids_(prompt_ids), prompt_bytes_(tok.decode(prompt_ids).size()), out_(out) {}

  void push(int32_t id) {
    ids_.push_back(id);
    const std::string all = tok_.decode(ids_);
    text_ = all.size() >= prompt_bytes_ ? all.substr(prompt_bytes_) : std::string();
    write(complete_utf8_prefix(text_));
  }
  // The whole continuation, an unfinished character at the end included.
  const std::string& finish() {
    write(text_.size());
    return text_;
  }

 private:
  void write(size_t upto) {
    if (!out_ || upto <= printed_) return;
    out_->write(text_.data() + printed_, std::streamsize(upto - printed_));
    out_->flush();
    printed_ = upto;
  }

  const tok::Tokenizer& tok_;
  std::vector<int32_t> ids_;
  size_t prompt_bytes_, printed_ = 0;
  std::string text_;
  std::ostream* out_;
};

}  // namespace

std::vector<int32_t> encode_prompt(const tok::Tokenizer& tok, const std::string& prompt, const model::Decoder& dec) {
  std::vector<int32_t> ids;
  if (tok.add_bos() && tok.bos() >= 0) ids.push_back(tok.bos());
  const std::vector<int32_t> text_ids = tok.encode(prompt);
  ids.insert(ids.end(), text_ids.begin(), text_ids.end());
  if (ids.empty()) throw std::invalid_argument("the prompt is empty (and the tokenizer adds no BOS)");
  if (int64_t(ids.size()) > dec.max_context())
    throw std::length_error("the prompt is " + std::to_string(ids.size()) + " tokens, more than the context of " +
                            std::to_string(dec.max_context()) + " (--ctx, at most the model's context length)");
  return ids;
}

Generation generate(model::Decoder& dec, const tok::Tokenizer& tok, const std::string& prompt, const SampleOptions& o,
                    std::ostream* stream) {
  check_sample_options(o);
  Generation gen;
  gen.prompt_ids = encode_prompt(tok, prompt, dec);

  std::mt19937_64 rng(o.seed);
  TextStream text(tok, gen.prompt_ids, stream);
  dec.reset();
  std::vector<float> logits = dec.feed(gen.prompt_ids);
  for (int64_t i = 0; i < o.max_tokens; ++i) {
    const int32_t id = sample_token(logits, o, rng);
    gen.ids.push_back(id);
    text.push(id);
    if (o.stop_at_eos && id == tok.eos()) {
      gen.stopped_at_eos = true;
      break;
    }
    if (i + 1 == o.max_tokens || dec.position() == dec.max_context()) break;
    logits = dec.feed(std::span<const int32_t>(&id, 1));
  }
  gen.text = text.finish();
  return gen;
}

int run_generate(const GenerateOptions& o, const DeviceChoice& dev, std::ostream& out) {
  check_sample_options(o.sample);
  if (o.ctx < 0) throw std::invalid_argument("--ctx must be non-negative (0: the model's context length)");
  auto be = dev.is_cpu() ? ag::Backend::cpu() : ag::Backend::vulkan(*dev.vulkan, dev.precision);
  auto m = model::Model::load(o.model, *be);
  const auto tok = tok::Tokenizer::from_gguf(*gguf::File::open(o.model));
  model::AdapterSet adapters;
  if (!o.adapter.empty()) adapters = model::load_adapter_weights(*m, *gguf::File::open(o.adapter), o.adapter_scale);
  model::Decoder dec(*m, std::move(adapters), o.ctx);
  encode_prompt(*tok, o.prompt, dec);  // a prompt that does not fit fails before anything is printed
  out << o.prompt;
  out.flush();
  generate(dec, *tok, o.prompt, o.sample, &out);
  out << "\n";
  return 0;
}

int run_generate(const GenerateOptions& o, std::ostream& out) {
  cpu::set_num_threads(o.threads);
  DeviceChoice dev = choose_device(o.device);
  dev.set_precision(o.precision);
  return run_generate(o, dev, out);
}

}  // namespace q4t
