#include "draftfeed/dataset/arrow_ipc.h"

#include <cstring>

#include "draftfeed/common/fault_guard.h"
#include "draftfeed/dataset/arrow_schema.h"
#include "draftfeed/dataset/flatbuffer_reader.h"

namespace draftfeed::arrow {

namespace {

// MessageHeader union codes and table slots (Arrow's Message.fbs).
constexpr std::uint8_t kHeaderSchema = 1;
constexpr std::uint8_t kHeaderDictionaryBatch = 2;
constexpr std::uint8_t kHeaderRecordBatch = 3;
constexpr int kMessageVersion = 0;
constexpr int kMessageHeaderType = 1;
constexpr int kMessageHeader = 2;
constexpr int kMessageBodyLength = 3;
constexpr int kBatchLength = 0;
constexpr int kBatchNodes = 1;
constexpr int kBatchBuffers = 2;
constexpr int kBatchCompression = 3;
constexpr int kBatchVariadicCounts = 4;
constexpr std::int16_t kMetadataV4 = 3;
constexpr std::int16_t kMetadataV5 = 4;
constexpr std::uint32_t kContinuation = 0xFFFFFFFFu;
constexpr std::uint32_t kStructSize = 16;  // FieldNode and Buffer: two int64 each

std::string at_byte(std::uint64_t pos) { return " at byte " + std::to_string(pos); }

// Walks the flattened field nodes and buffers of one record batch in schema pre-order.
class BatchLoader {
 public:
  BatchLoader(const fb::Vector& nodes, const fb::Vector& buffers, const fb::Vector& variadic,
              std::span<const std::uint8_t> body, int metadata_version, const std::string& where)
      : nodes_(nodes),
        buffers_(buffers),
        variadic_(variadic),
        body_(body),
        version_(metadata_version),
        where_(where) {}

  ArrayView load(const Field& field) {
    ArrayView array;
    if (node_ >= nodes_.size()) {
      fail("has " + std::to_string(nodes_.size()) +
           " field nodes, fewer than the schema needs (field '" + field.name + "')");
    }
    array.length = nodes_.scalar<std::int64_t>(node_, 0);
    array.null_count = nodes_.scalar<std::int64_t>(node_, 8);
    ++node_;
    if (array.length < 0 || array.null_count < 0 || array.null_count > array.length) {
      fail("field '" + field.name + "' has length " + std::to_string(array.length) +
           " and null count " + std::to_string(array.null_count));
    }
    std::int64_t count = buffer_count(field, version_);
    if (!field.dictionary_encoded &&
        (field.type_id == TypeId::kBinaryView || field.type_id == TypeId::kUtf8View)) {
      if (variadic_index_ >= variadic_.size()) {
        fail("lacks the variadic buffer count of view field '" + field.name + "'");
      }
      const auto extra = variadic_.scalar<std::int64_t>(variadic_index_++);
      if (extra < 0 || extra > static_cast<std::int64_t>(buffers_.size())) {
        fail("claims " + std::to_string(extra) + " variadic buffers for field '" + field.name +
             "' but has " + std::to_string(buffers_.size()) + " buffers");
      }
      count += extra;
    }
    for (std::int64_t i = 0; i < count; ++i) array.buffers.push_back(next_buffer(field));
    // A dictionary-encoded field's batch array holds only indices: its children belong to the
    // dictionary's value type and travel in DictionaryBatch messages.
    if (!field.dictionary_encoded) {
      for (const auto& child : field.children) array.children.push_back(load(child));
    }
    return array;
  }

 private:
  std::span<const std::uint8_t> next_buffer(const Field& field) {
    if (buffer_ >= buffers_.size()) {
      fail("has " + std::to_string(buffers_.size()) +
           " buffers, fewer than the schema needs (field '" + field.name + "')");
    }
    const auto offset = buffers_.scalar<std::int64_t>(buffer_, 0);
    const auto length = buffers_.scalar<std::int64_t>(buffer_, 8);
    const auto body_size = static_cast<std::int64_t>(body_.size());
    if (offset < 0 || length < 0 || offset > body_size || length > body_size - offset) {
      fail("buffer " + std::to_string(buffer_) + " (field '" + field.name + "') spans bytes [" +
           std::to_string(offset) + ", " + std::to_string(offset) + " + " + std::to_string(length) +
           ") of a " + std::to_string(body_size) + "-byte body");
    }
    ++buffer_;
    return body_.subspan(static_cast<std::size_t>(offset), static_cast<std::size_t>(length));
  }

  [[noreturn]] void fail(const std::string& problem) const {
    throw Error(ErrorKind::kFormat, where_ + " " + problem);
  }

