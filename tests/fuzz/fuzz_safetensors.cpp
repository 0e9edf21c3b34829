// libFuzzer target: a safetensors file (what export writes as adapter_model.safetensors) through the reader,
// then the values of every F32 tensor. A bad file must end in safetensors::FormatError; anything else is a finding.
#include <cstdint>
#include <string>

#include "data/safetensors.h"
#include "tests/fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace q4t;
  const std::string path = fuzz::write_input(data, size, ".safetensors");
  try {
    const safetensors::File f = safetensors::read(path);
    for (const auto& [name, t] : f.tensors)
      if (t.dtype == "F32") f.f32(name);
  } catch (const safetensors::FormatError&) {
  }
  return 0;
}
