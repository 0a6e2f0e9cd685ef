// Reader for GGUF model files (versions 2 and 3), memory-mapped and bounds-checked.
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
#include "kernels/cpu/matmul.h"

namespace winnow::model {

// On-disk ids of GGUF metadata value types.
enum class GgufValueType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};

std::string_view GgufValueTypeName(GgufValueType type);

// One metadata value. Scalars live in the matching field; arrays hold their elements (all of
// `array_type`) in `array`.
struct GgufValue {
  GgufValueType type = GgufValueType::kUint8;
  uint64_t u = 0;      // unsigned integers and bool
  int64_t i = 0;       // signed integers
  double f = 0;        // float32 / float64
  std::string s;       // string
  GgufValueType array_type = GgufValueType::kUint8;
  std::vector<GgufValue> array;
};

struct GgufTensor {
  std::string name;
  kernels::GgmlType type = kernels::GgmlType::kF32;
  std::vector<int64_t> dims;   // ggml order: dims[0] is the contiguous one
  int64_t num_elements = 0;
  uint64_t offset = 0;         // relative to the start of the data section
  const uint8_t* data = nullptr;
  uint64_t nbytes = 0;

  // View as a matrix of dims[1] rows x dims[0] columns (1-D tensors: 1 row).
  kernels::WeightMatrix AsMatrix() const;
};

class GgufFile {
 public:
  // Maps and parses the file. Every length, count, offset and type is checked against the file
  // size; a truncated or malformed file gives an InvalidArgument/DataLoss error naming what is
  // wrong (which key, which tensor), never a crash.
  static absl::StatusOr<std::unique_ptr<GgufFile>> Open(const std::string& path);
  // The same checks on an image held in memory (the fuzz targets, vocabularies built in code).
  // The file keeps `bytes`, so tensor data points into them; `name` stands for the path in
  // errors.
  static absl::StatusOr<std::unique_ptr<GgufFile>> FromBytes(std::string bytes,
                                                             std::string name = "<memory>");
  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  const std::string& path() const { return path_; }

  // Metadata in file order.
  const std::vector<std::pair<std::string, GgufValue>>& metadata() const { return metadata_; }
  const GgufValue* Find(std::string_view key) const;

  // Typed accessors: NotFound when absent, InvalidArgument (naming the key and the stored type)
  // when the type does not fit. GetInt accepts any integer type, GetFloat any number.
  absl::StatusOr<std::string> GetString(std::string_view key) const;
  absl::StatusOr<int64_t> GetInt(std::string_view key) const;
  absl::StatusOr<double> GetFloat(std::string_view key) const;
  absl::StatusOr<bool> GetBool(std::string_view key) const;
  absl::StatusOr<std::vector<std::string>> GetStringArray(std::string_view key) const;
  absl::StatusOr<std::vector<int64_t>> GetIntArray(std::string_view key) const;
  absl::StatusOr<std::vector<double>> GetFloatArray(std::string_view key) const;

  const std::vector<GgufTensor>& tensors() const { return tensors_; }
  const GgufTensor* FindTensor(std::string_view name) const;

 private:
  GgufFile() = default;
  // Parses the mapped bytes into the members below; errors name the item and its file offset.
  absl::Status Parse();

  std::string path_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  const uint8_t* map_ = nullptr;  // mapping_'s bytes, or owned_'s
  uint64_t map_size_ = 0;
  std::unique_ptr<base::MappedFile> mapping_;
  std::string owned_;
  uint64_t data_offset_ = 0;  // start of the tensor data section in the file
  std::vector<std::pair<std::string, GgufValue>> metadata_;
  absl::flat_hash_map<std::string, size_t> metadata_index_;
  std::vector<GgufTensor> tensors_;
  absl::flat_hash_map<std::string, size_t> tensor_index_;
};

}  // namespace winnow::model