  const fb::Vector& nodes_;
  const fb::Vector& buffers_;
  const fb::Vector& variadic_;
  std::span<const std::uint8_t> body_;
  int version_;
  const std::string& where_;
  std::uint32_t node_ = 0;
  std::uint32_t buffer_ = 0;
  std::uint32_t variadic_index_ = 0;
};

class StreamReader {
 public:
  StreamReader(std::span<const std::uint8_t> bytes, const std::string& name)
      : bytes_(bytes), name_(name) {}

  IpcStream read() {
    std::uint64_t pos = 0;
    if (bytes_.empty()) fail(ErrorKind::kFormat, "is empty (0 bytes; not an Arrow stream)");
    if (bytes_.size() >= 8) {
      char magic[6];
      copy_out(magic, 0, sizeof magic, 0);
      if (std::memcmp(magic, "ARROW1", 6) == 0) pos = 8;
    }
    for (int message = 0;; ++message) {
      const std::uint64_t start = pos;
      const std::uint64_t remaining = bytes_.size() - pos;
      if (remaining == 0) {
        fail(ErrorKind::kFormat, "ends after " + std::to_string(stream_.batches.size()) +
                                     " record batches without the end-of-stream marker "
                                     "(the file is truncated)");
      }
      if (remaining < 4) truncated(start, "message header", 4, remaining);
      std::uint32_t word = load_u32(pos);
      std::int32_t metadata_length = 0;
      if (word == kContinuation) {
        if (remaining < 8) truncated(start, "message header", 8, remaining);
        metadata_length = static_cast<std::int32_t>(load_u32(pos + 4));
        pos += 8;
      } else {
        // Streams from before Arrow 0.15: the length word comes first.
        stream_.legacy_framing = true;
        metadata_length = static_cast<std::int32_t>(word);
        pos += 4;
      }
      if (metadata_length == 0) break;  // end-of-stream marker
      if (metadata_length < 0) {
        fail(ErrorKind::kFormat, "message " + std::to_string(message) + at_byte(start) +
                                     " has a negative metadata length " +
                                     std::to_string(metadata_length));
      }
      if (static_cast<std::uint64_t>(metadata_length) > bytes_.size() - pos) {
        truncated(start, "metadata", static_cast<std::uint64_t>(metadata_length),
                  bytes_.size() - pos);
      }
      // Parsed from a copy: the parser allocates as it goes, so it must never meet a SIGBUS.
      metadata_.resize(static_cast<std::size_t>(metadata_length));
      copy_out(metadata_.data(), pos, metadata_.size(), start);
      pos += static_cast<std::uint64_t>(metadata_length);
      pos = read_message(message, start, metadata_, pos);
    }
    if (!have_schema_) fail(ErrorKind::kFormat, "holds no schema message");
    return std::move(stream_);
  }

 private:
  // Parses one message whose metadata is `metadata` and whose body starts at `body_start`;
  // returns the position after the body.
  std::uint64_t read_message(int index, std::uint64_t start, std::span<const std::uint8_t> metadata,
                             std::uint64_t body_start) {
    const std::string where = name_ + ": message " + std::to_string(index) + at_byte(start);
    const fb::Buffer buffer(metadata, &where);
    const fb::Table message = buffer.root();
    const auto version = message.scalar<std::int16_t>(kMessageVersion, 0);
    if (version < kMetadataV4 || version > kMetadataV5) {
      throw Error(ErrorKind::kUnsupported, where + " uses Arrow metadata version V" +
                                               std::to_string(version + 1) +
                                               "; draftfeed reads V4 and V5 (Arrow 0.8 and later)");
    }
    if (stream_.metadata_version != 0 && stream_.metadata_version != version) {
      throw Error(ErrorKind::kFormat, where + " has metadata version V" +
                                          std::to_string(version + 1) +
                                          " but the stream began with V" +
                                          std::to_string(stream_.metadata_version + 1));
    }
    stream_.metadata_version = version;
    const auto body_length = message.scalar<std::int64_t>(kMessageBodyLength, 0);
    if (body_length < 0 || static_cast<std::uint64_t>(body_length) > bytes_.size() - body_start) {
      throw Error(ErrorKind::kFormat, where + " has a " + std::to_string(body_length) +
                                          "-byte body but only " +
                                          std::to_string(bytes_.size() - body_start) +
                                          " bytes remain in the file (truncated?)");
    }
    const auto body =
        bytes_.subspan(static_cast<std::size_t>(body_start), static_cast<std::size_t>(body_length));
    const auto header_type = message.scalar<std::uint8_t>(kMessageHeaderType, 0);
    fb::Table header;
    if (!message.table(kMessageHeader, &header)) {
      throw Error(ErrorKind::kFormat, where + " has no header");
    }
    if (header_type == kHeaderSchema) {
      if (have_schema_) throw Error(ErrorKind::kFormat, where + " is a second schema message");
      ParsedSchema schema = parse_schema(header, where);
      if (schema.big_endian) {
        throw Error(ErrorKind::kUnsupported,
                    where + ": the schema is big-endian; draftfeed reads little-endian data");
      }
      stream_.fields = std::move(schema.fields);
      have_schema_ = true;
    } else if (!have_schema_) {
      throw Error(ErrorKind::kFormat, where + " comes before the schema message");
    } else if (header_type == kHeaderRecordBatch) {
      read_record_batch(header, body, start, where);
    } else if (header_type != kHeaderDictionaryBatch) {
      // Dictionary batches are skipped (see arrow_ipc.h); anything else has no place in a stream.
      throw Error(ErrorKind::kFormat, where + " has message type " + std::to_string(header_type) +
                                          " (expected a schema, record batch or dictionary batch)");
    }
    return body_start + static_cast<std::uint64_t>(body_length);
  }

