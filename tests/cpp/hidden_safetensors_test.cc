// safetensors reading and writing: every layout rule gives its own clear message; the writer's
// files parse back to the same tensors. (Compatibility with the real package is tested in
// tests/python/test_hidden_safetensors.py.)
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "draftfeed/hidden/safetensors.h"
#include "draftfeed/hidden/safetensors_writer.h"

namespace draftfeed {
namespace {

std::vector<std::uint8_t> file_bytes(const std::string& header, std::size_t buffer_bytes,
                                     std::uint64_t declared_size = UINT64_MAX) {
  const std::uint64_t n = declared_size == UINT64_MAX ? header.size() : declared_size;
  std::vector<std::uint8_t> out(8);
  for (int i = 0; i < 8; ++i)
    out[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(n >> (8 * i));
  out.insert(out.end(), header.begin(), header.end());
  for (std::size_t i = 0; i < buffer_bytes; ++i) out.push_back(static_cast<std::uint8_t>(i * 7));
  return out;
}

// The parse error's message, or "" when the bytes parse.
std::string parse_error(const std::vector<std::uint8_t>& bytes) {
  auto result = parse_safetensors(bytes, "test.safetensors");
  if (result.ok()) return "";
  EXPECT_EQ(result.error().kind(), ErrorKind::kFormat);
  return result.error().what();
}

#define EXPECT_CONTAINS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << (haystack)

const std::string kTwoTensors = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                R"("b":{"dtype":"I64","shape":[1,1],"data_offsets":[8,16]}})";

TEST(HiddenSafetensorsTest, ParsesTensorsInFileOrderWithViewsIntoTheBytes) {
  const auto bytes = file_bytes(kTwoTensors, 16);
  auto layout = parse_safetensors(bytes, "x");
  ASSERT_TRUE(layout.ok()) << layout.error().what();
  ASSERT_EQ(layout->tensors.size(), 2u);
  const TensorView& a = layout->tensors[0];
  EXPECT_EQ(a.name, "a");
  EXPECT_EQ(a.dtype, DType::kF32);
  EXPECT_EQ(a.shape, (std::vector<std::int64_t>{2}));
  EXPECT_EQ(a.nbytes, 8u);
  EXPECT_EQ(a.data, bytes.data() + 8 + kTwoTensors.size());
  EXPECT_EQ(a.file_offset, 8 + kTwoTensors.size());
  EXPECT_EQ(layout->tensors[1].name, "b");
  EXPECT_EQ(layout->tensors[1].num_elements(), 1);
  EXPECT_FALSE(layout->has_metadata);
}

TEST(HiddenSafetensorsTest, ReadsMetadataAndIgnoresUnknownFields) {
  const std::string header =
      R"( {"__metadata__":{"format":"pt","k":"v"},"t":{"dtype":"U8","shape":[3],)"
      R"("data_offsets":[0,3],"extra":{"nested":[1,{"x":null}]}}}   )";
  auto layout = parse_safetensors(file_bytes(header, 3), "x");
  ASSERT_TRUE(layout.ok()) << layout.error().what();
  EXPECT_TRUE(layout->has_metadata);
  EXPECT_EQ(layout->metadata.at("format"), "pt");
  EXPECT_EQ(layout->metadata.at("k"), "v");
  ASSERT_EQ(layout->tensors.size(), 1u);
}

TEST(HiddenSafetensorsTest, AcceptsEmptyFilesZeroSizedTensorsScalarsAndNullMetadata) {
  EXPECT_EQ(parse_error(file_bytes("{}", 0)), "");
  EXPECT_EQ(parse_error(file_bytes(R"({"__metadata__":null})", 0)), "");
  EXPECT_EQ(parse_error(file_bytes(R"({"z":{"dtype":"F32","shape":[0,3],"data_offsets":[0,0]},)"
                                   R"("s":{"dtype":"F64","shape":[],"data_offsets":[0,8]}})",
                                   8)),
            "");
}

TEST(HiddenSafetensorsTest, NeverRequiresAlignment) {
  // Pad the header to an odd length: the data then starts at an odd offset.
  std::string padded = R"({"a":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]}})";
  if (padded.size() % 2 == 0) padded += ' ';
  auto layout = parse_safetensors(file_bytes(padded, 4), "x");
  ASSERT_TRUE(layout.ok()) << layout.error().what();
  EXPECT_EQ(layout->tensors[0].file_offset % 2, 1u);
}

TEST(HiddenSafetensorsTest, ShortFileIsRefused) {
  const std::vector<std::uint8_t> three = {1, 2, 3};
  const std::string message = parse_error(three);
  EXPECT_CONTAINS(message,
                  "test.safetensors: file is 3 bytes, shorter than the 8-byte header size");
}

TEST(HiddenSafetensorsTest, HugeHeaderSizeIsRefused) {
  const std::string message = parse_error(file_bytes("{}", 0, 100'000'001));
  EXPECT_CONTAINS(message, "header size 100000001 exceeds the limit of 100000000 bytes");
  EXPECT_CONTAINS(parse_error(file_bytes("{}", 0, UINT64_MAX - 1)), "exceeds the limit");
}

TEST(HiddenSafetensorsTest, HeaderLongerThanTheFileIsRefused) {
  const std::string message = parse_error(file_bytes("{}", 0, 50));
  EXPECT_CONTAINS(message,
                  "header size 50 runs past the end of the file (2 bytes after the size field)");
}

TEST(HiddenSafetensorsTest, NonJsonAndNonObjectHeadersAreRefused) {
  EXPECT_CONTAINS(parse_error(file_bytes("hello", 0)), "header is not valid JSON");
  EXPECT_CONTAINS(parse_error(file_bytes("[]", 0)), "header is an array, not a JSON object");
  EXPECT_CONTAINS(parse_error(file_bytes("42", 0)), "header is a number, not a JSON object");
  EXPECT_CONTAINS(parse_error(file_bytes(std::string("{}\0", 3), 0)),
                  "header is not valid JSON: a NUL byte at offset 2");
  EXPECT_CONTAINS(parse_error(file_bytes("{} {}", 0)), "not valid JSON");
  EXPECT_CONTAINS(parse_error(file_bytes("{\"\xff\":1}", 0)), "not valid JSON");
}

TEST(HiddenSafetensorsTest, DeepNestingIsRefusedWithoutRecursion) {
  std::string header = R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[0,0],"x":)";
  header += std::string(100000, '[') + std::string(100000, ']') + "}}";
  EXPECT_CONTAINS(parse_error(file_bytes(header, 0)), "header JSON nested deeper than 64 levels");
}

TEST(HiddenSafetensorsTest, UnknownDtypeIsRefused) {
  const std::string message =
      parse_error(file_bytes(R"({"a":{"dtype":"X32","shape":[2],"data_offsets":[0,8]}})", 8));
  EXPECT_CONTAINS(message, "tensor `a` has the unknown dtype 'X32'");
  EXPECT_CONTAINS(
      parse_error(file_bytes(R"({"a":{"dtype":"f32","shape":[2],"data_offsets":[0,8]}})", 8)),
      "unknown dtype 'f32'");
}

TEST(HiddenSafetensorsTest, MalformedTensorEntriesAreRefused) {
  EXPECT_CONTAINS(parse_error(file_bytes(R"({"a":{"dtype":"F32","data_offsets":[0,8]}})", 8)),
                  "tensor `a` has no `shape`");
  EXPECT_CONTAINS(
      parse_error(file_bytes(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,8]}})", 8)),
      "the negative number -1 in its shape");
  EXPECT_CONTAINS(
      parse_error(file_bytes(R"({"a":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})", 8)),
      "the non-integer number 2.0 in its shape");
  EXPECT_CONTAINS(
      parse_error(file_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8,8]}})", 8)),
      "more than 2 data_offsets");
  EXPECT_CONTAINS(
      parse_error(file_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", 8)),
      "has 1 data_offsets, expected 2");
  EXPECT_CONTAINS(parse_error(file_bytes(R"({"a":[1]})", 0)),
                  "tensor `a` is an array, not an object");
  EXPECT_CONTAINS(
      parse_error(file_bytes(R"({"a":{"dtype":7,"shape":[],"data_offsets":[0,0]}})", 0)),
      "tensor `a` has a number as its `dtype`");
}

