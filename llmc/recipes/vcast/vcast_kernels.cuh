// recipes/vcast/vcast_kernels.cuh: virtual casts (quantize, then dequantize) of BF16 GEMM operands to any
// TensorCast-style datatype parsed by llmc/formats/vcast.h, on the GPU. The kernels call formats/vcast.h's
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
// The MX float datatypes with 32-value tiles on tensors of whole 32 x 128 patches (every linear of
// the recipe at B*T a multiple of 32) take vcast_mx32_kernel instead: one read of the tensor for
// either direction or both (the output gradient, with its bias gradient's column sums), values in
// registers between the amax and the cast, 16-byte accesses.
// A datatype without tiles (one tensor scale, or no scale) does not depend on the direction:
// vcast_tensor first reduces the tensor's statistics (amax, min, max over the values M-of-N
// sparsity keeps), then casts every value with the one scale.
// Stochastic rounding draws the bits of element (r, c) from vcast_random_bits(seed, r * cols + c),
// as the CPU reference does, whatever the direction.
#pragma once
#include <cuda_fp8.h>
#include "llmc/cuda_common.h"
#include "llmc/matmul.cuh" // bias_backward, bias_backward_reduce
#include "llmc/formats/vcast.h"

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

// The same with round-to-nearest-even by minifloat_round_even (the same values, fewer instructions)
template <int FMT>
__device__ __forceinline__ float vcast_element_mx_even(float x, vc::InfNan infnan, int exp) {
    constexpr llmc::MinifloatFormat F = VcastMxFormat<FMT>::f;
    static_assert(llmc::minifloat_round_even_ok(F), "minifloat_round_even needs normal quanta");
    if (llmc::is_nan_bits(x)) return x;
    float q = llmc::minifloat_round_even(vc::vc_mul_pow2(x, -exp), F);
    if (infnan == vc::InfNan::FNUZ && q == 0.0f) q = 0.0f;
    return vc::vc_mul_pow2(q, exp);
}
template <int FMT>
__device__ __forceinline__ float vcast_mx_value(float x, vc::InfNan infnan, int exp, vc::RoundMode rm, uint32_t rbits) {
    return rm == vc::RoundMode::Even ? vcast_element_mx_even<FMT>(x, infnan, exp)
                                     : vcast_element_mx<FMT>(x, infnan, exp, rm, rbits);
}

// Two values of one tile, round to nearest even. FP8 E4M3 / E5M2 (FMT 1, 2) go through the
// hardware conversion (cvt.rn.satfinite.{e4m3,e5m2}x2.f32: to nearest even, saturating at +-max,
// inf included, NaN to NaN; then back through FP16, which holds every FP8 value exactly): the
// values minifloat_round_even gives, two per instruction. build/test_vcast checks every BF16 value
// of the scaled range against the CPU reference.
template <int FMT>
__device__ __forceinline__ float2 vcast_mx_even_pair(float a, float b, vc::InfNan infnan, int exp) {
    if constexpr (FMT == 1 || FMT == 2) {
        if (infnan != vc::InfNan::FNUZ) {
            constexpr __nv_fp8_interpretation_t K = FMT == 1 ? __NV_E4M3 : __NV_E5M2;
            const float2 y = make_float2(vc::vc_mul_pow2(a, -exp), vc::vc_mul_pow2(b, -exp));
            const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(__nv_cvt_float2_to_fp8x2(y, __NV_SATFINITE, K), K);
            const float2 q = __half22float2(__half2(h));
            return make_float2(vc::vc_mul_pow2(q.x, exp), vc::vc_mul_pow2(q.y, exp));
        }
    }
    return make_float2(vcast_element_mx_even<FMT>(a, infnan, exp), vcast_element_mx_even<FMT>(b, infnan, exp));
}

