// dtrain::tokenizers against the reference implementations, document by document over tests/data/corpus: HF
// tokenizers.js (tests/reference/hf_encode.mjs, with the corrections it documents) for GPT-2's, Llama 3's and
// Llama 2's tokenizer.json (and variants of them: the Metaspace pre-tokenizer, an NFKC normalizer), Python's
// sentencepiece for models spm_train makes here. Then the pieces on tiny hand-made tokenizers, and the errors.
#include "dtrain/data/tokenizer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "dtrain/common/error.h"
#include "shell.h"

namespace dtrain::data {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using Ids = std::vector<std::int32_t>;

const fs::path kRoot = DTRAIN_SOURCE_DIR;
const fs::path kCorpus = kRoot / "tests/data/corpus/corpus.jsonl";
const fs::path kReference = kRoot / "tests/reference";
const fs::path kModels = kReference / "node_modules/@lenml";
const fs::path kGpt2 = kModels / "tokenizer-gpt2/models";
const fs::path kLlama3 = kModels / "tokenizer-llama3/models";
const fs::path kLlama2 = kModels / "tokenizer-llama2/models";

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<std::string> corpus() {
  std::vector<std::string> docs;
  std::ifstream in(kCorpus);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) docs.push_back(json::parse(line).at("text").get<std::string>());
  }
  return docs;
}

std::string quoted(const std::string& s) { return json(s).dump(); }

std::string show(const Ids& ids, std::size_t from, std::size_t count) {
  std::string out = "[";
  for (std::size_t i = from; i < std::min(ids.size(), from + count); ++i)
    out += (i > from ? "," : "") + std::to_string(ids[i]);
  return out + "]";
}

// A scratch directory per test, removed afterwards.
class TokenizerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("dtrain_tokenizer_test_" + std::to_string(::getpid()) + "_" + info->test_suite_name() + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path write(const std::string& name, const std::string& content) const {
    std::ofstream(dir_ / name, std::ios::binary) << content;
    return dir_ / name;
  }

  // A tokenizer.json (in a directory of its own, so that no tokenizer_config.json is next to it).
  std::unique_ptr<Tokenizer> open_json(const json& tokenizer_json, const std::string& name = "tiny") const {
    fs::create_directories(dir_ / name);
    std::ofstream(dir_ / name / "tokenizer.json") << tokenizer_json.dump();
    return open_tokenizer((dir_ / name / "tokenizer.json").string());
  }

  // A copy of the tokenizer in `from` (tokenizer.json and tokenizer_config.json) with `edit` applied to its JSON.
  fs::path variant(const fs::path& from, const std::string& name, const std::function<void(json&)>& edit) const {
    fs::create_directories(dir_ / name);
    json j = json::parse(slurp(from / "tokenizer.json"));
    edit(j);
    std::ofstream(dir_ / name / "tokenizer.json") << j.dump();
    fs::copy_file(from / "tokenizer_config.json", dir_ / name / "tokenizer_config.json");
    return dir_ / name;
  }

  fs::path dir_;
};

// ---- against HF tokenizers.js ------------------------------------------------------------------------------------

class HfReferenceTest : public TokenizerTest {
 protected:
  void SetUp() override {
    TokenizerTest::SetUp();
    if (!fs::exists(kReference / "node_modules/@huggingface/tokenizers/package.json") || !fs::exists(kLlama2)) {
      GTEST_SKIP() << "the npm references are not installed in tests/reference (run scripts/install-deps.sh)";
    }
    if (testing::shell(dir_, "node --version").exit_code != 0) GTEST_SKIP() << "node is not on PATH";
  }

