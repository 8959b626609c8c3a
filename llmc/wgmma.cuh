// wgmma.cuh: the PTX wrappers that Hopper's warpgroup MMA kernels share (the flash attention,
// llmc/flash_attention_wgmma.cuh, and the GEMM with our own epilogues, llmc/gemm_wgmma.cuh).
//
// wgmma.mma_async (sm_90a) reads its B operand, and its A operand unless A is in registers, from shared
// memory through a 64-bit descriptor. Both kernel families keep operand tiles 64 bf16 wide (128 bytes a
// row) in the 128-byte swizzle: row r at byte 128 r, its 16-byte chunk c at chunk c ^ (r % 8), the tile
// base 1024-byte aligned (the pattern repeats every 8 rows). The Tensor Memory Accelerator writes
// exactly this layout with CU_TENSOR_MAP_SWIZZLE_128B; cp.async copies write it by computing the chunk.
//
// The MMAs are asynchronous: wgmma_fence() before the first wgmma of a batch (after the registers it
// reads, accumulators or A, were written), wgmma_commit() closes the batch, wgmma_wait<N>() waits until
// at most N batches are in flight. The compiler sees a wgmma as an ordinary asm that reads and writes
// its accumulators, so reg_fence() on the accumulators (an empty volatile asm that "modifies" them)
// pins their writes before a batch and their reads after the wait.
#pragma once
#include "cuda_common.h" // smem_addr

// Descriptor of a 128-byte-swizzled, 64-column bf16 tile whose k-step starts at `start`: start address
// (>> 4) in bits 0-13, leading-dimension byte offset (>> 4) in 16-29 (unused by this swizzle with
// 64-wide tiles; 1 by convention), stride-dimension byte offset (>> 4) in 32-45 = 1024 bytes between
// groups of 8 rows, base offset 0 (1024-aligned pattern), swizzle mode 1 (128 B) in 62-63. A K-major
// tile's k-step of 16 starts 32 bytes into each row; an MN-major tile's 16 rows (2048 bytes) further.
__device__ __forceinline__ uint64_t sw_desc(const void* start) {
    return (uint64_t)((smem_addr(start) & 0x3FFFF) >> 4) | (1ull << 16) | ((uint64_t)(1024 >> 4) << 32) | (1ull << 62);
}

#if !defined(__CUDA_ARCH__) || defined(__CUDA_ARCH_FEAT_SM90_ALL)
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" :: "n"(N) : "memory"); }
template <int N>
__device__ __forceinline__ void reg_fence(float (&r)[N]) {
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+f"(r[i]) :: "memory");
}
template <int N>
__device__ __forceinline__ void reg_fence(uint32_t (&r)[N][4]) {
#pragma unroll
    for (int i = 0; i < N; i++)
#pragma unroll
        for (int x = 0; x < 4; x++) asm volatile("" : "+r"(r[i][x]) :: "memory");
}
#endif
