// Random inputs of the kernels' checks, shared by tests/ and `q4tune selftest`: uniform and normal floats, and
// weights in a frozen format quantized from uniform ones.
#pragma once
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/formats.h"

namespace q4t {

// n floats uniform in [-scale, scale].
inline std::vector<float> random_floats(std::mt19937& rng, int64_t n, float scale = 1.0f) {
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = u(rng);
  return v;
}

// n floats from N(0, sigma^2), drawn from a generator seeded with `seed`: the same seed gives the same floats.
inline std::vector<float> normal_floats(int64_t n, uint32_t seed, float sigma = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, sigma);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = normal(rng);
  return v;
}

// W [n_out, n_in] in format f as GGML stores it, quantized from weights uniform in [-1, 1].
inline std::vector<uint8_t> random_weights(std::mt19937& rng, Format f, int64_t n_out, int64_t n_in) {
  return quantize_matrix(f, random_floats(rng, n_out * n_in), n_out, n_in);
}

}  // namespace q4t