  // Encodes every corpus document with dtrain and with tokenizers.js; expects the same ids and, where `decode` is
  // set, the same text from decode(). Fails at the first difference, showing where.
  void expect_same_as_reference(const fs::path& tokenizer_dir, bool decode = true) {
    const auto ref = testing::shell(dir_, "node " + (kReference / "hf_encode.mjs").string() + " " +
                                              tokenizer_dir.string() + " " + kCorpus.string());
    ASSERT_EQ(ref.exit_code, 0) << ref.err;
    std::vector<json> expected;
    std::istringstream lines(ref.out);
    for (std::string line; std::getline(lines, line);) expected.push_back(json::parse(line));
    const auto docs = corpus();
    ASSERT_EQ(expected.size(), docs.size());

    const auto tokenizer = open_tokenizer(tokenizer_dir.string());
    std::size_t same = 0;
    for (std::size_t d = 0; d < docs.size(); ++d) {
      const Ids want = expected[d].at("ids").get<Ids>();
      const Ids got = tokenizer->encode(docs[d]);
      if (got != want) {
        std::size_t at = 0;
        while (at < got.size() && at < want.size() && got[at] == want[at]) ++at;
        const std::size_t from = at >= 3 ? at - 3 : 0;
        ADD_FAILURE() << tokenizer_dir << ": document " << d << " " << quoted(docs[d]) << "\n  differs at id " << at
                      << " (" << got.size() << " ids, reference " << want.size() << ")"
                      << "\n  dtrain:    ..." << show(got, from, 10) << "\n  reference: ..." << show(want, from, 10);
        return;
      }
      if (decode) {
        EXPECT_EQ(tokenizer->decode(got), expected[d].at("decoded").get<std::string>())
            << tokenizer_dir << ": decode of document " << d;
      }
      ++same;
    }
    std::cout << "[ reference ] " << tokenizer_dir.string() << ": " << same << " of " << docs.size()
              << " documents with the same ids as tokenizers.js\n";
  }
};

TEST_F(HfReferenceTest, Gpt2MatchesTokenizersJs) { expect_same_as_reference(kGpt2); }

TEST_F(HfReferenceTest, Llama3MatchesTokenizersJs) { expect_same_as_reference(kLlama3); }

// HF's legacy conversion of a SentencePiece BPE model (this package's ids are Mistral 7B's): normalizer
// Sequence[Prepend("▁"), Replace(" ", "▁")], no pre-tokenizer, byte fallback, fuse_unk.
TEST_F(HfReferenceTest, Llama2MatchesTokenizersJs) { expect_same_as_reference(kLlama2); }

// The non-legacy conversion of the same model: the Metaspace pre-tokenizer (prepend_scheme first, split false, as
// transformers' LlamaConverter writes it) and the Metaspace decoder. decode() is not compared here: tokenizers.js's
// Metaspace decoder drops one leading space of the first token, Rust's drops every ▁ of the first token (so "   a",
// first token "▁▁", decodes to " a" in Python); dtrain follows Rust, checked in MetaspaceSplitMerges... below.
TEST_F(HfReferenceTest, MetaspacePreTokenizerMatchesTokenizersJs) {
  expect_same_as_reference(
      variant(
          kLlama2, "metaspace",
          [](json& j) {
            j["normalizer"] = nullptr;
            j["pre_tokenizer"] = {
                {"type", "Metaspace"}, {"replacement", "▁"}, {"prepend_scheme", "first"}, {"split", false}};
            j["decoder"] = {{"type", "Metaspace"}, {"replacement", "▁"}, {"prepend_scheme", "first"}, {"split", false}};
          }),
      /*decode=*/false);
}

// prepend_scheme always: every section between special tokens gets its ▁. (tokenizers.js's Metaspace ignores
// split, so split true is checked by hand below, in MetaspaceSplitMergesEachReplacementWithWhatFollows.)
TEST_F(HfReferenceTest, MetaspaceAlwaysPrependsMatchesTokenizersJs) {
  expect_same_as_reference(
      variant(kLlama2, "metaspace_always",
              [](json& j) {
                j["normalizer"] = nullptr;
                j["pre_tokenizer"] = {
                    {"type", "Metaspace"}, {"replacement", "▁"}, {"prepend_scheme", "always"}, {"split", false}};
                j["decoder"] = {
                    {"type", "Metaspace"}, {"replacement", "▁"}, {"prepend_scheme", "always"}, {"split", false}};
              }),
      /*decode=*/false);
}

