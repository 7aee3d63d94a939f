// Small string helpers shared by the parsers and the reports.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dtrain {

std::vector<std::string> split(std::string_view text, char sep);
std::string_view trim(std::string_view text);
std::string lowercase(std::string_view text);
std::string join(const std::vector<std::string>& parts, std::string_view sep);
bool starts_with(std::string_view text, std::string_view prefix);

// Levenshtein distance, for "did you mean" suggestions.
std::size_t edit_distance(std::string_view a, std::string_view b);
// The candidate closest to word when it is close enough to be a plausible typo (distance at most a third of the
// word's length, at least 1, or one is a prefix of the other); nullopt otherwise.
std::optional<std::string> nearest(std::string_view word, const std::vector<std::string>& candidates);

// "12.3 GiB", "512 MiB", "100 B".
std::string format_bytes(double bytes);
// "1.23 s", "45.6 ms", "789 us".
std::string format_seconds(double seconds);

// `text` as a TOML basic string, quotes included: backslash, quote and control characters escaped, so that any name
// (a model called `my "big" model`) writes a file that reads back to the same name.
std::string toml_string(std::string_view text);

// Strict integer/float parsing of a whole string; nullopt when anything is left over or out of range.
std::optional<std::int64_t> parse_int(std::string_view text);
std::optional<double> parse_double(std::string_view text);

}  // namespace dtrain
