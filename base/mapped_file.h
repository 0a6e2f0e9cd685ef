// A whole file mapped read-only, for model files whose weights are read in place (model/gguf.h,
// model/safetensors.h).
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace winnow::base {

class MappedFile {
 public:
  // Errors carry errno's reason; the caller names the file. An empty file maps to no bytes
  // (mmap refuses a zero length), so the caller's own size check reports it.
  static absl::StatusOr<std::unique_ptr<MappedFile>> Open(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return absl::ErrnoToStatus(errno, "cannot open");
    struct stat st;
    if (::fstat(fd, &st) != 0) {
      const int err = errno;
      ::close(fd);
      return absl::ErrnoToStatus(err, "cannot stat");
    }
    if (!S_ISREG(st.st_mode)) {
      ::close(fd);
      return absl::InvalidArgumentError("not a regular file");
    }
    if (st.st_size == 0) {
      ::close(fd);
      return std::unique_ptr<MappedFile>(new MappedFile(nullptr, 0));
    }
    void* map = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
    const int map_err = errno;
    ::close(fd);  // the mapping keeps its own reference to the file
    if (map == MAP_FAILED) return absl::ErrnoToStatus(map_err, "cannot mmap");
    return std::unique_ptr<MappedFile>(
        new MappedFile(static_cast<const uint8_t*>(map), static_cast<uint64_t>(st.st_size)));
  }
  ~MappedFile() {
    if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }

 private:
  MappedFile(const uint8_t* data, uint64_t size) : data_(data), size_(size) {}
  const uint8_t* data_;
  uint64_t size_;
};

}  // namespace winnow::base
