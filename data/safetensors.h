// safetensors files (Hugging Face's tensor container, what PEFT's adapter_model.safetensors is): an u64
// little-endian header length N, N bytes of JSON header {name: {"dtype", "shape", "data_offsets": [begin, end]},
// "__metadata__": {string: string}} padded with spaces to a multiple of 8, then the raw little-endian data, with
// offsets relative to the end of the header. We write F32 tensors only, atomically; the reader exists for tests
// and checks every offset and shape against the file before use.
#pragma once
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace q4t::safetensors {

struct FormatError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Tensor {
  std::string dtype;           // "F32" for everything we write
  std::vector<int64_t> shape;  // row-major, slowest dimension first (PyTorch's order)
  std::vector<uint8_t> data;   // raw little-endian bytes
};

class Writer {
 public:
  void set_metadata(const std::string& key, const std::string& value) { metadata_[key] = value; }
  // values must hold the product of shape (checked); names must be unique and not "__metadata__".
  void add_f32(const std::string& name, std::vector<int64_t> shape, const std::vector<float>& values);
  // Writes the file atomically (temp file, fsync, rename); throws std::runtime_error naming the path.
  void write(const std::string& path) const;

 private:
  std::map<std::string, std::string> metadata_;
  std::map<std::string, Tensor> tensors_;  // sorted by name, as the reference implementation writes them
};

struct File {
  std::map<std::string, std::string> metadata;
  std::map<std::string, Tensor> tensors;
  // The values of an F32 tensor; throws FormatError for another dtype or a missing name.
  std::vector<float> f32(const std::string& name) const;
};

// Reads and validates a whole file; throws FormatError naming the path and what is wrong.
File read(const std::string& path);

}  // namespace q4t::safetensors
