// q4tune merge: LoRA adapters folded into their base model. Each adapted weight becomes
// W' = dequant(W) + Σ scale·B·A and is quantized again, to its own type or to --type; every other tensor and the
// metadata are copied. The output streams one tensor at a time (gguf::Writer's produced tensors), so memory holds
// one weight in f32 beside the mapped input, and it appears under its name only once whole.
#include <CLI/CLI.hpp>
#include <Eigen/Core>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>

#include "data/gguf.h"
#include "kernels/cpu/threads.h"
#include "kernels/formats.h"
#include "train/cli_common.h"
#include "train/commands.h"
#include "train/run_log.h"
#include "train/train.h"

namespace fs = std::filesystem;

namespace q4t {
namespace {

using gguf::GgmlType;
using RowMajor = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// One adapter of one weight on the host: A [r, n_in] and B [n_out, r] row-major, and the scale of B·A.
struct HostLora {
  std::vector<float> a, b;
  int64_t r = 0;
  double scale = 0;
  std::string from;  // the adapter as given, for messages
};
// By the name of the weight they adapt; several adapters may fold into one weight.
using HostLoras = std::multimap<std::string, HostLora>;

// A 2-D or 1-D tensor's values as f32 (any type q4tune reads).
std::vector<float> tensor_floats(const gguf::TensorInfo& t) {
  const int64_t n_in = t.cols(), rows = t.rows();
  if (t.type == GgmlType::F32) {
    std::vector<float> v(static_cast<size_t>(n_in * rows));
    std::memcpy(v.data(), t.data, v.size() * sizeof(float));
    return v;
  }
  const FormatTraits* f = find_format(uint32_t(t.type));
  if (!f) throw std::invalid_argument("tensor '" + t.name + "' is " + gguf::type_name(t.type) + ", which q4tune cannot read");
  return dequantize_matrix(f->format, std::span<const uint8_t>(t.data, t.bytes), rows, n_in);
}

std::string shape(int64_t rows, int64_t cols) { return "[" + std::to_string(rows) + ", " + std::to_string(cols) + "]"; }

// Adds one LoRA pair to `out` after checking it against the model's tensor `weight` (n_in = ne[0], n_out = ne[1]).
void add_lora(const std::string& from, const gguf::File& model, const std::string& weight, std::vector<float> a,
              int64_t r, std::vector<float> b, double scale, HostLoras& out) {
  const gguf::TensorInfo* w = model.tensor(weight);
  if (!w)
    throw std::invalid_argument(from + ": its adapter of '" + weight + "' names no tensor of " + model.path() +
                                " (an adapter of another model?)");
  const int64_t n_in = w->ne[0], n_out = w->ne.size() > 1 ? w->ne[1] : 1;
  if (w->ne.size() != 2 || int64_t(a.size()) != r * n_in || int64_t(b.size()) != n_out * r)
    throw std::invalid_argument(from + ": its adapter of '" + weight + "' (A " + shape(r, int64_t(a.size()) / std::max<int64_t>(r, 1)) +
                                ", B " + shape(int64_t(b.size()) / std::max<int64_t>(r, 1), r) + ") does not fit the weight " +
                                shape(n_out, n_in) + " of " + model.path() + " (an adapter of a model with other dims?)");
  out.insert({weight, HostLora{std::move(a), std::move(b), r, scale, from}});
}

// A GGUF LoRA (llama.cpp's format): blk.N.<proj>.weight.lora_a ne [n_in, r] and .lora_b ne [r, n_out], each
// pair scaled by user_scale · adapter.lora.alpha / r.
void read_adapter_file(const std::string& path, double user_scale, const gguf::File& model, HostLoras& out) {
  const auto a = gguf::File::open(path);
  a->expect_adapter();
  if (a->get_string("general.type") != "adapter" || a->get_string("adapter.type") != "lora")
    throw std::invalid_argument(path + ": not a LoRA adapter (general.type 'adapter', adapter.type 'lora')");
  const std::string arch = a->get_string("general.architecture"), model_arch = model.get_string("general.architecture");
  if (arch != model_arch)
    throw std::invalid_argument(path + ": an adapter for a " + arch + " model; " + model.path() + " is " + model_arch);
  const double alpha = a->get_float("adapter.lora.alpha");
  const std::vector<model::AdapterPair> pairs = model::adapter_pairs(*a);
  if (pairs.empty()) throw std::invalid_argument(path + ": no '*.lora_a' tensors");
  for (const auto& [weight, ta, tb] : pairs) {
    if (!tb) throw std::invalid_argument(path + ": '" + weight + ".lora_b' is missing (its lora_a is present)");
    if (ta->ne.size() != 2 || tb->ne.size() != 2 || ta->ne[1] != tb->ne[0])
      throw std::invalid_argument(path + ": '" + weight + "': lora_a and lora_b do not share a rank");
    const int64_t r = ta->ne[1];
    add_lora(path, model, weight, tensor_floats(*ta), r, tensor_floats(*tb), user_scale * alpha / double(r), out);
  }
}

// A training run (its newest complete checkpoint) or a checkpoint: its LoRA tensors blk.N.<proj>.lora_a [r, n_in]
// and .lora_b [n_out, r], scaled by user_scale · alpha / r (alpha / sqrt(r) with rsLoRA).
void read_run_adapters(const std::string& dir, double user_scale, const gguf::File& model, HostLoras& out) {
  RunInfo run = read_run(dir);
  ag::LoraConfig lora = run_lora_spec(run).cfg;
  std::map<std::string, NamedTensor*> by_name;
  for (NamedTensor& t : run.state.lora) by_name[t.name] = &t;
  int pairs = 0;
  for (auto& [name, ta] : by_name) {
    const std::string suffix = ".lora_a";
    if (name.size() <= suffix.size() || name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) continue;
    const std::string stem = name.substr(0, name.size() - suffix.size());
    auto tb = by_name.find(stem + ".lora_b");
    if (tb == by_name.end() || ta->shape.size() != 2 || tb->second->shape.size() != 2)
      throw std::runtime_error(run.checkpoint + "/lora.bin: '" + stem + "' lacks a 2-D lora_a and lora_b");
    const int64_t r = lora.rank = ta->shape[0];  // the pair's own rank
    const double scale = user_scale * lora.scale();
    add_lora(run.checkpoint, model, stem + ".weight", std::move(ta->values), r, std::move(tb->second->values), scale,
             out);
    ++pairs;
  }
  if (pairs == 0) throw std::runtime_error(run.checkpoint + "/lora.bin: no LoRA tensors");
}

// The bits of a block that belong to one weight alone (its quant), per weight: found by flipping each bit of a
// block quantized from random values and seeing which weights change, so no format needs code of its own here.
// k = 0 where the weights do not all own the same number (1 to 8) of bits (F16, BF16: not blocks of quants).
struct QuantBits {
  int k = 0;
  std::vector<std::vector<int64_t>> bits;  // bits[i]: weight i's bit positions in the block
  std::vector<uint8_t> mask;               // every weight's bits
  std::vector<std::vector<uint8_t>> all;   // all[v]: the bits that give every weight the quant pattern v
};

QuantBits probe_quant_bits(const FormatTraits& f) {
  QuantBits q;
  const int64_t n = f.block_elems;
  if (n < 2) return q;
  std::vector<float> x(static_cast<size_t>(n)), ref(x.size()), got(x.size());
  uint64_t state = 0x9E3779B97F4A7C15ull;  // a fixed pseudo-random block: every scale of it non-zero
  for (float& v : x) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    v = float(int64_t(state >> 40) % 2001 - 1000) / 1000.0f;
  }
  std::vector<uint8_t> block(static_cast<size_t>(f.block_bytes));
  f.quantize_row(block.data(), x.data(), n);
  f.dequantize_row(ref.data(), block.data(), n);
  q.bits.assign(static_cast<size_t>(n), {});
  for (int64_t bit = 0; bit < 8 * f.block_bytes; ++bit) {
    block[size_t(bit / 8)] ^= uint8_t(1u << (bit % 8));
    f.dequantize_row(got.data(), block.data(), n);
    block[size_t(bit / 8)] ^= uint8_t(1u << (bit % 8));
    int64_t changed = -1, count = 0;
    for (int64_t i = 0; i < n; ++i)
      if (!(got[size_t(i)] == ref[size_t(i)])) changed = i, ++count;
    if (count == 1) q.bits[size_t(changed)].push_back(bit);
  }
  const size_t k = q.bits[0].size();
  for (const auto& b : q.bits)
    if (b.size() != k || k < 1 || k > 8) return QuantBits{};
  q.k = int(k);
  q.mask.assign(block.size(), 0);
  q.all.assign(size_t(1) << k, std::vector<uint8_t>(block.size(), 0));
  for (const auto& b : q.bits)
    for (size_t j = 0; j < k; ++j) {
      const auto bit = uint8_t(1u << (b[j] % 8));
      q.mask[size_t(b[j] / 8)] |= bit;
      for (uint32_t v = 0; v < (1u << k); ++v)
        if ((v >> j) & 1u) q.all[v][size_t(b[j] / 8)] |= bit;
    }
  return q;
}

const QuantBits& quant_bits(const FormatTraits& f) {
  static std::mutex m;
  static std::map<Format, QuantBits> probed;
  std::lock_guard<std::mutex> lock(m);
  auto it = probed.find(f.format);
  if (it == probed.end()) it = probed.emplace(f.format, probe_quant_bits(f)).first;
  return it->second;
}

void set_quant(uint8_t* block, const std::vector<int64_t>& bits, uint32_t v) {
  for (size_t j = 0; j < bits.size(); ++j) {
    const auto mask = uint8_t(1u << (bits[j] % 8));
    uint8_t& byte = block[size_t(bits[j] / 8)];
    byte = (v >> j) & 1u ? uint8_t(byte | mask) : uint8_t(byte & ~mask);
  }
}

double squared_error(const float* a, const float* b, int64_t n) {
  double e = 0;
  for (int64_t i = 0; i < n; ++i) e += double(a[i] - b[i]) * double(a[i] - b[i]);
  return e;
}

// The bytes of W[n_out, n_in] in `type` (F32, or any format q4tune writes). With `before` (the weight's bytes
// before the merge, in the same type), each block is also rounded on its old grid (its old scales kept, each
// weight's quant chosen anew), and the block keeps whichever of that and the block quantized afresh lies closer
// to W: an adapter's small change then costs at most itself, not a whole new rounding of the block.
std::vector<uint8_t> encode(const std::vector<float>& w, GgmlType type, int64_t n_out, int64_t n_in,
                            const uint8_t* before = nullptr) {
  if (type == GgmlType::F32) {
    std::vector<uint8_t> bytes(w.size() * sizeof(float));
    std::memcpy(bytes.data(), w.data(), bytes.size());
    return bytes;
  }
  const FormatTraits& f = *find_format(uint32_t(type));
  const int64_t rb = row_bytes(f.format, n_in);
  std::vector<uint8_t> bytes(static_cast<size_t>(n_out * rb));
  cpu::parallel_for(n_out, 4, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) f.quantize_row(bytes.data() + r * rb, w.data() + r * n_in, n_in);
  });
  const QuantBits& q = quant_bits(f);
  if (!before || q.k == 0) return bytes;
  const int64_t n = f.block_elems, blocks = n_out * (n_in / n);  // rows are whole blocks: block b holds weights b·n ..
  cpu::parallel_for(blocks, 64, [&](int64_t b0, int64_t b1) {
    std::vector<float> fresh(static_cast<size_t>(n)), deq(fresh.size()), best(fresh.size());
    std::vector<uint32_t> pick(fresh.size());
    std::vector<uint8_t> grid(static_cast<size_t>(f.block_bytes));
    for (int64_t b = b0; b < b1; ++b) {
      uint8_t* out = bytes.data() + b * f.block_bytes;
      const float* x = w.data() + b * n;
      std::memcpy(grid.data(), before + b * f.block_bytes, grid.size());
      std::fill(best.begin(), best.end(), INFINITY);
      for (uint32_t v = 0; v < (1u << q.k); ++v) {
        for (size_t j = 0; j < grid.size(); ++j) grid[j] = uint8_t((grid[j] & ~q.mask[j]) | q.all[v][j]);
        f.dequantize_row(deq.data(), grid.data(), n);
        for (int64_t i = 0; i < n; ++i)
          if (std::abs(deq[size_t(i)] - x[i]) < best[size_t(i)]) best[size_t(i)] = std::abs(deq[size_t(i)] - x[i]), pick[size_t(i)] = v;
      }
      for (int64_t i = 0; i < n; ++i) set_quant(grid.data(), q.bits[size_t(i)], pick[size_t(i)]);
      f.dequantize_row(deq.data(), grid.data(), n);
      f.dequantize_row(fresh.data(), out, n);
      if (squared_error(deq.data(), x, n) < squared_error(fresh.data(), x, n)) std::memcpy(out, grid.data(), grid.size());
    }
  });
  return bytes;
}

}  // namespace

