// Training data: files → tokenized examples (ids + loss mask) → shuffled batches of fixed shape [B, T].
//
// Files (chosen by extension):
//   .txt    the whole file is one document: BOS (when the tokenizer adds one) + text + EOS, cut into windows of
//           seq_len + 1 tokens that overlap by one token, so every token of the file is predicted once. This is
//           what llama.cpp's finetune does with a text file; blank lines are kept as text.
//   .jsonl  one JSON object per line (blank lines skipped), one of
//             {"text": "..."}                       every token counted;
//             {"prompt": "...", "completion": "..."} only the completion (and EOS) counted, unless
//                                                    train_on_prompt;
//             {"messages": [{"role", "content"}...]} rendered with a chat template (data/chat_template.h);
//                                                    only assistant turns counted, unless train_on_prompt.
//             {"instruction", "input", "output"}     alpaca: a user turn (instruction, then "\n\n" + input when
//                                                    input is non-empty) and an assistant turn (output), rendered
//                                                    and counted like "messages";
//             {"conversations": [{"from", "value"}...]} ShareGPT: from system, human or user, gpt or assistant;
//                                                    rendered and counted like "messages".
//           Each line is one example: BOS (when the tokenizer adds one and the text does not start with it) +
//           tokens (+ EOS for text and prompt/completion).
//   .json   a top-level array of the same records.
// DataFormat picks the record shape (auto: per record, from the fields present, in the order messages,
// conversations, instruction, prompt/completion, text; a list of turns is ShareGPT's when its first turn has
// "from") and the names of the text, prompt, completion and turn-list fields.
// Tokenization of an example whose parts count differently: the whole text is tokenized at once (so the ids are
// exactly what inference on that text sees), then each token is mapped back to the bytes it covers and is
// counted when any of them lies in a counted part. Chat text is tokenized with parse_special, so the template's
// markers become their control tokens (and so would marker text inside message content).
//
// Sequences: an example of n tokens gives n - 1 input positions; n may be at most seq_len + 1. Longer examples
// are truncated (and counted in the load report), or rejected with `file:line` when no_truncate.
// Labels: labels[t] = ids[t+1] when mask[t+1] == 1, else -100 (also at padding and at each example's last token).
//
// Batching: every batch is [B, T] with T = seq_len, a fixed shape so a training step can be recorded once.
//   pack = false: one example per row, padded; pad positions have attn_mask 0, label -100, id = EOS.
//   pack = true:  rows hold several examples, filled greedily in file order (an example that does not fit in
//                 what is left of a row starts the next one). Attention must stay inside each example: the rows
//                 carry segment_ids (1, 2, ... per example in the row, 0 at padding) and positions that restart
//                 at 0 for each example; the model builds the block-diagonal causal mask from segment_ids
//                 (q attends k iff segment_ids equal and k <= q): ag::attention's segment_ids input, through
//                 model::ModelGraph::logits(ids, segment_ids). RoPE scores depend only on the distance k - q,
//                 so inside a segment the restarting positions and the row's running positions give the same
//                 attention.
// Order: rows are shuffled per epoch with a permutation derived from (seed, epoch), identical on every platform;
// the cursor (epoch, index, seed) is all that exact resume needs.
#pragma once
#include <cstdint>
#include <iosfwd>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "data/tokenizer.h"

