// IntArrayView over every Arrow integer width, signed and unsigned, at unaligned addresses.
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <vector>

#include "draftfeed/dataset/token_dataset.h"

namespace draftfeed {
namespace {

// Stores `values` as T at byte offset 1 of a buffer (so multi-byte loads are unaligned).
template <typename T>
std::vector<std::uint8_t> unaligned_bytes(const std::vector<T>& values) {
  std::vector<std::uint8_t> bytes(1 + values.size() * sizeof(T));
  std::memcpy(bytes.data() + 1, values.data(), values.size() * sizeof(T));
  return bytes;
}

template <typename T>
void check_width() {
  const std::vector<T> values{std::numeric_limits<T>::min(), static_cast<T>(0), static_cast<T>(1),
                              static_cast<T>(std::numeric_limits<T>::max() / 3),
                              std::numeric_limits<T>::max()};
  const auto bytes = unaligned_bytes(values);
  const IntArrayView view{bytes.data() + 1, static_cast<std::int64_t>(values.size()), sizeof(T),
                          std::numeric_limits<T>::is_signed};
  std::vector<std::int64_t> widened(values.size());
  view.copy_to(widened.data());
  for (std::size_t i = 0; i < values.size(); ++i) {
    EXPECT_EQ(view[static_cast<std::int64_t>(i)], static_cast<std::int64_t>(values[i])) << i;
    EXPECT_EQ(widened[i], static_cast<std::int64_t>(values[i])) << i;
  }
  EXPECT_TRUE(view.equals(widened));
  widened.back() -= 1;
  EXPECT_FALSE(view.equals(widened));
  widened.pop_back();
  EXPECT_FALSE(view.equals(widened));  // lengths differ
}

TEST(DatasetIntArrayView, EveryWidthAndSignedness) {
  check_width<std::int8_t>();
  check_width<std::uint8_t>();
  check_width<std::int16_t>();
  check_width<std::uint16_t>();
  check_width<std::int32_t>();
  check_width<std::uint32_t>();
  check_width<std::int64_t>();
}

TEST(DatasetIntArrayView, Uint64WrapsPastInt64Max) {
  const std::vector<std::uint64_t> values{5, std::numeric_limits<std::uint64_t>::max()};
  const auto bytes = unaligned_bytes(values);
  const IntArrayView view{bytes.data() + 1, 2, 8, false};
  EXPECT_EQ(view[0], 5);
  EXPECT_EQ(view[1], -1);  // documented: token ids and lengths never get there
}

// A view of no elements, over real bytes and over none (an empty row of an empty batch): it equals
// only the empty list, whatever its bytes hold, and widening it writes nothing.
TEST(DatasetIntArrayView, EmptyViewEqualsOnlyTheEmptyListAndWritesNothing) {
  const std::vector<std::int64_t> first{42};
  const auto bytes = unaligned_bytes(std::vector<std::int64_t>{42, 43});
  for (const std::uint8_t width : {1, 2, 4, 8}) {
    for (const std::uint8_t* data : {static_cast<const std::uint8_t*>(nullptr), bytes.data() + 1}) {
      const IntArrayView view{data, 0, width, true};
      EXPECT_EQ(view.size(), 0);
      EXPECT_TRUE(view.equals({}));
      EXPECT_FALSE(view.equals(first)) << "width " << int{width};
      std::vector<std::int64_t> out{-7, -7};
      view.copy_to(out.data());
      EXPECT_EQ(out, (std::vector<std::int64_t>{-7, -7})) << "width " << int{width};
    }
  }
  const IntArrayView one{bytes.data() + 1, 1, 8, true};
  EXPECT_FALSE(one.equals({})) << "a non-empty view is not the empty list";
  EXPECT_TRUE(one.equals(first));
}

}  // namespace
}  // namespace draftfeed
