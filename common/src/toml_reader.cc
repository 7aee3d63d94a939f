#include "dtrain/common/toml_reader.h"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "dtrain/common/error.h"
#include "dtrain/common/strings.h"

namespace dtrain {

namespace {

std::string describe_type(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::table:
      return "a table";
    case toml::node_type::array:
      return "an array";
    case toml::node_type::string:
      return "a string";
    case toml::node_type::integer:
      return "an integer";
    case toml::node_type::floating_point:
      return "a float";
    case toml::node_type::boolean:
      return "a boolean";
    case toml::node_type::date:
    case toml::node_type::time:
    case toml::node_type::date_time:
      return "a date/time";
    default:
      return "nothing";
  }
}

}  // namespace

TomlDocument TomlDocument::parse_file(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    throw input_error(fmt::format("{}: file not found", path));
  }
  if (std::filesystem::is_directory(path, ec)) {
    throw input_error(fmt::format("{}: is a directory, expected a TOML file", path));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw input_error(fmt::format("{}: cannot be read", path));
  std::stringstream buffer;
  buffer << in.rdbuf();
  return parse_string(buffer.str(), path);
}

TomlDocument TomlDocument::parse_string(std::string_view text, std::string name) {
  try {
    auto table = std::make_shared<toml::table>(toml::parse(text, name));
    return TomlDocument(std::move(table), std::move(name));
  } catch (const toml::parse_error& e) {
    const auto& begin = e.source().begin;
    throw input_error(fmt::format("{}:{}:{}: TOML syntax error: {}", name, begin.line, begin.column, e.description()));
  }
}

TableReader TomlDocument::root() const { return TableReader(*table_, file_, ""); }

TableReader::TableReader(const toml::table& table, std::string file, std::string section)
    : table_(&table), file_(std::move(file)), section_(std::move(section)) {}

int TableReader::line() const { return static_cast<int>(table_->source().begin.line); }

bool TableReader::has(std::string_view key) const { return table_->contains(key); }

const toml::node* TableReader::node(std::string_view key) const { return table_->get(key); }

std::string TableReader::where(std::string_view key) const {
  const toml::node* n = node(key);
  int ln = n != nullptr ? static_cast<int>(n->source().begin.line) : line();
  if (ln <= 0) return file_;
  return fmt::format("{}:{}", file_, ln);
}

std::string TableReader::key_name(std::string_view key) const {
  if (section_.empty()) return std::string(key);
  return fmt::format("[{}] {}", section_, key);
}

std::string TableReader::value_text(std::string_view key) const {
  const toml::node* n = node(key);
  if (n == nullptr) return "";
  std::ostringstream os;
  if (n->is_string()) {
    os << '"' << n->as_string()->get() << '"';
  } else if (n->is_table()) {
    os << "{...}";
  } else {
    n->visit([&os](auto&& v) { os << v; });
  }
  return os.str();
}

void TableReader::fail(std::string_view key, std::string_view message) const {
  if (node(key) != nullptr) {
    throw input_error(fmt::format("{}: {} = {}: {}", where(key), key_name(key), value_text(key), message));
  }
  throw input_error(fmt::format("{}: {}: {}", where(key), key_name(key), message));
}

void TableReader::fail_table(std::string_view message) const {
  std::string loc = line() > 0 ? fmt::format("{}:{}", file_, line()) : file_;
  if (section_.empty()) throw input_error(fmt::format("{}: {}", loc, message));
  throw input_error(fmt::format("{}: [{}]: {}", loc, section_, message));
}

void TableReader::fail_type(std::string_view key, std::string_view expected) const {
  fail(key, fmt::format("expected {}, got {}", expected, describe_type(*node(key))));
}

std::optional<TableReader> TableReader::table(std::string_view key) {
  asked_.emplace(key);
  const toml::node* n = node(key);
  if (n == nullptr) return std::nullopt;
  if (!n->is_table()) fail_type(key, "a table");
  std::string sub = section_.empty() ? std::string(key) : section_ + "." + std::string(key);
  return TableReader(*n->as_table(), file_, sub);
}

std::vector<TableReader> TableReader::table_array(std::string_view key) {
  asked_.emplace(key);
  std::vector<TableReader> out;
  const toml::node* n = node(key);
  if (n == nullptr) return out;
  if (!n->is_array_of_tables()) fail_type(key, "an array of tables ([[" + std::string(key) + "]])");
  std::string sub = section_.empty() ? std::string(key) : section_ + "." + std::string(key);
  for (const auto& el : *n->as_array()) out.emplace_back(*el.as_table(), file_, sub);
  return out;
}

std::optional<std::int64_t> TableReader::get_int(std::string_view key) {
  asked_.emplace(key);
  const toml::node* n = node(key);
  if (n == nullptr) return std::nullopt;
  if (!n->is_integer()) {
    if (n->is_floating_point()) fail(key, "expected an integer, got a float");
    fail_type(key, "an integer");
  }
  return n->as_integer()->get();
}

