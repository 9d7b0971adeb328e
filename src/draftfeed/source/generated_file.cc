#include "draftfeed/source/generated_file.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdio>

#include "draftfeed/common/enum_names.h"
#include "draftfeed/common/poll_backoff.h"
#include "draftfeed/source/sample_source.h"

namespace draftfeed {

namespace {

constexpr std::array<EnumName<FileProblem>, static_cast<std::size_t>(FileProblem::kCount)>
    kFileProblemNames = {{
        {FileProblem::kNone, "ok"},
        {FileProblem::kOutsideServerDir, "outside server dir"},
        {FileProblem::kCacheFile, "cache file"},
        {FileProblem::kMissing, "missing file"},
        {FileProblem::kNotRegular, "not a regular file"},
        {FileProblem::kTooLarge, "file too large"},
        {FileProblem::kLockTimeout, "lock timeout"},
        {FileProblem::kUnreadable, "unreadable"},
        {FileProblem::kCorrupt, "corrupt"},
        {FileProblem::kTokenMismatch, "token mismatch"},
        {FileProblem::kBadShape, "bad shape"},
        {FileProblem::kNonFinite, "non-finite"},
        {FileProblem::kTransferFailed, "transfer failed"},
        {FileProblem::kNotPlainPath, "not a plain path"},
    }};

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

UniqueFd dup_fd(int fd) { return UniqueFd(::fcntl(fd, F_DUPFD_CLOEXEC, 0)); }

// The identity of the folder at `path`, when it exists and opens.
std::optional<FileIdentity> folder_identity(const std::string& path) {
  auto folder = open_folder(path);
  if (!folder.ok()) return std::nullopt;
  auto id = identity_of(folder.value().get(), path);
  if (!id.ok()) return std::nullopt;
  return id.value();
}

// Where an open descriptor's file is now, as the kernel names it (for messages and to find a link
// target's folder); empty when /proc cannot say.
std::string descriptor_path(int fd) {
  char buffer[4096];
  const std::string link = "/proc/self/fd/" + std::to_string(fd);
  const ssize_t n = ::readlink(link.c_str(), buffer, sizeof(buffer) - 1);
  if (n <= 0) return {};
  return std::string(buffer, static_cast<std::size_t>(n));
}

// Whether the file a link led to (open at `fd`) lies in `folder` or below it: its path from the
// kernel, that path's folder opened, and the name there checked to be the same file.
bool link_target_within(const HeldFile& file, const FileIdentity& folder) {
  const std::string target = descriptor_path(file.fd());
  if (target.empty() || target.front() != '/') return false;
  const auto slash = target.rfind('/');
  const std::string parent = slash == 0 ? "/" : target.substr(0, slash);
  auto opened = open_folder(parent);
  if (!opened.ok()) return false;
  struct stat st {};
  const std::string name = target.substr(slash + 1);
  if (::fstatat(opened.value().get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) return false;
  const FileIdentity named{static_cast<std::uint64_t>(st.st_dev),
                           static_cast<std::uint64_t>(st.st_ino)};
  return named == file.identity() && folder_within(opened.value().get(), folder);
}

std::int64_t nanoseconds(std::chrono::system_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

std::string seconds_text(double seconds) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.3f", seconds);
  return text;
}

}  // namespace

const char* file_problem_name(FileProblem problem) { return enum_name(problem, kFileProblemNames); }

void GeneratedFileOptions::validate() const {
  require(max_file_bytes > 0, ErrorKind::kInvalidArgument, "max_file_bytes must be > 0");
  require(lock_timeout.count() >= 0 && lock_poll.count() > 0, ErrorKind::kInvalidArgument,
          "lock_timeout must be >= 0 and lock_poll > 0 (got " +
              std::to_string(lock_timeout.count()) + " and " + std::to_string(lock_poll.count()) +
              ")");
  require(clock_skew.count() >= 0, ErrorKind::kInvalidArgument,
          "generated_file_clock_skew must be >= 0, got " + std::to_string(clock_skew.count()));
}

std::optional<Error> wait_for_lock_at(int folder, const std::string& lock_name,
                                      const std::string& shown,
                                      std::chrono::duration<double> timeout,
                                      std::chrono::duration<double> poll) {
  const UniqueFd fd(
      ::openat(folder, lock_name.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW));
  if (!fd) {
    if (errno == ENOENT) return std::nullopt;  // no writer, or it finished and removed it
    if (errno == ELOOP) return Error(ErrorKind::kIo, shown + ": the lock file is a symbolic link");
    return Error(ErrorKind::kIo, shown + ": cannot open the lock file: " + os_error_text(errno));
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) {
    return Error(ErrorKind::kIo, shown + ": the lock file is not a regular file");
  }
  PollBackoff backoff(timeout, poll);  // as wait_for_lock: attempts less and less often
  while (::flock(fd.get(), LOCK_SH | LOCK_NB) != 0) {
    const int err = errno;
    if (err == EINTR) continue;
    if (err != EWOULDBLOCK) {
      return Error(ErrorKind::kIo, shown + ": cannot lock: " + os_error_text(err));
    }
    if (!backoff.wait()) {
      return Error(ErrorKind::kTimeout, shown + ": timed out after " +
                                            std::to_string(timeout.count()) +
                                            " s waiting for the writer's lock");
    }
  }
  return std::nullopt;  // the shared lock goes with the descriptor
}

GeneratedFileReader::GeneratedFileReader(std::shared_ptr<const CacheStore> cache,
                                         GeneratedFileOptions options)
    : cache_(std::move(cache)), options_(std::move(options)) {
  options_.validate();
}

GeneratedFileReader::Anchors GeneratedFileReader::anchors() const {
  Anchors out;
  out.cache_root = folder_identity(cache_->root());
  if (!options_.server_dir.empty()) out.server = folder_identity(options_.server_dir);
  return out;
}

std::string GeneratedFileReader::keep_reason(
    const HeldFile& file, bool failed, std::chrono::system_clock::time_point request_sent) const {
  return keep_reason(file, failed, request_sent, anchors());
}

std::string GeneratedFileReader::keep_reason(const HeldFile& file, bool failed,
                                             std::chrono::system_clock::time_point request_sent,
                                             const Anchors& anchors) const {
  if (file.is_link()) return "it is a symbolic link";
  struct stat st {};
  if (::fstat(file.fd(), &st) != 0) return "it cannot be looked at: " + os_error_text(errno);
  if (st.st_nlink == 0) return "it was removed meanwhile";
  if (st.st_nlink != 1) {
    return "it has " + std::to_string(st.st_nlink) + " names (hard links), not only the server's";
  }
  if (anchors.cache_root && folder_within(file.folder(), *anchors.cache_root)) {
    return "it lies in the cache folder " + cache_->root() +
           ", where draftfeed removes only what it wrote";
  }
  if (is_cache_file_name(file.name()) || folder_holds_cache_files(file.folder(), file.name())) {
    return "its folder holds hs_* cache files (some cache's samples)";
  }
  const std::int64_t earliest =
      nanoseconds(request_sent) -
      std::chrono::duration_cast<std::chrono::nanoseconds>(options_.clock_skew).count();
  if (file.created_ns() < earliest) {
    const double before = static_cast<double>(nanoseconds(request_sent) - file.created_ns()) / 1e9;
    return std::string("it was ") + (file.created_is_birth() ? "created" : "last changed") + " " +
           seconds_text(before) +
           " s before the request was sent (allowed: " + seconds_text(options_.clock_skew.count()) +
           " s of clock skew), so it is not the request's output";
  }
  if (failed) {
    if (options_.server_dir.empty()) return "it failed, and no server folder (server_dir) is set";
    if (!anchors.server || !folder_within(file.folder(), *anchors.server)) {
      return "it failed, and lies outside the server folder " + options_.server_dir;
    }
  }
  return {};
}

GeneratedFile GeneratedFileReader::read(const std::string& handle, const RowIds& ids,
                                        std::int64_t row,
                                        std::chrono::system_clock::time_point request_sent) const {
  GeneratedFile out;
  out.path = handle;
  const std::string where = "row " + std::to_string(row) + ": handle " + handle;
  // The cache folder and the server folder, opened once for all the checks below.
  const Anchors anchored = anchors();
  auto fail = [&](FileProblem kind, const std::string& message) -> GeneratedFile& {
    out.problem = kind;
    out.message = message;
    if (out.held) out.keep_reason = keep_reason(*out.held, true, request_sent, anchored);
    return out;
  };

  auto plain = split_plain_path(handle);
  if (!plain.ok()) return fail(FileProblem::kNotPlainPath, where + ": " + plain.error().what());
  const std::string& name = plain.value().name;
  auto folder_or = open_folder(plain.value().folder);
  if (!folder_or.ok()) {
    const bool missing = folder_or.error().kind() == ErrorKind::kNotFound;
    return fail(missing ? FileProblem::kMissing : FileProblem::kUnreadable,
                where + ": " + folder_or.error().what());
  }
  UniqueFd folder = std::move(folder_or).value();

  const std::optional<FileIdentity>& server = anchored.server;
  if (!options_.server_dir.empty()) {
    if (!server || !folder_within(folder.get(), *server)) {
      const std::string real = descriptor_path(folder.get());
      return fail(FileProblem::kOutsideServerDir,
                  where + " lies in " + (real.empty() ? plain.value().folder : real) +
                      ", outside the server folder " + options_.server_dir);
    }
  }
  const std::optional<FileIdentity>& cache_root = anchored.cache_root;
  if (cache_root && is_cache_file_name(name) && folder_within(folder.get(), *cache_root)) {
    return fail(FileProblem::kCacheFile,
                where + " names " + handle + ", a file of the hidden-state cache itself");
  }

  // The writer's lock first: the file may still be being written (or not exist yet).
  if (auto lock_error = wait_for_lock_at(folder.get(), name + ".lock", handle + ".lock",
                                         options_.lock_timeout, options_.lock_poll)) {
    const bool timeout = lock_error->kind() == ErrorKind::kTimeout;
    if (timeout) {
      // Held now when it exists, so that a later sweep removes this very file once its writer
      // lets go; else the folder is kept for the sweep to open it then.
      auto held = HeldFile::open(dup_fd(folder.get()), plain.value().folder, name, false);
      if (held.ok()) out.held = std::make_shared<const HeldFile>(std::move(held).value());
      out.name = plain.value();
      out.folder = std::make_shared<const UniqueFd>(std::move(folder));
    }
    return fail(timeout ? FileProblem::kLockTimeout : FileProblem::kUnreadable,
                where + ": " + lock_error->what());
  }

  auto held_or = HeldFile::open(dup_fd(folder.get()), plain.value().folder, name, true);
  if (!held_or.ok()) {
    const ErrorKind kind = held_or.error().kind();
    const FileProblem p = kind == ErrorKind::kNotFound      ? FileProblem::kMissing
                          : kind == ErrorKind::kUnsupported ? FileProblem::kNotRegular
                                                            : FileProblem::kUnreadable;
    return fail(p, where + ": " + held_or.error().what());
  }
  out.held = std::make_shared<const HeldFile>(std::move(held_or).value());
  const HeldFile& held = *out.held;
  if (held.is_link() && server && !link_target_within(held, *server)) {
    const std::string real = descriptor_path(held.fd());
    return fail(FileProblem::kOutsideServerDir,
                where + " is a symbolic link to " + (real.empty() ? "a file" : real) +
                    ", outside the server folder " + options_.server_dir);
  }
  if (held.size() > options_.max_file_bytes) {
    return fail(FileProblem::kTooLarge,
                where + ": " + held.path() + " has " + std::to_string(held.size()) +
                    " bytes, more than the limit of " + std::to_string(options_.max_file_bytes));
  }
  // Mapped from the descriptor checked above: what is validated is the file held.
  auto mapping = MappedFile::map_descriptor(::fcntl(held.fd(), F_DUPFD_CLOEXEC, 0), held.path(),
                                            kMapForRowReads);
  auto file = mapping.ok() ? SafetensorsFile::from_mapping(std::move(mapping).value())
                           : Result<std::shared_ptr<const SafetensorsFile>>(mapping.error());
  if (!file.ok()) {
    const FileProblem p =
        file.error().kind() == ErrorKind::kIo ? FileProblem::kUnreadable : FileProblem::kCorrupt;
    return fail(p, where + ": " + file.error().what());
  }
  HiddenStateSample sample;
  const SampleCheck check = validate_file(std::move(file).value(), ids, row, &sample);
  if (!check.ok()) return fail(from_sample_problem(check.problem), where + ": " + check.message);
  out.keep_reason = keep_reason(held, false, request_sent, anchored);
  out.sample = std::move(sample);
  return out;
}

void remove_released_lock(const HeldFile& held) {
  auto lock =
      HeldFile::open(dup_fd(held.folder()), held.folder_path(), held.name() + ".lock", false);
  if (!lock.ok() || lock.value().links() != 1) return;
  // A lock its writer holds again is the writer's; one no one holds is the protocol's leftover.
  if (::flock(lock.value().fd(), LOCK_EX | LOCK_NB) != 0) return;
  (void)lock.value().remove();
}

std::optional<Error> release_generated(const CacheStore& cache, const GeneratedFile& file,
                                       std::optional<std::int64_t> cache_row) {
  if (!file.removable()) {
    return Error(ErrorKind::kInvalidArgument,
                 file.path + ": left in place: " +
                     (file.keep_reason.empty() ? std::string("not opened") : file.keep_reason));
  }
  const HeldFile& held = *file.held;
  if (cache_row) {
    if (auto error = cache.adopt_held(*cache_row, held)) return error;
  } else if (auto error = held.remove()) {
    return error;
  }
  remove_released_lock(held);
  return std::nullopt;
}

}  // namespace draftfeed
