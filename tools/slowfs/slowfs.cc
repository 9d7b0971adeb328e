// slowfs: a FUSE pass-through over a real folder that answers like a network file system: every
// open, name lookup, attribute read, directory listing and first read of an open file is answered
// late, by a latency drawn from a distribution (lognormal around a median, plus a heavy tail), and
// reads may share a bandwidth cap. For tests and benchmarks of caches on NFS, Lustre, CephFS or
// object-store mounts, where each of those operations is a round trip to a server.
//
//   slowfs SOURCE MOUNTPOINT [--latency-ms M] [--open-ms M] [--lookup-ms M] [--readdir-ms M]
//          [--read-ms M] [--missing-lookup-ms M] [--every-read] [--sigma S] [--tail P:LO:HI]
//          [--tail-ops open,lookup,...]
//          [--slow NAME:SECONDS]... [--bandwidth-mbps B] [--entry-timeout S] [--attr-timeout S]
//          [--negative-timeout S] [--seed N] [--threads N] [--max-background N] [--stats FILE]
//
// Why replies are late rather than handlers slow: the operation itself runs at once on the local
// folder, and its reply is queued with a due time; one thread sends replies when they fall due. So
// any number of requests may wait at once (as at a server, where waiting costs nothing), without a
// thread per request; the latency a reader sees does not depend on how many others wait.
//
// Lookups. The kernel sends the lookups of one folder to a FUSE file system one at a time (even
// with FUSE_PARALLEL_DIROPS, on Linux 6.18: measured), so a lookup answered late would make every
// reader of the folder queue behind it; no network file system does that (NFS looks names up in
// parallel). So slowfs answers a lookup at once and emulates the client's cache itself: a file
// found whose attributes the client does not know (none fetched within --attr-timeout seconds)
// owes one lookup round trip, which its next attribute read (stat) or open pays; a stat within
// --attr-timeout of the last round trip is free, as NFS serves it from its attribute cache (3 s
// by default). Opens are always a round trip (NFS's close-to-open check), and bring the
// attributes. A lookup of a name that does not exist (a lock file that is not there) waits
// --missing-lookup-ms (0 by default: NFS answers repeated ones from its cache of negative
// lookups; above 0 such lookups queue per folder, as said). Names stay in the kernel's cache for
// --entry-timeout seconds, missing ones only with --negative-timeout > 0.
// File data stays in the kernel's page cache across opens (FOPEN_KEEP_CACHE): a warm epoch reads
// no data from slowfs, but still opens. flock() is handled by the kernel, locally to this mount.
//
// --latency-ms M sets the median of every class (lookup, open, readdir, read); the others set one.
// Stats: SIGUSR1 writes the counters (per operation: calls, injected seconds; bytes read; replies
// waiting now and at most, whether the tail is on) as JSON to --stats, atomically; SIGUSR2 resets
// them; SIGRTMIN turns the tail off and SIGRTMIN+1 back on (then writes the stats): a benchmark
// compares warm epochs with and without the tail on one client, its pages and its cached names the
// same, instead of across two mounts whose epochs differ by more than the tail costs. Lifetime: the
// process dies with its parent (PR_SET_PDEATHSIG) and unmounts on SIGTERM, SIGINT or SIGHUP; the
// mount's source is named `slowfs-<pid>`, so that a mount left by a killed slowfs can be found and
// lazily unmounted (tools/slowfs_process.py does, at start). Prints "ready" once mounted.
#define FUSE_USE_VERSION 312

#include <dirent.h>
#include <fcntl.h>
#include <fuse3/fuse_lowlevel.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <queue>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

// ---------------------------------------------------------------- what is delayed, and by how much
enum class OpClass : int { kLookup, kOpen, kReaddir, kRead, kCount };
constexpr std::array<const char*, 4> kClassNames = {"lookup", "open", "readdir", "read"};

struct Options {
  std::string source;
  std::string mountpoint;
  std::array<double, 4> median_ms{0, 0, 0, 0};
  bool every_read = false;  // latency on every read, not only a handle's first
  double sigma = 0.5;       // lognormal spread around the median
  double tail_probability = 0;
  double tail_low = 0, tail_high = 0;  // seconds
  std::array<bool, 4> tail_on{false, true, false, false};
  std::map<std::string, double> slow_names;  // basename -> seconds for its opens
  double missing_lookup_ms = 0;              // lookups of names that do not exist
  double bandwidth = 0;                      // bytes per second; 0: none
  double entry_timeout = 1.0, attr_timeout = 1.0, negative_timeout = 0.0;
  std::uint64_t seed = 1;
  int threads = 8;
  int max_background = 1024;
  std::string stats_path;
};

class LatencyModel {
 public:
  explicit LatencyModel(const Options& options) : options_(options), random_(options.seed) {}

  // Whether --tail applies (SIGRTMIN turns it off, SIGRTMIN+1 on).
  void set_tail(bool on) { tail_enabled_ = on; }
  bool tail_enabled() const { return tail_enabled_; }

