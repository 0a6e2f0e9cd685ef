#include "model/gguf.h"

#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "base/status_macros.h"
#include "kernels/cpu/dequantize.h"

namespace winnow::model {
namespace {

using kernels::GgmlType;
using kernels::GgmlTypeTraits;

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian uint32
constexpr uint64_t kDefaultAlignment = 32;
constexpr uint32_t kMaxDims = 4;  // GGML_MAX_DIMS
// Nesting deeper than this is never produced by real writers; bounding it keeps the recursive
// reader's stack use bounded on hostile input.
constexpr int kMaxArrayDepth = 8;
// Each element becomes a GgufValue (~150 bytes), so a file-size bound alone would let a few
// hundred MB of uint8 array expand to tens of GB. Real vocabularies are < 1M entries.
constexpr uint64_t kMaxArrayLength = uint64_t{1} << 24;

absl::string_view AbslView(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// Bytes a value of this type occupies at minimum; 0 for an unknown type.
uint64_t MinValueBytes(uint32_t type) {
  switch (static_cast<GgufValueType>(type)) {
    case GgufValueType::kUint8:
    case GgufValueType::kInt8:
    case GgufValueType::kBool:
      return 1;
    case GgufValueType::kUint16:
    case GgufValueType::kInt16:
      return 2;
    case GgufValueType::kUint32:
    case GgufValueType::kInt32:
    case GgufValueType::kFloat32:
      return 4;
    case GgufValueType::kUint64:
    case GgufValueType::kInt64:
    case GgufValueType::kFloat64:
    case GgufValueType::kString:  // the length prefix
      return 8;
    case GgufValueType::kArray:  // element type + count
      return 12;
  }
  return 0;
}

bool IsInteger(GgufValueType t) {
  switch (t) {
    case GgufValueType::kUint8:
    case GgufValueType::kInt8:
    case GgufValueType::kUint16:
    case GgufValueType::kInt16:
    case GgufValueType::kUint32:
    case GgufValueType::kInt32:
    case GgufValueType::kUint64:
    case GgufValueType::kInt64:
      return true;
    default:
      return false;
  }
}

bool IsUnsigned(GgufValueType t) {
  return t == GgufValueType::kUint8 || t == GgufValueType::kUint16 ||
         t == GgufValueType::kUint32 || t == GgufValueType::kUint64;
}

bool IsFloat(GgufValueType t) {
  return t == GgufValueType::kFloat32 || t == GgufValueType::kFloat64;
}

// Sequential little-endian reader over the mapped file. Every read checks the remaining length
// first; errors name `what` is being read and the offset where it starts.
class Reader {
 public:
  Reader(const uint8_t* base, uint64_t size) : base_(base), size_(size) {}

  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return size_ - pos_; }

  absl::Status Need(uint64_t n, std::string_view what) const {
    if (n > remaining()) {
      return absl::DataLossError(absl::StrCat("file ends inside ", AbslView(what), ": need ", n,
                                              " bytes at offset ", pos_, " but the file has ",
                                              size_, " bytes"));
    }
    return absl::OkStatus();
  }

  template <typename T>
  absl::Status Read(T* out, std::string_view what) {
    WINNOW_RETURN_IF_ERROR(Need(sizeof(T), what));
    std::memcpy(out, base_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return absl::OkStatus();
  }

  absl::Status ReadString(std::string* out, std::string_view what) {
    const uint64_t start = pos_;
    uint64_t len = 0;
    WINNOW_RETURN_IF_ERROR(Read(&len, what));
    if (len > remaining()) {
      pos_ = start;
      return absl::DataLossError(absl::StrCat(AbslView(what), ": string length ", len,
                                              " at offset ", start, " runs past the end of the ",
                                              size_, "-byte file"));
    }
    out->assign(reinterpret_cast<const char*>(base_ + pos_), len);
    pos_ += len;
    return absl::OkStatus();
  }

 private:
  const uint8_t* base_;
  uint64_t size_;
  uint64_t pos_ = 0;
};

absl::Status ReadValue(Reader& r, GgufValueType type, int depth, const std::string& what,
                       GgufValue* out);

absl::Status ReadArray(Reader& r, int depth, const std::string& what, GgufValue* out) {
  const uint64_t start = r.pos();
  uint32_t elem_type = 0;
  uint64_t count = 0;
  WINNOW_RETURN_IF_ERROR(r.Read(&elem_type, what + " (array element type)"));
  WINNOW_RETURN_IF_ERROR(r.Read(&count, what + " (array length)"));
  const uint64_t min_bytes = MinValueBytes(elem_type);
  if (min_bytes == 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": unknown array element type ",
                                                   elem_type, " at offset ", start));
  }
  if (elem_type == static_cast<uint32_t>(GgufValueType::kArray) && depth + 1 >= kMaxArrayDepth) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": arrays nested deeper than ",
                                                   kMaxArrayDepth, " at offset ", start));
  }
  if (count > r.remaining() / min_bytes) {
    return absl::DataLossError(absl::StrCat(what, ": array length ", count, " at offset ", start,
                                            " needs at least ", min_bytes, " bytes each but only ",
                                            r.remaining(), " bytes remain"));
  }
  if (count > kMaxArrayLength) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": array length ", count, " at offset ",
                                                   start, " exceeds the limit of ",
                                                   kMaxArrayLength));
  }
  out->array_type = static_cast<GgufValueType>(elem_type);
  out->array.resize(count);
  for (uint64_t i = 0; i < count; ++i) {
    WINNOW_RETURN_IF_ERROR(ReadValue(r, out->array_type, depth + 1, what, &out->array[i]));
  }
  return absl::OkStatus();
}

