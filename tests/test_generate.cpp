// Text generation: the KV-cache decoder against the full-sequence forward (llama and qwen2, tied and untied, with
// adapters, on the CPU and on a Vulkan device), the decode ops against the ops they stand in for, sampling, and
// the generate loop (greedy, top-k, seeds, streaming, errors).
#include <gtest/gtest.h>

#include <functional>
#include <algorithm>
#include <filesystem>
#include <map>
#include <sstream>

#include "autograd/gradcheck.h"
#include "train/commands.h"
#include "train/device_choice.h"
#include "train/export.h"
#include "train/generate.h"
#include "train/model/decoder.h"
#include "scratch_dir.h"

namespace q4t {
namespace {

namespace fs = std::filesystem;
using model::AdapterSet;
using model::Decoder;
using model::Model;
using model::ModelGraph;

std::string temp_dir() { return test::process_scratch_dir("q4t_test_generate_"); }

// Two layers, 4 query heads over 2 kv heads of dim 16, init-model's byte vocabulary, 96 positions. The gemmas'
// first layer is local with a window of 5 (shorter than the sequences below), gemma2's caps bend the scores.
std::string tiny_model(const std::string& arch, bool tied) {
  const std::string path = temp_dir() + "/" + arch + (tied ? "_tied" : "") + ".gguf";
  if (!fs::exists(path)) {
    InitModelOptions o;
    o.arch = arch;
    o.tied = tied;
    o.out = path;
    o.dim = 64, o.layers = 2, o.heads = 4, o.kv_heads = 2, o.ff = 128, o.ctx = 96;
    o.sliding_window = 5, o.swa_pattern = 2, o.attn_softcap = 2, o.final_softcap = 3;
    std::ostringstream sink;
    run_init_model(o, sink);
  }
  return path;
}

struct Devices {
  std::unique_ptr<vk::Device> device = vk::Device::open({-1, /*validation=*/true});
  std::unique_ptr<ag::Backend> cpu = ag::Backend::cpu(ag::DType::F32);
  std::unique_ptr<ag::Backend> vulkan = ag::Backend::vulkan(*device);
  ag::Backend& get(bool use_vulkan) { return use_vulkan ? *vulkan : *cpu; }
};
Devices& devices() {
  static Devices d;
  return d;
}

std::vector<float> uniform(std::mt19937& rng, int64_t n, double lo, double hi) {
  std::uniform_real_distribution<float> u{float(lo), float(hi)};
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = u(rng);
  return v;
}

// Random rank-3 adapters (B non-zero, so they change the logits) on every target of every layer.
AdapterSet random_adapters(const Model& m, uint32_t seed) {
  std::mt19937 rng(seed);
  AdapterSet out;
  for (int64_t l = 0; l < m.config().n_layer; ++l)
    for (const std::string& t : model::lora_targets(m.config())) {
      const std::string name = model::target_tensor_name(l, t);
      const ag::Shape& ws = m.weight(name).shape();
      ag::Backend& be = m.backend();
      out[name] = {be.from_host(uniform(rng, 3 * ws[1], -0.3, 0.3), {3, ws[1]}),
                   be.from_host(uniform(rng, ws[0] * 3, -0.3, 0.3), {ws[0], 3}), 0.5};
    }
  return out;
}

// ModelGraph::logits [T, V] of the whole sequence, with the same adapters.
std::vector<double> full_logits(const Model& m, const AdapterSet& adapters, const std::vector<int32_t>& ids) {
  ag::Graph g(m.backend());
  ModelGraph mg(m, g);
  for (const auto& [name, w] : adapters)
    mg.set_adapter(name, ag::LoraLinear(mg.weight(name), g.constant(w.a), g.constant(w.b), w.scale));
  ag::Var out = mg.logits(g.constant(m.backend().from_host_i32(ids, {int64_t(ids.size())}), "ids"));
  g.forward();
  return m.backend().to_host(out.value());
}

// max |got - want[row]| / max |want[row]| for one row of a [T, V] matrix.
double row_error(const std::vector<float>& got, const std::vector<double>& want, int64_t row) {
  const size_t V = got.size();
  double num = 0, den = 0;
  for (size_t i = 0; i < V; ++i) {
    num = std::max(num, std::abs(double(got[i]) - want[size_t(row) * V + i]));
    den = std::max(den, std::abs(want[size_t(row) * V + i]));
  }
  return num / den;
}

std::vector<int32_t> random_ids(std::mt19937& rng, size_t n, int32_t V) {
  std::uniform_int_distribution<int32_t> u(0, V - 1);
  std::vector<int32_t> ids(n);
  for (int32_t& id : ids) id = u(rng);
  return ids;
}

void expect_no_validation_messages() {
  const auto msgs = devices().device->validation_messages();
  EXPECT_TRUE(msgs.empty()) << "validation: " << (msgs.empty() ? "" : msgs.back());
}

// --- the decoder against the full-sequence forward ----------------------------------------------------------

struct DecoderCase {
  std::string arch;
  bool tied, vulkan, adapters;
};

class DecoderLogits : public ::testing::TestWithParam<DecoderCase> {};

// A prompt of 11 tokens in chunks of 4, 4, 2 and 1 (prefill_chunk 4), then 5 single-token steps: every step's
// logits equal the full forward's row at the same position.
TEST_P(DecoderLogits, PrefillAndEachDecodeStepMatchTheFullSequence) {
  const DecoderCase& p = GetParam();
  auto m = Model::load(tiny_model(p.arch, p.tied), devices().get(p.vulkan));
  const AdapterSet adapters = p.adapters ? random_adapters(*m, 5) : AdapterSet{};
  std::mt19937 rng(11);
  const std::vector<int32_t> ids = random_ids(rng, 16, int32_t(m->config().n_vocab));
  const size_t n_prompt = 11;
  const std::vector<double> want = full_logits(*m, adapters, ids);

  Decoder dec(*m, adapters, 0, 4);
  EXPECT_EQ(dec.max_context(), 96);
  std::vector<float> got = dec.feed(std::span(ids).first(n_prompt));
  EXPECT_LE(row_error(got, want, int64_t(n_prompt) - 1), 1e-4) << "after the prompt";
  for (size_t t = n_prompt; t < ids.size(); ++t) {
    got = dec.feed(std::span(ids).subspan(t, 1));
    EXPECT_EQ(dec.position(), int64_t(t) + 1);
    EXPECT_LE(row_error(got, want, int64_t(t)), 1e-4) << "position " << t;
  }
  // A reset decoder starts over: the same prompt again gives the same logits.
  dec.reset();
  got = dec.feed(std::span(ids).first(n_prompt));
  EXPECT_LE(row_error(got, want, int64_t(n_prompt) - 1), 1e-4) << "after reset";
  if (p.vulkan) expect_no_validation_messages();
}

std::string decoder_case_name(const ::testing::TestParamInfo<DecoderCase>& info) {
  const DecoderCase& c = info.param;
  return c.arch + (c.tied ? "_tied" : "") + (c.vulkan ? "_vulkan" : "_cpu") + (c.adapters ? "_adapters" : "");
}

INSTANTIATE_TEST_SUITE_P(
    Models, DecoderLogits,
    ::testing::Values(DecoderCase{"llama", false, false, false}, DecoderCase{"llama", false, false, true},
                      DecoderCase{"llama", true, false, true}, DecoderCase{"qwen2", false, false, true},
                      DecoderCase{"qwen2", true, false, false}, DecoderCase{"llama", false, true, true},
                      DecoderCase{"llama", true, true, false}, DecoderCase{"qwen2", false, true, true},
                      DecoderCase{"qwen2", true, true, true}, DecoderCase{"qwen3", false, false, true},
                      DecoderCase{"qwen3", true, true, true}, DecoderCase{"gemma2", true, false, true},
                      DecoderCase{"gemma2", true, true, true}, DecoderCase{"gemma3", false, false, true},
                      DecoderCase{"gemma3", true, true, false}, DecoderCase{"phi3", false, false, true},
                      DecoderCase{"phi3", true, true, true}),
    decoder_case_name);

// 70 cached keys: the Vulkan kernel's online softmax runs over more than one block of 64 keys.
TEST(DecoderLogitsLong, AContextPastOneKeyBlockMatchesTheFullSequenceOnVulkan) {
  auto m = Model::load(tiny_model("qwen2", false), *devices().vulkan);
  const AdapterSet adapters = random_adapters(*m, 6);
  std::mt19937 rng(12);
  const std::vector<int32_t> ids = random_ids(rng, 72, int32_t(m->config().n_vocab));
  const std::vector<double> want = full_logits(*m, adapters, ids);
  Decoder dec(*m, adapters, 80, 32);
  EXPECT_LE(row_error(dec.feed(std::span(ids).first(70)), want, 69), 1e-4);
  EXPECT_LE(row_error(dec.feed(std::span(ids).subspan(70, 1)), want, 70), 1e-4);
  EXPECT_LE(row_error(dec.feed(std::span(ids).subspan(71, 1)), want, 71), 1e-4);
  expect_no_validation_messages();
}

// The trainer builds a decoder once from its ModelGraph; later optimizer steps write into the same tensors.
TEST(DecoderAdapters, ADecoderSeesLaterUpdatesOfTheTrainersAdapters) {
  for (bool vulkan : {false, true}) {
    ag::Backend& be = devices().get(vulkan);
    auto m = Model::load(tiny_model("llama", false), be);
    ag::Graph g(be);
    ModelGraph mg(*m, g);
    model::LoraSpec spec;
    spec.cfg.rank = 2;
    spec.cfg.dropout = 0.5;  // training-time only: the decoder never drops
    std::mt19937 rng(3);
    mg.add_adapters(spec, rng);
    const AdapterSet shared = model::adapter_weights(mg);
    ASSERT_EQ(shared.size(), 14u);
    Decoder dec(*m, shared, 32);
    const std::vector<int32_t> ids = {1, 72, 101, 108, 108};
    const std::vector<double> before = full_logits(*m, shared, ids);

    // An "optimizer step": B of one adapter becomes non-zero.
    const std::string name = "blk.1.ffn_down.weight";
    ag::Tensor b = mg.adapters().at(name).b.value();
    be.upload(b, uniform(rng, b.numel(), -1, 1));
    const std::vector<double> after = full_logits(*m, shared, ids);
    const std::vector<float> got = dec.feed(ids);
    EXPECT_LE(row_error(got, after, 4), 1e-4) << (vulkan ? "vulkan" : "cpu");
    EXPECT_GT(row_error(got, before, 4), 1e-3) << "the update changed nothing: the test proves nothing";
  }
}

// `--adapter FILE`: the adapters of a GGUF LoRA, read with ModelGraph::load_adapters's checks and scale.
TEST(DecoderAdapters, AGgufLoraFileGivesTheLogitsOfModelGraphLoadAdapters) {
  auto m = Model::load(tiny_model("qwen2", false), *devices().cpu);
  const std::string path = temp_dir() + "/adapter.gguf";
  {
    ag::Graph g(m->backend());
    ModelGraph mg(*m, g);
    for (const auto& [name, w] : random_adapters(*m, 9))
      mg.set_adapter(name, ag::LoraLinear(mg.weight(name), g.constant(w.a), g.constant(w.b), 8.0 / 3));
    export_gguf_adapter(mg, 8.0, path);
  }
  const auto file = gguf::File::open(path);
  const AdapterSet loaded = model::load_adapter_weights(*m, *file, 0.75);
  ASSERT_EQ(loaded.size(), 14u);
  EXPECT_NEAR(loaded.begin()->second.scale, 0.75 * 8.0 / 3, 1e-12);

  const std::vector<int32_t> ids = {1, 84, 104, 101, 32, 99, 97, 116};
  ag::Graph g(m->backend());
  ModelGraph mg(*m, g);
  mg.load_adapters(*file, 0.75);
  ag::Var out = mg.logits(g.constant(m->backend().from_host_i32(ids, {int64_t(ids.size())})));
  g.forward();
  Decoder dec(*m, loaded, 16);
  EXPECT_LE(row_error(dec.feed(ids), m->backend().to_host(out.value()), 7), 1e-5);
}

// An adapter file with one half of a pair missing or renamed is refused naming the tensor, never applied in
// part.
TEST(DecoderAdapters, AnAdapterMissingEitherHalfOfAPairIsRefusedNamingTheTensor) {
  auto m = Model::load(tiny_model("llama", false), *devices().cpu);
  const std::string dir = temp_dir();
  const std::string path = dir + "/whole.gguf";
  {
    ag::Graph g(m->backend());
    ModelGraph mg(*m, g);
    for (const auto& [name, w] : random_adapters(*m, 3))
      mg.set_adapter(name, ag::LoraLinear(mg.weight(name), g.constant(w.a), g.constant(w.b), 2.0));
    export_gguf_adapter(mg, 8.0, path);
  }
  const auto whole = gguf::File::open(path);
  // The adapter again, with `rename` applied to the tensor names ("" drops the tensor).
  auto copy = [&](const std::string& out, const std::function<std::string(const std::string&)>& rename) {
    gguf::Writer w;
    for (const auto& [key, value] : whole->metadata()) {
      if (key != "general.alignment") w.set(key, value);
    }
    for (const gguf::TensorInfo& t : whole->tensors()) {
      const std::string name = rename(t.name);
      if (!name.empty()) w.add_tensor(name, t.ne, t.type, std::vector<uint8_t>(t.data, t.data + t.bytes));
    }
    w.write(dir + "/" + out);
    return gguf::File::open(dir + "/" + out);
  };
  const std::string a = "blk.1.attn_v.weight.lora_a", b = "blk.0.ffn_up.weight.lora_b";
  struct Case {
    std::string file, from, to, error;
  };
  const std::vector<Case> cases = {
      {"no-a.gguf", a, "", "tensor 'blk.1.attn_v.weight.lora_a' is missing (its lora_b is present)"},
      {"renamed-a.gguf", a, "blk.1.attn_v.weight.lora_x",
       "tensor 'blk.1.attn_v.weight.lora_x' is neither a .lora_a nor a .lora_b"},
      {"no-b.gguf", b, "", "tensor 'blk.0.ffn_up.weight.lora_b' is missing (its lora_a is present)"}};
  for (const Case& c : cases) {
    const auto file = copy(c.file, [&](const std::string& n) { return n == c.from ? c.to : n; });
    ag::Graph g(m->backend());
    ModelGraph mg(*m, g);
    try {
      mg.load_adapters(*file, 1.0);
      ADD_FAILURE() << c.file << " was accepted";
    } catch (const gguf::FormatError& e) {
      EXPECT_NE(std::string(e.what()).find(dir + "/" + c.file + ": " + c.error), std::string::npos) << e.what();
    }
    EXPECT_THROW(model::load_adapter_weights(*m, *file, 1.0), gguf::FormatError) << c.file;
  }
}

TEST(DecoderAdapters, AnAdapterThatDoesNotFitIsAClearError) {
  auto m = Model::load(tiny_model("llama", false), *devices().cpu);
  AdapterSet bad = random_adapters(*m, 1);
  std::swap(bad["blk.0.attn_q.weight"].a, bad["blk.0.ffn_down.weight"].a);
  try {
    Decoder dec(*m, bad);
    FAIL() << "accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("do not fit the weight"), std::string::npos) << e.what();
  }
  AdapterSet embd;
  embd["token_embd.weight"] = random_adapters(*m, 1).begin()->second;
  EXPECT_THROW(Decoder(*m, embd), std::invalid_argument);
}

// A model whose context is 2^31 tokens: the cache is sized by what is fed (it grows, keeping the cached rows),
// never by the context, and a grown cache gives the logits of one sized up front.
TEST(Decoder, TheCacheGrowsWithWhatIsFedNotWithTheModelsContext) {
  const std::string path = temp_dir() + "/long_context.gguf";
  InitModelOptions o;
  o.out = path;
  o.dim = 32, o.layers = 2, o.heads = 4, o.kv_heads = 2, o.ff = 64, o.ctx = int64_t(1) << 31;
  std::ostringstream sink;
  ASSERT_EQ(run_init_model(o, sink), 0) << sink.str();
  for (bool vulkan : {false, true}) {
    auto m = Model::load(path, devices().get(vulkan));
    Decoder grows(*m), sized(*m);
    EXPECT_EQ(grows.max_context(), int64_t(1) << 31);
    EXPECT_EQ(grows.capacity(), 256);
    sized.reserve(400);
    EXPECT_EQ(sized.capacity(), 400);
    std::mt19937 rng(5);
    std::vector<int32_t> ids(250);
    for (int32_t& id : ids) id = int32_t(rng() % 200) + 3;
    EXPECT_EQ(grows.feed(ids), sized.feed(ids)) << (vulkan ? "vulkan" : "cpu");
    for (int32_t i = 0; i < 20; ++i) {  // across the growth at 256 rows
      const int32_t id = int32_t(rng() % 200) + 3;
      ASSERT_EQ(grows.feed(std::span<const int32_t>(&id, 1)), sized.feed(std::span<const int32_t>(&id, 1)))
          << (vulkan ? "vulkan" : "cpu") << " at position " << grows.position();
    }
    EXPECT_EQ(grows.capacity(), 512);
    // generate reserves the prompt plus the tokens asked for.
    Decoder dec(*m);
    SampleOptions so;
    so.max_tokens = 300;
    generate(dec, *tok::Tokenizer::from_gguf(*gguf::File::open(path)), "hello", so);
    EXPECT_LT(dec.capacity(), 320);
    EXPECT_GT(dec.capacity(), 300);
  }
}

// --- the decode ops against the ops they stand in for ---------------------------------------------------------

// rope_at with start = s is rope with pos_offset = s; cached_attention over a cache holding k, v is attention's
// rows for the new queries.
TEST(DecodeOps, RopeAtAndCachedAttentionEqualRopeAndAttention) {
  for (bool vulkan : {false, true}) {
    ag::Backend& be = devices().get(vulkan);
    const int64_t T = 9, H = 4, Hkv = 2, D = 8, start = 6, n_new = T - start;
    std::mt19937 rng(4);
    const std::vector<float> q = uniform(rng, T * H * D, -1, 1), k = uniform(rng, T * Hkv * D, -1, 1),
                             v = uniform(rng, T * Hkv * D, -1, 1);
    ag::Graph g(be);
    ag::Var qv = g.constant(be.from_host(q, {T, H * D})), kv = g.constant(be.from_host(k, {T, Hkv * D}));
    ag::Var vv = g.constant(be.from_host(v, {T, Hkv * D}));
    ag::Var full = ag::attention(qv, kv, vv, H, Hkv);
    ag::Var roped = ag::rope(qv, H, D, ag::RopeMode::Neox, 10000.0, 5);

    // The last n_new rows of q as new queries; the caches hold all T rows of k and v.
    const std::vector<float> q_new(q.end() - n_new * H * D, q.end());
    ag::Var start_v = g.constant(be.from_host_i32(std::vector<int32_t>{int32_t(start)}, {1}));
    ag::Var cached = ag::cached_attention(g.constant(be.from_host(q_new, {n_new, H * D})), kv, vv, start_v, H, Hkv);
    ag::Var five = g.constant(be.from_host_i32(std::vector<int32_t>{5}, {1}));
    ag::Var roped_at = ag::rope_at(qv, five, H, D, ag::RopeMode::Neox, 10000.0);
    g.forward();

    const std::vector<double> a = be.to_host(full.value()), c = be.to_host(cached.value());
    double worst = 0;
    for (size_t i = 0; i < c.size(); ++i) worst = std::max(worst, std::abs(c[i] - a[size_t(start * H * D) + i]));
    EXPECT_LE(worst, 1e-6) << (vulkan ? "vulkan" : "cpu");
    EXPECT_EQ(be.to_host(roped_at.value()), be.to_host(roped.value())) << (vulkan ? "vulkan" : "cpu");
  }
}

TEST(DecodeOps, ACacheWriteLandsAtStartAndAPositionPastTheCacheThrowsOnTheCpu) {
  ag::Backend& be = *devices().cpu;
  ag::Graph g(be);
  ag::Tensor cache = be.zeros({4, 2}, ag::DType::F32), start = be.from_host_i32(std::vector<int32_t>{1}, {1});
  ag::Var out = ag::kv_cache_write(g.constant(cache), g.constant(be.from_host(std::vector<float>{1, 2, 3, 4}, {2, 2})),
                                   g.constant(start));
  g.forward();
  EXPECT_EQ(be.to_host(cache), (std::vector<double>{0, 0, 1, 2, 3, 4, 0, 0}));
  EXPECT_EQ(be.to_host(out.value()), be.to_host(cache)) << "the output is the cache";
  be.upload_i32(start, std::vector<int32_t>{3});
  EXPECT_THROW(g.forward(), std::out_of_range);
}

TEST(DecodeOps, InferenceOnlyOpsRefuseInputsThatNeedAGradient) {
  ag::Backend& be = *devices().cpu;
  ag::Graph g(be);
  ag::Var cache = g.constant(be.zeros({4, 8}, ag::DType::F32));
  ag::Var x = g.param(be.zeros({1, 8}, ag::DType::F32), "x");
  ag::Var start = g.constant(be.zeros({1}, ag::DType::I32));
  try {
    ag::kv_cache_write(cache, x, start);
    FAIL() << "accepted a parameter";
  } catch (const ag::GraphError& e) {
    EXPECT_NE(std::string(e.what()).find("kv_cache_write is for inference"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ag::cached_attention(x, cache, cache, start, 2, 1), ag::GraphError);
  EXPECT_THROW(ag::kv_cache_write(cache, g.constant(be.zeros({5, 8}, ag::DType::F32)), start), ag::GraphError);
  EXPECT_THROW(ag::rope_at(cache, g.constant(be.zeros({2}, ag::DType::I32)), 2, 4, ag::RopeMode::Norm, 1e4),
               ag::GraphError);
}

// --- sampling ----------------------------------------------------------------------------------------------

std::map<int32_t, int> draw(const std::vector<float>& logits, const SampleOptions& o, int n) {
  std::mt19937_64 rng(o.seed);
  std::map<int32_t, int> counts;
  for (int i = 0; i < n; ++i) ++counts[sample_token(logits, o, rng)];
  return counts;
}

TEST(Sampling, GreedyTakesTheHighestLogitAndTheLowestIdOfATie) {
  SampleOptions o;
  o.temperature = 0;
  std::mt19937_64 rng(1);
  EXPECT_EQ(sample_token(std::vector<float>{0.5f, 2.0f, -1.0f, 2.0f}, o, rng), 1);
  o.temperature = 1, o.top_k = 1;
  EXPECT_EQ(sample_token(std::vector<float>{0.5f, 2.0f, -1.0f, 2.0f}, o, rng), 1);
}

TEST(Sampling, TopKAndTopPKeepOnlyTheirCandidatesAtTheirProbabilities) {
  const std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.15f), std::log(0.05f)};
  SampleOptions o;
  o.temperature = 1, o.top_k = 0, o.top_p = 1;
  const int n = 40000;
  auto c = draw(logits, o, n);
  EXPECT_NEAR(c[0] / double(n), 0.5, 0.01);
  EXPECT_NEAR(c[3] / double(n), 0.05, 0.005);
  o.top_k = 2;  // 0.5 and 0.3, renormalised
  c = draw(logits, o, n);
  EXPECT_EQ(c.size(), 2u);
  EXPECT_NEAR(c[0] / double(n), 0.625, 0.01);
  o.top_k = 0, o.top_p = 0.85;  // 0.5 + 0.3 < 0.85 <= 0.5 + 0.3 + 0.15
  c = draw(logits, o, n);
  EXPECT_EQ(c.size(), 3u);
  EXPECT_NEAR(c[2] / double(n), 0.15 / 0.95, 0.01);
  o.top_p = 0.5;  // the first token alone reaches it
  EXPECT_EQ(draw(logits, o, 100).size(), 1u);
  o.top_p = 1, o.temperature = 0.5;  // p ∝ p^2: 0.25, 0.09, ...
  c = draw(logits, o, n);
  EXPECT_NEAR(c[0] / double(n), 0.25 / (0.25 + 0.09 + 0.0225 + 0.0025), 0.01);
}

TEST(Sampling, OptionsOutOfRangeNameTheFlag) {
  SampleOptions o;
  o.top_p = 0;
  EXPECT_THROW(check_sample_options(o), std::invalid_argument);
  o = {};
  o.temperature = -1;
  try {
    check_sample_options(o);
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("--temperature"), std::string::npos);
  }
}

TEST(Streaming, AnUnfinishedCharacterIsHeldBack) {
  EXPECT_EQ(complete_utf8_prefix("abc"), 3u);
  EXPECT_EQ(complete_utf8_prefix("a\xC3"), 1u);
  EXPECT_EQ(complete_utf8_prefix("a\xC3\xA9"), 3u);
  EXPECT_EQ(complete_utf8_prefix("\xE2\x82"), 0u);
  EXPECT_EQ(complete_utf8_prefix("x\xE2\x82\xAC"), 4u);
  EXPECT_EQ(complete_utf8_prefix("\xF0\x9F\x98"), 0u);
  EXPECT_EQ(complete_utf8_prefix("\xF0\x9F\x98\x80"), 4u);
  EXPECT_EQ(complete_utf8_prefix("\x80\x80"), 2u) << "stray continuation bytes are not waited for";
  EXPECT_EQ(complete_utf8_prefix(""), 0u);
}

// --- the generate loop -------------------------------------------------------------------------------------

struct Loaded {
  std::unique_ptr<Model> m;
  std::unique_ptr<tok::Tokenizer> tok;
};
Loaded load(const std::string& arch, ag::Backend& be) {
  const std::string path = tiny_model(arch, false);
  return {Model::load(path, be), tok::Tokenizer::from_gguf(*gguf::File::open(path))};
}

SampleOptions greedy(int64_t n) {
  SampleOptions o;
  o.temperature = 0, o.max_tokens = n, o.stop_at_eos = false;
  return o;
}

TEST(Generate, GreedyEqualsTheArgmaxOfTheFullSequenceRecomputedAtEveryStep) {
  for (bool vulkan : {false, true}) {
    auto [m, tok] = load("llama", devices().get(vulkan));
    const AdapterSet adapters = random_adapters(*m, 8);
    Decoder dec(*m, adapters, 0, 8);
    const Generation gen = generate(dec, *tok, "Hello, world", greedy(10));
    ASSERT_EQ(gen.ids.size(), 10u);
    EXPECT_EQ(gen.prompt_ids.front(), tok->bos());
    EXPECT_EQ(gen.prompt_ids.size(), 1 + tok->encode("Hello, world").size());
    std::vector<int32_t> seq = gen.prompt_ids;
    const size_t V = size_t(m->config().n_vocab);
    for (int32_t id : gen.ids) {
      const std::vector<double> logits = full_logits(*m, adapters, seq);
      const auto last = logits.begin() + long((seq.size() - 1) * V);
      EXPECT_EQ(id, int32_t(std::max_element(last, last + long(V)) - last)) << "after " << seq.size() << " tokens";
      seq.push_back(id);
    }
    EXPECT_EQ(gen.text, tok->decode(gen.ids));
  }
}

TEST(Generate, TopKOneIsGreedyAndTheSameSeedGivesTheSameText) {
  auto [m, tok] = load("qwen2", *devices().cpu);
  Decoder dec(*m, random_adapters(*m, 2));
  const Generation g0 = generate(dec, *tok, "abc", greedy(12));
  SampleOptions k1 = greedy(12);
  k1.temperature = 1.3, k1.top_k = 1, k1.top_p = 1;
  EXPECT_EQ(generate(dec, *tok, "abc", k1).ids, g0.ids);

  SampleOptions s;
  s.temperature = 1.0, s.top_k = 0, s.top_p = 0.95, s.max_tokens = 12, s.stop_at_eos = false, s.seed = 7;
  const Generation a = generate(dec, *tok, "abc", s), b = generate(dec, *tok, "abc", s);
  EXPECT_EQ(a.ids, b.ids);
  EXPECT_EQ(a.text, b.text);
  bool another_seed_differs = false;
  for (uint64_t seed : {8, 9, 10}) {
    s.seed = seed;
    another_seed_differs = another_seed_differs || generate(dec, *tok, "abc", s).ids != a.ids;
  }
  EXPECT_TRUE(another_seed_differs) << "the seed changes nothing";
}

// Records each write to the stream separately.
struct ChunkBuf : std::streambuf {
  std::vector<std::string> chunks;
  std::streamsize xsputn(const char* s, std::streamsize n) override {
    chunks.emplace_back(s, size_t(n));
    return n;
  }
  int overflow(int c) override {
    if (c != traits_type::eof()) chunks.emplace_back(1, char(c));
    return c;
  }
};

// The [begin, end) byte ranges of the well-formed multi-byte UTF-8 characters of s (stray or truncated bytes
// are not characters: nothing can be split there).
std::vector<std::pair<size_t, size_t>> multibyte_characters(const std::string& s) {
  std::vector<std::pair<size_t, size_t>> out;
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t len = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 1;
    size_t n = 1;
    while (n < len && i + n < s.size() && (static_cast<unsigned char>(s[i + n]) & 0xC0) == 0x80) ++n;
    if (len > 1 && n == len) out.push_back({i, i + len});
    i += n == len ? len : 1;
  }
  return out;
}