// Unicode normalization through ICU: GPT-2 with an NFKC normalizer (the corpus has ligatures, full-width letters,
// circled digits, combining marks) and, for Qwen2's NFC, with NFC.
TEST_F(HfReferenceTest, NfkcAndNfcNormalizersMatchTokenizersJs) {
  expect_same_as_reference(variant(kGpt2, "nfkc", [](json& j) { j["normalizer"] = {{"type", "NFKC"}}; }));
  expect_same_as_reference(variant(kGpt2, "nfc",
                                   [](json& j) {
                                     j["normalizer"] = {{"type", "NFC"}};
                                   }),
                           /*decode=*/false);
}

// ---- against Python's sentencepiece ------------------------------------------------------------------------------

class SentencePieceReferenceTest : public TokenizerTest {
 protected:
  void SetUp() override {
    TokenizerTest::SetUp();
    if (testing::shell(dir_, "{ command -v spm_train && /usr/bin/python3 -c 'import sentencepiece'; }").exit_code !=
        0) {
      GTEST_SKIP() << "spm_train or python3-sentencepiece is not installed (scripts/install-deps.sh)";
    }
    // Training text: the GPL (English prose) and the corpus itself (so that its scripts have pieces).
    std::ofstream text(dir_ / "train.txt");
    text << slurp("/usr/share/common-licenses/GPL-3");
    for (const std::string& doc : corpus()) text << doc << "\n";
  }

  fs::path train(const std::string& name, const std::string& options) {
    const auto r = testing::shell(dir_, "spm_train --input=" + (dir_ / "train.txt").string() + " --model_prefix=" +
                                            (dir_ / name).string() + " --vocab_size=800 " + options);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return dir_ / (name + ".model");
  }

  void expect_same_as_reference(const fs::path& model) {
    const auto ref = testing::shell(dir_, "/usr/bin/python3 " + (kReference / "spm_encode.py").string() + " " +
                                              model.string() + " " + kCorpus.string());
    ASSERT_EQ(ref.exit_code, 0) << ref.err;
    std::istringstream lines(ref.out);
    const auto docs = corpus();
    const auto tokenizer = open_tokenizer(model.string());
    std::size_t d = 0;
    for (std::string line; std::getline(lines, line); ++d) {
      ASSERT_LT(d, docs.size());
      EXPECT_EQ(tokenizer->encode(docs[d]), json::parse(line).get<Ids>()) << "document " << d << " " << quoted(docs[d]);
    }
    EXPECT_EQ(d, docs.size());
    std::cout << "[ reference ] " << model.filename().string() << ": " << d << " documents compared with Python's "
              << "sentencepiece\n";
  }
};

TEST_F(SentencePieceReferenceTest, UnigramModelMatchesPython) {
  const fs::path model = train("unigram", "--model_type=unigram");
  expect_same_as_reference(model);
  const auto tokenizer = open_tokenizer(model.string());
  EXPECT_EQ(tokenizer->eod(), 2);  // spm_train's default </s>
  EXPECT_EQ(tokenizer->vocab_size(), 800);
  EXPECT_EQ(tokenizer->decode(tokenizer->encode("Free software")), "Free software");
}

TEST_F(SentencePieceReferenceTest, BpeModelWithByteFallbackMatchesPython) {
  // Llama 2's own kind of model: BPE with byte fallback, digits split. Renamed, to show the content decides the kind.
  const fs::path model = train("bpe", "--model_type=bpe --byte_fallback=true --split_digits=true");
  fs::rename(model, dir_ / "bpe.bin");
  expect_same_as_reference(dir_ / "bpe.bin");
}

TEST_F(SentencePieceReferenceTest, WithoutEosThereIsNoEod) {
  const auto tokenizer = open_tokenizer(train("noeos", "--eos_id=-1").string());
  EXPECT_EQ(tokenizer->eod(), std::nullopt);
  EXPECT_THROW(tokenizer->decode(Ids{800}), Error);
}

