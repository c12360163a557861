// One EAGLE drafter forward over a few new entries per row, in one call: x = fc([embed(token) | feature]) (a fused
// drafter's policy states fused to one feature first), then a
// Llama decoder layer without an input norm (q/k/v, RoPE, the new K/V stored in the paged cache, paged attention
// under the forward's mask, o, residual, RMS norm, SwiGLU MLP, residual). Called through ctypes by
// fastrl/speculative/cpu_drafter_step.py, which documents when it runs; built at first use by
// fastrl/models/kernel_build.py (g++ -O3 -march=native).
//
// At a few rows per forward a drafter step on a CPU is mostly per-op overhead (dozens of small tensor ops, each a
// few microseconds) around matrix-vector products that stream the weights once; here the products read each weight
// row once for up to QT input rows, and everything between them is a loop over a few hundred values.
#include <cmath>
#include <cstdint>
#include <vector>

#include "paged_attention.h"

namespace {

using fastrl::hsum;
using fastrl::Layout;
using fastrl::QT;
using fastrl::Vec;

// The weights, in the order of the pointer array the caller passes (a bias may be null).
enum Weight { EMBED, FUSE_W, FC_W, FC_B, Q_W, Q_B, K_W, K_B, V_W, V_B, O_W, O_B, NORM_W, GATE_W, UP_W, DOWN_W, WEIGHTS };
// The sizes, in the order of the int64 array the caller passes.
enum Dim { ROWS, QUERIES, HIDDEN, FEATURES, HEADS, KV_HEADS, HEAD_DIM, INTERMEDIATE, MASK_LEN, COLUMNS, PAGE_SIZE, DIMS };

// Y[r, n] = sum_k W[n, k] X[r, k] (+ bias[n]) for R rows: W [N, K], X [R, K], Y [R, N], all contiguous. Each weight
// row is read once per QT input rows.
template <typename T>
void matvec(const T* w, const T* bias, int64_t n_out, int64_t k_in, const T* x, int64_t rows, T* y) {
    typedef typename Vec<T>::type V;
    constexpr int L = Vec<T>::lanes;
    const int64_t k_vec = k_in / L * L;
    for (int64_t first = 0; first < rows; first += QT) {
        const int n = static_cast<int>(rows - first < QT ? rows - first : QT);
        const T* xs[QT];
        for (int i = 0; i < QT; i++) xs[i] = x + (first + (i < n ? i : 0)) * k_in;  // spare places repeat row 0
        for (int64_t o = 0; o < n_out; o++) {
            const T* row = w + o * k_in;
            V acc[QT];
            for (int i = 0; i < QT; i++) acc[i] = V{};
            for (int64_t k = 0; k < k_vec; k += L) {
                const V wv = *reinterpret_cast<const V*>(row + k);
                for (int i = 0; i < QT; i++) acc[i] += wv * *reinterpret_cast<const V*>(xs[i] + k);
            }
            for (int i = 0; i < n; i++) {
                T s = hsum(acc[i]);
                for (int64_t k = k_vec; k < k_in; k++) s += row[k] * xs[i][k];
                y[(first + i) * n_out + o] = bias ? s + bias[o] : s;
            }
        }
    }
}

// Rotates pairs (i, i + hd/2) of each of `heads` heads of one entry by its position's angles (cos/sin computed in
// float32 from float32 frequencies, as fastrl/models/rope.py does).
template <typename T>
void rope(T* x, int64_t heads, int64_t head_dim, const float* cos_sin) {
    const int64_t half = head_dim / 2;
    for (int64_t h = 0; h < heads; h++) {
        T* v = x + h * head_dim;
        for (int64_t i = 0; i < half; i++) {
            const T c = static_cast<T>(cos_sin[i]), s = static_cast<T>(cos_sin[half + i]);
            const T a = v[i], b = v[half + i];
            v[i] = a * c - b * s;
            v[half + i] = b * c + a * s;
        }
    }
}

template <typename T>
int step(const T* const* w, const float* inv_freq, const int64_t* d, const int64_t* tokens, const T* features,
         const int64_t* positions, const int64_t* write, T* k_pool, T* v_pool, const int64_t* pages,
         const uint8_t* mask, const int64_t* extents, double eps, T* out) {
    const int64_t rows = d[ROWS] * d[QUERIES], hidden = d[HIDDEN], heads = d[HEADS], kv_heads = d[KV_HEADS];
    const int64_t hd = d[HEAD_DIM], inter = d[INTERMEDIATE], qw = heads * hd, kw = kv_heads * hd;
    std::vector<T> in(rows * 2 * hidden), x(rows * hidden), q(rows * qw), k(rows * kw), v(rows * kw);
    std::vector<T> att(rows * qw), h(rows * hidden), gate(rows * inter), up(rows * inter);
    std::vector<T> scores(QT * d[MASK_LEN]);
    std::vector<float> cos_sin(hd);
    if (d[FEATURES] != hidden) {  // a fused drafter's policy states [.., m * hidden]: fuse them to hidden first
        matvec<T>(w[FUSE_W], nullptr, hidden, d[FEATURES], features, rows, h.data());
        features = h.data();
    }
    for (int64_t r = 0; r < rows; r++) {
        const T* e = w[EMBED] + tokens[r] * hidden;
        for (int64_t c = 0; c < hidden; c++) {
            in[r * 2 * hidden + c] = e[c];
            in[r * 2 * hidden + hidden + c] = features[r * hidden + c];
        }
    }
    matvec<T>(w[FC_W], w[FC_B], hidden, 2 * hidden, in.data(), rows, x.data());
    matvec<T>(w[Q_W], w[Q_B], qw, hidden, x.data(), rows, q.data());
    matvec<T>(w[K_W], w[K_B], kw, hidden, x.data(), rows, k.data());
    matvec<T>(w[V_W], w[V_B], kw, hidden, x.data(), rows, v.data());
    for (int64_t r = 0; r < rows; r++) {
        const float p = static_cast<float>(positions[r]);
        for (int64_t i = 0; i < hd / 2; i++) {
            const float angle = p * inv_freq[i];
            cos_sin[i] = std::cos(angle);
            cos_sin[hd / 2 + i] = std::sin(angle);
        }
        rope<T>(q.data() + r * qw, heads, hd, cos_sin.data());
        rope<T>(k.data() + r * kw, kv_heads, hd, cos_sin.data());
        for (int64_t c = 0; c < kw; c++) {  // [kv_heads, hd] at the entry, as the pool lays it out
            k_pool[write[r] * kw + c] = k[r * kw + c];
            v_pool[write[r] * kw + c] = v[r * kw + c];
        }
    }
    const Layout at{heads, kv_heads, d[QUERIES], d[MASK_LEN], d[COLUMNS], d[PAGE_SIZE],
                    d[QUERIES] * qw, hd, qw, d[QUERIES] * qw, hd, qw};  // q and att: [rows, queries, heads, hd]
    const T scale = static_cast<T>(1 / std::sqrt(static_cast<double>(hd)));
    if (!fastrl::attend<T>(hd, q.data(), k_pool, v_pool, pages, mask, extents, att.data(), d[ROWS], at, scale,
                           scores.data()))
        return 1;
    matvec<T>(w[O_W], w[O_B], hidden, qw, att.data(), rows, h.data());
    for (int64_t i = 0; i < rows * hidden; i++) h[i] += x[i];
    for (int64_t r = 0; r < rows; r++) {  // x <- RMS norm of h (statistics in double)
        double sq = 0;
        for (int64_t c = 0; c < hidden; c++) sq += static_cast<double>(h[r * hidden + c]) * h[r * hidden + c];
        const T scale = static_cast<T>(1 / std::sqrt(sq / hidden + eps));
        for (int64_t c = 0; c < hidden; c++) x[r * hidden + c] = w[NORM_W][c] * (h[r * hidden + c] * scale);
    }
    matvec<T>(w[GATE_W], nullptr, inter, hidden, x.data(), rows, gate.data());
    matvec<T>(w[UP_W], nullptr, inter, hidden, x.data(), rows, up.data());
    for (int64_t i = 0; i < rows * inter; i++) gate[i] = gate[i] / (1 + std::exp(-gate[i])) * up[i];
    matvec<T>(w[DOWN_W], nullptr, hidden, inter, gate.data(), rows, out);
    for (int64_t i = 0; i < rows * hidden; i++) out[i] += h[i];
    return 0;
}

}  // namespace