  void read_record_batch(const fb::Table& header, std::span<const std::uint8_t> body,
                         std::uint64_t start, const std::string& where) {
    const std::string batch_where = name_ + ": record batch " +
                                    std::to_string(stream_.batches.size()) + " (message" +
                                    at_byte(start) + ")";
    fb::Table compression;
    if (header.table(kBatchCompression, &compression)) {
      const auto codec = compression.scalar<std::int8_t>(0, 0);
      const std::string codec_name = codec == 0 ? "lz4_frame" : codec == 1 ? "zstd" : "unknown";
      throw Error(ErrorKind::kUnsupported,
                  batch_where + " is compressed (" + codec_name +
                      "); draftfeed reads uncompressed shards only (save it again with datasets, "
                      "which writes uncompressed)");
    }
    RecordBatchView batch;
    batch.file_offset = start;
    batch.length = header.scalar<std::int64_t>(kBatchLength, 0);
    if (batch.length < 0) {
      throw Error(ErrorKind::kFormat,
                  where + " has a negative row count " + std::to_string(batch.length));
    }
    fb::Vector nodes, buffers, variadic;
    header.vector(kBatchNodes, kStructSize, &nodes);
    header.vector(kBatchBuffers, kStructSize, &buffers);
    header.vector(kBatchVariadicCounts, 8, &variadic);
    BatchLoader loader(nodes, buffers, variadic, body, stream_.metadata_version, batch_where);
    for (const auto& field : stream_.fields) {
      batch.columns.push_back(loader.load(field));
      if (batch.columns.back().length != batch.length) {
        throw Error(ErrorKind::kFormat, batch_where + ": column '" + field.name + "' has " +
                                            std::to_string(batch.columns.back().length) +
                                            " rows but the batch has " +
                                            std::to_string(batch.length));
      }
    }
    stream_.batches.push_back(std::move(batch));
  }

  std::uint32_t load_u32(std::uint64_t pos) const {
    std::uint32_t value;
    copy_out(&value, pos, 4, pos);
    return value;
  }

  // Copies `size` bytes at `pos` of the stream out under the fault guard: a mapped shard truncated
  // by another process while it is read is an error naming it, never a SIGBUS. (The checks above
  // have kept [pos, pos + size) inside the bytes the stream had when it was mapped.)
  void copy_out(void* out, std::uint64_t pos, std::size_t size, std::uint64_t message) const {
    if (!reads_.copy(out, bytes_.data() + pos, size)) {
      fail(ErrorKind::kIo, "shrank while the message" + at_byte(message) +
                               " was read (truncated or rewritten by another process)");
    }
  }

  [[noreturn]] void truncated(std::uint64_t start, const char* what, std::uint64_t needed,
                              std::uint64_t available) const {
    fail(ErrorKind::kFormat, "is truncated: the message" + at_byte(start) + " needs " +
                                 std::to_string(needed) + " bytes of " + what + " but only " +
                                 std::to_string(available) + " remain");
  }

  [[noreturn]] void fail(ErrorKind kind, const std::string& problem) const {
    throw Error(kind, name_ + ": " + problem);
  }

  std::span<const std::uint8_t> bytes_;
  const std::string& name_;
  IpcStream stream_;
  std::vector<std::uint8_t> metadata_;  // the message being parsed, copied out of bytes_
  MappedReadScope reads_;               // the guards of the copies out of bytes_
  bool have_schema_ = false;
};

}  // namespace

Result<IpcStream> read_ipc_stream(std::span<const std::uint8_t> bytes, const std::string& name) {
  try {
    return StreamReader(bytes, name).read();
  } catch (const Error& error) {
    return error;
  }
}

}  // namespace draftfeed::arrow