// ---- the real tokenizers' properties -----------------------------------------------------------------------------

TEST_F(HfReferenceTest, EodVocabularySizeAndSpecialTokensInText) {
  const auto gpt2 = open_tokenizer(kGpt2.string());
  EXPECT_EQ(gpt2->eod(), 50256);
  EXPECT_EQ(gpt2->vocab_size(), 50257);
  // Text that spells a special token gives the token (HF's encode, add_special_tokens=False, does).
  EXPECT_EQ(gpt2->encode("<|endoftext|>"), Ids{50256});
  EXPECT_EQ(gpt2->encode("Hello world"), (Ids{15496, 995}));

  const auto llama3 = open_tokenizer(kLlama3.string());
  EXPECT_EQ(llama3->eod(), 128001);  // <|end_of_text|>, tokenizer_config.json's eos_token
  EXPECT_EQ(llama3->vocab_size(), 128256);
  EXPECT_EQ(llama3->encode("<|begin_of_text|>hi<|end_of_text|>"), (Ids{128000, 6151, 128001}));

  const auto llama2 = open_tokenizer((kLlama2 / "tokenizer.json").string());
  EXPECT_EQ(llama2->eod(), 2);  // </s>
  EXPECT_EQ(llama2->vocab_size(), 32000);
  EXPECT_EQ(llama2->encode("</s>").front(), 2);
  EXPECT_NE(llama2->describe().find("vocabulary 32000"), std::string::npos) << llama2->describe();
}

TEST_F(HfReferenceTest, IllFormedUtf8IsEncodedAsReplacementCharacters) {
  const auto llama3 = open_tokenizer(kLlama3.string());
  // As Python's text.decode("utf-8", errors="replace") before encoding: one U+FFFD per maximal ill-formed subpart.
  EXPECT_EQ(llama3->encode("a\xFF\xC3(b\xE2\x82"), llama3->encode("a\uFFFD\uFFFD(b\uFFFD"));
}

TEST_F(HfReferenceTest, EncodesFromSeveralThreadsAtOnce) {
  const auto llama3 = open_tokenizer(kLlama3.string());
  const auto docs = corpus();
  std::vector<Ids> expected;
  for (const auto& doc : docs) expected.push_back(llama3->encode(doc));
  std::vector<int> mismatches(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 20; ++round) {
        for (std::size_t d = 0; d < docs.size(); ++d) mismatches[t] += llama3->encode(docs[d]) != expected[d];
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(mismatches, std::vector<int>(4, 0));
}

TEST_F(HfReferenceTest, DecodeRejectsIdsOutsideTheVocabulary) {
  const auto gpt2 = open_tokenizer(kGpt2.string());
  try {
    gpt2->decode(Ids{15496, 50257});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), ErrorCategory::kInput);
    EXPECT_NE(std::string(e.what()).find("token id 50257 is not in the vocabulary"), std::string::npos) << e.what();
  }
  EXPECT_THROW(gpt2->decode(Ids{-1}), Error);
}

// ---- the pieces, on tiny tokenizers ------------------------------------------------------------------------------

// A BPE tokenizer.json over single characters, with `merges` in rank order and extra vocabulary entries.
json tiny_bpe(const std::vector<std::string>& merges, const std::vector<std::string>& extra = {}) {
  json vocab = json::object();
  for (const char* c : {"a", "b", "c", "d", " "}) vocab[c] = vocab.size();
  for (const std::string& m : merges) {
    const auto space = m.find(' ');
    const std::string merged = m.substr(0, space) + m.substr(space + 1);
    if (!vocab.contains(merged)) vocab[merged] = vocab.size();
  }
  for (const std::string& e : extra) vocab[e] = vocab.size();
  return {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}}}, {"added_tokens", json::array()}};
}

