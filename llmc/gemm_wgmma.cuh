// gemm_wgmma.cuh: a BF16 GEMM for Hopper (sm_90a) whose epilogue is ours: out = epilogue(inp W^T + bias).
//
// Why: cuBLASLt's epilogues are fixed (bias, GELU, ...). A recipe that must transform every output of a
// forward GEMM (the Q1.15 recipe quantizes each one, and applies the GELU to the fc output) otherwise
// needs a pass over the GEMM's output after it, which reads and writes the whole tensor again
// (dev/bench/q115_quantize_bench.cu: those passes run at the copy bandwidth). Here the transform runs
// on the accumulators, before the one store.
//
// The product (llm.c's forward layout): inp is (M x K) row-major, W is (N x K) row-major (the
// linear's weight, OC x C), out is (M x N) row-major, bias has N entries:
//     out[m][n] = epilogue(sum_k inp[m][k] W[n][k] + bias[n])
// Both operands are "K-major" (the reduction dimension is contiguous), the form wgmma reads from
// shared memory without a transpose.
//
// The kernel: one CTA computes a 128 x 128 tile of out, K in steps of 64, with
//   - one producer warp (warp 8): its lane 0 loads the (128 x 64) tiles of inp and of W for each
//     K step with the Tensor Memory Accelerator (cp.async.bulk.tensor), into a ring of STAGES
//     shared-memory slots, in the 128-byte swizzle that wgmma reads (row r of a 64-column bf16 tile
//     at byte 128 r, its 16-byte chunk c at chunk c ^ (r % 8); the tile base 1024-byte aligned);
//   - two consumer warpgroups (warps 0-3, 4-7): warpgroup g computes rows 64g..64g+63 of the tile,
//     four wgmma.m64n128k16 per K step (the accumulator: 64 fp32 registers a thread).
// Each slot has two barriers (mbarrier): `full` completes when the TMA has written the slot (the
// producer arms it with the byte count), `empty` when both warpgroups have finished reading it (one
// arrival from each); the producer waits on `empty` before it refills a slot. A consumer keeps one
// batch of wgmma in flight (wait_group 1) and releases the slot of the batch before.
// 288 threads and 3 x 32 KB of shared memory a CTA, so that two CTAs share an SM: one's epilogue
// overlaps the other's MMAs. The epilogue stages the output tile in the ring's slots (free by then)
// and stores whole rows (see OUT_LD).
//
// The grid: x = the N tiles, y = the M tiles, so CTAs that run together share their inp rows (read
// from DRAM about once; W is small enough to stay in L2).
//
// Speed (dev/test/test_gemm_wgmma.cu times it at d12's forward shapes): the plain GEMM is slower than
// cuBLASLt's, so plain linears stay on cuBLASLt; with the Q1.15 quantization (and the GELU) fused in its
// epilogue it beats cuBLASLt followed by the separate pass, which is what it is for. Slower designs:
// storing from the accumulators (4 bytes into each of 8 rows a warp instruction); one CTA an SM with 4 or
// 6 slots; clusters of CTAs sharing operand tiles by TMA multicast (the CTAs of a cluster wait on each
// other's slot releases). Tile256 (128 x 256, one CTA an SM) is faster for the plain GEMM but slower with
// the fused fc + GELU (the GELU epilogue no longer overlaps another CTA's MMAs), so Tile128 is the
// default. A persistent kernel that overlaps one tile's epilogue with the next tile's MMAs would hide the
// epilogue in both.
//
// FP8 operands (Fp8Operands, recipes/fp8/fp8_gemm.cuh): the same kernel with 128 E4M3 / E5M2 codes a K step (four
// wgmma k32), the tiles byte for byte as above; K need only be a multiple of 16 (the TMA reads zeros
// past K). build/test_fp8 times it with the plain BF16 store against cuBLASLt's FP8 GEMM at d12's and d48's
// fc shapes (recipes/fp8/fp8_gemm.cuh runs the FP8 operands in a persistent kernel of its own).
//
// Accumulator layout of m64nNk16 (warp w of the warpgroup, lane = 4 g + q): registers 4j..4j+3 hold
// rows 16w + g and 16w + g + 8, columns 8j + 2q and 8j + 2q + 1 (j = 0..N/8-1), each row's pair in
// two consecutive registers. The epilogue sees the two fp32 values of a pair.
//
// Shapes: M % 128 == 0, N % 128 == 0, K % 64 == 0, pointers 16-byte aligned (gemm_wgmma::supported);
// every GPT-2/3 forward linear at B*T a multiple of 128. Only device code built for sm_90a has these
// instructions; elsewhere the kernel traps and gemm_wgmma::available() is false, so callers keep
// cuBLASLt. The tensor maps are encoded on the host at each call (a few microseconds) through the
// driver's cuTensorMapEncodeTiled, found with cudaGetDriverEntryPointByVersion (no link against
// libcuda). The sums run in a different order than cuBLASLt's, so outputs may differ from its in the
// last BF16 bit (the test bounds both against float64).
#pragma once
#include <cuda.h>
#include <cudaTypedefs.h>
#include "cuda_common.h"
#include "wgmma.cuh" // smem_addr, sw_desc, the wgmma fences

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define GEMM_WGMMA_DEVICE 1
#else
#define GEMM_WGMMA_DEVICE 0
#endif

