// Test fixtures for GGUF readers: a small valid llama-like GGUF and many malformed files derived from it by byte
// surgery, each with the part of the error message a reader must give. Used by test_gguf (the reader),
// test_model (the loader) and test_cli (`q4tune info`).
#pragma once
#include <string>
#include <vector>

namespace q4t::test {

struct MalformedGguf {
  std::string name;                      // e.g. "truncated_in_key"
  std::string path;                      // DIR/NAME.gguf
  std::string expected_error_substring;  // the field and byte offset and/or the condition
  // A well-formed GGUF that is not a usable llama model (a tensor or key missing or wrong): the GGUF reader
  // must open it, the model loader must reject it naming the tensor or key (the expected substring).
  bool gguf_valid = false;
};

// Writes a 1-layer llama (32-dim, 32-token vocabulary, Q4_0 matrices, F32 norms) with the GGUF writer.
void write_tiny_llama_gguf(const std::string& path);

// Creates DIR if needed and writes every case into it.
std::vector<MalformedGguf> write_malformed_ggufs(const std::string& dir);

}  // namespace q4t::test
