#include "cache/keep_plan.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "absl/strings/str_cat.h"

namespace winnow::cache::policies {
namespace {

// A mass-preserving merge's inputs: a mass per slot of every head, an absorbing range inside the
// layer, and no mean-merge groups beside it.
absl::Status ValidateMass(const LayerKeep& keep, int32_t num_kv_heads, int32_t n,
                          const std::string& where) {
  if (!keep.merges_mass()) return absl::OkStatus();
  if (!keep.merge.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": both merge groups and masses"));
  }
  if (static_cast<int32_t>(keep.mass.size()) != num_kv_heads) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": masses for ", keep.mass.size(), " heads"));
  }
  for (const std::vector<float>& mass : keep.mass) {
    if (static_cast<int32_t>(mass.size()) != n) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": ", mass.size(), " masses for ", n, " slots"));
    }
    for (float m : mass) {
      if (!(m >= 0.0f) || !std::isfinite(m)) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": a mass is not finite >= 0"));
      }
    }
  }
  if (keep.absorb_begin < 0 || keep.absorb_end < keep.absorb_begin || keep.absorb_end > n) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": absorbing range [",
                                                   keep.absorb_begin, ", ", keep.absorb_end,
                                                   ") is not inside [0, ", n, "]"));
  }
  return absl::OkStatus();
}

}  // namespace

bool KeepPlan::empty() const {
  for (const LayerKeep& layer : layers) {
    if (!layer.untouched()) return false;
  }
  return true;
}

absl::Status KeepPlan::Validate(const ModelDims& dims,
                                const std::function<int32_t(int32_t)>& num_slots) const {
  if (layers.empty()) return absl::OkStatus();
  if (static_cast<int32_t>(layers.size()) != dims.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat("keep plan has ", layers.size(),
                                                   " layers, the model ", dims.num_layers));
  }
  for (int32_t l = 0; l < dims.num_layers; ++l) {
    const LayerKeep& keep = layers[l];
    if (keep.untouched()) continue;
    const std::string where = absl::StrCat("keep plan layer ", l);
    if (static_cast<int32_t>(keep.heads.size()) != dims.num_kv_heads) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": ", keep.heads.size(),
                                                     " heads, expected ", dims.num_kv_heads));
    }
    const int32_t n = num_slots(l);
    const size_t count = keep.heads[0].size();
    if (count == 0) return absl::InvalidArgumentError(absl::StrCat(where, ": keeps nothing"));
    if (!keep.merge.empty() && static_cast<int32_t>(keep.merge.size()) != dims.num_kv_heads) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": merge lists for ",
                                                     keep.merge.size(), " heads"));
    }
    if (absl::Status s = ValidateMass(keep, dims.num_kv_heads, n, where); !s.ok()) return s;
    for (int32_t h = 0; h < dims.num_kv_heads; ++h) {
      const std::vector<int32_t>& slots = keep.heads[h];
      if (slots.size() != count) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": head ", h, " keeps ", slots.size(), " slots, head 0 keeps ", count));
      }
      for (size_t i = 0; i < slots.size(); ++i) {
        if (slots[i] < 0 || slots[i] >= n || (i > 0 && slots[i] <= slots[i - 1])) {
          return absl::InvalidArgumentError(absl::StrCat(
              where, " head ", h, ": slot list is not ascending within [0, ", n, ")"));
        }
      }
      if (keep.merge.empty() || keep.merge[h].empty()) continue;
      const auto& groups = keep.merge[h];
      if (groups.size() != count) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, " head ", h, ": ", groups.size(), " merge groups for ", count,
                         " kept slots"));
      }
      int32_t previous = -1;
      for (size_t i = 0; i < groups.size(); ++i) {
        bool has_anchor = false;
        for (int32_t src : groups[i]) {
          if (src <= previous || src >= n) {
            return absl::InvalidArgumentError(absl::StrCat(
                where, " head ", h, ": merge sources must be ascending, disjoint and < ", n));
          }
          previous = src;
          has_anchor |= src == slots[i];
        }
        if (!has_anchor) {
          return absl::InvalidArgumentError(absl::StrCat(
              where, " head ", h, ": merge group ", i, " does not contain its slot ", slots[i]));
        }
      }
    }
  }
  return absl::OkStatus();
}

void KeepSlidingWindow(LayerKeep& keep, int32_t num_slots, int32_t window) {
  const int32_t read = window - 1;  // past slots the next token sees
  // Without a window, or when the next token sees every slot, the plan stands (merges too).
  if (read <= 0 || num_slots <= read || keep.untouched()) return;
  // The newest `count` slots: positions without gaps, so while decoding the layer reads
  // nothing further back than its window (a pick older than the newest would stay in view up
  // to window - 1 - count positions past it), and once it holds window - 1 slots it reads what
  // the full cache's layer reads.
  const int32_t count = std::min(keep.kept(), read);
  std::vector<int32_t> newest(count);
  std::iota(newest.begin(), newest.end(), num_slots - count);
  for (std::vector<int32_t>& slots : keep.heads) slots = newest;
  keep.merge.clear();
  keep.mass.clear();
}

void KeepSlidingWindows(KeepPlan& plan, const ModelDims& dims,
                        const std::function<int32_t(int32_t)>& num_slots) {
  for (int32_t l = 0; l < static_cast<int32_t>(plan.layers.size()); ++l) {
    KeepSlidingWindow(plan.layers[l], num_slots(l), dims.WindowOf(l));
  }
}

}  // namespace winnow::cache::policies
