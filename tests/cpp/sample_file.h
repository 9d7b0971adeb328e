// Writes a hidden-state sample file (`token_ids` int64 [T], `hidden_states` [T, L, H]) for tests.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "draftfeed/hidden/safetensors_writer.h"

namespace draftfeed {

// `hidden` holds T * L * H elements of `dtype` (BF16 as uint16 bits, F32 as float).
template <typename Element>
void write_sample_file(const std::string& path, std::span<const std::int64_t> ids, DType dtype,
                       std::int64_t layers, std::int64_t hidden_size,
                       const std::vector<Element>& hidden) {
  const auto tokens = static_cast<std::int64_t>(ids.size());
  const std::vector<TensorToWrite> tensors = {
      {"token_ids",
       DType::kI64,
       {tokens},
       {reinterpret_cast<const std::uint8_t*>(ids.data()), ids.size() * sizeof(std::int64_t)}},
      {"hidden_states",
       dtype,
       {tokens, layers, hidden_size},
       {reinterpret_cast<const std::uint8_t*>(hidden.data()), hidden.size() * sizeof(Element)}},
  };
  write_safetensors(path, tensors);
}

}  // namespace draftfeed
