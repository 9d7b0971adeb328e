// The Arrow IPC stream parser on byte buffers built in memory with our writer, then corrupted.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "draftfeed/dataset/arrow_ipc.h"
#include "draftfeed/dataset/arrow_ipc_writer.h"
#include "draftfeed/dataset/flatbuffer_builder.h"
#include "draftfeed/dataset/token_columns.h"

namespace draftfeed {
namespace {

using arrow::IpcStreamWriter;
using arrow::WriteColumn;
using arrow::WriteNode;
using Bytes = std::vector<std::uint8_t>;

template <typename T>
std::span<const std::uint8_t> bytes_of(const std::vector<T>& values) {
  return {reinterpret_cast<const std::uint8_t*>(values.data()), values.size() * sizeof(T)};
}

// input_ids list<int64> rows [0..i) for i in [0, rows), seq_len int64; `batches` record batches.
Bytes token_stream(int rows = 5, int batches = 2) {
  Bytes out;
  IpcStreamWriter writer(
      [&](std::span<const std::uint8_t> b) { out.insert(out.end(), b.begin(), b.end()); },
      {{"input_ids", true, false, 64, true}, {"seq_len", false, false, 64, true}},
      {{"note", "hand-made"}});
  for (int b = 0; b < batches; ++b) {
    std::vector<std::int32_t> offsets{0};
    std::vector<std::int64_t> values, lengths;
    for (int r = 0; r < rows; ++r) {
      for (int t = 0; t < r; ++t) values.push_back(100 * b + t);
      offsets.push_back(static_cast<std::int32_t>(values.size()));
      lengths.push_back(r);
    }
    const std::span<const std::uint8_t> none;
    writer.write_batch(rows, {{rows, 0}, {static_cast<std::int64_t>(values.size()), 0}, {rows, 0}},
                       {none, bytes_of(offsets), none, bytes_of(values), none, bytes_of(lengths)});
  }
  writer.close();
  return out;
}

Result<arrow::IpcStream> parse(const Bytes& bytes) { return arrow::read_ipc_stream(bytes, "mem"); }

std::string error_of(const Bytes& bytes) {
  auto result = parse(bytes);
  EXPECT_FALSE(result.ok());
  return result.ok() ? std::string() : std::string(result.error().what());
}

// A framed message whose flatbuffer is `message`, with `body` zero bytes after it.
Bytes framed(const fb::NodeRef& message, std::size_t body = 0) {
  Bytes out = arrow::frame_message(fb::finish(message));
  out.resize(out.size() + body, 0);
  return out;
}

fb::NodeRef message(std::int16_t version, std::uint8_t header_type, fb::NodeRef header,
                    std::int64_t body = 0) {
  return fb::TableBuilder()
      .add_i16(0, version)
      .add_u8(1, header_type)
      .add_ref(2, std::move(header))
      .add_i64(3, body)
      .build();
}

fb::NodeRef int_field(const std::string& name, std::uint8_t type_code = 2,
                      std::vector<fb::NodeRef> children = {}) {
  return fb::TableBuilder()
      .add_ref(0, fb::make_string(name))
      .add_bool(1, true)
      .add_u8(2, type_code)
      .add_ref(3, fb::TableBuilder().add_i32(0, 64).add_bool(1, true).build())
      .add_ref(5, fb::make_table_vector(std::move(children)))
      .build();
}

fb::NodeRef schema_of(std::vector<fb::NodeRef> fields, std::int16_t endianness = 0) {
  auto schema = fb::TableBuilder().add_ref(1, fb::make_table_vector(std::move(fields)));
  if (endianness != 0) schema.add_i16(0, endianness);
  return schema.build();
}

const Bytes kEndOfStream = {0xFF, 0xFF, 0xFF, 0xFF, 0, 0, 0, 0};

Bytes concat(std::initializer_list<Bytes> parts) {
  Bytes out;
  for (const auto& part : parts) out.insert(out.end(), part.begin(), part.end());
  return out;
}

TEST(DatasetIpc, ParsesWhatTheWriterWrote) {
  const Bytes bytes = token_stream(5, 2);
  auto stream = parse(bytes).value();
  ASSERT_EQ(stream.fields.size(), 2u);
  EXPECT_EQ(stream.fields[0].type, "list<int64>");
  EXPECT_EQ(stream.fields[1].type, "int64");
  EXPECT_EQ(stream.metadata_version, 4);
  EXPECT_FALSE(stream.legacy_framing);
  ASSERT_EQ(stream.batches.size(), 2u);
  EXPECT_EQ(stream.batches[1].length, 5);
  const auto& ids = stream.batches[1].columns[0];
  ASSERT_EQ(ids.children.size(), 1u);
  EXPECT_EQ(ids.children[0].length, 10);
  EXPECT_TRUE(ids.buffers[0].empty());  // absent validity

  std::vector<std::int64_t> lens;
  const ShardColumns columns = read_token_columns(stream, "mem", 0, &lens).value();
  EXPECT_EQ(columns.rows, 10);
  EXPECT_EQ(columns.total_tokens, 20);
  EXPECT_EQ(lens, (std::vector<std::int64_t>{0, 1, 2, 3, 4, 0, 1, 2, 3, 4}));
  const IntArrayView row = columns.input_ids[1].row(4);
  const std::vector<std::int64_t> expected{100, 101, 102, 103};
  EXPECT_TRUE(row.equals(expected));
}

TEST(DatasetIpc, EveryTruncationIsAnErrorNamingTheStream) {
  const Bytes bytes = token_stream(7, 3);
  for (std::size_t cut = 0; cut < bytes.size(); ++cut) {
    const Bytes prefix(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(cut));
    const std::string message = error_of(prefix);
    EXPECT_EQ(message.rfind("mem: ", 0), 0u) << "cut " << cut << ": " << message;
  }
}

TEST(DatasetIpc, EveryByteFlipIsHandled) {
  // Every flip must either give an error or parse into row views that lie inside the bytes (the
  // sanitizer builds also catch any read outside them).
  const Bytes bytes = token_stream(4, 1);
  int errors = 0;
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    for (const std::uint8_t value : {std::uint8_t{0x00}, std::uint8_t{0xFF}, std::uint8_t{0x80}}) {
      Bytes corrupt = bytes;
      corrupt[i] = value;
      auto stream = parse(corrupt);
      std::vector<std::int64_t> lens;
      auto columns = stream.ok() ? read_token_columns(stream.value(), "mem", 0, &lens)
                                 : Result<ShardColumns>(stream.error());
      if (!columns.ok()) {
        ++errors;
        continue;
      }
      std::uint64_t sum = 0;
      for (std::size_t b = 0; b < columns->input_ids.size(); ++b) {
        for (std::int64_t r = 0; r < columns->batch_rows[b]; ++r) {
          const IntArrayView row = columns->input_ids[b].row(r);
          ASSERT_GE(row.size(), 0);
          if (row.size() == 0) continue;
          ASSERT_GE(row.data, corrupt.data()) << "flip at " << i;
          ASSERT_LE(row.data + row.size() * row.byte_width, corrupt.data() + corrupt.size())
              << "flip at " << i;
          for (std::int64_t t = 0; t < row.size(); ++t) sum += static_cast<std::uint64_t>(row[t]);
        }
      }
      volatile std::uint64_t sink = sum;
      (void)sink;
    }
  }
  EXPECT_GT(errors, 0);
}

TEST(DatasetIpc, LegacyFramingWithoutContinuationWords) {
  const Bytes modern = token_stream(3, 2);
  Bytes legacy;
  std::size_t pos = 0;
  const auto full = parse(modern).value();
  // Rewrite every [FFFFFFFF][len] header as [len] (bodies follow the metadata unchanged).
  while (pos < modern.size()) {
    ASSERT_EQ(std::memcmp(&modern[pos], "\xFF\xFF\xFF\xFF", 4), 0);
    std::int32_t length;
    std::memcpy(&length, &modern[pos + 4], 4);
    legacy.insert(legacy.end(), modern.begin() + static_cast<std::ptrdiff_t>(pos) + 4,
                  modern.begin() + static_cast<std::ptrdiff_t>(pos) + 8);
    pos += 8;
    if (length == 0) break;
    // The message's body length: parse the metadata with the reader's own framing rules by
    // copying until the next continuation word.
    std::size_t next = pos + static_cast<std::size_t>(length);
    while (next + 4 <= modern.size() && std::memcmp(&modern[next], "\xFF\xFF\xFF\xFF", 4) != 0) {
      next += 8;
    }
    legacy.insert(legacy.end(), modern.begin() + static_cast<std::ptrdiff_t>(pos),
                  modern.begin() + static_cast<std::ptrdiff_t>(next));
    pos = next;
  }
  const auto stream = parse(legacy).value();
  EXPECT_TRUE(stream.legacy_framing);
  EXPECT_EQ(stream.batches.size(), full.batches.size());
}

TEST(DatasetIpc, RefusesStreamsWithoutSchemaOrWithTwo) {
  const Bytes schema = framed(message(4, 1, schema_of({int_field("seq_len")})));
  EXPECT_EQ(error_of(kEndOfStream), "mem: holds no schema message");
  EXPECT_NE(error_of(concat({schema, schema, kEndOfStream})).find("is a second schema message"),
            std::string::npos);
  const Bytes batch = framed(message(4, 3, fb::TableBuilder().add_i64(0, 0).build()));
  EXPECT_NE(error_of(concat({batch, kEndOfStream})).find("comes before the schema message"),
            std::string::npos);
}

TEST(DatasetIpc, RefusesOldMetadataBigEndianAndUnknownTypes) {
  const Bytes v3 = framed(message(2, 1, schema_of({int_field("x")})));
  auto result = parse(concat({v3, kEndOfStream}));
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.error().kind(), ErrorKind::kUnsupported);
  EXPECT_NE(std::string(result.error().what()).find("uses Arrow metadata version V3"),
            std::string::npos);

