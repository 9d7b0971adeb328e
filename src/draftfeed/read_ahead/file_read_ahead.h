// The file read-ahead: opening and reading the cache ahead of the batch copy, in the order the
// epoch's plan will fetch it: what keeps a cold cache at the disk's speed, and hides a network file
// system's latency. One of the two read-aheads (the other, source/lookahead_source.h,
// starts an online source's requests ahead); both are planned by the loader through
// SampleSource::will_need, hold what they read ahead against a ByteBudget, ask again for what
// stalls by a HedgeRule, and report through SampleSource::stats_report.
//
// On NFS, Lustre, CephFS or an object store's FUSE mount every name lookup, open and first read is
// a round trip of milliseconds, with tails of seconds. By Little's law a reader that wants R bytes
// per second from files that each cost L seconds of round trips must keep R x L bytes in flight,
// whatever L is; so how many files are in flight is not a fixed thread count but follows from
// budgets in bytes and in open files:
//   * open ahead: the lock protocol, the open and the header of each file (CacheStore::lookup), in
//     plan order, up to `max_open_files` files opened and not yet fetched (each keeps its file
//     open, to be read without a second open, and one memory map). Opens that take long (a tail of
//     seconds) do not hold the others back: the files after them are opened meanwhile, and only a
//     fetch of that very file waits for it. Files are mapped header-only (kMapForRowReads:
//     touching the header reads its page alone, no read-around; the fetch's check ends that);
//   * read ahead: the bytes of opened files read into the page cache (sequentially, through the
//     descriptor the open left: page_cache_read.h), nearest in the plan first, at most
//     `max_reading_bytes` being read at once and `max_ahead_bytes` read and not yet fetched.
//     A file whose first and last pages are already cached is not read again (a warm epoch reads
//     nothing and only opens).
// Each open or read blocks a thread in the kernel. Two threads start with the first plan; a pacer
// starts more (an eighth more per `grow_after`, 1 ms, up to `max_threads`) while work waits
// within the budgets, no thread is free, and the opens are slow: half of the latest 8 took
// `grow_after` or more (on a network file system each open is a few round trips). That is a file
// system that keeps each call waiting, where many calls must be in flight (Little's law: in flight
// = rate x latency), and where opening far ahead of the fetches is what hides a slow open's tail:
// its file is asked for long before its batch. A thread blocked in such a call costs its stack,
// nothing else; one idle for `idle_exit_after` (30 s) ends, down to two. Where opens are quick (a
// local disk, even one busy with other threads) none start: more threads would only contend for the
// CPUs and for the process's memory map (every mmap and munmap takes it), and slow each open down.
//
// Rows that are not files of their own but byte ranges of a file opened once for many rows (a
// packed cache's samples in their shard: pack/packed_cache.h) are read ahead the same way, in plan
// order and within the same budgets, by range: the sample's pages (page-aligned), not the whole
// shard, through the shard's own descriptor (no open per row, and none timed or hedged as an open);
// a range whose first and last pages are cached is not read again.
// A fetch takes its row's prepared file (take): at once when it is ready, after the rest of its
// read when that is under way, or, when its read has not started, after reading it whole there
// (through the same descriptor, sequentially), so that the copy finds it in the page cache, whether
// it maps the rows (the default) or reads them (batch/sample_copy.h; source/cache_source.h's
// CacheCopy); a row the read-ahead has not reached yet is left to the fetch
// (and skipped when the read-ahead gets there).
// An open taking far longer than opens usually do (4 x the median of the latest 32 answers that
// won, at least 50 ms: a network file system's tail) is hedged: the pacer has a worker open the
// file again, and the first answer wins (the late ones are dropped, untimed). An open for a batch
// the fetches have reached (one of its rows taken: the batch is being put together now, its fetches
// are about to wait), or for one of the next three, is asked again sooner (2 x the median, at least
// 10 ms), whether or not a fetch waits for it yet: once a fetch waits, the tail's time is already
// lost. An ask that itself stalls is asked again, up to four asks in all. Where a tail is one
// request's bad luck (a server's queue, a lost packet), each further ask meets it again only as
// often as the tail is common, and a warm epoch has a dozen tails, so a few asks are needed before
// an epoch seldom waits a whole tail out (docs/decisions.md: why four); where the file itself is
// stuck, every ask waits, and the fetch holds its batch as it would have.
// Thread safety: every method may be called from any thread.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "draftfeed/common/error.h"
#include "draftfeed/common/mapped_file.h"
#include "draftfeed/hidden/hidden_state_sample.h"
#include "draftfeed/read_ahead/byte_budget.h"
#include "draftfeed/read_ahead/hedge_rule.h"

