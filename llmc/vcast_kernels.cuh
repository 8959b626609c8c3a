// vcast_kernels.cuh: virtual casts (quantize, then dequantize) of BF16 GEMM operands to any
// TensorCast-style datatype parsed by llmc/vcast.h, on the GPU. The kernels call vcast.h's
// __host__ __device__ functions per tile, so a cast equals the CPU reference vcast_matrix value for
// value (build/test_vcast checks it); the result is then stored in BF16, which is exact for every
// cast value with at most 8 significant bits inside BF16's range (all the MX, BFP and FP8/FP6/FP4
// datatypes), and rounds to nearest even otherwise (e.g. e5m10, or float scales).
//
// Directions. A GEMM operand is scaled along the GEMM's K dimension (as the MX formats specify), so
// the recipe casts each (rows x cols) row-major tensor along its rows (K = cols: the forward and
// dgrad operands) or along its columns (K = rows: the wgrad operands):
//   rows:    tiles of `tile` consecutive values of a row (t0: the whole row), one thread each,
//            staged through shared memory for tiles of up to 64 values
//   columns: tiles of `tile` consecutive values of a column, one thread each (a warp covers 32
//               neighbouring columns, so its loads are coalesced)
// A datatype without tiles (one tensor scale, or no scale) does not depend on the direction:
// vcast_tensor first reduces the tensor's statistics (amax, min, max over the values M-of-N
// sparsity keeps), then casts every value with the one scale.
// Stochastic rounding draws the bits of element (r, c) from vcast_random_bits(seed, r * cols + c),
// as the CPU reference does, whatever the direction.
#pragma once
#include "cuda_common.h"
#include "vcast.h"

namespace vc = llmc::vcast;

// The statistics of a whole tensor on the device: bits of amax, -min(0, min x) and max(0, max x),
// all non-negative floats, so atomicMax on their bits is a float max.
struct VcastTensorStats {
    uint32_t amax, neg_vmin, vmax;
};

__device__ __forceinline__ vc::TileStats vcast_stats_from_device(const VcastTensorStats* s) {
    vc::TileStats st;
    st.amax = __uint_as_float(s->amax);
    st.vmin = -__uint_as_float(s->neg_vmin);
    st.vmax = __uint_as_float(s->vmax);
    return st;
}

// The tensor is walked in chunks of `chunk` values of a row (a multiple of the sparsity group, so
// the groups fall where the CPU reference puts them: from the start of each row).
inline int vcast_chunk(int cols, const vc::VcastOptions& o) {
    int chunk = vc::vcast_sparsity_on(o) ? std::max(64, o.sparse_n) : 64;
    return cols % chunk == 0 ? chunk : cols;
}

// A thread's statistics into the tensor's: a warp reduction, then one atomicMax per warp and value
// (float max on the bits of non-negative floats; -0.0 counts as +0.0)
__device__ __forceinline__ void vcast_commit_tensor_stats(VcastTensorStats* out, const vc::TileStats& st) {
    uint32_t a = __float_as_uint(st.amax), lo = __float_as_uint(-st.vmin) & 0x7FFFFFFFu, hi = __float_as_uint(st.vmax);
    for (int k = 16; k > 0; k >>= 1) {
        a = max(a, __shfl_xor_sync(0xffffffffu, a, k));
        lo = max(lo, __shfl_xor_sync(0xffffffffu, lo, k));
        hi = max(hi, __shfl_xor_sync(0xffffffffu, hi, k));
    }
    if (threadIdx.x % 32 == 0) {
        atomicMax(&out->amax, a);
        atomicMax(&out->neg_vmin, lo);
        atomicMax(&out->vmax, hi);
    }
}

__global__ void vcast_tensor_stats_kernel(VcastTensorStats* out, const floatX* x, long long chunks, int chunk,
                                          vc::VcastOptions o) {
    vc::TileStats st;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < chunks; i += (long long)gridDim.x * blockDim.x)
        st = vc::vcast_stats_merge(st, vc::vcast_tile_stats(x + i * chunk, chunk, 1, o));
    vcast_commit_tensor_stats(out, st);
}

