// The one table of ops, filled by the OpRegistration of each file under autograd/ops/.
#include <algorithm>
#include <cstring>

#include "autograd/gradcheck.h"
#include "autograd/ops.h"

namespace q4t::ag {

namespace {
struct Registry {
  std::vector<const OpDef*> ops;
  std::vector<void (*)(std::vector<GradcheckCase>&)> case_adders;
};
Registry& registry() {
  static Registry r;
  return r;
}
}  // namespace

OpRegistration::OpRegistration(std::initializer_list<const OpDef*> ops,
                               void (*add_cases)(std::vector<GradcheckCase>&)) {
  for (const OpDef* op : ops) registry().ops.push_back(op);
  if (add_cases) registry().case_adders.push_back(add_cases);
}

const std::vector<const OpDef*>& op_table() {
  static const std::vector<const OpDef*> table = [] {
    auto ops = registry().ops;
    std::sort(ops.begin(), ops.end(), [](const OpDef* a, const OpDef* b) { return std::strcmp(a->name, b->name) < 0; });
    return ops;
  }();
  return table;
}

const std::vector<GradcheckCase>& gradcheck_cases() {
  static const std::vector<GradcheckCase> cases = [] {
    std::vector<GradcheckCase> v;
    for (auto add : registry().case_adders) add(v);
    std::stable_sort(v.begin(), v.end(), [](const GradcheckCase& a, const GradcheckCase& b) { return a.name < b.name; });
    return v;
  }();
  return cases;
}

}  // namespace q4t::ag
