// A hand-written reader for the Arrow IPC *stream* format, as Hugging Face `save_to_disk` writes
// it.
//
// Why by hand: Arrow C++ is not packaged for this platform, and draftfeed needs only a subset:
// the schema, and the buffers of each record batch as zero-copy spans into the mapped file.
//
// Framing (Arrow columnar format spec): a sequence of messages, each
//   [0xFFFFFFFF continuation] [int32 metadata length] [flatbuffer Message, padded] [body]
// ended by a zero metadata length (the end-of-stream marker). Streams written before Arrow 0.15
// have no continuation word. A file that starts with the `ARROW1` magic (the IPC *file* format) is
// read through its embedded stream. The first message is the Schema; then RecordBatch messages
// (and DictionaryBatch messages, which are skipped: no column draftfeed reads may be
// dictionary-encoded; see token_columns.h).
//
// What is checked here, for every column: each message lies inside the file, every buffer lies
// inside its message body, the field nodes and buffers are enough for the schema, and every
// top-level column has the batch's row count. What is refused: compressed bodies, big-endian data,
// metadata versions before V4, a missing end-of-stream marker (the classic sign of truncation).
// The *contents* of buffers (offsets, validity bits) are checked by the code that reads them.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "draftfeed/common/error.h"

namespace draftfeed::arrow {

// The Type union's member codes, as numbered in Arrow's Schema.fbs.
enum class TypeId : std::uint8_t {
  kNull = 1,
  kInt = 2,
  kFloatingPoint = 3,
  kBinary = 4,
  kUtf8 = 5,
  kBool = 6,
  kDecimal = 7,
  kDate = 8,
  kTime = 9,
  kTimestamp = 10,
  kInterval = 11,
  kList = 12,
  kStruct = 13,
  kUnion = 14,
  kFixedSizeBinary = 15,
  kFixedSizeList = 16,
  kMap = 17,
  kDuration = 18,
  kLargeBinary = 19,
  kLargeUtf8 = 20,
  kLargeList = 21,
  kRunEndEncoded = 22,
  kBinaryView = 23,
  kUtf8View = 24,
  kListView = 25,
  kLargeListView = 26,
};

// One schema field. Parameters not listed here are kept only in `type` (the text form).
struct Field {
  std::string name;
  TypeId type_id = TypeId::kNull;
  std::string type;        // e.g. "list<int64>", "struct<role: string, content: string>"
  int bit_width = 0;       // kInt only: 8, 16, 32 or 64
  bool is_signed = false;  // kInt only
  bool dense_union = false;
  bool nullable = true;
  bool dictionary_encoded = false;  // the batch holds dictionary *indices* (an Int column)
  std::vector<Field> children;
};

// One array of one record batch: its field node and buffers, in the IPC layout of its type
// (validity first). Spans point into the mapped file; a length-0 span is an absent buffer.
struct ArrayView {
  std::int64_t length = 0;
  std::int64_t null_count = 0;
  std::vector<std::span<const std::uint8_t>> buffers;
  std::vector<ArrayView> children;
};

struct RecordBatchView {
  std::int64_t length = 0;
  std::uint64_t file_offset = 0;  // where its message starts, for error messages
  std::vector<ArrayView> columns;
};

struct IpcStream {
  std::vector<Field> fields;
  std::vector<RecordBatchView> batches;
  int metadata_version = 0;  // 3 = V4, 4 = V5
  bool legacy_framing = false;
};

// Parses a whole stream held in `bytes` (a mapped shard, or any buffer for tests and fuzzing).
// `name` (usually the file path) starts every error message. The spans in the result point into
// `bytes`, which must outlive it. Errors: kFormat for corrupt bytes, kUnsupported for valid Arrow
// features draftfeed does not read (compression, big-endian, old metadata).
Result<IpcStream> read_ipc_stream(std::span<const std::uint8_t> bytes, const std::string& name);

// Text form of a type, in pyarrow's spelling for the common cases ("int64", "list<int32>",
// "large_list<int64>", "string", "struct<a: int64>").
std::string type_string(const Field& field);

// How many buffers a field of this type owns in a record batch (not counting its children's, and
// not counting variadic data buffers of view types). `metadata_version` matters for unions (V4
// unions had a validity buffer).
int buffer_count(const Field& field, int metadata_version);

// Limits on untrusted metadata: nesting depth of fields and the number of fields in a schema.
inline constexpr int kMaxFieldDepth = 64;
inline constexpr std::size_t kMaxFields = 1 << 16;

}  // namespace draftfeed::arrow
