// Files → examples: the .txt, .jsonl and .json formats, the record shapes, and the byte alignment that gives
// each token its loss mask.
#include <algorithm>
#include <fstream>
#include <iterator>
#include <optional>
#include <sstream>
#include <utility>

#include <nlohmann/json.hpp>

#include "data/chat_template.h"
#include "data/dataset.h"

namespace q4t::data {

namespace {

using json = nlohmann::json;

std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw DatasetError(path + ": cannot open the file");
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The bytes a token stands for in the text: its decoding, or its token text for tokens that decode to nothing
// (control tokens such as <|im_end|> that the text spells out). A decoder may drop the leading space of the
// first token it decodes (llama.cpp does for SentencePiece), so the piece is the second half of the token
// decoded twice.
std::string token_piece(const tok::Tokenizer& tok, int32_t id) {
  const int32_t twice[2] = {id, id};
  std::string first = tok.decode(std::span<const int32_t>(twice, 1));
  std::string both = tok.decode(std::span<const int32_t>(twice, 2));
  std::string p = both.size() >= first.size() ? both.substr(first.size()) : first;
  return p.empty() ? tok.token_text(id) : p;
}

// SentencePiece writes spaces as U+2581 ("▁"); a vocabulary without that token spells it in byte tokens, whose
// decoding keeps the three bytes. Either way it stands for one space of the text.
void push_piece(std::string& stream, std::vector<int32_t>& owner, const std::string& piece, int32_t k) {
  for (size_t i = 0; i < piece.size(); ++i) {
    stream.push_back(piece[i]);
    owner.push_back(k);
  }
}

// Folds every U+2581 of s into one space; tag[i] (a token index or a loss flag) follows its first byte. The
// text gets the same folding as the decoded tokens, so a "▁" typed in the text meets the space its tokens
// decode to.
template <class Tag>
void normalise_spaces(std::string& s, std::vector<Tag>& tag) {
  static const std::string kSp = "\xE2\x96\x81";
  std::string out;
  std::vector<Tag> kept;
  for (size_t i = 0; i < s.size();) {
    bool sp = s.compare(i, kSp.size(), kSp) == 0;
    out.push_back(sp ? ' ' : s[i]);
    kept.push_back(tag[i]);
    i += sp ? kSp.size() : 1;
  }
  s.swap(out);
  tag.swap(kept);
}

// Marks token k counted when any text byte it covers is counted. Spaces present on one side only (the space
// SentencePiece puts before a text, one a decoder drops) go to the neighbouring token.
std::vector<uint8_t> align_mask(const tok::Tokenizer& tok, const std::vector<int32_t>& ids, std::string text,
                                std::vector<uint8_t> counted, const std::string& at) {
  std::string s;
  std::vector<int32_t> owner;
  for (size_t k = 0; k < ids.size(); ++k) push_piece(s, owner, token_piece(tok, ids[k]), int32_t(k));
  normalise_spaces(s, owner);
  normalise_spaces(text, counted);
  std::vector<uint8_t> mask(ids.size(), 0);
  size_t i = 0, j = 0;
  while (i < s.size() && j < text.size()) {
    if (s[i] == text[j]) {
      mask[size_t(owner[i++])] |= counted[j++];
    } else if (s[i] == ' ') {
      mask[size_t(owner[i++])] |= counted[j];
    } else if (text[j] == ' ') {
      mask[size_t(owner[i])] |= counted[j++];
    } else if (const std::string& spelled = tok.token_text(ids[size_t(owner[i])]);
               !spelled.empty() && text.compare(j, spelled.size(), spelled) == 0) {
      // A special token the text spells out but that decodes to other bytes (<unk> renders as "▅"): it stands
      // for its spelling, and the rest of its decoding is skipped.
      const int32_t k = owner[i];
      for (size_t n = 0; n < spelled.size(); ++n) mask[size_t(k)] |= counted[j++];
      while (i < s.size() && owner[i] == k) ++i;
    } else {
      throw DatasetError(at + "cannot map token " + std::to_string(owner[i]) + " ('" + tok.token_text(ids[owner[i]]) +
                         "') back to the text at byte " + std::to_string(j));
    }
  }
  // A trailing inserted space takes the status of the last text byte.
  for (; i < s.size(); ++i) mask[size_t(owner[i])] |= text.empty() ? 0 : counted.back();
  // Tokens left with no byte (the 2nd and 3rd byte tokens of a "▁" folded into one space) share the status of
  // the token they continue.
  std::vector<uint8_t> covered(ids.size(), 0);
  for (int32_t k : owner) covered[size_t(k)] = 1;
  for (size_t k = 1; k < ids.size(); ++k) {
    if (!covered[k]) mask[k] = mask[k - 1];
  }
  return mask;
}

// Tokenizes the parts as one text; adds BOS (unless the text already starts with it) and, when asked, EOS.
Example tokenize_parts(const tok::Tokenizer& tok, const std::vector<chat::Segment>& parts, bool parse_special,
                       bool add_eos, const std::string& at) {
  std::string text;
  std::vector<uint8_t> counted;
  for (const auto& p : parts) {
    text += p.text;
    counted.insert(counted.end(), p.text.size(), p.assistant ? 1 : 0);
  }
  Example ex;
  ex.ids = tok.encode(text, parse_special);
  ex.mask = align_mask(tok, ex.ids, text, counted, at);
  bool has_bos = !ex.ids.empty() && ex.ids[0] == tok.bos();
  if (tok.add_bos() && tok.bos() >= 0 && !has_bos) {
    ex.ids.insert(ex.ids.begin(), tok.bos());
    ex.mask.insert(ex.mask.begin(), 0);
  }
  if (add_eos && tok.eos() >= 0) {
    ex.ids.push_back(tok.eos());
    ex.mask.push_back(parts.empty() ? 1 : uint8_t(parts.back().assistant));
  }
  return ex;
}

// The most bytes one JSONL record may take: far beyond any example a context holds, and a bound on the memory
// one line can make the reader use.
constexpr size_t kMaxRecordBytes = size_t(64) << 20;

std::string where(const std::string& path, size_t line) { return path + ":" + std::to_string(line) + ": "; }

// The parser's message with any echoed token cut short, so a 5000-digit number or a runaway string is not
// printed whole.
std::string json_error(const json::exception& e) {
  constexpr size_t kEcho = 40;
  std::string msg = e.what();
  if (msg.rfind("[json.exception.", 0) == 0 && msg.find("] ") != std::string::npos) msg.erase(0, msg.find("] ") + 2);
  size_t open = msg.find('\'');
  size_t close = open == std::string::npos ? open : msg.rfind('\'');
  if (open != std::string::npos && close > open + kEcho + 1) {
    msg = msg.substr(0, open + 1 + kEcho) + "..." + msg.substr(close);
  }
  return msg;
}

json parse_json(const std::string& text, const std::string& at) {
  try {
    return json::parse(text);
  } catch (const json::out_of_range& e) {
    throw DatasetError(at + "a number beyond the range of a double (" + json_error(e) + ")");
  } catch (const json::exception& e) {
    throw DatasetError(at + "malformed JSON: " + json_error(e));
  }
}

const std::string& string_field(const json& obj, const std::string& key, const std::string& at) {
  auto it = obj.find(key);
  if (it == obj.end()) throw DatasetError(at + "missing field '" + key + "'");
  if (!it->is_string()) {
    throw DatasetError(at + "field '" + key + "' is " + it->type_name() + ", expected a string");
  }
  return it->get_ref<const std::string&>();
}

// kFormatNames[i] names Format(i).
enum class Format { auto_detect, text, completion, chat, alpaca, sharegpt };
constexpr const char* kFormatNames[] = {"auto", "text", "completion", "chat", "alpaca", "sharegpt"};

Format format_by_name(const std::string& name) {
  for (size_t i = 0; i < std::size(kFormatNames); ++i) {
    if (name == kFormatNames[i]) return Format(i);
  }
  std::string known;
  for (const char* n : kFormatNames) known += (known.empty() ? "" : ", ") + std::string(n);
  throw DatasetError("unknown data format '" + name + "'; known: " + known);
}

// ShareGPT's "from" values and the roles they stand for, in the order errors list them.
constexpr std::pair<const char*, const char*> kShareGptRoles[] = {
    {"system", "system"}, {"human", "user"}, {"user", "user"}, {"gpt", "assistant"}, {"assistant", "assistant"}};

std::string sharegpt_role(const std::string& from, const std::string& at) {
  std::string accepted;
  for (const auto& [name, role] : kShareGptRoles) {
    if (from == name) return role;
    accepted += (accepted.empty() ? "" : ", ") + std::string(name);
  }
  throw DatasetError(at + "unknown 'from' value '" + from + "'; accepted: " + accepted);
}

// ShareGPT turns are {"from", "value"}; chat turns are {"role", "content"}. Auto-detection looks at the first.
bool looks_like_sharegpt(const json& turns) {
  return turns.is_array() && !turns.empty() && turns[0].is_object() && turns[0].contains("from");
}

// The conversation in obj[field]: {"role", "content"} turns, or ShareGPT's {"from", "value"} ones.
std::vector<chat::Message> parse_turns(const json& obj, const std::string& field, bool sharegpt,
                                       const std::string& at) {
  auto it = obj.find(field);
  if (it == obj.end()) throw DatasetError(at + "missing field '" + field + "'");
  const json& turns = *it;
  if (!turns.is_array()) {
    throw DatasetError(at + "field '" + field + "' is " + std::string(turns.type_name()) + ", expected an array of " +
                       (sharegpt ? "{\"from\", \"value\"}" : "{\"role\", \"content\"}") + " objects");
  }
  std::vector<chat::Message> out;
  for (size_t i = 0; i < turns.size(); ++i) {
    const json& m = turns[i];
    std::string mat = at + field + "[" + std::to_string(i) + "]: ";
    if (!m.is_object()) throw DatasetError(mat + "is " + std::string(m.type_name()) + ", expected an object");
    if (sharegpt) {
      std::string role = sharegpt_role(string_field(m, "from", mat), mat);
      out.push_back({role, string_field(m, "value", mat)});
    } else {
      out.push_back({string_field(m, "role", mat), string_field(m, "content", mat)});
    }
  }
  return out;
}

// Alpaca: the instruction (and the input, when there is one) is the user's turn, the output the assistant's.
std::vector<chat::Message> parse_alpaca(const json& obj, const std::string& at) {
  std::string user = string_field(obj, "instruction", at);
  auto input = obj.find("input");
  if (input != obj.end() && !input->is_null()) {
    const std::string& in = string_field(obj, "input", at);
    if (!in.empty()) user += "\n\n" + in;
  }
  return {{"user", user}, {"assistant", string_field(obj, "output", at)}};
}

// Parses one JSON record into an example; `tmpl` is resolved on the first conversation record.
class RecordReader {
 public:
  RecordReader(const tok::Tokenizer& tok, const DatasetOptions& opt)
      : tok_(tok), opt_(opt), fields_(opt.format), format_(format_by_name(opt.format.format)) {}

