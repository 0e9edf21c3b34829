// The 64-bit checksum of q4tune's own files and cache keys (checkpoints, tokenized-dataset caches, the tokenizer's
// content hash): XXH3 from xxHash, compiled in (XXH_INLINE_ALL), so the binary needs no libxxhash at run time.
// It detects truncation and corruption; it is not a defence against deliberate tampering.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace q4t {

inline uint64_t checksum64(const void* data, size_t n) { return XXH3_64bits(data, n); }

// 16 lowercase hex digits, as q4tune's files and cache names write a checksum.
inline std::string hex64(uint64_t v) {
  char b[17];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(v));
  return b;
}

// The same checksum over data given in pieces; u64() and str() frame values so that ("ab", "c") and ("a", "bc")
// differ.
class Checksum64 {
 public:
  Checksum64() { XXH3_64bits_reset(&state_); }
  void bytes(const void* data, size_t n) { XXH3_64bits_update(&state_, data, n); }
  void u64(uint64_t v) { bytes(&v, sizeof v); }
  void str(std::string_view s) {
    u64(s.size());
    bytes(s.data(), s.size());
  }
  uint64_t digest() const { return XXH3_64bits_digest(&state_); }

 private:
  XXH3_state_t state_;
};

}  // namespace q4t
