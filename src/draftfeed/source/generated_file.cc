#include "draftfeed/source/generated_file.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>

#include "draftfeed/common/poll_backoff.h"
#include "draftfeed/source/sample_source.h"

namespace draftfeed {

namespace fs = std::filesystem;

namespace {

GeneratedFile problem(FileProblem kind, std::string message, std::string path = {},
                      bool owned = false) {
  GeneratedFile out;
  out.problem = kind;
  out.message = std::move(message);
  out.path = std::move(path);
  out.owned = owned;
  return out;
}

FileProblem from_sample_problem(SampleProblem problem) {
  switch (problem) {
    case SampleProblem::kNone:
      return FileProblem::kNone;
    case SampleProblem::kMissingKey:
    case SampleProblem::kBadScales:
      return FileProblem::kCorrupt;
    case SampleProblem::kTokenMismatch:
      return FileProblem::kTokenMismatch;
    case SampleProblem::kNonFinite:
      return FileProblem::kNonFinite;
    case SampleProblem::kBadTokenIds:
    case SampleProblem::kBadDtype:
    case SampleProblem::kBadShape:
    case SampleProblem::kLengthMismatch:
      return FileProblem::kBadShape;
    case SampleProblem::kUnreadable:
      return FileProblem::kUnreadable;
  }
  return FileProblem::kCorrupt;
}

// True for the cache's own names: `hs_*` (cached samples) and `.hs_*` (adopt temporaries).
bool is_cache_name(const std::string& name) {
  return name.rfind("hs_", 0) == 0 || name.rfind(".hs_", 0) == 0;
}

}  // namespace

const char* file_problem_name(FileProblem problem) {
  switch (problem) {
    case FileProblem::kNone:
      return "ok";
    case FileProblem::kOutsideServerDir:
      return "outside server dir";
    case FileProblem::kCacheFile:
      return "cache file";
    case FileProblem::kMissing:
      return "missing file";
    case FileProblem::kNotRegular:
      return "not a regular file";
    case FileProblem::kTooLarge:
      return "file too large";
    case FileProblem::kLockTimeout:
      return "lock timeout";
    case FileProblem::kUnreadable:
      return "unreadable";
    case FileProblem::kCorrupt:
      return "corrupt";
    case FileProblem::kTokenMismatch:
      return "token mismatch";
    case FileProblem::kBadShape:
      return "bad shape";
    case FileProblem::kNonFinite:
      return "non-finite";
    case FileProblem::kTransferFailed:
      return "transfer failed";
    case FileProblem::kCount:
      break;
  }
  return "unknown";
}

std::optional<Error> wait_for_foreign_lock(const std::string& lock_path,
                                           std::chrono::duration<double> timeout,
                                           std::chrono::duration<double> poll) {
  // O_NONBLOCK: a FIFO planted as the lock file must not block the open.
  const int fd = ::open(lock_path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    if (errno == ENOENT) return std::nullopt;
    return Error(ErrorKind::kIo,
                 lock_path + ": cannot open the lock file: " + os_error_text(errno));
  }
  PollBackoff backoff(timeout, poll);  // as wait_for_lock: attempts less and less often
  while (::flock(fd, LOCK_SH | LOCK_NB) != 0) {
    const int err = errno;
    if (err == EINTR) continue;
    if (err != EWOULDBLOCK) {
      ::close(fd);
      return Error(ErrorKind::kIo, lock_path + ": cannot lock: " + os_error_text(err));
    }
    if (!backoff.wait()) {
      ::close(fd);
      return Error(ErrorKind::kTimeout, lock_path + ": timed out after " +
                                            std::to_string(timeout.count()) +
                                            " s waiting for the writer's lock");
    }
  }
  ::close(fd);
  return std::nullopt;
}

GeneratedFileReader::GeneratedFileReader(std::shared_ptr<const CacheStore> cache,
                                         GeneratedFileOptions options)
    : cache_(std::move(cache)), options_(std::move(options)) {
  if (!options_.server_dir.empty()) {
    CacheStoreOptions server;
    server.root = options_.server_dir;
    server.lock_timeout = options_.lock_timeout;
    server.lock_poll = options_.lock_poll;
    server_.emplace(server);
  }
}

GeneratedFile GeneratedFileReader::read(const std::string& handle, const RowIds& ids,
                                        std::int64_t row) const {
  const std::string where = "row " + std::to_string(row) + ": handle " + handle;
  std::error_code ec;
  const fs::path named = fs::absolute(handle, ec);
  fs::path resolved = named;
  if (!ec) resolved = fs::weakly_canonical(resolved, ec);
  if (ec) return problem(FileProblem::kUnreadable, where + ": cannot resolve: " + ec.message());
  const std::string path = resolved.string();
  // A link is followed for reading, but neither it nor its target is ever moved or removed.
  struct stat named_st {};
  const bool is_link = ::lstat(named.c_str(), &named_st) == 0 && S_ISLNK(named_st.st_mode);

  if (server_) {
    auto inside = server_->confine(handle);
    if (!inside.ok()) {
      return problem(
          FileProblem::kOutsideServerDir,
          where + " resolves to " + path + ", outside the server folder " + options_.server_dir,
          path);
    }
  }
  fs::path cache_root = fs::absolute(cache_->root(), ec);
  if (!ec) cache_root = fs::weakly_canonical(cache_root, ec);
  // The cache's own files lie in its root or in a shard folder of it (cache_layout.h).
  const fs::path folder = resolved.parent_path();
  const bool in_cache_folder =
      folder == cache_root ||
      (folder.parent_path() == cache_root && is_shard_folder_name(folder.filename().string()));
  if (!ec && in_cache_folder && is_cache_name(resolved.filename())) {
    return problem(FileProblem::kCacheFile,
                   where + " names " + path + ", a file of the hidden-state cache itself", path);
  }
  const bool owned = !is_link && cache_->confine(path).ok();

  // The lock protocol first: the file may still be being written (or not exist yet).
  const std::string lock_path = path + ".lock";
  std::optional<Error> lock_error =
      owned ? wait_for_lock(lock_path, options_.lock_timeout, options_.lock_poll)
            : wait_for_foreign_lock(lock_path, options_.lock_timeout, options_.lock_poll);
  if (lock_error) {
    const FileProblem kind = lock_error->kind() == ErrorKind::kTimeout ? FileProblem::kLockTimeout
                                                                       : FileProblem::kUnreadable;
    return problem(kind, where + ": " + lock_error->what(), path, owned);
  }

  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT || errno == ENOTDIR) {
      return problem(FileProblem::kMissing, where + ": no file at " + path, path, owned);
    }
    return problem(FileProblem::kUnreadable,
                   where + ": cannot stat " + path + ": " + os_error_text(errno), path, owned);
  }
  if (!S_ISREG(st.st_mode)) {
    return problem(FileProblem::kNotRegular, where + ": " + path + " is not a regular file", path,
                   owned);
  }
  if (static_cast<std::uint64_t>(st.st_size) > options_.max_file_bytes) {
    return problem(FileProblem::kTooLarge,
                   where + ": " + path + " has " + std::to_string(st.st_size) +
                       " bytes, more than the limit of " + std::to_string(options_.max_file_bytes),
                   path, owned);
  }
  auto file = SafetensorsFile::open(path, kMapForRowReads);
  if (!file.ok()) {
    const ErrorKind kind = file.error().kind();
    const FileProblem p = kind == ErrorKind::kNotFound ? FileProblem::kMissing
                          : kind == ErrorKind::kIo     ? FileProblem::kUnreadable
                                                       : FileProblem::kCorrupt;
    return problem(p, where + ": " + file.error().what(), path, owned);
  }
  HiddenStateSample sample;
  const SampleCheck check = validate_file(std::move(file).value(), ids, row, &sample);
  if (!check.ok()) {
    return problem(from_sample_problem(check.problem), where + ": " + check.message, path, owned);
  }
  GeneratedFile out;
  out.path = path;
  out.owned = owned;
  out.proven = !is_link;
  out.device = static_cast<std::uint64_t>(st.st_dev);
  out.inode = static_cast<std::uint64_t>(st.st_ino);
  out.sample = std::move(sample);
  return out;
}

