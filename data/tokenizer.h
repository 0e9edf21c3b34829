// Tokenizers built from a GGUF's tokenizer.ggml.* keys, producing exactly the ids llama.cpp produces:
//   "llama": SentencePiece-style BPE over tokens + scores with byte fallback (<0xXX>), leading-space and "▁"
//            conventions;
//   "gpt2":  byte-level BPE over merges, with the pre-tokenizer chosen by tokenizer.ggml.pre (gpt-2/default,
//            llama-bpe (Llama 3), qwen2, ...).
// encode() never adds BOS/EOS (callers decide with add_bos()/add_eos()); special/control tokens written in the
// text are recognised only when parse_special is true.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "data/gguf.h"

namespace q4t::tok {

struct TokenizerError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class Tokenizer {
 public:
  // Throws TokenizerError naming the file and the key (unknown tokenizer.ggml.model or .pre, missing tokens...).
  static std::unique_ptr<Tokenizer> from_gguf(const gguf::File& f);
  virtual ~Tokenizer() = default;

  virtual std::vector<int32_t> encode(std::string_view text, bool parse_special = false) const = 0;
  // The text of the ids (byte tokens reassembled; control tokens such as BOS/EOS are rendered as nothing).
  virtual std::string decode(std::span<const int32_t> ids) const = 0;

  int32_t n_vocab() const { return int32_t(tokens_.size()); }
  const std::string& token_text(int32_t id) const { return tokens_.at(size_t(id)); }
  int32_t bos() const { return bos_; }
  int32_t eos() const { return eos_; }
  bool add_bos() const { return add_bos_; }
  bool add_eos() const { return add_eos_; }
  // tokenizer.chat_template, or "" when the file has none.
  const std::string& chat_template() const { return chat_template_; }
  // A hash of everything that determines encode() (model, pre, tokens, scores, merges, types): the key of
  // tokenized-dataset caches.
  uint64_t content_hash() const { return hash_; }

 protected:
  std::vector<std::string> tokens_;
  int32_t bos_ = -1, eos_ = -1;
  bool add_bos_ = false, add_eos_ = false;
  std::string chat_template_;
  uint64_t hash_ = 0;
};

}  // namespace q4t::tok
