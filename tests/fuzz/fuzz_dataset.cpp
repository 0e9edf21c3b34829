// libFuzzer target: a training data file through data::tokenize_file (JSONL, a JSON array or plain text; every
// record shape and chat template), then the rows and one batch that training would take from it.
// Input: byte 0 picks the file kind (bits 0-1: .jsonl, .json, .txt, .jsonl), the chat template (bits 2-4: the
// tokenizer's own, then each family by name), pack (bit 5), train_on_prompt (bit 6) and no_truncate (bit 7);
// byte 1 the record format (mod 6: data_format_names()) and seq_len (1 + 8 * (byte / 6)); the rest is the file.
// A bad file must end in DatasetError; anything else is a finding.
#include <cstdint>
#include <memory>
#include <string>

#include "data/dataset.h"
#include "data/tokenizer.h"
#include "tests/fuzz/fuzz_input.h"

namespace {

using namespace q4t;

// init-model's byte vocabulary plus every chat marker, with a chatml template to be recognised.
std::unique_ptr<tok::Tokenizer> make_tokenizer() {
  const std::string dir = fuzz::scratch();
  fuzz::write_tokenizer_with_controls(fuzz::make_adapter_base(dir + "/base.gguf"), fuzz::chat_markers(),
                                      "{{ '<|im_start|>' + message['role'] }}", dir + "/chat.gguf");
  return tok::Tokenizer::from_gguf(*gguf::File::open(dir + "/chat.gguf"));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::unique_ptr<tok::Tokenizer> tok = make_tokenizer();
  static const char* const kExt[] = {".jsonl", ".json", ".txt", ".jsonl"};
  static const char* const kTemplate[] = {"", "chatml", "llama3", "llama2", "mistral", "zephyr", "gemma", "phi3"};
  if (size < 2) return 0;
  data::DatasetOptions opt;
  opt.use_cache = false;
  opt.chat_template = kTemplate[(data[0] >> 2) & 7];
  opt.pack = data[0] & 0x20;
  opt.train_on_prompt = data[0] & 0x40;
  opt.no_truncate = data[0] & 0x80;
  opt.format.format = data::data_format_names()[data[1] % 6];
  opt.seq_len = 1 + 8 * (data[1] / 6);
  const std::string path = fuzz::write_input(data + 2, size - 2, kExt[data[0] & 3]);
  try {
    data::TokenizedFile tf = data::tokenize_file(path, *tok, opt);
    for (const data::Example& ex : tf.examples)
      if (ex.ids.size() != ex.mask.size() || ex.ids.size() > size_t(opt.seq_len) + 1) std::abort();
    if (tf.examples.empty()) return 0;
    data::Dataset ds(std::move(tf.examples), opt, tok->eos());
    ds.next_batch(2);
    ds.batch_at(0, 2);
  } catch (const data::DatasetError&) {
  }
  return 0;
}