__global__ void vcast_tensor_apply_kernel(floatX* out, const floatX* x, long long chunks, int chunk, vc::DataType dt,
                                          vc::VcastOptions o, uint64_t seed, const VcastTensorStats* stats) {
    const vc::TileScale ts = vc::vcast_select_scale(dt, vcast_stats_from_device(stats), o.scale);
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < chunks; i += (long long)gridDim.x * blockDim.x) {
        const long long at = i * chunk;
        vc::vcast_tile_apply(x + at, out + at, chunk, 1, dt, ts, o, seed, (uint64_t)at, 1);
    }
}

// Without sparsity, element-wise versions of the two kernels above (coalesced: neighbouring threads
// take neighbouring values). The statistics merge is a max / min, so any order gives the same bits.
__global__ void vcast_tensor_stats_flat_kernel(VcastTensorStats* out, const floatX* x, long long n) {
    vc::TileStats st;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        vc::vcast_stats_add(st, (float)x[i]);
    vcast_commit_tensor_stats(out, st);
}

__global__ void vcast_tensor_apply_flat_kernel(floatX* out, const floatX* x, long long n, vc::DataType dt,
                                               vc::VcastOptions o, uint64_t seed, const VcastTensorStats* stats) {
    const vc::TileScale ts = vc::vcast_select_scale(dt, vcast_stats_from_device(stats), o.scale);
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        const uint32_t bits = o.round == vc::RoundMode::Stochastic ? vc::vcast_random_bits(seed, (uint64_t)i) : 0u;
        out[i] = (floatX)vc::vcast_element((float)x[i], dt, ts, o.round, bits);
    }
}

// ---------------------------------------------------------------------------------------------
// The MX float datatypes (a float number with a power-of-two scale per tile: mxfp8e4/e5,
// mxfp6e3/e2, mxfp4e2 and any other tile size) get kernels with the number format as a
// compile-time constant: the same functions (minifloat_encode / decode) with the format folded
// in, several times faster than the run-time format of the general path, and the same bits.
template <int FMT> struct VcastMxFormat;
template <> struct VcastMxFormat<1> { static constexpr llmc::MinifloatFormat f{4, 3, 7, llmc::Specials::NanOnly, true}; };
template <> struct VcastMxFormat<2> { static constexpr llmc::MinifloatFormat f{5, 2, 15, llmc::Specials::IEEE, true}; };
template <> struct VcastMxFormat<3> { static constexpr llmc::MinifloatFormat f{3, 2, 3, llmc::Specials::FiniteOnly, true}; };
template <> struct VcastMxFormat<4> { static constexpr llmc::MinifloatFormat f{2, 3, 1, llmc::Specials::FiniteOnly, true}; };
template <> struct VcastMxFormat<5> { static constexpr llmc::MinifloatFormat f{2, 1, 1, llmc::Specials::FiniteOnly, true}; };
static const int VCAST_MX_FORMATS = 5;

// Which of the formats above a datatype is (1..5), or 0: the general path
inline int vcast_mx_format(const vc::DataType& dt, const vc::VcastOptions& o) {
    if (dt.num.kind != vc::NumKind::Float || !dt.scale.present || dt.scale.scale.kind != vc::NumKind::Exponent ||
        dt.scale.tile_kind == vc::TileKind::Tensor || vc::vcast_sparsity_on(o))
        return 0;
    const llmc::MinifloatFormat fs[VCAST_MX_FORMATS] = {VcastMxFormat<1>::f, VcastMxFormat<2>::f, VcastMxFormat<3>::f,
                                                         VcastMxFormat<4>::f, VcastMxFormat<5>::f};
    const llmc::MinifloatFormat& m = dt.num.mf;
    for (int i = 0; i < VCAST_MX_FORMATS; i++)
        if (m.exp_bits == fs[i].exp_bits && m.man_bits == fs[i].man_bits && m.bias == fs[i].bias &&
            m.specials == fs[i].specials && m.is_signed == fs[i].is_signed)
            return i + 1;
    return 0;
}

