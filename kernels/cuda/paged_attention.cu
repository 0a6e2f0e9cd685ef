#include "kernels/cuda/paged_attention.h"

#include <algorithm>
#include <climits>
#include <span>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/flashinfer_attention.h"

namespace winnow::kernels::cuda {
namespace {

constexpr int64_t kElementBytes = 2;  // f16 and bf16

int32_t PagesFor(int32_t slots, int32_t block_size) { return (slots + block_size - 1) / block_size; }

template <typename T>
absl::Status RunKernel(bool decode, int32_t head_dim, const FlashInferCall& call) {
  if (head_dim == 64) {
    return decode ? FlashInferDecode<T, 64>(call) : FlashInferPrefill<T, 64>(call);
  }
  return decode ? FlashInferDecode<T, 128>(call) : FlashInferPrefill<T, 128>(call);
}

// Offsets into the host (and device) page-table array of one kernel call's sequences.
struct TableOffsets {
  int64_t kv_indptr = 0;
  int64_t last_page_len = 0;
  int64_t qo_indptr = 0;
  int64_t indices = 0;
};

// Appends the page table of `sequences` (FlashInfer's CSR form: page indptr, last page length,
// query-row indptr, page ids) to `tables`.
TableOffsets AppendTables(std::span<const AttentionSequence> sequences, int32_t block_size,
                          std::vector<int32_t>& tables) {
  const int64_t n = static_cast<int64_t>(sequences.size());
  TableOffsets at;
  at.kv_indptr = static_cast<int64_t>(tables.size());
  at.last_page_len = at.kv_indptr + n + 1;
  at.qo_indptr = at.last_page_len + n;
  at.indices = at.qo_indptr + n + 1;
  tables.resize(at.indices);
  int32_t pages = 0;
  int32_t rows = 0;
  tables[at.kv_indptr] = 0;
  tables[at.qo_indptr] = 0;
  for (int64_t i = 0; i < n; ++i) {
    const AttentionSequence& s = sequences[i];
    const int32_t used = PagesFor(s.num_slots, block_size);
    tables.insert(tables.end(), s.block_table, s.block_table + used);
    pages += used;
    rows += s.num_new;
    tables[at.kv_indptr + i + 1] = pages;
    tables[at.last_page_len + i] = s.num_slots - (used - 1) * block_size;
    tables[at.qo_indptr + i + 1] = rows;
  }
  return at;
}

}  // namespace

absl::Status ValidatePagedAttentionConfig(const PagedAttentionConfig& c) {
  const auto invalid = [](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat("paged attention: ", parts...));
  };
  if (c.num_heads <= 0 || c.num_kv_heads <= 0 || c.num_heads % c.num_kv_heads != 0) {
    return invalid("num_heads (", c.num_heads, ") must be a positive multiple of num_kv_heads (",
                   c.num_kv_heads, ")");
  }
  if (c.head_dim != 64 && c.head_dim != 128) {
    return invalid("head_dim ", c.head_dim, ": the CUDA kernels are built for 64 and 128");
  }
  if (c.block_size <= 0) return invalid("block_size ", c.block_size, " must be positive");
  if (c.dtype != KvDtype::kF16 && c.dtype != KvDtype::kBF16) {
    return invalid("kv dtype ", KvDtypeName(c.dtype), ": the CUDA kernels take f16 or bf16");
  }
  if (c.num_blocks <= 0) return invalid("num_blocks ", c.num_blocks, " must be positive");
  if (c.float_workspace_bytes <= 0 || c.int_workspace_bytes <= 0) {
    return invalid("workspace sizes must be positive");
  }
  // FlashInfer's page strides are 32-bit element counts.
  if (2 * int64_t{c.num_kv_heads} * c.block_size * c.head_dim > UINT32_MAX) {
    return invalid("a block of ", c.num_kv_heads, " KV heads x ", c.block_size,
                   " slots is too large");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<PagedAttention>> PagedAttention::Create(
    const PagedAttentionConfig& config) {
  if (absl::Status s = ValidatePagedAttentionConfig(config); !s.ok()) return s;
  auto float_workspace = DeviceBuffer<std::byte>::Allocate(config.float_workspace_bytes);
  if (!float_workspace.ok()) return float_workspace.status();
  auto int_workspace = DeviceBuffer<std::byte>::Allocate(config.int_workspace_bytes);
  if (!int_workspace.ok()) return int_workspace.status();
  return std::unique_ptr<PagedAttention>(
      new PagedAttention(config, std::move(*float_workspace), std::move(*int_workspace)));
}

absl::Status PagedAttention::ValidateSequences(
    std::span<const AttentionSequence> sequences) const {
  int64_t row = 0;
  for (size_t i = 0; i < sequences.size(); ++i) {
    const AttentionSequence& s = sequences[i];
    const auto invalid = [&](auto&&... parts) {
      return absl::InvalidArgumentError(
          absl::StrCat("paged attention: sequence ", i, ": ", parts...));
    };
    if (s.selected != nullptr || s.probs != nullptr) {
      return invalid("selected slots and probs are not supported on CUDA");
    }
    if (s.num_new <= 0 || s.num_slots < s.num_new) {
      return invalid("num_new (", s.num_new, ") must be in [1, num_slots = ", s.num_slots, "]");
    }
    if (s.first_row != row) {
      return invalid("first_row ", s.first_row, " must be ", row,
                     " (sequences in row order, without gaps)");
    }
    row += s.num_new;
    if (row > INT32_MAX) return invalid("more than 2^31 query rows");
    if (s.block_table == nullptr) return invalid("block_table is null");
    for (int32_t b = 0; b < PagesFor(s.num_slots, config_.block_size); ++b) {
      if (s.block_table[b] < 0 || s.block_table[b] >= config_.num_blocks) {
        return invalid("block_table[", b, "] = ", s.block_table[b], " is not in [0, ",
                       config_.num_blocks, ")");
      }
    }
  }
  return absl::OkStatus();
}

int32_t PagedAttention::DecodePrefix(std::span<const AttentionSequence> sequences) const {
  if (!DecodeSupportsGroup(config_.num_heads / config_.num_kv_heads)) return 0;
  int32_t n = 0;
  while (n < static_cast<int32_t>(sequences.size()) && sequences[n].num_new == 1) ++n;
  return n;
}

absl::Status PagedAttention::Run(const void* arena, std::span<const AttentionSequence> sequences,
                                 const void* q, float scale, void* out, cudaStream_t stream,
                                 float* lse) {
  if (absl::Status s = ValidateSequences(sequences); !s.ok()) return s;
  if (sequences.empty()) return absl::OkStatus();
  if (arena == nullptr || q == nullptr || out == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "paged attention: ", arena == nullptr ? "arena" : (q == nullptr ? "q" : "out"),
        " is null"));
  }
  // Decode tokens at the front go to the decode kernel (a query row each, split along the KV
  // length), the rest to the prefill kernel (query tiles, causal mask).
  const int32_t num_decode = DecodePrefix(sequences);
  const std::span<const AttentionSequence> groups[2] = {sequences.first(num_decode),
                                                        sequences.subspan(num_decode)};
  host_tables_.clear();
  TableOffsets offsets[2];
  for (int g = 0; g < 2; ++g) offsets[g] = AppendTables(groups[g], config_.block_size, host_tables_);
  if (absl::Status s = UploadTables(stream); !s.ok()) return s;

