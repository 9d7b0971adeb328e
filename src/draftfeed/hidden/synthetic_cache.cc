#include "draftfeed/hidden/synthetic_cache.h"

#include <array>
#include <atomic>
#include <cstring>
#include <exception>
#include <filesystem>
#include <mutex>
#include <thread>

#include "draftfeed/common/error.h"
#include "draftfeed/common/hash.h"
#include "draftfeed/common/run_workers.h"
#include "draftfeed/hidden/safetensors_writer.h"

namespace draftfeed {

namespace {

std::uint64_t mix(std::uint64_t z) { return splitmix64_finalizer(z); }

std::uint64_t position_base(std::uint64_t seed, std::int64_t row, std::int64_t position,
                            std::int64_t layer) {
  return mix(
      mix(mix(mix(seed) ^ static_cast<std::uint64_t>(row)) ^ static_cast<std::uint64_t>(position)) ^
      static_cast<std::uint64_t>(layer));
}

unsigned value_index(std::uint64_t base, std::int64_t h) {
  return static_cast<unsigned>(mix(base ^ static_cast<std::uint64_t>(h)) >> 57);
}

float value_of_index(unsigned k) { return (static_cast<float>(k) - 64.0f) / 16.0f; }

// The 128 possible values' bit patterns in the output dtype, little-endian, `width` bytes each.
struct ValueTable {
  unsigned width = 2;
  std::array<std::uint8_t, std::size_t{128} * 4> bytes{};

  explicit ValueTable(DType dtype) {
    for (unsigned k = 0; k < 128; ++k) {
      const float value = value_of_index(k);
      std::uint8_t* out = bytes.data() + static_cast<std::size_t>(k) * 4;
      if (dtype == DType::kF32) {
        width = 4;
        std::memcpy(out, &value, 4);
      } else {
        const std::uint16_t bits =
            dtype == DType::kBF16 ? float_to_bf16(value) : float_to_f16(value);
        std::memcpy(out, &bits, 2);
      }
    }
  }
};

void write_row(const std::string& root, std::int64_t row, const std::vector<std::int64_t>& ids,
               const SyntheticHiddenStateSpec& spec, const ValueTable& table,
               std::vector<std::uint8_t>& buffer) {
  const auto tokens = static_cast<std::int64_t>(ids.size());
  const std::size_t width = table.width;
  buffer.resize(static_cast<std::size_t>(tokens * spec.layers * spec.hidden_size) * width);
  std::uint8_t* out = buffer.data();
  for (std::int64_t t = 0; t < tokens; ++t) {
    for (std::int64_t l = 0; l < spec.layers; ++l) {
      const std::uint64_t base = position_base(spec.seed, row, t, l);
      for (std::int64_t h = 0; h < spec.hidden_size; ++h, out += width) {
        std::memcpy(out, table.bytes.data() + static_cast<std::size_t>(value_index(base, h)) * 4,
                    width);
      }
    }
  }
  const std::vector<TensorToWrite> tensors = {
      {"token_ids",
       DType::kI64,
       {tokens},
       {reinterpret_cast<const std::uint8_t*>(ids.data()), ids.size() * sizeof(std::int64_t)}},
      {"hidden_states", spec.dtype, {tokens, spec.layers, spec.hidden_size}, buffer},
  };
  write_safetensors(
      (std::filesystem::path(root) / ("hs_" + std::to_string(row) + ".safetensors")).string(),
      tensors);
}

}  // namespace

float synthetic_hidden_value(std::uint64_t seed, std::int64_t row, std::int64_t position,
                             std::int64_t layer, std::int64_t h) {
  return value_of_index(value_index(position_base(seed, row, position, layer), h));
}

SyntheticCacheStats write_synthetic_hidden_states(const std::string& root, std::int64_t num_rows,
                                                  const RowIdsFn& ids_of_row,
                                                  const SyntheticHiddenStateSpec& spec) {
  require(spec.hidden_size > 0 && spec.layers > 0, ErrorKind::kInvalidArgument,
          "synthetic hidden states need hidden_size > 0 and layers > 0 (got " +
              std::to_string(spec.hidden_size) + " and " + std::to_string(spec.layers) + ")");
  require(
      spec.dtype == DType::kBF16 || spec.dtype == DType::kF16 || spec.dtype == DType::kF32,
      ErrorKind::kInvalidArgument,
      "synthetic hidden states are BF16, F16 or F32, not " + std::string(dtype_name(spec.dtype)));
  require(num_rows >= 0, ErrorKind::kInvalidArgument,
          "number of rows must be >= 0, got " + std::to_string(num_rows));
  std::error_code ec;
  std::filesystem::create_directories(root, ec);
  if (ec) throw Error(ErrorKind::kIo, root + ": cannot create the folder: " + ec.message());

  const ValueTable table(spec.dtype);
  unsigned threads = spec.threads != 0 ? spec.threads : std::thread::hardware_concurrency();
  if (threads == 0) threads = 1;
  if (static_cast<std::int64_t>(threads) > num_rows) threads = static_cast<unsigned>(num_rows);

  std::atomic<std::int64_t> next{0};
  std::atomic<std::uint64_t> bytes{0};
  run_workers(threads, [&](unsigned, const std::atomic<bool>& stop) {
    std::vector<std::int64_t> ids;
    std::vector<std::uint8_t> buffer;
    for (std::int64_t row = next++; row < num_rows && !stop; row = next++) {
      ids.clear();
      ids_of_row(row, ids);
      write_row(root, row, ids, spec, table, buffer);
      bytes += buffer.size() + ids.size() * sizeof(std::int64_t);
    }
  });
  return SyntheticCacheStats{num_rows, bytes.load()};
}

SyntheticCacheStats write_synthetic_hidden_states(const std::string& root,
                                                  std::span<const std::vector<std::int64_t>> rows,
                                                  const SyntheticHiddenStateSpec& spec) {
  return write_synthetic_hidden_states(
      root, static_cast<std::int64_t>(rows.size()),
      [rows](std::int64_t row, std::vector<std::int64_t>& out) {
        out = rows[static_cast<std::size_t>(row)];
      },
      spec);
}

}  // namespace draftfeed
