// Files → examples: the .txt and .jsonl formats, and the byte alignment that gives each token its loss mask.
#include <algorithm>
#include <fstream>
#include <optional>
#include <sstream>

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

void normalise_spaces(std::string& s, std::vector<int32_t>& owner) {
  static const std::string kSp = "\xE2\x96\x81";
  std::string out;
  std::vector<int32_t> own;
  for (size_t i = 0; i < s.size();) {
    bool sp = s.compare(i, kSp.size(), kSp) == 0;
    out.push_back(sp ? ' ' : s[i]);
    own.push_back(owner[i]);
    i += sp ? kSp.size() : 1;
  }
  s.swap(out);
  owner.swap(own);
}

// Marks token k counted when any text byte it covers is counted. Spaces present on one side only (the space
// SentencePiece puts before a text, one a decoder drops) go to the neighbouring token.
std::vector<uint8_t> align_mask(const tok::Tokenizer& tok, const std::vector<int32_t>& ids, const std::string& text,
                                const std::vector<uint8_t>& counted) {
  std::string s;
  std::vector<int32_t> owner;
  for (size_t k = 0; k < ids.size(); ++k) push_piece(s, owner, token_piece(tok, ids[k]), int32_t(k));
  normalise_spaces(s, owner);
  std::vector<uint8_t> mask(ids.size(), 0);
  size_t i = 0, j = 0;
  while (i < s.size() && j < text.size()) {
    if (s[i] == text[j]) {
      mask[size_t(owner[i++])] |= counted[j++];
    } else if (s[i] == ' ') {
      mask[size_t(owner[i++])] |= counted[j];
    } else if (text[j] == ' ') {
      mask[size_t(owner[i])] |= counted[j++];
    } else {
      throw DatasetError("cannot map token " + std::to_string(owner[i]) + " ('" + tok.token_text(ids[owner[i]]) +
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
                       bool add_eos) {
  std::string text;
  std::vector<uint8_t> counted;
  for (const auto& p : parts) {
    text += p.text;
    counted.insert(counted.end(), p.text.size(), p.assistant ? 1 : 0);
  }
  Example ex;
  ex.ids = tok.encode(text, parse_special);
  ex.mask = align_mask(tok, ex.ids, text, counted);
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

std::string where(const std::string& path, size_t line) { return path + ":" + std::to_string(line) + ": "; }

const std::string& string_field(const json& obj, const char* key, const std::string& at) {
  auto it = obj.find(key);
  if (it == obj.end()) throw DatasetError(at + "missing field '" + key + "'");
  if (!it->is_string()) {
    throw DatasetError(at + "field '" + key + "' is " + it->type_name() + ", expected a string");
  }
  return it->get_ref<const std::string&>();
}

std::vector<chat::Message> parse_messages(const json& msgs, const std::string& at) {
  if (!msgs.is_array()) throw DatasetError(at + "field 'messages' is " + std::string(msgs.type_name()) +
                                           ", expected an array of {\"role\", \"content\"} objects");
  std::vector<chat::Message> out;
  for (size_t i = 0; i < msgs.size(); ++i) {
    const json& m = msgs[i];
    std::string mat = at + "messages[" + std::to_string(i) + "]: ";
    if (!m.is_object()) throw DatasetError(mat + "is " + std::string(m.type_name()) + ", expected an object");
    out.push_back({string_field(m, "role", mat), string_field(m, "content", mat)});
  }
  return out;
}

// Parses one JSONL record into an example; `tmpl` is resolved on the first chat record.
class JsonlReader {
 public:
  JsonlReader(const tok::Tokenizer& tok, const DatasetOptions& opt) : tok_(tok), opt_(opt) {}

  Example read(const std::string& line, const std::string& at) {
    json obj;
    try {
      obj = json::parse(line);
    } catch (const json::parse_error& e) {
      throw DatasetError(at + "malformed JSON: " + e.what());
    }
    if (!obj.is_object()) throw DatasetError(at + "expected a JSON object, got " + std::string(obj.type_name()));
    if (obj.contains("messages")) return chat(parse_messages(obj["messages"], at), at);
    if (obj.contains("prompt") || obj.contains("completion")) {
      const std::string& p = string_field(obj, "prompt", at);
      const std::string& c = string_field(obj, "completion", at);
      return tokenize_parts(tok_, {{p, opt_.train_on_prompt}, {c, true}}, false, true);
    }
    if (obj.contains("text")) return tokenize_parts(tok_, {{string_field(obj, "text", at), true}}, false, true);
    throw DatasetError(at + "expected a field 'text', 'prompt' + 'completion', or 'messages'");
  }

 private:
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
    return tokenize_parts(tok_, segs, true, false);
  }

  const tok::Tokenizer& tok_;
  const DatasetOptions& opt_;
  std::optional<chat::Template> tmpl_;
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

TokenizedFile read_jsonl(const std::string& path, const std::string& body, const tok::Tokenizer& tok,
                         const DatasetOptions& opt) {
  TokenizedFile out;
  JsonlReader reader(tok, opt);
  std::istringstream in(body);
  std::string line;
  for (size_t n = 1; std::getline(in, line); ++n) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    std::string at = where(path, n);
    Example ex = reader.read(line, at);
    if (fit_example(ex, opt, at, out)) out.examples.push_back(std::move(ex));
  }
  if (out.examples.empty() && out.n_no_loss == 0) throw DatasetError(path + ": no examples (the file is empty)");
  return out;
}

// The whole text as one stream, in windows of seq_len + 1 tokens overlapping by one. A text file is meant to be
// cut into windows, so no_truncate (which is about examples) does not apply.
TokenizedFile read_txt(const std::string& path, const std::string& body, const tok::Tokenizer& tok,
                       const DatasetOptions& opt) {
  if (body.find_first_not_of(" \t\r\n") == std::string::npos) throw DatasetError(path + ": the file is empty");
  Example all = tokenize_parts(tok, {{body, true}}, false, true);
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
  std::string body = read_all(path);
  if (ends_with(path, ".jsonl")) return read_jsonl(path, body, tok, opt);
  if (ends_with(path, ".txt")) return read_txt(path, body, tok, opt);
  throw DatasetError(path + ": unknown dataset format; expected a .txt or .jsonl file");
}

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
