#include "train/export.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>

#include "data/atomic_file.h"
#include "data/safetensors.h"

namespace q4t {

namespace {

namespace fs = std::filesystem;

// Both directions of the converter's permutation: perm[gguf_row] = hf_row.
std::vector<int64_t> gguf_to_hf_row(int64_t rows, int64_t n_head) {
  if (n_head <= 0 || rows % n_head != 0 || (rows / n_head) % 2 != 0)
    throw std::invalid_argument("rope permutation: " + std::to_string(rows) + " rows do not split into " +
                                std::to_string(n_head) + " heads of an even size");
  const int64_t hd = rows / n_head, half = hd / 2;
  std::vector<int64_t> perm(static_cast<size_t>(rows));
  for (int64_t h = 0; h < n_head; ++h)
    for (int64_t j = 0; j < half; ++j)
      for (int64_t s = 0; s < 2; ++s) perm[size_t(h * hd + 2 * j + s)] = h * hd + s * half + j;
  return perm;
}

int64_t checked_rows(const std::vector<float>& m, int64_t cols) {
  if (cols <= 0 || m.size() % size_t(cols) != 0)
    throw std::invalid_argument("rope permutation: " + std::to_string(m.size()) + " values are not rows of " +
                                std::to_string(cols));
  return int64_t(m.size()) / cols;
}

// One adapter as host matrices: a [r, n_in] and b [n_out, r], row-major.
struct HostAdapter {
  int64_t layer = 0;
  std::string target;  // q, k, v, o, gate, up, down (qkv, gate_up where fused)
  int64_t r = 0, n_in = 0, n_out = 0;
  double scale = 0;
  std::vector<float> a, b;
};

std::vector<float> to_floats(const std::vector<double>& v) { return std::vector<float>(v.begin(), v.end()); }

// Every adapter of mg, in layer then target order; an adapter on anything but the seven targets is an error.
std::vector<HostAdapter> host_adapters(const model::ModelGraph& mg) {
  const auto& adapters = mg.adapters();
  if (adapters.empty()) throw std::invalid_argument("export: the model has no adapters");
  const ag::Backend& be = mg.graph().backend();
  std::vector<HostAdapter> out;
  const std::vector<std::string> targets = model::lora_targets(mg.model().config());
  for (int64_t l = 0; l < mg.model().config().n_layer; ++l)
    for (const std::string& t : targets) {
      auto it = adapters.find(model::target_tensor_name(l, t));
      if (it == adapters.end()) continue;
      const ag::LoraLinear& lin = it->second;
      if (lin.a.shape().size() != 2 || lin.b.shape().size() != 2 || lin.b.shape()[1] != lin.a.shape()[0])
        throw std::invalid_argument("export: adapter '" + it->first + "' has inconsistent A and B shapes");
      HostAdapter h{l, t, lin.a.shape()[0], lin.a.shape()[1], lin.b.shape()[0], lin.scale, {}, {}};
      h.a = to_floats(be.to_host(lin.a.value()));
      h.b = to_floats(be.to_host(lin.b.value()));
      out.push_back(std::move(h));
    }
  if (out.size() != adapters.size())
    throw std::invalid_argument("export: an adapter is on a tensor that is none of the model's LoRA targets");
  return out;
}

// Multiplies b by want_scale / file_scale unless they agree (then b is left bit-exact).
void fold_scale(std::vector<float>& b, double want_scale, double file_scale) {
  const double ratio = want_scale / file_scale;
  if (std::abs(ratio - 1.0) <= 1e-12) return;
  for (float& x : b) x = float(double(x) * ratio);
}

std::vector<uint8_t> f32_bytes(const std::vector<float>& v) {
  std::vector<uint8_t> bytes(v.size() * sizeof(float));
  if (!v.empty()) std::memcpy(bytes.data(), v.data(), bytes.size());
  return bytes;
}

const std::map<std::string, std::string>& hf_module() {
  static const std::map<std::string, std::string> m = {
      {"q", "self_attn.q_proj"}, {"k", "self_attn.k_proj"}, {"v", "self_attn.v_proj"}, {"o", "self_attn.o_proj"},
      {"gate", "mlp.gate_proj"}, {"up", "mlp.up_proj"}, {"down", "mlp.down_proj"},
      {"qkv", "self_attn.qkv_proj"}, {"gate_up", "mlp.gate_up_proj"}};
  return m;
}

}  // namespace

std::vector<float> rope_permute_rows(const std::vector<float>& hf, int64_t n_head, int64_t cols) {
  const std::vector<int64_t> perm = gguf_to_hf_row(checked_rows(hf, cols), n_head);
  std::vector<float> out(hf.size());
  for (size_t g = 0; g < perm.size(); ++g)
    std::copy_n(hf.begin() + perm[g] * cols, cols, out.begin() + int64_t(g) * cols);
  return out;
}

std::vector<float> rope_unpermute_rows(const std::vector<float>& gguf_rows, int64_t n_head, int64_t cols) {
  const std::vector<int64_t> perm = gguf_to_hf_row(checked_rows(gguf_rows, cols), n_head);
  std::vector<float> out(gguf_rows.size());
  for (size_t g = 0; g < perm.size(); ++g)
    std::copy_n(gguf_rows.begin() + int64_t(g) * cols, cols, out.begin() + perm[g] * cols);
  return out;
}

void export_gguf_adapter(const model::ModelGraph& mg, double alpha, const std::string& path,
                         const std::string& chat_template) {
  const float alpha_f32 = float(alpha);
  if (!(alpha_f32 > 0) || !std::isfinite(alpha_f32))
    throw std::invalid_argument("export: LoRA alpha " + std::to_string(alpha) + " must be positive and finite");
  gguf::Writer w;
  w.set("general.type", gguf::Value::str("adapter"));
  w.set("general.architecture", gguf::Value::str(mg.model().config().arch));
  w.set("adapter.type", gguf::Value::str("lora"));
  w.set("adapter.lora.alpha", gguf::Value::f32(alpha_f32));
  if (!chat_template.empty()) w.set(kAdapterChatTemplateKey, gguf::Value::str(chat_template));
  for (HostAdapter& h : host_adapters(mg)) {
    fold_scale(h.b, h.scale, double(alpha_f32) / double(h.r));
    const std::string base = model::target_tensor_name(h.layer, h.target);
    w.add_tensor(base + ".lora_a", {h.n_in, h.r}, gguf::GgmlType::F32, f32_bytes(h.a));
    w.add_tensor(base + ".lora_b", {h.r, h.n_out}, gguf::GgmlType::F32, f32_bytes(h.b));
  }
  w.write(path);
}

std::string base_model_name(const gguf::File& model) {
  auto str = [&](const char* key) {
    const gguf::Value* v = model.find(key);
    return v && v->type == gguf::ValueType::STRING ? std::get<std::string>(v->v) : std::string();
  };
  // "https://huggingface.co/org/name" (or the id itself, for the repository key) → "org/name".
  auto hf_id = [](std::string s) {
    for (const char* prefix : {"https://huggingface.co/", "http://huggingface.co/", "huggingface.co/", "hf://"})
      if (s.rfind(prefix, 0) == 0) {
        s = s.substr(std::string(prefix).size());
        while (!s.empty() && s.back() == '/') s.pop_back();
        return std::count(s.begin(), s.end(), '/') == 1 ? s : std::string();
      }
    return std::string();
  };
  const std::string repo = str("general.source.huggingface.repository");
  if (std::count(repo.begin(), repo.end(), '/') == 1 && repo.find(':') == std::string::npos) return repo;
  for (const char* key : {"general.source.repo_url", "general.source.url", "general.base_model.0.repo_url"}) {
    const std::string id = hf_id(str(key));
    if (!id.empty()) return id;
  }
  const std::string name = str("general.name");
  return name.empty() ? model.path() : name;
}

void export_peft(const model::ModelGraph& mg, const ExportInfo& info, const std::string& dir) {
  const model::ModelConfig& cfg = mg.model().config();
  if (!(info.alpha > 0) || !std::isfinite(info.alpha))
    throw std::invalid_argument("export: LoRA alpha " + std::to_string(info.alpha) + " must be positive and finite");
  std::vector<HostAdapter> adapters = host_adapters(mg);
  const int64_t r = adapters.front().r;
  const double peft_scale = info.rslora ? info.alpha / std::sqrt(double(r)) : info.alpha / double(r);
  const bool permuted = cfg.arch == "llama";  // llama.cpp's converter permutes llama's q/k rows only

  safetensors::Writer st;
  st.set_metadata("format", "pt");
  std::set<std::string> targets;
  std::set<int64_t> layers;
  for (HostAdapter& h : adapters) {
    const std::string base = model::target_tensor_name(h.layer, h.target);
    if (h.r != r)
      throw std::invalid_argument("export: adapter '" + base + "' has rank " + std::to_string(h.r) +
                                  ", the others " + std::to_string(r) + " (PEFT export needs one rank)");
    fold_scale(h.b, h.scale, peft_scale);
    if (permuted && (h.target == "q" || h.target == "k"))
      h.b = rope_unpermute_rows(h.b, h.target == "q" ? cfg.n_head : cfg.n_head_kv, r);
    const std::string key = "base_model.model.model.layers." + std::to_string(h.layer) + "." + hf_module().at(h.target);
    st.add_f32(key + ".lora_A.weight", {r, h.n_in}, h.a);
    st.add_f32(key + ".lora_B.weight", {h.n_out, r}, h.b);
    targets.insert(h.target);
    layers.insert(h.layer);
  }

  nlohmann::json target_modules = nlohmann::json::array();
  for (const std::string& t : model::lora_targets(cfg))
    if (targets.count(t)) {
      const std::string& m = hf_module().at(t);
      target_modules.push_back(m.substr(m.find('.') + 1));
    }
  nlohmann::json config = {
      {"peft_type", "LORA"},           {"task_type", "CAUSAL_LM"},
      {"r", r},                        {"lora_alpha", info.alpha},
      {"target_modules", target_modules}, {"bias", "none"},
      {"use_rslora", info.rslora},     {"fan_in_fan_out", false},
      {"lora_dropout", info.dropout},  {"base_model_name_or_path", info.base_model},
      {"inference_mode", true},        {"modules_to_save", nullptr},
  };
  // Only some layers adapted: say which, so PEFT does not add (zero) adapters to the others.
  if (int64_t(layers.size()) != cfg.n_layer) config["layers_to_transform"] = std::vector<int64_t>(layers.begin(), layers.end());

  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw std::runtime_error("cannot create directory " + dir + ": " + ec.message());
  st.write((fs::path(dir) / "adapter_model.safetensors").string());
  write_file_atomic((fs::path(dir) / "adapter_config.json").string(), config.dump(2) + "\n");
}

}  // namespace q4t
