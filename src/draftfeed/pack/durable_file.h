// Files that are either there whole or not at all, after a crash or a power loss: written to a
// temporary file beside the target (`.<name>.tmp-<host>-<pid>-<n>`: common/held_file.h's
// process_unique_name, so that writers on two hosts sharing a folder never take each other's
// name), fsynced, renamed over the target, then
// the folder fsynced so that the rename itself is on disk. What packed caches need: a shard or a
// manifest a reader finds is complete, and the manifest naming a shard is written only once the
// shard is durable.
#pragma once

#include <cstdint>
#include <span>
#include <string>

namespace draftfeed {

// Writes the concatenation of `pieces` to `path` as above. Throws Error(kIo) naming the file and
// what failed; the temporary file is removed then.
void write_file_durably(const std::string& path,
                        std::span<const std::span<const std::uint8_t>> pieces);

// The first half of write_file_durably: the pieces written to a new temporary file beside `path`
// (named as above), fsynced and closed; returns its path. The caller renames it into place with
// rename_durably (or removes it). Throws Error(kIo) naming the file; nothing is left then.
std::string write_temporary_durably(const std::string& path,
                                    std::span<const std::span<const std::uint8_t>> pieces);
// Renames `temporary` over `path` and fsyncs the folder. Throws Error(kIo) naming both (the
// temporary is removed then).
void rename_durably(const std::string& temporary, const std::string& path);

// fsync of a folder (after a rename or an unlink in it). Throws Error(kIo) naming it.
void sync_folder(const std::string& folder);

// Removes the temporaries of pack files (`.shard-*` and `.manifest.json` names, as above) that a
// killed writer of this host left: those whose host is this one and whose pid no longer runs;
// returns how many. Those of live processes, of other hosts (whose pids mean nothing here) and
// names of any other form are left alone.
std::int64_t remove_dead_temporaries(const std::string& folder);

}  // namespace draftfeed
