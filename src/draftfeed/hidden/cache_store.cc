#include "draftfeed/hidden/cache_store.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <filesystem>
#include <string_view>
#include <vector>

#include "draftfeed/common/held_file.h"
#include "draftfeed/common/poll_backoff.h"

namespace draftfeed {

namespace fs = std::filesystem;

namespace {

Error os_error(const std::string& what, const std::string& path, int err) {
  const ErrorKind kind = (err == ENOENT || err == ENOTDIR) ? ErrorKind::kNotFound : ErrorKind::kIo;
  return Error(kind, path + ": " + what + ": " + os_error_text(err));
}

std::string seconds_text(std::chrono::duration<double> d) {
  std::string text = std::to_string(d.count());
  while (text.size() > 1 && text.back() == '0') text.pop_back();
  if (!text.empty() && text.back() == '.') text.pop_back();
  return text + " s";
}

// `base` without a trailing separator, so component-wise comparison works.
fs::path without_trailing_separator(fs::path base) {
  while (!base.has_filename() && base.has_relative_path()) base = base.parent_path();
  return base;
}

// True when `path` lies strictly below `base` (both absolute and normalised).
bool strictly_inside(const fs::path& path, const fs::path& base) {
  auto p = path.begin();
  for (auto b = base.begin(); b != base.end(); ++b, ++p) {
    if (p == path.end() || *p != *b) return false;
  }
  // At least one more non-empty component: the folder itself is not "inside" it.
  for (; p != path.end(); ++p) {
    if (!p->empty()) return true;
  }
  return false;
}

fs::path resolve(const std::string& path, std::error_code& ec) {
  const fs::path absolute = fs::absolute(path, ec);
  if (ec) return {};
  return without_trailing_separator(fs::weakly_canonical(absolute, ec));
}

constexpr std::string_view kAdoptMark = ".safetensors.adopt-";

// The pid of an adopt temporary named by this host ("...adopt-<host>-<pid>-<n>"), or -1.
long temporary_pid(const std::string& name, const std::string& host) {
  if (name.rfind(".hs_", 0) != 0) return -1;
  const auto mark = name.find(kAdoptMark);
  if (mark == std::string::npos) return -1;
  const std::string tail = name.substr(mark + kAdoptMark.size());  // <host>-<pid>-<n>
  if (tail.rfind(host + "-", 0) != 0) return -1;
  const std::string numbers = tail.substr(host.size() + 1);  // <pid>-<n>
  const auto dash = numbers.find('-');
  if (dash == 0 || dash == std::string::npos) return -1;
  long pid = 0;
  for (std::size_t i = 0; i < dash; ++i) {
    if (numbers[i] < '0' || numbers[i] > '9' || pid > 100'000'000) return -1;
    pid = pid * 10 + (numbers[i] - '0');
  }
  return pid;
}

}  // namespace

std::optional<Error> wait_for_lock(const std::string& lock_path,
                                   std::chrono::duration<double> timeout,
                                   std::chrono::duration<double> poll, LockMode mode,
                                   std::int64_t* attempts) {
  // Read-write as the reference opens it; a probe only needs to read. Never through a link, and
  // never blocking: a FIFO planted as the lock file is refused, not waited on.
  const int fd = ::open(lock_path.c_str(), (mode == LockMode::kWait ? O_RDWR : O_RDONLY) |
                                               O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    if (errno == ENOENT) return std::nullopt;  // no writer, or it finished and the lock is gone
    if (errno == ELOOP)
      return Error(ErrorKind::kIo, lock_path + ": the lock file is a symbolic link");
    return os_error("cannot open the lock file", lock_path, errno);
  }
  struct stat lock_st {};
  if (::fstat(fd, &lock_st) != 0 || !S_ISREG(lock_st.st_mode)) {
    ::close(fd);
    return Error(ErrorKind::kIo, lock_path + ": the lock file is not a regular file");
  }
  // A probe takes a shared lock: it conflicts with the writer's exclusive one, not with other
  // probes.
  const int operation = (mode == LockMode::kWait ? LOCK_EX : LOCK_SH) | LOCK_NB;
  // No file system notifies a waiter here (network ones have no inotify): ask again, less and less
  // often (common/poll_backoff.h), at most `poll` apart.
  PollBackoff backoff(timeout, poll);
  while (true) {
    if (attempts != nullptr) ++*attempts;
    if (::flock(fd, operation) == 0) break;
    const int err = errno;
    if (err == EINTR) continue;
    if (err != EWOULDBLOCK) {
      ::close(fd);
      return os_error("cannot lock", lock_path, err);
    }
    if (mode == LockMode::kProbe) {
      ::close(fd);
      return Error(ErrorKind::kTimeout, lock_path + ": locked by a writer (not waited for)");
    }
    if (!backoff.wait()) {
      ::close(fd);
      return Error(ErrorKind::kTimeout, lock_path + ": timed out after " + seconds_text(timeout) +
                                            " waiting for the writer's lock");
    }
  }
  ::close(fd);  // releases the lock
  // The writer has let go: the data file is complete and may be read. Removing the lock file is
  // the protocol's cleanup; in a folder this process may not change (a read-only cache, a server
  // folder of another user) it stays, which is harmless (a later reader finds it free at once),
  // so that refusal does not fail the read. Any other failure does.
  if (mode == LockMode::kWait && ::unlink(lock_path.c_str()) != 0 && errno != ENOENT &&
      errno != EACCES && errno != EPERM && errno != EROFS) {
    return os_error("cannot remove the lock file", lock_path, errno);
  }
  return std::nullopt;
}

void CacheStoreOptions::validate() const {
  require(!root.empty(), ErrorKind::kInvalidArgument,
          "the cache store needs a root folder (hidden_states_path)");
  require(lock_timeout.count() >= 0 && lock_poll.count() > 0, ErrorKind::kInvalidArgument,
          "lock_timeout must be >= 0 and lock_poll > 0 (got " +
              std::to_string(lock_timeout.count()) + " and " + std::to_string(lock_poll.count()) +
              ")");
}

CacheStore::CacheStore(CacheStoreOptions options) : options_(std::move(options)) {
  options_.validate();
}

std::string CacheStore::path_for(std::int64_t row) const {
  return cache_file_path(options_.root, row, options_.layout);
}

std::string CacheStore::path_for_writing(std::int64_t row) const {
  std::string path = path_for(row);
  const std::string folder = fs::path(path).parent_path().string();
  std::error_code ec;
  fs::create_directories(folder, ec);
  if (ec) throw Error(ErrorKind::kIo, folder + ": cannot create the folder: " + ec.message());
  // A shard folder of the cache (the sharded layout's <row // 1000>) that is a link would send
  // the file outside the cache: refused (the cache's own root may be a link; its folders not).
  if (folder != options_.root && fs::is_symlink(folder, ec)) {
    throw Error(ErrorKind::kInvalidArgument,
                folder +
                    " is a symbolic link: the cache's shard folders must be folders of the "
                    "cache, not links to elsewhere");
  }
  return path;
}

std::string CacheStore::paths_text(std::int64_t row) const {
  return cache_file_path(options_.root, row, CacheLayout::kFlat) + " (or " +
         cache_file_path(options_.root, row, CacheLayout::kSharded) + ")";
}

Result<std::string> CacheStore::confine(const std::string& path) const {
  std::error_code ec;
  const fs::path resolved = resolve(path, ec);
  if (ec) return Error(ErrorKind::kIo, path + ": cannot resolve: " + ec.message());
  std::string folders;
  std::vector<std::string> allowed{options_.root};
  allowed.insert(allowed.end(), options_.allowed_folders.begin(), options_.allowed_folders.end());
  for (const auto& folder : allowed) {
    std::error_code folder_ec;
    const fs::path base = resolve(folder, folder_ec);
    if (!folder_ec && strictly_inside(resolved, base)) return resolved.string();
    folders += (folders.empty() ? "" : ", ") + (folder_ec ? folder : base.string());
  }
  return Error(ErrorKind::kInvalidArgument, path + " resolves to " + resolved.string() +
                                                ", outside the folders this store may change (" +
                                                folders + ")");
}

Result<std::optional<HiddenStateSample>> CacheStore::read_with_lock(const std::string& path,
                                                                    MapOptions map) const {
  if (auto error = wait_for_lock(path + ".lock", options_.lock_timeout, options_.lock_poll,
                                 options_.lock_mode)) {
    return *error;
  }
  auto file = SafetensorsFile::open(path, map);
  if (!file.ok()) {
    if (file.error().kind() == ErrorKind::kNotFound) return std::optional<HiddenStateSample>();
    return file.error();
  }
  auto sample = HiddenStateSample::from_file(std::move(file).value());
  if (!sample.ok()) return sample.error();
  return std::optional<HiddenStateSample>(std::move(sample).value());
}

Result<std::optional<HiddenStateSample>> CacheStore::lookup(std::int64_t row,
                                                            MapOptions map) const {
  const auto first = static_cast<CacheLayout>(found_in_.load(std::memory_order_relaxed));
  const CacheLayout second =
      first == CacheLayout::kFlat ? CacheLayout::kSharded : CacheLayout::kFlat;
  for (const CacheLayout layout : {first, second}) {
    auto found = read_with_lock(cache_file_path(options_.root, row, layout), map);
    if (!found.ok() || found.value()) {
      if (layout != first) {
        found_in_.store(static_cast<std::uint8_t>(layout), std::memory_order_relaxed);
      }
      return found;
    }
  }
  return std::optional<HiddenStateSample>();
}

Result<std::optional<HiddenStateSample>> CacheStore::load(const std::string& path,
                                                          MapOptions map) const {
  auto confined = confine(path);
  if (!confined.ok()) return confined.error();
  return read_with_lock(confined.value(), map);
}

void CacheStore::adopt(std::int64_t row, const std::string& source) const {
  const std::string confined = confine(source).value();
  const PlainPath plain = split_plain_path(confined).value();
  auto held = HeldFile::open(open_folder(plain.folder).value(), plain.folder, plain.name, false);
  if (!held.ok()) {
    const Error& error = held.error();
    throw Error(error.kind() == ErrorKind::kNotFound ? ErrorKind::kNotFound : ErrorKind::kIo,
                "cannot adopt " + source + ": " + error.what());
  }
  if (auto error = adopt_held(row, held.value())) throw *error;
}

std::optional<Error> CacheStore::adopt_held(std::int64_t row, const HeldFile& source) const {
  std::string target;
  try {
    target = path_for_writing(row);
  } catch (const Error& error) {
    return error;
  }
  const PlainPath plain = split_plain_path(target).value();
  auto folder = open_folder(plain.folder);
  if (!folder.ok()) return folder.error();
  // A temporary name that says which process of which host writes it, so that a later run can
  // tell a copy orphaned by a killed process from one under way (remove_stale_temporaries).
  const std::string temporary =
      process_unique_name(".hs_" + std::to_string(row) + ".safetensors", "adopt");
  if (auto error = source.move_to(folder.value().get(), plain.folder, plain.name, temporary,
                                  options_.force_copy_on_adopt)) {
    return error;
  }
  try {
    remove_other_layout(row);
  } catch (const Error& error) {
    return error;
  }
  return std::nullopt;
}

std::int64_t CacheStore::remove_stale_temporaries() const {
  const std::string host = host_name();
  std::int64_t removed = 0;
  std::vector<fs::path> folders{options_.root};
  for (std::size_t f = 0; f < folders.size(); ++f) {
    std::error_code ec;
    for (fs::directory_iterator it(folders[f], ec), end; !ec && it != end; it.increment(ec)) {
      const std::string name = it->path().filename().string();
      // The shard folders too (one level: that is where the sharded layout writes).
      std::error_code type_ec;
      if (f == 0 && is_shard_folder_name(name) && it->is_directory(type_ec)) {
        folders.push_back(it->path());
        continue;
      }
      const long pid = temporary_pid(name, host);
      if (pid <= 0) continue;
      if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;  // it still runs
      if (::unlink(it->path().c_str()) == 0) ++removed;
    }
  }
  return removed;
}

void CacheStore::remove_other_layout(std::int64_t row) const {
  const CacheLayout other =
      options_.layout == CacheLayout::kFlat ? CacheLayout::kSharded : CacheLayout::kFlat;
  const std::string path = cache_file_path(options_.root, row, other);
  if (::unlink(path.c_str()) != 0 && errno != ENOENT && errno != ENOTDIR) {
    throw os_error("cannot remove the file of the other layout", path, errno);
  }
}

void CacheStore::remove(const std::string& path) const {
  const std::string confined = confine(path).value();
  if (::unlink(confined.c_str()) != 0 && errno != ENOENT) {
    throw os_error("cannot remove", confined, errno);
  }
}

}  // namespace draftfeed