  // Seconds a lookup of a name that does not exist waits (--missing-lookup-ms, no tail).
  double missing_lookup() {
    const double median = options_.missing_lookup_ms / 1000.0;
    if (median <= 0) return 0;
    std::lock_guard lock(mutex_);
    return median * std::exp(options_.sigma * normal_(random_));
  }

  // Seconds to wait before answering an operation of class `op` (on a file named `name`).
  double draw(OpClass op, const std::string& name = {}) {
    const auto c = static_cast<std::size_t>(op);
    if (op == OpClass::kOpen && !name.empty()) {
      const auto slow = options_.slow_names.find(name);
      if (slow != options_.slow_names.end()) return slow->second;
    }
    std::lock_guard lock(mutex_);
    if (options_.tail_on[c] && options_.tail_probability > 0 && tail_enabled_ &&
        uniform_(random_) < options_.tail_probability) {
      return options_.tail_low + (options_.tail_high - options_.tail_low) * uniform_(random_);
    }
    const double median = options_.median_ms[c] / 1000.0;
    if (median <= 0) return 0;
    return median * std::exp(options_.sigma * normal_(random_));
  }

 private:
  const Options& options_;
  std::mutex mutex_;
  std::mt19937_64 random_;
  std::uniform_real_distribution<double> uniform_{0.0, 1.0};
  std::normal_distribution<double> normal_{0.0, 1.0};
  std::atomic<bool> tail_enabled_{true};
};

// ---------------------------------------------------------------- counters
struct Stats {
  std::mutex mutex;
  std::map<std::string, std::uint64_t> calls;
  std::map<std::string, double> delayed_seconds;
  std::uint64_t read_bytes = 0;
  std::uint64_t tails = 0;
  std::int64_t waiting = 0;
  std::int64_t max_waiting = 0;

  void count(const char* op, double delay) {
    std::lock_guard lock(mutex);
    ++calls[op];
    delayed_seconds[op] += delay;
  }
  void reset() {
    std::lock_guard lock(mutex);
    calls.clear();
    delayed_seconds.clear();
    read_bytes = 0;
    tails = 0;
    max_waiting = waiting;
  }
  std::string json() {
    std::lock_guard lock(mutex);
    std::string out = "{\"calls\": {";
    bool first = true;
    for (const auto& [op, n] : calls) {
      out += (first ? "\"" : ", \"") + op + "\": " + std::to_string(n);
      first = false;
    }
    out += "}, \"delayed_seconds\": {";
    first = true;
    for (const auto& [op, s] : delayed_seconds) {
      out += (first ? "\"" : ", \"") + op + "\": " + std::to_string(s);
      first = false;
    }
    out += "}, \"read_bytes\": " + std::to_string(read_bytes) +
           ", \"waiting\": " + std::to_string(waiting) +
           ", \"max_waiting\": " + std::to_string(max_waiting) + "}";
    return out;
  }
};

// ---------------------------------------------------------------- replies that fall due later
class ReplyQueue {
 public:
  explicit ReplyQueue(Stats& stats) : stats_(stats), thread_([this] { run(); }) {}
  ~ReplyQueue() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    changed_.notify_all();
    thread_.join();
  }
  ReplyQueue(const ReplyQueue&) = delete;
  ReplyQueue& operator=(const ReplyQueue&) = delete;

  // Runs `reply` at `due` (at once if that has passed).
  void at(Clock::time_point due, std::function<void()> reply) {
    if (due <= Clock::now()) {
      reply();
      return;
    }
    {
      std::lock_guard lock(mutex_);
      queue_.push(Item{due, sequence_++, std::move(reply)});
    }
    {
      std::lock_guard lock(stats_.mutex);
      stats_.max_waiting = std::max(stats_.max_waiting, ++stats_.waiting);
    }
    changed_.notify_one();
  }

 private:
  struct Item {
    Clock::time_point due;
    std::uint64_t sequence;
    std::function<void()> reply;
    bool operator>(const Item& other) const {
      return due != other.due ? due > other.due : sequence > other.sequence;
    }
  };

  void run() {
    std::unique_lock lock(mutex_);
    while (!stopping_) {
      if (queue_.empty()) {
        changed_.wait(lock);
        continue;
      }
      const Clock::time_point due = queue_.top().due;
      if (Clock::now() < due) {
        changed_.wait_until(lock, due);
        continue;
      }
      std::function<void()> reply = std::move(const_cast<Item&>(queue_.top()).reply);
      queue_.pop();
      lock.unlock();
      reply();
      {
        std::lock_guard stats_lock(stats_.mutex);
        --stats_.waiting;
      }
      lock.lock();
    }
  }

  Stats& stats_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::priority_queue<Item, std::vector<Item>, std::greater<>> queue_;
  std::uint64_t sequence_ = 0;
  bool stopping_ = false;
  std::thread thread_;
};

// ---------------------------------------------------------------- inodes: an O_PATH fd each
struct Inode {
  int fd = -1;
  dev_t device = 0;
  ino_t inode = 0;
  std::uint64_t lookups = 0;
  std::string name;  // the last name it was looked up by (for --slow)
  // The emulated client's cache (see "Lookups" at the top): the round trip a lookup answered at
  // once still owes, and until when the attributes count as known to the client.
  double owed = 0;
  Clock::time_point valid_until{};
};

