// arrow_value_json on hand-built arrays: valid values give Python's json text, and corrupt buffers,
// bad UTF-8, unsupported types and values past the limits give errors, never a crash.
// (tests/python/test_dataset_messages.py checks real `datasets` folders against the reference.)
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <deque>
#include <limits>
#include <string>
#include <vector>

#include "draftfeed/dataset/arrow_json.h"

namespace draftfeed::arrow {
namespace {

using Bytes = std::vector<std::uint8_t>;

Field scalar(TypeId id, std::string type, int bit_width = 0, bool is_signed = false) {
  Field field;
  field.name = "messages";
  field.type_id = id;
  field.type = std::move(type);
  field.bit_width = bit_width;
  field.is_signed = is_signed;
  return field;
}

Field list_of(Field child, TypeId id = TypeId::kList) {
  Field field = scalar(id, (id == TypeId::kList ? "list<" : "large_list<") + child.type + ">");
  child.name = "item";
  field.children.push_back(std::move(child));
  return field;
}

// Owns the bytes that the views' spans point into.
class Arrays {
 public:
  template <typename T>
  std::span<const std::uint8_t> buffer(const std::vector<T>& values) {
    Bytes& bytes = store_.emplace_back(values.size() * sizeof(T));
    if (!bytes.empty()) std::memcpy(bytes.data(), values.data(), bytes.size());
    return bytes;
  }
  std::span<const std::uint8_t> text(const std::string& s) {
    return buffer(std::vector<char>(s.begin(), s.end()));
  }

  // A string array of `values` (no nulls).
  ArrayView strings(const std::vector<std::string>& values) {
    std::vector<std::int32_t> offsets{0};
    std::string data;
    for (const auto& v : values) {
      data += v;
      offsets.push_back(static_cast<std::int32_t>(data.size()));
    }
    return {static_cast<std::int64_t>(values.size()), 0, {{}, buffer(offsets), text(data)}, {}};
  }

  template <typename T>
  ArrayView fixed(const std::vector<T>& values) {
    return {static_cast<std::int64_t>(values.size()), 0, {{}, buffer(values)}, {}};
  }

