#include "dtrain/spank/hostlist.h"

#include <fmt/format.h>

#include "dtrain/common/error.h"
#include "dtrain/common/strings.h"

namespace dtrain::spank {

namespace {

constexpr std::size_t kMaxHosts = 1'000'000;

// Splits at commas that are not inside brackets.
std::vector<std::string> top_level_items(std::string_view expr) {
  std::vector<std::string> items;
  std::string cur;
  int depth = 0;
  for (char c : expr) {
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (depth < 0) throw input_error(fmt::format("host list '{}': ']' without '['", expr));
    if (c == ',' && depth == 0) {
      items.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (depth != 0) throw input_error(fmt::format("host list '{}': '[' without ']'", expr));
  items.push_back(cur);
  return items;
}

// "1-3,07" -> {"1","2","3","07"}
std::vector<std::string> expand_ranges(std::string_view expr, std::string_view ranges) {
  std::vector<std::string> out;
  for (const std::string& part : split(ranges, ',')) {
    auto bad = [&](const std::string& why) {
      return input_error(fmt::format("host list '{}': range '{}' {}", expr, part, why));
    };
    if (part.empty()) throw bad("is empty");
    auto dash = part.find('-');
    std::string lo_text = part.substr(0, dash);
    std::string hi_text = dash == std::string::npos ? lo_text : part.substr(dash + 1);
    for (const std::string& t : {lo_text, hi_text}) {
      if (t.empty() || t.find_first_not_of("0123456789") != std::string::npos) throw bad("is not numeric");
    }
    auto lo = parse_int(lo_text);
    auto hi = parse_int(hi_text);
    if (!lo || !hi) throw bad("is out of range");
    if (*hi < *lo) throw bad("runs backwards");
    if (static_cast<std::size_t>(*hi - *lo) + out.size() >= kMaxHosts) throw bad("has too many hosts");
    std::size_t width = lo_text.size();
    for (std::int64_t v = *lo; v <= *hi; ++v) out.push_back(fmt::format("{:0{}}", v, width));
  }
  return out;
}

}  // namespace

std::vector<std::string> expand_hostlist(std::string_view expression) {
  std::string_view expr = trim(expression);
  if (expr.empty()) throw input_error("host list is empty");
  std::vector<std::string> hosts;
  for (const std::string& item : top_level_items(expr)) {
    if (item.empty()) throw input_error(fmt::format("host list '{}': empty host name", expr));
    // Cartesian product over the bracket groups, left to right.
    std::vector<std::string> partial = {""};
    std::size_t pos = 0;
    while (pos < item.size()) {
      auto open = item.find('[', pos);
      std::string literal = item.substr(pos, open == std::string::npos ? std::string::npos : open - pos);
      for (auto& p : partial) p += literal;
      if (open == std::string::npos) break;
      auto close = item.find(']', open);
      auto values = expand_ranges(expr, std::string_view(item).substr(open + 1, close - open - 1));
      std::vector<std::string> next;
      if (partial.size() * values.size() + hosts.size() > kMaxHosts) {
        throw input_error(fmt::format("host list '{}': more than {} hosts", expr, kMaxHosts));
      }
      next.reserve(partial.size() * values.size());
      for (const auto& p : partial) {
        for (const auto& v : values) next.push_back(p + v);
      }
      partial = std::move(next);
      pos = close + 1;
    }
    for (auto& h : partial) hosts.push_back(std::move(h));
  }
  return hosts;
}

}  // namespace dtrain::spank
