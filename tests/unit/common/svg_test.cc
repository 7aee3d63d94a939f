#include "dtrain/common/svg.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "dtrain/common/error.h"

namespace dtrain::svg {
namespace {

const std::string kFffd = "\xEF\xBF\xBD";  // U+FFFD, what escape() writes for what XML cannot carry

TEST(SvgEscape, MarkupCharactersBecomeReferences) {
  EXPECT_EQ(escape("RECV grad c1 mb0 <- 8"), "RECV grad c1 mb0 &lt;- 8");
  EXPECT_EQ(escape("SEND act c0 mb3 -> 1"), "SEND act c0 mb3 -&gt; 1");
  EXPECT_EQ(escape(R"(a&b<c>d"e'f)"), "a&amp;b&lt;c&gt;d&quot;e&apos;f");
  EXPECT_EQ(escape("&amp;"), "&amp;amp;");  // text that looks escaped is text, escaped again
  EXPECT_EQ(escape("]]></title><script>alert(1)</script>"),
            "]]&gt;&lt;/title&gt;&lt;script&gt;alert(1)&lt;/script&gt;");
  EXPECT_EQ(escape(""), "");
  EXPECT_EQ(escape("plain text 0-9"), "plain text 0-9");
}

TEST(SvgEscape, WhitespaceAndControlCharacters) {
  // Tab, newline and CR as references, so an attribute value keeps them (a parser turns them into spaces otherwise).
  EXPECT_EQ(escape("a\tb\nc\rd"), "a&#9;b&#10;c&#13;d");
  // The other C0 controls cannot appear in XML 1.0 at all, not even as &#1;.
  EXPECT_EQ(escape(std::string_view("x\0y", 3)), "x" + kFffd + "y");
  EXPECT_EQ(escape("\x01\x08\x0b\x0c\x1b\x1f"), kFffd + kFffd + kFffd + kFffd + kFffd + kFffd);
  EXPECT_EQ(escape("del\x7f"), "del\x7f");  // U+007F is an XML character
}

TEST(SvgEscape, KeepsUtf8AndReplacesWhatIsNotUtf8) {
  const std::string text = "llama é — 日本 🚀 \xEF\xBF\xBD";
  EXPECT_EQ(escape(text), text);
  EXPECT_EQ(escape("\xff"), kFffd);                                      // never a UTF-8 byte
  EXPECT_EQ(escape("a\x80z"), "a" + kFffd + "z");                        // stray continuation byte
  EXPECT_EQ(escape("\xC0\xAF"), kFffd + kFffd);                          // overlong '/'
  EXPECT_EQ(escape("\xE0\x80\xAF"), kFffd + kFffd + kFffd);              // overlong '/', three bytes
  EXPECT_EQ(escape("\xED\xA0\x80"), kFffd + kFffd + kFffd);              // a surrogate, U+D800
  EXPECT_EQ(escape("\xF4\x90\x80\x80"), kFffd + kFffd + kFffd + kFffd);  // above U+10FFFF
  EXPECT_EQ(escape("\xE6\x97"), kFffd + kFffd);                          // truncated at the end
  EXPECT_EQ(escape("\xE6\x97<"), kFffd + kFffd + "&lt;");                // truncated before markup
  EXPECT_EQ(escape("\xEF\xBF\xBE\xEF\xBF\xBF"), kFffd + kFffd);          // U+FFFE, U+FFFF: not XML characters
  EXPECT_EQ(escape("\xF0\x9F\x9A"), kFffd + kFffd + kFffd);              // a truncated four-byte sequence
}

TEST(SvgEscape, OutputHasNoMarkupLeft) {
  std::string hostile;
  for (int c = 0; c < 256; ++c) hostile += static_cast<char>(c);
  hostile += "<-&\"'";
  std::string out = escape(hostile);
  for (std::size_t i = 0; i < out.size(); ++i) {
    char c = out[i];
    ASSERT_NE(c, '<') << i;
    ASSERT_NE(c, '>') << i;
    ASSERT_NE(c, '"') << i;
    ASSERT_NE(c, '\'') << i;
    ASSERT_FALSE(c >= 0 && c < 0x20) << i;
    if (c == '&') {
      std::size_t end = out.find(';', i);
      ASSERT_NE(end, std::string::npos);
      std::string ref = out.substr(i, end + 1 - i);
      EXPECT_TRUE(ref == "&amp;" || ref == "&lt;" || ref == "&gt;" || ref == "&quot;" || ref == "&apos;" ||
                  ref == "&#9;" || ref == "&#10;" || ref == "&#13;")
          << ref;
    }
  }
}

TEST(SvgAttribute, NumbersInFixedNotation) {
  EXPECT_EQ(Attribute("x", 0).value(), "0");
  EXPECT_EQ(Attribute("x", 8).value(), "8");
  EXPECT_EQ(Attribute("x", 1200.0).value(), "1200");
  EXPECT_EQ(Attribute("x", 12.5).value(), "12.5");
  EXPECT_EQ(Attribute("x", 123.456).value(), "123.46");
  EXPECT_EQ(Attribute("x", -0.001).value(), "0");
  EXPECT_EQ(Attribute("x", 1e9).value(), "1000000000");
  EXPECT_EQ(Attribute("fill", "#ddd").value(), "#ddd");
  EXPECT_THROW(Attribute("x", std::nan("")), Error);
  EXPECT_THROW(Attribute("x", std::numeric_limits<double>::infinity()), Error);
}

TEST(SvgWriter, WritesABalancedEscapedDocument) {
  Writer w(10, 20.5, {{"font-size", 11}});
  w.element("rect", {{"x", 0.5}, {"fill", "a\"b<c>"}});
  w.open("rect", {{"width", 3}}).text_element("title", {}, "RECV grad c1 mb0 <- 8").close();
  w.text_element("text", {{"x", 1}}, "llama & co \xff");
  EXPECT_EQ(w.finish(),
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"10\" height=\"20.5\" viewBox=\"0 0 10 20.5\" "
            "font-size=\"11\">\n"
            "<rect x=\"0.5\" fill=\"a&quot;b&lt;c&gt;\"/>\n"
            "<rect width=\"3\"><title>RECV grad c1 mb0 &lt;- 8</title></rect>\n"
            "<text x=\"1\">llama &amp; co " +
                kFffd +
                "</text>\n"
                "</svg>\n");
}

TEST(SvgWriter, FinishClosesWhatIsOpen) {
  Writer w(1, 1);
  w.open("g", {}).open("rect", {});
  EXPECT_EQ(w.finish(),
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"1\" height=\"1\" viewBox=\"0 0 1 1\">\n"
            "<g><rect></rect></g>\n</svg>\n");
  EXPECT_THROW(w.element("rect", {}), Error);  // spent
}

TEST(SvgWriter, RefusesNamesThatAreNotXmlNames) {
  Writer w(1, 1);
  EXPECT_THROW(w.element("rect x=\"1\"", {}), Error);
  EXPECT_THROW(w.element("", {}), Error);
  EXPECT_THROW(w.element("1rect", {}), Error);
  EXPECT_THROW(w.element("rect", {{"on click", "x"}}), Error);
  EXPECT_THROW(w.element("rect", {{"x\"", 1}}), Error);
  EXPECT_THROW(Writer(1, 1, {{"a>b", 1}}), Error);
  EXPECT_THROW(w.element("rect", {{"x", 1}, {"x", 2}}), Error);  // twice is not well-formed
  EXPECT_THROW(Writer(1, 1, {{"width", 2}}), Error);             // the writer sets width
  EXPECT_THROW(Writer(1, 1, {{"xmlns", "x"}}), Error);
  EXPECT_THROW(w.close(), Error);  // only the root is open
  EXPECT_NO_THROW(w.element("stop", {{"stop-color", "red"}, {"xlink:href", "#a"}, {"data.x_1", 2}}));
}

}  // namespace
}  // namespace dtrain::svg
