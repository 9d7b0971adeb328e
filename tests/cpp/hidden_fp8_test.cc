// FP8 files in the store: validation of hs-connectors' scales (dtype, shape, values), the sample
// handed to the batch copy, and the cache conversion (in place, into a folder, resumed). The
// files' bytes against hs-connectors' own are checked in tests/python/test_fp8_*.py.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "draftfeed/common/fp8.h"
#include "draftfeed/hidden/fp8_convert.h"
#include "draftfeed/hidden/fp8_quantize.h"
#include "draftfeed/hidden/safetensors_writer.h"
#include "draftfeed/hidden/synthetic_cache.h"
#include "draftfeed/hidden/validate.h"
#include "draftfeed/source/cache_source.h"
#include "temp_folder.h"

namespace draftfeed {
namespace {

#define EXPECT_CONTAINS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << (haystack)

const std::vector<std::int64_t> kIds = {11, 12, 13};

template <typename T>
std::span<const std::uint8_t> bytes_of(const std::vector<T>& v) {
  return {reinterpret_cast<const std::uint8_t*>(v.data()), v.size() * sizeof(T)};
}

class HiddenFp8Test : public TempFolderTest {
 protected:
  void SetUp() override { make_temp_folder("hidden_fp8"); }

  // An FP8 file for kIds: codes [3, 2, 4] of 0x38 (1.0), scales as given (F32 [3, 1, 1] unless
  // `scale_shape` says otherwise); `with_scales` false leaves the key out.
  std::shared_ptr<const SafetensorsFile> write_fp8(
      std::vector<float> scales, std::vector<std::int64_t> scale_shape = {3, 1, 1},
      bool with_scales = true, DType states = DType::kF8E4M3) {
    const std::vector<std::uint8_t> codes(3 * 2 * 4 * (states == DType::kF8E4M3 ? 1 : 2), 0x38);
    std::vector<TensorToWrite> tensors = {
        {"token_ids", DType::kI64, {3}, bytes_of(kIds)},
        {"hidden_states", states, {3, 2, 4}, codes},
    };
    if (with_scales) {
      tensors.push_back({"hidden_states_scales", DType::kF32, scale_shape, bytes_of(scales)});
    }
    const std::string path = (dir_ / ("f" + std::to_string(counter_++) + ".safetensors")).string();
    write_safetensors(path, tensors);
    return SafetensorsFile::open(path).value();
  }

