#include "draftfeed/read_ahead/file_read_ahead.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>

#include "draftfeed/common/error.h"
#include "draftfeed/read_ahead/page_cache_read.h"

namespace draftfeed {

namespace {

// The mapping of a prepared file worth reading (found, with its descriptor kept), else null.
std::shared_ptr<const MappedFile> readable_mapping(const FileReadAhead::Prepared& prepared) {
  if (!prepared.ok() || !prepared.value()) return nullptr;
  const auto& mapping = prepared.value()->file->mapping();
  return mapping->fd() >= 0 && mapping->size() > 0 ? mapping : nullptr;
}

// `range` widened to whole pages (the page cache's unit) and clipped to its file; no file when
// there is nothing to read through a descriptor.
FileRange page_aligned(FileRange range) {
  if (!range.file || range.file->fd() < 0 || range.file->size() == 0) return {};
  static const auto kPage = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  const std::uint64_t size = range.file->size();
  const std::uint64_t begin = std::min(range.offset / kPage * kPage, size);
  const std::uint64_t end =
      std::min((range.offset + range.length + kPage - 1) / kPage * kPage, size);
  if (end <= begin) return {};
  return FileRange{std::move(range.file), begin, end - begin};
}

}  // namespace

void read_before_copy(const MappedFile& mapping) {
  if (mapping.fd() < 0 || mapping.size() == 0) return;
  if (!mapped_file_cached(mapping.data(), mapping.size())) {
    read_open_file_into_page_cache(mapping.fd(), mapping.size());
  }
}

std::int64_t default_max_open_files() {
  std::int64_t files = 4096;
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY) {
    files = std::min<std::int64_t>(files, static_cast<std::int64_t>(limit.rlim_cur / 4));
  }
  return std::max<std::int64_t>(16, files);
}

void FileReadAheadOptions::validate() const {
  auto positive = [](bool ok, const char* field, const std::string& value) {
    require(ok, ErrorKind::kInvalidArgument,
            std::string("read-ahead: ") + field + " must be positive, got " + value);
  };
  positive(max_ahead_bytes > 0, "max_ahead_bytes", std::to_string(max_ahead_bytes));
  positive(max_reading_bytes > 0, "max_reading_bytes", std::to_string(max_reading_bytes));
  positive(max_threads > 0, "max_threads", std::to_string(max_threads));
  positive(max_asks > 0, "max_asks", std::to_string(max_asks));
  positive(idle_exit_after.count() > 0, "idle_exit_after",
           std::to_string(idle_exit_after.count()) + " ms");
  require(max_open_files >= 0, ErrorKind::kInvalidArgument,
          "read-ahead: max_open_files must be >= 0 (0: from the open-file limit), got " +
              std::to_string(max_open_files));
  require(grow_after.count() >= 0, ErrorKind::kInvalidArgument,
          "read-ahead: grow_after must be >= 0");
  hedge.validate("read-ahead: hedge.factor", "read-ahead: hedge.min_wait");
  wanted_hedge.validate("read-ahead: wanted_hedge.factor", "read-ahead: wanted_hedge.min_wait");
}

FileReadAhead::FileReadAhead(Opener opener, FileReadAheadOptions options, RangeOf range_of)
    : opener_(std::move(opener)),
      range_of_(std::move(range_of)),
      options_((options.validate(), options)),
      max_open_files_(options.max_open_files > 0 ? options.max_open_files
                                                 : default_max_open_files()),
      pacer_([this] { pace(); }) {
  ahead_.set_limit(options_.max_ahead_bytes);
}

FileReadAhead::~FileReadAhead() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    stop_reads_ = true;
  }
  work_.notify_all();
  ready_.notify_all();
  paced_.notify_all();
  // No thread starts once stopping_ is set, so threads_ no longer changes once the pacer is gone.
  pacer_.join();
  for (std::thread& thread : threads_) thread.join();
}

void FileReadAhead::plan(FileReadAheadPlan plan) {
  std::unordered_map<std::int64_t, Entry> dropped;
  {
    std::lock_guard lock(mutex_);
    plan_ = std::move(plan);
    if (plan_.budget_bytes > 0) ahead_.set_limit(plan_.budget_bytes);
    batch_ = in_batch_ = 0;
    position_ = 0;
    dropped.swap(entries_);
    to_read_.clear();
    reached_early_.clear();
    to_hedge_.clear();
    opens_started_.clear();
    opening_by_batch_.clear();
    wanted_batches_ = 0;
    ahead_.clear();
    ++generation_;
    start_threads();
  }
  work_.notify_all();
  ready_.notify_all();
  paced_.notify_all();
  // `dropped` unmaps and closes its files here, outside the lock.
}

