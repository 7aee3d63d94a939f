// UTF-8 for the tokenizers: stepping through code points, and making text well-formed the way the references do.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace dtrain::data::utf8 {

// One step through a UTF-8 string: the length of the sequence at s[i] and whether it is well-formed. An ill-formed
// sequence's length is that of its maximal subpart (Unicode 15, section 3.9, table 3-7), at least 1, so that
// replacing each with one U+FFFD gives what Rust's String::from_utf8_lossy and Python's decode(errors="replace") give.
struct Step {
  std::size_t length;
  bool well_formed;
};

inline Step step(std::string_view s, std::size_t i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) return {1, true};
  std::size_t trailing = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // the range of the first trailing byte (table 3-7)
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    trailing = 1;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    trailing = 2;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    trailing = 3;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
  } else {
    return {1, false};
  }
  for (std::size_t k = 1; k <= trailing; ++k) {
    if (i + k >= s.size()) return {k, false};
    const auto b = static_cast<unsigned char>(s[i + k]);
    if (b < lo || b > hi) return {k, false};
    lo = 0x80;
    hi = 0xBF;
  }
  return {trailing + 1, true};
}

// The length of the (well-formed) sequence that starts with byte `lead`.
inline std::size_t sequence_length(unsigned char lead) {
  return lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
}

// The code point of the well-formed sequence at s[i].
inline char32_t decode(std::string_view s, std::size_t i) {
  const auto b = [&](std::size_t k) { return static_cast<char32_t>(static_cast<unsigned char>(s[i + k])); };
  switch (sequence_length(static_cast<unsigned char>(s[i]))) {
    case 1:
      return b(0);
    case 2:
      return ((b(0) & 0x1F) << 6) | (b(1) & 0x3F);
    case 3:
      return ((b(0) & 0x0F) << 12) | ((b(1) & 0x3F) << 6) | (b(2) & 0x3F);
    default:
      return ((b(0) & 0x07) << 18) | ((b(1) & 0x3F) << 12) | ((b(2) & 0x3F) << 6) | (b(3) & 0x3F);
  }
}

inline void append(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
}

inline bool is_well_formed(std::string_view s) {
  for (std::size_t i = 0; i < s.size();) {
    const auto b = static_cast<unsigned char>(s[i]);
    if (b < 0x80) {
      ++i;
      continue;
    }
    const Step st = step(s, i);
    if (!st.well_formed) return false;
    i += st.length;
  }
  return true;
}

// `s` with every ill-formed sequence replaced by U+FFFD.
inline std::string make_well_formed(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 8);
  for (std::size_t i = 0; i < s.size();) {
    const Step st = step(s, i);
    if (st.well_formed) {
      out.append(s.substr(i, st.length));
    } else {
      out += "\xEF\xBF\xBD";
    }
    i += st.length;
  }
  return out;
}

}  // namespace dtrain::data::utf8
