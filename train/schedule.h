// The learning-rate schedule of `q4tune train`: linear warmup from 0, then constant, linear or cosine decay.
//
// With W warmup steps (warmup_steps, or ceil(warmup_ratio * total_steps) when warmup_steps is 0) and the 0-based
// step s (the optimizer step about to run, 0 .. total_steps-1):
//   s < W:    base_lr * s / W                                  (the first step of a warmup runs at 0, as in
//                                                               Hugging Face's schedulers)
//   s >= W:   constant: base_lr
//             linear:   min_lr + (base_lr - min_lr) * (1 - q)
//             cosine:   min_lr + (base_lr - min_lr) * (1 + cos(pi q)) / 2
// where q = (s - W) / (total_steps - W), clamped to [0, 1] (1 when warmup fills the whole run).
#pragma once
#include <cstdint>
#include <string>

namespace q4t::train {

struct ScheduleConfig {
  std::string kind = "cosine";  // constant | linear | cosine
  int64_t warmup_steps = 0;
  double warmup_ratio = 0;  // of total_steps, used when warmup_steps is 0; in [0, 1]
  double min_lr = 0;        // where linear and cosine decay end; in [0, base_lr]
};

// Throws std::invalid_argument naming the field (kind, warmup_steps, warmup_ratio, min_lr, base_lr, step,
// total_steps) for an unknown kind or a value out of range.
void validate(const ScheduleConfig& cfg, double base_lr);
double lr_at(int64_t step, int64_t total_steps, double base_lr, const ScheduleConfig& cfg);

}  // namespace q4t::train
