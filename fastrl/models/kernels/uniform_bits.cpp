// The sampler's counter-based uniforms on a CPU: for every (row, vocab index) the top 24 bits of the hash that
// fastrl/sampling/noise.py documents, in one pass. Called through ctypes by fastrl/sampling/cpu_noise.py; built at
// first use by fastrl/models/kernel_build.py (g++ -O3 -march=native).
//
// PyTorch computes the same words in ~60 element-wise ops over [rows, vocab] and ~40 more for the rows' keys, each a
// dispatch and a pass over memory: at batch 1 on the bundled model that is most of a decode round's host time. The
// arithmetic is the module's exactly (32-bit words, products modulo 2**32, logical shifts), so the bits are equal.
#include <cstdint>

namespace {

constexpr uint32_t MUL_A = 0x2C1B3C6Du;
constexpr uint32_t MUL_B = 0x297A2D39u;
constexpr uint32_t SALT_INDEX = 0xC2B2AE35u;

inline uint32_t mix32(uint32_t x) {
    x ^= x >> 15;
    x *= MUL_A;
    x ^= x >> 12;
    x *= MUL_B;
    x ^= x >> 15;
    return x;
}

}  // namespace

extern "C" {

// out[r, j] = mix32(mix32(lane_a(r) ^ mix32(j ^ SALT_INDEX)) + lane_b(r)) >> 8 for r < rows, j < vocab; a row's two
// lanes absorb the low and high words of its seed and position, each lane starting from its salt (the stream's).
// seeds, positions [rows] int64; out [rows, vocab] int32, contiguous.
void fastrl_uniform_bits(const int64_t* seeds, const int64_t* positions, int64_t rows, int64_t vocab, uint32_t salt_a,
                         uint32_t salt_b, int32_t* out) {
    for (int64_t r = 0; r < rows; r++) {
        const uint64_t seed = static_cast<uint64_t>(seeds[r]);
        const uint64_t position = static_cast<uint64_t>(positions[r]);
        const uint32_t words[4] = {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32),
                                   static_cast<uint32_t>(position), static_cast<uint32_t>(position >> 32)};
        uint32_t lane_a = mix32(words[0] ^ salt_a);
        uint32_t lane_b = mix32(words[0] ^ salt_b);
        for (int k = 1; k < 4; k++) {
            lane_a = mix32(lane_a ^ words[k]);
            lane_b = mix32(lane_b ^ words[k]);
        }
        int32_t* row = out + r * vocab;
        for (int64_t j = 0; j < vocab; j++) {
            const uint32_t key = mix32(static_cast<uint32_t>(j) ^ SALT_INDEX);
            const uint32_t h = mix32(mix32(lane_a ^ key) + lane_b);
            row[j] = static_cast<int32_t>(h >> 8);
        }
    }
}

}  // extern "C"
