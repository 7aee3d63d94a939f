// A real text as a Megatron dataset of byte tokens, for tests that train the byte-vocabulary tiny model on real data
// (link dtrain::data).
#pragma once

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "dtrain/data/indexed_dataset.h"

namespace dtrain::testing {

// Writes `prefix`.bin/.idx from the text at `text_path`: a document per paragraph (lines up to a blank line), its
// bytes as tokens, ended by token 0, which no text byte is. Returns `prefix`.
inline std::string byte_text_dataset(const std::string& prefix, const std::string& text_path) {
  std::ifstream in(text_path);
  std::stringstream text;
  text << in.rdbuf();
  data::IndexedDatasetWriter writer(prefix, data::TokenDType::kUInt16);
  std::vector<std::int32_t> doc;
  const auto end_document = [&] {
    if (doc.empty()) return;
    doc.push_back(0);
    writer.add_document(doc);
    doc.clear();
  };
  std::string line;
  while (std::getline(text, line)) {
    if (line.find_first_not_of(" \t") == std::string::npos) {
      end_document();
      continue;
    }
    for (unsigned char c : line + "\n") doc.push_back(c);
  }
  end_document();
  writer.finish();
  return prefix;
}

}  // namespace dtrain::testing
