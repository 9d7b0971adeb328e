#include "draftfeed/dataset/arrow_schema.h"

#include <string_view>

#include "draftfeed/common/error.h"

namespace draftfeed::arrow {

namespace {

// Slots of the flatbuffer tables (their field order in Arrow's Schema.fbs; a union takes two slots,
// the type code and the value).
constexpr int kSchemaEndianness = 0;
constexpr int kSchemaFields = 1;
constexpr int kFieldName = 0;
constexpr int kFieldNullable = 1;
constexpr int kFieldTypeType = 2;
constexpr int kFieldType = 3;
constexpr int kFieldDictionary = 4;
constexpr int kFieldChildren = 5;
constexpr int kDictionaryIndexType = 1;
constexpr int kIntBitWidth = 0;
constexpr int kIntIsSigned = 1;

constexpr TypeId kLastKnownType = TypeId::kLargeListView;

const char* time_unit_name(int unit) {
  switch (unit) {
    case 0:
      return "s";
    case 1:
      return "ms";
    case 2:
      return "us";
    case 3:
      return "ns";
    default:
      return "?";
  }
}

std::string int_name(int bit_width, bool is_signed) {
  return (is_signed ? "int" : "uint") + std::to_string(bit_width);
}

class SchemaParser {
 public:
  explicit SchemaParser(const std::string& what) : what_(what) {}

  Field parse_field(const fb::Table& table, int depth) {
    if (depth > kMaxFieldDepth) {
      fail("fields nest deeper than " + std::to_string(kMaxFieldDepth) + " levels");
    }
    if (++field_count_ > kMaxFields) {
      fail("more than " + std::to_string(kMaxFields) + " fields in the schema");
    }
    Field field;
    std::string_view name;
    table.string(kFieldName, &name);
    field.name = std::string(name);
    field.nullable = table.scalar<std::uint8_t>(kFieldNullable, 0) != 0;
    const auto code = table.scalar<std::uint8_t>(kFieldTypeType, 0);
    if (code == 0) fail("field '" + field.name + "' has no type");
    if (code > static_cast<std::uint8_t>(kLastKnownType)) {
      throw Error(ErrorKind::kUnsupported, what_ + ": field '" + field.name +
                                               "' has Arrow type code " + std::to_string(code) +
                                               ", newer than this reader knows");
    }
    field.type_id = static_cast<TypeId>(code);
    fb::Table type;
    const bool has_type = table.table(kFieldType, &type);

    fb::Vector children;
    table.vector(kFieldChildren, 4, &children);
    for (std::uint32_t i = 0; i < children.size(); ++i) {
      field.children.push_back(parse_field(children.table(i), depth + 1));
    }
    check_children(field);

    if (field.type_id == TypeId::kInt) {
      field.bit_width = has_type ? type.scalar<std::int32_t>(kIntBitWidth, 0) : 0;
      field.is_signed = has_type && type.scalar<std::uint8_t>(kIntIsSigned, 0) != 0;
      if (field.bit_width != 8 && field.bit_width != 16 && field.bit_width != 32 &&
          field.bit_width != 64) {
        fail("field '" + field.name + "' is an integer of " + std::to_string(field.bit_width) +
             " bits (Arrow allows 8, 16, 32, 64)");
      }
    }
    if (field.type_id == TypeId::kUnion) {
      field.dense_union = has_type && type.scalar<std::int16_t>(0, 0) == 1;
    }
    field.type = value_type_string(field, has_type ? &type : nullptr);

    fb::Table dictionary;
    if (table.table(kFieldDictionary, &dictionary)) {
      // The batch holds indices of the index type (signed int32 when absent), not values.
      field.dictionary_encoded = true;
      int index_width = 32;
      bool index_signed = true;
      fb::Table index_type;
      if (dictionary.table(kDictionaryIndexType, &index_type)) {
        index_width = index_type.scalar<std::int32_t>(kIntBitWidth, 0);
        index_signed = index_type.scalar<std::uint8_t>(kIntIsSigned, 0) != 0;
        if (index_width != 8 && index_width != 16 && index_width != 32 && index_width != 64) {
          fail("field '" + field.name + "' has dictionary indices of " +
               std::to_string(index_width) + " bits");
        }
      }
      field.type = "dictionary<values=" + field.type +
                   ", indices=" + int_name(index_width, index_signed) + ">";
      field.bit_width = index_width;
      field.is_signed = index_signed;
    }
    return field;
  }

  [[noreturn]] void fail(const std::string& problem) const {
    throw Error(ErrorKind::kFormat, what_ + ": bad schema: " + problem);
  }

 private:
  void check_children(const Field& field) const {
    std::size_t expected = 0;
    switch (field.type_id) {
      case TypeId::kList:
      case TypeId::kLargeList:
      case TypeId::kListView:
      case TypeId::kLargeListView:
      case TypeId::kFixedSizeList:
      case TypeId::kMap:
        expected = 1;
        break;
      case TypeId::kRunEndEncoded:
        expected = 2;
        break;
      case TypeId::kStruct:
      case TypeId::kUnion:
        return;  // any number
      default:
        expected = 0;
    }
    if (field.children.size() != expected) {
      fail("field '" + field.name + "' of type code " +
           std::to_string(static_cast<int>(field.type_id)) + " has " +
           std::to_string(field.children.size()) + " children, expected " +
           std::to_string(expected));
    }
  }

