// A read-only memory mapping of a whole file, shared by every view into it.
//
// Views (Arrow columns, safetensors tensors) hold a `std::shared_ptr<const MappedFile>` so the
// mapping outlives every pointer into it, including arrays handed to Python.
//
// A mapping shows the file as it is now, not as it was when mapped: another process that truncates
// or rewrites the file changes what the views read (a read past a new, shorter end raises SIGBUS;
// see fault_guard.h). `change_since_mapped()` tells a reader whether that happened, so a copy taken
// from a file that changed meanwhile can be discarded.
//
// A mapping opened with `keep_descriptor` keeps its file open: a reader can then read the file
// through it (`read_at`, without opening it again: on a network file system every open is a round
// trip; and without the page-table work a mapping costs, see read_at) and change_since_mapped()
// asks the open file instead of its path (no name lookup, and the attributes the kernel has: no
// round trip either). One opened `header_only` reads, when a page is first touched, that page alone
// (MADV_RANDOM: no read-around), until advise_normal(): for a file whose header is read at once and
// whose bytes are read later through the descriptor, so that touching the header does not read the
// megabyte around it (opening thousands of files ahead, that read-around would take the bandwidth
// the next batch needs). Thread safety: immutable after `open`; any number of threads may read.
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "draftfeed/common/error.h"

namespace draftfeed {

// How MappedFile::open maps a file (see above).
struct MapOptions {
  bool keep_descriptor = false;
  bool header_only = false;
};

// How the loader's sources (and verify's read baseline) map cache files: the descriptor kept, for
// the read-ahead reads the files through it, and so may the batch copy (batch/file_rows_copy.h);
// through the mapping only the header, token ids and scales are read, without the kernel's
// read-around, until the fetch ends that for a file whose rows are copied from the mapping.
inline constexpr MapOptions kMapForRowReads{.keep_descriptor = true, .header_only = true};

class MappedFile {
 public:
  // Maps `path` read-only. A missing file is ErrorKind::kNotFound; a folder or a file the OS will
  // not map is ErrorKind::kIo. An empty file maps to an empty span (no mmap call).
  static Result<std::shared_ptr<const MappedFile>> open(const std::string& path,
                                                        MapOptions options = {});

  // Maps the file open at `fd`, which it takes over (closed now, or with the mapping when
  // keep_descriptor); `path` names it in messages and for change_since_mapped() without a kept
  // descriptor. For a file opened by its folder's descriptor (common/held_file.h): what was
  // checked is what is mapped. Errors as open's.
  static Result<std::shared_ptr<const MappedFile>> map_descriptor(int fd, std::string path,
                                                                  MapOptions options = {});

  // Same as open, but throws the Error.
  static std::shared_ptr<const MappedFile> open_or_throw(const std::string& path);

  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::uint8_t* data() const { return data_; }
  std::size_t size() const { return size_; }
  std::span<const std::uint8_t> bytes() const { return {data_, size_}; }
  const std::string& path() const { return path_; }
  // The open file (keep_descriptor), else -1. Owned by the mapping: do not close it.
  int fd() const { return fd_; }

  // Copies up to `length` bytes from `offset` into `out` through the kept descriptor (pread;
  // retried on EINTR and short reads) and returns how many it copied: fewer when the file is now
  // shorter (truncated by another process). Why not the mapping: reading a mapping of the page
  // cache costs a page fault per few pages to map them and a TLB shootdown to unmap them, which
  // can cost as much CPU as the copy itself (docs/decisions.md); a read copies from the page cache
  // with no page tables at all. An I/O error is ErrorKind::kIo naming the file. Needs
  // keep_descriptor.
  Result<std::size_t> read_at(std::size_t offset, std::size_t length, std::uint8_t* out) const;
  // The same for the bytes from `offset` on, scattered over `parts` in order (preadv; at most
  // IOV_MAX parts). `parts` is consumed: its entries are advanced past what was read.
  Result<std::size_t> read_at(std::size_t offset, std::span<iovec> parts) const;

  // Ends `header_only`: touched pages are read with the kernel's read-around again (MADV_NORMAL):
  // for a file whose rows are copied through the mapping (CacheCopy's default).
  void advise_normal() const;

  // Drops this process's page-table entries for the whole pages inside [offset, offset + length)
  // (MADV_DONTNEED on a shared read-only mapping): the pages stay in the page cache, and a later
  // read of them faults them in again. Why: a page of the cache mapped by this process counts in
  // its memory (RSS, PSS) until unmapped, so a loader that keeps a batch's files mapped while it
  // assembles the batch holds that batch's bytes twice. Never an error.
  void release(std::size_t offset, std::size_t length) const;
  // The same for the bytes [begin, end) if they lie inside this mapping.
  void release(const std::uint8_t* begin, const std::uint8_t* end) const;

  // Why the mapped file no longer holds the bytes it held when mapped ("changed size from A to B
  // bytes", "was modified"), or nothing. Looks at the mapped file itself when its descriptor is
  // kept (statx with AT_STATX_DONT_SYNC: the attributes the kernel holds, which on a network file
  // system may lag a writer on another host, as its reads would), else at the file now at path()
  // (one stat): when that is another file (the path was replaced by a rename) or none (deleted),
  // the mapped file lives on unchanged and this returns nothing.
  std::optional<std::string> change_since_mapped() const;

 private:
  // What identifies the file and its contents when it was mapped.
  struct Identity {
    std::uint64_t device = 0;
    std::uint64_t inode = 0;
    std::int64_t modified_ns = 0;
  };
  MappedFile(std::string path, const std::uint8_t* data, std::size_t size, Identity identity,
             int fd)
      : path_(std::move(path)), data_(data), size_(size), identity_(identity), fd_(fd) {}
  std::string path_;
  const std::uint8_t* data_;
  std::size_t size_;
  Identity identity_;
  int fd_;
};

}  // namespace draftfeed
