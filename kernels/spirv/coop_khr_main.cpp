// q4t_coop_khr IN.spv OUT.h NAME: the build step of the shaders compiled for VK_KHR_cooperative_matrix
// (cmake/Shaders.cmake). Reads glslang's SPIR-V, rewrites its NV cooperative-matrix instructions (coop_khr.h) and
// writes `const uint32_t spv_NAME[]` as glslang's --vn would. On failure it writes nothing and exits 1.
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/spirv/coop_khr.h"

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: q4t_coop_khr IN.spv OUT.h NAME\n");
    return 2;
  }
  try {
    std::ifstream in(argv[1], std::ios::binary);
    if (!in) throw std::runtime_error("cannot read it");
    const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), {});
    if (bytes.size() % 4 != 0) throw std::runtime_error("its size is not a whole number of words");
    std::vector<uint32_t> words(bytes.size() / 4);
    std::memcpy(words.data(), bytes.data(), bytes.size());
    const std::vector<uint32_t> out = q4t::spirv::nv_to_khr_coopmat(words);
    std::string text = "// " + std::string(argv[1]) + " with VK_KHR_cooperative_matrix (q4t_coop_khr)\n";
    text += "const uint32_t spv_" + std::string(argv[3]) + "[] = {\n";
    for (size_t i = 0; i < out.size(); ++i) {
      char w[16];
      std::snprintf(w, sizeof w, "0x%08x,", out[i]);
      text += w;
      text += (i % 8 == 7 || i + 1 == out.size()) ? "\n" : " ";
    }
    text += "};\n";
    const std::string tmp = std::string(argv[2]) + ".tmp";
    std::ofstream o(tmp, std::ios::binary);
    o << text;
    o.close();
    if (!o || std::rename(tmp.c_str(), argv[2]) != 0) {
      std::remove(tmp.c_str());
      throw std::runtime_error(std::string("cannot write ") + argv[2]);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "q4t_coop_khr: %s: %s\n", argv[1], e.what());
    return 1;
  }
  return 0;
}
