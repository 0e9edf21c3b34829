// tokenizer.ggml.model "gpt2": byte-level BPE over tokenizer.ggml.merges, as llama.cpp's llm_tokenizer_bpe.
// The text is cut into words by the pre-tokenizer regex of tokenizer.ggml.pre (llama.cpp's hand-written
// matchers, reproduced here: their choices on odd input are what the ids must match); each word's UTF-8 bytes
// are spelt in GPT-2's printable byte alphabet, and the adjacent pair with the lowest merge rank merges first
// (ties: leftmost) until no pair has a rank.
#include <queue>
#include <span>

#include "data/tokenizer_impl.h"
#include "data/unicode.h"

namespace q4t::tok::detail {
namespace {

// The regex families of tokenizer.ggml.pre that q4tune implements.
//   kGpt2:   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//   kLlama3: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|
//            \s*[\r\n]+|\s+(?!\S)|\s+
//   kQwen2:  the same with \p{N} (one digit per word).
//   kDefault: four regexes, each splitting the words of the one before (llama.cpp's default BPE pre-type, also
//            what a gpt2 GGUF without tokenizer.ggml.pre gets):
//            [\p{P}\$\+<=>\^~\|]+   then kGpt2's   then \p{N}+   then [0-9][0-9][0-9]
enum class PreTokenizer { kGpt2, kLlama3, kQwen2, kDefault };

struct PreName {
  const char* name;
  PreTokenizer kind;
};
constexpr PreName kPreNames[] = {
    {"gpt-2", PreTokenizer::kGpt2},       {"llama-bpe", PreTokenizer::kLlama3}, {"llama3", PreTokenizer::kLlama3},
    {"llama-v3", PreTokenizer::kLlama3},  {"qwen2", PreTokenizer::kQwen2},   {"default", PreTokenizer::kDefault},
};

// Word boundaries over code points; the word lengths (in code points) are appended to `lengths`.
class Splitter {
 public:
  Splitter(std::span<const uint32_t> cps, std::vector<size_t>& lengths) : cps_(cps), out_(lengths) {}

  void gpt2() {
    for (size_t pos = 0; pos < n();) {
      const uint32_t cp = cps_[pos];
      if (const size_t len = contraction(pos, false)) {
        pos = emit(pos + len);
        continue;
      }
      const size_t look = cp == ' ' ? pos + 1 : pos;  // the optional leading space
      const CharClass c = cls(look);
      if (c.letter || c.number) {
        size_t end = look;
        while (c.letter ? cls(end).letter : cls(end).number) ++end;
        pos = emit(end);
        continue;
      }
      if (look < n() && !c.space) {
        pos = emit(other_run(look));
        continue;
      }
      pos = emit(pos + spaces(pos, nullptr));
    }
  }

  // digits: the longest run of \p{N} one word holds (3 for Llama 3, 1 for Qwen2).
  void llama3(size_t digits) {
    for (size_t pos = 0; pos < n();) {
      const uint32_t cp = cps_[pos];
      const CharClass c = cls(pos);
      if (const size_t len = contraction(pos, true)) {
        pos = emit(pos + len);
        continue;
      }
      if (!(cp == '\r' || cp == '\n' || c.number) && (c.letter || cls(pos + 1).letter)) {
        size_t end = pos + 1;
        while (cls(end).letter) ++end;
        pos = emit(end);
        continue;
      }
      if (c.number) {
        size_t end = pos;
        while (end < n() && end - pos < digits && cls(end).number) ++end;
        pos = emit(end);
        continue;
      }
      const size_t look = cp == ' ' ? pos + 1 : pos;
      const CharClass c2 = cls(look);
      if (!(c2.space || c2.letter || c2.number)) {
        size_t end = other_run(look);
        while (end < n() && (cps_[end] == '\r' || cps_[end] == '\n')) ++end;
        pos = emit(end);
        continue;
      }
      size_t after_newline = 0;
      const size_t run = spaces(pos, &after_newline);
      pos = emit(after_newline ? after_newline : pos + run);
    }
  }

