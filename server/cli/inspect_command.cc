// `winnow inspect`: GGUF metadata or a Hugging Face directory's JSON files as JSON, the tensor
// table, or one tensor dequantised.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/cli.h"
#include "base/status_macros.h"
#include "kernels/cpu/dequantize.h"
#include "base/file.h"
#include "model/gguf.h"
#include "model/safetensors.h"
#include "nlohmann/json.hpp"
#include "server/cli/commands.h"

namespace winnow::cli {
namespace {

// Arrays longer than this are printed as {length, first kArrayPreview items}: a vocabulary would
// otherwise bury the rest of the metadata.
constexpr size_t kArrayFullLimit = 16;
constexpr size_t kArrayPreview = 8;

// Appends `s` as a JSON string. GGUF strings are not guaranteed UTF-8; invalid bytes become
// U+FFFD so the output always parses.
void AppendJsonString(std::string_view s, std::string* out) {
  out->push_back('"');
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      switch (c) {
        case '"': out->append("\\\""); break;
        case '\\': out->append("\\\\"); break;
        case '\n': out->append("\\n"); break;
        case '\r': out->append("\\r"); break;
        case '\t': out->append("\\t"); break;
        default:
          if (c < 0x20 || c == 0x7f) {
            char buf[8];
            std::snprintf(buf, sizeof(buf), "\\u%04x", c);
            out->append(buf);
          } else {
            out->push_back(static_cast<char>(c));
          }
      }
      ++i;
      continue;
    }
    // Length and minimum code point of a well-formed sequence starting with c.
    int len = 0;
    uint32_t cp = 0;
    uint32_t min_cp = 0;
    if ((c & 0xe0) == 0xc0) {
      len = 2;
      cp = c & 0x1f;
      min_cp = 0x80;
    } else if ((c & 0xf0) == 0xe0) {
      len = 3;
      cp = c & 0x0f;
      min_cp = 0x800;
    } else if ((c & 0xf8) == 0xf0) {
      len = 4;
      cp = c & 0x07;
      min_cp = 0x10000;
    }
    bool ok = len > 0 && i + len <= s.size();
    for (int k = 1; ok && k < len; ++k) {
      const unsigned char cc = static_cast<unsigned char>(s[i + k]);
      ok = (cc & 0xc0) == 0x80;
      cp = (cp << 6) | (cc & 0x3f);
    }
    ok = ok && cp >= min_cp && cp <= 0x10ffff && !(cp >= 0xd800 && cp <= 0xdfff);
    if (ok) {
      out->append(s.substr(i, len));
      i += len;
    } else {
      out->append("\xef\xbf\xbd");
      ++i;
    }
  }
  out->push_back('"');
}

// JSON has no NaN/Infinity; we write the tokens Python's json module reads, since the numeric
// reference checks are done from Python.
void AppendNumber(double v, const char* format, std::string* out) {
  if (std::isnan(v)) {
    out->append("NaN");
  } else if (std::isinf(v)) {
    out->append(v > 0 ? "Infinity" : "-Infinity");
  } else {
    char buf[40];
    std::snprintf(buf, sizeof(buf), format, v);
    out->append(buf);
  }
}

void AppendValue(const model::GgufValue& v, std::string* out);

void AppendArray(const model::GgufValue& v, std::string* out) {
  const bool summarise = v.array.size() > kArrayFullLimit;
  const size_t shown = summarise ? kArrayPreview : v.array.size();
  if (summarise) {
    absl::StrAppend(out, "{\"type\": \"array\", \"element_type\": \"",
                    std::string(model::GgufValueTypeName(v.array_type)),
                    "\", \"length\": ", v.array.size(), ", \"first\": ");
  }
  out->push_back('[');
  for (size_t i = 0; i < shown; ++i) {
    if (i > 0) out->append(", ");
    AppendValue(v.array[i], out);
  }
  out->push_back(']');
  if (summarise) out->push_back('}');
}