struct OpenFile {
  int fd = -1;
  std::atomic<bool> read_once{false};
};

class SlowFs {
 public:
  explicit SlowFs(Options options)
      : options_(std::move(options)), latency_(options_), replies_(stats_) {
    root_.fd = ::open(options_.source.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (root_.fd < 0) {
      std::fprintf(stderr, "slowfs: cannot open %s: %s\n", options_.source.c_str(),
                   std::strerror(errno));
      std::exit(2);
    }
    struct stat st {};
    ::fstat(root_.fd, &st);
    root_.device = st.st_dev;
    root_.inode = st.st_ino;
    root_.lookups = 2;
  }

  const Options& options() const { return options_; }
  Stats& stats() { return stats_; }

  // A reply that falls due `delay` seconds from now, counted under `op` (unless null).
  void later(const char* op, double delay, std::function<void()> reply) {
    if (op != nullptr) stats_.count(op, delay);
    replies_.at(Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                   std::chrono::duration<double>(delay)),
                std::move(reply));
  }

  // When a read of `bytes` may be answered: after its latency, and after the bytes have passed
  // through a pipe of the capped bandwidth shared by every read.
  Clock::time_point read_due(double latency, std::size_t bytes) {
    const Clock::time_point now = Clock::now();
    Clock::time_point due =
        now + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(latency));
    if (options_.bandwidth > 0) {
      std::lock_guard lock(pipe_mutex_);
      const auto transfer = std::chrono::duration_cast<Clock::duration>(
          std::chrono::duration<double>(static_cast<double>(bytes) / options_.bandwidth));
      pipe_free_ = std::max(pipe_free_, now) + transfer;
      due = std::max(due, pipe_free_);
    }
    return due;
  }

  Inode& inode(fuse_ino_t ino) {
    if (ino == FUSE_ROOT_ID) return root_;
    return *reinterpret_cast<Inode*>(ino);
  }

  // Finds or adds the inode of `fd`'s file (taking `fd`, or closing it when known), one more
  // lookup counted. Returns its number.
  fuse_ino_t remember(int fd, const struct stat& st, const std::string& name) {
    std::lock_guard lock(inodes_mutex_);
    if (st.st_dev == root_.device && st.st_ino == root_.inode) {
      ::close(fd);
      ++root_.lookups;
      return FUSE_ROOT_ID;
    }
    auto& slot = inodes_[{st.st_dev, st.st_ino}];
    if (slot) {
      ::close(fd);
    } else {
      slot = std::make_unique<Inode>();
      slot->fd = fd;
      slot->device = st.st_dev;
      slot->inode = st.st_ino;
    }
    ++slot->lookups;
    slot->name = name;
    return reinterpret_cast<fuse_ino_t>(slot.get());
  }

  void forget(fuse_ino_t ino, std::uint64_t n) {
    if (ino == FUSE_ROOT_ID) return;
    std::lock_guard lock(inodes_mutex_);
    Inode& node = inode(ino);
    node.lookups -= std::min(node.lookups, n);
    if (node.lookups == 0) {
      ::close(node.fd);
      inodes_.erase({node.device, node.inode});
    }
  }

  std::string name_of(fuse_ino_t ino) {
    std::lock_guard lock(inodes_mutex_);
    return inode(ino).name;
  }

  // A lookup that found `ino` (answered at once): unless the client knows its attributes still,
  // it owes one lookup round trip, paid by the file's next getattr or open.
  void looked_up(fuse_ino_t ino) {
    const double owed = latency_.draw(OpClass::kLookup);
    std::lock_guard lock(inodes_mutex_);
    Inode& node = inode(ino);
    if (Clock::now() >= node.valid_until && node.owed == 0) node.owed = owed;
  }

  // The delay of a request on `ino` that validates its attributes: what the client's cache makes
  // free is free; otherwise `own` (the request's round trip, or none) plus what a lookup owes.
  // Returns {delay, of which the lookup's}. The attributes then count as known until the reply
  // plus the attribute timeout.
  // `own_or_lookup`: the owed lookup replaces the request's own round trip (NFS's LOOKUP brings
  // the attributes with it) instead of adding to it.
  std::pair<double, double> validate(fuse_ino_t ino, double own, bool always, bool own_or_lookup) {
    std::lock_guard lock(inodes_mutex_);
    Inode& node = inode(ino);
    const Clock::time_point now = Clock::now();
    if (!always && now < node.valid_until) return {0.0, 0.0};
    const double lookup = node.owed;
    const double delay = own_or_lookup && lookup > 0 ? lookup : own + lookup;
    node.owed = 0;
    node.valid_until = now + std::chrono::duration_cast<Clock::duration>(
                                 std::chrono::duration<double>(delay + options_.attr_timeout));
    return {delay, lookup};
  }

  LatencyModel& latency() { return latency_; }

 private:
  Options options_;
  Stats stats_;
  LatencyModel latency_;
  ReplyQueue replies_;
  Inode root_;
  std::mutex inodes_mutex_;
  std::map<std::pair<dev_t, ino_t>, std::unique_ptr<Inode>> inodes_;
  std::mutex pipe_mutex_;
  Clock::time_point pipe_free_{};
};