namespace gemm_wgmma {

constexpr int BM = 128, BK = 64;
constexpr int CONSUMER_THREADS = 256, THREADS = CONSUMER_THREADS + 32;
constexpr int A_TILE_BYTES = BM * BK * 2;      // the inp tile (128 x 64 bf16): 16 KB

// The tile's width and the ring's depth. Tile128 (the default): 128 x 128 tiles, 3 slots of 32 KB, two
// CTAs an SM. Tile256 (an experiment, timed by the test): 128 x 256 (wgmma m64n256, 128 accumulator
// registers a thread), 4 slots of 48 KB, one CTA an SM.
template <int BN_, int STAGES_, int MIN_BLOCKS_>
struct TileConfig {
    static constexpr int BN = BN_, STAGES = STAGES_, MIN_BLOCKS = MIN_BLOCKS_;
    static constexpr int W_TILE_BYTES = BN * BK * 2;
    static constexpr int STAGE_BYTES = A_TILE_BYTES + W_TILE_BYTES;
    static constexpr int SMEM_BYTES = STAGES * STAGE_BYTES + 1024 + 2 * STAGES * 8; // + alignment + barriers
    // the staged output tile (see the epilogue): rows padded by 8 BF16 (16 bytes), so that the
    // accumulator layout's 8 rows x 4 column pairs fall into 32 different banks
    static constexpr int OUT_LD = BN + 8;
    static constexpr int OUT_TILE_BYTES = BM * OUT_LD * 2;
    static_assert(2 * OUT_TILE_BYTES <= STAGES * STAGE_BYTES, "two staged output tiles fit in the ring");
};
using Tile128 = TileConfig<128, 3, 2>;
using Tile256 = TileConfig<256, 4, 1>;
constexpr int N_MULTIPLE = 128; // every supported N is a multiple of this (Tile128's width)

// The operands. A K step is 128 bytes of every row of both tiles, whatever the element: 64 BF16 values
// (four wgmma k16) or 128 FP8 codes (four wgmma k32, recipes/fp8/fp8_gemm.cuh). The shared-memory layout, the
// descriptors (a k-instruction 32 bytes further into each row) and the accumulator layout are the same.
// The BF16 operands (floatX), the kernel's first use:
struct Bf16Operands {
    static constexpr int ELEMS_PER_STEP = BK; // K values per K step
    static constexpr CUtensorMapDataType TMA_TYPE = CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
    static constexpr int ELEM_BYTES = 2;
};
// FP8 codes: A (inp) and B (W) each E4M3 or E5M2 (Hopper has no E5M2 x E5M2)
template <bool A_E5M2, bool B_E5M2>
struct Fp8Operands {
    static_assert(!(A_E5M2 && B_E5M2), "Hopper's FP8 MMA takes at most one E5M2 operand");
    static constexpr int ELEMS_PER_STEP = 128;
    static constexpr CUtensorMapDataType TMA_TYPE = CU_TENSOR_MAP_DATA_TYPE_UINT8;
    static constexpr int ELEM_BYTES = 1;
    static constexpr bool a_e5m2 = A_E5M2, b_e5m2 = B_E5M2;
};

__device__ int g_built = GEMM_WGMMA_DEVICE;

#if GEMM_WGMMA_DEVICE
// ---- mbarrier ------------------------------------------------------------------------------------
__device__ __forceinline__ void bar_init(uint64_t* bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" :: "r"(smem_addr(bar)), "r"(count) : "memory");
}
// arm `bar` for `bytes` of TMA writes (and count this thread's arrival)
__device__ __forceinline__ void bar_expect_bytes(uint64_t* bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" :: "r"(smem_addr(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void bar_arrive(uint64_t* bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" :: "r"(smem_addr(bar)) : "memory");
}
// wait until the phase with this parity has completed
__device__ __forceinline__ void bar_wait(uint64_t* bar, uint32_t parity) {
    uint32_t done = 0;
    while (!done) {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done) : "r"(smem_addr(bar)), "r"(parity) : "memory");
    }
}

