// Y = X W^T (+ b) for a few rows of X, reading W once: the linear layers of a decode or verify forward on a CPU.
// Called through ctypes by fastrl/models/cpu_linear.py, which documents when it runs; built at first use by
// fastrl/models/kernel_build.py (g++ -O3 -march=native).
//
// At a few rows PyTorch's CPU product streams a large weight once per row (SmolLM2's 49152 x 576 LM head with torch
// 2.13, one thread: 7.3 ms at one row, 14.8 at two, 22.3 at three), while the product is bound by reading the weight
// once (this kernel: 3.4, 3.6, 3.9 ms).
// This kernel reads each weight row once for up to ROWS input rows and keeps their dot products in vector registers.
// A row's result is computed by the same operations in the same order whatever the other rows are and however many
// there are.
#include <cstdint>

#include "paged_attention.h"

namespace {

using fastrl::hsum;
using fastrl::Vec;

constexpr int ROWS = 16;  // input rows per pass over the weight

// y[r, o] = sum_k x[r, k] w[o, k] (+ bias[o]) for N rows: x [N, k_in] with row stride x_stride, w [n_out, k_in]
// contiguous, y [N, n_out] with row stride y_stride. N is a template argument so that the N accumulators stay in
// registers; each row's sum runs in the same order for every N.
template <typename T, int N>
void pass(const T* x, int64_t x_stride, const T* w, const T* bias, int64_t n_out, int64_t k_in, T* y,
          int64_t y_stride) {
    typedef typename Vec<T>::type V;
    constexpr int L = Vec<T>::lanes;
    const int64_t k_vec = k_in / L * L;
    for (int64_t o = 0; o < n_out; o++) {
        const T* row = w + o * k_in;
        V acc[N];
        for (int i = 0; i < N; i++) acc[i] = V{};
        for (int64_t k = 0; k < k_vec; k += L) {
            V wv;
            __builtin_memcpy(&wv, row + k, sizeof(V));
            for (int i = 0; i < N; i++) {
                V xv;
                __builtin_memcpy(&xv, x + i * x_stride + k, sizeof(V));
                acc[i] += wv * xv;
            }
        }
        for (int i = 0; i < N; i++) {
            T s = hsum(acc[i]);
            for (int64_t k = k_vec; k < k_in; k++) s += row[k] * x[i * x_stride + k];
            y[i * y_stride + o] = bias ? s + bias[o] : s;
        }
    }
}

template <typename T, int N = ROWS>
void pass_of(int n, const T* x, int64_t x_stride, const T* w, const T* bias, int64_t n_out, int64_t k_in, T* y,
             int64_t y_stride) {
    if constexpr (N > 1) {
        if (n < N) return pass_of<T, N - 1>(n, x, x_stride, w, bias, n_out, k_in, y, y_stride);
    }
    pass<T, N>(x, x_stride, w, bias, n_out, k_in, y, y_stride);
}

// Rows in passes of ROWS (the weight is read once per pass).
template <typename T>
void product(const T* x, int64_t x_stride, int64_t rows, const T* w, const T* bias, int64_t n_out, int64_t k_in,
             T* y, int64_t y_stride) {
    for (int64_t first = 0; first < rows; first += ROWS) {
        const int n = static_cast<int>(rows - first < ROWS ? rows - first : ROWS);
        pass_of<T>(n, x + first * x_stride, x_stride, w, bias, n_out, k_in, y + first * y_stride, y_stride);
    }
}

}  // namespace

extern "C" {

void fastrl_small_linear_f32(const float* x, int64_t x_stride, int64_t rows, const float* w, const float* bias,
                             int64_t n_out, int64_t k_in, float* y, int64_t y_stride) {
    product<float>(x, x_stride, rows, w, bias, n_out, k_in, y, y_stride);
}

void fastrl_small_linear_f64(const double* x, int64_t x_stride, int64_t rows, const double* w, const double* bias,
                             int64_t n_out, int64_t k_in, double* y, int64_t y_stride) {
    product<double>(x, x_stride, rows, w, bias, n_out, k_in, y, y_stride);
}
}