  Example read(const json& obj, const std::string& at) {
    if (!obj.is_object()) throw DatasetError(at + "expected a JSON object, got " + std::string(obj.type_name()));
    switch (format_) {
      case Format::text: return text(obj, at);
      case Format::completion: return completion(obj, at);
      case Format::chat: return chat(parse_turns(obj, messages_field(), false, at), at);
      case Format::sharegpt: return chat(parse_turns(obj, conversations_field(), true, at), at);
      case Format::alpaca: return chat(parse_alpaca(obj, at), at);
      case Format::auto_detect: break;
    }
    for (const std::string& list : {messages_field(), conversations_field()}) {
      if (obj.contains(list)) return chat(parse_turns(obj, list, looks_like_sharegpt(obj[list]), at), at);
    }
    if (obj.contains("instruction")) return chat(parse_alpaca(obj, at), at);
    if (obj.contains(fields_.prompt_field) || obj.contains(fields_.completion_field)) return completion(obj, at);
    if (obj.contains(fields_.text_field)) return text(obj, at);
    std::string lists = "'" + messages_field() + "'";
    if (conversations_field() != messages_field()) lists += ", '" + conversations_field() + "'";
    throw DatasetError(at + "expected a field '" + fields_.text_field + "', '" + fields_.prompt_field + "' + '" +
                       fields_.completion_field + "', " + lists + " or 'instruction' + 'output'");
  }

