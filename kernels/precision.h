// The numerics of the products (--precision): f32, or mixed (f16 inputs, f32 accumulation; see
// vk::LinearKernels' "Mixed precision").
#pragma once
#include <stdexcept>
#include <string>

namespace q4t {

enum class Precision { F32, Mixed };

inline const char* precision_name(Precision p) { return p == Precision::Mixed ? "mixed" : "f32"; }

// "f32" or "mixed"; anything else throws std::invalid_argument naming `what` (the flag or key).
inline Precision parse_precision(const std::string& s, const std::string& what) {
  if (s == "f32") return Precision::F32;
  if (s == "mixed") return Precision::Mixed;
  throw std::invalid_argument(what + ": '" + s + "' is not a precision (f32 or mixed)");
}

}  // namespace q4t
