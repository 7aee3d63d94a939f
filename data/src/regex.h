// The regular expressions of tokenizer.json files (pre-tokenizer splits, Replace normalizers), run with PCRE2.
//
// HF tokenizers compiles these patterns with Oniguruma. PCRE2 (UTF and Unicode properties on) reads the same syntax
// — lookahead, (?i:...), \p{L}, possessive and lazy quantifiers — and the few shorthands whose Unicode meaning
// differs are rewritten to Oniguruma's before compiling: \s and \S are White_Space (PCRE2's \s misses U+0085),
// \w and \W are letters, marks, numbers and connector punctuation (PCRE2 10.42's \w has no marks).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dtrain::data {

class Regex {
 public:
  // Compiles `pattern` (JIT-compiled where PCRE2 has a JIT). Throws dtrain::Error (input) "<where>: ..." naming the
  // pattern and PCRE2's complaint when it does not compile.
  Regex(std::string_view pattern, std::string_view where);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Appends to `matches` the [begin, end) byte ranges of the matches in `text` (well-formed UTF-8), left to right,
  // as Oniguruma's find_iter gives them (an empty match right after the previous match is skipped). Safe to call
  // from several threads at once (match data is per thread).
  void find_all(std::string_view text, std::vector<std::pair<std::size_t, std::size_t>>& matches) const;

 private:
  struct Code;
  std::unique_ptr<Code> code_;
};

// `pattern` with the shorthands rewritten as described above (exposed for the tests).
std::string oniguruma_to_pcre2(std::string_view pattern);

}  // namespace dtrain::data
