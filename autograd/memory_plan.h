// Placing tensors of known lifetimes into one arena: two tensors may share bytes only when no step at which
// one is live falls inside a live interval of the other. Steps are the positions of a graph's schedule
// (forward pass, then backward pass with its recomputation); see Graph::plan_memory.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace q4t::ag {

struct LiveInterval {
  int64_t first = 0, last = 0;  // steps, inclusive
};
struct PlanItem {
  size_t bytes = 0;
  std::vector<LiveInterval> live;  // sorted, disjoint; empty: never used
};
struct Placement {
  std::vector<size_t> offset;  // per item, a multiple of the alignment
  size_t bytes = 0;            // the arena's size
};

bool live_together(const PlanItem& a, const PlanItem& b);
// Largest first, each at the lowest aligned offset that no item live at the same time occupies. An arena past
// SIZE_MAX bytes is SIZE_MAX.
Placement place_items(const std::vector<PlanItem>& items, size_t align);

}  // namespace q4t::ag