void AppendValue(const model::GgufValue& v, std::string* out) {
  using model::GgufValueType;
  switch (v.type) {
    case GgufValueType::kUint8:
    case GgufValueType::kUint16:
    case GgufValueType::kUint32:
    case GgufValueType::kUint64:
      absl::StrAppend(out, v.u);
      return;
    case GgufValueType::kInt8:
    case GgufValueType::kInt16:
    case GgufValueType::kInt32:
    case GgufValueType::kInt64:
      absl::StrAppend(out, v.i);
      return;
    case GgufValueType::kFloat32:
      AppendNumber(v.f, "%.9g", out);
      return;
    case GgufValueType::kFloat64:
      AppendNumber(v.f, "%.17g", out);
      return;
    case GgufValueType::kBool:
      out->append(v.u != 0 ? "true" : "false");
      return;
    case GgufValueType::kString:
      AppendJsonString(v.s, out);
      return;
    case GgufValueType::kArray:
      AppendArray(v, out);
      return;
  }
  out->append("null");
}

void AppendDims(const std::vector<int64_t>& dims, std::string* out) {
  out->push_back('[');
  for (size_t i = 0; i < dims.size(); ++i) absl::StrAppend(out, i > 0 ? ", " : "", dims[i]);
  out->push_back(']');
}

// Writes `s` to stdout and clears it; false on a write error (closed pipe, full disk).
bool Flush(std::string* s) {
  const bool ok = std::fwrite(s->data(), 1, s->size(), stdout) == s->size();
  s->clear();
  return ok;
}

absl::Status PrintMetadata(const model::GgufFile& f) {
  std::string out = "{\n";
  absl::StrAppend(&out, "  \"path\": ");
  AppendJsonString(f.path(), &out);
  absl::StrAppend(&out, ",\n  \"version\": ", f.version(), ",\n  \"alignment\": ", f.alignment(),
                  ",\n  \"tensor_count\": ", f.tensors().size(), ",\n  \"metadata\": {");
  bool first = true;
  for (const auto& [key, value] : f.metadata()) {
    out.append(first ? "\n    " : ",\n    ");
    first = false;
    AppendJsonString(key, &out);
    out.append(": ");
    AppendValue(value, &out);
  }
  out.append(first ? "}\n}\n" : "\n  }\n}\n");
  if (!Flush(&out)) return absl::UnavailableError("cannot write to stdout");
  return absl::OkStatus();
}

absl::Status PrintTensors(const model::GgufFile& f) {
  std::string out = "[";
  bool first = true;
  for (const model::GgufTensor& t : f.tensors()) {
    out.append(first ? "\n  " : ",\n  ");
    first = false;
    out.append("{\"name\": ");
    AppendJsonString(t.name, &out);
    absl::StrAppend(&out, ", \"type\": \"", std::string(kernels::TraitsOf(t.type).name),
                    "\", \"dims\": ");
    AppendDims(t.dims, &out);
    absl::StrAppend(&out, ", \"offset\": ", t.offset, ", \"nbytes\": ", t.nbytes, "}");
  }
  out.append(first ? "]\n" : "\n]\n");
  if (!Flush(&out)) return absl::UnavailableError("cannot write to stdout");
  return absl::OkStatus();
}

absl::Status DumpMatrix(const kernels::WeightMatrix& w);

absl::Status DumpTensor(const model::GgufFile& f, const std::string& name) {
  const model::GgufTensor* t = f.FindTensor(name);
  if (t == nullptr) {
    return absl::NotFoundError(absl::StrCat("no tensor named '", name, "' in ", f.path()));
  }
  if (!kernels::CanDequantize(t->type)) {
    return absl::UnimplementedError(absl::StrCat("tensor '", name, "' has type ",
                                                 std::string(kernels::TraitsOf(t->type).name),
                                                 ", which cannot be dequantised"));
  }
  return DumpMatrix(t->AsMatrix());
}

// Row by row so that even the embedding table never needs a full float copy.
absl::Status DumpMatrix(const kernels::WeightMatrix& w) {
  std::vector<float> row(static_cast<size_t>(w.cols));
  std::string out = "[";
  for (int64_t r = 0; r < w.rows; ++r) {
    WINNOW_RETURN_IF_ERROR(
        kernels::DequantizeRow(w.type, w.data + r * w.row_bytes, w.cols, row.data()));
    for (int64_t c = 0; c < w.cols; ++c) {
      if (r > 0 || c > 0) out.append(", ");
      AppendNumber(row[c], "%.9g", &out);
    }
    if (out.size() > (1 << 20) && !Flush(&out)) {
      return absl::UnavailableError("cannot write to stdout");
    }
  }
  out.append("]\n");
  if (!Flush(&out)) return absl::UnavailableError("cannot write to stdout");
  return absl::OkStatus();
}