// weights: WEIGHTS pointers (see Weight; biases and the fuse may be null) of one dtype, contiguous; inv_freq
// [head_dim / 2] float32; dims: DIMS sizes (see Dim); tokens, positions, write [rows * queries]; features
// [rows * queries, features] (features = hidden, or the fuse's input width);
// k, v [entries, kv_heads, head_dim] (the drafter's one-layer pool); pages [rows, columns]; mask [rows, queries,
// mask_len] bytes; extents [rows]; out [rows * queries, hidden]. Returns 0, or 1 for a head size without an
// instance (the new entries may be stored, out is not written).
#define FASTRL_ENTRY(NAME, T)                                                                                      \
    extern "C" int NAME(const void* const* weights, const float* inv_freq, const int64_t* dims,                  \
                        const int64_t* tokens, const T* features, const int64_t* positions, const int64_t* write, \
                        T* k, T* v, const int64_t* pages, const uint8_t* mask, const int64_t* extents, double eps,  \
                        T* out) {                                                                                 \
        return step<T>(reinterpret_cast<const T* const*>(weights), inv_freq, dims, tokens, features, positions,   \
                       write, k, v, pages, mask, extents, eps, out);                                              \
    }
FASTRL_ENTRY(fastrl_drafter_step_f32, float)
FASTRL_ENTRY(fastrl_drafter_step_f64, double)
