// Examples → rows → batches; the validation split; the per-epoch shuffle.
#include "data/dataset.h"

#include <algorithm>
#include <cmath>
#include <ostream>

#include "data/dataset_cache.h"
#include "data/splitmix.h"

namespace q4t::data {

namespace {

// Distinct streams for the split and for each epoch's order, all from the one user seed.
uint64_t derive_seed(uint64_t seed, uint64_t stream) {
  uint64_t s = seed ^ (stream * 0xD1B54A32D192ED03ull);
  return splitmix64_next(s);
}
constexpr uint64_t kSplitStream = ~0ull;

// Greedy in file order; every example fits an empty row (at most seq_len + 1 tokens → seq_len positions).
std::vector<std::vector<uint32_t>> pack_rows(const std::vector<Example>& ex, int64_t seq_len, bool pack) {
  std::vector<std::vector<uint32_t>> rows;
  int64_t used = seq_len;
  for (uint32_t i = 0; i < ex.size(); ++i) {
    int64_t n = int64_t(ex[i].ids.size()) - 1;
    if (!pack || used + n > seq_len) {
      rows.emplace_back();
      used = 0;
    }
    rows.back().push_back(i);
    used += n;
  }
  return rows;
}

void report(std::ostream& log, const std::string& what, const TokenizedFile& f, const Dataset& d) {
  log << what << ": " << d.examples().size() << (d.examples().size() == 1 ? " example in " : " examples in ")
      << d.size() << (d.size() == 1 ? " row of " : " rows of ") << d.seq_len() << " tokens"
      << (f.from_cache ? " (tokenized cache)" : "");
  if (f.n_truncated) log << "; " << f.n_truncated << " truncated to the context";
  if (f.n_no_loss) log << "; " << f.n_no_loss << " dropped with no token in the loss";
  log << "\n";
}

Batch empty_batch(int64_t B, int64_t T, int32_t pad) {
  Batch b;
  b.B = B;
  b.T = T;
  size_t n = size_t(B * T);
  b.ids.assign(n, pad);
  b.labels.assign(n, -100);
  b.attn_mask.assign(n, 0);
  b.segment_ids.assign(n, 0);
  b.positions.assign(n, 0);
  return b;
}

}  // namespace

std::vector<uint32_t> permutation(size_t n, uint64_t seed) {
  std::vector<uint32_t> p(n);
  for (size_t i = 0; i < n; ++i) p[i] = uint32_t(i);
  uint64_t state = seed;
  for (size_t i = n; i > 1; --i) {
    size_t j = size_t(splitmix64_next(state) % i);
    std::swap(p[i - 1], p[j]);
  }
  return p;
}

int64_t Batch::n_label_tokens() const {
  int64_t n = 0;
  for (int32_t l : labels) n += l != -100;
  return n;
}

Dataset::Dataset(std::vector<Example> examples, const DatasetOptions& opt, int32_t pad_id)
    : examples_(std::move(examples)), seq_len_(opt.seq_len), pack_(opt.pack), pad_id_(pad_id) {
  for (const Example& e : examples_) {
    if (e.ids.size() < 2 || e.ids.size() > size_t(seq_len_) + 1 || e.mask.size() != e.ids.size()) {
      throw DatasetError("an example of " + std::to_string(e.ids.size()) + " tokens does not fit rows of " +
                         std::to_string(seq_len_));
    }
  }
  rows_ = pack_rows(examples_, seq_len_, opt.pack);
  cursor_.seed = opt.seed;
  order_ = epoch_order(0);
}

int64_t Dataset::real_positions() const {
  int64_t n = 0;
  for (const Example& e : examples_) n += int64_t(e.ids.size()) - 1;
  return n;
}

size_t Dataset::packed_size() const { return pack_ ? rows_.size() : pack_rows(examples_, seq_len_, true).size(); }

std::string padding_report(const Dataset& d) {
  const int64_t slots = int64_t(d.size()) * d.seq_len();
  if (slots == 0) return "rows: none";
  const int64_t real = int64_t(std::llround(100.0 * double(d.real_positions()) / double(slots)));
  std::string line = std::string("rows") + (d.packed() ? " (packed)" : "") + ": " + std::to_string(real) +
                     "% real tokens, " + std::to_string(100 - real) + "% padding";
  constexpr int64_t kAdvisePackBelow = 75;
  const size_t packed = d.packed() || real >= kAdvisePackBelow ? d.size() : d.packed_size();
  if (packed < d.size()) {
    line += " (--pack would fit the same data in about " + std::to_string(packed) + (packed == 1 ? " row" : " rows") +
            " instead of " + std::to_string(d.size()) + ")";
  }
  return line;
}

std::vector<uint32_t> Dataset::epoch_order(uint64_t epoch) const {
  return permutation(rows_.size(), derive_seed(cursor_.seed, epoch));
}

void Dataset::fill_row(Batch& b, int64_t r, const std::vector<uint32_t>& row) const {
  int64_t p = 0;
  int32_t segment = 0;
  for (uint32_t i : row) {
    const Example& e = examples_[i];
    ++segment;
    for (size_t t = 0; t + 1 < e.ids.size(); ++t, ++p) {
      size_t at = size_t(r * b.T + p);
      b.ids[at] = e.ids[t];
      b.labels[at] = e.mask[t + 1] ? e.ids[t + 1] : -100;
      b.attn_mask[at] = 1;
      b.segment_ids[at] = segment;
      b.positions[at] = int32_t(t);
    }
  }
}

Batch Dataset::next_batch(int64_t B) {
  if (rows_.empty()) throw DatasetError("the dataset has no examples");
  Batch b = empty_batch(B, seq_len_, pad_id_);
  for (int64_t r = 0; r < B; ++r) {
    if (cursor_.index >= rows_.size()) {
      ++cursor_.epoch;
      cursor_.index = 0;
      order_ = epoch_order(cursor_.epoch);
    }
    fill_row(b, r, rows_[order_[cursor_.index++]]);
  }
  return b;
}

Batch Dataset::batch_at(size_t first, int64_t B) const {
  Batch b = empty_batch(B, seq_len_, pad_id_);
  for (int64_t r = 0; r < B && first + size_t(r) < rows_.size(); ++r) fill_row(b, r, rows_[first + size_t(r)]);
  return b;
}

void Dataset::set_cursor(const Cursor& c) {
  if (c.seed != cursor_.seed) {
    throw DatasetError("the saved data cursor has seed " + std::to_string(c.seed) + " but the dataset uses " +
                       std::to_string(cursor_.seed));
  }
  if (c.index > rows_.size()) {
    throw DatasetError("the saved data cursor points at row " + std::to_string(c.index) + " of " +
                       std::to_string(rows_.size()) + ": the dataset changed");
  }
  cursor_ = c;
  order_ = epoch_order(c.epoch);
}

Datasets load_datasets(const std::string& path, const tok::Tokenizer& tok, const DatasetOptions& opt,
                       std::ostream& log) {
  int32_t pad = tok.eos() >= 0 ? tok.eos() : 0;
  TokenizedFile train = load_tokenized(path, tok, opt, log);
  std::vector<Example> train_ex = std::move(train.examples), val_ex;
  std::optional<TokenizedFile> val;
  if (!opt.val_file.empty()) {
    val = load_tokenized(opt.val_file, tok, opt, log);
    val_ex = std::move(val->examples);
  } else if (opt.val_fraction > 0.0 && train_ex.size() >= 2) {
    size_t n = train_ex.size();
    size_t n_val = std::clamp<size_t>(size_t(std::llround(opt.val_fraction * double(n))), 1, n - 1);
    std::vector<uint8_t> is_val(n, 0);
    auto perm = permutation(n, derive_seed(opt.seed, kSplitStream));
    for (size_t i = 0; i < n_val; ++i) is_val[perm[i]] = 1;
    std::vector<Example> kept;
    for (size_t i = 0; i < n; ++i) (is_val[i] ? val_ex : kept).push_back(std::move(train_ex[i]));
    train_ex = std::move(kept);
    val = TokenizedFile{};
  } else if (opt.val_fraction > 0.0) {
    log << path << ": too few examples to hold some out for validation; training on all of them\n";
  }
  if (train_ex.empty()) throw DatasetError(path + ": no example has a token in the loss");
  Datasets out{Dataset(std::move(train_ex), opt, pad), std::nullopt, train.chat_template};
  report(log, path, train, out.train);
  if (val && !val_ex.empty()) {
    out.val.emplace(std::move(val_ex), opt, pad);
    report(log, opt.val_file.empty() ? "validation split" : opt.val_file, *val, *out.val);
  }
  return out;
}

}  // namespace q4t::data
