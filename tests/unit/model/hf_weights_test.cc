// safetensors files and the HuggingFace names of dtrain's parameters: a written file reads back with its tensors and
// metadata, laid out as the format says (checked byte by byte); a malformed or cut file is refused naming the file and
// the tensor; every test model's exported config.json imports back to the same model; models no HF class describes
// are refused with the reason.
#include "dtrain/model/hf_weights.h"

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "dtrain/common/error.h"
#include "dtrain/model/hf_config.h"
#include "dtrain/model/model_spec.h"
#include "dtrain/model/safetensors.h"
#include "refusal.h"

namespace dtrain::model {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

std::string scratch(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/hf-weights-test";
  fs::create_directories(dir);
  return dir + "/" + name;
}

std::vector<std::byte> bytes_of(const std::vector<float>& v) {
  std::vector<std::byte> b(v.size() * sizeof(float));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

void write_raw(const std::string& path, const std::string& header, std::size_t data_bytes) {
  std::ofstream out(path, std::ios::binary);
  std::uint64_t n = header.size();
  out.write(reinterpret_cast<const char*>(&n), 8);  // little-endian host
  out << header << std::string(data_bytes, '\0');
}

std::string refusal(const std::string& path) {
  return dtrain::testing::input_error_of([&] { SafetensorsFile f(path); });
}

TEST(Safetensors, AWrittenFileReadsBackAsTheFormatLaysItOut) {
  const std::string path = scratch("a.safetensors");
  write_safetensors(path,
                    {{"b", "F32", {2, 3}, bytes_of({1, 2, 3, 4, 5, 6})},
                     {"a", "BF16", {2}, {std::byte{1}, std::byte{2}, std::byte{3}, std::byte{4}}}},
                    {{"format", "pt"}});
  SafetensorsFile f(path);
  ASSERT_EQ(f.tensors().size(), 2u);
  EXPECT_EQ(f.tensors()[0].name, "b");  // in data order
  EXPECT_EQ(f.tensors()[0].begin, 0u);
  EXPECT_EQ(f.tensors()[0].end, 24u);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  const SafeTensorInfo* a = f.find("a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->dtype, "BF16");
  EXPECT_EQ(a->shape, (std::vector<std::int64_t>{2}));
  EXPECT_EQ(f.bytes(*a)[3], std::byte{4});
  float back[6];
  std::memcpy(back, f.bytes(*f.find("b")).data(), sizeof(back));
  EXPECT_EQ(back[5], 6.0f);
  // The bytes themselves: u64 header length (a multiple of 8 with the padding), JSON, then the data.
  std::ifstream in(path, std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::uint64_t n = 0;
  std::memcpy(&n, all.data(), 8);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(all.size(), 8 + n + 28);
  EXPECT_THAT(all.substr(8, n), HasSubstr("\"data_offsets\":[24,28]"));
  EXPECT_FALSE(fs::exists(path + ".tmp"));
}

// Tensors given to the file piece by piece (as dtexec export streams a large one) make the same file as whole; a
// tensor given more or fewer bytes than its shape is refused naming it, and leaves nothing behind.
TEST(Safetensors, TensorsWrittenInPiecesEqualTensorsWrittenWhole) {
  const std::vector<SafeTensorData> tensors = {{"w", "F32", {3, 2}, bytes_of({1, 2, 3, 4, 5, 6})},
                                               {"b", "F32", {2}, bytes_of({7, 8})}};
  const std::string whole = scratch("whole.safetensors"), pieces = scratch("pieces.safetensors");
  write_safetensors(whole, tensors);
  write_safetensors(pieces, tensors, [&](std::size_t i, const SafeTensorsSink& sink) {
    const auto& b = tensors[i].bytes;
    for (std::size_t at = 0; at < b.size(); at += 4) sink(b.data() + at, 4);  // one float at a time
  });
  auto contents = [](const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  EXPECT_EQ(contents(pieces), contents(whole));
  const std::string short_path = scratch("short.safetensors");
  for (std::size_t given : {std::size_t{20}, std::size_t{28}}) {
    SCOPED_TRACE(given);
    const std::string message = dtrain::testing::input_error_of([&] {
      write_safetensors(short_path, tensors, [&](std::size_t i, const SafeTensorsSink& sink) {
        std::vector<std::byte> b = tensors[i].bytes;
        if (i == 0) b.resize(given);
        sink(b.data(), b.size());
      });
    });
    EXPECT_THAT(message, HasSubstr(fmt::format("tensor \"w\": {} bytes for dtype \"F32\"", given)));
    EXPECT_FALSE(fs::exists(short_path));
    EXPECT_FALSE(fs::exists(short_path + ".tmp"));
  }
}

TEST(Safetensors, MalformedFilesAreRefusedNamingFileAndTensor) {
  const std::string p = scratch("bad.safetensors");
  { std::ofstream(p) << "abc"; }
  EXPECT_THAT(refusal(p), HasSubstr("too short"));
  write_raw(p, "{}", 0);
  EXPECT_EQ(refusal(p), "");  // an empty file of tensors is a file
  {
    std::ofstream out(p, std::ios::binary);
    std::uint64_t n = 1000;
    out.write(reinterpret_cast<const char*>(&n), 8);
    out << "{}";
  }
  EXPECT_THAT(refusal(p), HasSubstr("header length 1000 does not fit"));
  write_raw(p, "{not json", 0);
  EXPECT_THAT(refusal(p), HasSubstr("not JSON"));
  write_raw(p, R"({"w": {"dtype": "F33", "shape": [1], "data_offsets": [0, 4]}})", 4);
  EXPECT_THAT(refusal(p), HasSubstr("tensor \"w\": unknown dtype \"F33\""));
  write_raw(p, R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}})", 4);
  EXPECT_THAT(refusal(p), HasSubstr("tensor \"w\": 4 bytes for a F32 tensor of 2 elements (8 bytes)"));
  write_raw(p, R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})", 4);  // cut short
  EXPECT_THAT(refusal(p), HasSubstr("outside the 4 bytes of data"));
  write_raw(p,
            R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
            8);
  EXPECT_THAT(refusal(p), HasSubstr("overlap"));
  write_raw(p, R"({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", 4);
  EXPECT_THAT(refusal(p), HasSubstr("not a non-negative integer"));
  // No gaps: every byte of the data belongs to a tensor, and nothing follows the last.
  write_raw(p,
            R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                "b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}})",
            12);
  EXPECT_THAT(refusal(p), HasSubstr("bytes [4, 8) of the data belong to no tensor (before tensor \"b\")"));
  write_raw(p, R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})", 8);
  EXPECT_THAT(refusal(p), HasSubstr("bytes [0, 4) of the data belong to no tensor"));
  write_raw(p, R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})", 6);
  EXPECT_THAT(refusal(p), HasSubstr("the data holds 6 bytes but its tensors end at byte 4"));
  // Shapes whose element count would overflow are refused before any product wraps.
  write_raw(p, R"({"w": {"dtype": "F32", "shape": [4294967296, 4294967296, 16], "data_offsets": [0, 0]}})", 0);
  EXPECT_THAT(refusal(p), HasSubstr("holds more elements than the file's 0 bytes"));
  write_raw(p, R"({"w": {"dtype": "F32", "shape": [18446744073709551615], "data_offsets": [0, 4]}})", 4);
  EXPECT_THAT(refusal(p), HasSubstr("is not a non-negative integer"));
  write_raw(p, R"({"w": {"dtype": "F32", "shape": [0, 4294967296, 4294967296], "data_offsets": [0, 0]}})", 0);
  EXPECT_EQ(refusal(p), "");  // no elements: a legal empty tensor
  EXPECT_THAT(refusal(scratch("missing.safetensors")), HasSubstr("cannot open"));
  // The writer refuses what it cannot lay out.
  EXPECT_THROW(write_safetensors(p, {{"w", "F32", {3}, bytes_of({1, 2})}}), Error);
  EXPECT_THROW(write_safetensors(p, {{"w", "F32", {1}, bytes_of({1})}, {"w", "F32", {1}, bytes_of({2})}}), Error);
}

