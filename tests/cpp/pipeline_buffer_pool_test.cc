// The buffer pool's slot holds (pipeline/buffer_pool.h): a buffer comes back once its batch and
// every view of it are gone; a tensor kept longer pins only its slot, which the pool replaces when
// it must reuse the buffer. Named Pipeline* so CI also runs it under ThreadSanitizer.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include "draftfeed/pipeline/buffer_pool.h"
#include "draftfeed/pipeline/host_memory.h"

namespace draftfeed {
namespace {

using namespace std::chrono_literals;

std::shared_ptr<BufferPool> two_slot_pool(int buffers) {
  // Slot 0: 64 bytes (say input_ids), slot 1: 4096 bytes (the hidden states).
  return BufferPool::create(64 + 4096, {{0, 64}, {64, 4096}}, buffers, [](std::size_t bytes) {
    return std::make_shared<HostBuffer>(bytes, /*pin_with=*/nullptr);
  });
}

TEST(PipelineBufferPoolTest, ABufferComesBackWhenItsBatchAndEveryViewAreGone) {
  auto pool = two_slot_pool(1);
  auto never = [] { return false; };
  auto handle = pool->acquire(never, never);
  std::shared_ptr<SlotRegion> view = handle->regions()[0];
  view->hold();  // a tensor of the batch, still alive after the batch
  handle.reset();
  std::atomic<bool> got{false};
  // acquire() asks grow_if() each time it has looked for a free buffer and found none: the point
  // where it would have taken this one.
  std::atomic<int> found_none{0};
  auto count_and_never = [&] {
    ++found_none;
    return false;
  };
  std::thread waiter([&] {
    auto again = pool->acquire(never, count_and_never);
    got = true;
    EXPECT_EQ(again->regions()[0]->data(), view->data()) << "its own slot, free again";
  });
  const auto looked = [&](int times) {
    const auto deadline = std::chrono::steady_clock::now() + 30s;
    while (found_none < times && !got && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(1ms);
    }
    return found_none >= times;
  };
  EXPECT_TRUE(looked(1)) << "the waiter never looked for a buffer";
  pool->poke();  // and once more, after it has waited
  EXPECT_TRUE(looked(2));
  EXPECT_FALSE(got) << "a held view keeps the buffer out of the pool";
  view->release();
  waiter.join();
  EXPECT_TRUE(got);
  EXPECT_EQ(pool->extra_buffers(), 0);
}

TEST(PipelineBufferPoolTest, AKeptTensorPinsOnlyItsSlotWhenTheConsumerWaits) {
  auto pool = two_slot_pool(1);
  auto never = [] { return false; };
  auto always = [] { return true; };  // the consumer waits and nothing else can come
  auto first = pool->acquire(never, never);
  std::memset(first->regions()[0]->data(), 7, 64);
  std::shared_ptr<SlotRegion> kept = first->regions()[0];
  kept->hold();
  first.reset();
  auto second = pool->acquire(never, always);
  EXPECT_EQ(pool->extra_buffers(), 0) << "no new buffer: the old one, with one slot replaced";
  EXPECT_NE(second->regions()[0]->data(), kept->data());
  EXPECT_EQ(pool->held_slot_bytes(), 64u);
  std::memset(second->regions()[0]->data(), 9, 64);
  EXPECT_EQ(kept->data()[0], 7) << "the kept tensor is never overwritten";
  second.reset();
  EXPECT_EQ(pool->held_slot_bytes(), 0u) << "the replacement goes with its batch";
  kept->release();
}

TEST(PipelineBufferPoolTest, KeptBatchesStillGrowThePool) {
  auto pool = two_slot_pool(1);
  auto never = [] { return false; };
  auto always = [] { return true; };
  auto first = pool->acquire(never, never);  // a batch the consumer keeps whole
  auto second = pool->acquire(never, always);
  EXPECT_EQ(pool->extra_buffers(), 1);
  EXPECT_EQ(pool->buffers(), 2);
}

}  // namespace
}  // namespace draftfeed