 private:
  size_t n() const { return cps_.size(); }
  CharClass cls(size_t i) const { return i < n() ? char_class(cps_[i]) : CharClass{}; }
  size_t emit(size_t end) {
    out_.push_back(end - start_);
    start_ = end;
    return end;
  }
  // Length of 's 't 're 've 'm 'll 'd at pos (ASCII case folded when fold: no other code point lowercases to
  // these letters), or 0.
  size_t contraction(size_t pos, bool fold) const {
    if (cps_[pos] != '\'' || pos + 1 >= n()) return 0;
    auto low = [&](size_t i) { return fold && cps_[i] >= 'A' && cps_[i] <= 'Z' ? cps_[i] + 32 : cps_[i]; };
    const uint32_t a = low(pos + 1);
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
    if (pos + 2 >= n()) return 0;
    const uint32_t b = low(pos + 2);
    return (a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l') ? 3 : 0;
  }
  // End of the run of code points that are neither space, letter nor number, from `from`.
  size_t other_run(size_t from) const {
    size_t end = from;
    for (CharClass c = cls(end); end < n() && !(c.space || c.letter || c.number); c = cls(++end)) {
    }
    return end;
  }
  // The word a whitespace run at pos makes: \s+(?!\S) leaves the last space to the next word when more follows,
  // \s+ takes a single one. *after_newline (when asked): one past the run's last \r or \n, or 0.
  size_t spaces(size_t pos, size_t* after_newline) const {
    size_t k = 0;
    while (cls(pos + k).space) {
      if (after_newline && (cps_[pos + k] == '\r' || cps_[pos + k] == '\n')) *after_newline = pos + k + 1;
      ++k;
    }
    if (k > 1 && pos + k < n()) return k - 1;
    return k > 0 ? k : 1;  // 1: a code point no alternative matches is a word of its own
  }

  std::span<const uint32_t> cps_;
  std::vector<size_t>& out_;
  size_t start_ = 0;
};

// The default pre-tokenizer. llama.cpp runs its regexes one after the other, each only inside the words the
// previous one made (a match never crosses a word's edge; what lies between matches is a word too). The first and
// third go through std::regex over "collapsed" text (a code point >= U+0080 becomes one byte for its category,
// White_Space first), so their classes are an ASCII list plus a category above U+0080, not \p{..} proper.

// [\p{P}\$\+<=>\^~\|] as matched there: ASCII punctuation and symbols except '`', and \p{P} above U+007F.
bool default_punct(uint32_t cp) {
  if (cp < 0x80)
    return (cp >= 0x21 && cp <= 0x2F) || (cp >= 0x3A && cp <= 0x40) || (cp >= 0x5B && cp <= 0x5F) ||
           (cp >= 0x7B && cp <= 0x7E);
  const CharClass c = char_class(cp);
  return c.punct && !c.space;
}

// A regex [set]+ splits a word into its maximal runs inside and outside the set.
template <class InSet>
void split_runs(std::span<const uint32_t> cps, InSet in_set, std::vector<size_t>& lengths) {
  for (size_t start = 0, end = 0; start < cps.size(); start = end) {
    const bool in = in_set(cps[start]);
    for (end = start + 1; end < cps.size() && in_set(cps[end]) == in; ++end) {
    }
    lengths.push_back(end - start);
  }
}

// [0-9][0-9][0-9] searched left to right: each three ASCII digits in a row is a word, the rest between them too.
void split_digit_triples(std::span<const uint32_t> cps, std::vector<size_t>& lengths) {
  auto digit = [&](size_t i) { return i < cps.size() && cps[i] >= '0' && cps[i] <= '9'; };
  size_t gap = 0;  // start of the unmatched text before the next match
  for (size_t i = 0; i < cps.size();) {
    if (!(digit(i) && digit(i + 1) && digit(i + 2))) {
      ++i;
      continue;
    }
    if (i > gap) lengths.push_back(i - gap);
    lengths.push_back(3);
    gap = i += 3;
  }
  if (gap < cps.size()) lengths.push_back(cps.size() - gap);
}

// Splits every word of `lengths` (over cps) with split(word, out); the new word lengths replace the old.
template <class Split>
void refine(std::span<const uint32_t> cps, std::vector<size_t>& lengths, Split split) {
  std::vector<size_t> out;
  size_t at = 0;
  for (const size_t len : lengths) {
    split(cps.subspan(at, len), out);
    at += len;
  }
  lengths = std::move(out);
}

void split_default(std::span<const uint32_t> cps, std::vector<size_t>& lengths) {
  std::vector<size_t> words;
  split_runs(cps, default_punct, words);
  refine(cps, words, [](std::span<const uint32_t> w, std::vector<size_t>& out) { Splitter(w, out).gpt2(); });
  refine(cps, words, [](std::span<const uint32_t> w, std::vector<size_t>& out) {
    split_runs(w, [](uint32_t cp) { return char_class(cp).number; }, out);
  });
  refine(cps, words, split_digit_triples);
  lengths.insert(lengths.end(), words.begin(), words.end());
}

class BpeTokenizer final : public VocabTokenizer {
 public:
  BpeTokenizer(const gguf::File& f, PreTokenizer pre, const std::string& pre_name) : pre_(pre) {
    bos_ = eos_ = 11;  // llama.cpp's defaults for this model when the keys are absent
    add_bos_ = pre == PreTokenizer::kLlama3;
    ignore_merges_ = pre == PreTokenizer::kLlama3;
    load_common(f);
    Checksum64 h;
    h.str("gpt2");
    h.str(pre_name);
    add_vocabulary(h);
    try {
      if (!f.find("tokenizer.ggml.merges"))
        throw TokenizerError(f.path() + ": tokenizer.ggml.model 'gpt2' needs tokenizer.ggml.merges");
      const auto& merges = f.get_array("tokenizer.ggml.merges", gguf::ValueType::STRING);
      for (size_t rank = 0; rank < merges.size(); ++rank) {
        const std::string& m = std::get<std::string>(merges[rank].v);
        h.str(m);
        add_merge(m, int32_t(rank));
      }
    } catch (const gguf::FormatError& e) {
      throw TokenizerError(e.what());
    }
    hash_ = h.digest();
  }

