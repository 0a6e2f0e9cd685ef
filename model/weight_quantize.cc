#include "model/weight_quantize.h"

#include <map>
#include <new>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "kernels/cpu/dequantize.h"
#include "kernels/cpu/quantize.h"
#include "kernels/cpu/thread_pool.h"

namespace winnow::model {
namespace {

using kernels::GgmlType;
using kernels::WeightMatrix;

struct NamedType {
  std::string_view name;
  GgmlType type;
};
constexpr NamedType kTypes[] = {{"q8_0", GgmlType::kQ8_0},
                                {"q4_0", GgmlType::kQ4_0},
                                {"q4_1", GgmlType::kQ4_1},
                                {"q5_0", GgmlType::kQ5_0},
                                {"q5_1", GgmlType::kQ5_1}};

constexpr int64_t kBlock = 32;
constexpr int64_t kAlign = 64;  // each matrix starts on a cache line

bool Rewritable(const WeightMatrix& m) {
  const bool is_float =
      m.type == GgmlType::kF32 || m.type == GgmlType::kF16 || m.type == GgmlType::kBF16;
  return is_float && m.rows > 0 && m.cols > 0 && m.cols % kBlock == 0 && m.data != nullptr;
}

// Every 2-D weight the forwards multiply by or look rows up in. The output head comes second
// so that, tied, it finds the embeddings already done.
std::vector<WeightMatrix*> Matrices(ModelWeights* w) {
  std::vector<WeightMatrix*> out = {&w->token_embd, &w->output};
  for (LayerWeights& l : w->layers) {
    for (WeightMatrix* m : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) {
      out.push_back(m);
    }
  }
  return out;
}

// Views of the same bytes (a tied head and its embeddings) are rewritten once.
using SourceKey = std::tuple<const uint8_t*, int64_t, int64_t>;
SourceKey KeyOf(const WeightMatrix& m) { return {m.data, m.rows, m.cols}; }

}  // namespace

absl::StatusOr<std::optional<GgmlType>> ParseCpuWeightType(std::string_view name) {
  if (name == "none") return std::nullopt;
  for (const NamedType& t : kTypes) {
    if (name == t.name) return t.type;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("must be one of ", CpuWeightTypeNames(), "; got '", std::string(name), "'"));
}

std::string CpuWeightTypeName(std::optional<GgmlType> type) {
  for (const NamedType& t : kTypes) {
    if (type == t.type) return std::string(t.name);
  }
  return "none";
}

std::string CpuWeightTypeNames() {
  std::vector<std::string> names = {"none"};
  for (const NamedType& t : kTypes) names.emplace_back(t.name);
  return absl::StrJoin(names, ", ");
}

absl::StatusOr<std::shared_ptr<const void>> QuantizeWeights(GgmlType type, int32_t threads,
                                                            ModelWeights* weights) {
  if (!kernels::CanQuantize(type)) {
    return absl::InvalidArgumentError(absl::StrCat("--cpu-weight-type: cannot quantize to ",
                                                   std::string(kernels::TraitsOf(type).name)));
  }
  const std::vector<WeightMatrix*> matrices = Matrices(weights);
  std::map<SourceKey, int64_t> offsets;  // of each distinct source's rewrite in the buffer
  int64_t total = 0;
  for (const WeightMatrix* m : matrices) {
    if (!Rewritable(*m) || !offsets.emplace(KeyOf(*m), total).second) continue;
    const int64_t bytes = m->rows * kernels::RowBytes(type, m->cols);
    total += (bytes + kAlign - 1) / kAlign * kAlign;
  }
  if (total == 0) return std::shared_ptr<const void>();
  std::shared_ptr<uint8_t> buffer(
      static_cast<uint8_t*>(::operator new(total, std::align_val_t(kAlign))),
      [](uint8_t* p) { ::operator delete(p, std::align_val_t(kAlign)); });
  kernels::ThreadPool pool(threads);
  std::map<SourceKey, WeightMatrix> done;
  for (WeightMatrix* m : matrices) {
    if (!Rewritable(*m)) continue;
    auto it = done.find(KeyOf(*m));
    if (it == done.end()) {
      WINNOW_ASSIGN_OR_RETURN(
          WeightMatrix q,
          kernels::QuantizeMatrix(*m, type, buffer.get() + offsets.at(KeyOf(*m)), pool));
      it = done.emplace(KeyOf(*m), q).first;
    }
    *m = it->second;
  }
  return std::shared_ptr<const void>(buffer, buffer.get());
}

}  // namespace winnow::model
