// Reading a small control file (a dataset's state.json, a pack's manifest.json, a port file) whole,
// safely, whatever the name now names.
//
// Why: such files are read by name from folders the user gave, which anything may have changed.
// A plain read of one misbehaves on what a name can hold: a FIFO blocks the open (and the loader
// or `draftfeed inspect` hangs), a link to /dev/zero reads until memory runs out, a file grown to
// gigabytes (a lying or runaway writer) is allocated whole, a file rewritten while it is read
// gives a mix of two versions. So a control file is
//   * opened O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC, and O_NOFOLLOW unless links are
//     followed (ControlFileLinks): the open of a FIFO never blocks, a link is refused;
//   * checked with fstat of the descriptor opened to be a regular file (a FIFO, socket, device or
//     folder is refused, naming what it is);
//   * bounded: its size is compared with the caller's maximum before anything is allocated;
//   * read exactly: its size's bytes, no fewer (it shrank) and no more (it grew), and the size
//     again after the read: a file that changes size while read is an error, never a mix.
// Errors name the file and the reason: kNotFound (no such file), kUnsupported ("is a FIFO, not a
// regular file"), kInvalidArgument ("is a symbolic link"), kFormat ("is 5.37 GB (5368709120
// bytes), more than the 1 GiB a manifest may be"), kIo (the OS refused, or the size changed while
// it was read).
// Thread safety: reentrant.
#pragma once

#include <cstdint>
#include <string>

#include "draftfeed/common/error.h"
#include "draftfeed/common/held_file.h"

namespace draftfeed {

// Whether a control file may be a symbolic link (to a regular file).
enum class ControlFileLinks {
  kRefuse,  // O_NOFOLLOW: for files draftfeed itself writes (a pack's manifest)
  kFollow,  // for files of folders others lay out: a Hugging Face hub snapshot's files are links
            // into its blob store. The file linked to must still be a regular file.
};

// How to read one control file.
struct ControlFileRules {
  std::uint64_t max_bytes = 0;  // larger is refused before anything is allocated
  std::string what;             // what the file is, for the size message: "a manifest"
  ControlFileLinks links = ControlFileLinks::kRefuse;
};

// A control file's bytes, and which file they came from.
struct ControlFile {
  std::string bytes;
  FileIdentity identity;         // device and inode of the file read
  std::int64_t modified_ns = 0;  // its mtime, nanoseconds since the epoch
};

// Reads `name` in the folder open at `folder` (for messages, `folder_path`/`name`). `name` is
// opened relative to the folder's descriptor, so a folder renamed or replaced meanwhile does not
// redirect the read.
Result<ControlFile> read_control_file_at(int folder, const std::string& folder_path,
                                         const std::string& name, const ControlFileRules& rules);

// Reads the file at `path` (relative to the working folder when not absolute).
Result<ControlFile> read_control_file(const std::string& path, const ControlFileRules& rules);

// A byte count as people read it: "812 bytes", "3.20 MB", "5.37 GB" (powers of 1000), or with the
// binary unit when exact ("1 GiB", "64 KiB").
std::string byte_count_text(std::uint64_t bytes);

}  // namespace draftfeed