 private:
  std::string messages_field() const { return fields_.messages_field.empty() ? "messages" : fields_.messages_field; }
  std::string conversations_field() const {
    return fields_.messages_field.empty() ? "conversations" : fields_.messages_field;
  }

  Example text(const json& obj, const std::string& at) {
    return tokenize_parts(tok_, {{string_field(obj, fields_.text_field, at), true}}, false, true, at);
  }

  Example completion(const json& obj, const std::string& at) {
    const std::string& p = string_field(obj, fields_.prompt_field, at);
    const std::string& c = string_field(obj, fields_.completion_field, at);
    return tokenize_parts(tok_, {{p, opt_.train_on_prompt}, {c, true}}, false, true, at);
  }

  Example chat(const std::vector<chat::Message>& msgs, const std::string& at) {
    try {
      if (!tmpl_) {
        tmpl_ = opt_.chat_template.empty() ? chat::detect_template(tok_.chat_template())
                                           : chat::template_by_name(opt_.chat_template);
      }
      chat::check_conversation(*tmpl_, msgs);
    } catch (const chat::TemplateError& e) {
      throw DatasetError(at + e.what());
    }
    auto text_of = [&](int32_t id) { return id >= 0 ? tok_.token_text(id) : std::string(); };
    auto segs = chat::render(*tmpl_, msgs, text_of(tok_.bos()), text_of(tok_.eos()));
    if (opt_.train_on_prompt) {
      for (auto& s : segs) s.assistant = true;
    }
    return tokenize_parts(tok_, segs, true, false, at);
  }