  int counter_ = 0;
};

TEST_F(HiddenFp8Test, GoodFileIsAcceptedAndDequantizedInTheChosenDtype) {
  const auto file = write_fp8({0.5f, 1e-12f, 3.0f});
  HiddenStateSample sample;
  const SampleCheck check = validate_file(file, RowIds(kIds), 4, &sample);
  ASSERT_TRUE(check.ok()) << check.message;
  const std::vector<std::int64_t> row = kIds;
  const IntArrayView ids{reinterpret_cast<const std::uint8_t*>(row.data()), 3, 8, true};
  const FetchOutcome outcome = CacheSampleSource::check(4, ids, sample, DType::kF32);
  ASSERT_TRUE(outcome.sample.has_value()) << outcome.message;
  const HiddenStatesView& hs = outcome.sample->hidden;
  EXPECT_EQ(hs.dtype, DType::kF8E4M3);
  EXPECT_EQ(hs.dequantize, DType::kF32);
  ASSERT_NE(hs.scales, nullptr);
  float second;
  std::memcpy(&second, hs.scales + 4, 4);
  EXPECT_EQ(second, 1e-12f);
}

TEST_F(HiddenFp8Test, ScaleValuesMustBeFiniteAndPositive) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  for (const auto& [scales, shown] : std::vector<std::pair<std::vector<float>, std::string>>{
           {{1.0f, -0.25f, 1.0f}, "token 1, -0.25"},
           {{0.0f, 1.0f, 1.0f}, "token 0, 0"},
           {{1.0f, 1.0f, nan}, "token 2, nan"},
           {{inf, -1.0f, 1.0f}, "token 0, inf"}}) {
    const SampleCheck check = validate_file(write_fp8(scales), RowIds(kIds), 9);
    EXPECT_EQ(check.problem, SampleProblem::kBadScales);
    EXPECT_EQ(check.error_kind(), ErrorKind::kFormat);
    EXPECT_CONTAINS(check.message, "(row 9): hidden_states_scales has");
    EXPECT_CONTAINS(check.message, "not finite and positive (first: " + shown + ")");
  }
  const SampleCheck two = validate_file(write_fp8({-1.0f, 1.0f, -2.0f}), RowIds(kIds));
  EXPECT_CONTAINS(two.message, "has 2 of 3 scales");
  EXPECT_TRUE(validate_file(write_fp8({1e-45f, 1e38f, 1.0f}), RowIds(kIds)).ok());
}

TEST_F(HiddenFp8Test, ScalesMustBeThereAndShapedOnePerToken) {
  SampleCheck check = validate_file(write_fp8({}, {}, false), RowIds(kIds));
  EXPECT_EQ(check.problem, SampleProblem::kBadScales);
  EXPECT_CONTAINS(check.message, "hidden_states is F8_E4M3 but there is no hidden_states_scales");
  check = validate_file(write_fp8({1, 1, 1}, {3}), RowIds(kIds));
  EXPECT_CONTAINS(check.message, "hidden_states_scales is F32 [3], expected F32 [3, 1, 1]");
  check = validate_file(write_fp8({1, 1}, {2, 1, 1}), RowIds(kIds));
  EXPECT_CONTAINS(check.message, "hidden_states_scales is F32 [2, 1, 1], expected F32 [3, 1, 1]");
  check = validate_file(write_fp8({1, 1, 1}, {3, 1, 1}, true, DType::kBF16), RowIds(kIds));
  EXPECT_EQ(check.problem, SampleProblem::kBadScales);
  EXPECT_CONTAINS(check.message, "only used with F8_E4M3 hidden states, but hidden_states is BF16");
}

TEST_F(HiddenFp8Test, NanCodesAreNonFinite) {
  const std::vector<std::uint8_t> codes = {0x38, 0x7F, 0xFF, 0x00, 0x38, 0x38};
  const std::vector<float> scales = {1.0f, 1.0f, 1.0f};
  const std::vector<TensorToWrite> tensors = {
      {"token_ids", DType::kI64, {3}, bytes_of(kIds)},
      {"hidden_states", DType::kF8E4M3, {3, 2, 1}, codes},
      {"hidden_states_scales", DType::kF32, {3, 1, 1}, bytes_of(scales)},
  };
  const std::string path = (dir_ / "nan.safetensors").string();
  write_safetensors(path, tensors);
  const SampleCheck check = validate_file(SafetensorsFile::open(path).value(), RowIds(kIds));
  EXPECT_EQ(check.problem, SampleProblem::kNonFinite);
  EXPECT_EQ(check.nan_count, 2);
  EXPECT_EQ(check.nonfinite_layers, (std::vector<std::int64_t>{0, 1}));
}

TEST_F(HiddenFp8Test, QuantizerFollowsHsConnectorsFormula) {
  // Token 0: amax 4 -> scale 4/448; token 1: all zero -> scale 1e-12, codes 0 (and -0 -> 0x80).
  const std::vector<float> values = {4.0f, -1.0f, 0.5f, 0.0f, 0.0f, -0.0f};
  std::vector<std::uint8_t> codes(6);
  std::vector<float> scales(2);
  quantize_fp8(reinterpret_cast<const std::uint8_t*>(values.data()), DType::kF32, 2, 3,
               codes.data(), scales.data());
  EXPECT_EQ(scales[0], 4.0f / 448.0f);
  EXPECT_EQ(scales[1], kFp8MinScale);
  EXPECT_EQ(codes[0], float_to_fp8_e4m3(4.0f / scales[0]));
  EXPECT_EQ(fp8_e4m3_to_float(codes[0]), 448.0f);
  EXPECT_EQ(codes[1], float_to_fp8_e4m3(-1.0f / scales[0]));
  EXPECT_EQ(codes[3], 0x00);
  EXPECT_EQ(codes[5], 0x80);
}

// A synthetic bf16 cache of `rows` rows of 5 tokens (ids 100 * row + t) under dir_/cache.
std::vector<std::vector<std::int64_t>> write_cache(const std::filesystem::path& root, int rows) {
  std::vector<std::vector<std::int64_t>> ids(static_cast<std::size_t>(rows));
  for (int r = 0; r < rows; ++r) {
    for (int t = 0; t < 5; ++t) ids[static_cast<std::size_t>(r)].push_back(100 * r + t);
  }
  SyntheticHiddenStateSpec spec;
  spec.hidden_size = 8;
  spec.layers = 3;
  spec.threads = 2;
  write_synthetic_hidden_states(root.string(), ids, spec);
  return ids;
}

CacheStore probe_store(const std::filesystem::path& root) {
  CacheStoreOptions options;
  options.root = root.string();
  options.lock_mode = LockMode::kProbe;
  return CacheStore(options);
}

TEST_F(HiddenFp8Test, ConvertsIntoAFolderThenResumesAndSkipsBadFiles) {
  const auto ids = write_cache(dir_ / "cache", 10);
  std::filesystem::remove(dir_ / "cache" / "hs_3.safetensors");
  {
    std::FILE* f = std::fopen((dir_ / "cache" / "hs_6.safetensors").c_str(), "wb");
    std::fputs("not a safetensors file", f);
    std::fclose(f);
  }
  const CacheStore source = probe_store(dir_ / "cache");
  auto ids_of = [&ids](std::int64_t row) {
    return RowIds(std::span<const std::int64_t>(ids[static_cast<std::size_t>(row)]));
  };
  CacheConvertOptions options;
  options.rewrite.target_root = (dir_ / "fp8").string();
  options.rewrite.threads = 3;
  CacheRewriteProgress progress;
  const CacheConvertReport first = convert_cache_to_fp8(source, 0, 10, ids_of, options, &progress);
  EXPECT_EQ(first.converted, 8);
  EXPECT_EQ(first.missing, 1);
  EXPECT_EQ(first.skipped[static_cast<std::size_t>(ScanStatus::kCorrupt)], 1);
  EXPECT_EQ(first.examples[static_cast<std::size_t>(ScanStatus::kCorrupt)][0].row, 6);
  EXPECT_EQ(progress.rows_done.load(), 10);
  EXPECT_EQ(progress.bytes_after.load(), first.bytes_after);
  EXPECT_LT(first.bytes_after, first.bytes_before);
  const CacheStore target = probe_store(dir_ / "fp8");
  for (std::int64_t row : {0, 9}) {
    const auto sample = target.lookup(row).value();
    ASSERT_TRUE(sample.has_value());
    EXPECT_EQ(sample->hidden_states.dtype, DType::kF8E4M3);
    EXPECT_TRUE(validate_sample(*sample, ids_of(row), row).ok());
  }
  std::filesystem::remove(dir_ / "fp8" / "hs_9.safetensors");
  const CacheConvertReport second = convert_cache_to_fp8(source, 0, 10, ids_of, options);
  EXPECT_EQ(second.converted, 1);
  EXPECT_EQ(second.already_fp8, 7);
  EXPECT_EQ(second.bytes_after, first.bytes_after);
}

TEST_F(HiddenFp8Test, ConvertsInPlaceAndAgainIsANoOp) {
  const auto ids = write_cache(dir_ / "cache", 4);
  const CacheStore store = probe_store(dir_ / "cache");
  auto ids_of = [&ids](std::int64_t row) {
    return RowIds(std::span<const std::int64_t>(ids[static_cast<std::size_t>(row)]));
  };
  const CacheConvertReport first = convert_cache_to_fp8(store, 0, 4, ids_of, {});
  EXPECT_EQ(first.converted, 4);
  const CacheConvertReport second = convert_cache_to_fp8(store, 0, 4, ids_of, {});
  EXPECT_EQ(second.converted, 0);
  EXPECT_EQ(second.already_fp8, 4);
  EXPECT_EQ(second.bytes_before, first.bytes_after);
  // The cache's files, and the writer lock the conversion held (common/folder_lock.h), which
  // stays: nothing else (no temporary left behind).
  for (const auto& entry : std::filesystem::directory_iterator(dir_ / "cache")) {
    const std::string name = entry.path().filename().string();
    EXPECT_TRUE(name.rfind("hs_", 0) == 0 || name == kWriterLockName) << entry.path();
  }
}

}  // namespace
}  // namespace draftfeed