// Reads a little-endian T and widens it into the GgufValue field that holds its kind.
template <typename T, typename Field>
absl::Status ReadScalar(Reader& r, const std::string& what, Field* field) {
  T v = 0;
  WINNOW_RETURN_IF_ERROR(r.Read(&v, what));
  *field = v;
  return absl::OkStatus();
}

absl::Status ReadBool(Reader& r, const std::string& what, GgufValue* out) {
  const uint64_t at = r.pos();
  uint8_t v = 0;
  WINNOW_RETURN_IF_ERROR(r.Read(&v, what));
  if (v > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": bool byte ", v, " at offset ", at, " is neither 0 nor 1"));
  }
  out->u = v;
  return absl::OkStatus();
}

absl::Status ReadValue(Reader& r, GgufValueType type, int depth, const std::string& what,
                       GgufValue* out) {
  out->type = type;
  switch (type) {
    case GgufValueType::kUint8:
      return ReadScalar<uint8_t>(r, what, &out->u);
    case GgufValueType::kInt8:
      return ReadScalar<int8_t>(r, what, &out->i);
    case GgufValueType::kUint16:
      return ReadScalar<uint16_t>(r, what, &out->u);
    case GgufValueType::kInt16:
      return ReadScalar<int16_t>(r, what, &out->i);
    case GgufValueType::kUint32:
      return ReadScalar<uint32_t>(r, what, &out->u);
    case GgufValueType::kInt32:
      return ReadScalar<int32_t>(r, what, &out->i);
    case GgufValueType::kUint64:
      return r.Read(&out->u, what);
    case GgufValueType::kInt64:
      return r.Read(&out->i, what);
    case GgufValueType::kFloat32:
      return ReadScalar<float>(r, what, &out->f);
    case GgufValueType::kFloat64:
      return r.Read(&out->f, what);
    case GgufValueType::kBool:
      return ReadBool(r, what, out);
    case GgufValueType::kString:
      return r.ReadString(&out->s, what);
    case GgufValueType::kArray:
      return ReadArray(r, depth, what, out);
  }
  return absl::InvalidArgumentError(absl::StrCat(what, ": unknown value type ",
                                                 static_cast<uint32_t>(type)));
}

