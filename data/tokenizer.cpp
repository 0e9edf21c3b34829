// Tokenizer::from_gguf and what both algorithms share: reading the vocabulary and special tokens, and the
// special-token partition of the input.
#include "data/tokenizer.h"

#include <algorithm>

#include "data/tokenizer_impl.h"

namespace q4t::tok {

std::unique_ptr<Tokenizer> Tokenizer::from_gguf(const gguf::File& f) {
  f.expect_model();
  if (!f.find("tokenizer.ggml.model"))
    throw TokenizerError(f.path() + ": no tokenizer.ggml.model key: the file carries no tokenizer");
  const std::string model = f.get_string("tokenizer.ggml.model");
  if (model == "llama") return detail::make_spm(f);
  if (model == "gpt2") {
    const std::string pre = f.find("tokenizer.ggml.pre") ? f.get_string("tokenizer.ggml.pre") : "default";
    return detail::make_bpe(f, pre);
  }
  throw TokenizerError(f.path() + ": tokenizer.ggml.model '" + model +
                       "' is not supported (supported: llama, gpt2)");
}

namespace detail {

void VocabTokenizer::load_common(const gguf::File& f) {
  try {
    for (const auto& v : f.get_array("tokenizer.ggml.tokens", gguf::ValueType::STRING))
      tokens_.push_back(std::get<std::string>(v.v));
    if (tokens_.empty()) throw TokenizerError(f.path() + ": tokenizer.ggml.tokens is empty");
    types_.assign(tokens_.size(), kNormal);
    if (f.find("tokenizer.ggml.token_type")) {
      const auto& types = f.get_array("tokenizer.ggml.token_type", gguf::ValueType::I32);
      if (types.size() != tokens_.size())
        throw TokenizerError(f.path() + ": tokenizer.ggml.token_type has " + std::to_string(types.size()) +
                             " entries for " + std::to_string(tokens_.size()) + " tokens");
      for (size_t i = 0; i < types.size(); ++i) types_[i] = int32_t(std::get<int64_t>(types[i].v));
    }
    bos_ = int32_t(f.get_uint_or("tokenizer.ggml.bos_token_id", uint64_t(bos_)));
    eos_ = int32_t(f.get_uint_or("tokenizer.ggml.eos_token_id", uint64_t(eos_)));
    add_bos_ = f.get_bool_or("tokenizer.ggml.add_bos_token", add_bos_);
    add_eos_ = f.get_bool_or("tokenizer.ggml.add_eos_token", add_eos_);
    if (f.find("tokenizer.chat_template")) chat_template_ = f.get_string("tokenizer.chat_template");
  } catch (const gguf::FormatError& e) {
    throw TokenizerError(e.what());
  }
  if (bos_ >= n_vocab()) bos_ = -1;
  if (eos_ >= n_vocab()) eos_ = -1;
  index_.reserve(tokens_.size());
  for (size_t i = 0; i < tokens_.size(); ++i) index_[tokens_[i]] = int32_t(i);
  for (int32_t id = 0; id < n_vocab(); ++id) {
    const int32_t t = types_[size_t(id)];
    if ((t == kControl || t == kUserDefined || t == kUnknown) && !tokens_[size_t(id)].empty()) specials_.push_back(id);
  }
  std::stable_sort(specials_.begin(), specials_.end(),
                   [&](int32_t a, int32_t b) { return tokens_[size_t(a)].size() > tokens_[size_t(b)].size(); });
}

// Each special token in turn (longest first) cuts every remaining raw piece at its leftmost non-overlapping
// occurrences, so a longer token wins over a shorter one it contains.
std::vector<Fragment> VocabTokenizer::partition(std::string_view text, bool parse_special) const {
  std::vector<Fragment> pieces;
  if (text.empty()) return pieces;
  pieces.push_back({-1, text});
  for (const int32_t id : specials_) {
    if (!parse_special && types_[size_t(id)] != kUserDefined) continue;
    const std::string& needle = tokens_[size_t(id)];
    std::vector<Fragment> next;
    next.reserve(pieces.size());
    for (const Fragment& p : pieces) {
      if (p.token >= 0) {
        next.push_back(p);
        continue;
      }
      std::string_view rest = p.text;
      for (size_t at; (at = rest.find(needle)) != std::string_view::npos;) {
        if (at > 0) next.push_back({-1, rest.substr(0, at)});
        next.push_back({id, {}});
        rest.remove_prefix(at + needle.size());
      }
      if (!rest.empty()) next.push_back({-1, rest});
    }
    pieces = std::move(next);
  }
  return pieces;
}

}  // namespace detail
}  // namespace q4t::tok
