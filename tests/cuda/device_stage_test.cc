// The device stage and the fences on page-locked memory, against the fake CUDA runtime
// (fake_cudart.cc, loaded through DRAFTFEED_CUDART as ctest sets it): its copies run late on its
// own thread, so a buffer rewritten before the copy that reads it ran shows up as a wrong value
// on "the device" (and, under ThreadSanitizer, as a race between our write and its read).
// Suites are named Concurrent* so CI also runs them under ThreadSanitizer.
#include "draftfeed/pipeline/device_stage.h"

#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "draftfeed/cuda/cuda_runtime.h"
#include "draftfeed/cuda/device_worker.h"
#include "draftfeed/pipeline/buffer_pool.h"
#include "draftfeed/pipeline/host_memory.h"

namespace draftfeed {
namespace {

// The fake runtime's own entry points (for the test playing the trainer).
struct Fake {
  int (*malloc_device)(void**, std::size_t);
  int (*memcpy_async)(void*, const void*, std::size_t, int, void*);
  int (*device_synchronize)();
  int (*set_device)(int);
  unsigned long long (*peak_device_bytes)();
  int (*violations)(char*, std::size_t);
  void (*mark_test_thread)();
};

Fake& fake() {
  static Fake f = [] {
    const char* path = std::getenv("DRAFTFEED_CUDART");
    void* lib = path != nullptr ? ::dlopen(path, RTLD_NOW) : nullptr;
    Fake loaded{};
    if (lib == nullptr) return loaded;
    auto get = [&](const char* name) { return ::dlsym(lib, name); };
    loaded.malloc_device = reinterpret_cast<int (*)(void**, std::size_t)>(get("cudaMalloc"));
    loaded.memcpy_async = reinterpret_cast<int (*)(void*, const void*, std::size_t, int, void*)>(
        get("cudaMemcpyAsync"));
    loaded.device_synchronize = reinterpret_cast<int (*)()>(get("cudaDeviceSynchronize"));
    loaded.set_device = reinterpret_cast<int (*)(int)>(get("cudaSetDevice"));
    loaded.peak_device_bytes =
        reinterpret_cast<unsigned long long (*)()>(get("fake_cuda_peak_device_bytes"));
    loaded.violations = reinterpret_cast<int (*)(char*, std::size_t)>(get("fake_cuda_violations"));
    loaded.mark_test_thread = reinterpret_cast<void (*)()>(get("fake_cuda_mark_test_thread"));
    return loaded;
  }();
  return f;
}

class ConcurrentCudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (fake().malloc_device == nullptr || !cuda_runtime().available) {
      GTEST_SKIP() << "DRAFTFEED_CUDART does not name the fake runtime (ctest sets it)";
    }
    std::string why;
    worker_ = DeviceWorker::for_device(1, &why);
    ASSERT_NE(worker_, nullptr) << why;
    fake().mark_test_thread();
    ASSERT_EQ(fake().set_device(1), 0);  // the trainer's thread, on the rank's device
  }

  // Device memory of the test's own, where the "trainer" copies what it received.
  std::uint8_t* device_memory(std::size_t bytes) {
    void* p = nullptr;
    EXPECT_EQ(fake().malloc_device(&p, bytes), 0);
    return static_cast<std::uint8_t*>(p);
  }

  static std::string violations() {
    std::vector<char> text(1 << 14);
    fake().violations(text.data(), text.size());
    return text.data();
  }

  std::shared_ptr<DeviceWorker> worker_;
};

constexpr std::size_t kBytes = 1 << 16;

