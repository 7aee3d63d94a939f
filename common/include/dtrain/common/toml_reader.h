// Strict reading of TOML input files (model.toml, cluster.toml, plan.toml).
//
// Every value read is type-checked, every error names the file, the line and the dotted key, and keys nobody
// asked for are rejected with the nearest valid key suggested:
//   examples/models/x.toml:7: [model] hiden: unknown key (did you mean 'hidden'?)
// A TableReader records each key its caller asks for; reject_unknown() then reports the keys present in the file
// that no one asked for, so callers ask for all optional keys before calling it.
#pragma once

#include <toml++/toml.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "dtrain/common/count.h"

namespace dtrain {

class TableReader;

class TomlDocument {
 public:
  // Throws dtrain::Error (input) naming the file, line and column on a syntax error, or when the file is missing.
  static TomlDocument parse_file(const std::string& path);
  // `name` stands in for the file name in messages.
  static TomlDocument parse_string(std::string_view text, std::string name);

  TableReader root() const;
  const std::string& file() const { return file_; }
  const toml::table& table() const { return *table_; }

 private:
  TomlDocument(std::shared_ptr<toml::table> table, std::string file)
      : table_(std::move(table)), file_(std::move(file)) {}
  std::shared_ptr<toml::table> table_;
  std::string file_;
};

class TableReader {
 public:
  // `section` is the dotted path of the table ("" for the root, "model", "cluster.gpu").
  TableReader(const toml::table& table, std::string file, std::string section);

  bool has(std::string_view key) const;

  // Sub-table; nullopt when absent. Error when present but not a table.
  std::optional<TableReader> table(std::string_view key);
  // Array of tables ([[x]]); empty when absent.
  std::vector<TableReader> table_array(std::string_view key);

  std::optional<std::int64_t> get_int(std::string_view key);
  // Accepts integers and floats.
  std::optional<double> get_number(std::string_view key);
  std::optional<std::string> get_string(std::string_view key);
  std::optional<bool> get_bool(std::string_view key);
  std::optional<std::vector<double>> get_number_array(std::string_view key);
  std::optional<std::vector<std::int64_t>> get_int_array(std::string_view key);
  std::optional<std::vector<std::string>> get_string_array(std::string_view key);

  // The required forms throw when the key is missing.
  std::int64_t require_int(std::string_view key);
  double require_number(std::string_view key);
  std::string require_string(std::string_view key);

  // A count (dtrain/common/count.h): an integer of at least min_value (1 unless the key documents another bound);
  // "must be at least N" otherwise. 0 is refused like any other value below it, never read as absent.
  std::optional<std::int64_t> get_count(std::string_view key, std::int64_t min_value = kMinCount);
  std::optional<double> get_positive_number(std::string_view key);
  // String that must be one of `choices` (case-sensitive); lists them otherwise.
  std::optional<std::string> get_choice(std::string_view key, const std::vector<std::string>& choices);

  // Marks a key as valid without reading it (for keys read through another path).
  void allow(std::string_view key);
  // The optional `format = N` version key of a dtrain file: throws unless it is absent or equal to `supported`.
  // With `required`, absence is an error too.
  void check_format(std::int64_t supported, bool required = false);
  // Throws for the first key in the table that was never asked for, with a suggestion.
  void reject_unknown() const;

  // "file:line" of the key's value (the table's own line when the key is absent).
  std::string where(std::string_view key) const;
  // "[section] key" or "key" at the root.
  std::string key_name(std::string_view key) const;
  // The value as written in TOML ("4096", "\"gpt\"").
  std::string value_text(std::string_view key) const;

  // Throws an input error "file:line: [section] key = value: message".
  [[noreturn]] void fail(std::string_view key, std::string_view message) const;
  // Throws an input error "file:line: [section]: message" for problems of the table as a whole.
  [[noreturn]] void fail_table(std::string_view message) const;

  const std::string& file() const { return file_; }
  const std::string& section() const { return section_; }
  int line() const;

 private:
  const toml::node* node(std::string_view key) const;
  [[noreturn]] void fail_type(std::string_view key, std::string_view expected) const;

  const toml::table* table_;
  std::string file_;
  std::string section_;
  std::set<std::string, std::less<>> asked_;
};

}  // namespace dtrain
