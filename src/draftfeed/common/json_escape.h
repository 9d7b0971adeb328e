// Escaping one byte of a JSON string literal, shared by the writers that build JSON text by hand
// (safetensors headers, dataset values sent to vLLM): quote, backslash and control characters are
// escaped as serde_json and Python's json do (\b \f \n \r \t, else \u00XX); every other byte,
// including UTF-8 continuation bytes, is copied as it is (callers check UTF-8 themselves if
// needed).
#pragma once

#include <string>

namespace draftfeed {

inline void append_json_escaped(std::string& out, unsigned char c) {
  static constexpr char kHex[] = "0123456789abcdef";
  switch (c) {
    case '"':
      out += "\\\"";
      break;
    case '\\':
      out += "\\\\";
      break;
    case '\b':
      out += "\\b";
      break;
    case '\f':
      out += "\\f";
      break;
    case '\n':
      out += "\\n";
      break;
    case '\r':
      out += "\\r";
      break;
    case '\t':
      out += "\\t";
      break;
    default:
      if (c < 0x20) {
        out += "\\u00";
        out += kHex[c >> 4];
        out += kHex[c & 0xF];
      } else {
        out += static_cast<char>(c);
      }
  }
}

}  // namespace draftfeed