void FileReadAhead::clear() { plan(FileReadAheadPlan{}); }

FileReadAheadStats FileReadAhead::stats() const {
  std::lock_guard lock(mutex_);
  FileReadAheadStats stats = stats_;
  stats.running = static_cast<std::int64_t>(threads_.size() - ended_.size());
  ahead_.report(stats.memory);
  return stats;
}

bool FileReadAhead::settled() const {
  std::lock_guard lock(mutex_);
  // Every open and read runs on a worker outside the lock: with none under way and none allowed,
  // no worker can start one before a take, a plan or a clear changes the budgets or the plan.
  return opening_ == 0 && reading_ == 0 && to_hedge_.empty() && !can_read() && !can_open();
}

std::optional<FileReadAhead::Prepared> FileReadAhead::take(std::int64_t row) {
  std::unique_lock lock(mutex_);
  auto it = entries_.find(row);
  if (it == entries_.end()) {
    // Not opened yet: the caller opens it, and the read-ahead skips it when it gets there.
    if (batch_ < plan_.batches.size()) reached_early_.insert(row);
    return std::nullopt;
  }
  // Its batch is being put together: the opens for it, and for the next few (the pipeline fetches
  // the batches of its 4 buffers at once), are wanted soon (docs/decisions.md: why the next three).
  constexpr std::size_t kBatchesWanted = 4;
  if (it->second.batch + kBatchesWanted > wanted_batches_) {
    wanted_batches_ = it->second.batch + kBatchesWanted;
    if (!opening_by_batch_.empty()) paced_.notify_one();  // it may sleep until a later deadline
  }
  if (it->second.state == State::kOpening || it->second.state == State::kReading) {
    ++stats_.waited;
    if (it->second.state == State::kOpening) ++stats_.waited_opening;
    const auto wait_began = std::chrono::steady_clock::now();
    const std::uint64_t generation = generation_;
    const auto settled = [&] {
      if (stopping_ || generation != generation_) return true;
      it = entries_.find(row);
      return it == entries_.end() ||
             (it->second.state != State::kOpening && it->second.state != State::kReading);
    };
    // Waiting for an open under way: asked for again once it is slower than opens usually are
    // (its batch waits; the first answer wins).
    while (!settled()) {
      Entry& entry = it->second;
      const bool can_ask = entry.state == State::kOpening && options_.hedge.enabled() &&
                           opens_timed_ >= 8 && entry.asks < options_.max_asks;
      if (!can_ask) {
        ready_.wait(lock, settled);
        break;
      }
      const auto now = std::chrono::steady_clock::now();
      const auto delay = hedge_delay(/*wanted=*/true);
      if (due_another_ask(entry, now, delay)) {
        ask_again(row, entry);
      } else {
        ready_.wait_until(lock, entry.asked_at + delay, settled);
      }
    }
    stats_.wait_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - wait_began).count();
    if (stopping_ || generation != generation_ || it == entries_.end()) return std::nullopt;
  }
  Entry& entry = it->second;
  const bool read_here = entry.state == State::kOpened;  // opened, its read not started
  if (read_here) to_read_.erase(entry.position);
  if (entry.counted_ahead) ahead_.release(entry.bytes);
  std::optional<Prepared> prepared = std::move(entry.prepared);
  const std::optional<FileRange> range = std::move(entry.range);
  entries_.erase(it);
  ++stats_.taken;
  lock.unlock();
  work_.notify_all();
  if (range) {
    // Wanted now and not read yet: its range read here in one sequential pass, not faulted in by
    // the copy one page (and one file system round trip) at a time.
    if (read_here) {
      read_open_file_range_into_page_cache(range->file->fd(), range->offset,
                                           range->offset + range->length);
    }
    return std::nullopt;
  }
  // Wanted now and not read yet: read whole here, through the descriptor, in one sequential pass,
  // so that the copy finds the file in the page cache instead of waiting on the file system for
  // each slice it reads or faults in. On a network file system the copy then takes the rows from
  // the mapping, in the page cache now (CacheCopy in source/cache_source.h: there a read() of a
  // file opened long before asks the server for its attributes first).
  // The mapping stays header-only (kMapForRowReads) until the fetch's check.
  if (const auto mapping = prepared && read_here ? readable_mapping(*prepared) : nullptr) {
    read_open_file_into_page_cache(mapping->fd(), mapping->size());
  }
  return prepared;
}

bool FileReadAhead::can_open() const {
  return batch_ < plan_.batches.size() &&
         static_cast<std::int64_t>(entries_.size()) < max_open_files_;
}