// Fuzzing the reader: thousands of mutations of a valid file (bytes of the header changed, digits of its numbers
// replaced, the file cut or extended) either open with every tensor inside the data, back to back, and every byte of
// the data readable, or are refused with dtrain::Error (exit 2) naming the file; nothing else happens (no other
// exception, no read outside the mapping: run under ASan by scripts/sanitizer-tests.sh as part of model_test).
TEST(Safetensors, FuzzedFilesOpenConsistentlyOrAreRefused) {
  const std::string good = scratch("good.safetensors"), p = scratch("fuzz.safetensors");
  write_safetensors(good, {{"a", "F32", {2, 3}, bytes_of({1, 2, 3, 4, 5, 6})},
                           {"b", "BF16", {2}, std::vector<std::byte>(4, std::byte{7})},
                           {"c", "F32", {0, 5}, {}},
                           {"d", "I64", {1}, std::vector<std::byte>(8, std::byte{1})}});
  std::string original;
  {
    std::ifstream in(good, std::ios::binary);
    original.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  std::uint64_t header = 0;
  std::memcpy(&header, original.data(), 8);
  std::uint64_t x = 0x9e3779b97f4a7c15ULL;
  const auto next = [&x](std::uint64_t n) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return x % n;
  };
  int opened = 0, refused = 0;
  for (int round = 0; round < 4000; ++round) {
    std::string f = original;
    for (std::uint64_t k = 1 + next(3); k > 0; --k) {
      switch (next(5)) {
        case 0: {  // any byte of the length or the header
          const std::size_t at = next(4) == 0 ? next(8) : 8 + next(header);
          if (at < f.size()) f[at] = static_cast<char>(next(256));
          break;
        }
        case 1: {  // a digit of the header's numbers: offsets and shapes
          std::size_t at = 8 + next(header);
          while (at < std::min<std::size_t>(8 + header, f.size()) && (f[at] < '0' || f[at] > '9')) ++at;
          if (at < std::min<std::size_t>(8 + header, f.size())) f[at] = static_cast<char>('0' + next(10));
          break;
        }
        case 2:  // cut the file
          f.resize(next(f.size() + 1));
          break;
        case 3:  // bytes after the data
          f.append(next(16), 'x');
          break;
        default:  // a long number in place of a digit
          if (auto at = f.find_first_of("0123456789", std::min<std::size_t>(8 + next(header), f.size()));
              at != std::string::npos && at < 8 + header)
            f.replace(at, 1, std::to_string(next(~0ULL)));
          break;
      }
    }
    std::ofstream(p, std::ios::binary | std::ios::trunc) << f;
    try {
      SafetensorsFile file(p);
      ++opened;
      std::uint64_t at = 0, sum = 0;
      for (const SafeTensorInfo& t : file.tensors()) {
        ASSERT_EQ(t.begin, at) << f;
        at = t.end;
        for (std::byte b : file.bytes(t)) sum += static_cast<std::uint64_t>(b);  // every byte readable
      }
      std::uint64_t length = 0;  // the mutated file's own header length
      std::memcpy(&length, f.data(), 8);
      EXPECT_EQ(8 + length + at, f.size());  // nothing after the last tensor
      EXPECT_GE(sum, 0U);
    } catch (const Error& e) {
      ++refused;
      EXPECT_EQ(e.exit_code(), ExitCode::kBadInput);
      EXPECT_THAT(e.what(), HasSubstr(p));
    }
  }
  EXPECT_GT(opened, 0);  // some mutations keep a valid file (a digit replaced by itself, a name changed)
  EXPECT_GT(refused, 3000);
}

