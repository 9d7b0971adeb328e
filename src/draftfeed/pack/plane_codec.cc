#include "draftfeed/pack/plane_codec.h"

#include <zstd.h>

#include <algorithm>
#include <cstring>
#include <memory>

#include "draftfeed/common/cpu_features.h"
#include "draftfeed/common/xxh64.h"

namespace draftfeed {

namespace {

constexpr std::uint8_t kMagic[4] = {'D', 'F', 'P', 'Z'};
constexpr std::uint8_t kVersionZstd = 1;     // modes raw and zstd
constexpr std::uint8_t kVersionHuffman = 2;  // and the Huffman mode
constexpr std::uint8_t kKindBF16 = 1;
constexpr std::uint8_t kKindFP8 = 2;
constexpr std::size_t kHeaderBytes = 32;
constexpr std::size_t kChunkEntryBytes = 8;
constexpr std::uint32_t kModeRaw = 0;
constexpr std::uint32_t kModeZstd = 1;
constexpr std::uint32_t kModeHuffman = 2;
constexpr std::uint32_t kMaxChunkValues = 1U << 24;
constexpr int kExponentMinMatch = 7;  // zstd's largest

std::uint8_t kind_of(DType dtype) { return dtype == DType::kBF16 ? kKindBF16 : kKindFP8; }

// Plane bytes of a chunk of `values` values.
std::size_t exponent_bytes(std::uint8_t kind, std::size_t values) {
  return kind == kKindBF16 ? values : (values + 1) / 2;
}
std::size_t rest_bytes(std::uint8_t kind, std::size_t values) {
  return kind == kKindBF16 ? values : (values + 1) / 2;
}

void put32(std::vector<std::uint8_t>& out, std::size_t at, std::uint32_t v) {
  std::memcpy(out.data() + at, &v, sizeof v);
}
void put64(std::vector<std::uint8_t>& out, std::size_t at, std::uint64_t v) {
  std::memcpy(out.data() + at, &v, sizeof v);
}
std::uint32_t get32(const std::uint8_t* p) {
  std::uint32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
std::uint64_t get64(const std::uint8_t* p) {
  std::uint64_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// Splits `values` values at `in` into the two planes. Written over whole values (loads and stores
// through memcpy) so that the compiler vectorises the loops.
void split(std::uint8_t kind, const std::uint8_t* in, std::size_t values, std::uint8_t* exponent,
           std::uint8_t* rest) {
  if (kind == kKindBF16) {
    for (std::size_t i = 0; i < values; ++i) {
      std::uint16_t v;
      std::memcpy(&v, in + 2 * i, 2);
      exponent[i] = static_cast<std::uint8_t>(v >> 7);
      rest[i] = static_cast<std::uint8_t>(((v >> 8) & 0x80) | (v & 0x7F));
    }
    return;
  }
  for (std::size_t i = 0; i < values; i += 2) {
    const std::uint8_t a = in[i];
    const std::uint8_t b = i + 1 < values ? in[i + 1] : 0;
    exponent[i / 2] = static_cast<std::uint8_t>(((a >> 3) & 0x0F) | (((b >> 3) & 0x0F) << 4));
    const auto low = static_cast<std::uint8_t>(((a >> 4) & 0x08) | (a & 0x07));
    const auto high = static_cast<std::uint8_t>(((b >> 4) & 0x08) | (b & 0x07));
    rest[i / 2] = static_cast<std::uint8_t>(low | (high << 4));
  }
}

// The inverse of split.
[[gnu::always_inline]] inline void join_values(std::uint8_t kind, const std::uint8_t* exponent,
                                               const std::uint8_t* rest, std::size_t values,
                                               std::uint8_t* out) {
  if (kind == kKindBF16) {
    for (std::size_t i = 0; i < values; ++i) {
      const auto v = static_cast<std::uint16_t>(((rest[i] & 0x80U) << 8) | (exponent[i] << 7) |
                                                (rest[i] & 0x7FU));
      std::memcpy(out + 2 * i, &v, 2);
    }
    return;
  }
  const std::size_t pairs = values / 2;
  for (std::size_t p = 0; p < pairs; ++p) {
    const unsigned e = exponent[p];
    const unsigned r = rest[p];
    out[2 * p] = static_cast<std::uint8_t>(((r & 0x08U) << 4) | ((e & 0x0FU) << 3) | (r & 0x07U));
    out[2 * p + 1] =
        static_cast<std::uint8_t>(((r & 0x80U)) | ((e >> 4) << 3) | ((r >> 4) & 0x07U));
  }
  if (values % 2 != 0) {
    const unsigned e = exponent[pairs] & 0x0FU;
    const unsigned r = rest[pairs] & 0x0FU;
    out[values - 1] = static_cast<std::uint8_t>(((r & 0x08U) << 4) | (e << 3) | (r & 0x07U));
  }
}

// join built twice on x86 (DRAFTFEED_X86, as cpu_features.cc): the compiler vectorises it 32
// bytes at a time with AVX2 (a compressed warm epoch runs it over every value), 16 without.
void join_base(std::uint8_t kind, const std::uint8_t* exponent, const std::uint8_t* rest,
               std::size_t values, std::uint8_t* out) {
  join_values(kind, exponent, rest, values, out);
}
using JoinFn = void (*)(std::uint8_t, const std::uint8_t*, const std::uint8_t*, std::size_t,
                        std::uint8_t*);
#if defined(DRAFTFEED_X86)
__attribute__((target("avx2"))) void join_avx2(std::uint8_t kind, const std::uint8_t* exponent,
                                               const std::uint8_t* rest, std::size_t values,
                                               std::uint8_t* out) {
  join_values(kind, exponent, rest, values, out);
}
const JoinFn join = cpu_has_avx2() ? join_avx2 : join_base;
#else
const JoinFn join = join_base;
#endif

struct CCtxFree {
  void operator()(ZSTD_CCtx* c) const { ZSTD_freeCCtx(c); }
};
struct DCtxFree {
  void operator()(ZSTD_DCtx* d) const { ZSTD_freeDCtx(d); }
};

Error blob_error(std::size_t at, const std::string& what) {
  return Error(ErrorKind::kFormat,
               std::string(kPlaneCodecName) + " blob, byte " + std::to_string(at) + ": " + what);
}

}  // namespace

bool plane_codec_supports(DType dtype) { return dtype == DType::kBF16 || dtype == DType::kF8E4M3; }

namespace {

// A chunk's exponent plane, coded: the stored bytes and the mode, or nothing when coding would
// not make it smaller (the chunk is stored raw).
class ExponentCoder {
 public:
  ExponentCoder(const PlaneCodecOptions& options, std::size_t plane_bytes) : options_(options) {
    if (options.entropy == PlaneEntropy::kHuffman) return;
    cctx_.reset(ZSTD_createCCtx());
    require(cctx_ != nullptr, ErrorKind::kIo, "zstd: cannot create a compression context");
    ZSTD_CCtx_setParameter(cctx_.get(), ZSTD_c_compressionLevel, options.zstd_level);
    // Matches of fewer than 7 bytes: an exponent plane has no long repeats, and the short matches
    // a level picks by default cost more to decode (a sequence each) than the literals they
    // replace, and save no bytes (docs/decisions.md, "Packed caches' codec").
    ZSTD_CCtx_setParameter(cctx_.get(), ZSTD_c_minMatch, kExponentMinMatch);
    // Each chunk's exponent plane becomes one frame; its size is in the chunk table, so the frame
    // carries no checksum and no content size of its own.
    ZSTD_CCtx_setParameter(cctx_.get(), ZSTD_c_checksumFlag, 0);
    ZSTD_CCtx_setParameter(cctx_.get(), ZSTD_c_contentSizeFlag, 0);
    bound_ = ZSTD_compressBound(plane_bytes);
  }

  // The code the chunks share: the blob's whole exponent histogram's.
  void set_blob_histogram(const ByteHistogram& histogram) { blob_ = huffman_lengths(histogram); }

  std::uint32_t code(std::span<const std::uint8_t> plane) {
    packed_.clear();
    if (options_.entropy == PlaneEntropy::kHuffman) return code_huffman(plane);
    packed_.resize(bound_);
    const std::size_t z =
        ZSTD_compress2(cctx_.get(), packed_.data(), packed_.size(), plane.data(), plane.size());
    require(!ZSTD_isError(z), ErrorKind::kIo,
            std::string("zstd: ") + (ZSTD_isError(z) ? ZSTD_getErrorName(z) : ""));
    packed_.resize(z);
    return z < plane.size() ? kModeZstd : kModeRaw;
  }

  std::span<const std::uint8_t> stored() const { return packed_; }

 private:
  std::uint32_t code_huffman(std::span<const std::uint8_t> plane) {
    ByteHistogram histogram{};
    add_to_histogram(histogram, plane);
    const HuffmanLengths own = huffman_lengths(histogram);
    const std::size_t shared_bytes = huffman_stored_bytes(blob_, histogram);
    const std::size_t own_bytes = huffman_stored_bytes(own, histogram);
    // A chunk's own code costs the decoder a table build (a sizeable part of a chunk's decode, see
    // docs/decisions.md): worth it only where it saves more than kOwnCodeSaving of its bytes.
    const bool use_own = own_bytes + shared_bytes / kOwnCodeSaving < shared_bytes;
    if (std::min(own_bytes, shared_bytes) >= plane.size()) return kModeRaw;
    huffman_encode(use_own ? own : blob_, plane, packed_);
    return packed_.size() < plane.size() ? kModeHuffman : kModeRaw;
  }

  static constexpr std::size_t kOwnCodeSaving = 10;  // 10%

  const PlaneCodecOptions& options_;
  std::unique_ptr<ZSTD_CCtx, CCtxFree> cctx_;
  HuffmanLengths blob_{};
  std::size_t bound_ = 0;  // zstd's bound on a frame of a chunk's plane
  std::vector<std::uint8_t> packed_;
};

}  // namespace

PlaneEntropy plane_entropy_for(DType dtype, PlaneEntropy entropy) {
  if (entropy != PlaneEntropy::kAuto) return entropy;
  return dtype == DType::kF8E4M3 ? PlaneEntropy::kZstd : PlaneEntropy::kHuffman;
}

std::vector<std::uint8_t> plane_encode(DType dtype, std::span<const std::uint8_t> bytes,
                                       const PlaneCodecOptions& requested) {
  PlaneCodecOptions options = requested;
  options.entropy = plane_entropy_for(dtype, requested.entropy);
  require(plane_codec_supports(dtype), ErrorKind::kInvalidArgument,
          std::string(kPlaneCodecName) + " codes BF16 and F8_E4M3 tensors, not " +
              std::string(dtype_name(dtype)));
  const std::size_t size = dtype_size(dtype);
  require(bytes.size() % size == 0, ErrorKind::kInvalidArgument,
          std::string(kPlaneCodecName) + ": " + std::to_string(bytes.size()) +
              " bytes are not whole values");
  require(options.chunk_values >= 2 && options.chunk_values <= kMaxChunkValues &&
              options.chunk_values % 2 == 0,
          ErrorKind::kInvalidArgument,
          std::string(kPlaneCodecName) + ": chunk_values must be even, in [2, 2^24]");
  const std::uint8_t kind = kind_of(dtype);
  const std::size_t values = bytes.size() / size;
  const std::size_t chunk = options.chunk_values;
  const std::size_t chunks = (values + chunk - 1) / chunk;
  const bool huffman = options.entropy == PlaneEntropy::kHuffman;
  std::vector<std::uint8_t> out(kHeaderBytes + chunks * kChunkEntryBytes);
  std::memcpy(out.data(), kMagic, 4);
  out[4] = huffman ? kVersionHuffman : kVersionZstd;
  out[5] = kind;
  put64(out, 8, values);
  put32(out, 16, options.chunk_values);
  put32(out, 20, static_cast<std::uint32_t>(chunks));
  put64(out, 24, xxh64(bytes));
  std::vector<std::uint8_t> exponent(exponent_bytes(kind, chunk));
  std::vector<std::uint8_t> rest(rest_bytes(kind, chunk));
  ExponentCoder coder(options, exponent.size());
  auto split_chunk = [&](std::size_t c) {
    const std::size_t first = c * chunk;
    const std::size_t n = std::min(chunk, values - first);
    split(kind, bytes.data() + first * size, n, exponent.data(), rest.data());
    return n;
  };
  if (huffman) {
    ByteHistogram histogram{};
    for (std::size_t c = 0; c < chunks; ++c) {
      add_to_histogram(histogram, {exponent.data(), exponent_bytes(kind, split_chunk(c))});
    }
    coder.set_blob_histogram(histogram);
  }
  for (std::size_t c = 0; c < chunks; ++c) {
    const std::size_t n = split_chunk(c);
    const std::size_t e_bytes = exponent_bytes(kind, n);
    const std::uint32_t mode = coder.code({exponent.data(), e_bytes});
    const std::span<const std::uint8_t> stored =
        mode == kModeRaw ? std::span<const std::uint8_t>(exponent.data(), e_bytes) : coder.stored();
    const std::size_t entry = kHeaderBytes + c * kChunkEntryBytes;
    put32(out, entry, static_cast<std::uint32_t>(stored.size()));
    put32(out, entry + 4, mode);
    out.insert(out.end(), stored.begin(), stored.end());
    out.insert(out.end(), rest.data(), rest.data() + rest_bytes(kind, n));
  }
  return out;
}

std::uint64_t PlaneBlob::chunk_count(std::size_t c) const {
  return std::min<std::uint64_t>(chunk_values, values - chunk_first(c));
}

std::size_t plane_head_bytes(std::span<const std::uint8_t> first_32) {
  if (first_32.size() < kHeaderBytes || std::memcmp(first_32.data(), kMagic, 4) != 0) return 0;
  return kHeaderBytes + std::size_t{get32(first_32.data() + 20)} * kChunkEntryBytes;
}

Result<PlaneBlob> plane_parse(DType dtype, std::span<const std::uint8_t> head,
                              std::size_t blob_bytes, std::uint64_t values) {
  if (!plane_codec_supports(dtype)) {
    return blob_error(0, "no " + std::string(dtype_name(dtype)) + " tensors in this codec");
  }
  if (blob_bytes < kHeaderBytes || head.size() < kHeaderBytes) {
    return blob_error(0, "only " + std::to_string(std::min(blob_bytes, head.size())) +
                             " bytes, the header needs " + std::to_string(kHeaderBytes));
  }
  const std::uint8_t* p = head.data();
  if (std::memcmp(p, kMagic, 4) != 0) return blob_error(0, "not a planes-zstd blob (magic)");
  const std::uint8_t version = p[4];
  if (version != kVersionZstd && version != kVersionHuffman) {
    return blob_error(4, "version " + std::to_string(version) + ", expected 1 or 2");
  }
  if (p[6] != 0 || p[7] != 0) return blob_error(6, "the reserved bytes are not zero");
  const std::uint8_t kind = kind_of(dtype);
  if (p[5] != kind) {
    return blob_error(5, "kind " + std::to_string(p[5]) + ", the tensor's dtype " +
                             std::string(dtype_name(dtype)) + " needs " + std::to_string(kind));
  }
  PlaneBlob blob;
  blob.dtype = dtype;
  blob.blob_bytes = blob_bytes;
  blob.values = get64(p + 8);
  if (blob.values != values) {
    return blob_error(8, std::to_string(blob.values) + " values, the tensor's shape holds " +
                             std::to_string(values));
  }
  blob.chunk_values = get32(p + 16);
  const std::uint32_t chunk = blob.chunk_values;
  if (chunk < 2 || chunk > kMaxChunkValues || chunk % 2 != 0) {
    return blob_error(16, "chunk of " + std::to_string(chunk) + " values (even, 2 to 2^24)");
  }
  const std::uint64_t chunks = get32(p + 20);
  if (chunks != (values + chunk - 1) / chunk) {
    return blob_error(20, std::to_string(chunks) + " chunks for " + std::to_string(values) +
                              " values of " + std::to_string(chunk));
  }
  const std::uint64_t table_end = kHeaderBytes + chunks * kChunkEntryBytes;
  if (table_end > blob_bytes) {
    return blob_error(kHeaderBytes, "the chunk table ends at " + std::to_string(table_end) +
                                        ", past the blob's " + std::to_string(blob_bytes));
  }
  if (table_end > head.size()) {
    return blob_error(kHeaderBytes, "the chunk table needs " + std::to_string(table_end) +
                                        " bytes, " + std::to_string(head.size()) + " given");
  }
  blob.chunks.resize(chunks);
  std::uint64_t at = table_end;
  for (std::uint64_t c = 0; c < chunks; ++c) {
    const std::size_t entry = kHeaderBytes + c * kChunkEntryBytes;
    const std::size_t n = blob.chunk_count(c);
    const std::size_t e_bytes = exponent_bytes(kind, n);
    const std::size_t r_bytes = rest_bytes(kind, n);
    const std::uint64_t stored = get32(p + entry);
    const std::uint32_t mode = get32(p + entry + 4);
    const std::uint32_t last_mode = version == kVersionHuffman ? kModeHuffman : kModeZstd;
    if (mode > last_mode) {
      return blob_error(entry + 4, "chunk " + std::to_string(c) + ": mode " + std::to_string(mode) +
                                       (version == kVersionHuffman ? " (0 raw, 1 zstd, 2 Huffman)"
                                                                   : " (0 raw, 1 zstd)"));
    }
    if (stored > blob_bytes - at || r_bytes > blob_bytes - at - stored) {
      return blob_error(at, "chunk " + std::to_string(c) + " needs " +
                                std::to_string(stored + r_bytes) + " bytes, " +
                                std::to_string(blob_bytes - at) + " remain");
    }
    if (mode == kModeRaw && stored != e_bytes) {
      return blob_error(entry, "chunk " + std::to_string(c) + ": " + std::to_string(stored) +
                                   " raw exponent bytes, expected " + std::to_string(e_bytes));
    }
    blob.chunks[c] = PlaneBlob::Chunk{at, static_cast<std::uint32_t>(stored),
                                      static_cast<PlaneBlob::Mode>(mode)};
    at += stored + r_bytes;
  }
  if (at != blob_bytes) {
    return blob_error(at, std::to_string(blob_bytes - at) + " bytes after the last chunk");
  }
  return blob;
}

struct PlaneChunkDecoder::Context {
  std::unique_ptr<ZSTD_DCtx, DCtxFree> dctx{ZSTD_createDCtx()};
};

PlaneChunkDecoder::PlaneChunkDecoder() : context_(std::make_unique<Context>()) {
  require(context_->dctx != nullptr, ErrorKind::kIo, "zstd: cannot create a decompression context");
}

PlaneChunkDecoder::~PlaneChunkDecoder() = default;

void PlaneChunkDecoder::reserve(std::uint32_t chunk_values) {
  if (exponent_.size() < chunk_values) exponent_.resize(chunk_values);
}

PlaneChunkDecoder::Status PlaneChunkDecoder::decode(const PlaneBlob& blob, const std::uint8_t* data,
                                                    std::size_t c, std::uint8_t* out) {
  const std::uint8_t kind = kind_of(blob.dtype);
  const PlaneBlob::Chunk& chunk = blob.chunks[c];
  const std::size_t n = blob.chunk_count(c);
  const std::size_t e_bytes = exponent_bytes(kind, n);
  const std::uint8_t* planes = data + chunk.at;
  const std::uint8_t* exponent = planes;
  if (chunk.mode == PlaneBlob::Mode::kZstd) {
    const std::size_t got =
        ZSTD_decompressDCtx(context_->dctx.get(), exponent_.data(), e_bytes, planes, chunk.stored);
    if (ZSTD_isError(got)) return Status{false, got, 0};
    if (got != e_bytes) return Status{false, 0, got};
    exponent = exponent_.data();
  } else if (chunk.mode == PlaneBlob::Mode::kHuffman) {
    const HuffmanFault fault = huffman_.decode({planes, chunk.stored}, {exponent_.data(), e_bytes},
                                               {planes + chunk.stored, rest_bytes(kind, n)});
    if (fault != HuffmanFault::kNone) return Status{false, 0, 0, fault};
    exponent = exponent_.data();
  }
  join(kind, exponent, planes + chunk.stored, n, out);
  return Status{};
}

Error PlaneChunkDecoder::error(const PlaneBlob& blob, std::size_t c, const Status& status) {
  const std::size_t e_bytes = exponent_bytes(kind_of(blob.dtype), blob.chunk_count(c));
  if (status.huffman != HuffmanFault::kNone) {
    return blob_error(blob.chunks[c].at, "chunk " + std::to_string(c) +
                                             ": the exponent plane's Huffman coding " +
                                             huffman_fault_text(status.huffman));
  }
  return blob_error(
      blob.chunks[c].at,
      "chunk " + std::to_string(c) + ": the exponent plane " +
          (status.zstd_code != 0
               ? std::string("does not decompress (") + ZSTD_getErrorName(status.zstd_code) + ")"
               : "decompresses to " + std::to_string(status.got) + " bytes, expected " +
                     std::to_string(e_bytes)));
}

std::optional<Error> plane_decode(DType dtype, std::span<const std::uint8_t> blob,
                                  std::span<std::uint8_t> out, bool check_hash) {
  const std::size_t size = plane_codec_supports(dtype) ? dtype_size(dtype) : 1;
  if (out.size() % size != 0) {
    return blob_error(8,
                      "the tensor's " + std::to_string(out.size()) + " bytes are not whole values");
  }
  auto parsed = plane_parse(dtype, blob, blob.size(), out.size() / size);
  if (!parsed.ok()) return parsed.error();
  const PlaneBlob& planes = parsed.value();
  // One decoder per thread, kept: creating a zstd context per sample costs more than decoding a
  // small sample.
  thread_local PlaneChunkDecoder decoder;
  decoder.reserve(planes.chunk_values);
  for (std::size_t c = 0; c < planes.chunks.size(); ++c) {
    const PlaneChunkDecoder::Status status =
        decoder.decode(planes, blob.data(), c, out.data() + planes.chunk_first(c) * size);
    if (!status.ok) return PlaneChunkDecoder::error(planes, c, status);
  }
  if (!check_hash) return std::nullopt;
  const std::uint64_t expected = get64(blob.data() + 24);
  const std::uint64_t got = xxh64(out);
  if (got != expected) {
    return blob_error(24, "the decoded bytes hash to " + xxh64_hex(got) + ", the blob says " +
                              xxh64_hex(expected));
  }
  return std::nullopt;
}

PlaneSizes plane_sizes(std::span<const std::uint8_t> blob) {
  PlaneSizes sizes;
  if (blob.size() < kHeaderBytes) return sizes;
  const std::uint8_t* p = blob.data();
  const std::uint8_t kind = p[5];
  const std::uint64_t values = get64(p + 8);
  const std::uint32_t chunk = get32(p + 16);
  const std::uint64_t chunks = get32(p + 20);
  if (chunk == 0 || kHeaderBytes + chunks * kChunkEntryBytes > blob.size()) return sizes;
  sizes.header = kHeaderBytes + chunks * kChunkEntryBytes;
  for (std::uint64_t c = 0; c < chunks; ++c) {
    const std::size_t n = std::min<std::uint64_t>(chunk, values - c * chunk);
    sizes.exponent_raw += exponent_bytes(kind, n);
    sizes.exponent_stored += get32(p + kHeaderBytes + c * kChunkEntryBytes);
    sizes.rest += rest_bytes(kind, n);
  }
  return sizes;
}

}  // namespace draftfeed