// ---- TMA: a (rows x 64) box of a 2-D bf16 tensor at (column c0, row r0) into shared memory ----------
__device__ __forceinline__ void tma_load_2d(void* dst, const CUtensorMap* map, int c0, int r0, uint64_t* bar) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n"
                 :: "r"(smem_addr(dst)), "l"((uint64_t)map), "r"(c0), "r"(r0), "r"(smem_addr(bar)) : "memory");
}

// ---- wgmma ---------------------------------------------------------------------------------------
// the descriptor of k-step ks (16 columns, 32 bytes into each row) of a swizzled tile (wgmma.cuh)
__device__ __forceinline__ uint64_t tile_desc(const void* tile, int ks) {
    return sw_desc(static_cast<const unsigned char*>(tile) + ks * 32);
}
#define GW_ACC8(b) "+f"(d[b + 0]), "+f"(d[b + 1]), "+f"(d[b + 2]), "+f"(d[b + 3]), "+f"(d[b + 4]), "+f"(d[b + 5]), \
                   "+f"(d[b + 6]), "+f"(d[b + 7])
// d (64 x 128 fp32) += A (64 x 16, K-major tile) * B (16 x 128, K-major tile: the rows are B's columns)
__device__ __forceinline__ void wgmma_m64n128k16(float (&d)[64], uint64_t desc_a, uint64_t desc_b) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
                 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,"
                 "%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,"
                 "%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
                 : GW_ACC8(0), GW_ACC8(8), GW_ACC8(16), GW_ACC8(24), GW_ACC8(32), GW_ACC8(40), GW_ACC8(48), GW_ACC8(56)
                 : "l"(desc_a), "l"(desc_b));
}
// d (64 x 256 fp32) += A (64 x 16) * B (16 x 256), both K-major tiles
__device__ __forceinline__ void wgmma_m64n256k16(float (&d)[128], uint64_t desc_a, uint64_t desc_b) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
                 "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,"
                 "%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,"
                 "%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,"
                 "%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,%96,%97,%98,%99,%100,"
                 "%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,%112,%113,%114,%115,%116,%117,%118,%119,%120,"
                 "%121,%122,%123,%124,%125,%126,%127"
                 "}, %128, %129, p, 1, 1, 0, 0;\n}\n"
                 : GW_ACC8(0), GW_ACC8(8), GW_ACC8(16), GW_ACC8(24), GW_ACC8(32), GW_ACC8(40), GW_ACC8(48), GW_ACC8(56),
                   GW_ACC8(64), GW_ACC8(72), GW_ACC8(80), GW_ACC8(88), GW_ACC8(96), GW_ACC8(104), GW_ACC8(112), GW_ACC8(120)
                 : "l"(desc_a), "l"(desc_b));
}
template <int N>
__device__ __forceinline__ void wgmma_m64nNk16(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b) {
    if constexpr (N == 128) wgmma_m64n128k16(d, desc_a, desc_b);
    else wgmma_m64n256k16(d, desc_a, desc_b);
}
// d (64 x 128 fp32) += A (64 x 32 FP8, K-major) * B (32 x 128 FP8, K-major). FP8 wgmma has no transpose
// immediates, and its sums keep fewer bits than FP32: the mainloop adds every K step straight into d,
// which is cuBLASLt's "fast accumulation" (what the FP8 recipe's forward GEMMs use).
#define GW_FP8_M64N128K32(TYPES)                                                                                     \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"                                                         \
                 "wgmma.mma_async.sync.aligned.m64n128k32.f32." TYPES " "                                               \
                 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,"   \
                 "%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,"  \
                 "%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, %64, %65, p, 1, 1;\n}\n"                          \
                 : GW_ACC8(0), GW_ACC8(8), GW_ACC8(16), GW_ACC8(24), GW_ACC8(32), GW_ACC8(40), GW_ACC8(48), GW_ACC8(56) \
                 : "l"(desc_a), "l"(desc_b))