  const tok::Tokenizer& tok_;
  const DatasetOptions& opt_;
  const DataFormat& fields_;
  Format format_;
  std::optional<chat::Template> tmpl_;

 public:
  // The template conversation records were rendered with, "" when there were none.
  std::string chat_template() const { return tmpl_ ? chat::template_name(*tmpl_) : ""; }
};

// Cuts to seq_len + 1 tokens, or rejects; false when nothing is left to learn from.
bool fit_example(Example& ex, const DatasetOptions& opt, const std::string& at, TokenizedFile& out) {
  size_t max_len = size_t(opt.seq_len) + 1;
  if (ex.ids.size() > max_len) {
    if (opt.no_truncate) {
      throw DatasetError(at + "example has " + std::to_string(ex.ids.size()) +
                         " tokens, more than the context of " + std::to_string(opt.seq_len) +
                         " + 1 (no_truncate is set)");
    }
    ex.ids.resize(max_len);
    ex.mask.resize(max_len);
    ++out.n_truncated;
  }
  for (size_t t = 1; t < ex.mask.size(); ++t) {
    if (ex.mask[t]) return true;
  }
  ++out.n_no_loss;
  return false;
}

// The next line of in (without its '\n') into line; false at the end. A line longer than max_bytes is an error
// naming it, raised before more of it is read.
bool bounded_line(std::istream& in, std::string& line, size_t max_bytes, const std::string& at) {
  line.clear();
  if (in.peek() == std::char_traits<char>::eof()) return false;
  std::string chunk;
  while (true) {
    chunk.resize(1 << 16);
    in.getline(chunk.data(), std::streamsize(chunk.size()));
    const size_t got = size_t(in.gcount());
    const bool whole = !in.fail();  // the delimiter was met (gcount counts it) or the stream ended
    line.append(chunk.data(), whole && got > 0 && !in.eof() ? got - 1 : got);
    if (line.size() > max_bytes) {
      throw DatasetError(at + "a record of more than " + std::to_string(max_bytes >> 20) +
                         " MiB; one example is at most that (and keeps at most --seq-len tokens)");
    }
    if (whole || in.eof()) return true;
    in.clear();  // a full chunk without the delimiter: the line goes on
  }
}

TokenizedFile read_jsonl(const std::string& path, const tok::Tokenizer& tok, const DatasetOptions& opt) {
  TokenizedFile out;
  RecordReader reader(tok, opt);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DatasetError(path + ": cannot open the file");
  std::string line;
  for (size_t n = 1; bounded_line(in, line, kMaxRecordBytes, where(path, n)); ++n) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    std::string at = where(path, n);
    json obj = parse_json(line, at);
    Example ex = reader.read(obj, at);
    if (fit_example(ex, opt, at, out)) out.examples.push_back(std::move(ex));
  }
  out.chat_template = reader.chat_template();
  if (out.examples.empty() && out.n_no_loss == 0) throw DatasetError(path + ": no examples (the file is empty)");
  return out;
}

// The line on which each element of the top-level array in body starts (body parses as a JSON array): one pass
// that skips strings and counts depth.
std::vector<size_t> element_lines(const std::string& body) {
  std::vector<size_t> lines;
  size_t line = 1;
  int depth = 0;
  bool in_string = false, expect_element = false;
  for (size_t i = 0; i < body.size(); ++i) {
    const char c = body[i];
    if (c == '\n') ++line;
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == ' ' || c == '\t' || c == '\r' || c == '\n') continue;
    if (depth == 1 && expect_element && c != ']') lines.push_back(line);
    expect_element = false;
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      expect_element = ++depth == 1;
    } else if (c == ']' || c == '}') {
      --depth;
    } else if (c == ',' && depth == 1) {
      expect_element = true;
    }
  }
  return lines;
}

