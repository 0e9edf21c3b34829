#include "kernels/spirv/coop_khr.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <stdexcept>
#include <string>

namespace q4t::spirv {
namespace {

using Words = std::vector<uint32_t>;

// Opcodes, capabilities and operand values of the SPIR-V specification that the rewrite reads or writes.
enum : uint32_t {
  kMagic = 0x07230203u,
  OpExtension = 10,
  OpCapability = 17,
  OpTypeInt = 21,
  OpConstantTrue = 41,
  OpConstantFalse = 42,
  OpConstant = 43,
  OpSpecConstantOp = 52,
  OpSpecConstantComposite = 51,
  OpConstantComposite = 44,
  OpTypeArray = 28,
  OpFunction = 54,
  OpLabel = 248,
  OpVariable = 59,
  OpTypeCoopNV = 5358,
  OpLoadNV = 5359,
  OpStoreNV = 5360,
  OpMulAddNV = 5361,
  OpLengthNV = 5362,
  OpTypeCoopKHR = 4456,
  OpLoadKHR = 4457,
  OpStoreKHR = 4458,
  OpMulAddKHR = 4459,
  OpLengthKHR = 4460,
  CapCoopNV = 5357,
  CapCoopKHR = 6022,
  kUseA = 0,
  kUseB = 1,
  kUseAccumulator = 2,
  kRowMajor = 0,
  kColumnMajor = 1,
};
constexpr const char* kExtNV = "SPV_NV_cooperative_matrix";
constexpr const char* kExtKHR = "SPV_KHR_cooperative_matrix";

uint32_t opcode(const Words& w) { return w[0] & 0xFFFFu; }

// Whether an instruction whose first operand is a type id is a value of that type: not a debug name, an
// annotation or a type declaration (which name types, not values, in that place).
bool has_result_type(uint32_t op) {
  const bool debug = op >= 2 && op <= 8, annotation = op >= 71 && op <= 75, type = op >= 19 && op <= 39;
  return !debug && !annotation && !type && op != OpTypeCoopNV;
}

Words string_words(const std::string& s) {
  Words w((s.size() + 4) / 4, 0);  // NUL-terminated, padded to a word
  std::memcpy(w.data(), s.data(), s.size());
  return w;
}

std::string word_string(const Words& w, size_t first) {
  const char* c = reinterpret_cast<const char*>(w.data() + first);
  return std::string(c, strnlen(c, (w.size() - first) * 4));
}

std::vector<Words> split(std::span<const uint32_t> m) {
  if (m.size() < 5 || m[0] != kMagic) throw std::runtime_error("not a SPIR-V module (no magic number)");
  std::vector<Words> ins;
  for (size_t i = 5; i < m.size();) {
    const uint32_t n = m[i] >> 16;
    if (n == 0 || i + n > m.size())
      throw std::runtime_error("instruction at word " + std::to_string(i) + " runs past the module's end");
    ins.emplace_back(m.begin() + i, m.begin() + i + n);
    i += n;
  }
  return ins;
}

// The use of every NV matrix type: from each multiply-add's result type and the types of its A, B and C values.
std::map<uint32_t, uint32_t> matrix_uses(const std::vector<Words>& ins) {
  std::map<uint32_t, int> use;
  for (const Words& w : ins)
    if (opcode(w) == OpTypeCoopNV) use.emplace(w[1], -1);
  std::map<uint32_t, uint32_t> value_type;  // every value whose result type is a matrix type
  for (const Words& w : ins)
    if (w.size() >= 3 && use.count(w[1]) && has_result_type(opcode(w))) value_type[w[2]] = w[1];
  auto mark = [&](uint32_t type, int u) {
    int& cur = use.at(type);
    if (cur >= 0 && cur != u)
      throw std::runtime_error("cooperative matrix type %" + std::to_string(type) + " is used as both " +
                               (cur == kUseA ? "A" : cur == kUseB ? "B" : "accumulator") + " and " +
                               (u == kUseA ? "A" : u == kUseB ? "B" : "accumulator") +
                               " (give one of them another type)");
    cur = u;
  };
  for (const Words& w : ins) {
    if (opcode(w) != OpMulAddNV) continue;
    const uint32_t operands[3] = {w[3], w[4], w[5]};
    for (int k = 0; k < 3; ++k) {
      auto t = value_type.find(operands[k]);
      if (t == value_type.end())
        throw std::runtime_error("a multiply-add operand (%" + std::to_string(operands[k]) + ") has no matrix type");
      mark(t->second, k == 2 ? int(kUseAccumulator) : k);
    }
    mark(w[1], kUseAccumulator);
  }
  std::map<uint32_t, uint32_t> out;
  for (const auto& [t, u] : use) out[t] = u < 0 ? uint32_t(kUseAccumulator) : uint32_t(u);
  // KHR converts a matrix only into one of the same use (NV converted an accumulator into an A, for instance).
  for (const Words& w : ins) {
    const uint32_t op = opcode(w);
    const bool conversion = (op >= 109 && op <= 116) || op == 124;  // OpConvertFToU .. OpQuantizeToF16, OpBitcast
    if (!conversion || w.size() < 4 || !out.count(w[1])) continue;
    auto from = value_type.find(w[3]);
    if (from != value_type.end() && out.at(from->second) != out.at(w[1]))
      throw std::runtime_error("a conversion (%" + std::to_string(w[2]) + ") between matrices of different uses");
  }
  return out;
}

// A matrix's length as a specialization constant (glslang writes `m.length()` so) stops the driver's compiler, so
// it moves into the function as an instruction, with every OpSpecConstantOp computed from it: these are returned
// as the instructions they become (in module order), and their ids are erased from `ins`' globals.
Words function_level_lengths(std::vector<Words>& ins) {
  std::map<uint32_t, bool> moved;
  Words code;
  std::vector<Words> kept;
  for (const Words& w : ins) {
    bool move = false;
    if (opcode(w) == OpSpecConstantOp && w.size() > 3) {
      move = w[3] == OpLengthNV;
      for (size_t k = 4; k < w.size(); ++k) move = move || moved.count(w[k]);
    }
    if (!move) {
      kept.push_back(w);
      continue;
    }
    moved[w[2]] = true;
    const uint32_t op = w[3] == OpLengthNV ? uint32_t(OpLengthKHR) : w[3];
    code.push_back((uint32_t(w.size() - 1) << 16) | op);
    code.insert(code.end(), {w[1], w[2]});
    code.insert(code.end(), w.begin() + 4, w.end());
  }
  for (const Words& w : kept) {  // array lengths and constituents of composite constants, from word 3 on
    const uint32_t op = opcode(w);
    if (op != OpTypeArray && op != OpConstantComposite && op != OpSpecConstantComposite) continue;
    for (size_t k = 3; k < w.size(); ++k)
      if (moved.count(w[k]))
        throw std::runtime_error("a matrix length (%" + std::to_string(w[k]) + ") sizes a type or a constant");
  }
  ins = std::move(kept);
  return code;
}

}  // namespace

std::vector<uint32_t> nv_to_khr_coopmat(std::span<const uint32_t> module) {
  std::vector<Words> ins = split(module);
  const Words lengths = function_level_lengths(ins);
  const auto functions = std::count_if(ins.begin(), ins.end(), [](const Words& w) { return opcode(w) == OpFunction; });
  if (!lengths.empty() && functions != 1)
    throw std::runtime_error("a matrix length in a module of more than one function (or none)");
  const std::map<uint32_t, uint32_t> uses = matrix_uses(ins);
  uint32_t bound = module[3];
  uint32_t uint_type = 0;
  std::map<uint32_t, bool> bools;
  for (const Words& w : ins) {
    if (opcode(w) == OpTypeInt && w.size() == 4 && w[2] == 32 && w[3] == 0 && !uint_type) uint_type = w[1];
    if (opcode(w) == OpConstantTrue || opcode(w) == OpConstantFalse) bools[w[2]] = opcode(w) == OpConstantTrue;
  }
  if (!uses.empty() && !uint_type) throw std::runtime_error("cooperative matrices without a 32-bit unsigned type");
  // The constants 0, 1 and 2 (uses and layouts), new ids declared right after the unsigned integer type.
  uint32_t value_id[3];
  Words constants;
  for (uint32_t v = 0; v < 3; ++v) {
    value_id[v] = bound++;
    constants.insert(constants.end(), {(4u << 16) | OpConstant, uint_type, value_id[v], v});
  }
  auto layout_of = [&](uint32_t bool_id) {
    auto b = bools.find(bool_id);
    if (b == bools.end())
      throw std::runtime_error("a matrix load or store whose column-major operand (%" + std::to_string(bool_id) +
                               ") is not a boolean constant");
    return value_id[b->second ? kColumnMajor : kRowMajor];
  };
  Words out(module.begin(), module.begin() + 5);
  bool in_entry = false, lengths_placed = lengths.empty();
  for (const Words& w : ins) {
    // The lengths go after the entry block's OpVariables (which must come first in it).
    if (!lengths_placed && in_entry && opcode(w) != OpVariable) {
      out.insert(out.end(), lengths.begin(), lengths.end());
      lengths_placed = true;
    }
    if (opcode(w) == OpLabel && !lengths_placed) in_entry = true;
    Words r = w;
    switch (opcode(w)) {
      case OpCapability:
        if (w[1] == CapCoopNV) r[1] = CapCoopKHR;
        break;
      case OpExtension:
        if (word_string(w, 1) == kExtNV) {
          r = {0};
          const Words s = string_words(kExtKHR);
          r.insert(r.end(), s.begin(), s.end());
          r[0] = (uint32_t(r.size()) << 16) | OpExtension;
        }
        break;
      case OpTypeCoopNV:  // result, component type, scope, rows, columns (+ use)
        r = {(7u << 16) | OpTypeCoopKHR, w[1], w[2], w[3], w[4], w[5], value_id[uses.at(w[1])]};
        break;
      case OpLoadNV:  // type, result, pointer, stride, column-major [, memory access] -> pointer, layout, stride
        r = {0, w[1], w[2], w[3], layout_of(w[5]), w[4]};
        r.insert(r.end(), w.begin() + 6, w.end());
        r[0] = (uint32_t(r.size()) << 16) | OpLoadKHR;
        break;
      case OpStoreNV:  // pointer, object, stride, column-major [, memory access] -> pointer, object, layout, stride
        r = {0, w[1], w[2], layout_of(w[4]), w[3]};
        r.insert(r.end(), w.begin() + 5, w.end());
        r[0] = (uint32_t(r.size()) << 16) | OpStoreKHR;
        break;
      case OpMulAddNV:
        r[0] = (w[0] & 0xFFFF0000u) | OpMulAddKHR;
        break;
      case OpLengthNV:
        r[0] = (w[0] & 0xFFFF0000u) | OpLengthKHR;
        break;
      case OpSpecConstantOp:  // type, result, opcode, operands
        if (w.size() > 3 && (w[3] == OpLoadNV || w[3] == OpStoreNV || w[3] == OpMulAddNV))
          throw std::runtime_error("a cooperative matrix operation inside OpSpecConstantOp");
        break;
      default:
        break;
    }
    out.insert(out.end(), r.begin(), r.end());
    if (opcode(w) == OpTypeInt && w[1] == uint_type && !uses.empty())
      out.insert(out.end(), constants.begin(), constants.end());
  }
  if (!uses.empty()) out[3] = bound;
  return out;
}

}  // namespace q4t::spirv