// vcast_element's branch for a float number with an exponent scale, the format F a constant
template <int FMT>
__device__ __forceinline__ float vcast_element_mx(float x, vc::InfNan infnan, int exp, vc::RoundMode rm, uint32_t rbits) {
    constexpr llmc::MinifloatFormat F = VcastMxFormat<FMT>::f;
    if (llmc::is_nan_bits(x)) return x;
    const float y = vc::vc_mul_pow2(x, -exp);
    float q = y; // vcast_quantize_float(y, n, rm, rbits)
    if (!llmc::is_nan_bits(y)) {
        q = llmc::minifloat_decode(vc::mf_encode(y, F, rm, rbits), F);
        if (infnan == vc::InfNan::FNUZ && q == 0.0f) q = 0.0f;
    }
    return vc::vc_mul_pow2(q, exp);
}

// vcast_tile, with the MX fast path for FMT > 0 (no sparsity there)
template <int FMT, class TIn, class TOut>
__device__ __forceinline__ void vcast_tile_any(const TIn* in, TOut* out, int n, int64_t stride, const vc::DataType& dt,
                                               const vc::VcastOptions& o, uint64_t seed, uint64_t index0, int64_t step) {
    if (FMT == 0) {
        vc::vcast_tile(in, out, n, stride, dt, o, seed, index0, step);
        return;
    }
    const vc::TileScale ts = vc::vcast_select_scale(dt, vc::vcast_tile_stats(in, n, stride, o), o.scale);
    const bool stochastic = o.round == vc::RoundMode::Stochastic;
    for (int i = 0; i < n; i++) {
        const uint32_t r = stochastic ? vc::vcast_random_bits(seed, index0 + (uint64_t)((int64_t)i * step)) : 0u;
        out[i * stride] = static_cast<TOut>(vcast_element_mx<FMT == 0 ? 1 : FMT>(static_cast<float>(in[i * stride]),
                                                                                  dt.num.infnan, ts.exp, o.round, r));
    }
}

// Tiles along rows of up to VCAST_SMEM_TILE values: a block of 128 threads stages 128 consecutive
// tiles in shared memory with coalesced loads, each thread casts one tile there (vcast_tile, in
// place: statistics, scale, values), and the block writes them back coalesced. Rows padded by one
// float, so that the threads' tile-strided reads fall on different banks.
static const int VCAST_SMEM_TILE = 64;
template <int FMT>
__global__ void __launch_bounds__(128) vcast_rows_smem_kernel(floatX* out, const floatX* x, long long n, int tile,
                                                              vc::DataType dt, vc::VcastOptions o, uint64_t seed) {
    __shared__ float buf[128 * (VCAST_SMEM_TILE + 1)];
    const long long base = (long long)blockIdx.x * 128 * tile;
    const int count = (int)min((long long)128 * tile, n - base); // a whole number of tiles
    for (int i = threadIdx.x; i < count; i += 128) buf[(i / tile) * (tile + 1) + i % tile] = (float)x[base + i];
    __syncthreads();
    if (threadIdx.x * tile < count) {
        float* t = buf + threadIdx.x * (tile + 1);
        vcast_tile_any<FMT>(t, t, tile, 1, dt, o, seed, (uint64_t)(base + (long long)threadIdx.x * tile), 1);
    }
    __syncthreads();
    for (int i = threadIdx.x; i < count; i += 128) out[base + i] = (floatX)buf[(i / tile) * (tile + 1) + i % tile];
}