// Every model the export tests train: its config.json imports back to the same model.
TEST(HfWeights, ExportedConfigsImportToTheSameModel) {
  for (const char* file :
       {"examples/models/tiny.toml", "tests/data/models/tiny-qwen2.toml", "tests/data/models/tiny-mixtral.toml",
        "tests/data/models/tiny-qwen2-moe.toml", "examples/models/tiny-gpt2.toml", "examples/models/llama3-8b.toml",
        "examples/models/mixtral-8x7b.toml", "tests/data/models/tiny-llama31.toml",
        "tests/data/models/tiny-qwen2-yarn.toml", "tests/data/models/tiny-llama-linear.toml"}) {
    SCOPED_TRACE(file);
    const ModelDescription d = load_model(std::string(DTRAIN_SOURCE_DIR) + "/" + file);
    const ModelSpec& m = d.model;
    const HfModelMap map = hf_model_map(m);
    const std::string path = scratch("config.json");
    { std::ofstream(path) << hf_config_json(m, map, "bfloat16"); }
    const ModelSpec back = load_hf_config(path).model;
    EXPECT_EQ(back.arch, m.arch);
    EXPECT_EQ(back.layers, m.layers);
    EXPECT_EQ(back.hidden, m.hidden);
    EXPECT_EQ(back.ffn_hidden, m.ffn_hidden);
    EXPECT_EQ(back.heads, m.heads);
    EXPECT_EQ(back.kv_heads, m.kv_heads);
    EXPECT_EQ(back.vocab, m.vocab);
    EXPECT_EQ(back.seq_len, m.seq_len);
    EXPECT_EQ(back.tied_embeddings, m.tied_embeddings);
    EXPECT_EQ(back.has_qkv_bias(), m.has_qkv_bias());
    EXPECT_EQ(back.norm_eps, m.norm_eps);
    if (m.position == PositionKind::kRope) {
      EXPECT_EQ(back.rope_theta, m.rope_theta);
    }
    EXPECT_EQ(back.rope_scaling.type, m.rope_scaling.type);
    EXPECT_EQ(back.rope_scaling.factor, m.rope_scaling.factor);
    if (m.rope_scaling.type != RopeScalingType::kLinear) {
      EXPECT_EQ(back.rope_scaling.original_context, m.rope_scaling.original_context);
    }
    EXPECT_EQ(back.rope_scaling.beta_fast, m.rope_scaling.beta_fast);
    EXPECT_EQ(back.rope_scaling.beta_slow, m.rope_scaling.beta_slow);
    EXPECT_EQ(back.rope_scaling.truncate, m.rope_scaling.truncate);
    EXPECT_EQ(back.rope_scaling.attention_scale(), m.rope_scaling.attention_scale());
    EXPECT_EQ(back.moe.experts, m.moe.experts);
    EXPECT_EQ(back.moe.top_k, m.moe.top_k);
    EXPECT_EQ(back.moe.ffn_hidden, m.moe.ffn_hidden);
    EXPECT_EQ(back.moe.shared_ffn_hidden, m.moe.shared_ffn_hidden);
    EXPECT_EQ(back.moe.interval, m.moe.interval);
    EXPECT_EQ(back.moe.normalize_top_k, m.moe.normalize_top_k);
    // Every parameter is exported once: the HF tensors hold as many elements as the model has.
    std::int64_t elements = 0;
    for (const HfTensorMap& t : map.tensors) {
      std::int64_t n = 1;
      for (std::int64_t x : t.shape) n *= x;
      elements += n;
    }
    EXPECT_EQ(elements, m.total_params());
  }
}

