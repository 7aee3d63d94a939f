// Tokenizing a corpus into a Megatron indexed dataset (dtexec tokenize): documents from JSONL files (the text under a
// key, one document per line) or plain text files (one document per file), encoded by the model's tokenizer on
// several threads, written in input order, one sequence per document, as Megatron's preprocess_data.py writes them.
//
// Streams: documents are read, encoded and written a batch at a time (a few MB of text), so memory stays bounded
// whatever the corpus size (a plain text file is one document, so it is read whole). The output appears whole or not
// at all (IndexedDatasetWriter): an error or a stop request leaves nothing under the output prefix.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "dtrain/data/tokenizer.h"

namespace dtrain::data {

struct TokenizeProgress {
  std::int64_t documents = 0;        // written
  std::int64_t empty_documents = 0;  // skipped: their text gave no tokens
  std::int64_t tokens = 0;           // written, end-of-document tokens included
  std::int64_t bytes_read = 0;       // of input text
  std::int64_t bytes_total = 0;      // of every input file
  double seconds = 0;
};

struct TokenizeOptions {
  std::vector<std::string> inputs;  // .jsonl / .json files are JSONL; anything else is one plain text document
  std::string output_prefix;        // writes output_prefix.bin and .idx
  std::string json_key = "text";
  bool append_eod = false;                                // append the tokenizer's end-of-document id to each document
  int workers = 1;                                        // encoding threads
  std::int64_t batch_bytes = 4 << 20;                     // text per batch (all workers together)
  const std::atomic<bool>* stop = nullptr;                // when set (by a signal handler), stop and leave nothing
  std::function<void(const TokenizeProgress&)> progress;  // called about once a second, and at the end
};

// Tokenizes the inputs. Throws dtrain::Error (input, exit 2) naming the file and line for an input that cannot be
// read, a JSONL line that is not JSON or lacks the key (or whose value is not a string), --append-eod with a
// tokenizer that has no end-of-document token, and a corpus that gives no tokens; dtrain::Error (io) for a failed
// write; dtrain::Error (io, exit 1) "interrupted" when `stop`
// is set. Nothing is left under the output prefix in any of these cases.
TokenizeProgress tokenize_corpus(const Tokenizer& tokenizer, const TokenizeOptions& options);

}  // namespace dtrain::data