// tiles along rows: tile t of row r covers columns [t * tile, (t + 1) * tile)
template <int FMT>
__global__ void vcast_rows_kernel(floatX* out, const floatX* x, int rows, int cols, int tile, vc::DataType dt,
                                  vc::VcastOptions o, uint64_t seed) {
    const int per_row = cols / tile;
    const long long tiles = (long long)rows * per_row;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < tiles; i += (long long)gridDim.x * blockDim.x) {
        const long long at = (i / per_row) * cols + (i % per_row) * tile;
        vcast_tile_any<FMT>(x + at, out + at, tile, 1, dt, o, seed, (uint64_t)at, 1);
    }
}

// tiles along columns: tile t of column c covers rows [t * tile, (t + 1) * tile); consecutive
// threads take consecutive columns
template <int FMT>
__global__ void vcast_cols_kernel(floatX* out, const floatX* x, int rows, int cols, int tile, vc::DataType dt,
                                  vc::VcastOptions o, uint64_t seed) {
    const long long tiles = (long long)(rows / tile) * cols;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < tiles; i += (long long)gridDim.x * blockDim.x) {
        const long long at = (i / cols) * tile * (long long)cols + i % cols;
        vcast_tile_any<FMT>(x + at, out + at, tile, (int64_t)cols, dt, o, seed, (uint64_t)at, (int64_t)cols);
    }
}

inline int vcast_grid(long long work, int threads) {
    return (int)std::max<long long>(1, std::min<long long>(ceil_div(work, (long long)threads), 132LL * 32));
}

template <int FMT>
inline void vcast_launch_tiles(floatX* out, const floatX* x, int rows, int cols, int tile, bool along_cols,
                               const vc::DataType& dt, const vc::VcastOptions& o, uint64_t seed, cudaStream_t stream) {
    const long long n = (long long)rows * cols, tiles = n / tile;
    if (along_cols)
        vcast_cols_kernel<FMT><<<vcast_grid(tiles, 128), 128, 0, stream>>>(out, x, rows, cols, tile, dt, o, seed);
    else if (tile <= VCAST_SMEM_TILE)
        vcast_rows_smem_kernel<FMT><<<(unsigned)ceil_div(tiles, 128LL), 128, 0, stream>>>(out, x, n, tile, dt, o, seed);
    else
        vcast_rows_kernel<FMT><<<vcast_grid(tiles, 128), 128, 0, stream>>>(out, x, rows, cols, tile, dt, o, seed);
}

// Whether a datatype's cast depends on the direction (it has tiles or channels)
inline bool vcast_is_tiled(const vc::DataType& dt) {
    return dt.scale.present && dt.scale.tile_kind != vc::TileKind::Tensor;
}

// The shapes a cast needs: tiles divide the line, sparsity groups divide the tile (or the chunk)
inline bool vcast_shape_ok(const vc::DataType& dt, const vc::VcastOptions& o, int rows, int cols, bool along_cols) {
    const int len = along_cols ? rows : cols;
    if (vcast_is_tiled(dt)) {
        const int tile = dt.scale.tile_kind == vc::TileKind::Channel ? len : dt.scale.tile;
        return len % tile == 0 && (!vc::vcast_sparsity_on(o) || tile % o.sparse_n == 0);
    }
    return !vc::vcast_sparsity_on(o) || cols % o.sparse_n == 0;
}

