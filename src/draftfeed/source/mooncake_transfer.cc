#include "draftfeed/source/mooncake_transfer.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "draftfeed/common/cancel_scope.h"
#include "draftfeed/common/error.h"
#include "draftfeed/hidden/safetensors.h"
#include "draftfeed/hidden/validate.h"

namespace draftfeed {

namespace {

using Clock = std::chrono::steady_clock;
using Seconds = std::chrono::duration<double>;

// hs-connectors' first poll interval (_MIN_POLL_INTERVAL), doubled up to poll_interval.
constexpr Seconds kFirstPoll{0.001};
// A round takes the reads due this soon too (see run()).
constexpr auto kCoalesce = std::chrono::milliseconds(4);
// How often a caller waiting for its read looks at its cancel flags (a hedge's is not notified).
constexpr auto kCancelCheck = std::chrono::milliseconds(20);

Clock::duration ticks(Seconds seconds) {
  return std::chrono::duration_cast<Clock::duration>(seconds);
}

std::string status_text(std::int64_t status) { return "status=" + std::to_string(status); }

}  // namespace

void MooncakeTransferOptions::validate() const {
  require(key_wait.count() >= 0, ErrorKind::kInvalidArgument,
          "key_wait must be >= 0 seconds, got " + std::to_string(key_wait.count()));
  require(poll_interval.count() > 0, ErrorKind::kInvalidArgument,
          "poll_interval must be > 0 seconds, got " + std::to_string(poll_interval.count()));
  require(staging_chunk_bytes > 0, ErrorKind::kInvalidArgument, "staging_chunk_bytes must be > 0");
  require(max_keys_per_round >= 1, ErrorKind::kInvalidArgument,
          "max_keys_per_round must be >= 1, got " + std::to_string(max_keys_per_round));
}

struct MooncakeTransfer::Read {
  MooncakeManifest manifest;
  std::shared_ptr<StagingRegion> region;
  Clock::time_point deadline;
  Clock::time_point due;  // the next look
  Seconds delay = kFirstPoll;
  bool done = false;
  // Its caller went (cancelled) before the object came: still looked for until the deadline, and
  // removed once it is there, so that a producer's late put leaves nothing in the store.
  bool abandoned = false;
  std::optional<Error> error;
};

struct MooncakeTransfer::Removal {
  std::string handle;
  bool waited = false;  // remove()'s; else the transfer's own (a cancelled or failed read's key)
  // The key was not there when it was to go (a hedged request's loser, answered before its
  // producer's put): looked for again until the deadline and removed once it comes.
  bool until_found = false;
  // The key of a cancelled or failed read, or one removed before its put: counted in `orphans`
  // when this removal is the one that removes it (two watchers of one key count it once).
  bool orphan = false;
  // A key being written cannot be removed yet: tried again until the deadline.
  Clock::time_point due;
  Clock::time_point deadline;
  bool done = false;
  std::optional<Error> error;
};

namespace {

const MooncakeTransferOptions& validated(const MooncakeTransferOptions& options) {
  options.validate();
  return options;
}

}  // namespace

MooncakeTransfer::MooncakeTransfer(std::shared_ptr<MooncakeStoreClient> client,
                                   const MooncakeTransferOptions& options)
    : options_(validated(options)),
      pool_(options_.staging_chunk_bytes,
            [this](std::uint8_t* address, std::uint64_t size) {
              std::int64_t status = 0;
              client_->round([&](MooncakeStoreCalls& calls) {
                status = calls.register_buffer(address, size);
              });
              if (status != 0) {
                throw Error(ErrorKind::kRuntime,
                            "Mooncake register_buffer of " + std::to_string(size) +
                                " bytes of staging memory failed with " + status_text(status));
              }
            }),
      client_(std::move(client)) {
  require(client_ != nullptr, ErrorKind::kInvalidArgument, "the Mooncake transfer needs a client");
  reader_ = std::thread([this] { run(); });
}

MooncakeTransfer::~MooncakeTransfer() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  work_.notify_all();
  reader_.join();
  client_.reset();
}

void MooncakeTransfer::setup() { client_->setup(); }

FetchOutcome MooncakeTransfer::get_cached(std::int64_t row, const IntArrayView& /*input_ids*/) {
  return FetchOutcome::dropped(
      DropReason::kMissing,
      "row " + std::to_string(row) + ": a Mooncake transfer has no cached hidden states");
}