TEST_F(ConcurrentCudaTest, APinnedBufferIsRewrittenOnlyAfterTheCopiesThatReadIt) {
  auto pool = BufferPool::create(kBytes, {{0, kBytes}}, 1, [this](std::size_t bytes) {
    return std::make_shared<HostBuffer>(bytes, worker_);
  });
  ASSERT_TRUE(pool->pinned());
  constexpr int kBatches = 40;
  std::vector<std::uint8_t*> received;
  // The engine's side: fill the one buffer again and again (a thread of its own, as the
  // scheduler), each time after waiting for the reads of the batch before.
  std::vector<std::unique_ptr<BufferPool::Handle>> filled(kBatches);
  for (int b = 0; b < kBatches; ++b) {
    std::thread writer([&] {
      make_device_current(worker_->device());
      auto never = [] { return false; };
      auto handle = pool->acquire(never, never);
      handle->wait_until_unread();
      std::memset(handle->memory()[0], b + 1, kBytes);
      filled[b] = std::move(handle);
    });
    writer.join();
    // The trainer's side: queue a copy of it and let the batch go at once, never synchronizing.
    std::uint8_t* target = device_memory(kBytes);
    ASSERT_EQ(fake().memcpy_async(target, filled[b]->memory()[0], kBytes, 1, nullptr), 0);
    received.push_back(target);
    filled[b]->set_reader_stream(0);
    filled[b].reset();
  }
  ASSERT_EQ(fake().device_synchronize(), 0);
  for (int b = 0; b < kBatches; ++b) {
    std::vector<std::uint8_t> expected(kBytes, static_cast<std::uint8_t>(b + 1));
    EXPECT_EQ(std::memcmp(received[b], expected.data(), kBytes), 0) << "batch " << b;
  }
  EXPECT_EQ(violations(), "");
}

TEST_F(ConcurrentCudaTest, TheDeviceStageCopiesEveryBatchInOrderWithinItsBuffers) {
  BatchSpec spec;
  spec.max_len = 64;
  spec.hidden_size = 16;
  auto layout = std::make_shared<const BatchLayout>(make_batch_layout(spec));
  auto host = BufferPool::create(
      layout->total_bytes, batch_slot_spans(*layout), 3,
      [this](std::size_t bytes) { return std::make_shared<HostBuffer>(bytes, worker_); });
  constexpr int kBatches = 30;
  int produced = 0;
  DeviceStage stage(layout, worker_, 2);
  // Upstream: what the pipeline hands out, on the stage's copier thread.
  stage.start([&](CudaStream) -> std::shared_ptr<BatchLease> {
    if (produced == kBatches) return nullptr;
    auto never = [] { return false; };
    auto buffer = host->acquire(never, never);
    buffer->wait_until_unread();
    auto lease = std::make_shared<BatchLease>();
    lease->layout = layout;
    lease->memory = buffer->memory();
    lease->regions = buffer->regions();
    lease->index = produced;
    std::memset(buffer->memory()[0], produced + 1, layout->total_bytes);  // every slot
    lease->buffer = std::move(buffer);
    ++produced;
    return lease;
  });
  std::vector<std::uint8_t*> received;
  for (int b = 0;; ++b) {
    std::shared_ptr<BatchLease> batch = stage.next(0);
    if (!batch) break;
    ASSERT_EQ(batch->index, b);
    ASSERT_EQ(batch->device, 1);
    // The trainer's work on the batch: a device-to-device copy on its stream, not waited for.
    std::uint8_t* target = device_memory(layout->total_bytes);
    ASSERT_EQ(fake().memcpy_async(target, batch->memory[0], layout->total_bytes, 3, nullptr), 0);
    received.push_back(target);
  }
  ASSERT_EQ(received.size(), static_cast<std::size_t>(kBatches));
  ASSERT_EQ(fake().device_synchronize(), 0);
  for (int b = 0; b < kBatches; ++b) {
    std::vector<std::uint8_t> expected(layout->total_bytes, static_cast<std::uint8_t>(b + 1));
    EXPECT_EQ(std::memcmp(received[b], expected.data(), layout->total_bytes), 0) << "batch " << b;
  }
  PipelineMetrics metrics;
  stage.fill_metrics(metrics);
  EXPECT_EQ(metrics.batches, kBatches);
  EXPECT_EQ(metrics.device_buffers, 2);
  EXPECT_EQ(metrics.device_extra_buffers, 0);
  EXPECT_LE(fake().peak_device_bytes(), 2 * ((layout->total_bytes + 255) / 256 * 256));
  EXPECT_EQ(violations(), "");
}

}  // namespace
}  // namespace draftfeed
