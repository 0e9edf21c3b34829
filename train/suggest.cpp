#include "train/suggest.h"

#include <algorithm>

namespace q4t {

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

std::string did_you_mean(const std::string& s, const std::vector<std::string>& names) {
  std::string best;
  size_t best_d = std::max<size_t>(2, s.size() / 3) + 1;
  for (const std::string& n : names) {
    const size_t d = edit_distance(s, n);
    if (d < best_d) best = n, best_d = d;
  }
  return best.empty() ? "" : " (did you mean '" + best + "'?)";
}

}  // namespace q4t