std::vector<std::string> pieces(const Tokenizer& t, const Ids& ids) {
  std::vector<std::string> out;
  for (const std::int32_t id : ids) out.push_back(t.decode(Ids{id}));
  return out;
}
using Strings = std::vector<std::string>;

TEST_F(TokenizerTest, BpeMergesTheLowestRankedPairFirst) {
  // "abc": with b+c ranked first, a+bc; with a+b first, ab+c.
  auto t = open_json(tiny_bpe({"b c", "a bc", "a b"}), "bc_first");
  EXPECT_EQ(pieces(*t, t->encode("abc")), Strings{"abc"});
  t = open_json(tiny_bpe({"a b", "b c", "a bc"}), "ab_first");
  EXPECT_EQ(pieces(*t, t->encode("abc")), (Strings{"ab", "c"}));
  // Equal ranks: the leftmost pair merges first, and merged symbols do not merge again with the same rule.
  t = open_json(tiny_bpe({"a a"}), "aa");
  EXPECT_EQ(pieces(*t, t->encode("aaa")), (Strings{"aa", "a"}));
  EXPECT_EQ(pieces(*t, t->encode("aaaaa")), (Strings{"aa", "aa", "a"}));
  // A merge of merges, as the pairs appear.
  t = open_json(tiny_bpe({"a b", "c d", "ab cd"}), "abcd");
  EXPECT_EQ(pieces(*t, t->encode("abcdab")), (Strings{"abcd", "ab"}));
}

TEST_F(TokenizerTest, IgnoreMergesTakesAWordInTheVocabularyWhole) {
  json j = tiny_bpe({"a b"}, {"abc"});  // "abc" is a token no merge reaches
  auto t = open_json(j, "with_merges");
  EXPECT_EQ(pieces(*t, t->encode("abc")), (Strings{"ab", "c"}));
  j["model"]["ignore_merges"] = true;
  t = open_json(j, "ignore_merges");
  EXPECT_EQ(pieces(*t, t->encode("abc")), Strings{"abc"});
  EXPECT_EQ(pieces(*t, t->encode("abcab")), (Strings{"ab", "c", "ab"}));  // not a token: merged as usual
}

TEST_F(TokenizerTest, ByteFallbackAndFusedUnknowns) {
  json j = tiny_bpe({});
  j["model"]["vocab"]["<unk>"] = 100;
  j["model"]["unk_token"] = "<unk>";
  j["model"]["fuse_unk"] = true;
  auto t = open_json(j, "unk");
  const Ids unk = t->encode(
      "a\xC3\xA9\xC3\xA9"
      "b");  // "aééb": é is unknown, two of them fuse into one <unk>
  EXPECT_EQ(unk, (Ids{0, 100, 1}));
  j["model"]["byte_fallback"] = true;
  j["model"]["vocab"]["<0xC3>"] = 101;
  j["model"]["vocab"]["<0xA9>"] = 102;
  j["decoder"] = {{"type", "Sequence"}, {"decoders", {{{"type", "ByteFallback"}}, {{"type", "Fuse"}}}}};
  t = open_json(j, "byte_fallback");
  const Ids bytes = t->encode(
      "a\xC3\xA9"
      "b");
  EXPECT_EQ(bytes, (Ids{0, 101, 102, 1}));
  EXPECT_EQ(t->decode(bytes),
            "a\xC3\xA9"
            "b");
  EXPECT_EQ(t->decode(Ids{101}), "\uFFFD");  // a lone byte of a sequence: one U+FFFD per byte, as HF
}

