// `q4tune quantize` against llama-quantize itself: an f32 model written by `q4tune init-model` is quantized by
// both, for every file type q4tune writes, and the two files must hold the same tensors, each of the same type
// and the same bytes. llama.cpp's quantizer runs through llama_model_quantize of the npm prebuilt's libllama
// (install_node_llama.sh installs it), loaded with dlopen; no importance matrix, as `llama-quantize` without one.
// Two shapes: heads / kv heads = 2 and = 4 (llama-quantize's attn_v choice depends on it), and a tied model with
// rows of 64 (the super-block fallbacks). Needs node >= 20 and npm the first time; ctest label "interop".
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <string>

#include "data/gguf.h"
#include "interop_util.h"
#include "work_dir.h"

namespace q4t::interop {
namespace {

namespace fs = std::filesystem;

// llama_model_quantize_params: int32 nthread, int32 ftype first; the rest is left as
// llama_model_quantize_default_params fills it. The buffer is larger than the struct of any llama.cpp version.
struct QuantizeParams {
  alignas(8) unsigned char raw[1024];
};
using DefaultParamsFn = QuantizeParams (*)();
using QuantizeFn = uint32_t (*)(const char*, const char*, const QuantizeParams*);

struct LlamaQuantize {
  DefaultParamsFn defaults = nullptr;
  QuantizeFn quantize = nullptr;
  std::string error;
};

const LlamaQuantize& llama_quantize() {
  static const LlamaQuantize q = [] {
    LlamaQuantize r;
    const CmdResult inst = run(quoted(fs::path(Q4T_INTEROP_DIR) / "install_node_llama.sh"));
    std::string dir = inst.out.substr(0, inst.out.find_last_not_of('\n') + 1);
    dir = dir.substr(dir.find_last_of('\n') + 1);
    if (inst.code != 0 || dir.empty()) {
      r.error = "install_node_llama.sh failed:\n" + inst.out;
      return r;
    }
    const fs::path bins = fs::path(dir) / "node_modules/@node-llama-cpp/linux-x64/bins/linux-x64";
    fs::path lib;
    for (const auto& e : fs::directory_iterator(bins))
      if (e.path().filename().string().rfind("libllama.", 0) == 0) lib = e.path();
    if (lib.empty()) {
      r.error = "no libllama in " + bins.string();
      return r;
    }
    // libllama finds libggml*.so beside it through its RUNPATH ($ORIGIN).
    void* h = dlopen(lib.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      r.error = std::string("dlopen ") + lib.string() + ": " + dlerror();
      return r;
    }
    r.defaults = reinterpret_cast<DefaultParamsFn>(dlsym(h, "llama_model_quantize_default_params"));
    r.quantize = reinterpret_cast<QuantizeFn>(dlsym(h, "llama_model_quantize"));
    if (!r.defaults || !r.quantize) r.error = lib.string() + " lacks llama_model_quantize";
    return r;
  }();
  return q;
}

struct FileType {
  const char* name;  // q4tune quantize --type
  int32_t ftype;     // llama_ftype
};
void PrintTo(const FileType& f, std::ostream* os) { *os << f.name; }

class QuantizeAgreement : public ::testing::TestWithParam<FileType> {
 protected:
  void SetUp() override {
    ASSERT_TRUE(llama_quantize().error.empty()) << llama_quantize().error;
    dir_ = fresh_work_dir("q4t-quantize");
  }
  void TearDown() override { remove_unless_failed(dir_); }

  // Quantizes init-model's f32 model of `shape` with both tools and compares them tensor by tensor.
  void compare(const std::string& shape, const std::string& tag) {
    SCOPED_TRACE(tag);
    const FileType& t = GetParam();
    const fs::path f32 = dir_ / (tag + "-f32.gguf"), ours = dir_ / (tag + "-q4tune.gguf"),
                   theirs = dir_ / (tag + "-llama.gguf");
    CmdResult r = run(std::string(Q4TUNE_BIN) + " init-model --type f32 --seed 7 " + shape + " --out " + quoted(f32));
    ASSERT_EQ(r.code, 0) << r.out;
    r = run(std::string(Q4TUNE_BIN) + " quantize " + quoted(f32) + " " + quoted(ours) + " --type " + t.name);
    ASSERT_EQ(r.code, 0) << r.out;
    QuantizeParams p = llama_quantize().defaults();
    const int32_t nthread = 2;
    std::memcpy(p.raw, &nthread, 4);
    std::memcpy(p.raw + 4, &t.ftype, 4);
    ASSERT_EQ(llama_quantize().quantize(f32.c_str(), theirs.c_str(), &p), 0u) << "llama_model_quantize failed";
    const auto a = gguf::File::open(ours.string()), b = gguf::File::open(theirs.string());
    ASSERT_EQ(a->tensors().size(), b->tensors().size());
    int same = 0;
    for (const gguf::TensorInfo& tb : b->tensors()) {
      const gguf::TensorInfo* ta = a->tensor(tb.name);
      ASSERT_NE(ta, nullptr) << tb.name << " is missing from q4tune's file";
      EXPECT_EQ(gguf::type_name(ta->type), std::string(gguf::type_name(tb.type))) << tb.name;
      if (ta->type != tb.type) continue;
      ASSERT_EQ(ta->bytes, tb.bytes) << tb.name;
      const size_t diff = size_t(std::mismatch(ta->data, ta->data + ta->bytes, tb.data).first - ta->data);
      EXPECT_EQ(diff, ta->bytes) << tb.name << " (" << gguf::type_name(tb.type) << ") differs from byte " << diff;
      same += diff == ta->bytes;
    }
    std::printf("%s %s: %d of %zu tensors of the same type and bytes\n", t.name, tag.c_str(), same, b->tensors().size());
    EXPECT_EQ(a->get_uint("general.file_type"), b->get_uint("general.file_type"));
  }

  fs::path dir_;
};

TEST_P(QuantizeAgreement, SameTypesAndBytesAsLlamaQuantize) {
  compare("--dim 256 --ff 512 --layers 8 --heads 4 --kv-heads 2", "gqa2");
  compare("--dim 256 --ff 768 --layers 4 --heads 8 --kv-heads 2", "gqa4");
  compare("--dim 64 --ff 256 --layers 2 --heads 2 --kv-heads 1 --tied", "rows64");
}

INSTANTIATE_TEST_SUITE_P(
    FileTypes, QuantizeAgreement,
    ::testing::Values(FileType{"q4_0", 2}, FileType{"q4_1", 3}, FileType{"q8_0", 7}, FileType{"q5_0", 8},
                      FileType{"q5_1", 9}, FileType{"q2_k", 10}, FileType{"q3_k_m", 12}, FileType{"q4_k_m", 15},
                      FileType{"q5_k_s", 16}, FileType{"q5_k_m", 17}, FileType{"q6_k", 18}, FileType{"iq4_nl", 25},
                      FileType{"iq4_xs", 30}, FileType{"bf16", 32}),
    [](const ::testing::TestParamInfo<FileType>& i) { return std::string(i.param.name); });

}  // namespace
}  // namespace q4t::interop