Result<FetchedSample> MooncakeTransfer::get_generated(const std::string& transfer_params,
                                                      const std::string& handle, std::int64_t row,
                                                      std::span<const std::int64_t> ids) {
  const std::string where = "row " + std::to_string(row) + ", handle " + handle + ": ";
  Result<MooncakeManifest> manifest = parse_mooncake_manifest(transfer_params);
  if (!manifest.ok()) return Error(manifest.error().kind(), where + manifest.error().what());
  if (manifest.value().handle != handle) {
    return Error(ErrorKind::kFormat,
                 where + "the manifest names another key, " + manifest.value().handle);
  }
  auto read = std::make_shared<Read>();
  read->manifest = std::move(manifest).value();
  try {
    read->region = pool_.allocate(read->manifest.total_bytes);
  } catch (const Error& error) {
    return Error(error.kind(), where + error.what());
  }
  {
    std::unique_lock lock(mutex_);
    if (stopping_) return Error(ErrorKind::kRuntime, where + "the Mooncake transfer stopped");
    const auto now = Clock::now();
    read->due = now;
    read->deadline = now + ticks(options_.key_wait);
    // Queued even when cancelled: abandoned at once below, it still removes the key if it comes.
    reads_.push_back(read);
    work_.notify_one();
    while (!read->done) {
      if (cancelled_ || stopping_ || CancelScope::cancelled()) {
        read->abandoned = true;
        return Error(ErrorKind::kRuntime, where + "the Mooncake read was cancelled");
      }
      done_.wait_for(lock, kCancelCheck);
    }
  }
  if (read->error) return Error(read->error->kind(), where + read->error->what());
  Result<FetchedSample> sample = checked(*read, row, ids);
  if (!sample.ok()) {
    std::lock_guard lock(mutex_);
    ++stats_.bad_samples;
    return Error(sample.error().kind(), where + sample.error().what());
  }
  return sample;
}

Result<FetchedSample> MooncakeTransfer::checked(const Read& read, std::int64_t /*row*/,
                                                std::span<const std::int64_t> ids) {
  const MooncakeManifest& m = read.manifest;
  const auto tokens = static_cast<std::int64_t>(ids.size());
  const MooncakeTensorSpec& id_spec = m.token_ids;
  if (!dtype_is_integer(id_spec.dtype) || id_spec.shape.size() != 1) {
    return Error(ErrorKind::kFormat, "token_ids must be a 1-D integer tensor, the manifest says " +
                                         std::string(torch_dtype_name(id_spec.dtype)) + " of " +
                                         std::to_string(id_spec.shape.size()) + " dimension(s)");
  }
  if (id_spec.shape[0] != tokens) {
    return Error(ErrorKind::kMismatch, "token_ids from the store have " +
                                           std::to_string(id_spec.shape[0]) +
                                           " values, the row has " + std::to_string(tokens));
  }
  const std::uint8_t* base = read.region->data();
  TensorView id_view;
  id_view.name = "token_ids";
  id_view.dtype = id_spec.dtype;
  id_view.shape = id_spec.shape;
  id_view.data = base + id_spec.offset;
  id_view.nbytes = id_spec.nbytes;
  const RowIds row_ids(ids);
  if (const std::int64_t at = row_ids.first_difference(id_view); at >= 0) {
    return Error(ErrorKind::kMismatch,
                 "token_ids from the store differ from the row's input_ids at position " +
                     std::to_string(at) + " of " + std::to_string(tokens));
  }
  const MooncakeTensorSpec& hs = m.hidden_states;
  if ((hs.dtype != DType::kBF16 && hs.dtype != DType::kF16 && hs.dtype != DType::kF32) ||
      hs.shape.size() != 3 || hs.shape[0] != tokens) {
    std::string shape;
    for (const std::int64_t d : hs.shape) shape += (shape.empty() ? "" : ", ") + std::to_string(d);
    return Error(ErrorKind::kFormat,
                 "hidden_states from the store must be bf16/f16/f32 [T, L, H] with T = " +
                     std::to_string(tokens) + ", got " + torch_dtype_name(hs.dtype) + " [" + shape +
                     "]");
  }
  FetchedSample sample;
  sample.hidden =
      HiddenStatesView{base + hs.offset, hs.dtype, hs.shape[0], hs.shape[1], hs.shape[2]};
  sample.owner = read.region;
  return sample;
}