  std::vector<int32_t> encode(std::string_view text, bool parse_special) const override;
  std::string decode(std::span<const int32_t> ids) const override;

 private:
  // A merge is "left right", cut at the first space after the first byte (llama.cpp); the first of duplicate
  // pairs keeps its rank.
  void add_merge(const std::string& m, int32_t rank) {
    const size_t cut = m.find(' ', 1);
    const std::string left = cut == std::string::npos ? "" : m.substr(0, cut);
    const std::string right = cut == std::string::npos ? "" : m.substr(cut + 1);
    const int32_t l = find(left), r = find(right);
    if (l >= 0 && r >= 0) id_ranks_.emplace(pair_key(l, r), rank);
    else text_ranks_.emplace(left + '\0' + right, rank);
  }
  static uint64_t pair_key(int32_t l, int32_t r) { return (uint64_t(uint32_t(l)) << 32) | uint32_t(r); }
  int32_t rank(std::string_view left, std::string_view right) const {
    const int32_t l = find(left), r = find(right);
    if (l >= 0 && r >= 0) {
      const auto it = id_ranks_.find(pair_key(l, r));
      if (it != id_ranks_.end()) return it->second;
    }
    if (text_ranks_.empty()) return -1;
    const auto it = text_ranks_.find(std::string(left) + '\0' + std::string(right));
    return it == text_ranks_.end() ? -1 : it->second;
  }
  void split_words(std::string_view text, std::vector<std::string>& words) const;
  void encode_word(const std::string& word, std::vector<int32_t>& out) const;