SlowFs* g_fs = nullptr;

std::string proc_path(int fd) { return "/proc/self/fd/" + std::to_string(fd); }

double draw(OpClass op, const std::string& name = {}) { return g_fs->latency().draw(op, name); }

// Looks `name` up in `parent`: the entry to reply with, or an errno.
int make_entry(fuse_ino_t parent, const char* name, fuse_entry_param* entry) {
  std::memset(entry, 0, sizeof(*entry));
  const int fd = ::openat(g_fs->inode(parent).fd, name, O_PATH | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return errno;
  if (::fstatat(fd, "", &entry->attr, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) != 0) {
    const int err = errno;
    ::close(fd);
    return err;
  }
  entry->ino = g_fs->remember(fd, entry->attr, name);
  entry->attr_timeout = g_fs->options().attr_timeout;
  entry->entry_timeout = g_fs->options().entry_timeout;
  return 0;
}

void reply_entry_later(fuse_req_t req, const char* op, double delay, int err,
                       const fuse_entry_param& entry) {
  g_fs->later(op, delay, [req, err, entry] {
    if (err != 0) {
      fuse_reply_err(req, err);
    } else {
      fuse_reply_entry(req, &entry);
    }
  });
}

void reply_err_later(fuse_req_t req, const char* op, double delay, int err) {
  g_fs->later(op, delay, [req, err] { fuse_reply_err(req, err); });
}

// ---------------------------------------------------------------- the operations
void op_init(void* /*userdata*/, fuse_conn_info* conn) {
  // Many reads in flight at once, as a network file system's client keeps (the kernel's default
  // of 12 background requests would be the bottleneck, not the latency being modelled).
  conn->max_background = static_cast<unsigned>(g_fs->options().max_background);
  conn->congestion_threshold = conn->max_background * 3 / 4;
  // Lookups in one folder run in parallel (else the kernel holds the folder's lock through each
  // round trip, and a network file system's lookups would queue behind one another).
  if (conn->capable & FUSE_CAP_PARALLEL_DIROPS) conn->want |= FUSE_CAP_PARALLEL_DIROPS;
  conn->want &= ~FUSE_CAP_FLOCK_LOCKS;  // flock stays in the kernel
  conn->want &= ~FUSE_CAP_POSIX_LOCKS;
}

void op_lookup(fuse_req_t req, fuse_ino_t parent, const char* name) {
  // Answered at once (see "Lookups" at the top): a found file owes the round trip to its next
  // getattr or open; a missing name costs --missing-lookup-ms (0 by default).
  fuse_entry_param entry{};
  const int err = make_entry(parent, name, &entry);
  g_fs->stats().count("lookup", 0);
  if (err == 0) {
    entry.attr_timeout = 0;  // the kernel asks for attributes; the emulated client answers
    g_fs->looked_up(entry.ino);
    fuse_reply_entry(req, &entry);
    return;
  }
  const double delay =
      err == ENOENT ? g_fs->latency().missing_lookup() : g_fs->latency().draw(OpClass::kLookup);
  if (err == ENOENT && g_fs->options().negative_timeout > 0) {
    std::memset(&entry, 0, sizeof(entry));
    entry.entry_timeout = g_fs->options().negative_timeout;  // ino 0: a cached "no such name"
    reply_entry_later(req, "missing_lookup", delay, 0, entry);
    return;
  }
  reply_entry_later(req, "missing_lookup", delay, err, entry);
}

void op_forget(fuse_req_t req, fuse_ino_t ino, std::uint64_t nlookup) {
  g_fs->forget(ino, nlookup);
  fuse_reply_none(req);
}

void op_forget_multi(fuse_req_t req, std::size_t count, fuse_forget_data* forgets) {
  for (std::size_t i = 0; i < count; ++i) g_fs->forget(forgets[i].ino, forgets[i].nlookup);
  fuse_reply_none(req);
}

void op_getattr(fuse_req_t req, fuse_ino_t ino, fuse_file_info* /*fi*/) {
  struct stat st {};
  const int err =
      ::fstatat(g_fs->inode(ino).fd, "", &st, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) == 0 ? 0 : errno;
  // Free while the client knows the attributes; else one round trip (the owed lookup's, if any:
  // NFS's LOOKUP brings the attributes with it).
  const auto [delay, lookup] = g_fs->validate(ino, draw(OpClass::kLookup), false, true);
  if (lookup > 0) g_fs->stats().count("lookup_paid", lookup);
  const double timeout = 0;  // the kernel asks again; the emulated client decides
  g_fs->later("getattr", delay, [req, err, st, timeout] {
    if (err != 0) {
      fuse_reply_err(req, err);
    } else {
      fuse_reply_attr(req, &st, timeout);
    }
  });
}

void op_setattr(fuse_req_t req, fuse_ino_t ino, struct stat* attr, int to_set, fuse_file_info* fi) {
  const std::string path = proc_path(g_fs->inode(ino).fd);
  int err = 0;
  if ((to_set & FUSE_SET_ATTR_MODE) && ::chmod(path.c_str(), attr->st_mode) != 0) err = errno;
  if (err == 0 && (to_set & FUSE_SET_ATTR_SIZE)) {
    const int result = fi != nullptr ? ::ftruncate(static_cast<int>(fi->fh), attr->st_size)
                                     : ::truncate(path.c_str(), attr->st_size);
    if (result != 0) err = errno;
  }
  if (err == 0 && (to_set & (FUSE_SET_ATTR_ATIME | FUSE_SET_ATTR_MTIME))) {
    struct timespec times[2] = {{0, UTIME_OMIT}, {0, UTIME_OMIT}};
    if (to_set & FUSE_SET_ATTR_ATIME) times[0] = attr->st_atim;
    if (to_set & FUSE_SET_ATTR_ATIME_NOW) times[0].tv_nsec = UTIME_NOW;
    if (to_set & FUSE_SET_ATTR_MTIME) times[1] = attr->st_mtim;
    if (to_set & FUSE_SET_ATTR_MTIME_NOW) times[1].tv_nsec = UTIME_NOW;
    if (::utimensat(AT_FDCWD, path.c_str(), times, 0) != 0) err = errno;
  }
  struct stat st {};
  if (err == 0 && ::fstatat(g_fs->inode(ino).fd, "", &st, AT_EMPTY_PATH) != 0) err = errno;
  const double timeout = g_fs->options().attr_timeout;
  g_fs->later("setattr", draw(OpClass::kLookup), [req, err, st, timeout] {
    if (err != 0) {
      fuse_reply_err(req, err);
    } else {
      fuse_reply_attr(req, &st, timeout);
    }
  });
}

void op_readlink(fuse_req_t req, fuse_ino_t ino) {
  char target[PATH_MAX + 1];
  const ssize_t n = ::readlinkat(g_fs->inode(ino).fd, "", target, PATH_MAX);
  const int err = n < 0 ? errno : 0;
  const std::string text = n < 0 ? std::string() : std::string(target, static_cast<std::size_t>(n));
  g_fs->later("readlink", draw(OpClass::kLookup), [req, err, text] {
    if (err != 0) {
      fuse_reply_err(req, err);
    } else {
      fuse_reply_readlink(req, text.c_str());
    }
  });
}

void op_mkdir(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode) {
  fuse_entry_param entry{};
  int err = ::mkdirat(g_fs->inode(parent).fd, name, mode) == 0 ? 0 : errno;
  if (err == 0) err = make_entry(parent, name, &entry);
  reply_entry_later(req, "mkdir", draw(OpClass::kLookup), err, entry);
}

void op_unlink(fuse_req_t req, fuse_ino_t parent, const char* name) {
  const int err = ::unlinkat(g_fs->inode(parent).fd, name, 0) == 0 ? 0 : errno;
  reply_err_later(req, "unlink", draw(OpClass::kLookup), err);
}

void op_rmdir(fuse_req_t req, fuse_ino_t parent, const char* name) {
  const int err = ::unlinkat(g_fs->inode(parent).fd, name, AT_REMOVEDIR) == 0 ? 0 : errno;
  reply_err_later(req, "rmdir", draw(OpClass::kLookup), err);
}

void op_rename(fuse_req_t req, fuse_ino_t parent, const char* name, fuse_ino_t new_parent,
               const char* new_name, unsigned int flags) {
  const int err =
      ::renameat2(g_fs->inode(parent).fd, name, g_fs->inode(new_parent).fd, new_name, flags) == 0
          ? 0
          : errno;
  reply_err_later(req, "rename", draw(OpClass::kLookup), err);
}

void finish_open(fuse_req_t req, const char* op, int fd, int err, const fuse_entry_param* entry,
                 fuse_file_info fi, double delay) {
  if (err == 0) {
    auto* file = new OpenFile;
    file->fd = fd;
    fi.fh = reinterpret_cast<std::uint64_t>(file);
    fi.keep_cache = 1;  // the page cache outlives the open (a warm epoch reads no data)
  }
  const bool created = entry != nullptr;
  const fuse_entry_param e = created ? *entry : fuse_entry_param{};
  g_fs->later(op, delay, [req, err, fi, e, created] {
    if (err != 0) {
      fuse_reply_err(req, err);
    } else if (created) {
      fuse_reply_create(req, &e, &fi);
    } else {
      fuse_reply_open(req, &fi);
    }
  });
}

void op_open(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  const int fd = ::open(proc_path(g_fs->inode(ino).fd).c_str(),
                        (fi->flags & ~O_NOFOLLOW & ~O_CREAT) | O_CLOEXEC);
  const int err = fd < 0 ? errno : 0;
  // Always a round trip (close-to-open), plus a lookup's still owed; the reply brings the
  // attributes (a fstat right after it is free).
  const auto [delay, lookup] =
      g_fs->validate(ino, draw(OpClass::kOpen, g_fs->name_of(ino)), true, false);
  if (lookup > 0) g_fs->stats().count("lookup_paid", lookup);
  g_fs->stats().count("open", delay - lookup);
  finish_open(req, nullptr, fd, err, nullptr, *fi, delay);  // counted above
}

void op_create(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode,
               fuse_file_info* fi) {
  const int fd = ::openat(g_fs->inode(parent).fd, name, (fi->flags | O_CREAT) & ~O_NOFOLLOW, mode);
  int err = fd < 0 ? errno : 0;
  fuse_entry_param entry{};
  if (err == 0) err = make_entry(parent, name, &entry);
  finish_open(req, "create", fd, err, &entry, *fi, draw(OpClass::kOpen, name));
}

void op_read(fuse_req_t req, fuse_ino_t /*ino*/, std::size_t size, off_t offset,
             fuse_file_info* fi) {
  auto* file = reinterpret_cast<OpenFile*>(fi->fh);
  auto buffer = std::make_shared<std::vector<char>>(size);
  const ssize_t n = ::pread(file->fd, buffer->data(), size, offset);
  const int err = n < 0 ? errno : 0;
  const std::size_t got = n < 0 ? 0 : static_cast<std::size_t>(n);
  const bool first = !file->read_once.exchange(true);
  const double latency = (first || g_fs->options().every_read) ? draw(OpClass::kRead) : 0.0;
  {
    std::lock_guard lock(g_fs->stats().mutex);
    g_fs->stats().read_bytes += got;
  }
  const Clock::time_point due = g_fs->read_due(latency, got);
  g_fs->stats().count("read", latency);
  // The reply falls due after the latency and the bandwidth's share (counted above).
  const double delay = std::chrono::duration<double>(due - Clock::now()).count();
  g_fs->later(nullptr, std::max(0.0, delay), [req, err, buffer, got] {
    if (err != 0) {
      fuse_reply_err(req, err);
    } else {
      fuse_reply_buf(req, buffer->data(), got);
    }
  });
}

void op_write(fuse_req_t req, fuse_ino_t /*ino*/, const char* data, std::size_t size, off_t offset,
              fuse_file_info* fi) {
  auto* file = reinterpret_cast<OpenFile*>(fi->fh);
  const ssize_t n = ::pwrite(file->fd, data, size, offset);
  if (n < 0) {
    fuse_reply_err(req, errno);
  } else {
    fuse_reply_write(req, static_cast<std::size_t>(n));
  }
}

void op_flush(fuse_req_t req, fuse_ino_t /*ino*/, fuse_file_info* /*fi*/) {
  fuse_reply_err(req, 0);
}

void op_release(fuse_req_t req, fuse_ino_t /*ino*/, fuse_file_info* fi) {
  auto* file = reinterpret_cast<OpenFile*>(fi->fh);
  ::close(file->fd);
  delete file;
  fuse_reply_err(req, 0);
}

void op_fsync(fuse_req_t req, fuse_ino_t /*ino*/, int datasync, fuse_file_info* fi) {
  auto* file = reinterpret_cast<OpenFile*>(fi->fh);
  const int result = datasync ? ::fdatasync(file->fd) : ::fsync(file->fd);
  fuse_reply_err(req, result == 0 ? 0 : errno);
}

struct OpenDir {
  DIR* dir = nullptr;
  off_t offset = 0;
  dirent* entry = nullptr;  // read but not yet sent
};

void op_opendir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  const int fd = ::openat(g_fs->inode(ino).fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  DIR* dir = fd < 0 ? nullptr : ::fdopendir(fd);
  const int err = dir == nullptr ? errno : 0;
  if (dir == nullptr && fd >= 0) ::close(fd);
  fuse_file_info info = *fi;
  if (dir != nullptr) info.fh = reinterpret_cast<std::uint64_t>(new OpenDir{dir, 0, nullptr});
  g_fs->later("opendir", draw(OpClass::kOpen), [req, err, info] {
    if (err != 0) {
      fuse_reply_err(req, err);
    } else {
      fuse_reply_open(req, &info);
    }
  });
}

void op_readdir(fuse_req_t req, fuse_ino_t /*ino*/, std::size_t size, off_t offset,
                fuse_file_info* fi) {
  auto* d = reinterpret_cast<OpenDir*>(fi->fh);
  if (offset != d->offset) {
    ::seekdir(d->dir, offset);
    d->entry = nullptr;
    d->offset = offset;
  }
  auto buffer = std::make_shared<std::vector<char>>(size);
  std::size_t used = 0;
  while (true) {
    if (d->entry == nullptr) {
      errno = 0;
      d->entry = ::readdir(d->dir);
      if (d->entry == nullptr) break;
    }
    struct stat st {};
    st.st_ino = d->entry->d_ino;
    st.st_mode = static_cast<mode_t>(d->entry->d_type) << 12;
    const off_t next = d->entry->d_off;
    const std::size_t need =
        fuse_add_direntry(req, buffer->data() + used, size - used, d->entry->d_name, &st, next);
    if (need > size - used) break;  // sent with the next call
    used += need;
    d->entry = nullptr;
    d->offset = next;
  }
  g_fs->later("readdir", draw(OpClass::kReaddir),
              [req, buffer, used] { fuse_reply_buf(req, buffer->data(), used); });
}

void op_releasedir(fuse_req_t req, fuse_ino_t /*ino*/, fuse_file_info* fi) {
  auto* d = reinterpret_cast<OpenDir*>(fi->fh);
  ::closedir(d->dir);
  delete d;
  fuse_reply_err(req, 0);
}

void op_statfs(fuse_req_t req, fuse_ino_t ino) {
  struct statvfs st {};
  if (::fstatvfs(g_fs->inode(ino).fd, &st) != 0) {
    fuse_reply_err(req, errno);
  } else {
    fuse_reply_statfs(req, &st);
  }
}

// ---------------------------------------------------------------- the command line
[[noreturn]] void usage(const char* why) {
  std::fprintf(
      stderr,
      "slowfs: %s\nusage: slowfs SOURCE MOUNTPOINT [--latency-ms M] [--open-ms M] "
      "[--lookup-ms M] [--missing-lookup-ms M] [--readdir-ms M] [--read-ms M] [--every-read] "
      "[--sigma S] "
      "[--tail P:LO:HI] [--tail-ops open,lookup,readdir,read] [--slow NAME:SECONDS] "
      "[--bandwidth-mbps B] [--entry-timeout S] [--attr-timeout S] "
      "[--negative-timeout S] [--seed N] [--threads N] [--max-background N] "
      "[--stats FILE]\n",
      why);
  std::exit(2);
}

double number(const std::string& text, const std::string& flag) {
  try {
    std::size_t used = 0;
    const double value = std::stod(text, &used);
    if (used == text.size() && value >= 0 && std::isfinite(value)) return value;
  } catch (const std::exception&) {
  }
  usage((flag + " needs a non-negative number, got '" + text + "'").c_str());
}

Options parse(int argc, char** argv) {
  Options o;
  std::vector<std::string> positional;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage((arg + " needs a value").c_str());
      return argv[++i];
    };
    auto set_class = [&](OpClass c) {
      o.median_ms[static_cast<std::size_t>(c)] = number(value(), arg);
    };
    if (arg == "--latency-ms") {
      const double m = number(value(), arg);
      o.median_ms = {m, m, m, m};
    } else if (arg == "--lookup-ms") {
      set_class(OpClass::kLookup);
    } else if (arg == "--open-ms") {
      set_class(OpClass::kOpen);
    } else if (arg == "--readdir-ms") {
      set_class(OpClass::kReaddir);
    } else if (arg == "--read-ms") {
      set_class(OpClass::kRead);
    } else if (arg == "--missing-lookup-ms") {
      o.missing_lookup_ms = number(value(), arg);
    } else if (arg == "--every-read") {
      o.every_read = true;
    } else if (arg == "--sigma") {
      o.sigma = number(value(), arg);
    } else if (arg == "--tail") {
      const std::string spec = value();
      const auto a = spec.find(':');
      const auto b = spec.find(':', a == std::string::npos ? a : a + 1);
      if (a == std::string::npos || b == std::string::npos) usage("--tail is P:LOW:HIGH");
      o.tail_probability = number(spec.substr(0, a), arg);
      o.tail_low = number(spec.substr(a + 1, b - a - 1), arg);
      o.tail_high = number(spec.substr(b + 1), arg);
      if (o.tail_probability > 1 || o.tail_high < o.tail_low) usage("--tail: P <= 1, LOW <= HIGH");
    } else if (arg == "--tail-ops") {
      o.tail_on = {false, false, false, false};
      std::string list = value() + ",";
      for (std::size_t start = 0, comma; (comma = list.find(',', start)) != std::string::npos;
           start = comma + 1) {
        const std::string name = list.substr(start, comma - start);
        const auto it = std::find(kClassNames.begin(), kClassNames.end(), name);
        if (it == kClassNames.end()) usage(("--tail-ops: unknown operation " + name).c_str());
        o.tail_on[static_cast<std::size_t>(it - kClassNames.begin())] = true;
      }
    } else if (arg == "--slow") {
      const std::string spec = value();
      const auto colon = spec.rfind(':');
      if (colon == std::string::npos || colon == 0) usage("--slow is NAME:SECONDS");
      o.slow_names[spec.substr(0, colon)] = number(spec.substr(colon + 1), arg);
    } else if (arg == "--bandwidth-mbps") {
      o.bandwidth = number(value(), arg) * 1e6;
    } else if (arg == "--entry-timeout") {
      o.entry_timeout = number(value(), arg);
    } else if (arg == "--attr-timeout") {
      o.attr_timeout = number(value(), arg);
    } else if (arg == "--negative-timeout") {
      o.negative_timeout = number(value(), arg);
    } else if (arg == "--seed") {
      o.seed = static_cast<std::uint64_t>(number(value(), arg));
    } else if (arg == "--threads") {
      o.threads = std::max(1, static_cast<int>(number(value(), arg)));
    } else if (arg == "--max-background") {
      o.max_background = std::max(1, static_cast<int>(number(value(), arg)));
    } else if (arg == "--stats") {
      o.stats_path = value();
    } else if (!arg.empty() && arg[0] == '-') {
      usage(("unknown option " + arg).c_str());
    } else {
      positional.push_back(arg);
    }
  }
  if (positional.size() != 2) usage("needs SOURCE and MOUNTPOINT");
  o.source = positional[0];
  o.mountpoint = positional[1];
  return o;
}