int run_merge(const MergeOptions& o, std::ostream& out) {
  if (o.model.empty()) throw std::invalid_argument("merge: a base model: -m/--model FILE.gguf");
  if (o.out.empty()) throw std::invalid_argument("merge: an output file: -o/--out FILE.gguf");
  if (o.adapters.empty()) throw std::invalid_argument("merge: at least one --adapter (a GGUF LoRA, a run or a checkpoint)");
  if (!o.scales.empty() && o.scales.size() != o.adapters.size())
    throw std::invalid_argument("merge: " + train::plural(int64_t(o.scales.size()), "--adapter-scale") + " for " +
                                train::plural(int64_t(o.adapters.size()), "adapter") + ": give one per adapter, or none");
  if (!fs::is_regular_file(o.model)) throw std::invalid_argument("--model: '" + o.model + "' does not exist or is not a file");
  std::error_code ec;
  if (fs::exists(o.out, ec) && fs::equivalent(o.out, o.model, ec))
    throw std::invalid_argument("--out: '" + o.out + "' is the base model itself; write the merged model elsewhere");
  const auto model = gguf::File::open(o.model);
  model->expect_model();
  // The types (--type first: a bad name fails before any adapter is read), the adapters, and every refusal, all
  // before anything is written.
  const std::vector<gguf::TensorInfo>& tensors = model->tensors();
  std::vector<GgmlType> types;
  uint32_t file_type = uint32_t(model->get_uint_or("general.file_type", 0));
  if (o.type == "same") {
    for (const gguf::TensorInfo& t : tensors) types.push_back(t.type);
  } else {
    const TypePlan plan = plan_types(*model, "--type", o.type, true);
    types = plan.types;
    file_type = plan.file_type;
  }
  HostLoras loras;
  for (size_t i = 0; i < o.adapters.size(); ++i) {
    const double scale = o.scales.empty() ? 1.0 : o.scales[i];
    if (fs::is_directory(o.adapters[i], ec))
      read_run_adapters(o.adapters[i], scale, *model, loras);
    else if (fs::is_regular_file(o.adapters[i], ec))
      read_adapter_file(o.adapters[i], scale, *model, loras);
    else
      throw std::invalid_argument("--adapter: '" + o.adapters[i] + "' does not exist");
  }

  for (size_t i = 0; i < tensors.size(); ++i) {
    const bool converted = loras.count(tensors[i].name) > 0 || types[i] != tensors[i].type;
    if (converted && types[i] != GgmlType::F32 && !find_format(uint32_t(types[i])))
      throw std::invalid_argument("merge: '" + tensors[i].name + "' would be written as " + gguf::type_name(types[i]) +
                                  ", which q4tune cannot write: choose --type");
  }

  gguf::Writer w;
  for (const auto& [key, value] : model->metadata())
    if (key != "general.alignment") w.set(key, value);
  if (model->alignment() != 32) w.set("general.alignment", gguf::Value::u32(uint32_t(model->alignment())));
  const gguf::Value* name = model->find("general.name");
  const std::string base_name = name && name->type == gguf::ValueType::STRING ? std::get<std::string>(name->v) : "";
  w.set("general.name", gguf::Value::str(base_name.empty() ? "merged LoRA" : base_name + " + LoRA"));
  if (o.type != "same") w.set("general.file_type", gguf::Value::u32(file_type));
  std::vector<gguf::Value> from, scales;
  for (size_t i = 0; i < o.adapters.size(); ++i) {
    from.push_back(gguf::Value::str(fs::path(o.adapters[i]).filename().string()));
    scales.push_back(gguf::Value::f32(float(o.scales.empty() ? 1.0 : o.scales[i])));
  }
  w.set("q4tune.merge.adapters", gguf::Value::array(gguf::ValueType::STRING, from));
  w.set("q4tune.merge.adapter_scales", gguf::Value::array(gguf::ValueType::F32, scales));

  int64_t merged = 0, converted = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const gguf::TensorInfo* t = &tensors[i];
    const GgmlType type = types[i];
    const auto range = loras.equal_range(t->name);
    if (range.first == range.second && type == t->type) {
      w.add_tensor(t->name, t->ne, t->type, [t] { return std::vector<uint8_t>(t->data, t->data + t->bytes); });
      continue;
    }
    range.first == range.second ? ++converted : ++merged;
    std::vector<const HostLora*> mine;
    for (auto it = range.first; it != range.second; ++it) mine.push_back(&it->second);
    w.add_tensor(t->name, t->ne, type, [t, type, mine] {
      std::vector<float> v = tensor_floats(*t);
      const int64_t n_in = t->cols(), n_out = t->rows();
      Eigen::Map<RowMajor> W(v.data(), n_out, n_in);
      for (const HostLora* l : mine) {
        const Eigen::Map<const RowMajor> A(l->a.data(), l->r, n_in), B(l->b.data(), n_out, l->r);
        W.noalias() += (float(l->scale) * B) * A;
      }
      return encode(v, type, n_out, n_in, type == t->type ? t->data : nullptr);
    });
  }
  w.write(o.out);
  out << "wrote " << o.out << ": " << train::plural(merged, "adapted weight") << " merged from "
      << train::plural(int64_t(o.adapters.size()), "adapter") << " ("
      << (o.type == "same" ? std::string("each in its own type") : "as " + o.type) << ")";
  if (converted > 0) out << ", " << train::plural(converted, "other tensor") << " converted";
  out << ", " << train::plural(int64_t(tensors.size()) - merged - converted, "tensor") << " copied\n";
  return 0;
}

