#include "draftfeed/pack/shard_layout.h"

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

namespace draftfeed {

namespace {

using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;

constexpr std::size_t kMaxPartName = 256;
constexpr std::uint64_t kMaxDecodedBytes = std::uint64_t{1} << 40;

std::size_t alignment_of(DType dtype) {
  const std::size_t size = dtype_size(dtype);
  return size == 0 ? 1 : std::min<std::size_t>(size, 8);
}

void append_pad(EncodedSample& sample, std::size_t align, int& pads) {
  const std::size_t misfit = sample.bytes.size() % align;
  if (misfit == 0) return;
  const std::size_t n = align - misfit;
  EncodedPart pad;
  pad.name = std::to_string(sample.row) + "/__pad" + std::to_string(pads++) + "__";
  pad.shape = {static_cast<std::int64_t>(n)};
  pad.begin = sample.bytes.size();
  sample.bytes.resize(sample.bytes.size() + n, 0);
  pad.end = sample.bytes.size();
  sample.parts.push_back(std::move(pad));
}

void append_part(EncodedSample& sample, EncodedPart part, std::span<const std::uint8_t> bytes) {
  part.begin = sample.bytes.size();
  sample.bytes.insert(sample.bytes.end(), bytes.begin(), bytes.end());
  part.end = sample.bytes.size();
  sample.parts.push_back(std::move(part));
}

Error bad(const std::string& name, const std::string& what) {
  return Error(ErrorKind::kFormat, name + ": " + what);
}

// "<row>/<part>" split, the row in canonical decimal (no sign, no leading zero), else nothing.
std::optional<std::pair<std::int64_t, std::string>> split_name(const std::string& name) {
  const std::size_t slash = name.find('/');
  if (slash == std::string::npos || slash == 0 || slash > 16) return std::nullopt;
  const std::string digits = name.substr(0, slash);
  if (digits.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  if (digits.size() > 1 && digits[0] == '0') return std::nullopt;
  const std::string part = name.substr(slash + 1);
  if (part.empty() || part.size() > kMaxPartName) return std::nullopt;
  return std::make_pair(static_cast<std::int64_t>(std::stoll(digits)), part);
}

bool is_pad_name(const std::string& part) {
  if (part.size() < 8 || part.compare(0, 5, "__pad") != 0) return false;
  if (part.compare(part.size() - 2, 2, "__") != 0) return false;
  const std::string digits = part.substr(5, part.size() - 7);
  return !digits.empty() && digits.size() <= 4 &&
         digits.find_first_not_of("0123456789") == std::string::npos;
}

// A compressed part's metadata ({"codec", "dtype", "shape"}) into `packed`, or why not.
std::optional<std::string> read_codec_metadata(const std::string& text, const TensorView& view,
                                               PackedPart& packed) {
  const json info = json::parse(text, nullptr, /*allow_exceptions=*/false);
  const auto field = [&](const char* key) -> const json* {
    if (!info.is_object()) return nullptr;
    const auto it = info.find(key);
    return it == info.end() ? nullptr : &*it;
  };
  const json* codec = field("codec");
  const json* dtype_text = field("dtype");
  const json* shape = field("shape");
  if (codec == nullptr || !codec->is_string() || *codec != kPlaneCodecName ||
      dtype_text == nullptr || !dtype_text->is_string() || shape == nullptr || !shape->is_array() ||
      shape->size() > 8) {
    return std::string("its metadata is not {\"codec\": \"") + kPlaneCodecName +
           "\", \"dtype\", \"shape\"}";
  }
  const auto dtype = dtype_from_name(dtype_text->get<std::string>());
  if (!dtype || !plane_codec_supports(*dtype)) {
    return "the codec does not code dtype " + dtype_text->get<std::string>().substr(0, 16);
  }
  if (view.dtype != DType::kU8 || view.shape.size() != 1) return "a compressed part is U8 [n]";
  std::vector<std::int64_t> dims;
  std::uint64_t elements = 1;
  for (const json& d : *shape) {
    if (!d.is_number_integer() || d.get<std::int64_t>() < 0) {
      return "a shape of non-negative integers is needed";
    }
    const auto v = static_cast<std::uint64_t>(d.get<std::int64_t>());
    if (v != 0 && elements > kMaxDecodedBytes / v) return "the decoded shape is over 2^40 bytes";
    elements *= v;
    dims.push_back(static_cast<std::int64_t>(v));
  }
  if (elements > kMaxDecodedBytes / dtype_size(*dtype)) {
    return "the decoded shape is over 2^40 bytes";
  }
  // The codec stores one plane as it is (a byte per bf16 value, a nibble per FP8 value): a blob
  // decodes to at most twice its bytes. A shape that says more is a lie, refused before anything
  // is allocated for it.
  const std::uint64_t decoded = elements * dtype_size(*dtype);
  if (decoded > 2 * static_cast<std::uint64_t>(view.nbytes) + 64) {
    return "the decoded shape needs " + std::to_string(decoded) + " bytes, more than a blob of " +
           std::to_string(view.nbytes) + " bytes decodes to";
  }
  packed.compressed = true;
  packed.dtype = *dtype;
  packed.shape = std::move(dims);
  packed.decoded_bytes = decoded;
  return std::nullopt;
}

}  // namespace

EncodedSample encode_pack_sample(std::int64_t row, const SafetensorsFile& file, bool compress,
                                 const PlaneCodecOptions& codec) {
  EncodedSample sample;
  sample.row = row;
  sample.file_bytes = file.file_size();
  const std::string prefix = std::to_string(row) + "/";
  for (const TensorView& view : file.tensors()) {
    require(!view.name.empty() && view.name.size() <= kMaxPartName &&
                view.name.compare(0, 2, "__") != 0,
            ErrorKind::kInvalidArgument,
            file.path() + ": tensor name \"" + view.name.substr(0, 64) +
                "\" cannot be packed (empty, over 256 bytes, or starting with \"__\")");
  }
  const std::size_t header_bytes = 8 + file.header_size();
  EncodedPart header;
  header.name = prefix + kPackHeaderPart;
  header.shape = {static_cast<std::int64_t>(header_bytes)};
  append_part(sample, std::move(header), file.mapping()->bytes().first(header_bytes));
  int pads = 0;
  for (const TensorView& view : file.tensors()) {
    EncodedPart part;
    part.name = prefix + view.name;
    const bool is_hidden = view.name == "hidden_states";
    if (is_hidden) sample.original_hidden = view.nbytes;
    if (compress && is_hidden && plane_codec_supports(view.dtype)) {
      std::vector<std::uint8_t> blob = plane_encode(view.dtype, view.bytes(), codec);
      if (blob.size() < view.nbytes) {
        json meta = {{"codec", kPlaneCodecName},
                     {"dtype", std::string(dtype_name(view.dtype))},
                     {"shape", view.shape}};
        part.codec_metadata = meta.dump();
        part.shape = {static_cast<std::int64_t>(blob.size())};
        sample.stored_hidden = blob.size();
        append_part(sample, std::move(part), blob);
        continue;
      }
    }
    if (is_hidden) sample.stored_hidden = view.nbytes;
    part.dtype = view.dtype;
    part.shape = view.shape;
    append_pad(sample, alignment_of(view.dtype), pads);
    append_part(sample, std::move(part), view.bytes());
  }
  append_pad(sample, 8, pads);
  return sample;
}

std::string pack_shard_header(std::span<const EncodedSample* const> samples,
                              const std::string& codec) {
  ordered_json header = ordered_json::object();
  ordered_json metadata = ordered_json::object();
  metadata["format"] = "draftfeed-pack";
  metadata["format_version"] = "1";
  metadata["codec"] = codec;
  for (const EncodedSample* sample : samples) {
    for (const EncodedPart& part : sample->parts) {
      if (!part.codec_metadata.empty()) metadata[part.name] = part.codec_metadata;
    }
  }
  header["__metadata__"] = std::move(metadata);
  std::uint64_t at = 0;
  for (const EncodedSample* sample : samples) {
    for (const EncodedPart& part : sample->parts) {
      header[part.name] = {{"dtype", std::string(dtype_name(part.dtype))},
                           {"shape", part.shape},
                           {"data_offsets", {at + part.begin, at + part.end}}};
    }
    at += sample->bytes.size();
  }
  std::string text = header.dump();
  // As the safetensors package: spaces until the data (after the 8-byte size) starts at a multiple
  // of 8.
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

Result<std::unordered_map<std::int64_t, PackedSampleParts>> index_pack_shard(
    std::span<const TensorView> tensors, const std::map<std::string, std::string>& metadata,
    const std::string& name) {
  std::unordered_map<std::int64_t, PackedSampleParts> index;
  std::int64_t current = -1;  // the row whose tensors are being read (they are contiguous)
  for (const TensorView& view : tensors) {
    const auto split = split_name(view.name);
    if (!split) {
      return bad(name, "tensor \"" + view.name.substr(0, 80) + "\" at offset " +
                           std::to_string(view.file_offset) + " is not named <row>/<part>");
    }
    const auto& [row, part] = *split;
    const std::string where = "row " + std::to_string(row) + ", tensor " + view.name.substr(0, 80) +
                              " at offset " + std::to_string(view.file_offset);
    if (part == kPackHeaderPart) {
      if (index.contains(row)) return bad(name, where + ": a second header for the row");
      if (view.dtype != DType::kU8 || view.shape.size() != 1 || view.nbytes < 8) {
        return bad(name, where + ": the header part is not U8 [8 + N]");
      }
      PackedSampleParts& sample = index[row];
      sample.row = row;
      sample.header = view;
      sample.begin = view.file_offset;
      sample.end = view.file_offset + view.nbytes;
      current = row;
      continue;
    }
    if (row != current) {
      return bad(name, where +
                           ": not after its row's header (a sample's tensors are contiguous, "
                           "its header first)");
    }
    PackedSampleParts& sample = index[row];
    sample.end = view.file_offset + view.nbytes;
    if (is_pad_name(part)) {
      if (view.dtype != DType::kU8 || view.shape.size() != 1 || view.nbytes >= 8) {
        return bad(name, where + ": padding is U8 [1..7]");
      }
      continue;
    }
    if (part.compare(0, 2, "__") == 0) return bad(name, where + ": unknown reserved part");
    PackedPart packed;
    packed.name = part;
    packed.view = view;
    packed.dtype = view.dtype;
    packed.shape = view.shape;
    packed.decoded_bytes = view.nbytes;
    const auto meta = metadata.find(view.name);
    if (meta != metadata.end()) {
      // A part's codec metadata that lies costs its row only (the row's reads fail with the
      // reason), not the shard's other rows.
      if (auto problem = read_codec_metadata(meta->second, view, packed)) {
        if (sample.problem.empty()) sample.problem = where + ": " + *problem;
      }
    }
    sample.parts.push_back(std::move(packed));
  }
  if (index.size() > kMaxShardSamples) {
    return bad(name, std::to_string(index.size()) + " samples, more than a shard may hold (" +
                         std::to_string(kMaxShardSamples) + ")");
  }
  return index;
}

std::optional<Error> check_parts_against_header(const PackedSampleParts& parts,
                                                std::span<const std::uint8_t> header,
                                                std::uint64_t file_bytes,
                                                const std::string& where) {
  auto layout = parse_safetensors_header(header, file_bytes, where + ": its per-sample header");
  if (!layout.ok()) return layout.error();
  const std::vector<TensorView>& tensors = layout.value().tensors;
  if (tensors.size() != parts.parts.size()) {
    return bad(where, "the shard holds " + std::to_string(parts.parts.size()) +
                          " parts of the row, its per-sample header names " +
                          std::to_string(tensors.size()) + " tensors");
  }
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const TensorView& own = tensors[i];
    const PackedPart& part = parts.parts[i];
    const std::string what = "part " + std::to_string(i) + " (" + part.name.substr(0, 80) + ")";
    if (own.name != part.name) {
      return bad(where, what + ": the per-sample header names tensor " + own.name.substr(0, 80) +
                            " there");
    }
    if (own.dtype != part.dtype || own.shape != part.shape) {
      return bad(where, what + ": the shard's header says " + std::string(dtype_name(part.dtype)) +
                            " " + shape_to_string(part.shape) + ", the sample's own header " +
                            std::string(dtype_name(own.dtype)) + " " + shape_to_string(own.shape));
    }
    if (own.nbytes != part.decoded_bytes) {
      return bad(where, what + ": " + std::to_string(part.decoded_bytes) + " bytes in the shard, " +
                            std::to_string(own.nbytes) + " in the sample's own header");
    }
  }
  return std::nullopt;
}

}  // namespace draftfeed
