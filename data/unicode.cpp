#include "data/unicode.h"

#include <algorithm>
#include <array>
#include <unordered_map>

namespace q4t::tok {
namespace {
#include "data/unicode_table.inc"

bool continuation(std::string_view s, size_t i) { return i < s.size() && (uint8_t(s[i]) & 0xC0) == 0x80; }

// One code point at *pos, or false (malformed) without moving.
bool decode_one(std::string_view s, size_t* pos, uint32_t* cp) {
  const size_t i = *pos;
  const uint8_t b0 = uint8_t(s[i]);
  if (!(b0 & 0x80)) {
    *cp = b0;
    *pos += 1;
    return true;
  }
  if (!(b0 & 0x40)) return false;
  int n = 0;
  if (!(b0 & 0x20)) n = 2;
  else if (!(b0 & 0x10)) n = 3;
  else if (!(b0 & 0x08)) n = 4;
  else return false;
  for (int k = 1; k < n; ++k)
    if (!continuation(s, i + size_t(k))) return false;
  uint32_t v = b0 & (0x7F >> n);
  for (int k = 1; k < n; ++k) v = (v << 6) | (uint8_t(s[i + size_t(k)]) & 0x3F);
  *cp = v;
  *pos += size_t(n);
  return true;
}

// Classes of the Basic Multilingual Plane, looked up in O(1); the rest by binary search over the runs.
struct ClassTable {
  std::vector<uint8_t> bmp;  // bit 0 letter, bit 1 number, bit 2 space, bit 3 punctuation
  ClassTable() : bmp(0x10000) {
    for (uint32_t cp = 0; cp < 0x10000; ++cp) bmp[cp] = pack(slow(cp));
  }
  static uint8_t pack(CharClass c) {
    return uint8_t(c.letter | (c.number << 1) | (c.space << 2) | (c.punct << 3));
  }
  static CharClass slow(uint32_t cp) {
    const uint32_t key = (cp << 2) | 3;
    const auto* run = std::upper_bound(std::begin(kCategoryRuns), std::end(kCategoryRuns), key) - 1;
    CharClass c;
    c.letter = (*run & 3) == 1;
    c.number = (*run & 3) == 2;
    c.punct = (*run & 3) == 3;
    c.space = std::binary_search(std::begin(kWhiteSpace), std::end(kWhiteSpace), cp);
    return c;
  }
};

}  // namespace

std::vector<uint32_t> decode_utf8(std::string_view text) {
  std::vector<uint32_t> out;
  out.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) {
    uint32_t cp;
    if (decode_one(text, &pos, &cp)) {
      out.push_back(cp);
    } else {
      out.push_back(kReplacementChar);
      ++pos;
    }
  }
  return out;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp <= 0x7F) {
    out += char(cp);
  } else if (cp <= 0x7FF) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else if (cp <= 0xFFFF) {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else if (cp <= 0x10FFFF) {
    out += char(0xF0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else {
    append_utf8(out, kReplacementChar);
  }
}

CharClass char_class(uint32_t cp) {
  static const ClassTable table;
  if (cp < 0x10000) {
    const uint8_t b = table.bmp[cp];
    return {bool(b & 1), bool(b & 2), bool(b & 4), bool(b & 8)};
  }
  if (cp >= 0x110000) return {};
  return ClassTable::slow(cp);
}

namespace {
// GPT-2's table: printable Latin-1 bytes ('!'..'~', '¡'..'¬', '®'..'ÿ') stand for themselves, the other 68
// bytes take U+0100.. in byte order.
struct ByteAlphabet {
  std::array<std::string, 256> to_text;
  std::unordered_map<std::string, uint8_t> to_byte;
  ByteAlphabet() {
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      append_utf8(to_text[size_t(b)], printable ? uint32_t(b) : next++);
      to_byte[to_text[size_t(b)]] = uint8_t(b);
    }
  }
};
const ByteAlphabet& alphabet() {
  static const ByteAlphabet a;
  return a;
}
}  // namespace

const std::string& byte_to_unicode(uint8_t b) { return alphabet().to_text[b]; }

int unicode_to_byte(std::string_view ch) {
  const auto& m = alphabet().to_byte;
  const auto it = m.find(std::string(ch));
  return it == m.end() ? -1 : it->second;
}

}  // namespace q4t::tok