bool FileReadAhead::can_read() const {
  if (to_read_.empty()) return false;
  const std::uint64_t bytes = entries_.at(to_read_.begin()->second).bytes;
  const bool reading_room = reading_ == 0 || reading_bytes_ + bytes <= options_.max_reading_bytes;
  const bool ahead_room = ahead_.fits(bytes, /*first_always_fits=*/true);
  return reading_room && ahead_room;
}

void FileReadAhead::start_threads() {
  const auto wanted = static_cast<std::size_t>(std::min(2, std::max(1, options_.max_threads)));
  while (!stopping_ && threads_.size() < wanted && (can_read() || can_open())) {
    threads_.emplace_back([this] { run(); });
    ++stats_.threads;
  }
}

std::chrono::steady_clock::duration FileReadAhead::hedge_delay(bool wanted) const {
  const std::size_t timed = std::min(opens_timed_, open_times_.size());
  std::chrono::steady_clock::duration median{};
  if (timed > 0) {
    std::array<std::chrono::steady_clock::duration, 32> times{};
    std::copy_n(open_times_.begin(), timed, times.begin());
    const auto middle = times.begin() + static_cast<std::ptrdiff_t>(timed / 2);
    std::nth_element(times.begin(), middle, times.begin() + static_cast<std::ptrdiff_t>(timed));
    median = *middle;
  }
  const auto scaled = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      (wanted ? options_.wanted_hedge : options_.hedge)
          .delay(std::chrono::duration<double>(median)));
  return scaled;
}

bool FileReadAhead::due_another_ask(const Entry& entry, std::chrono::steady_clock::time_point now,
                                    std::chrono::steady_clock::duration delay) const {
  return entry.state == State::kOpening && entry.asks < options_.max_asks &&
         now >= entry.asked_at + delay;
}

void FileReadAhead::note_ask(Entry& entry) {
  entry.asked_at = std::chrono::steady_clock::now();
  ++entry.asks;
}

void FileReadAhead::ask_again(std::int64_t row, Entry& entry) {
  note_ask(entry);
  opens_started_.emplace_back(entry.asked_at, row);  // timed by the pacer, as a first ask
  to_hedge_.push_back(row);
  ++stats_.memory.hedges;
  work_.notify_one();
  if (pacer_idle_) paced_.notify_one();  // a thread for it, if every one is in a call
}

bool FileReadAhead::opens_are_slow() const {
  // Half of the latest 8 opens, not of the 32 the hedges time: a file system that turns slow (a
  // mount replaced, a server loaded) is seen after two rounds of opens on the two first threads,
  // not after most of 32; and on a local disk an open of a millisecond (a thread descheduled on a
  // busy machine) is seldom half of 8, where a smaller share would grow threads there.
  constexpr std::size_t kWindow = 8;
  const std::size_t timed = std::min({opens_timed_, open_times_.size(), kWindow});
  if (timed < 2) return false;
  std::size_t slow = 0;
  for (std::size_t k = 1; k <= timed; ++k) {
    const std::size_t at = (opens_timed_ - k) % open_times_.size();
    if (open_times_[at] >= options_.grow_after) ++slow;
  }
  return 2 * slow >= timed;  // half of them took grow_after or more
}

void FileReadAhead::join_ended() {
  for (const std::thread::id id : ended_) {
    const auto it = std::find_if(threads_.begin(), threads_.end(),
                                 [id](const std::thread& thread) { return thread.get_id() == id; });
    // It has left run() (and with it the lock): the join waits for nothing of ours.
    it->join();
    threads_.erase(it);
  }
  ended_.clear();
}

