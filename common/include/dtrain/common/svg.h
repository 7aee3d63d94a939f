// dtrain::svg — SVG documents that are well-formed XML by construction.
//
// Every SVG dtrain writes (dtplan simulate --svg) goes through svg::Writer: callers name elements and attributes and
// hand over text and values, and the writer escapes every attribute value and text node, balances the tags and
// closes the document. No call site writes markup itself, so a name such as "RECV grad c1 mb0 <- 8" or a model
// called "a&b" cannot break the document (browsers show an XML error page instead of a drawing that is not
// well-formed).
//
// Not thread-safe; one writer per document.
#pragma once

#include <initializer_list>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace dtrain::svg {

// `text` made safe as XML character data and as a quoted attribute value: & < > " ' become entity references; tab,
// newline and carriage return become character references (so they survive attribute-value normalisation and
// line-end handling); characters XML 1.0 cannot carry even escaped (the other C0 controls, U+FFFE, U+FFFF) and bytes
// that are not UTF-8 (stray continuation bytes, overlong forms, surrogates, truncated sequences) each become U+FFFD.
// Valid UTF-8 outside those is kept as it is. Never throws.
std::string escape(std::string_view text);

// One attribute: a name spelled by the code (an XML name: a letter, '_' or ':' then letters, digits, '_', ':', '.',
// '-'; checked when written) and a value, given as text (escaped when written) or as a number (written in fixed
// notation with at most two decimals, trailing zeros dropped: 12, 0.5, 123.46).
class Attribute {
 public:
  Attribute(std::string_view name, std::string_view value);
  Attribute(std::string_view name, const char* value) : Attribute(name, std::string_view(value)) {}
  template <typename Number>
  requires(std::is_arithmetic_v<Number> && !std::is_same_v<Number, bool>) Attribute(std::string_view name, Number value)
      : name_(name), value_(number(static_cast<double>(value))) {}

  const std::string& name() const { return name_; }
  const std::string& value() const { return value_; }  // unescaped

 private:
  // Throws an internal dtrain::Error for NaN and infinities, which no SVG length can be.
  static std::string number(double value);

  std::string name_;
  std::string value_;
};

using Attributes = std::initializer_list<Attribute>;

// Writes one SVG document. Element names and attribute names are checked (an internal dtrain::Error names a bad one
// or an attribute given twice on one element); everything else is escaped. Elements that are children of the root end
// with a newline, so the file reads one element per line.
class Writer {
 public:
  // Starts <svg xmlns="http://www.w3.org/2000/svg" width height viewBox="0 0 width height" ...attributes>.
  Writer(double width, double height, Attributes attributes = {});

  // An empty element: <name .../>.
  Writer& element(std::string_view name, Attributes attributes);
  // An element holding only text: <name ...>text</name>.
  Writer& text_element(std::string_view name, Attributes attributes, std::string_view text);
  // Opens <name ...>; what follows is its content until the matching close().
  Writer& open(std::string_view name, Attributes attributes);
  // Closes the element last opened. Throws an internal dtrain::Error when only the root is open.
  Writer& close();

  // Closes every open element and the root, and returns the document. The writer is spent afterwards: writing more
  // throws an internal dtrain::Error.
  std::string finish();

 private:
  void start_tag(std::string_view name, Attributes attributes);
  void write_attributes(Attributes attributes, std::vector<std::string_view>& written);
  void end_line();

  std::string out_;
  std::vector<std::string> open_;  // open elements, root first
};

}  // namespace dtrain::svg
