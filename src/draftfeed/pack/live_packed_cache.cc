#include "draftfeed/pack/live_packed_cache.h"

namespace draftfeed {

LivePackedCache::LivePackedCache(std::string root) : root_(std::move(root)) {
  auto opened = PackedCache::open(root_);
  if (!opened.ok()) throw opened.error();
  current_ = std::move(opened).value();
  stamp_ = current_ != nullptr ? current_->stamp() : FileStamp{};
}

std::shared_ptr<const PackedCache> LivePackedCache::current() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return current_;
}

Result<std::shared_ptr<const PackedCache>> LivePackedCache::refresh() {
  const FileStamp now = pack_manifest_stamp(root_);
  std::lock_guard<std::mutex> lock(mutex_);
  if (now == stamp_) return current_;
  auto opened = PackedCache::open(root_, current_.get());
  if (!opened.ok()) {
    return Error(opened.error().kind(),
                 opened.error().what() + std::string(" (the pack changed while this reader "
                                                     "ran, and its new manifest does not read)"));
  }
  current_ = std::move(opened).value();
  stamp_ = current_ != nullptr ? current_->stamp() : now;
  reloads_.fetch_add(1, std::memory_order_relaxed);
  return current_;
}

}  // namespace draftfeed
