#pragma once

#include <cstdint>
#include <vector>

namespace winnow::cache {

// A probe segment (CompressionSession::SetProbe): tokens run after the context, and the context
// keys their rows score, [scored_begin, scored_end). A segment that repeats one piece of the
// context scores that piece only, as KVzip's chunked scoring does: its rows' attention elsewhere
// says where the model looked while reproducing this piece, not what another piece needs.
struct ProbeSegment {
  std::vector<int32_t> tokens;
  int32_t scored_begin = 0;
  int32_t scored_end = 0;
};

}  // namespace winnow::cache
