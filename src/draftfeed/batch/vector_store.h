// How the batch copy's AVX2 kernels write a batch: 32 bytes at a time, with non-temporal
// (streaming) stores when asked for (RowStores::kStreamed) and the destination is 32-byte aligned
// (every row of the engine's page-aligned batch buffers whose width is a multiple of 16 values).
//
// Why streaming: a large batch (H=2048: 96 MiB of bf16 per 8192 tokens) is far larger than the
// caches, so nothing written stays in cache for the trainer anyway; an ordinary store first reads
// the line it writes into the cache, a third memory transfer per byte besides the read and the
// write back (`draftfeed kernels` compares the two: docs/decisions.md). A small batch would stay in
// cache for its reader: it is written with ordinary stores (batch_row_stores, hidden_copy.h).
//
// Streaming stores are weakly ordered: a kernel that issued any ends its vector part with
// vector_kernel_done() (sfence) before it returns, so a batch published to another thread
// afterwards (a mutex or an atomic release) is seen whole.
#pragma once

#include <cstdint>

namespace draftfeed {

enum class RowStores : std::uint8_t { kCached, kStreamed };

}  // namespace draftfeed

#if defined(DRAFTFEED_X86)
#include <immintrin.h>

namespace draftfeed {

inline bool vector_store_streams(RowStores stores, const void* dst) {
  return stores == RowStores::kStreamed && (reinterpret_cast<std::uintptr_t>(dst) & 31) == 0;
}

template <bool kStream>
__attribute__((target("avx2"))) inline void vector_store(std::uint8_t* dst, __m256i value) {
  if constexpr (kStream) {
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst), value);
  } else {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), value);
  }
}

// The end of a kernel's vector part, before it returns to or calls code built without AVX (its
// scalar tail, the batch copy): the streaming stores fenced (above), and the upper halves of the
// ymm registers cleared. Without vzeroupper every SSE instruction after 256-bit code pays a
// transition cost, per row. GCC inserts it by itself only sometimes, so it is explicit here.
template <bool kStream>
__attribute__((target("avx"))) inline void vector_kernel_done() {
  if constexpr (kStream) _mm_sfence();
  _mm256_zeroupper();
}

}  // namespace draftfeed

#endif