std::optional<double> TableReader::get_number(std::string_view key) {
  asked_.emplace(key);
  const toml::node* n = node(key);
  if (n == nullptr) return std::nullopt;
  if (n->is_integer()) return static_cast<double>(n->as_integer()->get());
  if (n->is_floating_point()) {
    double v = n->as_floating_point()->get();
    if (!std::isfinite(v)) fail(key, "expected a finite number");
    return v;
  }
  fail_type(key, "a number");
}

std::optional<std::string> TableReader::get_string(std::string_view key) {
  asked_.emplace(key);
  const toml::node* n = node(key);
  if (n == nullptr) return std::nullopt;
  if (!n->is_string()) fail_type(key, "a string");
  return n->as_string()->get();
}

std::optional<bool> TableReader::get_bool(std::string_view key) {
  asked_.emplace(key);
  const toml::node* n = node(key);
  if (n == nullptr) return std::nullopt;
  if (!n->is_boolean()) fail_type(key, "a boolean (true or false)");
  return n->as_boolean()->get();
}

std::optional<std::vector<double>> TableReader::get_number_array(std::string_view key) {
  asked_.emplace(key);
  const toml::node* n = node(key);
  if (n == nullptr) return std::nullopt;
  if (!n->is_array()) fail_type(key, "an array of numbers");
  std::vector<double> out;
  for (const auto& el : *n->as_array()) {
    if (el.is_integer())
      out.push_back(static_cast<double>(el.as_integer()->get()));
    else if (el.is_floating_point())
      out.push_back(el.as_floating_point()->get());
    else
      fail(key, fmt::format("expected an array of numbers, found {} in it", describe_type(el)));
  }
  return out;
}

std::optional<std::vector<std::int64_t>> TableReader::get_int_array(std::string_view key) {
  asked_.emplace(key);
  const toml::node* n = node(key);
  if (n == nullptr) return std::nullopt;
  if (!n->is_array()) fail_type(key, "an array of integers");
  std::vector<std::int64_t> out;
  for (const auto& el : *n->as_array()) {
    if (!el.is_integer()) fail(key, fmt::format("expected an array of integers, found {} in it", describe_type(el)));
    out.push_back(el.as_integer()->get());
  }
  return out;
}

std::optional<std::vector<std::string>> TableReader::get_string_array(std::string_view key) {
  asked_.emplace(key);
  const toml::node* n = node(key);
  if (n == nullptr) return std::nullopt;
  if (!n->is_array()) fail_type(key, "an array of strings");
  std::vector<std::string> out;
  for (const auto& el : *n->as_array()) {
    if (!el.is_string()) fail(key, fmt::format("expected an array of strings, found {} in it", describe_type(el)));
    out.push_back(el.as_string()->get());
  }
  return out;
}

std::int64_t TableReader::require_int(std::string_view key) {
  auto v = get_int(key);
  if (!v) fail(key, "required key is missing");
  return *v;
}

double TableReader::require_number(std::string_view key) {
  auto v = get_number(key);
  if (!v) fail(key, "required key is missing");
  return *v;
}

std::string TableReader::require_string(std::string_view key) {
  auto v = get_string(key);
  if (!v) fail(key, "required key is missing");
  return *v;
}

std::optional<std::int64_t> TableReader::get_count(std::string_view key, std::int64_t min_value) {
  auto v = get_int(key);
  if (v && !is_count(*v, min_value)) fail(key, count_requirement(min_value));
  return v;
}

std::optional<double> TableReader::get_positive_number(std::string_view key) {
  auto v = get_number(key);
  if (v && !(*v > 0.0)) fail(key, "must be positive");
  return v;
}

std::optional<std::string> TableReader::get_choice(std::string_view key, const std::vector<std::string>& choices) {
  auto v = get_string(key);
  if (!v) return v;
  for (const auto& c : choices) {
    if (*v == c) return v;
  }
  std::string msg = fmt::format("expected one of {}", join(choices, ", "));
  if (auto s = nearest(*v, choices)) msg += fmt::format(" (did you mean \"{}\"?)", *s);
  fail(key, msg);
}

void TableReader::allow(std::string_view key) { asked_.emplace(key); }

void TableReader::check_format(std::int64_t supported, bool required) {
  auto version = get_int("format");
  if (!version && required) fail("format", "required key is missing: is this a dtrain file?");
  if (version && *version != supported) {
    fail("format", fmt::format("unsupported format version (this dtrain reads format = {})", supported));
  }
}

void TableReader::reject_unknown() const {
  std::vector<std::string> known(asked_.begin(), asked_.end());
  for (const auto& [k, v] : *table_) {
    if (asked_.count(k.str()) > 0) continue;
    std::string msg = "unknown key";
    if (auto s = nearest(k.str(), known)) {
      msg += fmt::format(" (did you mean '{}'?)", *s);
    } else if (!known.empty()) {
      msg += fmt::format(" (valid keys: {})", join(known, ", "));
    }
    int ln = static_cast<int>(k.source().begin.line);
    std::string loc = ln > 0 ? fmt::format("{}:{}", file_, ln) : file_;
    throw input_error(fmt::format("{}: {}: {}", loc, key_name(k.str()), msg));
  }
}

}  // namespace dtrain
