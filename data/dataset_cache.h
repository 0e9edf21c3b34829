// The tokenized-dataset cache: tokenizing a large file is slow and its result depends only on the file's bytes,
// the tokenizer and the options that shape examples, so it is kept in <cache_dir>/<key>.q4td.
//
// Entry layout (little-endian): "Q4TDATA3"; u64 key; u64 n_truncated; u64 n_no_loss; u64 n, the chat template's
// n bytes; u64 n_examples; per example u32 n, i32 ids[n], u8 mask[n]; u64 XXH3 checksum of everything before it
// (data/checksum.h). Entries are written atomically; an entry with bad magic, a different key, an impossible size
// or a wrong checksum is reported and rebuilt.
#pragma once
#include <iosfwd>
#include <string>

#include "data/dataset.h"

namespace q4t::data {

// Hash of the file's contents, the tokenizer (content_hash, BOS/EOS and their add flags, chat template) and
// the options that change tokenized examples (seq_len, train_on_prompt, no_truncate, chat_template, and the
// record format with its field names).
uint64_t cache_key(const std::string& file_bytes, const std::string& path, const tok::Tokenizer& tok,
                   const DatasetOptions& opt);
// opt.cache_dir, else $XDG_CACHE_HOME/q4tune, else $HOME/.cache/q4tune.
std::string cache_dir(const DatasetOptions& opt);
// The entry path for this file; throws DatasetError when the file cannot be read.
std::string cache_entry_path(const std::string& path, const tok::Tokenizer& tok, const DatasetOptions& opt);

// tokenize_file through the cache (when opt.use_cache): an intact entry is read (from_cache = true), else the
// file is tokenized and the entry written. A failure to write the cache is reported to log, not thrown.
TokenizedFile load_tokenized(const std::string& path, const tok::Tokenizer& tok, const DatasetOptions& opt,
                             std::ostream& log);

}  // namespace q4t::data
