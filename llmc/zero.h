// zero.h: which part of the optimizer state each process owns under ZeRO-1 (-z 1), and the same
// description for a process that owns all of it. Plain C++ (the CPU tests check the partition).
//
// The parameters live in one flat buffer, tensor after tensor (train_gpt.cu, llm.c's order); most
// tensors are L per-layer blocks of `row` elements each (qkvw: L blocks of 3C*C), the others (wte,
// wpe, lnfw, lnfb) one block. The gradients are reduced layer by layer while the backward pass
// runs, so the unit of reduction is one block of one tensor, and ZeRO-1 cuts every block into
// P equal pieces: process r owns elements [r*row/P, (r+1)*row/P) of every block. (Every block is a
// multiple of C elements, so P must divide C.)
//
// A process keeps its pieces of the FP32 master weights and the AdamW moments packed one after the
// other (tensor by tensor, block by block): "shard" index j of tensor t maps to the full index
//     full(j) = t.offset + (j / t.piece) * t.row + t.piece_offset + (j % t.piece)
// in the parameter and gradient buffers, which every process keeps whole. With one owner (P = 1 or
// -z 0) every tensor is one block owned whole and full(j) = t.offset + j: the plain layout.
#pragma once
#include <algorithm>
#include <cstddef>
#include <vector>
#include "common.h"

namespace llmc {

struct ShardedTensor {
    size_t offset = 0;        // the tensor's first element in the full buffers
    size_t rows = 1;          // blocks (L for a per-layer tensor)
    size_t row = 0;           // elements per block
    size_t piece = 0;         // elements per block this process owns (row / P)
    size_t piece_offset = 0;  // where the owned piece starts in each block (rank * piece)
    size_t shard_offset = 0;  // the tensor's first element in the packed shard
    size_t shard_size() const { return rows * piece; }
    size_t full_index(size_t j) const { return offset + (j / piece) * row + piece_offset + (j % piece); }
};

struct ShardLayout {
    int rank = 0, owners = 1;
    std::vector<ShardedTensor> tensors;
    size_t shard_elements = 0;   // elements this process owns (sum over the tensors)
    size_t full_elements = 0;    // elements of the whole buffer

    // sizes[t]: elements of tensor t; blocks[t]: its blocks (L or 1). owners = P under ZeRO-1, else 1;
    // rank_ is this process's place among the owners (so 0 whenever it owns everything, -z 0 included:
    // with rank 1 of 1 owner the pieces would start past the end of every tensor).
    void build(const size_t* sizes, const size_t* blocks, int num_tensors, int rank_, int owners_) {
        if (owners_ < 1 || rank_ < 0 || rank_ >= owners_)
            input_error("internal: optimizer-state owner %d of %d (an owner is in [0, owners))", rank_, owners_);
        rank = rank_;
        owners = owners_;
        tensors.assign((size_t)num_tensors, ShardedTensor());
        size_t off = 0, shard_off = 0;
        for (int t = 0; t < num_tensors; t++) {
            ShardedTensor& s = tensors[(size_t)t];
            s.offset = off;
            // one owner: the whole tensor as one block (no per-block arithmetic on the hot path)
            s.rows = owners == 1 ? 1 : blocks[t];
            s.row = sizes[t] / s.rows;
            if (s.row * s.rows != sizes[t]) input_error("tensor %d: %zu elements are not %zu equal blocks", t, sizes[t], s.rows);
            if (s.row % (size_t)owners != 0)
                input_error("ZeRO-1 over %d processes needs every parameter block to split evenly: the number of processes "
                            "must divide the channels C; use -z 0 or another process count", owners);
            s.piece = s.row / (size_t)owners;
            s.piece_offset = (size_t)rank * s.piece;
            s.shard_offset = shard_off;
            off += sizes[t];
            shard_off += s.shard_size();
        }
        full_elements = off;
        shard_elements = shard_off;
    }

    // the owned elements of a full host buffer, packed; and back. Piece by piece: each is contiguous in both
    // buffers (full_index(b * piece + i) = full_index(b * piece) + i), so it is one copy.
    template <class T>
    std::vector<T> extract(const T* full) const {
        std::vector<T> out(shard_elements);
        for (const ShardedTensor& s : tensors)
            for (size_t b = 0; b < s.rows; b++)
                std::copy_n(full + s.full_index(b * s.piece), s.piece, out.data() + s.shard_offset + b * s.piece);
        return out;
    }
    template <class T>
    void scatter(const T* shard, T* full) const {
        for (const ShardedTensor& s : tensors)
            for (size_t b = 0; b < s.rows; b++)
                std::copy_n(shard + s.shard_offset + b * s.piece, s.piece, full + s.full_index(b * s.piece));
    }
};

} // namespace llmc
