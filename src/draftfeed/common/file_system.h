// Which kind of file system a path lies on, as far as reading a file already in the page cache is
// concerned: whether a read() of it may wait for a server.
//
// On NFS, a read() of a file whose cached attributes are older than the attribute cache's timeout
// (acregmin, 3 s by default) first sends a GETATTR to the server (nfs_file_read ->
// nfs_revalidate_mapping), even when every byte it asks for is in the page cache; FUSE does the
// same with auto_inval_data (libfuse's default: every read() asks for the attributes when they are
// stale), and so do the other clients that revalidate their cache on read (CephFS, Lustre, SMB,
// 9P, ...). A page fault on a mapping of cached pages asks nothing. So on such a file system a
// file opened ahead and read more than the attribute timeout later costs one round trip per file
// in the read, however far ahead its bytes were read; through its mapping, none.
// Thread safety: the functions are pure (statfs aside).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace draftfeed {

// Whether statfs's f_type names a network, cluster or FUSE file system (a read may be a round
// trip): NFS, SMB/CIFS, CephFS, Lustre, GPFS, AFS, 9P, OCFS2, GFS2, FUSE (sshfs, s3fs, gcsfuse,
// JuiceFS, ...) and the like. Local file systems (ext4, xfs, btrfs, tmpfs, overlayfs, ...): false.
bool is_network_file_system_type(std::uint64_t type);

// statfs(path)'s f_type, or nothing when statfs fails (the path does not exist, ...).
std::optional<std::uint64_t> file_system_type(const std::string& path);

// Whether `path` lies on a file system of is_network_file_system_type (false when statfs fails).
bool on_network_file_system(const std::string& path);

}  // namespace draftfeed