void FileReadAhead::pace() {
  std::unique_lock lock(mutex_);
  while (!stopping_) {
    join_ended();
    const auto now = std::chrono::steady_clock::now();
    auto wake = std::chrono::steady_clock::time_point::max();
    // Opens far slower than the usual one: hedged (asked again by a worker; the first answer wins).
    if (options_.hedge.enabled() && opens_timed_ >= 8) {
      const auto delay = hedge_delay(/*wanted=*/false);
      while (!opens_started_.empty()) {
        const auto [began, row] = opens_started_.front();
        const auto it = entries_.find(row);
        if (it == entries_.end() || it->second.state != State::kOpening ||
            it->second.asks >= options_.max_asks || it->second.asked_at != began) {
          opens_started_.pop_front();  // answered, dropped, asked again since, or asked enough
          continue;
        }
        if (now < began + delay) {
          wake = began + delay;
          break;
        }
        opens_started_.pop_front();
        ask_again(row, it->second);
      }
      // Opens for the batches being put together: asked again sooner.
      const auto wanted_delay = hedge_delay(/*wanted=*/true);
      for (const auto& [batch, row] : opening_by_batch_) {
        if (batch >= wanted_batches_) break;
        Entry& entry = entries_.at(row);
        if (entry.asks >= options_.max_asks) continue;
        if (due_another_ask(entry, now, wanted_delay)) {
          ask_again(row, entry);
        } else {
          wake = std::min(wake, entry.asked_at + wanted_delay);
        }
      }
    }
    // Every thread in a call on a file system that keeps each open waiting, work waiting: more
    // calls in flight, an eighth more threads per step (from 2 to 256 in a few dozen steps).
    const bool full = static_cast<int>(threads_.size()) >= options_.max_threads;
    // An ask waiting for a thread gets one even where opens are usually quick: every thread may
    // be in a stalled ask (of the very file it is for).
    if (!full && idle_ == 0 &&
        (!to_hedge_.empty() || (slow_opens_ && (can_read() || can_open())))) {
      const std::size_t more =
          std::min(std::max<std::size_t>(1, threads_.size() / 8),
                   static_cast<std::size_t>(options_.max_threads) - threads_.size());
      for (std::size_t k = 0; k < more; ++k) threads_.emplace_back([this] { run(); });
      stats_.threads += static_cast<std::int64_t>(more);
      wake = std::min(wake, now + options_.grow_after);
    }
    if (wake == std::chrono::steady_clock::time_point::max()) {
      pacer_idle_ = true;
      paced_.wait(lock);
      pacer_idle_ = false;
    } else {
      paced_.wait_until(lock, wake);
    }
  }
}

std::int64_t FileReadAhead::next_row() {
  while (batch_ < plan_.batches.size()) {
    const std::span<const std::int64_t> rows = plan_.batches[batch_];
    if (in_batch_ < rows.size()) {
      ++position_;
      return rows[in_batch_++];
    }
    ++batch_;
    in_batch_ = 0;
  }
  return -1;
}

void FileReadAhead::run() {
  std::unique_lock lock(mutex_);
  while (true) {
    ++idle_;
    const bool work = work_.wait_for(lock, options_.idle_exit_after, [this] {
      return stopping_ || !to_hedge_.empty() || can_read() || can_open();
    });
    --idle_;
    if (stopping_) return;
    if (!work) {
      // Idle for long: this thread ends, unless it is one of the last two (joined by the pacer).
      if (threads_.size() - ended_.size() > 2) {
        ended_.push_back(std::this_thread::get_id());
        paced_.notify_one();
        return;
      }
      continue;
    }
    // Hedges first (a file the fetches will want soon, held up), then reads (an opened file is
    // nearer to its fetch than the next one to open).
    if (!to_hedge_.empty()) {
      const std::int64_t row = to_hedge_.front();
      to_hedge_.pop_front();
      const auto it = entries_.find(row);
      // Not answered meanwhile: ask again.
      if (it != entries_.end() && it->second.state == State::kOpening) {
        open_row(lock, row, /*hedge=*/true);
      }
    } else if (can_read()) {
      read_one(lock);
    } else {
      open_one(lock);
    }
  }
}

void FileReadAhead::open_one(std::unique_lock<std::mutex>& lock) {
  const std::int64_t row = next_row();
  if (row < 0) return;
  if (reached_early_.erase(row) != 0) {
    ++stats_.overtaken;
    return;
  }
  if (entries_.count(row) != 0) return;  // planned twice: the first one serves both
  Entry& entry = entries_[row];
  entry.position = position_;
  entry.batch = batch_;
  opening_by_batch_.emplace(batch_, row);
  note_ask(entry);
  opens_started_.emplace_back(entry.asked_at, row);
  open_row(lock, row, /*hedge=*/false);
}

