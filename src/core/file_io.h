// Small file helpers shared by the .npy and safetensors readers/writers: a bounded reader of
// regular files and an atomic writer (a temporary file in the same folder, renamed over the target
// at the end, removed on any failure), so that a reader never sees a half-written file.
#pragma once
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include "attn/error.h"

namespace attn::io_detail {

// Reads a regular file front to back; every read is checked against the size known at open.
class FileReader {
 public:
  FileReader(const std::string& path, const char* fn) : path_(path), fn_(fn) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) fail(fmt::format("cannot open: {}", std::strerror(errno)));
    struct stat st {};
    if (::fstat(fd_, &st) != 0) fail(fmt::format("cannot stat: {}", std::strerror(errno)));
    if (!S_ISREG(st.st_mode)) fail("not a regular file");
    size_ = static_cast<uint64_t>(st.st_size);
  }
  ~FileReader() {
    if (fd_ >= 0) ::close(fd_);
  }
  FileReader(const FileReader&) = delete;
  FileReader& operator=(const FileReader&) = delete;

  uint64_t size() const { return size_; }
  uint64_t position() const { return pos_; }
  uint64_t remaining() const { return size_ - pos_; }

  // Reads exactly n bytes or throws, naming `what` (the part of the file being read).
  void read(void* dst, uint64_t n, const char* what) {
    if (n > remaining()) {
      fail(fmt::format("truncated: {} needs {} bytes at offset {}, the file has {} left", what, n,
                       pos_, remaining()));
    }
    char* p = static_cast<char*>(dst);
    uint64_t left = n;
    while (left > 0) {
      const size_t chunk = static_cast<size_t>(std::min<uint64_t>(left, uint64_t{1} << 30));
      const ssize_t got = ::read(fd_, p, chunk);
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) {
        fail(fmt::format("read error in {} at offset {}: {}", what, pos_,
                         got == 0 ? "unexpected end of file" : std::strerror(errno)));
      }
      p += got;
      left -= static_cast<uint64_t>(got);
      pos_ += static_cast<uint64_t>(got);
    }
  }

  [[noreturn]] void fail(const std::string& msg) const {
    throw Error(fmt::format("{}: '{}': {}", fn_, path_, msg));
  }

 private:
  std::string path_;
  const char* fn_;
  int fd_ = -1;
  uint64_t size_ = 0;
  uint64_t pos_ = 0;
};

// Writes a file atomically: open() creates a temporary next to `path` (so that rename() stays
// within one file system), write() appends, commit() renames it over `path`. Destroyed without
// commit(), it removes the temporary: an exception anywhere leaves neither a partial file nor a
// stray temporary.
class AtomicWriter {
 public:
  AtomicWriter(const std::string& path, const char* fn) : path_(path), fn_(fn) {
    static std::atomic<unsigned> counter{0};
    const size_t slash = path.find_last_of('/');
    const std::string dir = slash == std::string::npos ? std::string() : path.substr(0, slash + 1);
    const std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
    if (base.empty()) fail(path_, "the path names a folder, not a file");
    for (int attempt = 0; attempt < 100; ++attempt) {
      tmp_ = fmt::format("{}.{}.tmp-{}-{}", dir, base, static_cast<long>(::getpid()),
                         counter.fetch_add(1));
      fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);  // umask applies
      if (fd_ >= 0 || errno != EEXIST) break;
    }
    if (fd_ < 0)
      fail(path_,
           fmt::format("cannot create a temporary file next to it: {}", std::strerror(errno)));
  }
  ~AtomicWriter() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(tmp_.c_str());
  }
  AtomicWriter(const AtomicWriter&) = delete;
  AtomicWriter& operator=(const AtomicWriter&) = delete;

  void write(const void* src, uint64_t n) {
    const char* p = static_cast<const char*>(src);
    while (n > 0) {
      const size_t chunk = static_cast<size_t>(std::min<uint64_t>(n, uint64_t{1} << 30));
      const ssize_t put = ::write(fd_, p, chunk);
      if (put < 0 && errno == EINTR) continue;
      if (put <= 0) fail(tmp_, fmt::format("write error: {}", std::strerror(errno)));
      p += put;
      n -= static_cast<uint64_t>(put);
    }
  }

  void commit() {
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) fail(tmp_, fmt::format("write error on close: {}", std::strerror(errno)));
    if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
      fail(path_,
           fmt::format("cannot rename the temporary file into place: {}", std::strerror(errno)));
    }
    committed_ = true;
  }

 private:
  [[noreturn]] void fail(const std::string& which, const std::string& msg) const {
    throw Error(fmt::format("{}: '{}': {}", fn_, which, msg));
  }

  std::string path_;
  const char* fn_;
  std::string tmp_;
  int fd_ = -1;
  bool committed_ = false;
};

}  // namespace attn::io_detail