namespace draftfeed {

struct FileReadAheadOptions {
  // Read ahead, not yet fetched, until a plan brings the loader's budget (byte_budget.h).
  std::size_t max_ahead_bytes = kMinReadAheadBytes;
  std::size_t max_reading_bytes = std::size_t{32} << 20;  // being read at once (at least 1 file)
  // Files opened ahead and not yet fetched; 0: a quarter of the process's open-file limit
  // (RLIMIT_NOFILE), at most 4096 and at least 16.
  std::int64_t max_open_files = 0;
  int max_threads = 256;                       // blocked opens and reads at once, at most
  std::chrono::microseconds grow_after{1000};  // a call under way this long: one more thread
  // A thread with nothing to do this long ends (down to two): a slow file system's epoch leaves
  // no hundreds of idle threads behind for the rest of the run.
  std::chrono::milliseconds idle_exit_after{30000};
  // An open under way longer than `hedge` allows (x the median open time) is asked for again,
  // sooner (`wanted_hedge`) when a fetch waits for it; the first answer wins (read_ahead/
  // hedge_rule.h). At most `max_asks` asks of one file. hedge.factor 0: never.
  HedgeRule hedge{.factor = 4, .min_wait = std::chrono::milliseconds(50)};
  HedgeRule wanted_hedge{.factor = 2, .min_wait = std::chrono::milliseconds(10)};
  int max_asks = 4;
  bool read_data = true;    // read files into the page cache (off: open ahead only)
  bool skip_cached = true;  // files already in the page cache are not read again

  // The only check of these fields (Error kInvalidArgument naming the field).
  void validate() const;
};

struct FileReadAheadStats {
  std::int64_t opened = 0;          // files opened ahead (found or not)
  std::int64_t read = 0;            // files read into the page cache
  std::int64_t cached = 0;          // files found in the page cache once opened (not read again)
  std::uint64_t bytes = 0;          // the bytes read (files and ranges)
  std::int64_t taken = 0;           // prepared files a fetch took
  std::int64_t waited = 0;          // fetches that waited for their file's open or read under way
  std::int64_t waited_opening = 0;  // of them, for an open (the rest: for a read)
  double wait_seconds = 0;          // how long they waited, in all
  std::int64_t ranges = 0;          // byte ranges of shared files read into the page cache
  std::int64_t ranges_cached = 0;   // byte ranges found in the page cache (not read again)
  std::int64_t overtaken = 0;    // rows a fetch reached before the read-ahead (left to the fetch)
  std::int64_t threads = 0;      // threads started so far
  std::int64_t running = 0;      // threads running now (idle ones end: idle_exit_after)
  std::int64_t max_opening = 0;  // the most opens under way at once
  std::int64_t max_open_ahead = 0;  // the most files opened and not yet fetched
  // Bytes read ahead of the fetches (held now, at most, the budget) and opens asked for again
  // (see hedge): won when a later ask answered first.
  ReadAheadMemory memory;
};

// Each statistic under its reported name, in declaration order: the one list of them, from which
// the Python dict (python/bindings/engine.cc) is made. Calls `visit(name, value)` once per field.
template <typename Visit>
constexpr void for_each_stat(const FileReadAheadStats& s, Visit&& visit) {
  visit("opened", s.opened);
  visit("read", s.read);
  visit("cached", s.cached);
  visit("bytes", s.bytes);
  visit("taken", s.taken);
  visit("waited", s.waited);
  visit("waited_opening", s.waited_opening);
  visit("wait_seconds", s.wait_seconds);
  visit("ranges", s.ranges);
  visit("ranges_cached", s.ranges_cached);
  visit("overtaken", s.overtaken);
  visit("threads", s.threads);
  visit("running", s.running);
  visit("max_opening", s.max_opening);
  visit("max_open_ahead", s.max_open_ahead);
  visit("memory", s.memory);
}
// Every field but the memory group is 8 bytes: one added to the struct but not to for_each_stat
// changes the size.
static_assert(sizeof(FileReadAheadStats) == 8 * [] {
  std::size_t fields = 0;
  for_each_stat(FileReadAheadStats{}, [&](const char*, auto) { ++fields; });
  return fields - 1;
}() + sizeof(ReadAheadMemory));

// Batches of rows in fetch order, viewed where they lie (the pipeline's plan): no copy of an
// epoch's rows.
struct FileReadAheadPlan {
  std::shared_ptr<const void> owner;  // keeps the rows viewed alive
  std::vector<std::span<const std::int64_t>> batches;
  // The bytes read ahead of the fetches at most from now on (the loader's budget,
  // byte_budget.h); 0: as before (at first, the options' max_ahead_bytes).
  std::uint64_t budget_bytes = 0;
};

// A row's bytes in a file opened once for many rows (a packed cache's shard).
struct FileRange {
  std::shared_ptr<const MappedFile> file;  // its descriptor kept; null: nothing to read ahead
  std::uint64_t offset = 0;
  std::uint64_t length = 0;
};

class FileReadAhead {
 public:
  // What opening a row's file means: the cache store's lookup (lock protocol, open, header).
  using Opener = std::function<Result<std::optional<HiddenStateSample>>(std::int64_t row)>;
  using Prepared = Result<std::optional<HiddenStateSample>>;
  // The row's range when it lies in a shared file (a FileRange with no file when that file does not
  // open: its fetch says why), or nothing when it is a file of its own (then opened by the Opener).
  using RangeOf = std::function<std::optional<FileRange>(std::int64_t row)>;