TEST(HiddenSafetensorsTest, MetadataMustMapStringsToStrings) {
  EXPECT_CONTAINS(parse_error(file_bytes(R"({"__metadata__":{"k":1}})", 0)),
                  "metadata value of `k` is a number, not a string");
  EXPECT_CONTAINS(parse_error(file_bytes(R"({"__metadata__":[]})", 0)),
                  "`__metadata__` is an array, not an object of strings");
}

TEST(HiddenSafetensorsTest, DuplicateKeysAreRefused) {
  EXPECT_CONTAINS(parse_error(file_bytes(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                                         R"("a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})",
                                         1)),
                  "the tensor name `a` appears twice");
  EXPECT_CONTAINS(parse_error(file_bytes(
                      R"({"a":{"dtype":"U8","dtype":"U8","shape":[1],"data_offsets":[0,1]}})", 1)),
                  "tensor `a` has the field `dtype` twice");
  EXPECT_CONTAINS(parse_error(file_bytes(R"({"__metadata__":{"k":"1","k":"2"}})", 0)),
                  "the metadata key `k` appears twice");
  EXPECT_CONTAINS(parse_error(file_bytes(R"({"__metadata__":{},"__metadata__":{}})", 0)),
                  "the key `__metadata__` appears twice");
}

TEST(HiddenSafetensorsTest, GapsOverlapsAndReversedOffsetsAreRefused) {
  EXPECT_CONTAINS(
      parse_error(file_bytes(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                             R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                             12)),
      "tensor `b` has data_offsets [8, 12] but the previous tensor ends at 4 (a gap)");
  EXPECT_CONTAINS(
      parse_error(file_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                             R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                             8)),
      "tensor `b` has data_offsets [4, 8] but the previous tensor ends at 8 (an overlap)");
  EXPECT_CONTAINS(
      parse_error(file_bytes(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8)),
      "(a gap)");
  EXPECT_CONTAINS(
      parse_error(file_bytes(R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[4,0]}})", 4)),
      "data_offsets [4, 0] that end before they begin");
}

