#include "dtrain/common/svg.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "dtrain/common/error.h"

namespace dtrain::svg {
namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD in UTF-8

bool continuation(unsigned char c) { return (c & 0xC0) == 0x80; }

// Length of the well-formed UTF-8 sequence at text[i] (Unicode 15, table 3-7: no overlong forms, no surrogates,
// nothing above U+10FFFF), or 0 when there is none.
std::size_t utf8_length(std::string_view text, std::size_t i) {
  auto at = [&](std::size_t k) { return i + k < text.size() ? static_cast<unsigned char>(text[i + k]) : 0u; };
  unsigned char c = at(0);
  if (c >= 0xC2 && c <= 0xDF) return continuation(at(1)) ? 2 : 0;
  if (c >= 0xE0 && c <= 0xEF) {
    unsigned char lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
    return at(1) >= lo && at(1) <= hi && continuation(at(2)) ? 3 : 0;
  }
  if (c >= 0xF0 && c <= 0xF4) {
    unsigned char lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
    return at(1) >= lo && at(1) <= hi && continuation(at(2)) && continuation(at(3)) ? 4 : 0;
  }
  return 0;
}

bool is_name(std::string_view name) {
  auto start = [](char c) { return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_' || c == ':'; };
  if (name.empty() || !start(name.front())) return false;
  for (char c : name) {
    if (!start(c) && !(c >= '0' && c <= '9') && c != '.' && c != '-') return false;
  }
  return true;
}

void check_name(std::string_view name, std::string_view what) {
  DTRAIN_CHECK(is_name(name), fmt::format("svg: {} '{}' is not an XML name", what, escape(name)));
}

}  // namespace

std::string escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size();) {
    auto c = static_cast<unsigned char>(text[i]);
    if (c < 0x80) {
      switch (c) {
        case '&':
          out += "&amp;";
          break;
        case '<':
          out += "&lt;";
          break;
        case '>':
          out += "&gt;";
          break;
        case '"':
          out += "&quot;";
          break;
        case '\'':
          out += "&apos;";
          break;
        case '\t':
          out += "&#9;";
          break;
        case '\n':
          out += "&#10;";
          break;
        case '\r':
          out += "&#13;";
          break;
        default:
          // XML 1.0 has no way to write the other C0 controls, not even as character references.
          if (c < 0x20)
            out += kReplacement;
          else
            out += static_cast<char>(c);
      }
      ++i;
      continue;
    }
    std::size_t n = utf8_length(text, i);
    // U+FFFE and U+FFFF (EF BF BE, EF BF BF) are not XML characters either.
    bool non_character = n == 3 && c == 0xEF && static_cast<unsigned char>(text[i + 1]) == 0xBF &&
                         static_cast<unsigned char>(text[i + 2]) >= 0xBE;
    if (n == 0 || non_character) {
      out += kReplacement;
      i += n == 0 ? 1 : n;
    } else {
      out.append(text.substr(i, n));
      i += n;
    }
  }
  return out;
}

Attribute::Attribute(std::string_view name, std::string_view value) : name_(name), value_(value) {}

std::string Attribute::number(double value) {
  DTRAIN_CHECK(std::isfinite(value), fmt::format("svg: the number {} is not finite", value));
  std::string text = fmt::format("{:.2f}", value);
  while (text.back() == '0') text.pop_back();
  if (text.back() == '.') text.pop_back();
  return text == "-0" ? "0" : text;
}

Writer::Writer(double width, double height, Attributes attributes) {
  Attribute w("width", width), h("height", height);
  Attribute view_box("viewBox", fmt::format("0 0 {} {}", w.value(), h.value()));
  out_ += "<svg xmlns=\"http://www.w3.org/2000/svg\"";
  std::vector<std::string_view> written = {"xmlns"};
  write_attributes({w, h, view_box}, written);
  write_attributes(attributes, written);
  out_ += '>';
  open_.emplace_back("svg");
  end_line();
}

void Writer::start_tag(std::string_view name, Attributes attributes) {
  DTRAIN_CHECK(!open_.empty(), "svg: an element after finish()");
  check_name(name, "element");
  out_ += '<';
  out_ += name;
  std::vector<std::string_view> written;
  write_attributes(attributes, written);
}

void Writer::write_attributes(Attributes attributes, std::vector<std::string_view>& written) {
  for (const Attribute& a : attributes) {
    check_name(a.name(), "attribute");
    // XML allows an attribute once per element.
    DTRAIN_CHECK(std::find(written.begin(), written.end(), a.name()) == written.end(),
                 fmt::format("svg: attribute {} given twice", a.name()));
    written.push_back(a.name());
    out_ += fmt::format(" {}=\"{}\"", a.name(), escape(a.value()));
  }
}

void Writer::end_line() {
  if (open_.size() <= 1) out_ += '\n';
}

Writer& Writer::element(std::string_view name, Attributes attributes) {
  start_tag(name, attributes);
  out_ += "/>";
  end_line();
  return *this;
}

Writer& Writer::text_element(std::string_view name, Attributes attributes, std::string_view text) {
  start_tag(name, attributes);
  out_ += fmt::format(">{}</{}>", escape(text), name);
  end_line();
  return *this;
}

Writer& Writer::open(std::string_view name, Attributes attributes) {
  start_tag(name, attributes);
  out_ += '>';
  open_.emplace_back(name);
  return *this;
}

Writer& Writer::close() {
  DTRAIN_CHECK(open_.size() > 1, "svg: close() without an open element (finish() closes the root)");
  out_ += fmt::format("</{}>", open_.back());
  open_.pop_back();
  end_line();
  return *this;
}

std::string Writer::finish() {
  while (open_.size() > 1) close();
  if (!open_.empty()) {
    out_ += "</svg>\n";
    open_.clear();
  }
  std::string document = std::move(out_);
  out_.clear();
  return document;
}

}  // namespace dtrain::svg
