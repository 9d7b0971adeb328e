#include "draftfeed/pack/durable_file.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "draftfeed/common/error.h"
#include "draftfeed/common/held_file.h"

namespace draftfeed {

namespace {

Error os_error(const std::string& what, const std::string& path, int error) {
  return Error(ErrorKind::kIo, path + ": " + what + ": " + os_error_text(error));
}

constexpr const char* kTempTag = "tmp";
constexpr std::string_view kTempMark = ".tmp-";

// The host and pid of a temporary name `.<name>.tmp-<host>-<pid>-<n>` of a pack file, if it is
// one.
std::optional<std::pair<std::string, pid_t>> temporary_owner(const std::string& name) {
  if (!name.starts_with(".shard-") && !name.starts_with(".manifest.json")) {
    return std::nullopt;
  }
  const std::size_t mark = name.rfind(kTempMark);
  if (mark == std::string::npos) return std::nullopt;
  const std::string owner = name.substr(mark + kTempMark.size());  // <host>-<pid>-<n>
  const std::size_t counter = owner.rfind('-');
  if (counter == std::string::npos || counter == 0) return std::nullopt;
  const std::size_t pid_at = owner.rfind('-', counter - 1);
  if (pid_at == std::string::npos) return std::nullopt;
  const std::string pid_text = owner.substr(pid_at + 1, counter - pid_at - 1);
  if (pid_text.empty() || pid_text.size() > 9 ||
      pid_text.find_first_not_of("0123456789") != std::string::npos) {
    return std::nullopt;
  }
  return std::make_pair(owner.substr(0, pid_at), static_cast<pid_t>(std::stol(pid_text)));
}

}  // namespace

void sync_folder(const std::string& folder) {
  const int fd = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw os_error("cannot open the folder to fsync it", folder, errno);
  const int rc = ::fsync(fd);
  const int error = errno;
  ::close(fd);
  // Some file systems (and FUSE mounts) refuse fsync on a folder: the rename is then as durable as
  // they make it.
  if (rc != 0 && error != EINVAL && error != EROFS) {
    throw os_error("cannot fsync the folder", folder, error);
  }
}

namespace {

std::string folder_of(const std::string& path) {
  const std::filesystem::path target(path);
  return target.parent_path().empty() ? std::string(".") : target.parent_path().string();
}

}  // namespace

std::string write_temporary_durably(const std::string& path,
                                    std::span<const std::span<const std::uint8_t>> pieces) {
  const std::string folder = folder_of(path);
  std::string temp = folder;
  temp += '/';
  temp += process_unique_name('.' + std::filesystem::path(path).filename().string(), kTempTag);
  // Created, never reused (O_EXCL): the name is this process's alone.
  constexpr int kCreate = O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC;
  const int fd = ::open(temp.c_str(), kCreate, 0644);
  if (fd < 0) throw os_error("cannot create", temp, errno);
  auto fail = [&](const char* what, int error) {
    ::close(fd);
    ::unlink(temp.c_str());
    throw os_error(what, temp, error);
  };
  for (std::span<const std::uint8_t> piece : pieces) {
    const std::uint8_t* p = piece.data();
    std::size_t left = piece.size();
    while (left > 0) {
      const ssize_t n = ::write(fd, p, left);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) fail("cannot write", n < 0 ? errno : EIO);
      p += n;
      left -= static_cast<std::size_t>(n);
    }
  }
  if (::fsync(fd) != 0) fail("cannot fsync", errno);
  if (::close(fd) != 0) {
    const int error = errno;
    ::unlink(temp.c_str());
    throw os_error("cannot close", temp, error);
  }
  return temp;
}

void rename_durably(const std::string& temporary, const std::string& path) {
  if (::rename(temporary.c_str(), path.c_str()) != 0) {
    const int error = errno;
    ::unlink(temporary.c_str());
    throw os_error("cannot rename " + temporary + " to", path, error);
  }
  sync_folder(folder_of(path));
}

void write_file_durably(const std::string& path,
                        std::span<const std::span<const std::uint8_t>> pieces) {
  rename_durably(write_temporary_durably(path, pieces), path);
}

std::int64_t remove_dead_temporaries(const std::string& folder) {
  const std::string host = host_name();
  std::int64_t removed = 0;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(folder, ec)) {
    const auto owner = temporary_owner(entry.path().filename().string());
    if (!owner || owner->first != host) continue;
    const pid_t pid = owner->second;
    if (pid == ::getpid() || ::kill(pid, 0) == 0 || errno != ESRCH) continue;
    if (::unlink(entry.path().c_str()) == 0) ++removed;
  }
  return removed;
}

}  // namespace draftfeed
