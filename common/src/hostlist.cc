#include "dtrain/common/hostlist.h"

#include <fmt/format.h>

#include <cctype>
#include <cstdint>

#include "dtrain/common/error.h"
#include "dtrain/common/strings.h"

namespace dtrain {
namespace {

bool all_digits(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (std::isdigit(static_cast<unsigned char>(c)) == 0) return false;
  }
  return true;
}

// Splits at commas that are not inside brackets.
std::vector<std::string_view> split_top_level(std::string_view text) {
  std::vector<std::string_view> parts;
  int depth = 0;
  std::size_t start = 0;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '[') ++depth;
    if (text[i] == ']') --depth;
    if (text[i] == ',' && depth == 0) {
      parts.push_back(text.substr(start, i - start));
      start = i + 1;
    }
  }
  parts.push_back(text.substr(start));
  return parts;
}

class Expander {
 public:
  Expander(std::string_view expression, std::size_t max_hosts) : expression_(expression), max_hosts_(max_hosts) {}

  [[noreturn]] void fail(const std::string& why) const {
    throw input_error(
        fmt::format("hostlist '{}': {} (expected a Slurm host list such as 'node[01-04],login1')", expression_, why));
  }

  // The values of one bracket group, as strings with their padding.
  std::vector<std::string> group_values(std::string_view group) const {
    std::vector<std::string> values;
    if (group.empty()) fail("empty brackets");
    for (const std::string& item : split(group, ',')) {
      if (item.empty()) fail("empty item in '[" + std::string(group) + "]'");
      auto dash = item.find('-');
      if (dash == std::string::npos) {
        if (!all_digits(item)) fail("'" + item + "' is not a number");
        values.push_back(item);
        continue;
      }
      std::string lo_text = item.substr(0, dash);
      std::string hi_text = item.substr(dash + 1);
      if (!all_digits(lo_text) || !all_digits(hi_text)) fail("range '" + item + "' must be two numbers 'lo-hi'");
      if (lo_text.size() > 18 || hi_text.size() > 18) fail("range '" + item + "' has numbers too large");
      auto lo = *parse_int(lo_text);
      auto hi = *parse_int(hi_text);
      if (hi < lo) fail("range '" + item + "' runs backwards");
      if (static_cast<std::uint64_t>(hi - lo) >= max_hosts_) fail("range '" + item + "' is too large");
      const int width = static_cast<int>(lo_text.size());
      for (std::int64_t v = lo; v <= hi; ++v) {
        values.push_back(fmt::format("{:0{}}", v, width));
        if (values.size() > max_hosts_) fail(fmt::format("more than {} hosts", max_hosts_));
      }
    }
    return values;
  }

  void expand_entry(std::string_view entry, std::vector<std::string>& out) const {
    if (entry.empty()) fail("empty entry");
    std::vector<std::string> partial{""};
    std::size_t i = 0;
    while (i < entry.size()) {
      if (entry[i] == ']') fail("']' without '['");
      if (entry[i] != '[') {
        auto next = entry.find_first_of("[]", i);
        if (next == std::string_view::npos) next = entry.size();
        for (auto& p : partial) p += entry.substr(i, next - i);
        i = next;
        continue;
      }
      auto close = entry.find(']', i);
      if (close == std::string_view::npos) fail("'[' without ']'");
      std::string_view group = entry.substr(i + 1, close - i - 1);
      if (group.find('[') != std::string_view::npos) fail("nested '['");
      std::vector<std::string> values = group_values(group);
      std::vector<std::string> next;
      if (partial.size() * values.size() > max_hosts_) fail(fmt::format("more than {} hosts", max_hosts_));
      next.reserve(partial.size() * values.size());
      for (const auto& p : partial) {
        for (const auto& v : values) next.push_back(p + v);
      }
      partial = std::move(next);
      i = close + 1;
    }
    for (auto& p : partial) {
      out.push_back(std::move(p));
      if (out.size() > max_hosts_) fail(fmt::format("more than {} hosts", max_hosts_));
    }
  }

  std::vector<std::string> run() const {
    std::string_view text = trim(expression_);
    if (text.empty()) fail("empty host list");
    int depth = 0;
    for (char c : text) {
      if (c == '[') ++depth;
      if (c == ']') --depth;
      if (depth < 0) fail("']' without '['");
      if (depth > 1) fail("nested '['");
    }
    if (depth != 0) fail("'[' without ']'");
    std::vector<std::string> hosts;
    for (std::string_view entry : split_top_level(text)) expand_entry(trim(entry), hosts);
    return hosts;
  }

 private:
  std::string_view expression_;
  std::size_t max_hosts_;
};

}  // namespace

std::vector<std::string> expand_hostlist(std::string_view expression, std::size_t max_hosts) {
  return Expander(expression, max_hosts).run();
}

}  // namespace dtrain
