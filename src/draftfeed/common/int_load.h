// Loads one little-endian integer of any Arrow width from possibly unaligned bytes.
#pragma once

#include <cstdint>
#include <cstring>

namespace draftfeed {

inline std::int64_t load_int(const std::uint8_t* p, std::uint8_t byte_width, bool is_signed) {
  switch (byte_width) {
    case 1:
      return is_signed ? static_cast<std::int64_t>(static_cast<std::int8_t>(*p))
                       : static_cast<std::int64_t>(*p);
    case 2: {
      std::uint16_t v;
      std::memcpy(&v, p, 2);
      return is_signed ? static_cast<std::int64_t>(static_cast<std::int16_t>(v))
                       : static_cast<std::int64_t>(v);
    }
    case 4: {
      std::uint32_t v;
      std::memcpy(&v, p, 4);
      return is_signed ? static_cast<std::int64_t>(static_cast<std::int32_t>(v))
                       : static_cast<std::int64_t>(v);
    }
    default: {
      // uint64 values past INT64_MAX wrap to negative: token ids and lengths never get there,
      // and the readers of lengths reject negatives.
      std::int64_t v;
      std::memcpy(&v, p, 8);
      return v;
    }
  }
}

}  // namespace draftfeed