std::string KeyContext(std::string_view key) {
  return absl::StrCat("metadata key '", AbslView(key), "'");
}

absl::Status WrongType(std::string_view key, const GgufValue& v, std::string_view wanted) {
  std::string stored(GgufValueTypeName(v.type));
  if (v.type == GgufValueType::kArray) {
    stored = absl::StrCat("array of ", std::string(GgufValueTypeName(v.array_type)));
  }
  return absl::InvalidArgumentError(absl::StrCat(KeyContext(key), " holds ", stored, ", not ",
                                                 AbslView(wanted)));
}

// Integer value of a scalar integer GgufValue, or an error naming `key`.
absl::StatusOr<int64_t> IntOf(std::string_view key, const GgufValue& v) {
  if (!IsInteger(v.type)) return WrongType(key, v, "an integer");
  if (!IsUnsigned(v.type)) return v.i;
  if (v.u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return absl::OutOfRangeError(absl::StrCat(KeyContext(key), ": value ", v.u,
                                              " does not fit in int64"));
  }
  return static_cast<int64_t>(v.u);
}

absl::StatusOr<double> FloatOf(std::string_view key, const GgufValue& v) {
  if (IsFloat(v.type)) return v.f;
  if (IsInteger(v.type)) {
    return IsUnsigned(v.type) ? static_cast<double>(v.u) : static_cast<double>(v.i);
  }
  return WrongType(key, v, "a number");
}

// The smallest metadata entry is an empty key, a type and one byte; the smallest tensor entry an
// empty name, n_dims, one dim, a type and an offset. Counts that cannot fit are rejected before
// anything is allocated for them.
constexpr uint64_t kMinKvBytes = 8 + 4 + 1;
constexpr uint64_t kMinTensorBytes = 8 + 4 + 8 + 4 + 8;

using Metadata = std::vector<std::pair<std::string, GgufValue>>;
using NameIndex = absl::flat_hash_map<std::string, size_t>;

absl::Status ReadMagic(Reader& r) {
  uint32_t magic = 0;
  WINNOW_RETURN_IF_ERROR(r.Read(&magic, "magic"));
  if (magic == kMagic) return absl::OkStatus();
  // Show the four bytes as text (unprintable ones as '?'): a wrong file type is easier to spot.
  char shown[5] = {};
  std::memcpy(shown, &magic, 4);
  for (char& c : shown) {
    if (c != '\0' && (c < 0x20 || c > 0x7e)) c = '?';
  }
  return absl::InvalidArgumentError(
      absl::StrCat("bad magic '", shown, "' at offset 0 (expected 'GGUF')"));
}

absl::StatusOr<uint32_t> ReadVersion(Reader& r) {
  uint32_t version = 0;
  WINNOW_RETURN_IF_ERROR(r.Read(&version, "version"));
  if (version == 2 || version == 3) return version;
  if (version == 1) {
    return absl::InvalidArgumentError(
        "GGUF version 1 is not supported (only versions 2 and 3); re-convert the model");
  }
  if ((version & 0xffffu) == 0 && (version >> 16) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("version field 0x", absl::Hex(version),
                                                   " looks like a big-endian GGUF, which is "
                                                   "not supported"));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unsupported GGUF version ", version, " (only 2 and 3)"));
}

struct SectionCounts {
  uint64_t tensors = 0;
  uint64_t metadata = 0;
};

absl::StatusOr<SectionCounts> ReadSectionCounts(Reader& r) {
  SectionCounts counts;
  WINNOW_RETURN_IF_ERROR(r.Read(&counts.tensors, "tensor count"));
  WINNOW_RETURN_IF_ERROR(r.Read(&counts.metadata, "metadata count"));
  if (counts.metadata > r.remaining() / kMinKvBytes) {
    return absl::DataLossError(absl::StrCat("metadata count ", counts.metadata,
                                            " at offset 16 cannot fit in the remaining ",
                                            r.remaining(), " bytes"));
  }
  if (counts.tensors > r.remaining() / kMinTensorBytes) {
    return absl::DataLossError(absl::StrCat("tensor count ", counts.tensors,
                                            " at offset 8 cannot fit in the remaining ",
                                            r.remaining(), " bytes"));
  }
  return counts;
}