// A random model emits random bytes: some multi-byte characters come in several byte tokens, and many lead
// bytes never complete. No write may end inside a character; a lead byte that cannot complete goes out.
TEST(Generate, StreamsTheTextAsItComesWithoutSplittingACharacter) {
  auto [m, tok] = load("llama", *devices().cpu);
  Decoder dec(*m);
  SampleOptions s;
  s.temperature = 1.0, s.top_k = 0, s.top_p = 1, s.max_tokens = 80, s.stop_at_eos = false;
  size_t characters = 0;
  for (uint64_t seed = 1; seed <= 10; ++seed) {
    s.seed = seed;
    ChunkBuf buf;
    std::ostream out(&buf);
    const Generation gen = generate(dec, *tok, "x", s, &out);
    std::string joined;
    for (const std::string& c : buf.chunks) joined += c;
    EXPECT_EQ(joined, gen.text);
    EXPECT_GT(buf.chunks.size(), 10u) << "streamed in pieces, not at the end";
    const auto chars = multibyte_characters(gen.text);
    characters += chars.size();
    size_t cut = 0;
    for (const std::string& c : buf.chunks) {
      cut += c.size();
      for (const auto& [b, e] : chars)
        EXPECT_FALSE(b < cut && cut < e) << "seed " << seed << ": a write ends inside bytes [" << b << ", " << e << ")";
    }
  }
  EXPECT_GE(characters, 3u) << "too few multi-byte characters: the test proves little";
}

