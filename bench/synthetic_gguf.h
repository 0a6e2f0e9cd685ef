// A llama-architecture GGUF of a given shape with random weights, for benchmarks that must run
// where no model file can be brought (a GPU machine reached from a bare checkout). The weights
// are Q4_0 (the smallest type the loader takes: an 8B shape is 4.5 GB on disk) with scales that
// give each row roughly unit-variance outputs, the norms are 1, and the vocabulary is an SPM one
// of byte tokens and filler pieces, so Model::Load accepts the file as it would a real one.
// Nothing it computes means anything; only the shapes and the bytes moved are real.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace winnow::bench {

struct SyntheticShape {
  std::string name;
  int32_t layers = 0;
  int32_t hidden = 0;
  int32_t heads = 0;
  int32_t kv_heads = 0;
  int32_t head_dim = 0;
  int32_t ffn = 0;
  int32_t vocab = 0;
  int32_t context = 0;
  float rope_theta = 10000.0f;
  bool tied_embeddings = false;
};

// "llama3-8b" (32 layers, hidden 4096, 32/8 heads of 128, FFN 14336, vocab 128256) or
// "smollm2-135m" (the default model's shape). InvalidArgument names the known shapes.
absl::Status ShapeByName(const std::string& name, SyntheticShape* shape);

// Writes the file (overwriting `path`). Deterministic for a given seed.
absl::Status WriteSyntheticGguf(const SyntheticShape& shape, const std::string& path,
                                uint64_t seed = 1);

// The synthetic GGUF the benchmarks load: `path`, or /tmp/winnow-synthetic-<name>.gguf when
// empty, written first (with a line saying how long it took) when no file is there.
absl::StatusOr<std::string> EnsureSyntheticGguf(const SyntheticShape& shape,
                                                const std::string& path);

}  // namespace winnow::bench