// A Hugging Face directory: its JSON files as they are, under their names.
absl::Status PrintHfMetadata(const std::string& dir,
                             const model::SafetensorsCheckpoint& checkpoint) {
  nlohmann::json out = {{"path", dir}, {"format", "huggingface"}};
  size_t tensors = 0;
  for (const auto& file : checkpoint.files()) tensors += file->tensors().size();
  out["tensor_count"] = tensors;
  for (const char* name : {"config.json", "generation_config.json", "tokenizer_config.json"}) {
    const std::optional<std::string> text =
        base::ReadWholeFile((std::filesystem::path(dir) / name).string());
    if (!text.has_value()) continue;
    nlohmann::json parsed = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
    out[name] = parsed.is_discarded() ? nlohmann::json("not valid JSON") : parsed;
  }
  std::string text = out.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  if (!Flush(&text)) return absl::UnavailableError("cannot write to stdout");
  return absl::OkStatus();
}

absl::Status PrintHfTensors(const model::SafetensorsCheckpoint& checkpoint) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& file : checkpoint.files()) {
    for (const model::SafetensorsTensor& t : file->tensors()) {
      out.push_back({{"name", t.name}, {"dtype", t.dtype}, {"shape", t.shape},
                     {"file", std::filesystem::path(file->path()).filename().string()},
                     {"nbytes", t.nbytes}});
    }
  }
  std::string text = out.dump(2) + "\n";
  if (!Flush(&text)) return absl::UnavailableError("cannot write to stdout");
  return absl::OkStatus();
}

absl::Status DumpHfTensor(const model::SafetensorsCheckpoint& checkpoint,
                          const std::string& name) {
  const model::SafetensorsTensor* t = checkpoint.Find(name);
  if (t == nullptr) return absl::NotFoundError(absl::StrCat("no tensor named '", name, "'"));
  kernels::GgmlType type;
  if (!t->KernelType(&type)) {
    return absl::UnimplementedError(
        absl::StrCat("tensor '", name, "' is ", t->dtype, ", which cannot be printed"));
  }
  const int64_t cols = t->shape.empty() ? 1 : t->shape.back();
  const int64_t rows = cols == 0 ? 0 : t->elements() / cols;
  return DumpMatrix({type, rows, cols, rows == 0 ? 0 : static_cast<int64_t>(t->nbytes) / rows,
                     t->data});
}

absl::Status Inspect(const std::string& model, const CLI::Option& tensors,
                     const CLI::Option& dump_tensor, const std::string& tensor_name) {
  if (std::filesystem::is_directory(model)) {
    WINNOW_ASSIGN_OR_RETURN(std::unique_ptr<model::SafetensorsCheckpoint> checkpoint,
                            model::SafetensorsCheckpoint::Open(model));
    if (dump_tensor) return DumpHfTensor(*checkpoint, tensor_name);
    if (tensors) return PrintHfTensors(*checkpoint);
    return PrintHfMetadata(model, *checkpoint);
  }
  WINNOW_ASSIGN_OR_RETURN(std::unique_ptr<model::GgufFile> file, model::GgufFile::Open(model));
  if (dump_tensor) return DumpTensor(*file, tensor_name);
  if (tensors) return PrintTensors(*file);
  return PrintMetadata(*file);
}

}  // namespace

int RunInspect(const std::vector<std::string>& args) {
  CLI::App app("A GGUF file's metadata or a Hugging Face directory's JSON files (as JSON) by "
               "default, the tensor table, or one tensor's values.",
               "winnow inspect");
  // --threads is accepted for uniformity with the other commands; inspecting is single-threaded.
  CommonFlags common;
  AddCommonFlags(app, &common);
  bool tensors_flag = false;
  std::string tensor_name;
  CLI::Option* tensors =
      app.add_flag("--tensors", tensors_flag, "print the tensor table (name, type, shape) as JSON");
  app.add_option("--dump-tensor", tensor_name, "print one tensor's values, dequantised, as JSON")
      ->excludes(tensors);
  if (std::optional<int> exit = base::ParseCommandLine(app, args)) return *exit;

  const absl::Status s =
      Inspect(common.model, *tensors, *app.get_option("--dump-tensor"), tensor_name);
  if (std::fflush(stdout) != 0 && s.ok()) {
    std::fputs("winnow inspect: cannot write to stdout\n", stderr);
    return 1;
  }
  if (!s.ok()) {
    std::fprintf(stderr, "winnow inspect: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}

}  // namespace winnow::cli