  PreTokenizer pre_;
  bool ignore_merges_ = false;  // Llama 3: a word that is a token is that token, whatever the merges say
  std::unordered_map<uint64_t, int32_t> id_ranks_;
  std::unordered_map<std::string, int32_t> text_ranks_;  // merges whose halves are not tokens (rare)
};

// Words of text in GPT-2's byte alphabet. Invalid UTF-8 has become U+FFFD by then, as in llama.cpp.
void BpeTokenizer::split_words(std::string_view text, std::vector<std::string>& words) const {
  const std::vector<uint32_t> cps = decode_utf8(text);
  std::vector<size_t> lengths;
  if (pre_ == PreTokenizer::kDefault) split_default(cps, lengths);
  else if (pre_ == PreTokenizer::kGpt2) Splitter(cps, lengths).gpt2();
  else Splitter(cps, lengths).llama3(pre_ == PreTokenizer::kLlama3 ? 3 : 1);
  size_t at = 0;
  std::string utf8;
  for (const size_t len : lengths) {
    utf8.clear();
    for (size_t i = at; i < at + len; ++i) append_utf8(utf8, cps[i]);
    at += len;
    std::string word;
    for (char c : utf8) word += byte_to_unicode(uint8_t(c));
    words.push_back(std::move(word));
  }
}

void BpeTokenizer::encode_word(const std::string& word, std::vector<int32_t>& out) const {
  if (ignore_merges_) {
    if (const int32_t id = find(word); id >= 0) {
      out.push_back(id);
      return;
    }
  }
  const std::string_view w = word;
  // Lower merge rank first.
  auto priority = [&](std::string_view l, std::string_view r) -> std::optional<double> {
    const int32_t rk = rank(l, r);
    if (rk < 0) return std::nullopt;
    return -double(rk);
  };
  for (const std::string_view piece : merge_pieces(w, priority)) {
    if (const int32_t id = find(piece); id >= 0) {
      out.push_back(id);
      continue;
    }
    for (char c : piece)  // a symbol no token spells: its single bytes that are tokens, the rest dropped
      if (const int32_t id = find(std::string_view(&c, 1)); id >= 0) out.push_back(id);
  }
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view text, bool parse_special) const {
  std::vector<int32_t> out;
  std::vector<std::string> words;
  // Long texts repeat words; the cache keeps BPE to once per distinct word.
  std::unordered_map<std::string, std::vector<int32_t>> cache;
  for (const Fragment& frag : partition(text, parse_special)) {
    if (frag.token >= 0) {
      out.push_back(frag.token);
      continue;
    }
    words.clear();
    split_words(frag.text, words);
    for (std::string& word : words) {
      auto [it, fresh] = cache.try_emplace(std::move(word));
      if (fresh) encode_word(it->first, it->second);
      out.insert(out.end(), it->second.begin(), it->second.end());
    }
  }
  return out;
}

std::string BpeTokenizer::decode(std::span<const int32_t> ids) const {
  std::string out;
  for (const int32_t id : ids) {
    const int32_t t = type_of(id);
    const std::string& piece = token_text(id);
    if (t == kControl) continue;
    if (t == kUserDefined || t == kUnknown) {
      out += piece;
      continue;
    }
    for (size_t i = 0; i < piece.size();) {
      const size_t len = std::min(piece.size() - i, utf8_len(piece[i]));
      const int b = unicode_to_byte(std::string_view(piece).substr(i, len));
      if (b >= 0) out += char(b);
      else out.append(piece, i, len);  // not in the byte alphabet: kept as written
      i += len;
    }
  }
  return out;
}

}  // namespace

std::unique_ptr<Tokenizer> make_bpe(const gguf::File& f, const std::string& pre) {
  for (const PreName& p : kPreNames)
    if (pre == p.name) return std::make_unique<BpeTokenizer>(f, p.kind, pre);
  std::string names;
  for (const PreName& p : kPreNames) names += std::string(names.empty() ? "" : ", ") + p.name;
  throw TokenizerError(f.path() + ": tokenizer.ggml.pre '" + pre + "' is not supported (supported: " + names +
                       "; a file without the key means default)");
}

}  // namespace q4t::tok::detail