// Entry `k` of the metadata; `seen` holds the keys before it, so that a duplicate is an error.
absl::Status ReadMetadataEntry(Reader& r, uint64_t k, const NameIndex& seen, std::string* key,
                               GgufValue* value) {
  const uint64_t entry_at = r.pos();
  WINNOW_RETURN_IF_ERROR(r.ReadString(key, absl::StrCat("key of metadata entry ", k)));
  const std::string what = KeyContext(*key);
  if (seen.contains(*key)) {
    return absl::InvalidArgumentError(absl::StrCat("duplicate ", what, " at offset ", entry_at));
  }
  const uint64_t type_at = r.pos();
  uint32_t type = 0;
  WINNOW_RETURN_IF_ERROR(r.Read(&type, what + " (value type)"));
  if (MinValueBytes(type) == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": unknown value type ", type, " at offset ", type_at));
  }
  return ReadValue(r, static_cast<GgufValueType>(type), 0, what, value);
}

absl::Status ReadMetadata(Reader& r, uint64_t count, Metadata* metadata, NameIndex* index) {
  metadata->reserve(count);
  index->reserve(count);
  for (uint64_t k = 0; k < count; ++k) {
    std::string key;
    GgufValue value;
    WINNOW_RETURN_IF_ERROR(ReadMetadataEntry(r, k, *index, &key, &value));
    index->emplace(key, metadata->size());
    metadata->emplace_back(std::move(key), std::move(value));
  }
  return absl::OkStatus();
}

// general.alignment when the file sets it (`a`), else the GGUF default.
absl::StatusOr<uint64_t> AlignmentOf(const GgufValue* a) {
  if (a == nullptr) return kDefaultAlignment;
  WINNOW_ASSIGN_OR_RETURN(const int64_t v, IntOf("general.alignment", *a));
  if (v <= 0 || (v & (v - 1)) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("metadata key 'general.alignment' = ", v, " is not a power of two"));
  }
  // The GGUF spec asks for a multiple of 8. Below that, tensor data can start at an address
  // its type cannot be read from (an F32 row at an odd offset): UBSan found the kernels
  // reading floats through such pointers.
  if (v % 8 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("metadata key 'general.alignment' = ", v,
                                                   " is not a multiple of 8 (GGUF requires it)"));
  }
  return static_cast<uint64_t>(v);
}

// The dimensions and element count of a tensor entry; `what` names the tensor in errors.
absl::Status ReadTensorDims(Reader& r, const std::string& what, GgufTensor* tensor) {
  const uint64_t dims_at = r.pos();
  uint32_t n_dims = 0;
  WINNOW_RETURN_IF_ERROR(r.Read(&n_dims, what + " (dimension count)"));
  if (n_dims == 0 || n_dims > kMaxDims) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": dimension count ", n_dims, " at offset ", dims_at, " is not in 1..", kMaxDims));
  }
  int64_t elements = 1;
  for (uint32_t d = 0; d < n_dims; ++d) {
    const uint64_t dim_at = r.pos();
    uint64_t dim = 0;
    WINNOW_RETURN_IF_ERROR(r.Read(&dim, what + " (dimensions)"));
    if (dim == 0 || dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
        static_cast<int64_t>(dim) > std::numeric_limits<int64_t>::max() / elements) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": dimension ", d, " = ", dim,
                                                     " at offset ", dim_at,
                                                     " is zero or overflows the element count"));
    }
    tensor->dims.push_back(static_cast<int64_t>(dim));
    elements *= static_cast<int64_t>(dim);
  }
  tensor->num_elements = elements;
  return absl::OkStatus();
}

