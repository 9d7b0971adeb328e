#include "draftfeed/pack/durable_file.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include "draftfeed/common/error.h"

namespace draftfeed {

namespace {

Error os_error(const std::string& what, const std::string& path, int error) {
  return Error(ErrorKind::kIo, path + ": " + what + ": " + os_error_text(error));
}

constexpr const char* kTempMark = ".tmp-";

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

void write_file_durably(const std::string& path,
                        std::span<const std::span<const std::uint8_t>> pieces) {
  const std::filesystem::path target(path);
  const std::string folder =
      target.parent_path().empty() ? std::string(".") : target.parent_path().string();
  const std::string temp =
      folder + "/." + target.filename().string() + kTempMark + std::to_string(::getpid());
  // Created, never reused: a link or a file left by that name (a killed run with this pid) is
  // removed (the name only, never what a link points to) and the temporary made afresh.
  constexpr int kCreate = O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC;
  int fd = ::open(temp.c_str(), kCreate, 0644);
  if (fd < 0 && errno == EEXIST && ::unlink(temp.c_str()) == 0) {
    fd = ::open(temp.c_str(), kCreate, 0644);
  }
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
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    const int error = errno;
    ::unlink(temp.c_str());
    throw os_error("cannot rename " + temp + " to", path, error);
  }
  sync_folder(folder);
}

std::int64_t remove_dead_temporaries(const std::string& folder) {
  std::int64_t removed = 0;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(folder, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.empty() || name[0] != '.') continue;
    const std::size_t mark = name.rfind(kTempMark);
    if (mark == std::string::npos) continue;
    const std::string pid_text = name.substr(mark + std::strlen(kTempMark));
    if (pid_text.empty() || pid_text.size() > 9 ||
        pid_text.find_first_not_of("0123456789") != std::string::npos) {
      continue;
    }
    const pid_t pid = static_cast<pid_t>(std::stol(pid_text));
    if (pid == ::getpid() || ::kill(pid, 0) == 0 || errno != ESRCH) continue;
    if (::unlink(entry.path().c_str()) == 0) ++removed;
  }
  return removed;
}

}  // namespace draftfeed