void write_stats(const std::string& path) {
  if (path.empty()) return;
  const std::string temp = path + ".tmp";
  FILE* out = std::fopen(temp.c_str(), "w");
  if (out == nullptr) return;
  std::string text = g_fs->stats().json();
  text.pop_back();  // its closing brace: the tail's switch joins the counters
  text += std::string(", \"tail\": ") + (g_fs->latency().tail_enabled() ? "true" : "false") + "}\n";
  std::fwrite(text.data(), 1, text.size(), out);
  std::fclose(out);
  std::rename(temp.c_str(), path.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  // Die with the process that started us (a test killed mid-run): SIGTERM, which unmounts.
  const pid_t parent = ::getppid();
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (::getppid() != parent) return 1;  // it died before the line above
  Options options = parse(argc, argv);

  // An O_PATH descriptor per file the kernel knows: raise the limit as far as allowed.
  rlimit files{};
  if (::getrlimit(RLIMIT_NOFILE, &files) == 0) {
    files.rlim_cur = files.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &files);
  }
  // SIGUSR1/SIGUSR2 go to one thread (sigwait below), and the signals that end the session to
  // the main thread and libfuse's workers alone (libfuse's loop notices them there): all blocked
  // while our own threads start, which inherit the mask.
  sigset_t stats_signals, exit_signals;
  sigemptyset(&stats_signals);
  sigaddset(&stats_signals, SIGUSR1);
  sigaddset(&stats_signals, SIGUSR2);
  sigaddset(&stats_signals, SIGRTMIN);
  sigaddset(&stats_signals, SIGRTMIN + 1);
  sigemptyset(&exit_signals);
  sigaddset(&exit_signals, SIGTERM);
  sigaddset(&exit_signals, SIGINT);
  sigaddset(&exit_signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &stats_signals, nullptr);
  pthread_sigmask(SIG_BLOCK, &exit_signals, nullptr);

  SlowFs fs(options);  // starts the reply thread
  g_fs = &fs;

  fuse_lowlevel_ops ops{};
  ops.init = op_init;
  ops.lookup = op_lookup;
  ops.forget = op_forget;
  ops.forget_multi = op_forget_multi;
  ops.getattr = op_getattr;
  ops.setattr = op_setattr;
  ops.readlink = op_readlink;
  ops.mkdir = op_mkdir;
  ops.unlink = op_unlink;
  ops.rmdir = op_rmdir;
  ops.rename = op_rename;
  ops.open = op_open;
  ops.create = op_create;
  ops.read = op_read;
  ops.write = op_write;
  ops.flush = op_flush;
  ops.release = op_release;
  ops.fsync = op_fsync;
  ops.opendir = op_opendir;
  ops.readdir = op_readdir;
  ops.releasedir = op_releasedir;
  ops.statfs = op_statfs;

  const std::string fsname = "-ofsname=slowfs-" + std::to_string(::getpid()) + ",subtype=slowfs";
  std::vector<std::string> arg_text = {argv[0], fsname};
  std::vector<char*> fuse_argv;
  for (auto& text : arg_text) fuse_argv.push_back(text.data());
  fuse_args args = FUSE_ARGS_INIT(static_cast<int>(fuse_argv.size()), fuse_argv.data());
  fuse_session* session = fuse_session_new(&args, &ops, sizeof(ops), nullptr);
  if (session == nullptr) return 1;
  if (fuse_set_signal_handlers(session) != 0) return 1;
  if (fuse_session_mount(session, options.mountpoint.c_str()) != 0) {
    std::fprintf(stderr, "slowfs: cannot mount on %s\n", options.mountpoint.c_str());
    return 1;
  }
  std::thread([&options, stats_signals] {
    while (true) {
      int signal = 0;
      if (sigwait(&stats_signals, &signal) != 0) continue;
      if (signal == SIGUSR2) g_fs->stats().reset();
      if (signal == SIGRTMIN || signal == SIGRTMIN + 1)
        g_fs->latency().set_tail(signal != SIGRTMIN);
      write_stats(options.stats_path);
    }
  }).detach();
  pthread_sigmask(SIG_UNBLOCK, &exit_signals, nullptr);
  std::printf("ready\n");
  std::fflush(stdout);

  fuse_loop_config* loop = fuse_loop_cfg_create();
  fuse_loop_cfg_set_max_threads(loop, static_cast<unsigned>(options.threads));
  fuse_loop_cfg_set_idle_threads(loop, static_cast<unsigned>(options.threads));
  const int result = fuse_session_loop_mt(session, loop);
  fuse_loop_cfg_destroy(loop);
  write_stats(options.stats_path);
  fuse_session_unmount(session);
  fuse_remove_signal_handlers(session);
  fuse_session_destroy(session);
  // Replies still queued go nowhere now; leave without waiting for them.
  std::fflush(stdout);
  std::_Exit(result == 0 ? 0 : 1);
}
