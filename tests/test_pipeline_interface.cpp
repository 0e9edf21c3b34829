// A pipeline's layout against its shader: the SPIR-V reflection (storage buffers, which of them are written, the
// push-constant block's size) and the check at creation that the C++ side asks for exactly what the shader declares.
#include <gtest/gtest.h>

#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/vulkan/device.h"
#include "kernels/vulkan/pipeline.h"
#include "kernels/vulkan/shaders.h"

namespace q4t {
namespace {

// Which bindings a shader writes, from its SPIR-V: writeonly and read-write buffers count, readonly ones do not,
// also where two readonly views share a binding (the tensor-core GEMM's A).
TEST(SpirvReflection, FindsTheBindingsAShaderWritesAndItsPushBlock) {
  const auto& table = vk::shader_table();
  const auto copy = vk::reflect_spirv(table.at("copy"));
  EXPECT_EQ(copy.bindings, (std::vector<uint32_t>{0, 1}));
  EXPECT_EQ(copy.writes, (std::vector<bool>{true, false}));
  EXPECT_EQ(copy.push_bytes, 4u);  // { uint n_vec4; }
  EXPECT_EQ(vk::reflect_spirv(table.at("q4_0_dx_reduce")).writes, (std::vector<bool>{true, false}));
  const auto coop = vk::reflect_spirv(table.at("q4_0_gemm_coop"));
  EXPECT_EQ(coop.writes, (std::vector<bool>{true, false, false, false, false}));
  EXPECT_EQ(coop.push_bytes, 40u);  // gemm_push.glsl: ten 4-byte fields
  const std::vector<uint32_t> junk{1, 2, 3, 4, 5, 6};
  EXPECT_THROW(vk::reflect_spirv(junk), vk::DeviceError);
}

// Every shader of ours declares its buffers at bindings 0..n-1 of set 0 and a block the reflection can size, so
// the check at pipeline creation covers all of them.
TEST(SpirvReflection, EveryEmbeddedShaderHasDenseBindingsAndASizedPushBlock) {
  for (const auto& [name, words] : vk::shader_table()) {
    SCOPED_TRACE(name);
    vk::ShaderInterface s;
    ASSERT_NO_THROW(s = vk::reflect_spirv(words));
    std::vector<uint32_t> dense(s.bindings.size());
    std::iota(dense.begin(), dense.end(), 0u);
    EXPECT_EQ(s.bindings, dense);
    EXPECT_EQ(s.writes.size(), s.bindings.size());
    EXPECT_EQ(s.push_bytes % 4, 0u);
  }
}

// The message of creating a pipeline for `shader` with n_buffers and push_bytes, or "" when it is created.
std::string creation_error(vk::Device& dev, const char* shader, uint32_t n_buffers, uint32_t push_bytes) {
  try {
    vk::Pipeline p(dev, shader, n_buffers, push_bytes);
  } catch (const std::logic_error& e) {
    return e.what();
  }
  return "";
}

TEST(PipelineInterface, ABindingCountOrPushSizeOtherThanTheShadersFailsAtCreation) {
  struct Case {
    const char* shader;
    uint32_t n_buffers, push_bytes;
    const char* error;  // "": created
  };
  const Case cases[] = {
      {"copy", 2, 4, ""},
      // Too few buffers: the shader's binding 1 (or 3 and 4) would be left out of the layout.
      {"copy", 1, 4,
       "pipeline 'copy': the C++ code gives n_buffers = 1 (bindings 0..0), the shader declares storage buffers at "
       "bindings 0, 1 of set 0"},
      {"q4_0_gemm_coop", 3, 40,
       "pipeline 'q4_0_gemm_coop': the C++ code gives n_buffers = 3 (bindings 0..2), the shader declares storage "
       "buffers at bindings 0, 1, 2, 3, 4 of set 0"},
      // More buffers than the shader declares: bindings it leaves unused (the FP32 attention passes' binding 9).
      {"copy", 3, 4, ""},
      {"copy", 2, 8,
       "pipeline 'copy': the C++ code gives push_bytes = 8, the shader's push-constant block is 4 bytes (they must "
       "be equal)"},
      {"copy", 2, 0,
       "pipeline 'copy': the C++ code gives push_bytes = 0, the shader's push-constant block is 4 bytes (they must "
       "be equal)"},
  };
  auto dev = vk::Device::open({-1, false});
  for (const Case& c : cases)
    EXPECT_EQ(creation_error(*dev, c.shader, c.n_buffers, c.push_bytes), c.error)
        << c.shader << " with " << c.n_buffers << " buffers and " << c.push_bytes << " push bytes";
}

}  // namespace
}  // namespace q4t
