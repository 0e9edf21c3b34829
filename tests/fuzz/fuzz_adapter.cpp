// libFuzzer target: a GGUF LoRA adapter as logits, generate and eval load it (ModelGraph::load_adapters), against
// one fixed small model (fuzz_input.h). A bad file must end in gguf::FormatError; anything else is a finding.
#include <cstdint>
#include <memory>
#include <string>

#include "autograd/backend.h"
#include "autograd/graph.h"
#include "data/gguf.h"
#include "tests/fuzz/fuzz_input.h"
#include "train/model/model.h"

namespace {

using namespace q4t;

struct Base {
  std::unique_ptr<ag::Backend> be = ag::Backend::cpu();
  std::unique_ptr<model::Model> model = model::Model::load(fuzz::make_adapter_base(fuzz::scratch() + "/base.gguf"), *be);
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Base base;
  const std::string path = fuzz::write_input(data, size, ".gguf");
  try {
    auto f = gguf::File::open(path);
    ag::Graph g(*base.be);
    model::ModelGraph mg(*base.model, g);
    mg.load_adapters(*f, 1.0);
  } catch (const gguf::FormatError&) {
  }
  return 0;
}