void MooncakeTransfer::remove(const std::string& handle) {
  auto removal = std::make_shared<Removal>();
  removal->handle = handle;
  removal->waited = true;
  removal->due = Clock::now();
  removal->deadline = removal->due + ticks(options_.key_wait);
  std::unique_lock lock(mutex_);
  if (stopping_) throw Error(ErrorKind::kRuntime, "Mooncake remove of " + handle + ": stopped");
  removals_.push_back(removal);
  work_.notify_one();
  // Not cancelled with the reads: a key left behind would stay in the store.
  done_.wait(lock, [&] { return removal->done; });
  if (removal->error) throw *removal->error;
}

void MooncakeTransfer::cancel() {
  {
    std::lock_guard lock(mutex_);
    cancelled_ = true;
  }
  done_.notify_all();
}

void MooncakeTransfer::resume() {
  std::lock_guard lock(mutex_);
  cancelled_ = false;
}

void MooncakeTransfer::run() {
  std::unique_lock lock(mutex_);
  while (true) {
    if (stopping_) break;
    const auto now = Clock::now();
    std::vector<std::shared_ptr<Read>> due;
    auto next = Clock::time_point::max();
    const auto limit = static_cast<std::size_t>(options_.max_keys_per_round);
    for (auto it = reads_.begin(); it != reads_.end();) {
      // Reads due within kCoalesce join this round: fewer rounds (each a GIL hold and a master
      // round trip), each look at most kCoalesce early.
      if ((*it)->due <= now + kCoalesce && due.size() < limit) {
        due.push_back(*it);
        it = reads_.erase(it);
      } else {
        next = std::min(next, (*it)->due);
        ++it;
      }
    }
    std::vector<std::shared_ptr<Removal>> removals;
    for (auto it = removals_.begin(); it != removals_.end();) {
      if ((*it)->due <= now) {
        removals.push_back(*it);
        it = removals_.erase(it);
      } else {
        next = std::min(next, (*it)->due);
        ++it;
      }
    }
    if (due.empty() && removals.empty()) {
      if (next == Clock::time_point::max()) {
        work_.wait(lock);
      } else {
        work_.wait_until(lock, next);
      }
      continue;
    }
    lock.unlock();
    serve(due, removals);
    lock.lock();
    done_.notify_all();
  }
  // Stopping: nothing more is read or removed.
  for (const auto& read : reads_) {
    read->error = Error(ErrorKind::kRuntime, "the Mooncake transfer stopped");
    read->done = true;
  }
  for (const auto& removal : removals_) {
    removal->error = Error(ErrorKind::kRuntime,
                           "Mooncake remove of " + removal->handle + ": the transfer stopped");
    removal->done = true;
  }
  reads_.clear();
  removals_.clear();
  done_.notify_all();
}