  FileReadAhead(Opener opener, FileReadAheadOptions options = {}, RangeOf range_of = nullptr);
  ~FileReadAhead();  // stops the threads (after the system call each is in)
  FileReadAhead(const FileReadAhead&) = delete;
  FileReadAhead& operator=(const FileReadAhead&) = delete;

  // The rows coming, in the order the fetches will want them (an epoch's plan: batches of rows).
  // Replaces what was planned before (clear()).
  void plan(FileReadAheadPlan plan);
  // The prepared file of `row`, waiting for its open or read when under way; nothing when the
  // prefetch has not opened it (the caller opens it itself). For a row read by range: waits for its
  // read under way, or reads the range when its read has not started, and gives nothing (the
  // caller reads the row from the shared file).
  std::optional<Prepared> take(std::int64_t row);
  // Drops the plan, the prepared files and the accounting (an epoch stopped).
  void clear();

  const FileReadAheadOptions& options() const { return options_; }
  FileReadAheadStats stats() const;
  // Whether the read-ahead has done all it may until the next take, plan or clear: no open or read
  // under way, and nothing planned that the budgets let it open or read. What a caller waits for
  // before it checks that a budget held (a sleep would not say whether the workers got there).
  bool settled() const;

 private:
  enum class State : std::uint8_t { kOpening, kOpened, kReading, kReady };
  struct Entry {
    State state = State::kOpening;
    std::int64_t position = 0;                         // in the plan: reads go nearest first
    std::size_t batch = 0;                             // the plan's batch it is for
    std::chrono::steady_clock::time_point asked_at{};  // when its latest ask began
    int asks = 0;                                      // opens asked for (1 + hedges)
    std::optional<Prepared> prepared;
    // A row read by range (RangeOf): its range, page-aligned. Else the file's own (prepared).
    std::optional<FileRange> range;
    std::uint64_t bytes = 0;     // the bytes to read (the file's size, or the range's), once opened
    bool counted_ahead = false;  // its bytes count in ahead_
  };