TEST(HfWeights, ModelsNoHfClassDescribesAreRefusedWithTheReason) {
  auto reason = [](ModelSpec m) {
    try {
      hf_model_map(m);
    } catch (const Error& e) {
      EXPECT_EQ(e.exit_code(), ExitCode::kBadInput);
      return std::string(e.what());
    }
    return std::string();
  };
  const ModelSpec tiny = load_model(std::string(DTRAIN_SOURCE_DIR) + "/examples/models/tiny.toml").model;
  ModelSpec m = tiny;
  m.moe = {4, 2, 96};
  m.moe.capacity_factor = 1.0;
  EXPECT_THAT(reason(m), HasSubstr("no token is dropped"));
  m.moe.capacity_factor = 0;
  m.moe.interval = 2;
  EXPECT_THAT(reason(m), HasSubstr("MixtralForCausalLM, every layer's MLP is routed"));
  m.moe.shared_ffn_hidden = 64;
  EXPECT_THAT(reason(m), HasSubstr("Qwen2MoeForCausalLM, the shared expert has a gate"));
  const ModelSpec gpt = load_model(std::string(DTRAIN_SOURCE_DIR) + "/examples/models/tiny-gpt2.toml").model;
  m = gpt;
  m.tied_embeddings = false;
  EXPECT_THAT(reason(m), HasSubstr("GPT2LMHeadModel, the output matrix is the word embeddings"));
}

}  // namespace
}  // namespace dtrain::model