void MooncakeTransfer::serve(std::vector<std::shared_ptr<Read>>& reads,
                             std::vector<std::shared_ptr<Removal>>& removals) {
  std::vector<std::string> remove_keys;
  for (const auto& removal : removals) {
    remove_keys.push_back(removal->handle);
    remove_keys.push_back(removal->handle + std::string(kMooncakeErrorSuffix));
  }
  std::vector<std::string> markers;
  markers.reserve(reads.size());
  for (const auto& read : reads) markers.push_back(read->manifest.error_key());
  std::vector<std::int64_t> removed;
  std::vector<std::int64_t> exist;
  std::vector<std::string> marker_bytes(reads.size());
  std::vector<std::size_t> fetched;  // indices into `reads` read with batch_get_into
  std::vector<std::int64_t> got;
  std::vector<std::int64_t> sizes;  // get_size of the objects refused as larger
  std::optional<Error> failure;
  const auto start = Clock::now();
  try {
    client_->round([&](MooncakeStoreCalls& calls) {
      if (!remove_keys.empty()) removed = calls.batch_remove(remove_keys);
      if (reads.empty()) return;
      exist = calls.batch_is_exist(markers);
      std::vector<std::string> keys;
      std::vector<std::uint8_t*> buffers;
      std::vector<std::uint64_t> lengths;
      for (std::size_t i = 0; i < reads.size(); ++i) {
        if (i < exist.size() && exist[i] == 1) {
          marker_bytes[i] = calls.get(markers[i]);
        } else if (i < exist.size() && exist[i] == 0) {
          fetched.push_back(i);
          keys.push_back(reads[i]->manifest.handle);
          buffers.push_back(reads[i]->region->data());
          lengths.push_back(reads[i]->manifest.total_bytes);
        }
      }
      if (!keys.empty()) got = calls.batch_get_into(keys, buffers, lengths);
      sizes.assign(got.size(), 0);
      for (std::size_t k = 0; k < got.size(); ++k) {
        if (got[k] == kMooncakeInvalidParams) sizes[k] = calls.get_size(keys[k]);
      }
    });
  } catch (const std::exception& error) {
    failure = Error(ErrorKind::kRuntime, error.what());
  }
  const auto now = Clock::now();
  std::lock_guard lock(mutex_);
  ++stats_.rounds;
  stats_.max_keys_in_round =
      std::max(stats_.max_keys_in_round, static_cast<std::int64_t>(reads.size() + removals.size()));
  stats_.store_seconds += Seconds(now - start).count();
  for (std::size_t r = 0; r < removals.size(); ++r) {
    Removal& removal = *removals[r];
    std::optional<Error> error = failure;
    bool only_being_written = !failure;
    bool key_not_there = false;
    for (std::size_t k = 2 * r; !failure && k < 2 * r + 2; ++k) {
      const std::int64_t status = k < removed.size() ? removed[k] : kMooncakeInvalidParams;
      if (status == kMooncakeObjectNotFound) {
        key_not_there = key_not_there || k % 2 == 0;
        continue;
      }
      if (status >= 0) {
        if (k % 2 == 0) ++stats_.removed;
        if (k % 2 == 0 && removal.orphan) ++stats_.orphans;
        continue;
      }
      only_being_written = only_being_written && status == kMooncakeNotReady;
      if (!error) {
        error = Error(ErrorKind::kRuntime, "Mooncake remove failed for key=" + remove_keys[k] +
                                               " with " + status_text(status));
      }
    }
    if (!error) {
      // A producer may put its object after its answer: a key not there yet is watched for (its
      // caller does not wait for that), so that it does not stay in the store once it comes.
      // (The transfer's own removals follow a read that found the object: not there, it is gone.)
      if (key_not_there && (removal.waited || removal.until_found) && now < removal.deadline) {
        if (removal.until_found) {
          removal.due = now + ticks(options_.poll_interval);
          removals_.push_back(removals[r]);
          continue;
        }
        const auto later = remove_later(removal.handle, removal.deadline);
        later->until_found = true;
        later->orphan = true;
      }
      removal.done = true;
      continue;
    }
    const bool retry = now < removal.deadline;
    if (retry && (only_being_written || !removal.waited)) {
      // A put under way (its caller waits for it), or nobody waits: tried again.
      removal.due = now + ticks(options_.poll_interval);
      removals_.push_back(removals[r]);
      continue;
    }
    // Its caller hears of the failure now; the key is tried again until the deadline, so that a
    // store that comes back (a restarted master) is left empty.
    ++stats_.remove_errors;
    removal.error = std::move(error);
    removal.done = true;
    if (retry) remove_later(removal.handle, removal.deadline);
  }
  if (failure) {
    for (const auto& read : reads) {
      if (!read->abandoned) ++stats_.store_errors;
      keep_watching(read, now);
      read->error = *failure;
      read->done = true;
    }
    return;
  }
  for (std::size_t i = 0; i < reads.size(); ++i) {
    Read& read = *reads[i];
    const std::int64_t status = i < exist.size() ? exist[i] : kMooncakeInvalidParams;
    if (read.abandoned && status == 1) {
      remove_later(read.manifest.handle, now + ticks(options_.key_wait))->orphan = true;
      read.done = true;
    } else if (status == 1) {
      ++stats_.error_markers;
      read.error =
          Error(ErrorKind::kRuntime, mooncake_error_marker_text(markers[i], marker_bytes[i]));
      read.done = true;
    } else if (status != 0) {
      if (!read.abandoned) ++stats_.store_errors;
      keep_watching(reads[i], now);
      read.error = Error(ErrorKind::kRuntime, "Mooncake is_exist failed for key=" + markers[i] +
                                                  " with " + status_text(status));
      read.done = true;
    }
  }
  for (std::size_t k = 0; k < fetched.size(); ++k) {
    const std::int64_t status = k < got.size() ? got[k] : kMooncakeInvalidParams;
    settle(reads[fetched[k]], status, k < sizes.size() ? sizes[k] : -1, now);
  }
}

