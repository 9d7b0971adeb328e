// What a packed shard holds (docs/formats.md, "Packed caches"): a safetensors file whose tensors
// are the samples' parts, named `<row>/<part>`:
//   <row>/__header__     U8 [8 + N]  the per-sample file's size field and JSON header, verbatim
//   <row>/<name>         each tensor of the per-sample file, in its file order (token_ids,
//                        hidden_states, hidden_states_scales), as it was; or, compressed, a U8
//                        blob of pack/plane_codec.h whose codec, dtype and shape the shard's
//                        `__metadata__` holds under the same name (a JSON string)
//   <row>/__pad<k>__     U8 zero bytes, so every tensor starts aligned to its element size and
//                        every sample to 8 bytes (torch views a tensor only at an aligned offset)
// A sample's tensors are contiguous: the manifest's (offset, length) covers exactly them.
// Unpacking writes the header, then the parts in order, decoded: the per-sample file, byte for
// byte.
//
// index_pack_shard reads that structure back from an untrusted shard (after parse_safetensors
// checked the file's layout): names, row numbers, metadata, sizes, each refusal naming the shard
// and the tensor. A shard whose structure is broken (names, order) is refused whole; a part's
// codec metadata that lies marks its row only (PackedSampleParts::problem). It is the shard-index
// fuzz target's entry point.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "draftfeed/common/dtype.h"
#include "draftfeed/common/error.h"
#include "draftfeed/hidden/safetensors.h"
#include "draftfeed/pack/plane_codec.h"

namespace draftfeed {

inline constexpr const char* kPackHeaderPart = "__header__";
inline constexpr std::size_t kMaxShardSamples = 50'000;

// One part of an encoded sample, its bytes at [begin, end) of the sample's bytes.
struct EncodedPart {
  std::string name;  // "<row>/<part>"
  DType dtype = DType::kU8;
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
  std::string codec_metadata;  // for a compressed part: its __metadata__ value, else empty
};

// A sample ready to be appended to a shard: its bytes (a multiple of 8) and its parts.
struct EncodedSample {
  std::int64_t row = 0;
  std::vector<std::uint8_t> bytes;
  std::vector<EncodedPart> parts;
  std::uint64_t file_bytes = 0;       // the per-sample file's size
  std::uint64_t stored_hidden = 0;    // the hidden states' bytes as stored (compressed or not)
  std::uint64_t original_hidden = 0;  // and as they were
};

// Encodes the per-sample file `file` of `row`; `compress`: its `hidden_states` through the plane
// codec when it is BF16 or F8_E4M3 and the blob is smaller. Throws Error(kInvalidArgument) for a
// file whose tensor names the pack cannot hold (empty, starting with "__", over 256 bytes).
EncodedSample encode_pack_sample(std::int64_t row, const SafetensorsFile& file, bool compress,
                                 const PlaneCodecOptions& codec = {});

// The shard's header bytes (size field excluded, padded so the data starts at a multiple of 8)
// for `samples` laid out back to back in this order.
std::string pack_shard_header(std::span<const EncodedSample* const> samples,
                              const std::string& codec);

// A part of a packed sample, as the reader finds it.
struct PackedPart {
  std::string name;  // without the "<row>/"
  TensorView view;   // the stored tensor
  bool compressed = false;
  DType dtype = DType::kU8;         // the tensor's own dtype (compressed: before coding)
  std::vector<std::int64_t> shape;  // and shape
  std::uint64_t decoded_bytes = 0;  // its bytes decoded
};

struct PackedSampleParts {
  std::int64_t row = 0;
  TensorView header;              // <row>/__header__
  std::vector<PackedPart> parts;  // in file order, pads left out
  std::uint64_t begin = 0;        // file offset of the sample's first byte
  std::uint64_t end = 0;          // and one past its last (pads included)
  // Why the row cannot be read (a part's codec metadata that lies), naming the part; empty when
  // it can. The shard's other rows are read as usual.
  std::string problem;
};

// Row -> its parts, for a checked shard's tensors (in file order) and metadata. `name` (the shard's
// path) starts messages.
Result<std::unordered_map<std::int64_t, PackedSampleParts>> index_pack_shard(
    std::span<const TensorView> tensors, const std::map<std::string, std::string>& metadata,
    const std::string& name);

// Checks a packed sample's parts, as the shard's (unchecksummed) header and metadata describe
// them, against the sample's own per-sample header `header` (its `__header__` part, copied out of
// the mapping: the size field and the JSON header, covered by the sample's checksum): the same
// tensors in the same order, each with the same dtype, shape and bytes (decoded, for a compressed
// part), and `file_bytes` (the manifest's size of the per-sample file) what that header describes.
// A shard whose header relabels a part (bf16 bytes called F16, a longer shape) would otherwise
// give other values with a valid checksum. `where` starts the message; errors are kFormat.
std::optional<Error> check_parts_against_header(const PackedSampleParts& parts,
                                                std::span<const std::uint8_t> header,
                                                std::uint64_t file_bytes, const std::string& where);

}  // namespace draftfeed