  const int64_t row_elements = int64_t{config_.num_heads} * config_.head_dim;
  const int64_t head_block = int64_t{config_.block_size} * config_.head_dim;
  for (int g = 0; g < 2; ++g) {
    if (groups[g].empty()) continue;
    const TableOffsets& at = offsets[g];
    const int64_t first_row = groups[g].front().first_row;
    FlashInferCall call;
    call.num_heads = config_.num_heads;
    call.num_kv_heads = config_.num_kv_heads;
    call.block_size = config_.block_size;
    call.page_stride = 2 * config_.num_kv_heads * head_block;
    call.v_offset = config_.num_kv_heads * head_block;
    call.arena = arena;
    call.batch = static_cast<int32_t>(groups[g].size());
    call.total_rows = host_tables_[at.qo_indptr + call.batch];
    call.kv_indptr_host = host_tables_.data() + at.kv_indptr;
    call.qo_indptr_host = host_tables_.data() + at.qo_indptr;
    call.kv_indptr = tables_.data() + at.kv_indptr;
    call.kv_indices = tables_.data() + at.indices;
    call.last_page_len = tables_.data() + at.last_page_len;
    call.qo_indptr = tables_.data() + at.qo_indptr;
    call.q = static_cast<const std::byte*>(q) + first_row * row_elements * kElementBytes;
    call.out = static_cast<std::byte*>(out) + first_row * row_elements * kElementBytes;
    call.lse = lse == nullptr ? nullptr : lse + first_row * config_.num_heads;
    call.scale = scale;
    // The two kernels run one after the other on the stream, so they share the float
    // workspace (split-KV partials); their schedules live in separate halves of the int one.
    call.float_workspace = float_workspace_.data();
    call.float_workspace_bytes = float_workspace_.bytes();
    const int64_t half_bytes = int_workspace_.bytes() / 2;
    call.int_workspace = int_workspace_.data() + g * half_bytes;
    call.host_int_workspace = host_int_workspace_.data() + g * half_bytes;
    call.int_workspace_bytes = half_bytes;
    call.stream = stream;
    // The schedule depends on nothing but the lengths: the table before the page ids.
    const std::span<const int32_t> lengths(host_tables_.data() + at.kv_indptr,
                                           host_tables_.data() + at.indices);
    call.replan = !std::equal(lengths.begin(), lengths.end(), plan_lengths_[g].begin(),
                              plan_lengths_[g].end());
    call.plan = &plans_[g];
    const bool decode = g == 0;
    absl::Status status = config_.dtype == KvDtype::kF16
                              ? RunKernel<half>(decode, config_.head_dim, call)
                              : RunKernel<__nv_bfloat16>(decode, config_.head_dim, call);
    if (!status.ok()) {
      plan_lengths_[g].clear();  // the stored schedule may be half written
      return status;
    }
    if (call.replan) plan_lengths_[g].assign(lengths.begin(), lengths.end());
  }
  return absl::OkStatus();
}