template <bool A_E5M2, bool B_E5M2>
__device__ __forceinline__ void wgmma_m64n128k32_fp8(float (&d)[64], uint64_t desc_a, uint64_t desc_b) {
    if constexpr (!A_E5M2 && !B_E5M2) GW_FP8_M64N128K32("e4m3.e4m3");
    else if constexpr (A_E5M2) GW_FP8_M64N128K32("e5m2.e4m3");
    else GW_FP8_M64N128K32("e4m3.e5m2");
}
#undef GW_FP8_M64N128K32
// d (64 x 64 fp32) = (accumulate ? d : 0) + A (64 x 32 FP8) * B (32 x 64 FP8), both K-major: the partial sums
// of one K step that a kernel without fast accumulation adds into its FP32 accumulators itself
// (recipes/fp8/fp8_gemm.cuh's dgrad); the scale-d predicate comes from `accumulate`
#define GW_FP8_M64N64K32(TYPES)                                                                                      \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                                        \
                 "wgmma.mma_async.sync.aligned.m64n64k32.f32." TYPES " "                                                \
                 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,"   \
                 "%27,%28,%29,%30,%31}, %32, %33, p, 1, 1;\n}\n"                                                       \
                 : GW_ACC8(0), GW_ACC8(8), GW_ACC8(16), GW_ACC8(24)                                                   \
                 : "l"(desc_a), "l"(desc_b), "r"(accumulate))
template <bool A_E5M2, bool B_E5M2>
__device__ __forceinline__ void wgmma_m64n64k32_fp8(float (&d)[32], uint64_t desc_a, uint64_t desc_b, int accumulate) {
    if constexpr (!A_E5M2 && !B_E5M2) GW_FP8_M64N64K32("e4m3.e4m3");
    else if constexpr (A_E5M2) GW_FP8_M64N64K32("e5m2.e4m3");
    else GW_FP8_M64N64K32("e4m3.e5m2");
}
#undef GW_FP8_M64N64K32
// A descriptor moved on by `bytes` (a multiple of 16) in shared memory: its start-address field (bits 0-13,
// the address / 16) grows by bytes / 16, which never carries out of the field below 256 KB. Descriptors made
// once and moved on like this cost one add each in a main loop, where tile_desc per MMA costs about six.
__device__ __forceinline__ uint64_t desc_advance(uint64_t desc, uint32_t bytes) { return desc + (bytes >> 4); }
// one K step's four MMAs (128 bytes of each row of both tiles), from the descriptors of the tiles' first bytes
template <class Ops, int N>
__device__ __forceinline__ void mma_k_step(float (&d)[N / 2], uint64_t a_desc, uint64_t b_desc) {
#pragma unroll
    for (int ks = 0; ks < 4; ks++) {
        if constexpr (Ops::ELEM_BYTES == 2) {
            wgmma_m64nNk16<N>(d, desc_advance(a_desc, 32 * ks), desc_advance(b_desc, 32 * ks));
        } else {
            static_assert(N == 128, "FP8 operands: 128-wide tiles");
            wgmma_m64n128k32_fp8<Ops::a_e5m2, Ops::b_e5m2>(d, desc_advance(a_desc, 32 * ks), desc_advance(b_desc, 32 * ks));
        }
    }
}
template <class Ops, int N>
__device__ __forceinline__ void mma_k_step(float (&d)[N / 2], const unsigned char* a_tile, const unsigned char* b_tile) {
    mma_k_step<Ops, N>(d, tile_desc(a_tile, 0), tile_desc(b_tile, 0));
}
#undef GW_ACC8
#endif // GEMM_WGMMA_DEVICE