// Bytes of a tensor with these dims and type. Rows must be whole blocks, and every product is
// checked before it is formed: a hostile file must not overflow the size it is checked against.
absl::StatusOr<uint64_t> TensorBytes(const std::string& what, const GgmlTypeTraits& traits,
                                     const GgufTensor& tensor) {
  if (tensor.dims[0] % traits.block_elements != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": first dimension ", tensor.dims[0], " is not a multiple of the ",
                     std::string(traits.name), " block size ", traits.block_elements));
  }
  // A first dimension near 2^63 overflows the row's byte count itself, not only the product
  // with the rows below (found by fuzz/gguf_fuzz.cc).
  const int64_t row_blocks = tensor.dims[0] / traits.block_elements;
  if (row_blocks > std::numeric_limits<int64_t>::max() / traits.block_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": byte size overflows (a row of ",
                                                   tensor.dims[0], " ", std::string(traits.name),
                                                   " elements)"));
  }
  const int64_t row_bytes = row_blocks * traits.block_bytes;
  const int64_t rows = tensor.num_elements / tensor.dims[0];
  if (rows > std::numeric_limits<int64_t>::max() / row_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": byte size overflows (", rows, " rows of ", row_bytes, " bytes)"));
  }
  return static_cast<uint64_t>(rows * row_bytes);
}

// The ggml type of a tensor entry (after its dims) and the byte size it gives the tensor.
absl::Status ReadTensorType(Reader& r, const std::string& what, GgufTensor* tensor) {
  const uint64_t type_at = r.pos();
  uint32_t type_id = 0;
  WINNOW_RETURN_IF_ERROR(r.Read(&type_id, what + " (type)"));
  const GgmlTypeTraits traits = kernels::TraitsOf(type_id);
  if (!traits.known) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": unknown ggml type ", type_id, " at offset ", type_at));
  }
  tensor->type = static_cast<GgmlType>(type_id);
  WINNOW_ASSIGN_OR_RETURN(tensor->nbytes, TensorBytes(what, traits, *tensor));
  return absl::OkStatus();
}

absl::Status ReadTensorOffset(Reader& r, const std::string& what, uint64_t alignment,
                              GgufTensor* tensor) {
  const uint64_t offset_at = r.pos();
  WINNOW_RETURN_IF_ERROR(r.Read(&tensor->offset, what + " (data offset)"));
  if (tensor->offset % alignment != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": data offset ", tensor->offset, " at offset ", offset_at,
                     " is not a multiple of the alignment ", alignment));
  }
  return absl::OkStatus();
}

// Entry `t` of the tensor table: name, dims, type, offset. `seen` holds the names before it.
absl::StatusOr<GgufTensor> ReadTensorInfo(Reader& r, uint64_t t, uint64_t alignment,
                                          const NameIndex& seen) {
  const uint64_t entry_at = r.pos();
  GgufTensor tensor;
  WINNOW_RETURN_IF_ERROR(r.ReadString(&tensor.name, absl::StrCat("name of tensor ", t)));
  const std::string what = absl::StrCat("tensor '", tensor.name, "'");
  if (seen.contains(tensor.name)) {
    return absl::InvalidArgumentError(absl::StrCat("duplicate ", what, " at offset ", entry_at));
  }
  WINNOW_RETURN_IF_ERROR(ReadTensorDims(r, what, &tensor));
  WINNOW_RETURN_IF_ERROR(ReadTensorType(r, what, &tensor));
  WINNOW_RETURN_IF_ERROR(ReadTensorOffset(r, what, alignment, &tensor));
  return tensor;
}

absl::Status ReadTensorTable(Reader& r, uint64_t count, uint64_t alignment,
                             std::vector<GgufTensor>* tensors, NameIndex* index) {
  // Checked again now that the metadata's size is known (the header check allowed for none).
  if (count > r.remaining() / kMinTensorBytes) {
    return absl::DataLossError(absl::StrCat("tensor count ", count, " cannot fit in the ",
                                            r.remaining(), " bytes after the metadata (offset ",
                                            r.pos(), ")"));
  }
  tensors->reserve(count);
  index->reserve(count);
  for (uint64_t t = 0; t < count; ++t) {
    WINNOW_ASSIGN_OR_RETURN(GgufTensor tensor, ReadTensorInfo(r, t, alignment, *index));
    index->emplace(tensor.name, tensors->size());
    tensors->push_back(std::move(tensor));
  }
  return absl::OkStatus();
}

