#include "data/safetensors.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <nlohmann/json.hpp>

#include "data/atomic_file.h"

namespace q4t::safetensors {

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian; so is the host");

namespace {

constexpr uint64_t kMaxHeaderBytes = 100u << 20;  // the reference implementation's limit

// Bytes per element of the dtypes safetensors names; 0 for an unknown name.
uint64_t dtype_bytes(const std::string& d) {
  static const std::map<std::string, uint64_t> sizes = {
      {"BOOL", 1}, {"U8", 1}, {"I8", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"I16", 2}, {"U16", 2}, {"F16", 2},
      {"BF16", 2}, {"I32", 4}, {"U32", 4}, {"F32", 4}, {"I64", 8}, {"U64", 8}, {"F64", 8}};
  auto it = sizes.find(d);
  return it == sizes.end() ? 0 : it->second;
}

// Elements of a shape, or false on a negative dimension or overflow past 2^62.
bool element_count(const std::vector<int64_t>& shape, uint64_t* n) {
  uint64_t total = 1;
  for (int64_t d : shape) {
    if (d < 0) return false;
    if (d != 0 && total > (uint64_t(1) << 62) / uint64_t(d)) return false;
    total *= uint64_t(d);
  }
  *n = total;
  return true;
}

}  // namespace

void Writer::add_f32(const std::string& name, std::vector<int64_t> shape, const std::vector<float>& values) {
  if (name.empty() || name == "__metadata__") throw std::invalid_argument("safetensors: bad tensor name '" + name + "'");
  if (tensors_.count(name)) throw std::invalid_argument("safetensors: tensor '" + name + "' added twice");
  uint64_t n = 0;
  if (!element_count(shape, &n) || n != values.size())
    throw std::invalid_argument("safetensors: tensor '" + name + "' has " + std::to_string(values.size()) +
                                " values, which do not fill its shape");
  Tensor t{"F32", std::move(shape), std::vector<uint8_t>(values.size() * sizeof(float))};
  if (!values.empty()) std::memcpy(t.data.data(), values.data(), t.data.size());
  tensors_.emplace(name, std::move(t));
}

void Writer::write(const std::string& path) const {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata_.empty()) header["__metadata__"] = metadata_;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors_) {
    header[name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.data.size()}}};
    offset += t.data.size();
  }
  std::string json = header.dump();
  json.append((8 - json.size() % 8) % 8, ' ');  // the data then starts 8-byte aligned
  std::string file(8, '\0');
  const uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) file[size_t(i)] = char((n >> (8 * i)) & 0xff);
  file += json;
  file.reserve(file.size() + offset);
  for (const auto& [name, t] : tensors_) file.append(reinterpret_cast<const char*>(t.data.data()), t.data.size());
  write_file_atomic(path, file);
}

std::vector<float> File::f32(const std::string& name) const {
  auto it = tensors.find(name);
  if (it == tensors.end()) throw FormatError("safetensors: no tensor '" + name + "'");
  if (it->second.dtype != "F32")
    throw FormatError("safetensors: tensor '" + name + "' is " + it->second.dtype + ", expected F32");
  std::vector<float> v(it->second.data.size() / sizeof(float));
  if (!v.empty()) std::memcpy(v.data(), it->second.data.data(), v.size() * sizeof(float));
  return v;
}

File read(const std::string& path) {
  auto fail = [&](const std::string& what) -> FormatError { return FormatError(path + ": " + what); };
  std::ifstream in(path, std::ios::binary);
  if (!in) throw fail("cannot open the file");
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (bytes.size() < 8) throw fail("shorter than the 8-byte header length");
  uint64_t header_len = 0;
  for (int i = 0; i < 8; ++i) header_len |= uint64_t(uint8_t(bytes[size_t(i)])) << (8 * i);
  if (header_len > kMaxHeaderBytes || header_len > bytes.size() - 8)
    throw fail("header length " + std::to_string(header_len) + " does not fit the file of " +
               std::to_string(bytes.size()) + " bytes");
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(bytes.begin() + 8, bytes.begin() + 8 + std::ptrdiff_t(header_len));
  } catch (const nlohmann::json::exception& e) {
    throw fail(std::string("header is not valid JSON: ") + e.what());
  }
  if (!header.is_object()) throw fail("header is not a JSON object");
  const uint64_t data_start = 8 + header_len, data_size = bytes.size() - data_start;

  File f;
  std::vector<std::pair<uint64_t, uint64_t>> spans;
  for (const auto& item : header.items()) {
    // References, not a structured binding: lambdas capture bindings only from C++20 on, which clang 14 lacks.
    const std::string& name = item.key();
    const nlohmann::json& entry = item.value();
    if (name == "__metadata__") {
      if (!entry.is_object()) throw fail("__metadata__ is not an object");
      for (const auto& [k, v] : entry.items()) {
        if (!v.is_string()) throw fail("__metadata__ value of '" + k + "' is not a string");
        f.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    auto bad = [&](const std::string& what) { return fail("tensor '" + name + "': " + what); };
    if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") || !entry.contains("data_offsets"))
      throw bad("needs dtype, shape and data_offsets");
    const auto& dt = entry["dtype"];
    const auto& shape = entry["shape"];
    const auto& offs = entry["data_offsets"];
    if (!dt.is_string() || dtype_bytes(dt.get<std::string>()) == 0) throw bad("unknown dtype " + dt.dump());
    if (!shape.is_array() || !std::all_of(shape.begin(), shape.end(), [](const auto& d) { return d.is_number_unsigned(); }))
      throw bad("shape is not an array of non-negative integers");
    if (!offs.is_array() || offs.size() != 2 || !offs[0].is_number_unsigned() || !offs[1].is_number_unsigned())
      throw bad("data_offsets is not [begin, end]");
    Tensor t;
    t.dtype = dt.get<std::string>();
    for (const auto& d : shape) {
      if (d.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max())) throw bad("dimension out of range");
      t.shape.push_back(int64_t(d.get<uint64_t>()));
    }
    const uint64_t begin = offs[0].get<uint64_t>(), end = offs[1].get<uint64_t>();
    uint64_t n = 0;
    if (!element_count(t.shape, &n) || n > (uint64_t(1) << 62) / dtype_bytes(t.dtype)) throw bad("shape too large");
    if (begin > end || end > data_size)
      throw bad("data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) + "] outside the " +
                std::to_string(data_size) + " data bytes");
    if (end - begin != n * dtype_bytes(t.dtype))
      throw bad("data_offsets span " + std::to_string(end - begin) + " bytes, the shape needs " +
                std::to_string(n * dtype_bytes(t.dtype)));
    t.data.assign(bytes.begin() + std::ptrdiff_t(data_start + begin), bytes.begin() + std::ptrdiff_t(data_start + end));
    spans.emplace_back(begin, end);
    f.tensors.emplace(name, std::move(t));
  }
  // The tensors tile the data section exactly: no overlap, no hole, nothing after.
  std::sort(spans.begin(), spans.end());
  uint64_t at = 0;
  for (const auto& [b, e] : spans) {
    if (b != at) throw fail("tensor data overlaps or leaves a hole at byte " + std::to_string(at));
    at = e;
  }
  if (at != data_size) throw fail(std::to_string(data_size - at) + " bytes after the last tensor");
  return f;
}

}  // namespace q4t::safetensors