TEST_F(TokenizerTest, AddedTokensAreMatchedLeftmostLongestWithTheirFlags) {
  json j = tiny_bpe({"a b"});
  auto added = [](int id, const std::string& content, bool lstrip, bool rstrip, bool single_word) {
    return json{{"id", id},         {"content", content}, {"single_word", single_word},
                {"lstrip", lstrip}, {"rstrip", rstrip},   {"normalized", false},
                {"special", true}};
  };
  j["added_tokens"] = {added(50, "<x>", false, false, false), added(51, "<x>y", false, false, false),
                       added(52, "[L]", true, false, false), added(53, "[R]", false, true, false),
                       added(54, "cd", false, false, true)};
  const auto t = open_json(j);
  EXPECT_EQ(t->encode("ab<x>yab"), (Ids{5, 51, 5}));  // the longest at the leftmost start
  EXPECT_EQ(t->encode("ab<x>ab"), (Ids{5, 50, 5}));
  EXPECT_EQ(t->encode("a  [L]b"), (Ids{0, 52, 1}));                   // lstrip takes the spaces before it
  EXPECT_EQ(t->encode("a[R]  b"), (Ids{0, 53, 1}));                   // rstrip those after it
  EXPECT_EQ(t->encode("a cd b"), (Ids{0, 4, 54, 4, 1}));              // single_word: a word of its own ...
  EXPECT_EQ(pieces(*t, t->encode("acd")), (Strings{"a", "c", "d"}));  // ... not inside one
}

TEST_F(TokenizerTest, NormalizedAddedTokensAreMatchedAfterNormalization) {
  json j = tiny_bpe({});
  j["normalizer"] = {{"type", "Lowercase"}};
  j["added_tokens"] = {{{"id", 60},
                        {"content", "DD"},
                        {"single_word", false},
                        {"lstrip", false},
                        {"rstrip", false},
                        {"normalized", true},
                        {"special", false}}};
  const auto t = open_json(j);
  // The token's content is normalized too ("dd"), and looked for in the lowercased text.
  EXPECT_EQ(t->encode("aDdB"), (Ids{0, 60, 1}));
  EXPECT_EQ(t->encode("add"), (Ids{0, 60}));
}

TEST_F(TokenizerTest, MetaspaceSplitMergesEachReplacementWithWhatFollows) {
  // HF's Metaspace with split true cuts before each ▁ (MergedWithNext); prepend_scheme first prepends one ▁ only to
  // the text's first section.
  json j = tiny_bpe({"▁ a", "▁a b", "a b"}, {"▁"});
  j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "▁"}, {"prepend_scheme", "first"}, {"split", true}};
  j["decoder"] = {{"type", "Metaspace"}, {"replacement", "▁"}, {"prepend_scheme", "first"}};
  j["added_tokens"] = {{{"id", 70},
                        {"content", "<s>"},
                        {"single_word", false},
                        {"lstrip", false},
                        {"rstrip", false},
                        {"normalized", false},
                        {"special", true}}};
  const auto t = open_json(j);
  EXPECT_EQ(pieces(*t, t->encode("ab  ab")), (Strings{"ab", "", "ab"}));  // ▁ab ▁ ▁ab (decoded ▁ -> space ...)
  const Ids ids = t->encode("ab  ab");
  EXPECT_EQ(t->decode(ids), "ab  ab");  // the prepended ▁ is dropped again
  const Ids after_special = t->encode("<s>ab");
  EXPECT_EQ(after_special.size(), 2u);  // not the first section: nothing prepended, "ab" whole
  EXPECT_EQ(t->decode(after_special), "<s>ab");
  // HF's (Rust) decoder drops every ▁ of the first token: "  ab" is ▁ ▁ab and decodes to " ab".
  EXPECT_EQ(t->decode(t->encode("  ab")), " ab");
}

