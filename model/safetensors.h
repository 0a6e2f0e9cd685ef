// Safetensors checkpoints as Hugging Face writes them: one `model.safetensors`, or shards named
// by `model.safetensors.index.json`. Each file is memory-mapped; a tensor is a view into its
// mapping. The format: an 8-byte little-endian header length, a JSON header naming each
// tensor's dtype, shape and byte range in the data that follows, then the data.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "base/mapped_file.h"
#include "kernels/cpu/ggml_types.h"

namespace winnow::model {

struct SafetensorsTensor {
  std::string name;
  std::string dtype;             // as the header writes it: "BF16", "F16", "F32", "I64", ...
  std::vector<int64_t> shape;    // outermost first, as torch
  const uint8_t* data = nullptr;
  uint64_t nbytes = 0;
  const std::string* file = nullptr;  // the shard it lives in, for errors

  // The weight type for dtypes the kernels read (F32, F16, BF16); false otherwise.
  bool KernelType(kernels::GgmlType* type) const;
  int64_t elements() const;
};

class SafetensorsFile {
 public:
  // Maps and parses the file; every offset and size is checked against the file, so a
  // truncated or malformed file is an InvalidArgument naming the file and the tensor.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  // The same checks on bytes held in memory (tests, the fuzz target).
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> FromBytes(std::string bytes,
                                                                    std::string name);
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }

 private:
  SafetensorsFile() = default;
  absl::Status Parse();

  std::string path_;
  std::unique_ptr<base::MappedFile> mapping_;  // or owned_ holds the bytes
  std::string owned_;
  const uint8_t* bytes_ = nullptr;
  uint64_t size_ = 0;
  std::vector<SafetensorsTensor> tensors_;
};

// Every tensor of a checkpoint directory, whichever shard holds it.
class SafetensorsCheckpoint {
 public:
  // `dir`/model.safetensors.index.json when present (each shard it names, once), else
  // `dir`/model.safetensors. A tensor named twice is an error.
  static absl::StatusOr<std::unique_ptr<SafetensorsCheckpoint>> Open(const std::string& dir);

  const SafetensorsTensor* Find(std::string_view name) const;
  const std::vector<std::unique_ptr<SafetensorsFile>>& files() const { return files_; }

 private:
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  absl::flat_hash_map<std::string, const SafetensorsTensor*> index_;
};

}  // namespace winnow::model