TEST(HiddenSafetensorsTest, ShapeAndByteCountMustAgree) {
  EXPECT_CONTAINS(
      parse_error(file_bytes(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8)),
      "tensor `a`: shape [3] of F32 needs 12 bytes but data_offsets [0, 8] hold 8");
  EXPECT_CONTAINS(
      parse_error(file_bytes(
          R"({"a":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,8]}})", 8)),
      "overflows a 64-bit byte count");
  EXPECT_CONTAINS(
      parse_error(file_bytes(
          R"({"a":{"dtype":"U8","shape":[18446744073709551615],"data_offsets":[0,8]}})", 8)),
      "larger than 2^63-1");
  EXPECT_CONTAINS(
      parse_error(file_bytes(R"({"a":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}})", 2)),
      "is 12 bits, not whole bytes");
  EXPECT_EQ(parse_error(file_bytes(R"({"a":{"dtype":"F4","shape":[4],"data_offsets":[0,2]}})", 2)),
            "");
}

TEST(HiddenSafetensorsTest, TruncatedBufferIsRefused) {
  const std::string message = parse_error(file_bytes(kTwoTensors, 12));
  EXPECT_CONTAINS(message,
                  "truncated: tensor `b` ends at byte 16 of the data buffer, which has 12 bytes");
}

TEST(HiddenSafetensorsTest, TrailingBytesAreRefused) {
  const std::string message = parse_error(file_bytes(kTwoTensors, 17));
  EXPECT_CONTAINS(message,
                  "the data buffer has 17 bytes but the tensors cover 16 (1 trailing bytes)");
  EXPECT_CONTAINS(parse_error(file_bytes("{}", 1)), "(1 trailing bytes)");
}

TEST(HiddenSafetensorsTest, EveryPrefixOfAValidFileFailsCleanly) {
  const auto bytes = file_bytes(kTwoTensors, 16);
  for (std::size_t n = 0; n < bytes.size(); ++n) {
    std::vector<std::uint8_t> prefix(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(n));
    EXPECT_NE(parse_error(prefix), "") << "prefix of " << n << " bytes parsed";
  }
}

class HiddenSafetensorsFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("draftfeed_hidden_st_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_;
};