Command add_merge(CLI::App& app) {
  auto o = std::make_shared<MergeOptions>();
  auto* cmd = app.add_subcommand("merge",
                                 "Fold LoRA adapters into their base model and write one GGUF that llama.cpp runs as "
                                 "it is: W' = dequant(W) + scale·B·A for each adapted weight, quantized again");
  cmd->add_option("-m,--model", o->model, "the base GGUF model")->required();
  cmd->add_option("--adapter,--lora", o->adapters,
                  "a GGUF LoRA adapter, a training run's --out directory (its newest complete checkpoint) or a "
                  "checkpoint; give it again to merge several")
      ->required()
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cmd->add_option("--adapter-scale", o->scales, "the scale of each adapter, in the order of --adapter (default 1)")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cmd->add_option("-o,--out", o->out, "the merged GGUF (written whole or not at all)")->required();
  cmd->add_option("--type", o->type,
                  "same (each tensor keeps its type), or a llama-quantize file type or format for every matrix: " +
                      std::string("f32, f16, bf16, q4_k_m, q8_0, ... (as quantize --type)"))
      ->capture_default_str();
  set_examples(cmd, "  q4tune merge -m model-q4_k_m.gguf --lora my-run/adapter.gguf -o merged-q4_k_m.gguf\n"
                    "  q4tune merge -m model.gguf --lora my-run --type f16 -o merged-f16.gguf    (the run's newest checkpoint)");
  return {cmd, [o] { return run_merge(*o, std::cout); }};
}

}  // namespace q4t
