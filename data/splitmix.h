// splitmix64 (Steele, Lea, Flood): the 64-bit mixer behind q4tune's derived seeds and hashes.
#pragma once
#include <cstdint>

namespace q4t {

// The finalizer: a bijection of 64-bit values that spreads every input bit over the output.
inline uint64_t mix64(uint64_t x) {
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// The value splitmix64 draws from state x: a pure function of x.
inline uint64_t splitmix64(uint64_t x) { return mix64(x + 0x9E3779B97F4A7C15ull); }

// The generator: advances state and returns the next value of its stream.
inline uint64_t splitmix64_next(uint64_t& state) { return mix64(state += 0x9E3779B97F4A7C15ull); }

}  // namespace q4t
