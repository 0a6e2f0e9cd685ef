// The C++ side of tests/python/test_weight_quantize.py: quantises a float32 matrix as
// --cpu-weight-type does (kernels::QuantizeMatrix, rows spread over a thread pool) so that the
// test can compare the blocks with gguf-py's.
//
//   quantize_rows TYPE ROWS COLS [THREADS] < rows.f32 > blocks.bin
//
// TYPE is a --cpu-weight-type name (q8_0, q4_0, q4_1, q5_0, q5_1); stdin holds ROWS * COLS
// little-endian float32 values, stdout gets ROWS rows of ggml blocks.
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "kernels/cpu/dequantize.h"
#include "kernels/cpu/quantize.h"
#include "kernels/cpu/thread_pool.h"
#include "model/weight_quantize.h"

namespace {

int Fail(const std::string& message) {
  std::fprintf(stderr, "quantize_rows: %s\n", message.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace winnow;
  if (argc < 4 || argc > 5) return Fail("usage: quantize_rows TYPE ROWS COLS [THREADS]");
  const auto type = model::ParseCpuWeightType(argv[1]);
  if (!type.ok() || !type->has_value()) return Fail(std::string("TYPE ") + argv[1]);
  const int64_t rows = std::atoll(argv[2]);
  const int64_t cols = std::atoll(argv[3]);
  const int threads = argc == 5 ? std::atoi(argv[4]) : 2;
  std::vector<float> values(rows * cols);
  if (std::fread(values.data(), sizeof(float), values.size(), stdin) != values.size()) {
    return Fail("stdin holds fewer than ROWS * COLS float32 values");
  }
  const kernels::WeightMatrix w{kernels::GgmlType::kF32, rows, cols,
                                cols * static_cast<int64_t>(sizeof(float)),
                                reinterpret_cast<const uint8_t*>(values.data())};
  std::vector<uint8_t> out(rows * kernels::RowBytes(**type, cols));
  kernels::ThreadPool pool(threads);
  const auto quantized = kernels::QuantizeMatrix(w, **type, out.data(), pool);
  if (!quantized.ok()) return Fail(std::string(quantized.status().message()));
  if (std::fwrite(out.data(), 1, out.size(), stdout) != out.size()) return Fail("write failed");
  return 0;
}
