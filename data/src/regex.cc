#include "regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "dtrain/common/error.h"
#include "utf8.h"

namespace dtrain::data {
namespace {

// Oniguruma's \w with Unicode: General_Category Letter, Mark, Number or Connector_Punctuation (doc/RE).
constexpr std::string_view kWordClassBody = R"(\p{L}\p{M}\p{N}\p{Pc})";

// Per-thread PCRE2 state: one match data block (usable with any pattern) and a JIT stack larger than the default
// 32 KiB, so that long runs of whitespace or letters do not exhaust it.
struct MatchState {
  pcre2_match_data* data = pcre2_match_data_create(16, nullptr);
  pcre2_jit_stack* jit_stack = pcre2_jit_stack_create(std::size_t{32} * 1024, std::size_t{8} * 1024 * 1024, nullptr);
  pcre2_match_context* context = pcre2_match_context_create(nullptr);
  MatchState() { pcre2_jit_stack_assign(context, nullptr, jit_stack); }
  ~MatchState() {
    pcre2_match_context_free(context);
    pcre2_jit_stack_free(jit_stack);
    pcre2_match_data_free(data);
  }
  MatchState(const MatchState&) = delete;
  MatchState& operator=(const MatchState&) = delete;
};

MatchState& match_state() {
  thread_local MatchState state;
  return state;
}

}  // namespace

std::string oniguruma_to_pcre2(std::string_view pattern) {
  std::string out;
  out.reserve(pattern.size() + 32);
  bool in_class = false;
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char e = pattern[++i];
      switch (e) {
        case 's':
          out += R"(\p{White_Space})";
          break;
        case 'S':
          out += R"(\P{White_Space})";
          break;
        case 'w':
          out += in_class ? std::string(kWordClassBody) : "[" + std::string(kWordClassBody) + "]";
          break;
        case 'W':
          // Inside a class a complement cannot be spelled without nesting; PCRE2's own \W is kept there.
          out += in_class ? std::string(R"(\W)") : "[^" + std::string(kWordClassBody) + "]";
          break;
        default:
          out += c;
          out += e;
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];  // a literal ] first in a class
      continue;
    }
    if (in_class && c == '[' && i + 1 < pattern.size() && pattern[i + 1] == ':') {
      const auto end = pattern.find(":]", i + 2);  // a POSIX class, [:alpha:]
      if (end != std::string_view::npos) {
        out.append(pattern.substr(i, end + 2 - i));
        i = end + 1;
        continue;
      }
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

struct Regex::Code {
  pcre2_code* code = nullptr;
  ~Code() { pcre2_code_free(code); }
};

Regex::Regex(std::string_view pattern, std::string_view where) : code_(std::make_unique<Code>()) {
  const std::string translated = oniguruma_to_pcre2(pattern);
  int error = 0;
  PCRE2_SIZE offset = 0;
  code_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(), PCRE2_UTF | PCRE2_UCP,
                              &error, &offset, nullptr);
  if (code_->code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof message);
    throw input_error(std::string(where) + ": pattern '" + std::string(pattern) + "' does not compile (PCRE2, at " +
                      std::to_string(offset) + " of '" + translated + "': " + reinterpret_cast<char*>(message) + ")");
  }
  // Without a JIT (some architectures) pcre2_match interprets; the results are the same.
  pcre2_jit_compile(code_->code, PCRE2_JIT_COMPLETE);
}

Regex::~Regex() = default;

void Regex::find_all(std::string_view text, std::vector<std::pair<std::size_t, std::size_t>>& matches) const {
  MatchState& state = match_state();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  // Oniguruma's find_iter (the onig crate): search from the end of the last match; an empty match right where the
  // last match ended is skipped by moving one character on.
  std::size_t search_from = 0;
  std::size_t last_match_end = std::string_view::npos;
  while (search_from <= text.size()) {
    // The text was checked once by the caller; PCRE2_NO_UTF_CHECK keeps each search from checking it again.
    const int rc =
        pcre2_match(code_->code, subject, text.size(), search_from, PCRE2_NO_UTF_CHECK, state.data, state.context);
    if (rc == PCRE2_ERROR_NOMATCH) return;
    if (rc < 0) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(rc, message, sizeof message);
      throw input_error(std::string("tokenizer pattern match failed (PCRE2: ") + reinterpret_cast<char*>(message) +
                        ")");
    }
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(state.data);
    const std::size_t begin = ovector[0], end = ovector[1];
    if (begin == end && end == last_match_end) {
      search_from +=
          search_from < text.size() ? utf8::sequence_length(static_cast<unsigned char>(text[search_from])) : 1;
      continue;
    }
    search_from = end;
    last_match_end = end;
    matches.emplace_back(begin, end);
  }
}

}  // namespace dtrain::data
