// Tokenizer speed and memory: encodes every line of a text file REPEAT times on one thread (each line a document, as
// bench/tokenizer_vs_reference.sh has the references do) and prints one JSON line: MB/s of text, ids made, the time
// to open the tokenizer, and the peak resident memory of the process (getrusage ru_maxrss).
//   build/bin/tokenizer_speed TOKENIZER TEXT_FILE [REPEAT]
// Target (the tokenizer issue): >= 5 MB/s with Llama 3's tokenizer.json on one core, < 200 MB peak RSS.
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "dtrain/common/error.h"
#include "dtrain/data/tokenizer.h"

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double peak_rss_mb() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB on Linux
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3 || argc > 4) {
    std::cerr << "usage: tokenizer_speed TOKENIZER TEXT_FILE [REPEAT]\n";
    return 2;
  }
  const int repeat = argc == 4 ? std::stoi(argv[3]) : 1;
  try {
    std::ifstream in(argv[2], std::ios::binary);
    if (!in) throw dtrain::input_error(std::string(argv[2]) + ": cannot be read");
    std::vector<std::string> lines;
    std::size_t bytes = 0;
    for (std::string line; std::getline(in, line);) {
      bytes += line.size() + 1;
      lines.push_back(std::move(line));
    }
    const double rss_before_mb = peak_rss_mb();
    const auto t_open = std::chrono::steady_clock::now();
    const auto tokenizer = dtrain::data::open_tokenizer(argv[1]);
    const double open_s = seconds_since(t_open);

    std::size_t ids = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < repeat; ++r) {
      for (const std::string& line : lines) ids += tokenizer->encode(line).size();
    }
    const double seconds = seconds_since(t0);
    std::printf(
        "{\"tokenizer\": \"%s\", \"mb_per_s\": %.2f, \"ids\": %zu, \"seconds\": %.3f, \"open_s\": %.3f, "
        "\"peak_rss_mb\": %.1f, \"text_rss_mb\": %.1f}\n",
        tokenizer->describe().c_str(), static_cast<double>(bytes) * repeat / 1e6 / seconds, ids, seconds, open_s,
        peak_rss_mb(), rss_before_mb);
    return 0;
  } catch (const dtrain::Error& e) {
    std::cerr << "tokenizer_speed: " << e.what() << "\n";
    return static_cast<int>(e.exit_code());
  }
}
