// The Unicode pieces llama.cpp's tokenizers rely on, reproduced to the byte: its lenient UTF-8 decoder, the
// \p{L} / \p{N} / \p{P} / White_Space classes its pre-tokenizers split on, and GPT-2's byte <-> printable-character
// map.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace q4t::tok {

inline constexpr uint32_t kReplacementChar = 0xFFFD;

// Length of the UTF-8 sequence a lead byte announces, from its high nibble alone (1 for continuation and
// invalid bytes) — how llama.cpp cuts SPM and BPE symbols, valid or not.
inline size_t utf8_len(char lead) {
  static constexpr uint8_t kLen[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kLen[uint8_t(lead) >> 4];
}

// Code points of text. A byte that does not start a well-formed sequence becomes U+FFFD and decoding resumes at
// the next byte (overlong forms and surrogates are accepted), exactly as llama.cpp's unicode_cpts_from_utf8.
std::vector<uint32_t> decode_utf8(std::string_view text);
// Appends the UTF-8 of cp; values above U+10FFFF (which a 4-byte form can decode to) append U+FFFD.
void append_utf8(std::string& out, uint32_t cp);

struct CharClass {
  bool letter = false, number = false, space = false, punct = false;  // \p{L} \p{N} White_Space \p{P}
};
CharClass char_class(uint32_t cp);

// GPT-2's byte-level alphabet: every byte as one printable code point, in UTF-8.
const std::string& byte_to_unicode(uint8_t b);
// The byte a GPT-2 alphabet character (UTF-8, one code point) stands for, or -1.
int unicode_to_byte(std::string_view ch);

}  // namespace q4t::tok
