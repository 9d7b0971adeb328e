#include "draftfeed/dataset/arrow_ipc_writer.h"

#include <cstring>

#include "draftfeed/common/error.h"
#include "draftfeed/dataset/flatbuffer_builder.h"

namespace draftfeed::arrow {

namespace {

// Codes and slots from Arrow's Schema.fbs / Message.fbs (see arrow_ipc.cc for the reading side).
constexpr std::int16_t kMetadataV5 = 4;
constexpr std::uint8_t kHeaderSchema = 1;
constexpr std::uint8_t kHeaderRecordBatch = 3;
constexpr std::uint8_t kTypeInt = 2;
constexpr std::uint8_t kTypeList = 12;
constexpr std::uint8_t kTypeLargeList = 21;
constexpr std::size_t kAlignment = 8;

fb::NodeRef int_field(const std::string& name, int bit_width, bool is_signed) {
  auto type = fb::TableBuilder().add_i32(0, bit_width).add_bool(1, is_signed).build();
  return fb::TableBuilder()
      .add_ref(0, fb::make_string(name))
      .add_bool(1, true)
      .add_u8(2, kTypeInt)
      .add_ref(3, type)
      .add_ref(5, fb::make_table_vector({}))
      .build();
}

fb::NodeRef column_field(const WriteColumn& column) {
  if (!column.is_list) return int_field(column.name, column.bit_width, column.is_signed);
  return fb::TableBuilder()
      .add_ref(0, fb::make_string(column.name))
      .add_bool(1, true)
      .add_u8(2, column.large_list ? kTypeLargeList : kTypeList)
      .add_ref(3, fb::TableBuilder().build())
      .add_ref(5, fb::make_table_vector({int_field("item", column.bit_width, column.is_signed)}))
      .build();
}

std::vector<std::uint8_t> message(std::uint8_t header_type, fb::NodeRef header,
                                  std::int64_t body_length) {
  return fb::finish(fb::TableBuilder()
                        .add_i16(0, kMetadataV5)
                        .add_u8(1, header_type)
                        .add_ref(2, std::move(header))
                        .add_i64(3, body_length)
                        .build());
}

std::size_t padded(std::size_t size) { return (size + kAlignment - 1) / kAlignment * kAlignment; }

void append_i64(std::string* out, std::int64_t value) {
  char bytes[8];
  std::memcpy(bytes, &value, 8);
  out->append(bytes, 8);
}

}  // namespace

std::vector<std::uint8_t> frame_message(const std::vector<std::uint8_t>& flatbuffer) {
  const std::size_t length = padded(flatbuffer.size());
  std::vector<std::uint8_t> framed(8 + length, 0);
  const std::uint32_t continuation = 0xFFFFFFFFu;
  const auto length32 = static_cast<std::int32_t>(length);
  std::memcpy(framed.data(), &continuation, 4);
  std::memcpy(framed.data() + 4, &length32, 4);
  if (!flatbuffer.empty()) std::memcpy(framed.data() + 8, flatbuffer.data(), flatbuffer.size());
  return framed;
}

IpcStreamWriter::IpcStreamWriter(ByteSink sink, const std::vector<WriteColumn>& columns,
                                 const std::vector<std::pair<std::string, std::string>>& metadata)
    : sink_(std::move(sink)) {
  std::vector<fb::NodeRef> fields;
  fields.reserve(columns.size());
  for (const auto& column : columns) fields.push_back(column_field(column));
  std::vector<fb::NodeRef> pairs;
  pairs.reserve(metadata.size());
  for (const auto& [key, value] : metadata) {
    pairs.push_back(fb::TableBuilder()
                        .add_ref(0, fb::make_string(key))
                        .add_ref(1, fb::make_string(value))
                        .build());
  }
  auto schema = fb::TableBuilder().add_ref(1, fb::make_table_vector(std::move(fields)));
  if (!pairs.empty()) schema.add_ref(2, fb::make_table_vector(std::move(pairs)));
  emit_message(message(kHeaderSchema, schema.build(), 0));
}

void IpcStreamWriter::write_batch(std::int64_t length, const std::vector<WriteNode>& nodes,
                                  const std::vector<std::span<const std::uint8_t>>& buffers) {
  require(!closed_, ErrorKind::kRuntime, "IpcStreamWriter: write_batch after close");
  std::string node_bytes;
  for (const auto& node : nodes) {
    append_i64(&node_bytes, node.length);
    append_i64(&node_bytes, node.null_count);
  }
  std::string buffer_bytes;
  std::size_t body = 0;
  for (const auto& buffer : buffers) {
    append_i64(&buffer_bytes, static_cast<std::int64_t>(body));
    append_i64(&buffer_bytes, static_cast<std::int64_t>(buffer.size()));
    body += padded(buffer.size());
  }
  auto header =
      fb::TableBuilder()
          .add_i64(0, length)
          .add_ref(1, fb::make_bytes_vector(std::move(node_bytes),
                                            static_cast<std::uint32_t>(nodes.size()), 8))
          .add_ref(2, fb::make_bytes_vector(std::move(buffer_bytes),
                                            static_cast<std::uint32_t>(buffers.size()), 8))
          .build();
  emit_message(message(kHeaderRecordBatch, std::move(header), static_cast<std::int64_t>(body)));
  static const std::uint8_t zeros[kAlignment] = {};
  for (const auto& buffer : buffers) {
    emit(buffer);
    emit({zeros, padded(buffer.size()) - buffer.size()});
  }
}

void IpcStreamWriter::close() {
  if (closed_) return;
  const std::uint8_t marker[8] = {0xFF, 0xFF, 0xFF, 0xFF, 0, 0, 0, 0};
  emit(marker);
  closed_ = true;
}

void IpcStreamWriter::emit(std::span<const std::uint8_t> bytes) {
  if (bytes.empty()) return;
  sink_(bytes);
  bytes_written_ += bytes.size();
}

void IpcStreamWriter::emit_message(const std::vector<std::uint8_t>& flatbuffer) {
  const auto framed = frame_message(flatbuffer);
  emit(framed);
}

}  // namespace draftfeed::arrow