// The model file with another EOS id (the same weights and vocabulary).
std::string with_eos(const std::string& path, int32_t eos) {
  const std::string out = temp_dir() + "/eos_" + std::to_string(eos) + ".gguf";
  auto f = gguf::File::open(path);
  gguf::Writer w;
  for (const auto& [key, value] : f->metadata())
    if (key != "general.alignment") w.set(key, value);
  w.set("tokenizer.ggml.eos_token_id", gguf::Value::u32(uint32_t(eos)));
  for (const gguf::TensorInfo& t : f->tensors())
    w.add_tensor(t.name, t.ne, t.type, std::vector<uint8_t>(t.data, t.data + t.bytes));
  w.write(out);
  return out;
}

TEST(Generate, StopsWhenTheContextIsFullAndAfterEos) {
  auto [m, tok] = load("llama", *devices().cpu);
  Decoder small(*m, {}, 8);
  const Generation full = generate(small, *tok, "ab", greedy(100));
  EXPECT_EQ(full.ids.size(), 8 - full.prompt_ids.size() + 1) << "the last position's logits give one more token";

  Decoder dec(*m);
  const Generation g = generate(dec, *tok, "ab", greedy(12));
  ASSERT_EQ(g.ids.size(), 12u);
  const int32_t eos = g.ids[5];  // stop at its first occurrence
  const size_t stop = size_t(std::find(g.ids.begin(), g.ids.end(), eos) - g.ids.begin());
  const auto tok_eos = tok::Tokenizer::from_gguf(*gguf::File::open(with_eos(tiny_model("llama", false), eos)));
  SampleOptions s = greedy(12);
  s.stop_at_eos = true;
  const Generation stopped = generate(dec, *tok_eos, "ab", s);
  EXPECT_TRUE(stopped.stopped_at_eos);
  EXPECT_EQ(stopped.ids, std::vector<int32_t>(g.ids.begin(), g.ids.begin() + long(stop) + 1));
}

