#include "data/dataset_cache.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <ostream>
#include <sstream>

#include "data/atomic_file.h"
#include "data/checksum.h"

namespace q4t::data {

namespace {

constexpr char kMagic[8] = {'Q', '4', 'T', 'D', 'A', 'T', 'A', '3'};
// Bumped whenever tokenization, the entry layout or the checksum changes, so old entries stop matching (2: XXH3
// instead of FNV-1a).
constexpr uint64_t kFormatVersion = 2;

std::string read_file(const std::string& path, bool* ok) {
  std::ifstream f(path, std::ios::binary);
  *ok = bool(f);
  std::ostringstream ss;
  if (f) ss << f.rdbuf();
  return ss.str();
}

void put_u64(std::string& s, uint64_t v) { s.append(reinterpret_cast<const char*>(&v), 8); }

std::string serialise(uint64_t key, const TokenizedFile& f) {
  std::string s(kMagic, 8);
  put_u64(s, key);
  put_u64(s, uint64_t(f.n_truncated));
  put_u64(s, uint64_t(f.n_no_loss));
  put_u64(s, f.chat_template.size());
  s += f.chat_template;
  put_u64(s, f.examples.size());
  for (const Example& e : f.examples) {
    uint32_t n = uint32_t(e.ids.size());
    s.append(reinterpret_cast<const char*>(&n), 4);
    s.append(reinterpret_cast<const char*>(e.ids.data()), n * 4);
    s.append(reinterpret_cast<const char*>(e.mask.data()), n);
  }
  put_u64(s, checksum64(s.data(), s.size()));
  return s;
}

// A bounds-checked reader over an entry; every failure names what was wrong.
struct Reader {
  const std::string& s;
  size_t at = 0;
  void need(size_t n, const char* what) {
    if (n > s.size() - 8 - at) throw DatasetError(std::string("truncated at ") + what);
  }
  uint64_t u64(const char* what) {
    need(8, what);
    uint64_t v;
    std::memcpy(&v, s.data() + at, 8);
    at += 8;
    return v;
  }
};

// Throws DatasetError (caught by the caller) describing the corruption.
TokenizedFile deserialise(const std::string& s, uint64_t key) {
  if (s.size() < 8 + 5 * 8 || std::memcmp(s.data(), kMagic, 8) != 0) throw DatasetError("bad magic or size");
  uint64_t stored;
  std::memcpy(&stored, s.data() + s.size() - 8, 8);
  if (stored != checksum64(s.data(), s.size() - 8)) throw DatasetError("checksum mismatch");
  Reader r{s, 8};
  if (r.u64("key") != key) throw DatasetError("entry for a different key");
  TokenizedFile f;
  f.n_truncated = int64_t(r.u64("counts"));
  f.n_no_loss = int64_t(r.u64("counts"));
  const uint64_t n_tmpl = r.u64("template length");
  r.need(n_tmpl, "template");
  f.chat_template = s.substr(r.at, n_tmpl);
  r.at += n_tmpl;
  uint64_t n_ex = r.u64("example count");
  if (n_ex > s.size() / 4) throw DatasetError("impossible example count");
  f.examples.resize(n_ex);
  for (Example& e : f.examples) {
    r.need(4, "example length");
    uint32_t n;
    std::memcpy(&n, s.data() + r.at, 4);
    r.at += 4;
    r.need(size_t(n) * 5, "example data");
    e.ids.resize(n);
    e.mask.assign(s.begin() + long(r.at + size_t(n) * 4), s.begin() + long(r.at + size_t(n) * 5));
    std::memcpy(e.ids.data(), s.data() + r.at, size_t(n) * 4);
    r.at += size_t(n) * 5;
  }
  if (r.at != s.size() - 8) throw DatasetError("trailing bytes");
  f.from_cache = true;
  return f;
}

std::string extension(const std::string& path) {
  size_t dot = path.find_last_of('.');
  return dot == std::string::npos ? "" : path.substr(dot);
}

}  // namespace

uint64_t cache_key(const std::string& file_bytes, const std::string& path, const tok::Tokenizer& tok,
                   const DatasetOptions& opt) {
  Checksum64 h;
  h.u64(kFormatVersion);
  h.str(file_bytes);
  h.str(extension(path));
  h.u64(tok.content_hash());
  h.u64(uint64_t(int64_t(tok.bos())));
  h.u64(uint64_t(int64_t(tok.eos())));
  h.u64(uint64_t(tok.add_bos()) | uint64_t(tok.add_eos()) << 1);
  h.str(tok.chat_template());
  h.u64(uint64_t(opt.seq_len));
  h.u64(uint64_t(opt.train_on_prompt) | uint64_t(opt.no_truncate) << 1);
  h.str(opt.chat_template);
  h.str(opt.format.format);
  h.str(opt.format.text_field);
  h.str(opt.format.prompt_field);
  h.str(opt.format.completion_field);
  h.str(opt.format.messages_field);
  return h.digest();
}

std::string cache_dir(const DatasetOptions& opt) {
  if (!opt.cache_dir.empty()) return opt.cache_dir;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return std::string(x) + "/q4tune";
  if (const char* home = std::getenv("HOME"); home && *home) return std::string(home) + "/.cache/q4tune";
  return ".q4tune-cache";
}

namespace {
std::string entry_path(const DatasetOptions& opt, uint64_t key) {
  char name[32];
  std::snprintf(name, sizeof name, "%016llx.q4td", static_cast<unsigned long long>(key));
  return cache_dir(opt) + "/" + name;
}
}  // namespace

std::string cache_entry_path(const std::string& path, const tok::Tokenizer& tok, const DatasetOptions& opt) {
  bool ok;
  std::string bytes = read_file(path, &ok);
  if (!ok) throw DatasetError(path + ": cannot open the file");
  return entry_path(opt, cache_key(bytes, path, tok, opt));
}

TokenizedFile load_tokenized(const std::string& path, const tok::Tokenizer& tok, const DatasetOptions& opt,
                             std::ostream& log) {
  if (!opt.use_cache) return tokenize_file(path, tok, opt);
  bool ok;
  std::string bytes = read_file(path, &ok);
  if (!ok) throw DatasetError(path + ": cannot open the file");
  uint64_t key = cache_key(bytes, path, tok, opt);
  std::string entry = entry_path(opt, key);
  bool have;
  std::string cached = read_file(entry, &have);
  if (have) {
    try {
      return deserialise(cached, key);
    } catch (const DatasetError& e) {
      log << "dataset cache entry " << entry << " is corrupt (" << e.what() << "); rebuilding it\n";
    }
  }
  TokenizedFile f = tokenize_file(path, tok, opt);
  try {
    std::filesystem::create_directories(cache_dir(opt));
    write_file_atomic(entry, serialise(key, f));
  } catch (const std::exception& e) {
    log << "could not write the dataset cache entry " << entry << ": " << e.what() << "\n";
  }
  return f;
}

}  // namespace q4t::data
