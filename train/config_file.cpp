#include "train/config_file.h"

#include <CLI/CLI.hpp>
#include <toml++/toml.h>

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>

#include "train/suggest.h"

namespace q4t {
namespace {

// What an option takes, from its CLI11 shape and type name.
enum class Wants { Flag, FlagOrText, Integer, NonNegativeInteger, Number, Text };

Wants wants_of(const CLI::Option* op) {
  if (op->get_expected_max() == 0) return Wants::Flag;
  if (op->get_expected_min() == 0) return Wants::FlagOrText;  // an optional value, as --resume [DIR]
  const std::string full = op->get_type_name();  // "INT:INT in [1 - 65536]" with a check's description
  const std::string type = full.substr(0, full.find(':'));
  if (type == "INT") return Wants::Integer;
  if (type == "UINT") return Wants::NonNegativeInteger;
  if (type == "FLOAT") return Wants::Number;
  return Wants::Text;
}

// Several values: in one go (--lora-targets q,k) or one per use of the flag (--sample-prompt a --sample-prompt b).
bool is_list(const CLI::Option* op) {
  return op->get_items_expected_max() > 1 || op->get_multi_option_policy() == CLI::MultiOptionPolicy::TakeAll;
}

std::string key_of(const CLI::Option* op) { return op->get_lnames().empty() ? "" : op->get_lnames()[0]; }

bool contains(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

std::string one_value(Wants w) {
  switch (w) {
    case Wants::Flag: return "true or false";
    case Wants::FlagOrText: return "true, false or a string";
    case Wants::Integer: return "an integer";
    case Wants::NonNegativeInteger: return "a non-negative integer";
    case Wants::Number: return "a number";
    case Wants::Text: return "a string";
  }
  return "";
}

std::string wanted(const CLI::Option* op) {
  return one_value(wants_of(op)) + (is_list(op) ? " or an array of them" : "");
}

// A TOML basic string: quotes, backslashes and control characters escaped.
std::string toml_quoted(const std::string& s) {
  std::string q = "\"";
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': q += "\\\""; break;
      case '\\': q += "\\\\"; break;
      case '\n': q += "\\n"; break;
      case '\t': q += "\\t"; break;
      case '\r': q += "\\r"; break;
      case '\b': q += "\\b"; break;
      case '\f': q += "\\f"; break;
      default:
        if (c < 0x20 || c == 0x7f) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04X", unsigned(c));
          q += buf;
        } else {
          q += ch;
        }
    }
  }
  return q + "\"";
}

// The shortest text that reads back to v, as a TOML float (1.0, not 1).
std::string toml_float(double v) {
  char buf[32];
  const std::string s(buf, std::to_chars(buf, buf + sizeof buf, v).ptr);
  return s.find_first_of(".en") == std::string::npos ? s + ".0" : s;  // "inf" and "nan" have an 'n'
}

std::string describe(const toml::node& n) {
  if (const auto* v = n.as_string()) return "the string " + toml_quoted(v->get());
  if (const auto* v = n.as_integer()) return "the integer " + std::to_string(v->get());
  if (const auto* v = n.as_floating_point()) return "the number " + toml_float(v->get());
  if (const auto* v = n.as_boolean()) return v->get() ? "true" : "false";
  if (n.is_array()) return "an array";
  if (n.is_table()) return "a table";
  return "a date or time";
}

CLI::ConfigError config_error(const std::string& path, const toml::source_region& at, const std::string& what) {
  return CLI::ConfigError(path + ":" + std::to_string(at.begin.line) + ":" + std::to_string(at.begin.column) +
                          ": " + what);
}

// Whether pos (a 1-based line, and column in code points) is the end of its line in text.
bool at_line_end(const std::string& text, const toml::source_position& pos) {
  size_t start = 0;
  for (uint32_t line = 1; line < pos.line && start != std::string::npos; ++line) {
    start = text.find('\n', start);
    if (start != std::string::npos) ++start;
  }
  if (start == std::string::npos) return false;
  size_t end = std::min(text.find('\n', start), text.size());
  if (end > start && text[end - 1] == '\r') --end;
  const auto code_points = std::count_if(text.begin() + long(start), text.begin() + long(end),
                                         [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; });
  return pos.column == code_points + 1;
}