// out = the virtual cast of x (rows x cols), tiles along the rows (along_cols = false) or the
// columns. stats: device scratch for a tensor scale (one VcastTensorStats). out must not alias x.
inline void vcast_tensor(floatX* out, const floatX* x, int rows, int cols, bool along_cols, const vc::DataType& dt,
                         const vc::VcastOptions& o, uint64_t seed, VcastTensorStats* stats, cudaStream_t stream) {
    if (!vcast_shape_ok(dt, o, rows, cols, along_cols)) {
        fprintf(stderr, "error: vcast: datatype '%s' does not fit a %d x %d tensor cast along its %s\n", dt.name, rows,
                cols, along_cols ? "columns" : "rows");
        exit(1);
    }
    const bool sparse = vc::vcast_sparsity_on(o);
    const long long n = (long long)rows * cols;
    if (!vcast_is_tiled(dt) && !sparse) {
        cudaCheck(cudaMemsetAsync(stats, 0, sizeof(VcastTensorStats), stream));
        if (dt.scale.present) {
            vcast_tensor_stats_flat_kernel<<<vcast_grid(n, 256), 256, 0, stream>>>(stats, x, n);
            cudaCheckLaunch();
        }
        vcast_tensor_apply_flat_kernel<<<vcast_grid(n, 256), 256, 0, stream>>>(out, x, n, dt, o, seed, stats);
        cudaCheckLaunch();
        return;
    }
    if (!vcast_is_tiled(dt)) {
        const int chunk = vcast_chunk(cols, o);
        const long long chunks = (long long)rows * cols / chunk;
        cudaCheck(cudaMemsetAsync(stats, 0, sizeof(VcastTensorStats), stream));
        if (dt.scale.present) {
            vcast_tensor_stats_kernel<<<vcast_grid(chunks, 256), 256, 0, stream>>>(stats, x, chunks, chunk, o);
            cudaCheckLaunch();
        }
        vcast_tensor_apply_kernel<<<vcast_grid(chunks, 256), 256, 0, stream>>>(out, x, chunks, chunk, dt, o, seed, stats);
        cudaCheckLaunch();
        return;
    }
    const int len = along_cols ? rows : cols;
    const int tile = dt.scale.tile_kind == vc::TileKind::Channel ? len : dt.scale.tile;
    switch (vcast_mx_format(dt, o)) {
        case 1: vcast_launch_tiles<1>(out, x, rows, cols, tile, along_cols, dt, o, seed, stream); break;
        case 2: vcast_launch_tiles<2>(out, x, rows, cols, tile, along_cols, dt, o, seed, stream); break;
        case 3: vcast_launch_tiles<3>(out, x, rows, cols, tile, along_cols, dt, o, seed, stream); break;
        case 4: vcast_launch_tiles<4>(out, x, rows, cols, tile, along_cols, dt, o, seed, stream); break;
        case 5: vcast_launch_tiles<5>(out, x, rows, cols, tile, along_cols, dt, o, seed, stream); break;
        default: vcast_launch_tiles<0>(out, x, rows, cols, tile, along_cols, dt, o, seed, stream); break;
    }
    cudaCheckLaunch();
}

// ---------------------------------------------------------------------------------------------
// Telemetry (-lq): sums over a tensor of (x' - x)^2, x^2, the count and the non-zero values cast
// to zero, in double; one atomic per block and term.
static const int VCAST_STATS = 4;

__global__ void vcast_error_kernel(double* sums, const floatX* x, const floatX* xq, long long n) {
    double e2 = 0, x2 = 0, cnt = 0, ftz = 0;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        const float a = (float)x[i], q = (float)xq[i];
        if (!isfinite(a) || !isfinite(q)) continue;
        const double d = (double)q - a;
        e2 += d * d;
        x2 += (double)a * a;
        cnt += 1;
        ftz += (a != 0.0f && q == 0.0f) ? 1 : 0;
    }
    double v[VCAST_STATS] = {e2, x2, cnt, ftz};
    __shared__ double part[VCAST_STATS][32];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (int k = 0; k < VCAST_STATS; k++) {
        for (int o = 16; o > 0; o >>= 1) v[k] += __shfl_xor_sync(0xffffffffu, v[k], o);
        if (lane == 0) part[k][warp] = v[k];
    }
    __syncthreads();
    if (threadIdx.x < VCAST_STATS) {
        double s = 0;
        for (int w = 0; w < (int)blockDim.x / 32; w++) s += part[threadIdx.x][w];
        atomicAdd(sums + threadIdx.x, s);
    }
}

inline void vcast_error(double* sums, const floatX* x, const floatX* xq, long long n, cudaStream_t stream) {
    vcast_error_kernel<<<vcast_grid(n, 256), 256, 0, stream>>>(sums, x, xq, n);
    cudaCheckLaunch();
}