namespace q4t::data {

// Bad data: the message names `file:line` (or the file) and what was expected.
struct DatasetError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// How JSON records map onto examples. An empty messages_field means "messages" for chat records and
// "conversations" for ShareGPT ones.
struct DataFormat {
  std::string format = "auto";  // auto, text, completion, chat, alpaca or sharegpt
  std::string text_field = "text";
  std::string prompt_field = "prompt";
  std::string completion_field = "completion";
  std::string messages_field;
};
// The values of DataFormat::format: auto, text, completion, chat, alpaca, sharegpt.
std::vector<std::string> data_format_names();

struct DatasetOptions {
  int64_t seq_len = 512;          // T: input positions per row
  bool pack = false;              // several examples per row (see above)
  bool train_on_prompt = false;   // count prompts and non-assistant turns too
  bool no_truncate = false;       // an over-long example is an error instead of being truncated
  std::string chat_template;      // "" = recognised from the GGUF's tokenizer.chat_template
  DataFormat format;              // record shapes and field names of .jsonl/.json files
  double val_fraction = 0.0;      // examples held out for validation (ignored when val_file is set)
  std::string val_file;           // a separate validation file, read with the same options
  uint64_t seed = 42;             // the validation split and the shuffles
  bool use_cache = true;          // tokenized-file cache (dataset_cache.h)
  std::string cache_dir;          // "" = $XDG_CACHE_HOME/q4tune, else ~/.cache/q4tune
};

struct Example {
  std::vector<int32_t> ids;
  std::vector<uint8_t> mask;  // 1 = this token is predicted in the loss; same length as ids
};

// One file, tokenized.
struct TokenizedFile {
  std::vector<Example> examples;
  int64_t n_truncated = 0;  // examples cut to seq_len + 1 tokens
  int64_t n_no_loss = 0;    // examples with no counted token after truncation (dropped)
  std::string chat_template;  // the template its conversation records were rendered with ("" when none)
  bool from_cache = false;
};

// Tokenizes a .txt, .jsonl or .json file (no cache). Throws DatasetError.
TokenizedFile tokenize_file(const std::string& path, const tok::Tokenizer& tok, const DatasetOptions& opt);

struct Batch {
  int64_t B = 0, T = 0;
  std::vector<int32_t> ids;          // (B, T)
  std::vector<int32_t> labels;       // (B, T) next token or -100
  std::vector<uint8_t> attn_mask;    // (B, T) 1 = a real token, 0 = padding
  std::vector<int32_t> segment_ids;  // (B, T) 1.. per example within the row, 0 = padding
  std::vector<int32_t> positions;    // (B, T) restart at 0 for each example
  int64_t n_label_tokens() const;    // labels != -100
};

struct Cursor {
  uint64_t epoch = 0;  // completed passes
  uint64_t index = 0;  // next row within this epoch's order
  uint64_t seed = 0;
};

class Dataset {
 public:
  // seq_len, pack and seed come from opt.
  Dataset(std::vector<Example> examples, const DatasetOptions& opt, int32_t pad_id);

  size_t size() const { return rows_.size(); }  // rows per epoch
  const std::vector<Example>& examples() const { return examples_; }
  int64_t seq_len() const { return seq_len_; }
  bool packed() const { return pack_; }
  // Input positions holding a real token (each example of n tokens fills n - 1); the rows have size() * seq_len.
  int64_t real_positions() const;
  // Rows that packing these examples would take (size() when already packed).
  size_t packed_size() const;

  // The next B rows in this epoch's shuffled order; crosses into the next epoch (a new order) when needed.
  Batch next_batch(int64_t B);
  // Rows [first, first + B) in file order, unshuffled, the tail padded with empty rows: for evaluation.
  Batch batch_at(size_t first, int64_t B) const;

  Cursor cursor() const { return cursor_; }
  // Throws DatasetError when the cursor's seed differs or its index is past the end.
  void set_cursor(const Cursor& c);

 private:
  void fill_row(Batch& b, int64_t r, const std::vector<uint32_t>& row) const;
  std::vector<uint32_t> epoch_order(uint64_t epoch) const;

  std::vector<Example> examples_;
  std::vector<std::vector<uint32_t>> rows_;  // example indices per row
  int64_t seq_len_;
  bool pack_;
  int32_t pad_id_;
  Cursor cursor_;
  std::vector<uint32_t> order_;  // rows of cursor_.epoch
};

struct Datasets {
  Dataset train;
  std::optional<Dataset> val;
  std::string chat_template;  // the template the training file's conversations were rendered with ("": none)
};

// Tokenizes (through the cache), splits off validation and reports counts to log. Throws DatasetError.
Datasets load_datasets(const std::string& path, const tok::Tokenizer& tok, const DatasetOptions& opt,
                       std::ostream& log);

// One line on how full the rows are, e.g. "rows: 51% real tokens, 49% padding (--pack would fit the same data
// in about 12 rows instead of 40)"; the --pack advice only when unpacked rows are under 75% real tokens.
std::string padding_report(const Dataset& d);

// The example's text with the counted tokens in [brackets] (runs of counted tokens share one pair), control
// tokens written as their token text: for showing users what the loss sees.
std::string show_mask(const tok::Tokenizer& tok, const Example& ex);

// A deterministic permutation of [0, n) (Fisher-Yates over splitmix64), the same on every platform.
std::vector<uint32_t> permutation(size_t n, uint64_t seed);

}  // namespace q4t::data