toml::table parse_file(const std::string& path) {
  if (!std::filesystem::is_regular_file(path)) throw CLI::FileError(path + ": no such config file");
  std::ifstream f(path, std::ios::binary);
  const std::string text(std::istreambuf_iterator<char>(f), {});
  if (!f.good() && !f.eof()) throw CLI::FileError(path + ": cannot read the config file");
  try {
    return toml::parse(text, std::string_view(path));
  } catch (const toml::parse_error& e) {
    std::string what(e.description());
    std::replace(what.begin(), what.end(), '\n', ' ');
    if (what.find("unescaped control characters") != std::string::npos && at_line_end(text, e.source().begin))
      what = "unterminated string: it reaches the end of the line (only a \"\"\" string spans lines)";
    throw config_error(path, e.source(), what);
  }
}

// One key of the file: the option it names (its table keys joined with '-'), where the key is, and the value.
struct Setting {
  std::string key;
  toml::source_region at;
  const toml::node* value;
};

// Tables, dotted keys and inline tables open into their keys, unless the table's own key names an option (a type
// error reported on the value).
void collect_settings(const toml::table& t, const std::string& prefix, const CLI::App& cmd,
                      std::vector<Setting>* out) {
  for (const auto& [k, v] : t) {
    const std::string key = prefix.empty() ? std::string(k.str()) : prefix + "-" + std::string(k.str());
    const toml::table* sub = v.as_table();
    if (sub && !sub->empty() && !cmd.get_option_no_throw("--" + key))
      collect_settings(*sub, key, cmd, out);
    else
      out->push_back({key, k.source(), &v});
  }
}

// One TOML value as a CLI11 input for an option that wants w; nullopt where its type does not fit.
std::optional<std::string> input_of(const toml::node& n, Wants w) {
  switch (w) {
    case Wants::Flag:
      if (const auto* b = n.as_boolean()) return b->get() ? "true" : "false";
      break;
    case Wants::FlagOrText:
    case Wants::Text:
      if (const auto* s = n.as_string()) return s->get();
      break;
    case Wants::Number:
      if (const auto* f = n.as_floating_point()) return toml_float(f->get());
      [[fallthrough]];
    case Wants::Integer:
      if (const auto* i = n.as_integer()) return std::to_string(i->get());
      break;
    case Wants::NonNegativeInteger:
      if (const auto* i = n.as_integer(); i && i->get() >= 0) return std::to_string(i->get());
      break;
  }
  return std::nullopt;
}

// The CLI11 inputs of the value of s for op; nullopt leaves the option unset (false for an optional value).
std::optional<std::vector<std::string>> inputs_of(const Setting& s, const CLI::Option* op, const std::string& path) {
  const Wants w = wants_of(op);
  const toml::node& v = *s.value;
  if (const auto* b = v.as_boolean(); b && w == Wants::FlagOrText) {
    if (!b->get()) return std::nullopt;
    return std::vector<std::string>{""};  // given without a value, as on the command line
  }
  if (const toml::array* a = v.as_array(); a && is_list(op)) {
    if (a->empty()) {  // no values: the option's own state when it has no default, else a mistake
      if (op->get_default_str().empty()) return std::nullopt;
      throw config_error(path, v.source(), "'" + s.key + "' wants at least one value, not an empty array");
    }
    std::vector<std::string> inputs;
    for (const toml::node& e : *a) {
      const std::optional<std::string> in = input_of(e, w);
      if (!in) throw config_error(path, e.source(), "'" + s.key + "' wants " + one_value(w) + " in its array, not " +
                                                        describe(e));
      inputs.push_back(*in);
    }
    return inputs;
  }
  const std::optional<std::string> in = input_of(v, w);
  if (!in) throw config_error(path, v.source(), "'" + s.key + "' wants " + wanted(op) + ", not " + describe(v));
  return std::vector<std::string>{*in};
}