TEST(Generate, APromptLongerThanTheContextIsAClearError) {
  auto [m, tok] = load("llama", *devices().cpu);
  Decoder dec(*m, {}, 8);
  const std::string prompt = "a prompt of many characters";
  const size_t n = 1 + tok->encode(prompt).size();
  try {
    generate(dec, *tok, prompt, greedy(4));
    FAIL() << "accepted";
  } catch (const std::length_error& e) {
    EXPECT_NE(std::string(e.what()).find("the prompt is " + std::to_string(n) + " tokens, more than the context of 8"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(dec.feed(std::vector<int32_t>(9, 3)), std::length_error);
  EXPECT_THROW(dec.feed(std::vector<int32_t>{int32_t(m->config().n_vocab)}), std::invalid_argument);
}

TEST(Generate, TheCommandPrintsThePromptAndItsContinuation) {
  GenerateOptions o;
  o.model = tiny_model("qwen2", false);
  o.prompt = "Once";
  o.sample = greedy(6);
  o.device = "cpu";
  std::ostringstream out;
  EXPECT_EQ(run_generate(o, out), 0);
  auto [m, tok] = load("qwen2", *devices().cpu);
  Decoder dec(*m);
  EXPECT_EQ(out.str(), "Once" + generate(dec, *tok, "Once", greedy(6)).text + "\n");
  o.seq_len = 3;
  std::ostringstream none;
  EXPECT_THROW(run_generate(o, none), std::length_error);
  EXPECT_EQ(none.str(), "") << "a prompt that does not fit fails before anything is printed";
}

}  // namespace
}  // namespace q4t
