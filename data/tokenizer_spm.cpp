// tokenizer.ggml.model "llama": SentencePiece-style BPE over token scores, as llama.cpp's llm_tokenizer_spm.
// The text (with "▁" for every space, and one leading "▁" when add_space_prefix) starts as one symbol per UTF-8
// character; the adjacent pair whose concatenation is the highest-scoring token merges first (ties: leftmost),
// until no pair is a token. A final symbol that is not a token falls back to its bytes' <0xXX> tokens.
#include <array>
#include <bit>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <queue>

#include "data/tokenizer_impl.h"
#include "data/unicode.h"

namespace q4t::tok::detail {
namespace {

constexpr std::string_view kSpaceMark = "\xE2\x96\x81";  // U+2581 "▁"

class SpmTokenizer final : public VocabTokenizer {
 public:
  explicit SpmTokenizer(const gguf::File& f) {
    bos_ = 1;  // llama.cpp's defaults for this model when the keys are absent
    eos_ = 2;
    add_bos_ = true;
    load_common(f);
    try {
      add_space_prefix_ = f.get_bool_or("tokenizer.ggml.add_space_prefix", true);
      if (!f.find("tokenizer.ggml.scores"))
        throw TokenizerError(f.path() + ": tokenizer.ggml.model 'llama' needs tokenizer.ggml.scores");
      const auto& scores = f.get_array("tokenizer.ggml.scores", gguf::ValueType::F32);
      if (scores.size() != tokens_.size())
        throw TokenizerError(f.path() + ": tokenizer.ggml.scores has " + std::to_string(scores.size()) +
                             " entries for " + std::to_string(tokens_.size()) + " tokens");
      for (const auto& s : scores) scores_.push_back(float(std::get<double>(s.v)));
    } catch (const gguf::FormatError& e) {
      throw TokenizerError(e.what());
    }
    for (int b = 0; b < 256; ++b) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "<0x%02X>", b);
      byte_token_[size_t(b)] = find(hex);
      if (byte_token_[size_t(b)] < 0) byte_token_[size_t(b)] = find(std::string(1, char(b)));
    }
    Checksum64 h;
    h.str("llama");
    h.u64(add_space_prefix_);
    add_vocabulary(h);
    for (float score : scores_) h.u64(std::bit_cast<uint32_t>(score));
    hash_ = h.digest();
  }

  std::vector<int32_t> encode(std::string_view text, bool parse_special) const override {
    std::vector<int32_t> out;
    bool after_special = true;  // the text start counts as "after a special token": it gets the prefix space
    std::string escaped;
    for (const Fragment& frag : partition(text, parse_special)) {
      if (frag.token >= 0) {
        out.push_back(frag.token);
        after_special = true;
        continue;
      }
      escaped.clear();
      if (add_space_prefix_ && after_special) escaped += kSpaceMark;
      for (char c : frag.text) {
        if (c == ' ') escaped += kSpaceMark;
        else escaped += c;
      }
      encode_piece(escaped, out);
      after_special = false;
    }
    return out;
  }

  std::string decode(std::span<const int32_t> ids) const override {
    std::string out;
    bool strip_space = add_space_prefix_;  // llama.cpp drops the first token's leading space
    for (const int32_t id : ids) {
      const int32_t t = type_of(id);
      const std::string& piece = token_text(id);
      std::string text;
      if (t == kControl) {
        text.clear();
      } else if (t == kByte && piece.size() == 6 && piece.starts_with("<0x")) {
        text = char(byte_of(id, piece));
      } else if (t == kUserDefined) {
        text = piece;  // written as is, "▁" included
      } else if (t == kUnknown) {
        text = "\xE2\x96\x85";  // "▅", llama.cpp's rendering of the unknown token
      } else {
        for (size_t i = 0; i < piece.size();) {
          if (std::string_view(piece).substr(i).starts_with(kSpaceMark)) {
            text += ' ';
            i += kSpaceMark.size();
          } else {
            text += piece[i++];
          }
        }
      }
      if (strip_space && !text.empty() && text[0] == ' ') text.erase(0, 1);
      strip_space = false;
      out += text;
    }
    return out;
  }

 private:
  // The byte a byte token's text <0xHH> stands for.
  static uint8_t byte_of(int32_t id, const std::string& piece) {
    auto hex = [](char c) {
      const int l = std::tolower(uint8_t(c));
      return l >= '0' && l <= '9' ? l - '0' : l >= 'a' && l <= 'f' ? l - 'a' + 10 : -1;
    };
    const int hi = hex(piece[3]), lo = hex(piece[4]);
    if (hi < 0 || lo < 0 || piece[5] != '>') {
      throw TokenizerError("token " + std::to_string(id) + " '" + piece +
                           "' is a byte token, but its text is not <0x00>..<0xFF>");
    }
    return uint8_t(hi * 16 + lo);
  }

  // Merges by the score of the token a pair spells (highest first); pieces no token spells go out as bytes.
  void encode_piece(std::string_view s, std::vector<int32_t>& out) const {
    auto score = [&](std::string_view l, std::string_view r) -> std::optional<double> {
      const int32_t id = find(std::string_view(l.data(), l.size() + r.size()));  // adjacent in s
      if (id < 0) return std::nullopt;
      return double(scores_[size_t(id)]);
    };
    for (const std::string_view piece : merge_pieces(s, score)) {
      const int32_t id = find(piece);
      if (id >= 0) {
        out.push_back(id);
        continue;
      }
      for (char c : piece) {
        const int32_t byte_id = byte_token_[uint8_t(c)];
        if (byte_id < 0)
          throw TokenizerError("the vocabulary has no byte token <0x" + std::to_string(uint8_t(c)) +
                               "> (decimal) for a character it cannot spell");
        out.push_back(byte_id);
      }
    }
  }

  std::vector<float> scores_;
  bool add_space_prefix_ = true;
  std::array<int32_t, 256> byte_token_{};
};

}  // namespace

std::unique_ptr<Tokenizer> make_spm(const gguf::File& f) { return std::make_unique<SpmTokenizer>(f); }

}  // namespace q4t::tok::detail
