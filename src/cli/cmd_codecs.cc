// `draftfeed codecs`: the packed cache's entropy coders side by side on the exponent planes of
// real hidden-state files, against memcpy of the same bytes: what a compressed warm epoch pays per
// byte, per core, for each coder a pack can be written with.
#include <zstd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "args.h"
#include "command.h"
#include "draftfeed/common/dtype.h"
#include "draftfeed/common/error.h"
#include "draftfeed/hidden/safetensors.h"
#include "draftfeed/pack/exponent_huffman.h"
#include "draftfeed/pack/plane_codec.h"
#include "flag_table.h"
#include "timing.h"

namespace draftfeed::cli {
namespace {

const std::string kUsage = R"(usage: draftfeed codecs FILE... [options]

Times the exponent planes' entropy stage of packed caches (pack --compress) on the hidden states of
the given safetensors files (their "hidden_states" tensor, BF16 or F8_E4M3): each file's tensor is
coded as pack codes it, once with each coder (huffman: format version 2, pack's default for bf16;
zstd: version 1, level --level, minimum match 7, pack's default for FP8), and each coder's stored exponent planes are decoded,
chunk by chunk (64 Ki values), on one thread. Beside them, memcpy of the same exponent bytes.

For each coder: the stored exponent bytes as a share of the plane's, the blob's bytes as a share of
the tensor's, the entropy stage's GB/s of exponent bytes decoded, and a whole chunk's decode
(entropy stage and the join of the two planes into values) in GB/s of values. Each repeat runs
every coder and memcpy once, one after the other, so load on the machine falls on all alike; the
figures are medians over repeats.

options:
)";

const FlagTable& command_flags() {
  static const FlagTable table{
      {"repeat", "R", "timed repeats (default 7, after one warm-up)"},
      {"level", "L", "zstd's level (default 1, pack's)"},
      {"json", "", "print the result as JSON"},
  };
  return table;
}

using Clock = std::chrono::steady_clock;

struct Tensor {
  DType dtype;
  std::vector<std::uint8_t> bytes;
};

Tensor load(const std::string& path) {
  auto file = SafetensorsFile::open(path);
  if (!file.ok()) throw file.error();
  const TensorView* view = file.value()->find("hidden_states");
  require(view != nullptr, ErrorKind::kInvalidArgument, path + ": no \"hidden_states\" tensor");
  require(plane_codec_supports(view->dtype), ErrorKind::kInvalidArgument,
          path + ": hidden_states is " + std::string(dtype_name(view->dtype)) +
              "; the codec takes BF16 and F8_E4M3");
  return Tensor{view->dtype, std::vector<std::uint8_t>(view->data, view->data + view->nbytes)};
}

// One coder's blobs of every file, parsed.
struct Coded {
  const char* name;
  std::vector<std::vector<std::uint8_t>> blobs;
  std::vector<PlaneBlob> planes;
  std::uint64_t exponent_raw = 0;
  std::uint64_t exponent_stored = 0;
  std::uint64_t blob_bytes = 0;
  std::vector<double> entropy_s, chunk_s;
};

Coded code_all(const char* name, const std::vector<Tensor>& tensors, PlaneCodecOptions options) {
  Coded coded{name, {}, {}, 0, 0, 0, {}, {}};
  for (const Tensor& t : tensors) {
    coded.blobs.push_back(plane_encode(t.dtype, t.bytes, options));
    const auto& blob = coded.blobs.back();
    auto parsed = plane_parse(t.dtype, blob, blob.size(), t.bytes.size() / dtype_size(t.dtype));
    if (!parsed.ok()) throw parsed.error();
    coded.planes.push_back(parsed.value());
    const PlaneSizes sizes = plane_sizes(blob);
    coded.exponent_raw += sizes.exponent_raw;
    coded.exponent_stored += sizes.exponent_stored;
    coded.blob_bytes += blob.size();
  }
  return coded;
}

// The exponent bytes of chunk c of a blob (what its entropy stage gives).
std::size_t exponent_bytes_of(const PlaneBlob& planes, std::size_t c) {
  const std::uint64_t n = planes.chunk_count(c);
  return planes.dtype == DType::kBF16 ? n : (n + 1) / 2;
}

// Decodes every chunk's exponent plane of every blob, the entropy stage only.
void entropy_pass(const Coded& coded, ZSTD_DCtx* dctx, HuffmanDecoder& huffman,
                  std::vector<std::uint8_t>& out) {
  for (std::size_t b = 0; b < coded.blobs.size(); ++b) {
    const PlaneBlob& planes = coded.planes[b];
    const std::uint8_t* data = coded.blobs[b].data();
    for (std::size_t c = 0; c < planes.chunks.size(); ++c) {
      const PlaneBlob::Chunk& chunk = planes.chunks[c];
      const std::size_t bytes = exponent_bytes_of(planes, c);
      bool ok = true;
      if (chunk.mode == PlaneBlob::Mode::kZstd) {
        ok = ZSTD_decompressDCtx(dctx, out.data(), bytes, data + chunk.at, chunk.stored) == bytes;
      } else if (chunk.mode == PlaneBlob::Mode::kHuffman) {
        ok = huffman.decode({data + chunk.at, chunk.stored}, {out.data(), bytes}) ==
             HuffmanFault::kNone;
      } else {
        std::memcpy(out.data(), data + chunk.at, bytes);
      }
      require(ok, ErrorKind::kIo, std::string(coded.name) + ": a chunk did not decode");
    }
  }
}

// Decodes every chunk whole (entropy stage and join) into `out`.
void chunk_pass(const Coded& coded, PlaneChunkDecoder& decoder, std::vector<std::uint8_t>& out) {
  for (std::size_t b = 0; b < coded.blobs.size(); ++b) {
    const PlaneBlob& planes = coded.planes[b];
    for (std::size_t c = 0; c < planes.chunks.size(); ++c) {
      const auto status = decoder.decode(planes, coded.blobs[b].data(), c, out.data());
      require(status.ok, ErrorKind::kIo, std::string(coded.name) + ": a chunk did not decode");
    }
  }
}

// memcpy of each chunk's exponent bytes (the raw planes, from the huffman blobs' sizes).
void memcpy_pass(const std::vector<Tensor>& tensors, const std::vector<PlaneBlob>& planes,
                 std::vector<std::uint8_t>& out) {
  for (std::size_t b = 0; b < tensors.size(); ++b) {
    for (std::size_t c = 0; c < planes[b].chunks.size(); ++c) {
      const std::size_t bytes = exponent_bytes_of(planes[b], c);
      const std::size_t at = std::min(tensors[b].bytes.size() - bytes,
                                      static_cast<std::size_t>(planes[b].chunk_first(c)));
      std::memcpy(out.data(), tensors[b].bytes.data() + at, bytes);
    }
  }
}

int run_codecs(const std::vector<std::string>& argv) {
  const Args args = command_flags().parse(argv);
  args.expect_positionals(1, SIZE_MAX, "FILE...");
  const std::int64_t repeat = args.integer("repeat", 7);
  const std::int64_t level = args.integer("level", 1);
  require(repeat >= 1, ErrorKind::kInvalidArgument, "--repeat must be >= 1");
  require(level >= -7 && level <= 19, ErrorKind::kInvalidArgument,
          "--level must be a zstd level between -7 and 19, got " + std::to_string(level));
  std::vector<Tensor> tensors;
  for (const std::string& path : args.positionals()) tensors.push_back(load(path));
  const DType dtype = tensors.front().dtype;
  for (const Tensor& t : tensors) {
    require(
        t.dtype == dtype, ErrorKind::kInvalidArgument,
        "the files' hidden states are of different dtypes: give BF16 or F8_E4M3 files, not both");
  }
  PlaneCodecOptions huffman_options;
  huffman_options.entropy = PlaneEntropy::kHuffman;
  PlaneCodecOptions zstd_options;
  zstd_options.entropy = PlaneEntropy::kZstd;
  zstd_options.zstd_level = static_cast<int>(level);
  std::vector<Coded> coders;
  coders.push_back(code_all("huffman", tensors, huffman_options));
  coders.push_back(code_all("zstd", tensors, zstd_options));
  std::uint64_t tensor_bytes = 0;
  for (const Tensor& t : tensors) tensor_bytes += t.bytes.size();

  std::vector<std::uint8_t> out(std::size_t{kPlaneCodecDefaultChunk} * dtype_size(dtype));
  std::unique_ptr<ZSTD_DCtx, decltype(&ZSTD_freeDCtx)> dctx(ZSTD_createDCtx(), ZSTD_freeDCtx);
  require(dctx != nullptr, ErrorKind::kIo, "zstd: cannot create a decompression context");
  HuffmanDecoder huffman;
  PlaneChunkDecoder decoder;
  decoder.reserve(kPlaneCodecDefaultChunk);
  std::vector<double> memcpy_s;
  for (std::int64_t rep = -1; rep < repeat; ++rep) {  // rep -1: warm-up, not kept
    auto start = Clock::now();
    memcpy_pass(tensors, coders.front().planes, out);
    if (rep >= 0) memcpy_s.push_back(seconds_since(start));
    for (Coded& coded : coders) {
      start = Clock::now();
      entropy_pass(coded, dctx.get(), huffman, out);
      const double entropy = seconds_since(start);
      start = Clock::now();
      chunk_pass(coded, decoder, out);
      const double chunk = seconds_since(start);
      if (rep < 0) continue;
      coded.entropy_s.push_back(entropy);
      coded.chunk_s.push_back(chunk);
    }
  }

  const double exponent_gb = static_cast<double>(coders.front().exponent_raw) / 1e9;
  const double values_gb = static_cast<double>(tensor_bytes) / 1e9;
  nlohmann::json j;
  j["dtype"] = dtype_name(dtype);
  j["files"] = tensors.size();
  j["tensor_bytes"] = tensor_bytes;
  j["exponent_bytes"] = coders.front().exponent_raw;
  j["repeat"] = repeat;
  j["memcpy_gb_per_s"] = exponent_gb / median(memcpy_s);
  j["coders"] = nlohmann::json::array();
  const bool json = args.has("json");
  if (!json) {
    std::printf(
        "exponent planes of %zu %s tensors (%.1f MB, %.1f MB of exponent bytes), one thread, "
        "median of %lld repeats\n",
        tensors.size(), std::string(dtype_name(dtype)).c_str(), values_gb * 1e3, exponent_gb * 1e3,
        static_cast<long long>(repeat));
    std::printf("  %-8s %15s %13s %21s %18s\n", "coder", "stored/plane", "blob/tensor",
                "entropy GB/s (expo)", "chunk GB/s (vals)");
    std::printf("  %-8s %15s %13s %21.2f %18s\n", "memcpy", "-", "-",
                exponent_gb / median(memcpy_s), "-");
  }
  for (const Coded& coded : coders) {
    const double stored =
        static_cast<double>(coded.exponent_stored) / static_cast<double>(coded.exponent_raw);
    const double blob = static_cast<double>(coded.blob_bytes) / static_cast<double>(tensor_bytes);
    const double entropy = exponent_gb / median(coded.entropy_s);
    const double chunk = values_gb / median(coded.chunk_s);
    j["coders"].push_back({{"name", coded.name},
                           {"stored_share_of_plane", stored},
                           {"blob_share_of_tensor", blob},
                           {"entropy_gb_per_s_of_exponents", entropy},
                           {"chunk_gb_per_s_of_values", chunk}});
    if (!json) {
      std::printf("  %-8s %15.4f %13.4f %21.2f %18.2f\n", coded.name, stored, blob, entropy, chunk);
    }
  }
  if (json) std::printf("%s\n", j.dump(2).c_str());
  return 0;
}

const CommandRegistration kRegistration{
    Command{"codecs", "time the packed cache's entropy coders on hidden-state files",
            kUsage + command_flags().help(), run_codecs}};

}  // namespace
}  // namespace draftfeed::cli