  void run();
  bool can_open() const;
  bool can_read() const;
  void start_threads();         // the first two threads, when there is work (mutex_ held)
  void pace();                  // the pacer thread: one more worker while every call is slow
  void join_ended();            // joins the workers that ended idle (mutex_ held)
  bool opens_are_slow() const;  // see "the opens are slow" above (mutex_ held)
  // How long an ask may take before the file is asked for again: shorter when a fetch waits for
  // it (`wanted`) (mutex_ held).
  std::chrono::steady_clock::duration hedge_delay(bool wanted) const;
  // Whether `entry`'s open is due another ask: its latest ask under way `delay` or longer (a
  // hedge_delay()), fewer than max_asks asks (mutex_ held).
  bool due_another_ask(const Entry& entry, std::chrono::steady_clock::time_point now,
                       std::chrono::steady_clock::duration delay) const;
  // Marks the start of an ask of `entry` (mutex_ held).
  void note_ask(Entry& entry);
  // Has a worker ask for `row`'s file again (mutex_ held).
  void ask_again(std::int64_t row, Entry& entry);
  std::int64_t next_row();                            // the plan's next row, or -1 (mutex_ held)
  void open_one(std::unique_lock<std::mutex>& lock);  // the plan's next row
  // Opens `row` (its entry made): the first open, or a hedge of one under way (mutex_ held).
  void open_row(std::unique_lock<std::mutex>& lock, std::int64_t row, bool hedge);
  void read_one(std::unique_lock<std::mutex>& lock);

  const Opener opener_;
  const RangeOf range_of_;
  const FileReadAheadOptions options_;
  const std::int64_t max_open_files_;
  mutable std::mutex mutex_;
  std::condition_variable work_;   // workers: something to do, or stopping
  std::condition_variable ready_;  // fetches: an entry became ready
  FileReadAheadPlan plan_;
  std::size_t batch_ = 0;  // the plan's cursor: batch, then row in it
  std::size_t in_batch_ = 0;
  std::int64_t position_ = 0;                        // rows the cursor passed
  std::unordered_map<std::int64_t, Entry> entries_;  // opening or prepared, not yet taken
  std::map<std::int64_t, std::int64_t> to_read_;     // opened, not read: position -> row
  std::unordered_set<std::int64_t> reached_early_;   // taken before the cursor got there
  std::int64_t opening_ = 0;
  std::uint64_t reading_bytes_ = 0;
  std::int64_t reading_ = 0;
  ByteBudget ahead_;              // bytes read ahead of the fetches (options_.max_ahead_bytes)
  std::uint64_t generation_ = 0;  // bumped by clear(): work under way is then dropped
  int idle_ = 0;
  std::array<std::chrono::steady_clock::duration, 32> open_times_{};  // the latest opens' times
  std::size_t opens_timed_ = 0;
  std::condition_variable paced_;  // the pacer: work, a call started, or stopping
  bool pacer_idle_ = false;        // the pacer waits without a deadline (wake it)
  std::deque<std::pair<std::chrono::steady_clock::time_point, std::int64_t>> opens_started_;
  std::deque<std::int64_t> to_hedge_;  // opens to ask for again, by a worker
  // Opens under way, by the batch they are for: those of the batches the fetches have reached (up
  // to wanted_batches_, exclusive) are hedged as a waiting fetch's are (their batch is being
  // put together now).
  std::set<std::pair<std::size_t, std::int64_t>> opening_by_batch_;
  std::size_t wanted_batches_ = 0;
  bool slow_opens_ = false;  // opens_are_slow() as of the latest open
  bool stopping_ = false;
  std::atomic<bool> stop_reads_{false};  // read without the lock by reads under way
  FileReadAheadStats stats_;
  std::vector<std::thread> threads_;    // started, not yet joined
  std::vector<std::thread::id> ended_;  // of them, those that ended idle (the pacer joins)
  std::thread pacer_;
};

// The default for max_open_files (see FileReadAheadOptions).
std::int64_t default_max_open_files();

// Reads the file of `mapping` (opened with keep_descriptor) into the page cache through its
// descriptor, sequentially, unless its first and last pages are cached already: what a fetch does
// with a file it is about to copy that was not read ahead (the copy's preads of 512 KiB slices
// would each wait for the file system on their own).
void read_before_copy(const MappedFile& mapping);

}  // namespace draftfeed
