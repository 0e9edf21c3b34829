#include "train/schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <stdexcept>

namespace q4t::train {

namespace {
[[noreturn]] void bad(const std::string& field, const std::string& value, const std::string& want) {
  throw std::invalid_argument("schedule " + field + " = " + value + ": " + want);
}
}  // namespace

void validate(const ScheduleConfig& cfg, double base_lr) {
  if (cfg.kind != "constant" && cfg.kind != "linear" && cfg.kind != "cosine")
    bad("kind", "'" + cfg.kind + "'", "expected constant, linear or cosine");
  if (cfg.warmup_steps < 0) bad("warmup_steps", std::to_string(cfg.warmup_steps), "must be >= 0");
  if (!(cfg.warmup_ratio >= 0 && cfg.warmup_ratio <= 1))
    bad("warmup_ratio", std::to_string(cfg.warmup_ratio), "must be in [0, 1]");
  if (!(base_lr >= 0)) bad("base_lr", std::to_string(base_lr), "must be >= 0");
  if (!(cfg.min_lr >= 0)) bad("min_lr", std::to_string(cfg.min_lr), "must be >= 0");
  if (cfg.min_lr > base_lr)
    bad("min_lr", std::to_string(cfg.min_lr), "must not exceed the learning rate " + std::to_string(base_lr));
}

double lr_at(int64_t step, int64_t total_steps, double base_lr, const ScheduleConfig& cfg) {
  validate(cfg, base_lr);
  if (step < 0) bad("step", std::to_string(step), "must be >= 0");
  if (total_steps < 0) bad("total_steps", std::to_string(total_steps), "must be >= 0");
  const int64_t warmup =
      cfg.warmup_steps > 0 ? cfg.warmup_steps : int64_t(std::ceil(cfg.warmup_ratio * double(total_steps)));
  if (step < warmup) return base_lr * double(step) / double(warmup);
  if (cfg.kind == "constant") return base_lr;
  const double q =
      total_steps > warmup ? std::clamp(double(step - warmup) / double(total_steps - warmup), 0.0, 1.0) : 1.0;
  const double factor = cfg.kind == "linear" ? 1.0 - q : 0.5 * (1.0 + std::cos(std::numbers::pi * q));
  return cfg.min_lr + (base_lr - cfg.min_lr) * factor;
}

}  // namespace q4t::train
