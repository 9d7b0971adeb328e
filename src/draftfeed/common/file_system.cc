#include "draftfeed/common/file_system.h"

#include <sys/vfs.h>

#include <algorithm>
#include <array>

namespace draftfeed {

namespace {

// statfs f_type values of file systems whose reads may ask a server (linux/magic.h; the others
// as the file systems report them; coreutils' stat -f lists the same ones as remote).
constexpr std::array<std::uint64_t, 18> kNetworkTypes = {
    0x6969,      // NFS (v2, v3, v4)
    0x65735546,  // FUSE (sshfs, s3fs, gcsfuse, JuiceFS, ...)
    0x00c36400,  // CephFS
    0x0BD00BD0,  // Lustre
    0xFE534D42,  // SMB2/SMB3 (cifs.ko)
    0xFF534D42,  // CIFS
    0x517B,      // SMB (the old smbfs)
    0x01021997,  // 9P (v9fs: virtio-9p, WSL)
    0x47504653,  // GPFS (IBM Spectrum Scale)
    0x5346414F,  // AFS (kAFS)
    0x6B414653,  // AFS (OpenAFS)
    0x7461636F,  // OCFS2
    0x01161970,  // GFS2
    0x564C,      // NCP (NetWare)
    0x73757245,  // Coda
    0x013111A8,  // IBRIX
    0xAAD7AAEA,  // PanFS
    0xBEEFDEAD,  // StorNext (snfs)
};

}  // namespace

bool is_network_file_system_type(std::uint64_t type) {
  return std::find(kNetworkTypes.begin(), kNetworkTypes.end(), type) != kNetworkTypes.end();
}

std::optional<std::uint64_t> file_system_type(const std::string& path) {
  struct statfs st {};
  if (::statfs(path.c_str(), &st) != 0) return std::nullopt;
  return static_cast<std::uint64_t>(st.f_type);
}

bool on_network_file_system(const std::string& path) {
  const std::optional<std::uint64_t> type = file_system_type(path);
  return type && is_network_file_system_type(*type);
}

}  // namespace draftfeed