TEST_F(TokenizerTest, SplitBehaviors) {
  // Split on "-" under each behavior, each piece then its own word: "a-b--c".
  auto split = [&](const std::string& behavior, bool invert) {
    json j = tiny_bpe({}, {"-"});
    j["pre_tokenizer"] = {
        {"type", "Split"}, {"pattern", {{"String", "-"}}}, {"behavior", behavior}, {"invert", invert}};
    j["model"]["ignore_merges"] = true;
    j["model"]["vocab"]["a-"] = 20;
    j["model"]["vocab"]["-b"] = 21;
    j["model"]["vocab"]["--"] = 22;
    j["model"]["vocab"]["-c"] = 23;
    j["model"]["vocab"]["b-"] = 24;
    const auto t = open_json(j, behavior + (invert ? "_inverted" : ""));
    return pieces(*t, t->encode("a-b--c"));
  };
  EXPECT_EQ(split("Isolated", false), (Strings{"a", "-", "b", "-", "-", "c"}));
  EXPECT_EQ(split("Removed", false), (Strings{"a", "b", "c"}));
  EXPECT_EQ(split("MergedWithPrevious", false), (Strings{"a-", "b-", "-", "c"}));
  EXPECT_EQ(split("MergedWithNext", false), (Strings{"a", "-b", "-", "-c"}));
  EXPECT_EQ(split("Contiguous", false), (Strings{"a", "-", "b", "--", "c"}));
  EXPECT_EQ(split("Removed", true), (Strings{"-", "-", "-"}));
}

// ---- errors ------------------------------------------------------------------------------------------------------

// Expects open_tokenizer(path) to throw an input error whose message contains each of `parts`.
void expect_input_error(const std::string& path, const std::vector<std::string>& parts) {
  try {
    open_tokenizer(path);
    ADD_FAILURE() << path << ": no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), ErrorCategory::kInput) << e.what();
    EXPECT_EQ(e.exit_code(), ExitCode::kBadInput);
    for (const std::string& part : parts) EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

TEST_F(TokenizerTest, UnsupportedModelsAreNamed) {
  const fs::path fixtures = kRoot / "tests/data/tokenizers";
  expect_input_error((fixtures / "wordpiece.json").string(),
                     {"wordpiece.json", "model type 'WordPiece' is not supported (supported: BPE)"});
  expect_input_error((fixtures / "unigram.json").string(),
                     {"unigram.json", "model type 'Unigram' is not supported (supported: BPE)"});
}

TEST_F(TokenizerTest, UnsupportedComponentsAreNamed) {
  json j = tiny_bpe({});
  j["normalizer"] = {{"type", "BertNormalizer"}};
  write("bert_normalizer.json", j.dump());
  expect_input_error((dir_ / "bert_normalizer.json").string(),
                     {"bert_normalizer.json", "normalizer type 'BertNormalizer' is not supported"});
  j = tiny_bpe({});
  j["pre_tokenizer"] = {{"type", "BertPreTokenizer"}};
  write("bert_pre_tokenizer.json", j.dump());
  expect_input_error((dir_ / "bert_pre_tokenizer.json").string(),
                     {"bert_pre_tokenizer.json", "pre_tokenizer type 'BertPreTokenizer' is not supported"});
  j = tiny_bpe({"a x"});  // a merge part that is not in the vocabulary
  write("bad_merge.json", j.dump());
  expect_input_error((dir_ / "bad_merge.json").string(), {"bad_merge.json", "'x' is not in the vocabulary"});
}

TEST_F(TokenizerTest, FilesThatAreNotTokenizersAreNamed) {
  expect_input_error((dir_ / "missing.json").string(), {"missing.json", "no such file"});
  expect_input_error(write("broken.json", "{\"model\": {\"type\": ").string(), {"broken.json", "not valid JSON"});
  expect_input_error(write("text.txt", "just some words\n").string(),
                     {"text.txt", "neither a HuggingFace tokenizer.json (a JSON object) nor a SentencePiece model"});
  expect_input_error(write("binary.bin", std::string("\x00\x01\x02\x03", 4)).string(), {"binary.bin", "neither"});
  expect_input_error(write("fake.model", std::string("\x0A\xFF\xFF\xFF\x0F", 5)).string(),
                     {"fake.model", "not a SentencePiece model sentencepiece can load"});
  expect_input_error(write("other.json", "{\"version\": \"1.0\"}").string(), {"other.json", "no \"model\""});
  fs::create_directories(dir_ / "empty_dir");
  expect_input_error((dir_ / "empty_dir").string(), {"empty_dir", "neither a tokenizer.json"});
}

}  // namespace
}  // namespace dtrain::data