  result = parse(concat({framed(message(4, 1, schema_of({int_field("x")}, 1))), kEndOfStream}));
  ASSERT_FALSE(result.ok());
  EXPECT_NE(std::string(result.error().what()).find("the schema is big-endian"), std::string::npos);

  result = parse(concat({framed(message(4, 1, schema_of({int_field("x", 99)}))), kEndOfStream}));
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.error().kind(), ErrorKind::kUnsupported);
  EXPECT_NE(std::string(result.error().what()).find("field 'x' has Arrow type code 99"),
            std::string::npos);
}

TEST(DatasetIpc, RefusesFieldsNestedTooDeeply) {
  fb::NodeRef field = int_field("leaf");
  for (int depth = 0; depth < arrow::kMaxFieldDepth + 2; ++depth) {
    field = int_field("s", 13, {field});  // Struct_
  }
  const std::string message_text =
      error_of(concat({framed(message(4, 1, schema_of({field}))), kEndOfStream}));
  EXPECT_NE(message_text.find("fields nest deeper than 64 levels"), std::string::npos);
}

TEST(DatasetIpc, RefusesCompressedBatches) {
  const Bytes schema = framed(message(4, 1, schema_of({int_field("seq_len")})));
  const auto compression = fb::TableBuilder().add_scalar(0, 1, 1).build();  // codec ZSTD
  const auto header = fb::TableBuilder().add_i64(0, 0).add_ref(3, compression).build();
  auto result = parse(concat({schema, framed(message(4, 3, header)), kEndOfStream}));
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.error().kind(), ErrorKind::kUnsupported);
  EXPECT_NE(std::string(result.error().what()).find("record batch 0 (message at byte "),
            std::string::npos);
  EXPECT_NE(std::string(result.error().what()).find("is compressed (zstd)"), std::string::npos);
}

