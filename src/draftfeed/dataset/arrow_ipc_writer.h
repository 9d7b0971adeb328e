// Writes the Arrow IPC stream format for integer and list-of-integer columns (what a token
// dataset holds). The output reads back with pyarrow and with `datasets.load_from_disk`.
//
// Layout written: [0xFFFFFFFF][int32 metadata length][Message flatbuffer, padded to 8][body],
// metadata version V5, buffers at 8-byte aligned body offsets, no validity buffers (the writer has
// no nulls), the end-of-stream marker on close().
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace draftfeed::arrow {

// A column the writer can describe: an integer, or a (large) list of integers (child "item").
struct WriteColumn {
  std::string name;
  bool is_list = false;
  bool large_list = false;
  int bit_width = 64;
  bool is_signed = true;
};

// A field node: the length and null count of one array in a record batch, in schema pre-order.
struct WriteNode {
  std::int64_t length = 0;
  std::int64_t null_count = 0;
};

using ByteSink = std::function<void(std::span<const std::uint8_t>)>;

class IpcStreamWriter {
 public:
  // Writes the schema message. `metadata` becomes the schema's custom metadata (key, value).
  IpcStreamWriter(ByteSink sink, const std::vector<WriteColumn>& columns,
                  const std::vector<std::pair<std::string, std::string>>& metadata = {});

  // Writes one record batch: `nodes` and `buffers` follow the IPC layout in schema pre-order
  // (int column: node + [validity, values]; list column: node + [validity, offsets], then the
  // child's node + [validity, values]). An empty span is an absent buffer.
  void write_batch(std::int64_t length, const std::vector<WriteNode>& nodes,
                   const std::vector<std::span<const std::uint8_t>>& buffers);

  // Writes the end-of-stream marker. Nothing may be written after it.
  void close();

  std::uint64_t bytes_written() const { return bytes_written_; }

 private:
  void emit(std::span<const std::uint8_t> bytes);
  void emit_message(const std::vector<std::uint8_t>& flatbuffer);

  ByteSink sink_;
  std::uint64_t bytes_written_ = 0;
  bool closed_ = false;
};

// Encodes one framed message (continuation, length, padded flatbuffer) with no body; exposed for
// tests that build malformed streams.
std::vector<std::uint8_t> frame_message(const std::vector<std::uint8_t>& flatbuffer);

}  // namespace draftfeed::arrow