// Points each tensor at its bytes in the data section, which starts at the next multiple of
// the alignment after the tensor table (at `table_end`), and returns where that section starts.
absl::StatusOr<uint64_t> PlaceTensorData(const uint8_t* map, uint64_t map_size, uint64_t table_end,
                                         uint64_t alignment, std::vector<GgufTensor>* tensors) {
  const uint64_t pad = (alignment - table_end % alignment) % alignment;
  // Cannot overflow: table_end <= file size, pad < alignment.
  const uint64_t data_offset = table_end + pad;
  const uint64_t data_size = map_size > data_offset ? map_size - data_offset : 0;
  for (GgufTensor& tensor : *tensors) {
    if (tensor.offset > data_size || tensor.nbytes > data_size - tensor.offset) {
      return absl::DataLossError(
          absl::StrCat("tensor '", tensor.name, "': data [", tensor.offset, ", +", tensor.nbytes,
                       ") relative to the data section at offset ", data_offset,
                       " runs past the end of the ", map_size, "-byte file"));
    }
    tensor.data = map + data_offset + tensor.offset;
  }
  return data_offset;
}

}  // namespace

std::string_view GgufValueTypeName(GgufValueType type) {
  switch (type) {
    case GgufValueType::kUint8: return "uint8";
    case GgufValueType::kInt8: return "int8";
    case GgufValueType::kUint16: return "uint16";
    case GgufValueType::kInt16: return "int16";
    case GgufValueType::kUint32: return "uint32";
    case GgufValueType::kInt32: return "int32";
    case GgufValueType::kFloat32: return "float32";
    case GgufValueType::kBool: return "bool";
    case GgufValueType::kString: return "string";
    case GgufValueType::kArray: return "array";
    case GgufValueType::kUint64: return "uint64";
    case GgufValueType::kInt64: return "int64";
    case GgufValueType::kFloat64: return "float64";
  }
  return "unknown";
}

kernels::WeightMatrix GgufTensor::AsMatrix() const {
  kernels::WeightMatrix m;
  m.type = type;
  m.cols = dims.empty() ? 0 : dims[0];
  m.rows = 1;
  for (size_t i = 1; i < dims.size(); ++i) m.rows *= dims[i];
  m.row_bytes = kernels::RowBytes(type, m.cols);
  m.data = data;
  return m;
}

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::Open(const std::string& path) {
  std::unique_ptr<GgufFile> file(new GgufFile());
  file->path_ = path;
  auto fail = [&path](const absl::Status& s) {
    return absl::Status(s.code(), absl::StrCat("GGUF ", path, ": ", s.message()));
  };

  absl::StatusOr<std::unique_ptr<base::MappedFile>> mapping = base::MappedFile::Open(path);
  if (!mapping.ok()) return fail(mapping.status());
  // magic + version + two counts: anything shorter cannot be a v2/v3 header.
  constexpr uint64_t kHeaderBytes = 4 + 4 + 8 + 8;
  if ((*mapping)->size() < kHeaderBytes) {
    return fail(absl::DataLossError(absl::StrCat("file is ", (*mapping)->size(),
                                                 " bytes, shorter than the ", kHeaderBytes,
                                                 "-byte GGUF header")));
  }
  file->map_ = (*mapping)->data();
  file->map_size_ = (*mapping)->size();
  file->mapping_ = *std::move(mapping);

  if (absl::Status s = file->Parse(); !s.ok()) return fail(s);
  return file;
}

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::FromBytes(std::string bytes,
                                                              std::string name) {
  std::unique_ptr<GgufFile> file(new GgufFile());
  file->path_ = std::move(name);
  file->owned_ = std::move(bytes);
  file->map_ = reinterpret_cast<const uint8_t*>(file->owned_.data());
  file->map_size_ = file->owned_.size();
  if (absl::Status s = file->Parse(); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("GGUF ", file->path_, ": ", s.message()));
  }
  return file;
}