void release_generated(const CacheStore& cache, const GeneratedFile& file,
                       std::optional<std::int64_t> cache_row) {
  if (file.path.empty() || !(file.proven || file.owned)) {
    throw Error(ErrorKind::kInvalidArgument,
                file.path + ": not proven to be this request's output: left in place");
  }
  // The path must still name the file that was read (not a file put there since).
  struct stat st {};
  if (::lstat(file.path.c_str(), &st) != 0) {
    if (errno == ENOENT) return;  // already gone
    throw Error(ErrorKind::kIo, file.path + ": cannot stat: " + os_error_text(errno));
  }
  if (file.proven &&
      (!S_ISREG(st.st_mode) || static_cast<std::uint64_t>(st.st_dev) != file.device ||
       static_cast<std::uint64_t>(st.st_ino) != file.inode)) {
    throw Error(ErrorKind::kInvalidArgument,
                file.path + ": replaced since it was read: left in place");
  }
  if (cache_row) {
    if (file.owned) {
      cache.adopt(*cache_row, file.path);
    } else {
      cache.adopt_unconfined(*cache_row, file.path);
    }
  } else if (file.owned) {
    cache.remove(file.path);
  } else if (::unlink(file.path.c_str()) != 0 && errno != ENOENT) {
    throw Error(ErrorKind::kIo, file.path + ": cannot remove: " + os_error_text(errno));
  }
  // Its lock file, released by its writer before the file was read, goes too (the protocol's
  // last step, which an unowned read skipped). A lock still held is left to its holder.
  const std::string lock_path = file.path + ".lock";
  struct stat lock_st {};
  if (::lstat(lock_path.c_str(), &lock_st) == 0 && S_ISREG(lock_st.st_mode)) {
    (void)wait_for_lock(lock_path, std::chrono::duration<double>(0),
                        std::chrono::duration<double>(0));
  }
}

}  // namespace draftfeed