TEST_F(HiddenSafetensorsFileTest, WriterRoundTripsThroughTheMappedReader) {
  std::vector<std::uint16_t> hidden(2 * 3 * 5);
  for (std::size_t i = 0; i < hidden.size(); ++i) hidden[i] = static_cast<std::uint16_t>(i * 977);
  const std::vector<std::int64_t> ids = {5, -1, 1LL << 40};
  const std::vector<TensorToWrite> tensors = {
      {"hidden_states",
       DType::kBF16,
       {2, 3, 5},
       {reinterpret_cast<const std::uint8_t*>(hidden.data()), hidden.size() * 2}},
      {"token_ids", DType::kI64, {3}, {reinterpret_cast<const std::uint8_t*>(ids.data()), 24}},
      {"empty", DType::kF32, {0}, {}},
  };
  const std::map<std::string, std::string> metadata = {{"b", "2\n\"x\""}, {"a", "\x01"}};
  const std::string path = (dir_ / "t.safetensors").string();
  write_safetensors(path, tensors, &metadata);

  auto file = SafetensorsFile::open(path);
  ASSERT_TRUE(file.ok()) << file.error().what();
  EXPECT_EQ(file.value()->metadata(), metadata);
  EXPECT_EQ((8 + file.value()->header_size()) % 8, 0u);
  // The package's order: I64 before F32 before BF16 (dtype descending), then by name.
  ASSERT_EQ(file.value()->tensors().size(), 3u);
  EXPECT_EQ(file.value()->tensors()[0].name, "token_ids");
  const TensorView* states = file.value()->find("hidden_states");
  ASSERT_NE(states, nullptr);
  EXPECT_EQ(states->shape, (std::vector<std::int64_t>{2, 3, 5}));
  EXPECT_EQ(std::memcmp(states->data, hidden.data(), hidden.size() * 2), 0);
  EXPECT_EQ(states->mapping, file.value()->mapping());
  const TensorView* tokens = file.value()->find("token_ids");
  ASSERT_NE(tokens, nullptr);
  EXPECT_EQ(std::memcmp(tokens->data, ids.data(), 24), 0);
  EXPECT_EQ(file.value()->find("nope"), nullptr);

  // No temporary file is left behind by the atomic write.
  std::size_t entries = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator(dir_)) ++entries;
  EXPECT_EQ(entries, 1u);
}

TEST_F(HiddenSafetensorsFileTest, ViewsOutliveTheFileObject) {
  const std::vector<std::uint8_t> data = {1, 2, 3};
  const std::vector<TensorToWrite> tensors = {{"x", DType::kU8, {3}, data}};
  const std::string path = (dir_ / "v.safetensors").string();
  write_safetensors(path, tensors);
  TensorView kept;
  {
    auto file = SafetensorsFile::open(path).value();
    kept = *file->find("x");
  }
  std::filesystem::remove(path);
  ASSERT_NE(kept.mapping, nullptr);
  EXPECT_EQ(kept.data[2], 3);
}

TEST_F(HiddenSafetensorsFileTest, OpenNamesMissingAndCorruptFiles) {
  auto missing = SafetensorsFile::open((dir_ / "nope.safetensors").string());
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().kind(), ErrorKind::kNotFound);
  const std::string path = (dir_ / "bad.safetensors").string();
  std::ofstream(path) << "garbage!garbage";
  auto bad = SafetensorsFile::open(path);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().kind(), ErrorKind::kFormat);
  EXPECT_CONTAINS(bad.error().what(), path + ": header size");
}

TEST(HiddenSafetensorsWriterTest, RefusesInconsistentTensors) {
  const std::vector<std::uint8_t> seven(7);
  const std::vector<TensorToWrite> wrong_size = {{"a", DType::kF32, {2}, seven}};
  try {
    (void)safetensors_header(wrong_size, nullptr);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_CONTAINS(e.what(), "tensor `a`: shape [2] of F32 needs 64 bits but 7 bytes were given");
  }
  const std::vector<std::uint8_t> one(1);
  const std::vector<TensorToWrite> twice = {{"a", DType::kU8, {1}, one},
                                            {"a", DType::kU8, {1}, one}};
  EXPECT_THROW((void)safetensors_header(twice, nullptr), Error);
  const std::vector<TensorToWrite> reserved = {{"__metadata__", DType::kU8, {1}, one}};
  EXPECT_THROW((void)safetensors_header(reserved, nullptr), Error);
  const std::vector<TensorToWrite> bad_name = {{"\xC3", DType::kU8, {1}, one}};
  EXPECT_THROW((void)safetensors_header(bad_name, nullptr), Error);
}

TEST(HiddenSafetensorsWriterTest, HeaderIsCompactJsonPaddedToEightBytes) {
  const std::vector<std::uint8_t> four(4);
  const std::vector<TensorToWrite> tensors = {{"a", DType::kF32, {1}, four}};
  const std::string header = safetensors_header(tensors, nullptr);
  EXPECT_EQ(header,
            std::string(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})") + "  ");
  const auto bytes = serialize_safetensors(tensors, nullptr);
  EXPECT_EQ(bytes.size(), 8 + header.size() + 4);
  EXPECT_TRUE(parse_safetensors(bytes, "mem").ok());
}

}  // namespace
}  // namespace draftfeed