fb::NodeRef struct_vector(std::vector<std::int64_t> values) {
  std::string bytes(values.size() * 8, '\0');
  std::memcpy(bytes.data(), values.data(), bytes.size());
  return fb::make_bytes_vector(bytes, static_cast<std::uint32_t>(values.size() / 2), 8);
}

TEST(DatasetIpc, RefusesMissingNodesAndBuffersAndRowCountMismatch) {
  const Bytes schema = framed(message(4, 1, schema_of({int_field("a"), int_field("b")})));
  auto batch = [&](std::int64_t length, std::vector<std::int64_t> nodes,
                   std::vector<std::int64_t> buffers) {
    const auto header = fb::TableBuilder()
                            .add_i64(0, length)
                            .add_ref(1, struct_vector(std::move(nodes)))
                            .add_ref(2, struct_vector(std::move(buffers)))
                            .build();
    return concat({schema, framed(message(4, 3, header, 16), 16), kEndOfStream});
  };
  EXPECT_NE(error_of(batch(1, {1, 0}, {0, 0, 0, 8}))
                .find("has 1 field nodes, fewer than the schema needs (field 'b')"),
            std::string::npos);
  EXPECT_NE(error_of(batch(1, {1, 0, 1, 0}, {0, 0, 0, 8, 0, 0}))
                .find("has 3 buffers, fewer than the schema needs (field 'b')"),
            std::string::npos);
  EXPECT_NE(error_of(batch(1, {1, 0, 2, 0}, {0, 0, 0, 8, 0, 0, 8, 8}))
                .find("column 'b' has 2 rows but the batch has 1"),
            std::string::npos);
  EXPECT_NE(error_of(batch(1, {1, 0, 1, 5}, {0, 0, 0, 8, 0, 0, 8, 8}))
                .find("field 'b' has length 1 and null count 5"),
            std::string::npos);
  EXPECT_NE(error_of(batch(1, {1, 0, 1, 0}, {0, 0, 0, 8, 0, 0, 9, 8}))
                .find("buffer 3 (field 'b') spans bytes [9, 9 + 8) of a 16-byte body"),
            std::string::npos);
  EXPECT_TRUE(parse(batch(1, {1, 0, 1, 0}, {0, 0, 0, 8, 0, 0, 8, 8})).ok());
}

