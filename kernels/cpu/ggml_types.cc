#include "kernels/cpu/ggml_types.h"

#include <array>

namespace winnow::kernels {
namespace {

constexpr int64_t kQK = 256;  // QK_K: super-block size of the K-quants

// Indexed by on-disk id. Ids ggml has retired (4, 5: Q4_2/Q4_3; 31-33: the repacked Q4_0_x_x)
// stay unknown so that files using them fail with a clear message. The IQ/TQ/MXFP4 types are
// listed so a file using them parses (and reports its types) even though DequantizeRow cannot
// convert them.
constexpr GgmlTypeTraits kUnknown = {"unknown", 0, 0, false};
constexpr std::array<GgmlTypeTraits, 40> kTraits = {{
    /*0*/ {"F32", 1, 4, true},
    /*1*/ {"F16", 1, 2, true},
    /*2*/ {"Q4_0", 32, 2 + 16, true},
    /*3*/ {"Q4_1", 32, 2 + 2 + 16, true},
    /*4*/ kUnknown,
    /*5*/ kUnknown,
    /*6*/ {"Q5_0", 32, 2 + 4 + 16, true},
    /*7*/ {"Q5_1", 32, 2 + 2 + 4 + 16, true},
    /*8*/ {"Q8_0", 32, 2 + 32, true},
    // ggml's block_q8_1 holds two halves (d, s); older gguf-py tables still say 2 floats.
    /*9*/ {"Q8_1", 32, 2 + 2 + 32, true},
    /*10*/ {"Q2_K", kQK, 2 + 2 + kQK / 16 + kQK / 4, true},
    /*11*/ {"Q3_K", kQK, 2 + kQK / 4 + kQK / 8 + 12, true},
    /*12*/ {"Q4_K", kQK, 2 + 2 + 12 + kQK / 2, true},
    /*13*/ {"Q5_K", kQK, 2 + 2 + 12 + kQK / 8 + kQK / 2, true},
    /*14*/ {"Q6_K", kQK, kQK / 2 + kQK / 4 + kQK / 16 + 2, true},
    /*15*/ {"Q8_K", kQK, 4 + kQK + kQK / 8, true},
    /*16*/ {"IQ2_XXS", kQK, 2 + kQK / 4, true},
    /*17*/ {"IQ2_XS", kQK, 2 + kQK / 4 + kQK / 32, true},
    /*18*/ {"IQ3_XXS", kQK, 2 + kQK / 4 + kQK / 8, true},
    /*19*/ {"IQ1_S", kQK, 2 + kQK / 8 + kQK / 16, true},
    /*20*/ {"IQ4_NL", 32, 2 + 16, true},
    /*21*/ {"IQ3_S", kQK, 2 + kQK / 4 + kQK / 8 + kQK / 32 + 4, true},
    /*22*/ {"IQ2_S", kQK, 2 + kQK / 4 + kQK / 16, true},
    /*23*/ {"IQ4_XS", kQK, 2 + 2 + kQK / 2 + kQK / 64, true},
    /*24*/ {"I8", 1, 1, true},
    /*25*/ {"I16", 1, 2, true},
    /*26*/ {"I32", 1, 4, true},
    /*27*/ {"I64", 1, 8, true},
    /*28*/ {"F64", 1, 8, true},
    /*29*/ {"IQ1_M", kQK, kQK / 8 + kQK / 16 + kQK / 32, true},
    /*30*/ {"BF16", 1, 2, true},
    /*31*/ kUnknown,
    /*32*/ kUnknown,
    /*33*/ kUnknown,
    /*34*/ {"TQ1_0", kQK, 2 + 4 * 13, true},
    /*35*/ {"TQ2_0", kQK, 2 + 64, true},
    /*36*/ kUnknown,
    /*37*/ kUnknown,
    /*38*/ kUnknown,
    /*39*/ {"MXFP4", 32, 1 + 16, true},
}};

}  // namespace

GgmlTypeTraits TraitsOf(uint32_t type_id) {
  if (type_id >= kTraits.size()) return kUnknown;
  return kTraits[type_id];
}

}  // namespace winnow::kernels