// Epilogue: an object with
//   static constexpr int OUTPUTS;                 how many (M x N) BF16 tensors it writes (1 or 2)
//   floatX* out[OUTPUTS];                         where (row-major, leading dimension N)
//   __device__ void operator()(float v0, float v1, __nv_bfloat162 (&r)[OUTPUTS]) const
// The kernel calls it for every pair of neighbouring columns of a row with the two fp32 sums (bias
// included) and stores r[o] into out[o]. The plain one stores the sums as BF16:
struct StoreBf16 {
    static constexpr int OUTPUTS = 1;
    floatX* out[1];
    __device__ __forceinline__ void operator()(float v0, float v1, __nv_bfloat162 (&r)[1]) const {
        r[0] = __floats2bfloat162_rn(v0, v1);
    }
};

// The output tile goes through shared memory (the ring's slots, free once every K step is done) so
// that each warp stores whole rows, 16 bytes a thread: straight from the accumulators a warp would
// store 4 bytes into each of 8 rows per instruction.

__device__ __forceinline__ void consumer_barrier() {
    asm volatile("bar.sync 1, %0;\n" :: "n"(CONSUMER_THREADS) : "memory");
}

template <class Ops, class Epilogue, class Cfg>
__global__ void __launch_bounds__(THREADS, Cfg::MIN_BLOCKS)
gemm_kernel(const __grid_constant__ CUtensorMap map_inp, const __grid_constant__ CUtensorMap map_w,
            const floatX* __restrict__ bias, int K, Epilogue epi) {
#if GEMM_WGMMA_DEVICE
    constexpr int BN = Cfg::BN, STAGES = Cfg::STAGES, STAGE_BYTES = Cfg::STAGE_BYTES;
    constexpr int OUT_LD = Cfg::OUT_LD, OUT_TILE_BYTES = Cfg::OUT_TILE_BYTES;
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    // the tiles need 1024-byte alignment (the swizzle pattern repeats every 8 rows of 128 bytes)
    // (pointer arithmetic on smem_raw, so that the compiler knows the tiles are shared memory: LDS/STS)
    const uint32_t smem_a = (uint32_t)__cvta_generic_to_shared(smem_raw);
    unsigned char* smem = smem_raw + (((smem_a + 1023) & ~1023u) - smem_a);
    uint64_t* full = reinterpret_cast<uint64_t*>(smem + STAGES * STAGE_BYTES);
    uint64_t* empty = full + STAGES;
    const int n_tile = blockIdx.x, m_tile = blockIdx.y;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int k_steps = (K + Ops::ELEMS_PER_STEP - 1) / Ops::ELEMS_PER_STEP; // (the TMA fills a last partial step with zeros)
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; s++) {
            bar_init(&full[s], 1);
            bar_init(&empty[s], 2);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (warp == CONSUMER_THREADS / 32) {
        // producer: lane 0 keeps the ring full
        if (lane == 0) {
            for (int kt = 0; kt < k_steps; kt++) {
                const int s = kt % STAGES;
                if (kt >= STAGES) bar_wait(&empty[s], ((kt / STAGES) + 1) & 1);
                unsigned char* slot = smem + s * STAGE_BYTES;
                bar_expect_bytes(&full[s], STAGE_BYTES);
                tma_load_2d(slot, &map_inp, kt * Ops::ELEMS_PER_STEP, m_tile * BM, &full[s]);
                tma_load_2d(slot + A_TILE_BYTES, &map_w, kt * Ops::ELEMS_PER_STEP, n_tile * BN, &full[s]);
            }
        }
    } else {
        // consumers: warpgroup g computes rows 64g..64g+63 of the tile
        const int g = warp / 4;
        float d[BN / 2];
#pragma unroll
        for (int i = 0; i < BN / 2; i++) d[i] = 0.0f;
        for (int kt = 0; kt < k_steps; kt++) {
            const int s = kt % STAGES;
            bar_wait(&full[s], (kt / STAGES) & 1);
            const unsigned char* slot = smem + s * STAGE_BYTES;
            const unsigned char* a_tile = slot + g * (64 * BK * 2);
            const unsigned char* b_tile = slot + A_TILE_BYTES;
            reg_fence(d);
            wgmma_fence();
            mma_k_step<Ops, BN>(d, a_tile, b_tile);
            wgmma_commit();
            // the batch before this one is done: its slot can be refilled
            wgmma_wait<1>();
            reg_fence(d);
            if (kt > 0 && threadIdx.x % 128 == 0) bar_arrive(&empty[(kt - 1) % STAGES]);
        }
        wgmma_wait<0>();
        reg_fence(d);

        // epilogue: bias, then the caller's transform, into shared memory; then whole rows to global.
        // The slots are free once both warpgroups are past their last K step (every TMA write landed
        // before the last `full` barrier completed, and nothing more is loaded).
        consumer_barrier();
        const int wq = warp % 4, gq = lane / 4, q = lane % 4;
        const int r_lo = 64 * g + 16 * wq + gq;
        constexpr int NOUT = Epilogue::OUTPUTS;
        __nv_bfloat16* staged = reinterpret_cast<__nv_bfloat16*>(smem);
#pragma unroll
        for (int j = 0; j < BN / 8; j++) {
            const int c = 8 * j + 2 * q;
            float b0 = 0.0f, b1 = 0.0f;
            if (bias != nullptr) {
                const __nv_bfloat162 bb = *reinterpret_cast<const __nv_bfloat162*>(bias + n_tile * BN + c);
                b0 = __bfloat162float(bb.x);
                b1 = __bfloat162float(bb.y);
            }
            __nv_bfloat162 lo[NOUT], hi[NOUT];
            epi(d[4 * j + 0] + b0, d[4 * j + 1] + b1, lo);
            epi(d[4 * j + 2] + b0, d[4 * j + 3] + b1, hi);
#pragma unroll
            for (int o = 0; o < NOUT; o++) {
                *reinterpret_cast<__nv_bfloat162*>(staged + o * (OUT_TILE_BYTES / 2) + r_lo * OUT_LD + c) = lo[o];
                *reinterpret_cast<__nv_bfloat162*>(staged + o * (OUT_TILE_BYTES / 2) + (r_lo + 8) * OUT_LD + c) = hi[o];
            }
        }
        consumer_barrier();
        const int ld = (int)gridDim.x * BN;
        constexpr int CHUNKS = BM * BN / 8; // 16-byte pieces of one output tile
#pragma unroll
        for (int o = 0; o < NOUT; o++) {
#pragma unroll
            for (int i = 0; i < CHUNKS / CONSUMER_THREADS; i++) {
                const int chunk = (int)threadIdx.x + i * CONSUMER_THREADS;
                const int r = chunk / (BN / 8), c8 = chunk % (BN / 8);
                const uint4 v = *reinterpret_cast<const uint4*>(staged + o * (OUT_TILE_BYTES / 2) + r * OUT_LD + 8 * c8);
                *reinterpret_cast<uint4*>(epi.out[o] + ((long long)m_tile * BM + r) * ld + n_tile * BN + 8 * c8) = v;
            }
        }
    }
#else
    __trap();
#endif
}