// A top-level array of records, each read like a JSONL line; errors name the line and the record's index.
TokenizedFile read_json_array(const std::string& path, const std::string& body, const tok::Tokenizer& tok,
                              const DatasetOptions& opt) {
  json records = parse_json(body, path + ": ");
  if (!records.is_array()) {
    throw DatasetError(path + ": expected a top-level JSON array of records, got " +
                       std::string(records.type_name()) + " (a file of one record per line is read as .jsonl)");
  }
  const std::vector<size_t> lines = element_lines(body);
  TokenizedFile out;
  RecordReader reader(tok, opt);
  for (size_t i = 0; i < records.size(); ++i) {
    std::string at = path;
    if (lines.size() == records.size()) at.append(":").append(std::to_string(lines[i]));
    at.append(": record [").append(std::to_string(i)).append("]: ");
    Example ex = reader.read(records[i], at);
    if (fit_example(ex, opt, at, out)) out.examples.push_back(std::move(ex));
  }
  if (out.examples.empty() && out.n_no_loss == 0) throw DatasetError(path + ": no examples (the array is empty)");
  out.chat_template = reader.chat_template();
  return out;
}

// The whole text as one stream, in windows of seq_len + 1 tokens overlapping by one. A text file is meant to be
// cut into windows, so no_truncate (which is about examples) does not apply.
TokenizedFile read_txt(const std::string& path, const std::string& body, const tok::Tokenizer& tok,
                       const DatasetOptions& opt) {
  if (body.find_first_not_of(" \t\r\n") == std::string::npos) throw DatasetError(path + ": the file is empty");
  Example all = tokenize_parts(tok, {{body, true}}, false, true, path + ": ");
  TokenizedFile out;
  size_t step = size_t(opt.seq_len);
  for (size_t start = 0; start + 1 < all.ids.size(); start += step) {
    size_t end = std::min(all.ids.size(), start + step + 1);
    Example ex;
    ex.ids.assign(all.ids.begin() + long(start), all.ids.begin() + long(end));
    ex.mask.assign(all.mask.begin() + long(start), all.mask.begin() + long(end));
    out.examples.push_back(std::move(ex));
  }
  return out;
}

}  // namespace

TokenizedFile tokenize_file(const std::string& path, const tok::Tokenizer& tok, const DatasetOptions& opt) {
  if (opt.seq_len < 1) throw DatasetError("seq_len must be at least 1");
  format_by_name(opt.format.format);
  if (ends_with(path, ".jsonl")) return read_jsonl(path, tok, opt);
  std::string body = read_all(path);
  if (ends_with(path, ".json")) return read_json_array(path, body, tok, opt);
  if (ends_with(path, ".txt")) return read_txt(path, body, tok, opt);
  throw DatasetError(path + ": unknown dataset format; expected a .txt, .jsonl or .json file");
}

std::vector<std::string> data_format_names() { return {std::begin(kFormatNames), std::end(kFormatNames)}; }

std::string show_mask(const tok::Tokenizer& tok, const Example& ex) {
  std::string out;
  bool open = false;
  for (size_t t = 0; t < ex.ids.size(); ++t) {
    bool counted = ex.mask[t] != 0;
    if (counted != open) out += counted ? "[" : "]";
    open = counted;
    out += token_piece(tok, ex.ids[t]);
  }
  if (open) out += "]";
  // Spaces spelt as SentencePiece's U+2581 (byte-token vocabularies keep them) are shown as spaces.
  std::string shown;
  for (size_t i = 0; i < out.size(); ++i) {
    bool sp = out.compare(i, 3, "\xE2\x96\x81") == 0;
    shown += sp ? ' ' : out[i];
    i += sp ? 2 : 0;
  }
  return shown;
}

}  // namespace q4t::data