  static std::string children_list(const Field& field) {
    std::string text;
    for (const auto& child : field.children) {
      if (!text.empty()) text += ", ";
      text += child.name + ": " + child.type;
    }
    return text;
  }

  // The type's text from its id, parameters (the `type` table, may be null) and children.
  static std::string value_type_string(const Field& field, const fb::Table* type) {
    auto param = [&](int slot, std::int32_t fallback) {
      return type ? type->scalar<std::int32_t>(slot, fallback) : fallback;
    };
    auto short_param = [&](int slot, std::int16_t fallback) {
      return type ? type->scalar<std::int16_t>(slot, fallback) : fallback;
    };
    switch (field.type_id) {
      case TypeId::kNull:
        return "null";
      case TypeId::kInt:
        return int_name(field.bit_width, field.is_signed);
      case TypeId::kFloatingPoint: {
        const int precision = short_param(0, 0);
        return precision == 0 ? "halffloat" : precision == 1 ? "float" : "double";
      }
      case TypeId::kBinary:
        return "binary";
      case TypeId::kUtf8:
        return "string";
      case TypeId::kBool:
        return "bool";
      case TypeId::kDecimal:
        return "decimal" + std::to_string(param(2, 128)) + "(" + std::to_string(param(0, 0)) +
               ", " + std::to_string(param(1, 0)) + ")";
      case TypeId::kDate:
        return short_param(0, 1) == 0 ? "date32[day]" : "date64[ms]";
      case TypeId::kTime:
        return "time" + std::to_string(param(1, 32)) + "[" + time_unit_name(short_param(0, 1)) +
               "]";
      case TypeId::kTimestamp: {
        std::string text = std::string("timestamp[") + time_unit_name(short_param(0, 0));
        std::string_view zone;
        if (type && type->string(1, &zone) && !zone.empty()) {
          text += ", tz=" + std::string(zone);
        }
        return text + "]";
      }
      case TypeId::kInterval: {
        const int unit = short_param(0, 0);
        return unit == 0   ? "month_interval"
               : unit == 1 ? "day_time_interval"
                           : "month_day_nano_interval";
      }
      case TypeId::kList:
        return "list<" + field.children[0].type + ">";
      case TypeId::kLargeList:
        return "large_list<" + field.children[0].type + ">";
      case TypeId::kListView:
        return "list_view<" + field.children[0].type + ">";
      case TypeId::kLargeListView:
        return "large_list_view<" + field.children[0].type + ">";
      case TypeId::kFixedSizeList:
        return "fixed_size_list<" + field.children[0].type + ">[" + std::to_string(param(0, 0)) +
               "]";
      case TypeId::kStruct:
        return "struct<" + children_list(field) + ">";
      case TypeId::kUnion:
        return std::string(field.dense_union ? "dense_union<" : "sparse_union<") +
               children_list(field) + ">";
      case TypeId::kFixedSizeBinary:
        return "fixed_size_binary[" + std::to_string(param(0, 0)) + "]";
      case TypeId::kMap: {
        const Field& entries = field.children[0];
        if (entries.children.size() == 2) {
          return "map<" + entries.children[0].type + ", " + entries.children[1].type + ">";
        }
        return "map<" + entries.type + ">";
      }
      case TypeId::kDuration:
        return std::string("duration[") + time_unit_name(short_param(0, 1)) + "]";
      case TypeId::kLargeBinary:
        return "large_binary";
      case TypeId::kLargeUtf8:
        return "large_string";
      case TypeId::kRunEndEncoded:
        return "run_end_encoded<run_ends: " + field.children[0].type +
               ", values: " + field.children[1].type + ">";
      case TypeId::kBinaryView:
        return "binary_view";
      case TypeId::kUtf8View:
        return "string_view";
    }
    return "unknown";
  }

  const std::string& what_;
  std::size_t field_count_ = 0;
};

}  // namespace

ParsedSchema parse_schema(const fb::Table& schema, const std::string& what) {
  ParsedSchema parsed;
  parsed.big_endian = schema.scalar<std::int16_t>(kSchemaEndianness, 0) == 1;
  SchemaParser parser(what);
  fb::Vector fields;
  schema.vector(kSchemaFields, 4, &fields);
  for (std::uint32_t i = 0; i < fields.size(); ++i) {
    parsed.fields.push_back(parser.parse_field(fields.table(i), 0));
  }
  return parsed;
}

std::string type_string(const Field& field) { return field.type; }

int buffer_count(const Field& field, int metadata_version) {
  if (field.dictionary_encoded) return 2;  // validity + indices
  switch (field.type_id) {
    case TypeId::kNull:
    case TypeId::kRunEndEncoded:
      return 0;
    case TypeId::kStruct:
    case TypeId::kFixedSizeList:
      return 1;
    case TypeId::kBinary:
    case TypeId::kUtf8:
    case TypeId::kLargeBinary:
    case TypeId::kLargeUtf8:
    case TypeId::kListView:
    case TypeId::kLargeListView:
      return 3;
    case TypeId::kUnion: {
      // V5: type ids (+ offsets when dense); V4 added a validity bitmap in front.
      const int count = field.dense_union ? 2 : 1;
      return metadata_version < 4 ? count + 1 : count;
    }
    default:
      return 2;  // validity + values / offsets / views
  }
}

}  // namespace draftfeed::arrow
