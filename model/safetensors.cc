#include "model/safetensors.h"

#include <cstring>
#include <filesystem>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/file.h"
#include "base/status_macros.h"
#include "nlohmann/json.hpp"

namespace winnow::model {
namespace {

using nlohmann::json;

// A header larger than this is not a checkpoint's (real ones are a few MiB at most).
constexpr uint64_t kMaxHeaderBytes = uint64_t{100} << 20;

// Bytes per element of each dtype the format defines; 0 for unknown names.
uint64_t ElementBytes(const std::string& dtype) {
  if (dtype == "F64" || dtype == "I64" || dtype == "U64") return 8;
  if (dtype == "F32" || dtype == "I32" || dtype == "U32") return 4;
  if (dtype == "F16" || dtype == "BF16" || dtype == "I16" || dtype == "U16") return 2;
  if (dtype == "I8" || dtype == "U8" || dtype == "BOOL" || dtype == "F8_E4M3" ||
      dtype == "F8_E5M2") {
    return 1;
  }
  return 0;
}

absl::Status Malformed(const std::string& what) { return absl::InvalidArgumentError(what); }

// One header entry into a tensor whose bytes lie within `data_size`; errors name the tensor.
absl::StatusOr<SafetensorsTensor> ParseEntry(const std::string& name, const json& entry,
                                             const uint8_t* data, uint64_t data_size) {
  if (!entry.is_object() || !entry.contains("dtype") || !entry["dtype"].is_string() ||
      !entry.contains("shape") || !entry["shape"].is_array() ||
      !entry.contains("data_offsets") || !entry["data_offsets"].is_array() ||
      entry["data_offsets"].size() != 2) {
    return Malformed(absl::StrCat("tensor ", name, ": needs dtype, shape and data_offsets"));
  }
  SafetensorsTensor t;
  t.name = name;
  t.dtype = entry["dtype"].get<std::string>();
  const uint64_t element_bytes = ElementBytes(t.dtype);
  if (element_bytes == 0) {
    return Malformed(absl::StrCat("tensor ", name, ": unknown dtype ", t.dtype));
  }
  uint64_t elements = 1;
  for (const json& d : entry["shape"]) {
    if (!d.is_number_unsigned() || d.get<uint64_t>() > (uint64_t{1} << 40)) {
      return Malformed(absl::StrCat("tensor ", name, ": bad shape ", entry["shape"].dump()));
    }
    t.shape.push_back(d.get<int64_t>());
    elements *= d.get<uint64_t>();
    if (elements > (uint64_t{1} << 50)) {
      return Malformed(absl::StrCat("tensor ", name, ": shape too large"));
    }
  }
  const json& offsets = entry["data_offsets"];
  if (!offsets[0].is_number_unsigned() || !offsets[1].is_number_unsigned()) {
    return Malformed(absl::StrCat("tensor ", name, ": bad data_offsets"));
  }
  const uint64_t begin = offsets[0].get<uint64_t>();
  const uint64_t end = offsets[1].get<uint64_t>();
  if (begin > end || end > data_size) {
    return Malformed(absl::StrCat("tensor ", name, ": data_offsets [", begin, ", ", end,
                                  ") outside the ", data_size, " bytes of data"));
  }
  if (end - begin != elements * element_bytes) {
    return Malformed(absl::StrCat("tensor ", name, ": ", end - begin, " bytes for ", elements,
                                  " ", t.dtype, " elements"));
  }
  t.data = data + begin;
  t.nbytes = end - begin;
  return t;
}

}  // namespace

bool SafetensorsTensor::KernelType(kernels::GgmlType* type) const {
  if (dtype == "F32") {
    *type = kernels::GgmlType::kF32;
  } else if (dtype == "F16") {
    *type = kernels::GgmlType::kF16;
  } else if (dtype == "BF16") {
    *type = kernels::GgmlType::kBF16;
  } else {
    return false;
  }
  return true;
}

int64_t SafetensorsTensor::elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  absl::StatusOr<std::unique_ptr<base::MappedFile>> mapping = base::MappedFile::Open(path);
  if (!mapping.ok()) {
    return absl::Status(mapping.status().code(),
                        absl::StrCat(path, ": ", mapping.status().message()));
  }
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  file->bytes_ = (*mapping)->data();
  file->size_ = (*mapping)->size();
  file->mapping_ = *std::move(mapping);
  if (absl::Status s = file->Parse(); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(path, ": ", s.message()));
  }
  return file;
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::FromBytes(std::string bytes,
                                                                            std::string name) {
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = std::move(name);
  file->owned_ = std::move(bytes);
  file->bytes_ = reinterpret_cast<const uint8_t*>(file->owned_.data());
  file->size_ = file->owned_.size();
  if (absl::Status s = file->Parse(); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(file->path_, ": ", s.message()));
  }
  return file;
}

absl::Status SafetensorsFile::Parse() {
  if (size_ < 8) return Malformed(absl::StrCat("file is ", size_, " bytes, shorter than a header"));
  uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i) header_bytes = header_bytes << 8 | bytes_[i];  // little-endian
  if (header_bytes > kMaxHeaderBytes || header_bytes > size_ - 8) {
    return Malformed(absl::StrCat("header length ", header_bytes, " does not fit the file"));
  }
  const json header = json::parse(bytes_ + 8, bytes_ + 8 + header_bytes, nullptr,
                                  /*allow_exceptions=*/false);
  if (!header.is_object()) return Malformed("the header is not a JSON object");
  const uint8_t* data = bytes_ + 8 + header_bytes;
  const uint64_t data_size = size_ - 8 - header_bytes;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    WINNOW_ASSIGN_OR_RETURN(SafetensorsTensor t, ParseEntry(name, entry, data, data_size));
    t.file = &path_;
    tensors_.push_back(std::move(t));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<SafetensorsCheckpoint>> SafetensorsCheckpoint::Open(
    const std::string& dir) {
  const std::filesystem::path root(dir);
  std::vector<std::string> shards;
  const std::filesystem::path index_path = root / "model.safetensors.index.json";
  if (std::filesystem::exists(index_path)) {
    const std::optional<std::string> text = base::ReadWholeFile(index_path.string());
    const json index = json::parse(text.value_or(""), nullptr, /*allow_exceptions=*/false);
    if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(index_path.string(), ": needs a weight_map object"));
    }
    std::set<std::string> seen;
    for (const auto& [tensor, shard] : index["weight_map"].items()) {
      if (!shard.is_string() || shard.get<std::string>().find('/') != std::string::npos) {
        return absl::InvalidArgumentError(absl::StrCat(
            index_path.string(), ": weight_map.", tensor, " must name a file in ", dir));
      }
      if (seen.insert(shard.get<std::string>()).second) shards.push_back(shard);
    }
  } else {
    shards.push_back("model.safetensors");
  }
  auto checkpoint = std::make_unique<SafetensorsCheckpoint>();
  for (const std::string& shard : shards) {
    WINNOW_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file,
                            SafetensorsFile::Open((root / shard).string()));
    for (const SafetensorsTensor& t : file->tensors()) {
      if (!checkpoint->index_.emplace(t.name, &t).second) {
        return absl::InvalidArgumentError(
            absl::StrCat(file->path(), ": tensor ", t.name, " is also in another shard"));
      }
    }
    checkpoint->files_.push_back(std::move(file));
  }
  return checkpoint;
}

const SafetensorsTensor* SafetensorsCheckpoint::Find(std::string_view name) const {
  auto it = index_.find(std::string(name));
  return it == index_.end() ? nullptr : it->second;
}

}  // namespace winnow::model
