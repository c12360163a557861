// Paged attention for a CPU, shared by fastrl's kernels (paged_attention.cpp, drafter_step.cpp): every query of a
// row attends over that row's own keys, read in place from the pages the page table names, under a bool mask
// (causal, or [prefix | tree ancestors]).
//
// Per (row, kv head) the queries of that head's group are taken QT at a time: one pass over the row's keys computes
// their scores (the keys loaded once for the QT queries, a head's dot product in vector registers), a pass takes the
// softmax's exponentials (masked keys get a very negative finite score, whose exponential is exactly 0), and a pass
// over the values accumulates the outputs in registers. A query's result depends only on its own row's keys and
// mask, never on the other rows of the batch or on how many keys they have.
#pragma once
#include <cmath>
#include <cstdint>

namespace fastrl {

template <typename T> struct Vec;
template <> struct Vec<float> {
    typedef float type __attribute__((vector_size(32), aligned(4)));
    static constexpr int lanes = 8;
};
template <> struct Vec<double> {
    typedef double type __attribute__((vector_size(32), aligned(8)));
    static constexpr int lanes = 4;
};

template <typename T> inline T masked_score();
template <> inline float masked_score<float>() { return -3.0e38f; }
template <> inline double masked_score<double>() { return -1.0e300; }

inline float hsum(Vec<float>::type v) { return ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7])); }
inline double hsum(Vec<double>::type v) { return (v[0] + v[2]) + (v[1] + v[3]); }

constexpr int QT = 4;  // queries per tile

struct Layout {
    int64_t heads, kv_heads, queries, mask_len, columns, page_size;
    int64_t q_row, q_head, q_query, out_row, out_head, out_query;  // element strides of q and out
};

// Key (or value) j of kv head kh of a row, from the page the row's table names, into C vector registers.
template <typename T, int D>
inline void load_entry(typename Vec<T>::type* out, const T* pool, const int64_t* row_pages, int64_t j, int64_t kh,
                       const Layout& at) {
    typedef typename Vec<T>::type V;
    constexpr int L = Vec<T>::lanes;
    const int64_t entry = row_pages[j / at.page_size] * at.page_size + j % at.page_size;
    const T* at_entry = pool + (entry * at.kv_heads + kh) * D;
    for (int c = 0; c < D / L; c++) out[c] = *reinterpret_cast<const V*>(at_entry + c * L);
}

// Up to QT queries (n of them real) of one row and kv head over the row's keys [0, extent).
template <typename T, int D>
void tile(const T* const* qs, T* const* outs, const uint8_t* const* masks, int n, const T* k_pool, const T* v_pool,
          const int64_t* row_pages, int64_t extent, int64_t kh, const Layout& at, T scale, T* scores) {
    typedef typename Vec<T>::type V;
    constexpr int L = Vec<T>::lanes, C = D / L;
    V qv[QT][C];
    T best[QT], total[QT];
    for (int i = 0; i < QT; i++) {
        best[i] = masked_score<T>();
        for (int c = 0; c < C; c++) qv[i][c] = *reinterpret_cast<const V*>(qs[i] + c * L);
    }
    for (int64_t j = 0; j < extent; j++) {
        V kv[C];
        load_entry<T, D>(kv, k_pool, row_pages, j, kh, at);
        for (int i = 0; i < QT; i++) {
            V acc = qv[i][0] * kv[0];
            for (int c = 1; c < C; c++) acc += qv[i][c] * kv[c];
            const T s = (i < n && masks[i][j]) ? hsum(acc) * scale : masked_score<T>();
            scores[i * at.mask_len + j] = s;
            best[i] = s > best[i] ? s : best[i];
        }
    }
    for (int i = 0; i < QT; i++) {
        T* sc = scores + i * at.mask_len;
        T sum = 0;
        for (int64_t j = 0; j < extent; j++) {
            sc[j] = std::exp(sc[j] - best[i]);
            sum += sc[j];
        }
        total[i] = sum;
    }
    V acc[QT][C];
    for (int i = 0; i < QT; i++)
        for (int c = 0; c < C; c++) acc[i][c] = V{};
    for (int64_t j = 0; j < extent; j++) {
        V vv[C];
        load_entry<T, D>(vv, v_pool, row_pages, j, kh, at);
        for (int i = 0; i < QT; i++) {
            // a key the query may not see adds nothing, whatever its value (0 * NaN would be NaN: a rejected draft
            // whose values are not finite must not reach the other nodes of its tree)
            if (!(i < n && masks[i][j])) continue;
            const T p = scores[i * at.mask_len + j];
            for (int c = 0; c < C; c++) acc[i][c] += p * vv[c];
        }
    }
    for (int i = 0; i < n; i++) {
        const T inv = total[i] > 0 ? 1 / total[i] : 0;
        for (int c = 0; c < C; c++) *reinterpret_cast<V*>(outs[i] + c * L) = acc[i][c] * inv;
    }
}

template <typename T, int D>
void run(const T* q, const T* k_pool, const T* v_pool, const int64_t* pages, const uint8_t* mask,
         const int64_t* extents, T* out, int64_t rows, const Layout& at, T scale, T* scores) {
    const int64_t group = at.heads / at.kv_heads, nq = group * at.queries;
    for (int64_t b = 0; b < rows; b++) {
        for (int64_t kh = 0; kh < at.kv_heads; kh++) {
            for (int64_t first = 0; first < nq; first += QT) {
                const T* qs[QT];
                T* outs[QT];
                const uint8_t* masks[QT];
                const int n = static_cast<int>(nq - first < QT ? nq - first : QT);
                for (int i = 0; i < QT; i++) {  // a tile's spare places repeat its first query (not written back)
                    const int64_t qi = first + (i < n ? i : 0), g = qi / at.queries, s = qi % at.queries;
                    const int64_t h = kh * group + g;
                    qs[i] = q + b * at.q_row + h * at.q_head + s * at.q_query;
                    outs[i] = out + b * at.out_row + h * at.out_head + s * at.out_query;
                    masks[i] = mask + (b * at.queries + s) * at.mask_len;
                }
                tile<T, D>(qs, outs, masks, n, k_pool, v_pool, pages + b * at.columns, extents[b], kh, at, scale,
                           scores);
            }
        }
    }
}

// run<T, D> for head size `dim` (the head sizes of fastrl/models/cpu_attention.py's HEAD_DIMS); false, nothing
// written, for a head size without an instance.
template <typename T>
bool attend(int64_t dim, const T* q, const T* k_pool, const T* v_pool, const int64_t* pages, const uint8_t* mask,
            const int64_t* extents, T* out, int64_t rows, const Layout& at, T scale, T* scores) {
#define FASTRL_HEAD(D) \
    case D: run<T, D>(q, k_pool, v_pool, pages, mask, extents, out, rows, at, scale, scores); return true;
    switch (dim) {
        FASTRL_HEAD(16) FASTRL_HEAD(32) FASTRL_HEAD(64) FASTRL_HEAD(80) FASTRL_HEAD(96) FASTRL_HEAD(128)
        FASTRL_HEAD(256)
        default: return false;
    }
#undef FASTRL_HEAD
}

}  // namespace fastrl
