// The rewrite of NV cooperative-matrix SPIR-V into KHR (kernels/spirv/coop_khr.h): a hand-assembled module
// against the words it must become, the errors, and the embedded _khr kernels that the build made with it.
#include <gtest/gtest.h>

#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/spirv/coop_khr.h"
#include "kernels/vulkan/shaders.h"

namespace {

using Words = std::vector<uint32_t>;

// A module assembled from instructions given as {opcode, operands...}.
struct Module {
  Words words{0x07230203u, 0x00010300u, 0u, 0u, 0u};
  void add(uint32_t op, Words operands) {
    words.push_back((uint32_t(operands.size() + 1) << 16) | op);
    words.insert(words.end(), operands.begin(), operands.end());
  }
  void add_string(uint32_t op, const std::string& s) {
    Words w((s.size() + 4) / 4, 0);
    std::memcpy(w.data(), s.data(), s.size());
    add(op, w);
  }
  Words finish(uint32_t bound) {
    words[3] = bound;
    return words;
  }
};

std::string what_of(const Words& m) {
  try {
    q4t::spirv::nv_to_khr_coopmat(m);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

// Ids: 1 uint, 2 const 3 (subgroup), 3 const 16, 4 f16, 5 f32, 6 A type, 7 spec 16, 8 B type, 9 C type, 10 bool,
// 11 true, 12 false, 13-16 values, 17 length, 18 length as a specialization constant, 19 computed from it, 20 a
// pointer, 21-26 the function's void, types, label and variable. `b_type` 8 gives B its own type; 6 makes A and
// B one type.
Words nv_module(uint32_t b_type, uint32_t b_layout = 11) {
  Module m;
  m.add(17, {1});     // OpCapability Shader
  m.add(17, {5357});  // OpCapability CooperativeMatrixNV
  m.add_string(10, "SPV_NV_cooperative_matrix");
  m.add(14, {0, 1});  // OpMemoryModel Logical GLSL450
  m.add(21, {1, 32, 0});
  m.add(43, {1, 2, 3});
  m.add(43, {1, 3, 16});
  m.add(22, {4, 16});
  m.add(22, {5, 32});
  m.add(5358, {6, 4, 2, 3, 3});
  m.add(50, {1, 7, 16});  // OpSpecConstant
  m.add(5358, {8, 4, 2, 7, 3});
  m.add(5358, {9, 5, 2, 3, 3});
  m.add(20, {10});
  m.add(41, {10, 11});
  m.add(42, {10, 12});
  m.add(52, {1, 18, 5362, 9});    // OpSpecConstantOp length
  m.add(52, {1, 19, 128, 18, 3});  // OpSpecConstantOp IAdd
  m.add(19, {21});                 // OpTypeVoid
  m.add(33, {22, 21});             // OpTypeFunction
  m.add(32, {23, 7, 1});           // OpTypePointer Function uint
  m.add(54, {21, 24, 0, 22});      // OpFunction
  m.add(248, {25});                // OpLabel
  m.add(59, {23, 26, 7});          // OpVariable Function
  m.add(5359, {6, 13, 20, 3, 12});
  m.add(5359, {b_type, 14, 20, 3, b_layout, 0});
  m.add(5359, {9, 15, 20, 3, 12});
  m.add(5361, {9, 16, 13, 14, 15});
  m.add(5360, {20, 16, 3, 12, 0});
  m.add(5362, {1, 17, 9});
  m.add(253, {});  // OpReturn
  m.add(56, {});   // OpFunctionEnd
  return m.finish(27);
}

TEST(CoopKhr, RewritesEveryNvInstructionToItsKhrTwin) {
  Module e;  // what nv_module(8) must become: uses 0, 1, 2 as new constants 27, 28, 29 after the integer type
  e.add(17, {1});
  e.add(17, {6022});
  e.add_string(10, "SPV_KHR_cooperative_matrix");
  e.add(14, {0, 1});
  e.add(21, {1, 32, 0});
  e.add(43, {1, 27, 0});
  e.add(43, {1, 28, 1});
  e.add(43, {1, 29, 2});
  e.add(43, {1, 2, 3});
  e.add(43, {1, 3, 16});
  e.add(22, {4, 16});
  e.add(22, {5, 32});
  e.add(4456, {6, 4, 2, 3, 3, 27});
  e.add(50, {1, 7, 16});
  e.add(4456, {8, 4, 2, 7, 3, 28});
  e.add(4456, {9, 5, 2, 3, 3, 29});
  e.add(20, {10});
  e.add(41, {10, 11});
  e.add(42, {10, 12});
  e.add(19, {21});
  e.add(33, {22, 21});
  e.add(32, {23, 7, 1});
  e.add(54, {21, 24, 0, 22});
  e.add(248, {25});
  e.add(59, {23, 26, 7});
  e.add(4460, {1, 18, 9});             // the specialization-constant length, now an instruction
  e.add(128, {1, 19, 18, 3});          // and the OpIAdd computed from it
  e.add(4457, {6, 13, 20, 27, 3});      // row-major: layout 0 before the stride
  e.add(4457, {8, 14, 20, 28, 3, 0});   // column-major: layout 1, the memory operand kept
  e.add(4457, {9, 15, 20, 27, 3});
  e.add(4459, {9, 16, 13, 14, 15});
  e.add(4458, {20, 16, 27, 3, 0});
  e.add(4460, {1, 17, 9});
  e.add(253, {});
  e.add(56, {});
  EXPECT_EQ(q4t::spirv::nv_to_khr_coopmat(nv_module(8)), e.finish(30));
}

TEST(CoopKhr, RefusesWhatItCannotRewrite) {
  EXPECT_NE(what_of(nv_module(6)).find("used as both A and B"), std::string::npos) << what_of(nv_module(6));
  EXPECT_NE(what_of(nv_module(8, 3)).find("not a boolean constant"), std::string::npos);
  Words cut = nv_module(8);
  cut.resize(cut.size() - 3);  // OpFunctionEnd, OpReturn and the length's last word
  EXPECT_NE(what_of(cut).find("runs past the module's end"), std::string::npos);
  EXPECT_NE(what_of({1, 2, 3}).find("not a SPIR-V module"), std::string::npos);
  // An accumulator converted into an A operand (NV allows it, KHR does not).
  Words convert = nv_module(8);
  convert.insert(convert.end() - 2, {(4u << 16) | 115u, 6u, 30u, 16u});  // OpFConvert %30 of type A from C's %16
  convert[3] = 31;
  EXPECT_NE(what_of(convert).find("between matrices of different uses"), std::string::npos) << what_of(convert);
  // A length sizing an array type cannot move into the function.
  Words sized = nv_module(8);
  sized.insert(sized.end() - 2, {(4u << 16) | 28u, 30u, 1u, 18u});  // OpTypeArray %30 %uint %18, at the end
  sized[3] = 31;
  EXPECT_NE(what_of(sized).find("sizes a type or a constant"), std::string::npos) << what_of(sized);
  // A module without cooperative matrices passes word for word.
  Module plain;
  plain.add(17, {1});
  plain.add(21, {1, 32, 0});
  const Words p = plain.finish(2);
  EXPECT_EQ(q4t::spirv::nv_to_khr_coopmat(p), p);
}

// Every embedded kernel built with COOP_KHR holds KHR instructions only, each matrix type with a use; the NV
// kernels they come from, whose A and B share a type, are refused.
TEST(CoopKhr, EmbeddedKhrKernelsHaveNoNvInstructions) {
  int khr = 0;
  for (const auto& [name, words] : q4t::vk::shader_table()) {
    const bool is_khr = name.size() > 4 && name.compare(name.size() - 4, 4, "_khr") == 0;
    if (!is_khr) continue;
    ++khr;
    int types = 0, nv = 0;
    for (size_t i = 5; i < words.size(); i += words[i] >> 16) {
      const uint32_t op = words[i] & 0xFFFFu, n = words[i] >> 16;
      ASSERT_GT(n, 0u) << name;
      if (op >= 5358 && op <= 5362) ++nv;
      EXPECT_FALSE(op == 52 && words[i + 3] == 4460) << name << ": a length left as a specialization constant";
      if (op == 4456) {
        EXPECT_EQ(n, 7u) << name;
        ++types;
      }
    }
    EXPECT_EQ(nv, 0) << name;
    EXPECT_GE(types, 3) << name;  // A, B and the accumulator
    const auto nv_twin = q4t::vk::shader_table().find(name.substr(0, name.size() - 4));
    ASSERT_NE(nv_twin, q4t::vk::shader_table().end()) << name;
    const Words twin(nv_twin->second.begin(), nv_twin->second.end());
    EXPECT_NE(what_of(twin).find("used as both A and B"), std::string::npos) << name;
  }
  EXPECT_GE(khr, 2);
}

}  // namespace