absl::Status PagedAttention::UploadTables(cudaStream_t stream) {
  const int64_t n = static_cast<int64_t>(host_tables_.size());
  if (staged_ + n > staging_.size()) {
    // Every upload staged so far has been read once the stream drains: start over.
    WINNOW_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    staged_ = 0;
    if (n > staging_.size()) {
      auto grown = PinnedBuffer<int32_t>::Allocate(std::max<int64_t>(4 * n, int64_t{1} << 18));
      if (!grown.ok()) return grown.status();
      staging_ = std::move(*grown);
    }
  }
  if (tables_.size() < n) {
    auto grown = DeviceBuffer<int32_t>::Allocate(std::max<int64_t>(n, 2 * tables_.size()));
    if (!grown.ok()) return grown.status();
    tables_ = std::move(*grown);
  }
  int32_t* staged = staging_.data() + staged_;
  std::copy(host_tables_.begin(), host_tables_.end(), staged);
  staged_ += n;
  // Stream order keeps the previous call's kernels reading tables_ before this overwrites it.
  return CudaStatus(cudaMemcpyAsync(tables_.data(), staged, n * sizeof(int32_t),
                                    cudaMemcpyHostToDevice, stream),
                    "cudaMemcpyAsync page tables");
}

}  // namespace winnow::kernels::cuda