 private:
  std::deque<Bytes> store_;  // a deque: spans stay valid as it grows
};

std::string json(const Field& field, const ArrayView& array, std::int64_t index,
                 const JsonLimits& limits = {}) {
  return arrow_value_json(field, array, index, "shard.arrow: row 7", limits).value();
}

// The error's text, after checking its kind and that it names where, the column and its type.
std::string error_of(const Field& field, const ArrayView& array, std::int64_t index,
                     ErrorKind kind = ErrorKind::kFormat, const JsonLimits& limits = {}) {
  auto result = arrow_value_json(field, array, index, "shard.arrow: row 7", limits);
  EXPECT_FALSE(result.ok());
  if (result.ok()) return "";
  const std::string message = result.error().what();
  EXPECT_EQ(result.error().kind(), kind) << message;
  EXPECT_NE(message.find("shard.arrow: row 7"), std::string::npos) << message;
  EXPECT_NE(message.find("'messages'"), std::string::npos) << message;
  EXPECT_NE(message.find(field.type), std::string::npos) << message;
  return message;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(DatasetArrowJson, ListOfStringsWithEscapes) {
  Arrays a;
  const Field field = list_of(scalar(TypeId::kUtf8, "string"));
  ArrayView list{2, 0, {{}, a.buffer(std::vector<std::int32_t>{0, 3, 3})}, {}};
  list.children.push_back(a.strings({"plain", "q\"b\\\n\x01\x7f", "\xe4\xb8\xad\xf0\x9f\x98\x80"}));
  EXPECT_EQ(json(field, list, 0), R"(["plain","q\"b\\\n\u0001)"
                                  "\x7f"
                                  R"(","中😀"])");
  EXPECT_EQ(json(field, list, 1), "[]");
}

TEST(DatasetArrowJson, StructFieldsInSchemaOrderWithNulls) {
  Arrays a;
  Field field = scalar(TypeId::kStruct, "struct<role: string, n: int8, ok: bool>");
  field.children = {scalar(TypeId::kUtf8, "string"), scalar(TypeId::kInt, "int8", 8, true),
                    scalar(TypeId::kBool, "bool")};
  field.children[0].name = "role";
  field.children[1].name = "n";
  field.children[2].name = "ok";
  // Row 1 of the struct is null; row 0 has a null `n`.
  ArrayView array{2, 1, {a.buffer(std::vector<std::uint8_t>{0b01})}, {}};
  array.children.push_back(a.strings({"user", "x"}));
  array.children.push_back(
      {2,
       1,
       {a.buffer(std::vector<std::uint8_t>{0b10}), a.buffer(std::vector<std::int8_t>{-128, 5})},
       {}});
  array.children.push_back({2, 0, {{}, a.buffer(std::vector<std::uint8_t>{0b01})}, {}});
  EXPECT_EQ(json(field, array, 0), R"({"role":"user","n":null,"ok":true})");
  EXPECT_EQ(json(field, array, 1), "null");
}

TEST(DatasetArrowJson, IntegersOfEveryWidth) {
  Arrays a;
  EXPECT_EQ(json(scalar(TypeId::kInt, "uint64", 64, false),
                 a.fixed(std::vector<std::uint64_t>{std::numeric_limits<std::uint64_t>::max()}), 0),
            "18446744073709551615");
  EXPECT_EQ(json(scalar(TypeId::kInt, "int64", 64, true),
                 a.fixed(std::vector<std::int64_t>{std::numeric_limits<std::int64_t>::min()}), 0),
            "-9223372036854775808");
  EXPECT_EQ(json(scalar(TypeId::kInt, "uint16", 16, false),
                 a.fixed(std::vector<std::uint16_t>{1, 65535}), 1),
            "65535");
}

TEST(DatasetArrowJson, FloatsAsPythonRepr) {
  Arrays a;
  const Field f64 = scalar(TypeId::kFloatingPoint, "double");
  const std::vector<std::pair<double, std::string>> cases = {
      {0.0, "0.0"},
      {-0.0, "-0.0"},
      {1.0, "1.0"},
      {0.1, "0.1"},
      {123.456, "123.456"},
      {1e15, "1000000000000000.0"},
      {1e16, "1e+16"},
      {1.5e16, "1.5e+16"},
      {1e-4, "0.0001"},
      {1.5e-5, "1.5e-05"},
      {5e-324, "5e-324"},
      {1.7976931348623157e308, "1.7976931348623157e+308"},
      {std::numeric_limits<double>::quiet_NaN(), "NaN"},
      {std::numeric_limits<double>::infinity(), "Infinity"},
      {-std::numeric_limits<double>::infinity(), "-Infinity"},
  };
  for (const auto& [value, text] : cases) {
    EXPECT_EQ(json(f64, a.fixed(std::vector<double>{value}), 0), text) << value;
  }
  EXPECT_EQ(json(scalar(TypeId::kFloatingPoint, "float"), a.fixed(std::vector<float>{0.1f}), 0),
            "0.10000000149011612");
  const Field f16 = scalar(TypeId::kFloatingPoint, "halffloat");
  const auto half = a.fixed(std::vector<std::uint16_t>{0x3c00, 0x7bff, 0x0001, 0xfc00, 0x7e00});
  EXPECT_EQ(json(f16, half, 0), "1.0");
  EXPECT_EQ(json(f16, half, 1), "65504.0");
  EXPECT_EQ(json(f16, half, 2), "5.960464477539063e-08");
  EXPECT_EQ(json(f16, half, 3), "-Infinity");
  EXPECT_EQ(json(f16, half, 4), "NaN");
}

TEST(DatasetArrowJson, FixedSizeListAndNullType) {
  Arrays a;
  Field field = scalar(TypeId::kFixedSizeList, "fixed_size_list<int32>[2]");
  field.children.push_back(scalar(TypeId::kInt, "int32", 32, true));
  ArrayView array{2, 0, {{}}, {a.fixed(std::vector<std::int32_t>{1, 2, 3, 4})}};
  EXPECT_EQ(json(field, array, 1), "[3,4]");
  array.children[0].length = 3;  // too few values for row 1
  EXPECT_TRUE(contains(error_of(field, array, 1), "lists of 2"));
  EXPECT_EQ(json(scalar(TypeId::kNull, "null"), ArrayView{3, 3, {}, {}}, 2), "null");
}

TEST(DatasetArrowJson, CorruptOffsetsAreErrors) {
  Arrays a;
  const Field field = list_of(scalar(TypeId::kInt, "int64", 64, true));
  const auto values = a.fixed(std::vector<std::int64_t>{1, 2, 3});
  auto list = [&](std::vector<std::int32_t> offsets) {
    return ArrayView{
        static_cast<std::int64_t>(offsets.size()) - 1, 0, {{}, a.buffer(offsets)}, {values}};
  };
  // Offsets need not start at 0.
  EXPECT_EQ(json(field, list({1, 3}), 0), "[2,3]");
  EXPECT_TRUE(contains(error_of(field, list({0, 4}), 0), "[0, 4)"));        // past the child
  EXPECT_TRUE(contains(error_of(field, list({2, 1}), 0), "not a range"));   // decreasing
  EXPECT_TRUE(contains(error_of(field, list({-1, 1}), 0), "not a range"));  // negative
  ArrayView short_offsets = list({0, 1, 2});
  short_offsets.buffers[1] = short_offsets.buffers[1].first(9);  // entry 2 cut short
  EXPECT_TRUE(contains(error_of(field, short_offsets, 1), "too short"));
  // An index past the list, and a child array index past the child (a lying child length).
  EXPECT_EQ(arrow_value_json(field, list({0, 1}), 1, "w").error().kind(),
            ErrorKind::kInvalidArgument);
  ArrayView lying = list({0, 3});
  lying.children[0].buffers[1] = lying.children[0].buffers[1].first(16);
  EXPECT_TRUE(contains(error_of(field, lying, 0), "messages[2]: the values buffer"));
  // Missing child array or buffers.
  ArrayView orphan = list({0, 1});
  orphan.children.clear();
  EXPECT_TRUE(contains(error_of(field, orphan, 0), "child arrays"));
  ArrayView bare{1, 0, {}, {values}};
  EXPECT_TRUE(contains(error_of(field, bare, 0), "buffers"));
}

TEST(DatasetArrowJson, StringOffsetsPastTheDataAreErrors) {
  Arrays a;
  const Field field = scalar(TypeId::kLargeUtf8, "large_string");
  ArrayView array{1, 0, {{}, a.buffer(std::vector<std::int64_t>{0, 5}), a.text("abc")}, {}};
  EXPECT_TRUE(contains(error_of(field, array, 0), "string offsets"));
  array.buffers[1] = a.buffer(std::vector<std::int64_t>{1, 3});
  EXPECT_EQ(json(field, array, 0), R"("bc")");
  array.buffers[1] =
      a.buffer(std::vector<std::int64_t>{0, std::numeric_limits<std::int64_t>::max()});
  error_of(field, array, 0);
}

TEST(DatasetArrowJson, ValidityBitmapChecks) {
  Arrays a;
  const Field field = scalar(TypeId::kInt, "int32", 32, true);
  ArrayView array = a.fixed(std::vector<std::int32_t>(10, 4));
  array.null_count = 1;
  EXPECT_TRUE(contains(error_of(field, array, 9), "no validity bitmap"));
  array.buffers[0] = a.buffer(std::vector<std::uint8_t>{0xff});  // 8 bits for 10 elements
  EXPECT_EQ(json(field, array, 7), "4");
  EXPECT_TRUE(contains(error_of(field, array, 9), "validity bitmap has 1 bytes"));
  // With a null count of 0 the bitmap is ignored, as Arrow C++ (pyarrow) does.
  array.null_count = 0;
  array.buffers[0] = a.buffer(std::vector<std::uint8_t>{0x00});
  EXPECT_EQ(json(field, array, 9), "4");
  // A bool's values bitmap too short.
  ArrayView flags{10, 0, {{}, a.buffer(std::vector<std::uint8_t>{0x01})}, {}};
  EXPECT_EQ(json(scalar(TypeId::kBool, "bool"), flags, 0), "true");
  EXPECT_TRUE(contains(error_of(scalar(TypeId::kBool, "bool"), flags, 8), "values bitmap"));
}

TEST(DatasetArrowJson, InvalidUtf8IsAnError) {
  Arrays a;
  const Field field = scalar(TypeId::kUtf8, "string");
  for (const std::string bad : {"\xc0\xaf", "\xed\xa0\x80", "a\xe4\xb8", "\xf4\x90\x80\x80", "\xff",
                                "\x80", "\xe0\x80\xaf"}) {
    EXPECT_TRUE(contains(error_of(field, a.strings({bad}), 0), "not valid UTF-8")) << bad;
  }
  EXPECT_EQ(json(field, a.strings({"\xf4\x8f\xbf\xbf\xee\x80\x80"}), 0),
            "\"\xf4\x8f\xbf\xbf\xee\x80\x80\"");
  // A field name is checked too.
  Field record = scalar(TypeId::kStruct, "struct<?: null>");
  record.children.push_back(scalar(TypeId::kNull, "null"));
  record.children[0].name = "\xc3";
  EXPECT_TRUE(contains(error_of(record, ArrayView{1, 0, {{}}, {ArrayView{1, 1, {}, {}}}}, 0),
                       "field name"));
}

TEST(DatasetArrowJson, UnsupportedTypesAreRefusedByType) {
  Arrays a;
  const Field binary = scalar(TypeId::kBinary, "binary");
  EXPECT_TRUE(
      contains(error_of(binary, a.strings({"x"}), 0, ErrorKind::kUnsupported), "no JSON form"));
  Field dictionary = scalar(TypeId::kUtf8, "dictionary<values=string, indices=int32>", 32, true);
  dictionary.dictionary_encoded = true;
  error_of(dictionary, a.fixed(std::vector<std::int32_t>{0}), 0, ErrorKind::kUnsupported);
  // Refused even where the value is null: every row of a column gives the same answer.
  Field record = scalar(TypeId::kStruct, "struct<when: timestamp[s]>");
  record.children.push_back(scalar(TypeId::kTimestamp, "timestamp[s]"));
  record.children[0].name = "when";
  const std::string message =
      error_of(record, ArrayView{1, 1, {a.buffer(std::vector<std::uint8_t>{0})}, {}}, 0,
               ErrorKind::kUnsupported);
  EXPECT_TRUE(contains(message, "messages.when: has type timestamp[s]")) << message;
}

TEST(DatasetArrowJson, DepthAndSizeLimits) {
  Arrays a;
  Field deep = scalar(TypeId::kNull, "null");
  for (int level = 0; level < 100; ++level) deep = list_of(std::move(deep));
  ArrayView array{1, 0, {}, {}};  // never read: the type is refused first
  EXPECT_TRUE(contains(error_of(deep, array, 0, ErrorKind::kUnsupported), "deeper than 64 levels"));

  const Field field = scalar(TypeId::kUtf8, "string");
  const auto big = a.strings({std::string(1000, 'x')});
  EXPECT_EQ(json(field, big, 0, JsonLimits{1002, 64}).size(), 1002u);
  EXPECT_TRUE(contains(error_of(field, big, 0, ErrorKind::kUnsupported, JsonLimits{1001, 64}),
                       "larger than 1001 bytes"));
  // A long list of nulls (each element a few bytes) stops at the limit too.
  const Field nulls = list_of(scalar(TypeId::kNull, "null"));
  ArrayView many{1,
                 0,
                 {{}, a.buffer(std::vector<std::int32_t>{0, 1 << 30})},
                 {ArrayView{1 << 30, 1 << 30, {}, {}}}};
  EXPECT_TRUE(contains(error_of(nulls, many, 0, ErrorKind::kUnsupported, JsonLimits{4096, 64}),
                       "larger than 4096"));
}

}  // namespace
}  // namespace draftfeed::arrow