// ---- host ----------------------------------------------------------------------------------------
inline PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
    static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
        void* p = nullptr;
        cudaDriverEntryPointQueryResult q;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) != cudaSuccess ||
            q != cudaDriverEntryPointSuccess)
            p = nullptr;
        return (PFN_cuTensorMapEncodeTiled_v12000)p;
    }();
    return fn;
}

// whether this build and this GPU run the kernel (sm_90a device code, a Hopper GPU, the driver's
// tensor-map encoder); read once
inline bool available() {
    static int cached = -1;
    if (cached < 0) {
        int built = 0, dev = 0, major = 0, minor = 0;
        cudaCheck(cudaGetDevice(&dev));
        cudaCheck(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
        cudaCheck(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
        if (major == 9 && minor == 0) cudaCheck(cudaMemcpyFromSymbol(&built, g_built, sizeof(int)));
        cached = built && encode_fn() != nullptr ? 1 : 0;
    }
    return cached == 1;
}

inline bool supported(const void* out, const void* inp, const void* w, const void* bias, int M, int N, int K) {
    auto aligned = [](const void* p) { return ((uintptr_t)p % 16) == 0; };
    return M % BM == 0 && N % N_MULTIPLE == 0 && K % BK == 0 && aligned(out) && aligned(inp) && aligned(w) &&
           (bias == nullptr || ((uintptr_t)bias % 4) == 0) && available();
}

// a (rows x cols) row-major matrix of Ops' elements, read in (box_rows x 128 bytes) boxes with the
// 128-byte swizzle (the parts of a box beyond the matrix read as zeros)
template <class Ops>
inline CUtensorMap tensor_map(const void* base, int rows, int cols, int box_rows) {
    CUtensorMap map;
    const cuuint64_t dims[2] = {(cuuint64_t)cols, (cuuint64_t)rows};
    const cuuint64_t strides[1] = {(cuuint64_t)cols * Ops::ELEM_BYTES};
    const cuuint32_t box[2] = {(cuuint32_t)Ops::ELEMS_PER_STEP, (cuuint32_t)box_rows};
    const cuuint32_t elem_strides[2] = {1, 1};
    const CUresult r = encode_fn()(&map, Ops::TMA_TYPE, 2, (void*)base, dims, strides, box,
                                   elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                   CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) {
        fprintf(stderr, "error: cuTensorMapEncodeTiled failed (%d) for a %d x %d matrix\n", (int)r, rows, cols);
        exit(EXIT_FAILURE);
    }
    return map;
}

// the tile configuration gemm() launches: 128 (Tile128) or 256 (Tile256, the test's experiment)
inline int g_tile_n = 128;

template <class Ops, class Epilogue, class Cfg>
inline void launch(const void* inp, const void* w, const floatX* bias, int M, int N, int K, Epilogue epi,
                   cudaStream_t stream) {
    static bool configured = false;
    if (!configured) {
        cudaCheck(cudaFuncSetAttribute(gemm_kernel<Ops, Epilogue, Cfg>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       Cfg::SMEM_BYTES));
        // all of the unified L1 / shared memory as shared memory
        cudaCheck(cudaFuncSetAttribute(gemm_kernel<Ops, Epilogue, Cfg>, cudaFuncAttributePreferredSharedMemoryCarveout, 100));
        configured = true;
    }
    const CUtensorMap map_inp = tensor_map<Ops>(inp, M, K, BM);
    const CUtensorMap map_w = tensor_map<Ops>(w, N, K, Cfg::BN);
    gemm_kernel<Ops, Epilogue, Cfg><<<dim3(N / Cfg::BN, M / BM), THREADS, Cfg::SMEM_BYTES, stream>>>(map_inp, map_w, bias, K, epi);
    cudaCheckLaunch();
}

// out = epi(inp (M x K) W^T (W: N x K) + bias); the caller checked supported()
template <class Epilogue>
inline void gemm(const floatX* inp, const floatX* w, const floatX* bias, int M, int N, int K, Epilogue epi,
                 cudaStream_t stream) {
    if (g_tile_n == 256 && N % 256 == 0) launch<Bf16Operands, Epilogue, Tile256>(inp, w, bias, M, N, K, epi, stream);
    else launch<Bf16Operands, Epilogue, Tile128>(inp, w, bias, M, N, K, epi, stream);
}

} // namespace gemm_wgmma
