// Internals shared by the tokenizer files: the vocabulary as the tokenizers see it and the special-token
// partition of the input that llama.cpp performs before either algorithm runs.
#pragma once
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "data/tokenizer.h"

namespace q4t::tok::detail {

// tokenizer.ggml.token_type values (llama.cpp's llama_token_type).
enum TokenType : int32_t { kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6 };

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using TokenIndex = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

// Text into raw-text pieces and special tokens. Control and unknown tokens are matched only with
// parse_special; user-defined tokens always (llama.cpp's tokenizer_st_partition).
struct Fragment {
  int32_t token;          // -1: raw text
  std::string_view text;  // raw text only
};

class VocabTokenizer : public Tokenizer {
 protected:
  std::vector<int32_t> types_;
  TokenIndex index_;                // text -> id; the last of duplicate texts wins, as in llama.cpp
  std::vector<int32_t> specials_;   // control, user-defined and unknown ids, longest text first

  // Reads tokens, token_type, the BOS/EOS ids and flags, the chat template; builds the index and specials_.
  void load_common(const gguf::File& f);
  int32_t find(std::string_view text) const {
    const auto it = index_.find(text);
    return it == index_.end() ? -1 : it->second;
  }
  std::vector<Fragment> partition(std::string_view text, bool parse_special) const;
  int32_t type_of(int32_t id) const { return types_[size_t(id)]; }
};

std::unique_ptr<Tokenizer> make_spm(const gguf::File& f);
std::unique_ptr<Tokenizer> make_bpe(const gguf::File& f, const std::string& pre);

// FNV-1a, folded over everything that determines encode().
struct Hasher {
  uint64_t h = 1469598103934665603ull;
  void add(std::string_view s) {
    for (char c : s) h = (h ^ uint8_t(c)) * 1099511628211ull;
    h = (h ^ 0xFF) * 1099511628211ull;  // separator, so ("ab","c") and ("a","bc") differ
  }
  void add_u64(uint64_t v) { add(std::string_view(reinterpret_cast<const char*>(&v), sizeof v)); }
};

}  // namespace q4t::tok::detail