TEST(DatasetIpc, TypeStringsForSkippedColumns) {
  auto typed = [](const std::string& name, std::uint8_t code, fb::NodeRef type,
                  std::vector<fb::NodeRef> children = {}) {
    return fb::TableBuilder()
        .add_ref(0, fb::make_string(name))
        .add_u8(2, code)
        .add_ref(3, std::move(type))
        .add_ref(5, fb::make_table_vector(std::move(children)))
        .build();
  };
  const auto empty = fb::TableBuilder().build();
  const auto utf8 = typed("content", 5, empty);
  const auto role = typed("role", 5, empty);
  const auto msg = typed("item", 13, empty, {role, utf8});
  const auto messages = typed("messages", 12, empty, {msg});
  const auto floats = typed("f", 3, fb::TableBuilder().add_i16(0, 2).build());
  const auto stamp =
      typed("t", 10, fb::TableBuilder().add_i16(0, 2).add_ref(1, fb::make_string("UTC")).build());
  const auto stream =
      parse(concat({framed(message(4, 1, schema_of({messages, floats, stamp}))), kEndOfStream}))
          .value();
  EXPECT_EQ(stream.fields[0].type, "list<struct<role: string, content: string>>");
  EXPECT_EQ(stream.fields[1].type, "double");
  EXPECT_EQ(stream.fields[2].type, "timestamp[us, tz=UTC]");
  EXPECT_EQ(arrow::buffer_count(stream.fields[0], 4), 2);
  EXPECT_EQ(arrow::buffer_count(stream.fields[0].children[0], 4), 1);
}

TEST(DatasetIpc, TokenColumnsRefuseBadOffsets) {
  Bytes bytes = token_stream(3, 1);
  auto stream = parse(bytes).value();
  // Offsets of batch 0 are [0, 0, 1, 3]; make them decrease.
  auto offsets = stream.batches[0].columns[0].buffers[1];
  const std::int32_t bad = 2;
  std::memcpy(const_cast<std::uint8_t*>(offsets.data()) + 8, &bad, 4);  // [0, 0, 2, 3] still fine
  std::vector<std::int64_t> lens;
  EXPECT_TRUE(read_token_columns(stream, "mem", 0, &lens).ok());
  const std::int32_t worse = 5;
  std::memcpy(const_cast<std::uint8_t*>(offsets.data()) + 8, &worse, 4);  // [0, 0, 5, 3]
  auto result = read_token_columns(stream, "mem", 10, &lens);
  ASSERT_FALSE(result.ok());
  EXPECT_STREQ(result.error().what(),
               "mem: record batch 0, column 'input_ids': offsets decrease at row 12 (5 then 3)");
}

}  // namespace
}  // namespace draftfeed
