#include "draftfeed/common/printable.h"

#include <cstddef>
#include <cstdint>

namespace draftfeed {

namespace {

// The length of the valid UTF-8 sequence of 2 to 4 bytes at the start of `text` (no overlong
// form, no surrogate, at most U+10FFFF) and its code point, or 0.
std::size_t utf8_sequence(std::string_view text, std::uint32_t& code) {
  const auto lead = static_cast<unsigned char>(text[0]);
  std::size_t length = 0;
  std::uint32_t min = 0;
  if ((lead & 0xE0) == 0xC0) {
    length = 2, code = lead & 0x1F, min = 0x80;
  } else if ((lead & 0xF0) == 0xE0) {
    length = 3, code = lead & 0x0F, min = 0x800;
  } else if ((lead & 0xF8) == 0xF0) {
    length = 4, code = lead & 0x07, min = 0x10000;
  } else {
    return 0;
  }
  if (text.size() < length) return 0;
  for (std::size_t i = 1; i < length; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if ((c & 0xC0) != 0x80) return 0;
    code = (code << 6) | (c & 0x3F);
  }
  if (code < min || code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF)) return 0;
  return length;
}

// Code points that end or reorder a line on a terminal or in a log viewer: C1 controls, the line
// and paragraph separators, the bidirectional embeddings, overrides and isolates.
bool moves_text(std::uint32_t code) {
  return (code >= 0x80 && code <= 0x9F) || code == 0x2028 || code == 0x2029 ||
         (code >= 0x202A && code <= 0x202E) || (code >= 0x2066 && code <= 0x2069);
}

void append_escaped(std::string& out, unsigned char c) {
  static constexpr char kHex[] = "0123456789abcdef";
  out += "\\x";
  out += kHex[c >> 4];
  out += kHex[c & 0xF];
}

}  // namespace

std::string printable(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  std::size_t i = 0;
  while (i < text.size()) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7F) {
      if (c == '\\') out += '\\';
      out += static_cast<char>(c);
      ++i;
      continue;
    }
    std::uint32_t code = 0;
    const std::size_t length = c >= 0x80 ? utf8_sequence(text.substr(i), code) : 0;
    if (length > 0 && !moves_text(code)) {
      out.append(text.substr(i, length));
      i += length;
      continue;
    }
    const std::size_t escaped = length > 0 ? length : 1;
    for (std::size_t k = 0; k < escaped; ++k)
      append_escaped(out, static_cast<unsigned char>(text[i + k]));
    i += escaped;
  }
  return out;
}

}  // namespace draftfeed