void MooncakeTransfer::settle(const std::shared_ptr<Read>& read, std::int64_t status,
                              std::int64_t size, Clock::time_point now) {
  // Lock held.
  const std::string& key = read->manifest.handle;
  const auto expected = static_cast<std::int64_t>(read->manifest.total_bytes);
  // A key whose put has not completed reads as not there yet (hs-connectors' is_exist says 0).
  if (status == kMooncakeNotReady) status = kMooncakeObjectNotFound;
  if (read->abandoned) {
    if (status == kMooncakeObjectNotFound && now < read->deadline) {
      read->due = std::min(now + ticks(options_.poll_interval), read->deadline);
      reads_.push_back(read);
    } else if (status != kMooncakeObjectNotFound) {
      remove_later(key, now + ticks(options_.key_wait))->orphan = true;
    }
    read->done = true;
    return;
  }
  if (status == expected) {
    ++stats_.reads;
    stats_.bytes_read += read->manifest.total_bytes;
    read->done = true;
    return;
  }
  if (status == kMooncakeObjectNotFound) {
    if (now >= read->deadline) {
      ++stats_.timed_out;
      watch(*read, now);
      read->error =
          Error(ErrorKind::kNotFound, "Timed out waiting for Mooncake key: " + key + " (" +
                                          std::to_string(options_.key_wait.count()) + " s)");
      read->done = true;
      return;
    }
    ++stats_.polls;
    read->due = std::min(now + ticks(read->delay), read->deadline);
    read->delay = std::min(read->delay * 2, options_.poll_interval);
    reads_.push_back(read);
    return;
  }
  if (status >= 0 || (status == kMooncakeInvalidParams && size > expected)) {
    ++stats_.wrong_size;
    read->error = Error(ErrorKind::kFormat, "Mooncake payload size " +
                                                std::to_string(status >= 0 ? status : size) +
                                                " doesn't match expected payload size " +
                                                std::to_string(expected) + " (key=" + key + ")");
    read->done = true;
    return;
  }
  ++stats_.store_errors;
  watch(*read, now);
  read->error = Error(ErrorKind::kRuntime, "Mooncake batch_get_into failed for key=" + key +
                                               " with " + status_text(status));
  read->done = true;
}

std::shared_ptr<MooncakeTransfer::Removal> MooncakeTransfer::remove_later(
    const std::string& handle, Clock::time_point deadline) {
  // Lock held. Nobody waits for it: the next round removes it, or tries again until the deadline.
  auto removal = std::make_shared<Removal>();
  removal->handle = handle;
  removal->due = Clock::now();
  removal->deadline = deadline;
  removals_.push_back(removal);
  return removal;
}

void MooncakeTransfer::keep_watching(const std::shared_ptr<Read>& read, Clock::time_point now) {
  // Lock held. A read the store failed: a watcher for a live one, another look for a watcher.
  if (!read->abandoned) {
    watch(*read, now);
  } else if (now < read->deadline) {
    read->due = now + ticks(options_.poll_interval);
    reads_.push_back(read);
  }
}

void MooncakeTransfer::watch(const Read& failed, Clock::time_point now) {
  // Lock held. A read that failed without its object (the key did not come in time, the store
  // failed) leaves a watcher: a producer's put that lands later is removed when it comes.
  auto watcher = std::make_shared<Read>();
  watcher->manifest = failed.manifest;
  watcher->region = failed.region;
  watcher->abandoned = true;
  watcher->due = now + ticks(options_.poll_interval);
  watcher->deadline = now + ticks(options_.key_wait);
  reads_.push_back(std::move(watcher));
}

MooncakeTransferStats MooncakeTransfer::stats() const {
  MooncakeTransferStats out;
  {
    std::lock_guard lock(mutex_);
    out = stats_;
    out.queued_reads = static_cast<std::int64_t>(
        std::count_if(reads_.begin(), reads_.end(), [](const auto& r) { return !r->abandoned; }));
  }
  out.staging = pool_.stats();
  return out;
}

StatsTree MooncakeTransfer::stats_report() const {
  StatsTree out;
  out.add_group("mooncake", stats_tree(stats()));
  return out;
}

}  // namespace draftfeed
