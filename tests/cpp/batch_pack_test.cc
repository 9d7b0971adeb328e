// The native collate for a preprocess callable (batch/pack.h) on hand-made samples: truncation at
// max_len per key, conversions, document ids, and the errors. The comparison with speculators'
// own collate is in tests/python/test_pack.py; this runs under the sanitizers.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "draftfeed/batch/pack.h"
#include "draftfeed/common/error.h"

namespace draftfeed {
namespace {

template <typename T>
TensorArg tensor(const std::vector<T>& values, DType dtype, std::vector<std::int64_t> shape) {
  std::int64_t row = static_cast<std::int64_t>(sizeof(T));
  for (std::size_t d = 1; d < shape.size(); ++d) row *= shape[d];
  return TensorArg{reinterpret_cast<const std::uint8_t*>(values.data()), dtype, std::move(shape),
                   row};
}

TEST(BatchPackTest, PacksPerKeyTruncatesAtMaxLenAndConverts) {
  // Sample 0: 3 rows of f32 hidden (width 2), ids int32; sample 1: 4 rows, hidden bf16.
  const std::vector<float> h0{1, 2, 3, 4, 5, 6};
  const std::vector<std::int32_t> ids0{10, 11, 12};
  const std::vector<std::int64_t> len0{3};
  const std::vector<std::uint16_t> h1{float_to_bf16(7),  float_to_bf16(8),  float_to_bf16(9),
                                      float_to_bf16(10), float_to_bf16(11), float_to_bf16(12),
                                      float_to_bf16(13), float_to_bf16(14)};
  const std::vector<std::int64_t> ids1{20, 21, 22, 23};
  const std::vector<std::int64_t> len1{4};
  SampleArg a{{"hidden_states", "input_ids", "lengths"},
              {tensor(h0, DType::kF32, {3, 2}), tensor(ids0, DType::kI32, {3}),
               tensor(len0, DType::kI64, {1})}};
  SampleArg b{{"input_ids", "lengths", "hidden_states"},
              {tensor(ids1, DType::kI64, {4}), tensor(len1, DType::kI64, {1}),
               tensor(h1, DType::kBF16, {4, 2})}};
  const std::vector<SampleArg> samples{a, b};
  const PackedLayout layout = layout_packed(samples, 5, DType::kBF16);
  ASSERT_EQ(layout.tensors.size(), 3u);
  EXPECT_EQ(layout.tensors[0].name, "hidden_states");
  EXPECT_EQ(layout.tensors[0].dtype, DType::kBF16);
  EXPECT_EQ(layout.tensors[1].name, "input_ids");
  EXPECT_EQ(layout.tensors[1].dtype, DType::kI32);  // the first sample's dtype
  EXPECT_EQ(layout.tensors[2].name, "document_ids");
  std::vector<std::uint8_t> out(layout.total_bytes, 0xAB);
  pack_samples(samples, 5, layout, out.data());
  const auto* hs = reinterpret_cast<const std::uint16_t*>(out.data() + layout.tensors[0].offset);
  const std::vector<float> want{1, 2, 3, 4, 5, 6, 7, 8, 9, 10};  // 3 rows + 2 of 4: max_len 5
  for (std::size_t i = 0; i < want.size(); ++i) EXPECT_EQ(bf16_to_float(hs[i]), want[i]) << i;
  const auto* ids = reinterpret_cast<const std::int32_t*>(out.data() + layout.tensors[1].offset);
  EXPECT_EQ(std::vector<std::int32_t>(ids, ids + 5),
            (std::vector<std::int32_t>{10, 11, 12, 20, 21}));
  const auto* docs = reinterpret_cast<const std::int64_t*>(out.data() + layout.tensors[2].offset);
  EXPECT_EQ(std::vector<std::int64_t>(docs, docs + 5), (std::vector<std::int64_t>{0, 0, 0, 1, 1}));
}

TEST(BatchPackTest, RefusesWhatTheCollateCannotPack) {
  const std::vector<float> h{1, 2};
  const std::vector<std::int64_t> len{1};
  const std::vector<std::int64_t> negative{-2};
  SampleArg a{{"hidden_states", "lengths"},
              {tensor(h, DType::kF32, {1, 2}), tensor(len, DType::kI64, {1})}};
  SampleArg wide{{"hidden_states", "lengths"},
                 {tensor(h, DType::kF32, {2, 1}), tensor(len, DType::kI64, {1})}};
  SampleArg no_lengths{{"hidden_states"}, {tensor(h, DType::kF32, {1, 2})}};
  SampleArg bad_length{{"hidden_states", "lengths"},
                       {tensor(h, DType::kF32, {1, 2}), tensor(negative, DType::kI64, {1})}};
  EXPECT_THROW(layout_packed({}, 4, DType::kBF16), Error);
  EXPECT_THROW(layout_packed({a, wide}, 4, DType::kBF16), Error);
  EXPECT_THROW(layout_packed({a, no_lengths}, 4, DType::kBF16), Error);
  EXPECT_THROW(layout_packed({a}, 4, DType::kF16), Error);
  const PackedLayout layout = layout_packed({a, bad_length}, 4, DType::kBF16);
  std::vector<std::uint8_t> out(layout.total_bytes);
  EXPECT_THROW(pack_samples({a, bad_length}, 4, layout, out.data()), Error);
}

}  // namespace
}  // namespace draftfeed
