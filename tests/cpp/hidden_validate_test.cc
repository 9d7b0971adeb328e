// Sample validation (token ids, shape, dtype, NaN/Inf per layer slot), the synthetic cache's
// formula, and the whole-cache scan's counts.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "draftfeed/hidden/cache_scan.h"
#include "draftfeed/hidden/safetensors_writer.h"
#include "draftfeed/hidden/synthetic_cache.h"
#include "draftfeed/hidden/validate.h"

namespace draftfeed {
namespace {

namespace fs = std::filesystem;

#define EXPECT_CONTAINS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << (haystack)

class HiddenValidateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("draftfeed_hidden_validate_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Writes a file with the given token ids (as `id_dtype`) and F32 hidden states of `shape`
  // filled with 0.5, then `edit` applied; returns its checked file.
  std::shared_ptr<const SafetensorsFile> write(
      const std::vector<std::int64_t>& ids, std::vector<std::int64_t> shape,
      DType hidden_dtype = DType::kF32, DType id_dtype = DType::kI64,
      const std::function<void(std::vector<float>&)>& edit = nullptr) {
    std::int64_t count = 1;
    for (auto d : shape) count *= d;
    std::vector<float> values(static_cast<std::size_t>(count), 0.5f);
    if (edit) edit(values);
    std::vector<std::uint8_t> hidden;
    for (const float v : values) {
      if (hidden_dtype == DType::kF32 || hidden_dtype == DType::kI32) {
        const auto* p = reinterpret_cast<const std::uint8_t*>(&v);
        hidden.insert(hidden.end(), p, p + 4);
      } else {
        const std::uint16_t bits =
            hidden_dtype == DType::kBF16 ? float_to_bf16(v) : float_to_f16(v);
        hidden.push_back(static_cast<std::uint8_t>(bits));
        hidden.push_back(static_cast<std::uint8_t>(bits >> 8));
      }
    }
    std::vector<std::uint8_t> id_bytes;
    const unsigned width = dtype_size(id_dtype);
    for (const auto id : ids) {
      for (unsigned b = 0; b < width; ++b)
        id_bytes.push_back(static_cast<std::uint8_t>(id >> (8 * b)));
    }
    const std::vector<TensorToWrite> tensors = {
        {"token_ids", id_dtype, {static_cast<std::int64_t>(ids.size())}, id_bytes},
        {"hidden_states", hidden_dtype, shape, hidden},
    };
    const std::string path = (dir_ / ("f" + std::to_string(counter_++) + ".safetensors")).string();
    write_safetensors(path, tensors);
    return SafetensorsFile::open(path).value();
  }

  fs::path dir_;
  int counter_ = 0;
};

const std::vector<std::int64_t> kIds = {11, 12, 13};

TEST_F(HiddenValidateTest, GoodSampleInEveryDtype) {
  for (const DType dtype : {DType::kBF16, DType::kF16, DType::kF32}) {
    const SampleCheck check = validate_file(write(kIds, {3, 4, 5}, dtype), RowIds(kIds), 3);
    EXPECT_TRUE(check.ok()) << check.message;
    EXPECT_EQ(check.message, "");
  }
}

TEST_F(HiddenValidateTest, AcceptsNarrowerIntegerTokenIdsAndDatasetViews) {
  EXPECT_TRUE(validate_file(write(kIds, {3, 1, 2}, DType::kF32, DType::kI32), RowIds(kIds)).ok());
  // The row as a dataset would hand it over: int32 values, unaligned.
  std::vector<std::uint8_t> raw(1 + 12);
  for (int i = 0; i < 3; ++i) {
    const auto v = static_cast<std::int32_t>(kIds[static_cast<std::size_t>(i)]);
    std::memcpy(raw.data() + 1 + 4 * i, &v, 4);
  }
  const IntArrayView view{raw.data() + 1, 3, 4, true};
  EXPECT_TRUE(validate_file(write(kIds, {3, 1, 2}), RowIds(view)).ok());
}

TEST_F(HiddenValidateTest, TokenMismatchNamesPositionAndBothValues) {
  const std::vector<std::int64_t> row = {11, 99, 13};
  const SampleCheck check = validate_file(write(kIds, {3, 1, 2}), RowIds(row), 42);
  EXPECT_EQ(check.problem, SampleProblem::kTokenMismatch);
  EXPECT_EQ(check.error_kind(), ErrorKind::kMismatch);
  EXPECT_CONTAINS(check.message,
                  "(row 42): token_ids differ from the row's input_ids at position 1 "
                  "of 3: file has 12, row has 99");
}

TEST_F(HiddenValidateTest, TokenCountMismatch) {
  const std::vector<std::int64_t> row = {11, 12};
  const SampleCheck check = validate_file(write(kIds, {3, 1, 2}), RowIds(row));
  EXPECT_EQ(check.problem, SampleProblem::kTokenMismatch);
  EXPECT_CONTAINS(check.message, "token_ids has 3 ids but the row has 2");
}

TEST_F(HiddenValidateTest, WrongSequenceLengthOfHiddenStates) {
  const SampleCheck check = validate_file(write(kIds, {4, 1, 2}), RowIds(kIds), 0);
  EXPECT_EQ(check.problem, SampleProblem::kLengthMismatch);
  EXPECT_CONTAINS(check.message, "hidden_states has 4 positions but the row has 3 tokens");
}

TEST_F(HiddenValidateTest, WrongRankDtypeAndTokenTensor) {
  SampleCheck check = validate_file(write(kIds, {3, 2}), RowIds(kIds));
  EXPECT_EQ(check.problem, SampleProblem::kBadShape);
  EXPECT_CONTAINS(check.message, "hidden_states has shape [3, 2], expected 3-D");
  check = validate_file(write(kIds, {3, 1, 1}, DType::kI32), RowIds(kIds));
  EXPECT_EQ(check.problem, SampleProblem::kBadDtype);
  EXPECT_EQ(check.error_kind(), ErrorKind::kUnsupported);
  EXPECT_CONTAINS(check.message, "hidden_states is I32, expected BF16, F16, F32 or F8_E4M3");
  check = validate_file(write(kIds, {3, 1, 1}, DType::kF32, DType::kF64), RowIds(kIds));
  EXPECT_EQ(check.problem, SampleProblem::kBadTokenIds);
  EXPECT_CONTAINS(check.message, "token_ids is F64 [3], expected a 1-D integer tensor");
}

TEST_F(HiddenValidateTest, MissingKeyIsReportedAsSuch) {
  const std::vector<std::uint8_t> one(1);
  const std::vector<TensorToWrite> tensors = {{"token_ids", DType::kU8, {1}, one}};
  const std::string path = (dir_ / "k.safetensors").string();
  write_safetensors(path, tensors);
  const SampleCheck check = validate_file(SafetensorsFile::open(path).value(), RowIds(kIds), 5);
  EXPECT_EQ(check.problem, SampleProblem::kMissingKey);
  EXPECT_CONTAINS(check.message, "no tensor `hidden_states` (it holds `token_ids`) (row 5)");
}

TEST_F(HiddenValidateTest, NonFiniteValuesAreCountedPerLayerSlot) {
  for (const DType dtype : {DType::kBF16, DType::kF16, DType::kF32}) {
    // [3 tokens, 4 layers, 5 hidden]: NaN twice in layer 1, Inf once in layer 3 and -Inf in
    // layer 3.
    const auto file = write(kIds, {3, 4, 5}, dtype, DType::kI64, [](std::vector<float>& v) {
      auto at = [&](int t, int l, int h) -> float& {
        return v[static_cast<std::size_t>((t * 4 + l) * 5 + h)];
      };
      at(0, 1, 0) = std::numeric_limits<float>::quiet_NaN();
      at(2, 1, 4) = std::numeric_limits<float>::quiet_NaN();
      at(1, 3, 2) = std::numeric_limits<float>::infinity();
      at(2, 3, 2) = -std::numeric_limits<float>::infinity();
    });
    const SampleCheck check = validate_file(file, RowIds(kIds), 7);
    EXPECT_EQ(check.problem, SampleProblem::kNonFinite);
    EXPECT_EQ(check.error_kind(), ErrorKind::kNonFinite);
    EXPECT_EQ(check.nan_count, 2);
    EXPECT_EQ(check.inf_count, 2);
    EXPECT_EQ(check.nonfinite_layers, (std::vector<std::int64_t>{1, 3}));
    ASSERT_EQ(check.per_layer.size(), 4u);
    EXPECT_EQ(check.per_layer[1].nan, 2);
    EXPECT_EQ(check.per_layer[3].inf, 2);
    EXPECT_CONTAINS(check.message,
                    "(row 7): hidden_states has 2 NaN and 2 Inf values in layer slots 1, 3 (of 4)");
  }
}

TEST(HiddenSyntheticTest, ValuesFollowTheDocumentedFormula) {
  auto mix = [](std::uint64_t z) {
    z ^= z >> 30;
    z *= 0xBF58476D1CE4E5B9ull;
    z ^= z >> 27;
    z *= 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
  for (std::uint64_t seed : {0ull, 1ull, 12345ull}) {
    for (std::int64_t row = 0; row < 3; ++row) {
      for (std::int64_t h = 0; h < 50; ++h) {
        const std::uint64_t base =
            mix(mix(mix(mix(seed) ^ static_cast<std::uint64_t>(row)) ^ 5u) ^ 1u);
        const auto k = static_cast<float>(mix(base ^ static_cast<std::uint64_t>(h)) >> 57);
        EXPECT_EQ(synthetic_hidden_value(seed, row, 5, 1, h), (k - 64) / 16);
        const float v = synthetic_hidden_value(seed, row, 5, 1, h);
        EXPECT_GE(v, -4.0f);
        EXPECT_LE(v, 3.9375f);
        EXPECT_EQ(bf16_to_float(float_to_bf16(v)), v) << "exactly representable in bf16";
      }
    }
  }
}

class HiddenScanTest : public HiddenValidateTest {};

TEST_F(HiddenScanTest, SyntheticCacheValidatesAndEveryDefectIsCounted) {
  std::vector<std::vector<std::int64_t>> rows;
  for (std::int64_t r = 0; r < 40; ++r) {
    std::vector<std::int64_t> ids;
    for (std::int64_t t = 0; t < 5 + r % 7; ++t) ids.push_back(r * 1000 + t);
    rows.push_back(ids);
  }
  const std::string root = (dir_ / "cache").string();
  SyntheticHiddenStateSpec spec;
  spec.seed = 3;
  spec.hidden_size = 16;
  spec.layers = 4;
  spec.dtype = DType::kBF16;
  spec.threads = 3;
  const auto stats = write_synthetic_hidden_states(root, rows, spec);
  EXPECT_EQ(stats.files, 40);

  CacheStoreOptions o;
  o.root = root;
  o.lock_mode = LockMode::kProbe;
  const CacheStore store(o);
  // The file's values are the formula's.
  {
    auto found = store.lookup(9);
    ASSERT_TRUE(found.ok() && found.value().has_value());
    const TensorView& hs = found.value()->hidden_states;
    ASSERT_EQ(hs.shape, (std::vector<std::int64_t>{7, 4, 16}));
    std::uint16_t bits;
    std::memcpy(&bits, hs.data + 2 * ((3 * 4 + 2) * 16 + 5), 2);
    EXPECT_EQ(bf16_to_float(bits), synthetic_hidden_value(3, 9, 3, 2, 5));
  }
  // Defects: row 1 missing, row 2 corrupt (truncated), row 3 mismatched, row 4 non-finite.
  fs::remove(store.path_for(1));
  fs::resize_file(store.path_for(2), fs::file_size(store.path_for(2)) - 1);
  rows[3][0] = -5;
  {
    std::vector<std::uint16_t> hidden(static_cast<std::size_t>(rows[4].size() * 4 * 16), 0);
    hidden[17] = 0x7FC0;  // NaN in layer 1
    const std::vector<TensorToWrite> tensors = {
        {"token_ids",
         DType::kI64,
         {static_cast<std::int64_t>(rows[4].size())},
         {reinterpret_cast<const std::uint8_t*>(rows[4].data()), rows[4].size() * 8}},
        {"hidden_states",
         DType::kBF16,
         {static_cast<std::int64_t>(rows[4].size()), 4, 16},
         {reinterpret_cast<const std::uint8_t*>(hidden.data()), hidden.size() * 2}},
    };
    write_safetensors(store.path_for(4), tensors);
  }
  for (const ScanMode mode : {ScanMode::kValidate, ScanMode::kMemcpy, ScanMode::kRead}) {
    CacheScanOptions options;
    options.threads = 3;
    options.mode = mode;
    const auto report = scan_cache(
        store, 40, [&rows](std::int64_t r) { return RowIds(rows[static_cast<std::size_t>(r)]); },
        options);
    EXPECT_EQ(report.rows, 40);
    EXPECT_EQ(report.count(ScanStatus::kMissing), 1);
    EXPECT_EQ(report.count(ScanStatus::kCorrupt), 1);
    if (mode == ScanMode::kValidate) {
      EXPECT_EQ(report.count(ScanStatus::kOk), 36);
      EXPECT_EQ(report.count(ScanStatus::kMismatched), 1);
      EXPECT_EQ(report.count(ScanStatus::kNonFinite), 1);
      EXPECT_FALSE(report.clean());
      ASSERT_EQ(report.examples[static_cast<std::size_t>(ScanStatus::kNonFinite)].size(), 1u);
      EXPECT_EQ(report.examples[static_cast<std::size_t>(ScanStatus::kNonFinite)][0].row, 4);
      EXPECT_CONTAINS(report.examples[static_cast<std::size_t>(ScanStatus::kCorrupt)][0].reason,
                      "truncated");
    } else {
      EXPECT_EQ(report.count(ScanStatus::kOk), 38);
    }
    EXPECT_GT(report.bytes, 0u);
  }
}

// The read-only baseline reads every byte of every file: its checksum (XOR of the files' 8-byte
// little-endian words, each file's tail zero-padded) equals one computed here from the files'
// bytes, whatever the thread count.
TEST_F(HiddenScanTest, ReadBaselineReadsEveryByte) {
  std::vector<std::vector<std::int64_t>> rows;
  for (std::int64_t r = 0; r < 21; ++r) {
    std::vector<std::int64_t> ids;
    for (std::int64_t t = 0; t < 3 + r % 5; ++t) ids.push_back(r * 100 + t);
    rows.push_back(ids);
  }
  const std::string root = (dir_ / "cache").string();
  SyntheticHiddenStateSpec spec;
  spec.seed = 5;
  spec.hidden_size = 13;  // odd sizes: file lengths that are not multiples of 8 or 32
  spec.layers = 3;
  spec.dtype = DType::kBF16;
  write_synthetic_hidden_states(root, rows, spec);
  CacheStoreOptions o;
  o.root = root;
  o.lock_mode = LockMode::kProbe;
  const CacheStore store(o);

  std::uint64_t expected = 0;
  std::uint64_t total = 0;
  for (std::int64_t r = 0; r < 21; ++r) {
    std::ifstream in(store.path_for(r), std::ios::binary);
    const std::vector<char> bytes((std::istreambuf_iterator<char>(in)),
                                  std::istreambuf_iterator<char>());
    total += bytes.size();
    for (std::size_t i = 0; i < bytes.size(); ++i) {
      expected ^= static_cast<std::uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * (i % 8));
    }
  }
  for (const unsigned threads : {1u, 3u}) {
    CacheScanOptions options;
    options.threads = threads;
    options.mode = ScanMode::kRead;
    const auto report = scan_cache(
        store, 21, [&rows](std::int64_t r) { return RowIds(rows[static_cast<std::size_t>(r)]); },
        options);
    EXPECT_EQ(report.count(ScanStatus::kOk), 21);
    EXPECT_EQ(report.bytes, total);
    EXPECT_EQ(report.read_checksum, expected) << threads << " threads";
  }
}

}  // namespace
}  // namespace draftfeed
