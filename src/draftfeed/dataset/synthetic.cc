#include "draftfeed/dataset/synthetic.h"

#include "draftfeed/common/error.h"
#include "draftfeed/common/hash.h"

namespace draftfeed {

std::uint64_t synthetic_hash(std::uint64_t seed, std::uint64_t stream, std::uint64_t row,
                             std::uint64_t position) {
  return splitmix64(splitmix64(splitmix64(seed ^ (stream * 0xD1B54A32D192ED03ULL)) ^ row) ^
                    position);
}

void validate(const SyntheticOptions& o) {
  require(o.rows >= 0, ErrorKind::kInvalidArgument,
          "synthetic dataset: rows must be >= 0, got " + std::to_string(o.rows));
  require(o.min_len >= 0 && o.min_len <= o.max_len, ErrorKind::kInvalidArgument,
          "synthetic dataset: need 0 <= min_len <= max_len, got min_len " +
              std::to_string(o.min_len) + " and max_len " + std::to_string(o.max_len));
  require(o.vocab >= 1, ErrorKind::kInvalidArgument,
          "synthetic dataset: vocab must be >= 1, got " + std::to_string(o.vocab));
}

std::int64_t synthetic_row_length(const SyntheticOptions& o, std::int64_t row) {
  const auto span = static_cast<std::uint64_t>(o.max_len - o.min_len) + 1;
  return o.min_len +
         static_cast<std::int64_t>(
             synthetic_hash(o.seed, kStreamLength, static_cast<std::uint64_t>(row), 0) % span);
}

std::int64_t synthetic_token(const SyntheticOptions& o, std::int64_t row, std::int64_t position) {
  return static_cast<std::int64_t>(synthetic_hash(o.seed, kStreamToken,
                                                  static_cast<std::uint64_t>(row),
                                                  static_cast<std::uint64_t>(position)) %
                                   static_cast<std::uint64_t>(o.vocab));
}

namespace {

std::int64_t prompt_length(const SyntheticOptions& o, std::int64_t row, std::int64_t length) {
  return static_cast<std::int64_t>(
      synthetic_hash(o.seed, kStreamPrompt, static_cast<std::uint64_t>(row), 0) %
      (static_cast<std::uint64_t>(length) / 2 + 1));
}

}  // namespace

std::int64_t synthetic_loss_mask(const SyntheticOptions& o, std::int64_t row,
                                 std::int64_t position) {
  return position >= prompt_length(o, row, synthetic_row_length(o, row)) ? 1 : 0;
}

void synthetic_row(const SyntheticOptions& o, std::int64_t row, std::vector<std::int64_t>* ids,
                   std::vector<std::int64_t>* loss_mask) {
  const std::int64_t length = synthetic_row_length(o, row);
  const std::int64_t prompt = prompt_length(o, row, length);
  ids->resize(static_cast<std::size_t>(length));
  loss_mask->resize(static_cast<std::size_t>(length));
  for (std::int64_t t = 0; t < length; ++t) {
    (*ids)[static_cast<std::size_t>(t)] = synthetic_token(o, row, t);
    (*loss_mask)[static_cast<std::size_t>(t)] = t >= prompt ? 1 : 0;
  }
}

DatasetWriteSummary write_synthetic_dataset(const std::string& folder, const SyntheticOptions& o,
                                            DatasetWriterOptions writer_options) {
  validate(o);
  writer_options.total_rows = o.rows;
  DatasetWriter writer(folder, writer_options);
  std::vector<std::int64_t> ids, mask;
  for (std::int64_t row = 0; row < o.rows; ++row) {
    synthetic_row(o, row, &ids, &mask);
    writer.add_row(ids, mask);
  }
  return writer.finish();
}

}  // namespace draftfeed
