#include "autograd/memory_plan.h"

#include <algorithm>
#include <limits>
#include <numeric>
#include <utility>

namespace q4t::ag {

bool live_together(const PlanItem& a, const PlanItem& b) {
  size_t i = 0, j = 0;
  while (i < a.live.size() && j < b.live.size()) {
    const LiveInterval &x = a.live[i], &y = b.live[j];
    if (x.first <= y.last && y.first <= x.last) return true;
    if (x.last < y.last)
      ++i;
    else
      ++j;
  }
  return false;
}

Placement place_items(const std::vector<PlanItem>& items, size_t align) {
  // Sizes past the address space saturate at SIZE_MAX (an arena no allocation can give), never wrap around.
  constexpr size_t kMax = std::numeric_limits<size_t>::max();
  auto up = [&](size_t n) { return n > kMax - align ? kMax : (n + align - 1) / align * align; };
  auto end_of = [](size_t at, size_t bytes) { return bytes > kMax - at ? kMax : at + bytes; };
  std::vector<size_t> order(items.size());
  std::iota(order.begin(), order.end(), size_t(0));
  auto start = [&](size_t i) { return items[i].live.empty() ? int64_t(0) : items[i].live.front().first; };
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return items[a].bytes != items[b].bytes ? items[a].bytes > items[b].bytes : start(a) < start(b);
  });
  Placement p;
  p.offset.assign(items.size(), 0);
  std::vector<size_t> placed;
  std::vector<std::pair<size_t, size_t>> taken;  // [offset, end) of the placed items live with this one
  for (size_t i : order) {
    if (items[i].live.empty()) continue;  // never used: offset 0, sharing with anything
    taken.clear();
    for (size_t j : placed)
      if (live_together(items[i], items[j])) taken.emplace_back(p.offset[j], end_of(p.offset[j], items[j].bytes));
    std::sort(taken.begin(), taken.end());
    size_t at = 0;
    for (const auto& [off, end] : taken) {
      if (off >= end_of(at, items[i].bytes)) break;
      at = std::max(at, up(end));
    }
    p.offset[i] = at;
    p.bytes = std::max(p.bytes, up(end_of(at, items[i].bytes)));
    placed.push_back(i);
  }
  return p;
}

}  // namespace q4t::ag
