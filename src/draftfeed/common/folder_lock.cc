#include "draftfeed/common/folder_lock.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>
#include <vector>

#include "draftfeed/common/printable.h"

namespace draftfeed {

namespace {

using json = nlohmann::json;

// The record a holder writes is small; a lock file larger than this is not read whole.
constexpr std::size_t kMaxRecordBytes = 4096;

std::string now_utc() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&now, &tm);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return text;
}

// What DRAFTFEED_WRITER_LOCK allows: locks the mount keeps on one host (local), or none (off).
enum class LockPolicy { kAcrossHosts, kLocal, kOff };

LockPolicy lock_policy() {
  const char* env = std::getenv("DRAFTFEED_WRITER_LOCK");  // NOLINT(concurrency-mt-unsafe)
  const std::string value = env != nullptr ? env : "";
  if (value == "local") return LockPolicy::kLocal;
  if (value == "off") return LockPolicy::kOff;
  require(value.empty() || value == "required", ErrorKind::kInvalidArgument,
          "DRAFTFEED_WRITER_LOCK must be required, local or off, got '" + printable(value) + "'");
  return LockPolicy::kAcrossHosts;
}

// A mount option that keeps fcntl locks on one client, for the mount of device `device`
// (/proc/self/mountinfo), or empty: "nfs4 mounted with local_lock=all".
std::string local_only_lock_option(dev_t device) {
  std::ifstream in("/proc/self/mountinfo");
  const std::string wanted = std::to_string(major(device)) + ":" + std::to_string(minor(device));
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string id, parent, dev, root, point, options, field;
    if (!(fields >> id >> parent >> dev >> root >> point >> options) || dev != wanted) continue;
    while (fields >> field && field != "-") {
    }
    std::string type, source, super_options;
    fields >> type >> source >> super_options;
    const std::string all = "," + options + "," + super_options + ",";
    const auto has = [&](const char* option) { return all.find(option) != std::string::npos; };
    const bool nfs = type.rfind("nfs", 0) == 0;
    if (nfs && has(",nolock,")) return type + " mounted with nolock";
    if (nfs && (has(",local_lock=posix,") || has(",local_lock=all,"))) {
      return type + " mounted with " +
             std::string(has(",local_lock=all,") ? "local_lock=all" : "local_lock=posix");
    }
    if (type == "lustre" && has(",localflock,")) return "lustre mounted with localflock";
  }
  return {};
}

// F_OFD_SETLK, or F_SETLK where the kernel has no OFD locks: 0, or the errno.
int try_lock(int fd, int& command) {
  struct flock lock = {};
  lock.l_type = F_WRLCK;
  lock.l_whence = SEEK_SET;
  while (true) {
    if (::fcntl(fd, command, &lock) == 0) return 0;
    if (errno == EINTR) continue;
    if (errno == EINVAL && command == F_OFD_SETLK) {
      command = F_SETLK;
      continue;
    }
    return errno;
  }
}

bool is_busy(int error) { return error == EAGAIN || error == EACCES; }

bool locks_unsupported(int error) {
  return error == ENOLCK || error == EOPNOTSUPP || error == ENOSYS || error == EINVAL;
}

std::optional<LockHolder> read_holder(int fd) {
  std::string text(kMaxRecordBytes, '\0');
  const ssize_t n = ::pread(fd, text.data(), text.size(), 0);
  if (n <= 0) return std::nullopt;
  text.resize(static_cast<std::size_t>(n));
  const json record = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!record.is_object()) return std::nullopt;
  LockHolder holder;
  const auto string_field = [&](const char* key) {
    const auto it = record.find(key);
    return it != record.end() && it->is_string() ? it->get<std::string>() : std::string("?");
  };
  holder.host = string_field("host");
  holder.what = string_field("what");
  holder.since = string_field("since");
  const auto pid = record.find("pid");
  if (pid != record.end() && pid->is_number_integer()) holder.pid = pid->get<long>();
  return holder;
}

void write_holder(int fd, const std::string& what) {
  const json record = {{"host", host_name()},
                       {"pid", static_cast<long>(::getpid())},
                       {"what", what},
                       {"since", now_utc()}};
  const std::string text = record.dump() + "\n";
  // Best effort: the record only names the holder in another writer's message. Written over the
  // last holder's, then cut to length, so that the file is never empty while the lock is held.
  if (::pwrite(fd, text.data(), text.size(), 0) == static_cast<ssize_t>(text.size())) {
    (void)!::ftruncate(fd, static_cast<off_t>(text.size()));
  }
}

// Whether `holder` can be the one holding the lock now: not a record left by a process of this
// host that has ended (the new holder writes its own just after taking the lock).
bool could_hold(const LockHolder& holder) {
  if (holder.host != host_name() || holder.pid <= 0) return true;
  return ::kill(static_cast<pid_t>(holder.pid), 0) == 0 || errno == EPERM;
}

