// Internals shared by the tokenizer files: the vocabulary as the tokenizers see it and the special-token
// partition of the input that llama.cpp performs before either algorithm runs.
#pragma once
#include <algorithm>
#include <functional>
#include <optional>
#include <queue>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "data/checksum.h"
#include "data/tokenizer.h"
#include "data/unicode.h"

namespace q4t::tok::detail {

// The bigram merge both algorithms share (llama.cpp's SPM and BPE loops): s is cut into UTF-8 characters, then
// the adjacent pair with the highest priority(left, right) is merged, ties to the leftmost pair, until no
// pair has a priority (nullopt). SPM ranks a pair by the score of the token it spells, BPE by its merge rank.
// Returns the final pieces in order.
template <class Priority>
std::vector<std::string_view> merge_pieces(std::string_view s, const Priority& priority) {
  struct Symbol {
    int32_t prev, next;
    size_t begin, len;  // len 0 once merged into its left neighbour
  };
  struct Bigram {
    int32_t left, right;
    double priority;
    size_t len;
    bool operator<(const Bigram& o) const {
      return priority < o.priority || (priority == o.priority && left > o.left);
    }
  };
  std::vector<Symbol> sym;
  for (size_t at = 0; at < s.size();) {
    const size_t n = std::min(s.size() - at, utf8_len(s[at]));
    sym.push_back({int32_t(sym.size()) - 1, int32_t(sym.size()) + 1, at, n});
    at += n;
  }
  if (sym.empty()) return {};
  sym.back().next = -1;
  std::priority_queue<Bigram> queue;
  auto try_pair = [&](int32_t l, int32_t r) {
    if (l < 0 || r < 0) return;
    const Symbol &a = sym[size_t(l)], &b = sym[size_t(r)];
    if (const std::optional<double> p = priority(s.substr(a.begin, a.len), s.substr(b.begin, b.len)))
      queue.push({l, r, *p, a.len + b.len});
  };
  for (int32_t i = 1; i < int32_t(sym.size()); ++i) try_pair(i - 1, i);
  while (!queue.empty()) {
    const Bigram b = queue.top();
    queue.pop();
    Symbol& l = sym[size_t(b.left)];
    Symbol& r = sym[size_t(b.right)];
    if (l.len == 0 || r.len == 0 || l.len + r.len != b.len) continue;  // outdated by an earlier merge
    l.len += r.len;
    r.len = 0;
    l.next = r.next;
    if (r.next >= 0) sym[size_t(r.next)].prev = b.left;
    try_pair(l.prev, b.left);
    try_pair(b.left, l.next);
  }
  std::vector<std::string_view> pieces;
  for (int32_t i = 0; i != -1; i = sym[size_t(i)].next) pieces.push_back(s.substr(sym[size_t(i)].begin, sym[size_t(i)].len));
  return pieces;
}

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
  // Adds every token's text and type to h, the tokenizer's content hash; each algorithm adds what else
  // determines its encode().
  void add_vocabulary(Checksum64& h) const {
    for (size_t i = 0; i < tokens_.size(); ++i) {
      h.str(tokens_[i]);
      h.u64(uint64_t(types_[i]));
    }
  }
};

std::unique_ptr<Tokenizer> make_spm(const gguf::File& f);
std::unique_ptr<Tokenizer> make_bpe(const gguf::File& f, const std::string& pre);

}  // namespace q4t::tok::detail
