// libFuzzer target: a GGUF file as the model commands read it. The reader, the model config (and the RoPE
// frequencies of every layer), then the tokenizer: it encodes fixed texts with and without special tokens,
// decodes what it encoded and every token of its vocabulary. A bad file must end in the reader's, the config's
// or the tokenizer's own error; anything else (another exception, a sanitizer report) is a finding.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <numeric>
#include <string>
#include <vector>

#include "data/chat_template.h"
#include "data/gguf.h"
#include "data/tokenizer.h"
#include "tests/fuzz/fuzz_input.h"
#include "train/model/config.h"

namespace {

using namespace q4t;

// Texts that reach the tokenizers' special cases: spaces and "▁", byte fallback, invalid UTF-8, digits and
// contractions (the BPE pre-tokenizers), control-token text.
const std::vector<std::string>& texts() {
  static const std::vector<std::string> t = {
      "Hello world",
      "  two  spaces\n\nand\ttabs ",
      "\xe2\x96\x81 already a space \xe2\x96\x81\xe2\x96\x81",
      "caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x98\x80",
      "bad \xff\xfe utf-8 \xc3 \xe2\x96",
      "12345 67.89 I'm we'll they're",
      "<s>inside</s> <unk> <|im_start|>user\nhi<|im_end|>",
      std::string("nul\0byte", 8),
      "",
  };
  return t;
}

void check_ids(const tok::Tokenizer& t, const std::vector<int32_t>& ids) {
  for (int32_t id : ids)
    if (id < 0 || id >= t.n_vocab()) std::abort();  // encode made an id outside the vocabulary
}

void exercise(const tok::Tokenizer& t) {
  for (const std::string& s : texts())
    for (bool special : {false, true}) {
      const std::vector<int32_t> ids = t.encode(s, special);
      check_ids(t, ids);
      t.decode(ids);
    }
  // Every token, in one decode (bounded so a huge vocabulary stays fast).
  std::vector<int32_t> all(size_t(std::min(t.n_vocab(), 4096)));
  std::iota(all.begin(), all.end(), 0);
  t.decode(all);
  for (int32_t id : {t.bos(), t.eos()})
    if (id >= 0 && id < t.n_vocab()) t.decode(std::vector<int32_t>{id});
  if (!t.chat_template().empty()) {
    try {
      chat::detect_template(t.chat_template());
    } catch (const chat::TemplateError&) {
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = fuzz::write_input(data, size, ".gguf");
  std::unique_ptr<gguf::File> f;
  try {
    f = gguf::File::open(path);
  } catch (const gguf::FormatError&) {
    return 0;
  }
  try {
    f->expect_model();
    const model::ModelConfig c = model::ModelConfig::from_gguf(*f);
    for (int64_t l = 0; l < std::min<int64_t>(c.n_layer, 8); ++l) {
      c.rope_freqs(l);
      c.rope_freqs(l, 2 * c.n_ctx);
      c.attention_options(l);
    }
    c.config_tensors();
  } catch (const gguf::FormatError&) {
  }
  try {
    exercise(*tok::Tokenizer::from_gguf(*f));
  } catch (const tok::TokenizerError&) {
  }
  return 0;
}