void FileReadAhead::open_row(std::unique_lock<std::mutex>& lock, std::int64_t row, bool hedge) {
  ++opening_;
  stats_.max_opening = std::max(stats_.max_opening, opening_);
  stats_.max_open_ahead =
      std::max(stats_.max_open_ahead, static_cast<std::int64_t>(entries_.size()));
  const std::uint64_t generation = generation_;
  const auto began = std::chrono::steady_clock::now();
  // On a slow file system the pacer times this open (to hedge it) and may add a thread.
  if (slow_opens_ && pacer_idle_) paced_.notify_one();
  lock.unlock();

  std::optional<Prepared> prepared;
  std::optional<FileRange> range;
  try {
    if (range_of_) range = range_of_(row);
    if (range) {
      range = page_aligned(std::move(*range));
    } else {
      prepared.emplace(opener_(row));
    }
  } catch (const Error& error) {
    prepared.emplace(error);
  } catch (const std::exception& error) {
    prepared.emplace(Error(ErrorKind::kIo, "row " + std::to_string(row) + ": " + error.what()));
  }
  const auto mapping = range ? range->file : readable_mapping(*prepared);
  const std::uint64_t begin = range ? range->offset : 0;
  const std::uint64_t bytes = !mapping ? 0 : range ? range->length : mapping->size();
  const bool cached =
      mapping && options_.skip_cached && mapped_file_cached(mapping->data() + begin, bytes);
  const bool to_read = options_.read_data && mapping && !cached;
  // The open touched the header's page(s) (with large folios a fault maps a whole folio, up to 2
  // MiB): let them go now, as the fetch does after its checks. A file opened ahead waits for its
  // batch holding no page of this process's memory (thousands may be open ahead, each with a
  // folio mapped otherwise). A range touched nothing (its shared file is the fetches').
  if (mapping && !range) mapping->release(0, mapping->size());

  lock.lock();
  if (!hedge && !range) ++stats_.opened;
  --opening_;
  auto it = entries_.find(row);
  if (generation != generation_ || it == entries_.end() || it->second.state != State::kOpening) {
    // Cleared meanwhile, or another ask of a hedged file answered first: dropped (unmapped and
    // closed outside the lock), and not timed (a tail that lost would make the usual open time
    // look like the tail's: at an epoch's end the latest answers are the tails).
    lock.unlock();
    prepared.reset();
    lock.lock();
    return;
  }
  opening_by_batch_.erase({it->second.batch, row});
  // Asked again: this answer came first, the hedge's (won) or the first ask's (lost).
  if (it->second.asks > 1) ++(hedge ? stats_.memory.hedges_won : stats_.memory.hedges_lost);
  if (!range) {
    // The answer that wins is timed from its own ask (a hedge's too): what an open takes. A range
    // is found, not opened (its file opens once for all its rows): not an open's time.
    open_times_[opens_timed_++ % open_times_.size()] = std::chrono::steady_clock::now() - began;
    slow_opens_ = opens_are_slow();
  }
  // Opens still under way on a slow file system: the pacer times them (to hedge).
  if (slow_opens_ && pacer_idle_ && !opens_started_.empty()) paced_.notify_one();
  if (cached) ++(range ? stats_.ranges_cached : stats_.cached);
  it->second.prepared = std::move(prepared);
  if (range && mapping) it->second.range = std::move(range);
  it->second.bytes = bytes;
  if (to_read) {
    it->second.state = State::kOpened;
    to_read_.emplace(it->second.position, row);
    work_.notify_one();
  } else {
    it->second.state = State::kReady;
  }
  ready_.notify_all();
}

void FileReadAhead::read_one(std::unique_lock<std::mutex>& lock) {
  const std::int64_t row = to_read_.begin()->second;
  to_read_.erase(to_read_.begin());
  Entry& entry = entries_.at(row);
  entry.state = State::kReading;
  entry.counted_ahead = true;
  // Held here: the file stays open while it is read, even if the entry is dropped meanwhile.
  std::shared_ptr<const MappedFile> mapping =
      entry.range ? entry.range->file : readable_mapping(*entry.prepared);
  const bool by_range = entry.range.has_value();
  const std::uint64_t begin = by_range ? entry.range->offset : 0;
  const std::uint64_t bytes = entry.bytes;
  ahead_.hold(bytes);
  reading_bytes_ += bytes;
  ++reading_;
  const std::uint64_t generation = generation_;
  lock.unlock();

  // A whole file is read sequentially with the kernel's readahead widened (its fastest cold read);
  // a range is asked for exactly, so that the readahead does not run into the shard's other
  // samples.
  const std::size_t read =
      by_range
          ? read_open_file_range_into_page_cache(mapping->fd(), begin, begin + bytes,
                                                 kReadaheadChunk, &stop_reads_)
          : read_open_file_into_page_cache(mapping->fd(), bytes, kReadaheadChunk, &stop_reads_);
  mapping.reset();  // the last reference when the entry was dropped: unmapped outside the lock

  lock.lock();
  --reading_;
  reading_bytes_ -= bytes;
  if (generation == generation_) {
    auto it = entries_.find(row);
    if (it != entries_.end()) it->second.state = State::kReady;
    ++(by_range ? stats_.ranges : stats_.read);
    stats_.bytes += read;
  }
  work_.notify_one();  // reading room was freed
  ready_.notify_all();
}

}  // namespace draftfeed