absl::Status GgufFile::Parse() {
  Reader r(map_, map_size_);
  WINNOW_RETURN_IF_ERROR(ReadMagic(r));
  WINNOW_ASSIGN_OR_RETURN(version_, ReadVersion(r));
  WINNOW_ASSIGN_OR_RETURN(const SectionCounts counts, ReadSectionCounts(r));
  WINNOW_RETURN_IF_ERROR(ReadMetadata(r, counts.metadata, &metadata_, &metadata_index_));
  // Tensor offsets are checked against the alignment, so it has to be known before the table.
  WINNOW_ASSIGN_OR_RETURN(alignment_, AlignmentOf(Find("general.alignment")));
  WINNOW_RETURN_IF_ERROR(ReadTensorTable(r, counts.tensors, alignment_, &tensors_, &tensor_index_));
  WINNOW_ASSIGN_OR_RETURN(data_offset_,
                          PlaceTensorData(map_, map_size_, r.pos(), alignment_, &tensors_));
  return absl::OkStatus();
}

GgufFile::~GgufFile() = default;

const GgufValue* GgufFile::Find(std::string_view key) const {
  auto it = metadata_index_.find(AbslView(key));
  return it == metadata_index_.end() ? nullptr : &metadata_[it->second].second;
}

const GgufTensor* GgufFile::FindTensor(std::string_view name) const {
  auto it = tensor_index_.find(AbslView(name));
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

namespace {

absl::Status NotFound(std::string_view key) {
  return absl::NotFoundError(absl::StrCat(KeyContext(key), " not found"));
}

}  // namespace

absl::StatusOr<std::string> GgufFile::GetString(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return NotFound(key);
  if (v->type != GgufValueType::kString) return WrongType(key, *v, "a string");
  return v->s;
}

absl::StatusOr<int64_t> GgufFile::GetInt(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return NotFound(key);
  return IntOf(key, *v);
}

absl::StatusOr<double> GgufFile::GetFloat(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return NotFound(key);
  return FloatOf(key, *v);
}

absl::StatusOr<bool> GgufFile::GetBool(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return NotFound(key);
  if (v->type != GgufValueType::kBool) return WrongType(key, *v, "a bool");
  return v->u != 0;
}

absl::StatusOr<std::vector<std::string>> GgufFile::GetStringArray(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return NotFound(key);
  if (v->type != GgufValueType::kArray || v->array_type != GgufValueType::kString) {
    return WrongType(key, *v, "an array of strings");
  }
  std::vector<std::string> out;
  out.reserve(v->array.size());
  for (const GgufValue& e : v->array) out.push_back(e.s);
  return out;
}

absl::StatusOr<std::vector<int64_t>> GgufFile::GetIntArray(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return NotFound(key);
  if (v->type != GgufValueType::kArray || !IsInteger(v->array_type)) {
    return WrongType(key, *v, "an array of integers");
  }
  std::vector<int64_t> out;
  out.reserve(v->array.size());
  for (const GgufValue& e : v->array) {
    WINNOW_ASSIGN_OR_RETURN(const int64_t i, IntOf(key, e));
    out.push_back(i);
  }
  return out;
}

absl::StatusOr<std::vector<double>> GgufFile::GetFloatArray(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return NotFound(key);
  if (v->type != GgufValueType::kArray ||
      !(IsInteger(v->array_type) || IsFloat(v->array_type))) {
    return WrongType(key, *v, "an array of numbers");
  }
  std::vector<double> out;
  out.reserve(v->array.size());
  for (const GgufValue& e : v->array) {
    WINNOW_ASSIGN_OR_RETURN(const double f, FloatOf(key, e));
    out.push_back(f);
  }
  return out;
}

}  // namespace winnow::model