// The holder's record, read again for a short while when it is missing, torn or a dead
// process's: the holder takes the lock first and writes its record a moment later.
std::optional<LockHolder> read_current_holder(int fd) {
  constexpr auto kSettle = std::chrono::seconds(2);
  const auto start = std::chrono::steady_clock::now();
  while (true) {
    auto holder = read_holder(fd);
    if ((holder && could_hold(*holder)) || std::chrono::steady_clock::now() - start >= kSettle) {
      return holder;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

Result<UniqueFd> open_lock_file(int folder, const std::string& path) {
  const std::string lock_path = path + "/" + kWriterLockName;
  UniqueFd fd(::openat(folder, kWriterLockName,
                       O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644));
  if (!fd) {
    const int error = errno;
    if (error == ELOOP) {
      return Error(ErrorKind::kInvalidArgument,
                   lock_path + " is a symbolic link: the writer lock must be a file of the folder");
    }
    return Error(
        ErrorKind::kIo,
        "cannot open the writer lock " + lock_path + ": " + os_error_text(error) +
            (error == EROFS || error == EACCES ? " (a rewrite needs to write into the folder)"
                                               : ""));
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) {
    return Error(ErrorKind::kUnsupported, lock_path + " is not a regular file");
  }
  return fd;
}

}  // namespace

std::string LockHolder::text() const {
  return "host " + printable(host) + ", pid " + std::to_string(pid) + " (" + printable(what) +
         ", since " + printable(since) + ")";
}

Result<FolderLock> FolderLock::acquire(const std::string& path, const std::string& what,
                                       std::chrono::duration<double> wait,
                                       std::chrono::duration<double> poll) {
  const LockPolicy policy = lock_policy();
  auto folder = open_folder(path);
  if (!folder.ok()) return folder.error();
  FolderLock held;
  held.path_ = path;
  held.folder_ = std::move(folder).value();
  struct stat st {};
  if (::fstat(held.folder_.get(), &st) != 0) {
    return Error(ErrorKind::kIo, path + ": cannot stat the folder: " + os_error_text(errno));
  }
  held.identity_ = FileIdentity{static_cast<std::uint64_t>(st.st_dev), st.st_ino};
  if (const std::string local = local_only_lock_option(st.st_dev); !local.empty()) {
    if (policy == LockPolicy::kAcrossHosts) {
      return Error(ErrorKind::kUnsupported,
                   path + " is on " + local +
                       ": its locks are seen on this host only, so a rewrite on another host "
                       "could interleave with this one. Set DRAFTFEED_WRITER_LOCK=local if only "
                       "this host rewrites the cache");
    }
    held.across_hosts_ = false;
  }
  if (policy == LockPolicy::kOff) held.across_hosts_ = false;
  auto lock = open_lock_file(held.folder_.get(), path);
  if (!lock.ok()) return lock.error();
  held.lock_ = std::move(lock).value();

  const auto start = std::chrono::steady_clock::now();
  int command = F_OFD_SETLK;
  while (true) {
    const int error = try_lock(held.lock_.get(), command);
    if (error == 0) break;
    if (locks_unsupported(error)) {
      if (policy == LockPolicy::kOff) {
        held.across_hosts_ = false;
        break;
      }
      return Error(ErrorKind::kUnsupported,
                   path + ": its file system refuses file locks (" + os_error_text(error) +
                       "), so two rewrites could interleave. Set DRAFTFEED_WRITER_LOCK=off to "
                       "rewrite without the lock, making sure yourself that nothing else does");
    }
    if (!is_busy(error)) {
      return Error(ErrorKind::kIo,
                   "cannot lock " + path + "/" + kWriterLockName + ": " + os_error_text(error));
    }
    const auto waited = std::chrono::steady_clock::now() - start;
    if (waited >= wait) {
      const auto holder = read_current_holder(held.lock_.get());
      return Error(ErrorKind::kTimeout,
                   path + " is being rewritten by " +
                       (holder ? holder->text() : std::string("another writer")) +
                       ", which holds its writer lock (" + kWriterLockName +
                       ") until it ends; run this again once it has, or let it wait longer");
    }
    std::this_thread::sleep_for(std::min<std::chrono::duration<double>>(
        poll, wait - std::chrono::duration<double>(waited)));
  }
  held.waited_seconds_ =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  write_holder(held.lock_.get(), what);
  return held;
}

std::optional<LockHolder> folder_lock_holder(const std::string& path) {
  auto folder = open_folder(path);
  if (!folder.ok()) return std::nullopt;
  UniqueFd fd(::openat(folder.value().get(), kWriterLockName,
                       O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (!fd) return std::nullopt;
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) return std::nullopt;
  struct flock probe = {};
  probe.l_type = F_WRLCK;
  probe.l_whence = SEEK_SET;
  // A read-only descriptor can ask (F_OFD_GETLK) whether a write lock would be granted.
  if (::fcntl(fd.get(), F_OFD_GETLK, &probe) != 0 && ::fcntl(fd.get(), F_GETLK, &probe) != 0) {
    return std::nullopt;
  }
  if (probe.l_type == F_UNLCK) return std::nullopt;
  auto holder = read_current_holder(fd.get());
  return holder ? holder : LockHolder{"?", 0, "?", "?"};
}

}  // namespace draftfeed
