// q4tune info MODEL: what a GGUF file holds: version, alignment, every metadata key with its type and value, and
// every tensor with its shape, type, size and whether q4tune can compute with it. A bad file throws before
// anything is printed, so the user sees only main's one-line error.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <iomanip>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "data/gguf.h"
#include "kernels/formats.h"
#include "train/cli_common.h"
#include "train/commands.h"
#include "train/run_log.h"

namespace q4t {

namespace {

using gguf::Value;
using gguf::ValueType;

constexpr size_t kMaxStringBytes = 60;  // longer strings are cut at a UTF-8 character boundary
constexpr size_t kMaxArrayItems = 5;    // arrays show their first few values

// Control characters are escaped so that every key stays on one line (chat templates hold newlines).
std::string quoted(const std::string& s) {
  size_t n = s.size() > kMaxStringBytes ? kMaxStringBytes : s.size();
  while (n > 0 && n < s.size() && (uint8_t(s[n]) & 0xC0) == 0x80) --n;
  std::string out = "\"";
  for (size_t i = 0; i < n; ++i) {
    const unsigned char c = uint8_t(s[i]);
    if (c == '\n') {
      out += "\\n";
    } else if (c == '"' || c == '\\') {
      out += '\\';
      out += char(c);
    } else if (c < 0x20 || c == 0x7f) {
      char esc[8];
      std::snprintf(esc, sizeof esc, "\\x%02x", c);
      out += esc;
    } else {
      out += char(c);
    }
  }
  out += '"';
  if (n < s.size()) out += "... (" + std::to_string(s.size()) + " bytes)";
  return out;
}

std::string number(double x, int digits) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.*g", digits, x);
  return buf;
}

std::string format_value(const Value& v) {
  switch (v.type) {
    case ValueType::U8: case ValueType::U16: case ValueType::U32: case ValueType::U64:
      return std::to_string(std::get<uint64_t>(v.v));
    case ValueType::I8: case ValueType::I16: case ValueType::I32: case ValueType::I64:
      return std::to_string(std::get<int64_t>(v.v));
    case ValueType::F32: return number(std::get<double>(v.v), 7);
    case ValueType::F64: return number(std::get<double>(v.v), 15);
    case ValueType::BOOL: return std::get<bool>(v.v) ? "true" : "false";
    case ValueType::STRING: return quoted(std::get<std::string>(v.v));
    case ValueType::ARRAY: break;
  }
  const auto& items = std::get<std::vector<Value>>(v.v);
  std::string s = "[";
  for (size_t i = 0; i < items.size() && i < kMaxArrayItems; ++i) s += (i ? ", " : "") + format_value(items[i]);
  if (items.size() > kMaxArrayItems) s += ", ...";
  return s + "]";
}

// "u32", "string[32]" (an array of 32 strings), "array[3]" (an array of arrays).
std::string format_type(const Value& v) {
  if (v.type != ValueType::ARRAY) return gguf::value_type_name(v.type);
  return std::string(gguf::value_type_name(v.elem_type)) + "[" +
         std::to_string(std::get<std::vector<Value>>(v.v).size()) + "]";
}

std::string format_ne(const std::vector<int64_t>& ne) {
  std::string s = "[";
  for (size_t i = 0; i < ne.size(); ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
  return s + "]";
}

void print_metadata(const gguf::File& f, std::ostream& out) {
  size_t key_w = 0, type_w = 0;
  for (const auto& [key, v] : f.metadata()) {
    key_w = std::max(key_w, key.size());
    type_w = std::max(type_w, format_type(v).size());
  }
  out << "metadata:\n";
  for (const auto& [key, v] : f.metadata())
    out << "  " << std::left << std::setw(int(key_w)) << key << "  " << std::setw(int(type_w)) << format_type(v)
        << "  " << format_value(v) << "\n";
}

void print_tensors(const gguf::File& f, std::ostream& out) {
  size_t name_w = 0, ne_w = 0;
  for (const auto& t : f.tensors()) {
    name_w = std::max(name_w, t.name.size());
    ne_w = std::max(ne_w, format_ne(t.ne).size());
  }
  out << "tensors:\n";
  for (const auto& t : f.tensors()) {
    out << "  " << std::left << std::setw(int(name_w)) << t.name << "  " << std::setw(int(ne_w)) << format_ne(t.ne)
        << "  " << std::setw(7) << gguf::type_name(t.type) << std::right << std::setw(12) << t.bytes << " bytes  ";
    if (t.type == gguf::GgmlType::F32 || find_format(uint32_t(t.type)))
      out << "supported\n";
    else
      out << "not supported by q4tune (" << gguf::type_name(t.type) << ")\n";
  }
}

}  // namespace

int run_info(const std::string& path, std::ostream& out) {
  const auto f = gguf::File::open(path);
  uint64_t data_bytes = 0;
  for (const auto& t : f->tensors()) data_bytes += t.bytes;
  out << path << ": GGUF version " << f->version() << ", alignment " << f->alignment() << ", "
      << train::plural(int64_t(f->metadata().size()), "metadata key") << ", "
      << train::plural(int64_t(f->tensors().size()), "tensor") << " (" << data_bytes
      << " bytes of tensor data)\n";
  print_metadata(*f, out);
  print_tensors(*f, out);
  return 0;
}

Command add_info(CLI::App& app) {
  auto path = std::make_shared<std::string>();
  auto* cmd = app.add_subcommand("info", "Print a GGUF file's metadata and tensors, and which tensor types q4tune supports");
  add_model_argument(cmd, *path, "GGUF file (a model or an adapter)");
  set_examples(cmd, "  q4tune info -m model.gguf");
  return {cmd, [path] { return run_info(*path, std::cout); }};
}

}  // namespace q4t
