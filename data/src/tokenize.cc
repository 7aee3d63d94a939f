#include "dtrain/data/tokenize.h"

#include <fmt/format.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <thread>

#include "dtrain/common/error.h"
#include "dtrain/data/indexed_dataset.h"

namespace dtrain::data {

namespace {

using Clock = std::chrono::steady_clock;

bool is_jsonl(const std::string& path) {
  const auto ext = std::filesystem::path(path).extension().string();
  return ext == ".jsonl" || ext == ".json" || ext == ".ndjson";
}

// The documents of one batch, read in order.
struct Batch {
  std::vector<std::string> texts;
  std::vector<std::vector<std::int32_t>> ids;
  std::int64_t bytes = 0;
};

// Reads the inputs one batch at a time.
class CorpusReader {
 public:
  explicit CorpusReader(const TokenizeOptions& options) : options_(options) {}

  // The next batch; false at the end of the corpus.
  bool next(Batch& batch, std::int64_t& bytes_read) {
    batch.texts.clear();
    batch.bytes = 0;
    while (batch.bytes < options_.batch_bytes) {
      if (!in_.is_open()) {
        if (file_ == options_.inputs.size()) break;
        open(options_.inputs[file_]);
      }
      const std::string& path = options_.inputs[file_];
      if (!jsonl_) {
        std::stringstream text;
        text << in_.rdbuf();
        batch.texts.push_back(text.str());
        bytes_read += static_cast<std::int64_t>(batch.texts.back().size());
        finish_file();
      } else if (std::getline(in_, line_)) {
        ++line_number_;
        bytes_read += static_cast<std::int64_t>(line_.size()) + 1;
        if (line_.find_first_not_of(" \t\r") == std::string::npos) continue;
        batch.texts.push_back(text_of(path));
      } else {
        if (in_.bad()) throw io_error(fmt::format("{}: read failed at line {}", path, line_number_ + 1));
        finish_file();
        continue;
      }
      batch.bytes += static_cast<std::int64_t>(batch.texts.back().size());
    }
    return !batch.texts.empty();
  }

 private:
  void open(const std::string& path) {
    in_.open(path, std::ios::binary);
    if (!in_) throw input_error(fmt::format("{}: input not found or not readable", path));
    jsonl_ = is_jsonl(path);
    line_number_ = 0;
  }
  void finish_file() {
    in_.close();
    in_.clear();
    ++file_;
  }
  std::string text_of(const std::string& path) const {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line_);
    } catch (const nlohmann::json::parse_error& e) {
      throw input_error(fmt::format("{}:{}: not JSON ({})", path, line_number_, e.what()));
    }
    if (!j.is_object()) throw input_error(fmt::format("{}:{}: not a JSON object", path, line_number_));
    auto it = j.find(options_.json_key);
    if (it == j.end()) {
      throw input_error(fmt::format("{}:{}: no key '{}' (choose the text's key with --json-key)", path, line_number_,
                                    options_.json_key));
    }
    if (!it->is_string()) {
      throw input_error(
          fmt::format("{}:{}: '{}' is {}, not a string", path, line_number_, options_.json_key, it->type_name()));
    }
    return it->get<std::string>();
  }

  const TokenizeOptions& options_;
  std::size_t file_ = 0;
  std::ifstream in_;
  bool jsonl_ = false;
  std::string line_;
  std::int64_t line_number_ = 0;
};

// Encodes the batch's texts on `workers` threads, each taking every workers-th document.
void encode(const Tokenizer& tokenizer, Batch& batch, int workers) {
  batch.ids.assign(batch.texts.size(), {});
  const auto one = [&](std::size_t first) {
    for (std::size_t i = first; i < batch.texts.size(); i += static_cast<std::size_t>(workers)) {
      batch.ids[i] = tokenizer.encode(batch.texts[i]);
    }
  };
  if (workers == 1 || batch.texts.size() == 1) {
    one(0);
    return;
  }
  std::vector<std::thread> threads;
  std::exception_ptr failure;
  std::mutex failure_mutex;
  threads.reserve(static_cast<std::size_t>(workers));
  for (int w = 0; w < workers; ++w) {
    threads.emplace_back([&, w] {
      try {
        one(static_cast<std::size_t>(w));
      } catch (...) {
        std::lock_guard lock(failure_mutex);
        if (!failure) failure = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  if (failure) std::rethrow_exception(failure);
}

}  // namespace

TokenizeProgress tokenize_corpus(const Tokenizer& tokenizer, const TokenizeOptions& options) {
  DTRAIN_CHECK(options.workers >= 1, "workers");
  if (options.inputs.empty()) throw input_error("tokenize: no input files");
  std::optional<std::int32_t> eod;
  if (options.append_eod) {
    eod = tokenizer.eod();
    if (!eod) {
      throw input_error(
          fmt::format("--append-eod: the tokenizer ({}) has no end-of-document token", tokenizer.describe()));
    }
  }
  TokenizeProgress progress;
  for (const auto& path : options.inputs) {
    std::error_code ec;
    const auto status = std::filesystem::status(path, ec);
    if (ec || !std::filesystem::exists(status)) {
      throw input_error(fmt::format("{}: input not found or not readable", path));
    }
    // A pipe has no size: the total counts regular files only.
    if (std::filesystem::is_regular_file(status)) {
      progress.bytes_total += static_cast<std::int64_t>(std::filesystem::file_size(path, ec));
    }
  }
  const auto interrupted = [&] {
    if (options.stop != nullptr && options.stop->load()) {
      throw Error(ErrorCategory::kIo, fmt::format("{}: interrupted; nothing was written", options.output_prefix));
    }
  };
  const auto start = Clock::now();
  auto last_report = start;
  IndexedDatasetWriter writer(options.output_prefix, optimal_dtype(tokenizer.vocab_size()));
  CorpusReader reader(options);
  Batch batch;
  while (reader.next(batch, progress.bytes_read)) {
    encode(tokenizer, batch, options.workers);
    for (auto& ids : batch.ids) {
      if (ids.empty()) {
        ++progress.empty_documents;
        continue;
      }
      if (eod) ids.push_back(*eod);
      writer.add_document(ids);
      ++progress.documents;
      progress.tokens += static_cast<std::int64_t>(ids.size());
    }
    interrupted();
    const auto now = Clock::now();
    if (options.progress && now - last_report >= std::chrono::seconds(1)) {
      progress.seconds = std::chrono::duration<double>(now - start).count();
      options.progress(progress);
      last_report = now;
    }
  }
  interrupted();  // a read cut short by the signal ends the input early: what was read is not the corpus
  if (progress.tokens == 0) {
    throw input_error(fmt::format("{}: the corpus gives no tokens ({} empty documents)", options.inputs.front(),
                                  progress.empty_documents));
  }
  writer.finish();
  progress.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  if (options.progress) options.progress(progress);
  return progress;
}

}  // namespace dtrain::data
