// The paged attention kernel's entry points for fastrl/models/cpu_attention.py (ctypes), which documents the layouts
// and falls back to scaled_dot_product_attention where this kernel does not apply; the kernel itself is in
// paged_attention.h. Built at first use by fastrl/models/kernel_build.py (g++ -O3 -march=native).
#include <cstdint>

#include "paged_attention.h"

using fastrl::Layout;
using fastrl::QT;

// q, out [rows, heads, queries, dim] with the given element strides (dim contiguous); k, v [entries, kv_heads,
// dim]; pages [rows, columns] (only each row's first ceil(extent / page_size) read); mask [rows, queries, mask_len]
// bytes (nonzero = may attend); extents [rows] (<= mask_len, <= columns * page_size); scores [QT, mask_len] scratch.
// k, v, mask and scores contiguous. Returns 0, or 1 for a head size without an instance (nothing written).
#define FASTRL_ENTRY(NAME, T)                                                                                    \
    extern "C" int NAME(const T* q, const T* k, const T* v, const int64_t* pages, const uint8_t* mask,          \
                        const int64_t* extents, T* out, int64_t rows, int64_t heads, int64_t kv_heads,          \
                        int64_t queries, int64_t dim, int64_t mask_len, int64_t columns, int64_t page_size,     \
                        int64_t q_row, int64_t q_head, int64_t q_query, int64_t out_row, int64_t out_head,      \
                        int64_t out_query, double scale, T* scores) {                                           \
        const Layout at{heads, kv_heads, queries, mask_len, columns,  page_size,                                \
                        q_row, q_head,   q_query, out_row,  out_head, out_query};                               \
        return fastrl::attend<T>(dim, q, k, v, pages, mask, extents, out, rows, at, (T)scale, scores) ? 0 : 1;   \
    }
FASTRL_ENTRY(fastrl_paged_attention_f32, float)
FASTRL_ENTRY(fastrl_paged_attention_f64, double)

// Each row's extent, 1 + the last key any of its queries may attend (0 when none may), into extents [rows]; returns
// their sum. mask [rows, queries, mask_len] bytes, contiguous. A query's row is scanned from its end down to the
// extent found so far, so a row costs about its padding, once.
extern "C" int64_t fastrl_mask_extents(const uint8_t* mask, int64_t rows, int64_t queries, int64_t mask_len,
                                       int64_t* extents) {
    int64_t total = 0;
    for (int64_t b = 0; b < rows; b++) {
        int64_t extent = 0;
        for (int64_t s = 0; s < queries; s++) {
            const uint8_t* m = mask + (b * queries + s) * mask_len;
            for (int64_t j = mask_len; j > extent; j--) {
                if (m[j - 1]) {
                    extent = j;
                    break;
                }
            }
        }
        extents[b] = extent;
        total += extent;
    }
    return total;
}

extern "C" int fastrl_paged_attention_tile() { return QT; }