// A CLI11 error's message without the leading option name it repeats ("--lora-rank: ").
std::string message_of(const CLI::Error& e, const CLI::Option* op) {
  std::string m = e.what();
  const std::string name = op->get_name() + ": ";
  if (m.rfind(name, 0) == 0) m.erase(0, name.size());
  return m;
}

// op's value as TOML: what was given, else the default; "" where there is neither.
std::string toml_value(const CLI::Option* op) {
  const Wants w = wants_of(op);
  if (w == Wants::Flag) return op->count() > 0 && op->as<bool>() ? "true" : "false";
  if (w == Wants::FlagOrText) {
    if (op->count() == 0) return "false";
    const std::string v = op->as<std::string>();
    return v.empty() ? "true" : toml_quoted(v);
  }
  if (op->count() == 0 && op->get_default_str().empty()) return is_list(op) ? "[]" : w == Wants::Text ? "\"\"" : "";
  std::vector<std::string> items;
  const auto convert = [&](auto sample, auto format) {
    using T = decltype(sample);
    if (is_list(op))
      for (const T& x : op->as<std::vector<T>>()) items.push_back(format(x));
    else
      items.push_back(format(op->as<T>()));
  };
  switch (w) {
    case Wants::Integer: convert(int64_t(0), [](int64_t x) { return std::to_string(x); }); break;
    case Wants::NonNegativeInteger: convert(uint64_t(0), [](uint64_t x) { return std::to_string(x); }); break;
    case Wants::Number: convert(0.0, toml_float); break;
    default: convert(std::string(), toml_quoted); break;
  }
  if (!is_list(op)) return items.empty() ? "" : items[0];
  std::string list = "[";
  for (size_t i = 0; i < items.size(); ++i) list += (i ? ", " : "") + items[i];
  return list + "]";
}

}  // namespace

void apply_config_file(CLI::App* cmd, const std::string& path, const std::vector<std::string>& reserved) {
  const toml::table root = parse_file(path);
  std::vector<Setting> settings;
  collect_settings(root, "", *cmd, &settings);
  // In the order of the file, so the first mistake in it is the one reported.
  std::sort(settings.begin(), settings.end(), [](const Setting& a, const Setting& b) {
    return std::pair(a.at.begin.line, a.at.begin.column) < std::pair(b.at.begin.line, b.at.begin.column);
  });
  std::vector<std::string> keys;  // what a file may set, for the did-you-mean
  for (const CLI::Option* op : cmd->get_options())
    if (!key_of(op).empty() && !contains(reserved, key_of(op))) keys.push_back(key_of(op));

  std::map<std::string, toml::source_position> first_at;
  for (const Setting& s : settings) {
    CLI::Option* op = cmd->get_option_no_throw("--" + s.key);
    if (!op || key_of(op).empty())
      throw config_error(path, s.at, "unknown key '" + s.key + "'" + did_you_mean(s.key, keys));
    if (contains(reserved, s.key)) throw config_error(path, s.at, "'" + s.key + "' cannot be set in a config file");
    if (const auto [it, fresh] = first_at.emplace(s.key, s.at.begin); !fresh)
      throw config_error(path, s.at, "'" + s.key + "' is given twice (first at line " +
                                         std::to_string(it->second.line) + ", column " +
                                         std::to_string(it->second.column) + ")");
    const std::optional<std::vector<std::string>> inputs = inputs_of(s, op, path);
    if (!inputs || op->count() > 0) continue;  // the command line wins
    try {
      op->add_result(*inputs);
      op->run_callback();
    } catch (const CLI::ConversionError&) {  // a number the option's type cannot hold
      throw config_error(path, s.value->source(), "'" + s.key + "' cannot hold " + describe(*s.value));
    } catch (const CLI::Error& e) {
      throw config_error(path, s.value->source(), "'" + s.key + "': " + message_of(e, op));
    }
  }
}

std::string options_as_toml(const CLI::App* cmd, const std::vector<std::string>& skip) {
  std::string out;
  for (const CLI::Option* op : cmd->get_options()) {
    const std::string key = key_of(op);
    if (key.empty() || contains(skip, key)) continue;
    const std::string value = toml_value(op);
    if (!value.empty()) out += key + " = " + value + "\n";
  }
  return out;
}

}  // namespace q4t