// n (even) consecutive values of one tile in place: element i draws the bits of index
// index0 + i * step (stochastic rounding only)
template <int FMT, int n>
__device__ __forceinline__ void vcast_mx_values(float* v, vc::InfNan infnan, int exp, vc::RoundMode rm, uint64_t seed,
                                                long long index0, long long step) {
    if (rm == vc::RoundMode::Even) {
#pragma unroll
        for (int i = 0; i < n; i += 2) {
            const float2 q = vcast_mx_even_pair<FMT>(v[i], v[i + 1], infnan, exp);
            v[i] = q.x;
            v[i + 1] = q.y;
        }
    } else {
#pragma unroll
        for (int i = 0; i < n; i++) {
            const uint32_t r = rm == vc::RoundMode::Stochastic ? vc::vcast_random_bits(seed, (uint64_t)(index0 + i * step)) : 0u;
            v[i] = vcast_element_mx<FMT>(v[i], infnan, exp, rm, r);
        }
    }
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
        out[i * stride] = static_cast<TOut>(vcast_mx_value<FMT == 0 ? 1 : FMT>(static_cast<float>(in[i * stride]),
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

// ---------------------------------------------------------------------------------------------
// MX datatypes with 32-value tiles (the OCP MX block: every predefined MX name) on a tensor with
// rows % 32 == 0 and cols % 128 == 0: one read for either direction or both. The kernels above
// give each thread a whole tile, two passes over it (statistics, then the cast) and 2-byte
// accesses; this one keeps every value in registers between the passes and moves 16 bytes per
// access. A block of 256 threads walks 32 x 128 patches down the rows (patch p = blockIdx.y,
// + gridDim.y, ...):
//   rows:    thread t holds the patch's 16-byte vectors t and t + 256 (vector v: row v / 16,
//            columns 8 (v % 16) .. + 7), so lanes 4k .. 4k + 3 hold one 32-value row tile: its amax
//            is two xor-shuffles away and each lane casts its 8 values where they are
//   columns: the patch is staged in shared memory (BF16, as read); thread t takes column t % 128
//            and rows 16 (t / 128) .. + 15, the two halves of a column tile swap their amax through
//            shared memory, the cast values go back in place and leave as 16-byte row vectors
//   bias:    (with columns, optional) each thread adds its half-column of x in FP32, row after row,
//            over all of its block's patches; the two halves are added and stored in
//            bias_partials[blockIdx.y][column], which bias_backward_reduce sums over blockIdx.y
//            in a fixed order: deterministic, with the BF16 x as bias_backward reads it.
// Scales and values are those of vcast_tile (vcast_select_scale of the tile's amax over finite
// values; vcast_mx_value), and element (r, c) draws its stochastic bits from index r * cols + c
// in both directions: the same bits as the kernels above.
static const int VCAST_MX32_ROWS = 32, VCAST_MX32_COLS = 128, VCAST_MX32_THREADS = 256;

__device__ __forceinline__ uint32_t vcast_finite_abs_bits(float v) {
    const uint32_t a = __float_as_uint(v) & 0x7FFFFFFFu;
    return a < 0x7F800000u ? a : 0u; // NaN and +-inf never set a scale (vcast_stats_add)
}

template <int FMT>
__global__ void __launch_bounds__(VCAST_MX32_THREADS)
    vcast_mx32_kernel(floatX* out_rows, floatX* out_cols, float* bias_partials, const floatX* x, int rows, int cols,
                      vc::DataType dt, vc::VcastOptions o, uint64_t seed) {
    constexpr int PR = VCAST_MX32_ROWS, PC = VCAST_MX32_COLS, VPR = PC / 8; // 16 vectors per patch row
    __shared__ __align__(16) floatX patch[PR][PC];
    __shared__ uint32_t half_amax[2][PC];
    const int t = threadIdx.x, patches = rows / PR;
    const long long c0 = (long long)blockIdx.x * PC;
    const int ccol = t % PC, chalf = t / PC; // the column pass's column and half
    // the 16-byte vector k of this thread in patch p: its offset in x (and in the outputs)
    auto vec_at = [&](int p, int k) {
        const int v = t + k * VCAST_MX32_THREADS;
        return ((long long)p * PR + v / VPR) * cols + c0 + v % VPR * 8;
    };
    float bias_sum = 0.0f;
    uint4 raw[2], next[2];
    if ((int)blockIdx.y < patches)
        for (int k = 0; k < 2; k++) raw[k] = *reinterpret_cast<const uint4*>(x + vec_at(blockIdx.y, k));
    for (int p = blockIdx.y; p < patches; p += gridDim.y) {
        // the next patch's loads are in flight while this one is cast
        const int pn = p + gridDim.y;
        if (pn < patches)
            for (int k = 0; k < 2; k++) next[k] = *reinterpret_cast<const uint4*>(x + vec_at(pn, k));
        if (out_rows) {
#pragma unroll
            for (int k = 0; k < 2; k++) {
                const floatX* e = reinterpret_cast<const floatX*>(&raw[k]);
                float f[8];
                uint32_t amax = 0u;
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    f[j] = (float)e[j];
                    amax = max(amax, vcast_finite_abs_bits(f[j]));
                }
                amax = max(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
                amax = max(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
                vc::TileStats st;
                st.amax = __uint_as_float(amax);
                const int exp = vc::vcast_select_scale(dt, st, o.scale).exp;
                const long long at = vec_at(p, k);
                vcast_mx_values<FMT, 8>(f, dt.num.infnan, exp, o.round, seed, at, 1);
                uint4 packed;
                __nv_bfloat162* q = reinterpret_cast<__nv_bfloat162*>(&packed);
#pragma unroll
                for (int j = 0; j < 4; j++) q[j] = __floats2bfloat162_rn(f[2 * j], f[2 * j + 1]);
                *reinterpret_cast<uint4*>(out_rows + at) = packed;
            }
        }
        if (out_cols) {
            __syncthreads(); // the previous patch's last reads of `patch` are done
#pragma unroll
            for (int k = 0; k < 2; k++) {
                const int v = t + k * VCAST_MX32_THREADS;
                *reinterpret_cast<uint4*>(&patch[v / VPR][v % VPR * 8]) = raw[k];
            }
            __syncthreads();
            float f[16];
            uint32_t amax = 0u;
#pragma unroll
            for (int i = 0; i < 16; i++) {
                f[i] = (float)patch[chalf * 16 + i][ccol];
                amax = max(amax, vcast_finite_abs_bits(f[i]));
                if (bias_partials) bias_sum += f[i];
            }
            half_amax[chalf][ccol] = amax;
            __syncthreads();
            amax = max(amax, half_amax[chalf ^ 1][ccol]);
            vc::TileStats st;
            st.amax = __uint_as_float(amax);
            const int exp = vc::vcast_select_scale(dt, st, o.scale).exp;
            vcast_mx_values<FMT, 16>(f, dt.num.infnan, exp, o.round, seed, ((long long)p * PR + chalf * 16) * cols + c0 + ccol,
                                     cols);
#pragma unroll
            for (int i = 0; i < 16; i++) patch[chalf * 16 + i][ccol] = (floatX)f[i];
            __syncthreads();
#pragma unroll
            for (int k = 0; k < 2; k++) {
                const int v = t + k * VCAST_MX32_THREADS;
                *reinterpret_cast<uint4*>(out_cols + vec_at(p, k)) = *reinterpret_cast<const uint4*>(&patch[v / VPR][v % VPR * 8]);
            }
        }
        raw[0] = next[0];
        raw[1] = next[1];
    }
    if (bias_partials) {
        __syncthreads(); // half_amax is reused for the halves' sums
        float* half_sum = reinterpret_cast<float*>(&half_amax[0][0]);
        half_sum[chalf * PC + ccol] = bias_sum;
        __syncthreads();
        if (chalf == 0) bias_partials[(long long)blockIdx.y * cols + c0 + ccol] = bias_sum + half_sum[PC + ccol];
    }
}

inline int vcast_grid(long long work, int threads) {
    return (int)std::max<long long>(1, std::min<long long>(ceil_div(work, (long long)threads), 32LL * device_sm_count()));
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

// Whether vcast_mx32_kernel takes a cast: an MX float datatype (vcast_mx_format) with 32-value
// tiles, rows % 32 == 0, cols % 128 == 0, 16-byte aligned tensors
inline bool vcast_mx32_applies(const vc::DataType& dt, const vc::VcastOptions& o, int rows, int cols,
                               const void* x, const void* out) {
    return vcast_mx_format(dt, o) > 0 && dt.scale.tile_kind == vc::TileKind::Tile && dt.scale.tile == VCAST_MX32_ROWS &&
           rows % VCAST_MX32_ROWS == 0 && cols % VCAST_MX32_COLS == 0 && rows > 0 && (uintptr_t)x % 16 == 0 &&
           (uintptr_t)out % 16 == 0;
}

// Launches vcast_mx32_kernel: out_rows / out_cols may be null (that direction is skipped);
// bias_partials (with out_cols): room for bias_capacity floats, filled with the partial column
// sums of `groups` row groups, returned (0 without bias_partials)
template <int FMT>
inline int vcast_mx32_launch(floatX* out_rows, floatX* out_cols, float* bias_partials, long long bias_capacity,
                             const floatX* x, int rows, int cols, const vc::DataType& dt, const vc::VcastOptions& o,
                             uint64_t seed, cudaStream_t stream) {
    const int col_blocks = cols / VCAST_MX32_COLS, patches = rows / VCAST_MX32_ROWS;
    // enough blocks for a few waves of 8 blocks per SM, each walking several patches; with bias
    // partials, no more row groups than their scratch holds
    long long groups = std::min<long long>(patches, ceil_div(8LL * 4 * device_sm_count(), (long long)col_blocks));
    if (bias_partials) groups = std::max(1LL, std::min(groups, bias_capacity / cols));
    const dim3 grid(col_blocks, (unsigned)groups);
    vcast_mx32_kernel<FMT><<<grid, VCAST_MX32_THREADS, 0, stream>>>(out_rows, out_cols, bias_partials, x, rows, cols, dt,
                                                                     o, seed);
    cudaCheckLaunch();
    return bias_partials ? (int)groups : 0;
}
inline int vcast_mx32(floatX* out_rows, floatX* out_cols, float* bias_partials, long long bias_capacity, const floatX* x,
                      int rows, int cols, const vc::DataType& dt, const vc::VcastOptions& o, uint64_t seed,
                      cudaStream_t stream) {
    switch (vcast_mx_format(dt, o)) {
        case 1: return vcast_mx32_launch<1>(out_rows, out_cols, bias_partials, bias_capacity, x, rows, cols, dt, o, seed, stream);
        case 2: return vcast_mx32_launch<2>(out_rows, out_cols, bias_partials, bias_capacity, x, rows, cols, dt, o, seed, stream);
        case 3: return vcast_mx32_launch<3>(out_rows, out_cols, bias_partials, bias_capacity, x, rows, cols, dt, o, seed, stream);
        case 4: return vcast_mx32_launch<4>(out_rows, out_cols, bias_partials, bias_capacity, x, rows, cols, dt, o, seed, stream);
        default: return vcast_mx32_launch<5>(out_rows, out_cols, bias_partials, bias_capacity, x, rows, cols, dt, o, seed, stream);
    }
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
    if (vcast_mx32_applies(dt, o, rows, cols, x, out)) {
        vcast_mx32(along_cols ? nullptr : out, along_cols ? out : nullptr, nullptr, 0, x, rows, cols, dt, o, seed, stream);
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

// Both directions of one tensor (the output gradient: rows for dgrad, columns for wgrad, the same
// seed), and optionally dbias += its column sums (bias_scratch: BIAS_ROW_GROUPS * 4 * C floats, as
// the recipes' scratch; bias_capacity its size in floats). With a tiled datatype both casts come
// from one read (vcast_mx32) where that kernel applies, and the column sums from the same read;
// otherwise two vcast_tensor calls and bias_backward. A datatype without tiles casts once
// (out_cols is then not written: the caller uses out_rows for both).
inline void vcast_tensor_both(floatX* out_rows, floatX* out_cols, const floatX* x, int rows, int cols,
                              const vc::DataType& dt, const vc::VcastOptions& o, uint64_t seed, VcastTensorStats* stats,
                              float* dbias, float* bias_scratch, long long bias_capacity, cudaStream_t stream) {
    if (vcast_is_tiled(dt) && vcast_mx32_applies(dt, o, rows, cols, x, out_rows) && (uintptr_t)out_cols % 16 == 0) {
        const int groups = vcast_mx32(out_rows, out_cols, dbias ? bias_scratch : nullptr, bias_capacity, x, rows, cols,
                                      dt, o, seed, stream);
        if (dbias) bias_backward_reduce(dbias, bias_scratch, cols, groups, stream);
        return;
    }
    if (dbias) bias_backward(dbias, bias_scratch, x, rows, cols, stream);
    vcast_tensor(out_rows, x, rows, cols, false, dt, o, seed, stats, stream);
    if (vcast_is_tiled(dt)) vcast_tensor(out_cols, x, rows, cols, true, dt, o, seed, stats, stream);
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
