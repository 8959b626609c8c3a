// recipe_api.h: what every precision recipe shares: the names of the transformer linears, the recipe
// options from the command line, the plain (unquantized) linear layer that BF16 is, and the calls the
// model makes, which run that plain linear wherever the recipe does not quantize.
//
// The recipe API. Each recipe header (llmc/recipes/<name>/recipe.h, one per binary, named by
// -DRECIPE_HEADER) defines a `struct Recipe` holding its state and the hooks below; train_gpt.cu calls
// nothing else of a recipe. A hook marked (default) has a template here that does nothing (or what is
// said); a recipe that needs more defines the hook for its own Recipe type, which overload resolution
// prefers. The rest are required.
//
// Required:
//   struct Recipe { ...; LinearScratch scratch; }   the recipe's state; scratch: what the plain
//                                               linear's backward needs (linear_scratch_init, in
//                                               recipe_init), which the dispatcher below reads
//   recipe_init(r, options, shape, B, T, context)  allocate state for the model and micro-batch shape;
//                                               options: the recipe's flags (RecipeOptions, its
//                                               options.h), context: the run's seed, -Q, ZeRO-1 owners
//   recipe_describe(r)                          one line for the banner and main.log
// The state hooks (default: no state):
//   recipe_weights_changed(r, weights, stream)  the parameters changed (init, load, optimizer step):
//                                               derive whatever the recipe keeps per weight (quantized
//                                               copies); (default) nothing
//   recipe_step_end(r, stream)                  an optimizer step ended: per-step bookkeeping (scales);
//                                               called before recipe_weights_changed of the new
//                                               weights; (default) nothing
//   recipe_step_skipped(r, stream)              the step's update was skipped (a NaN/Inf loss or gradient
//                                               norm, -sl / -sg: llmc/spike_guard.h): the weights stay,
//                                               and neither recipe_step_end nor recipe_weights_changed
//                                               runs. Undo what the step's forward and backward left in
//                                               the state (amaxes, counts, first calibrations), so that
//                                               the next step starts from the state before this one, as
//                                               if the skipped step had not run; every process alike
//                                               (no collective). (default) nothing: the recipes whose
//                                               forward and backward keep no state past the step
//                                               (their scales are current, or made with the weights)
//   recipe_save(r, writer) / recipe_load(r, reader)   the recipe's state in the checkpoint's state
//                                               file; (default) none
//   recipe_begin_step(r, step)                  before a training step's first micro-step; returns
//                                               whether the step's quantization telemetry is due (-lq);
//                                               (default) false
//   recipe_begin_micro_step(r, slice)           before each training micro-step: the data slice it
//                                               trains on (micro-step * processes + rank, dataloader.h);
//                                               a recipe that draws random bits seeds them from
//                                               (step, slice, ...), so that the bits of a slice do not
//                                               depend on how the step is split over processes;
//                                               (default) nothing
//   recipe_cross_process_max(r)                 device state that every process of a data-parallel
//                                               run must agree on, as the maximum over the processes
//                                               (a step's amax); taken before recipe_step_end;
//                                               (default) none
//   recipe_log_telemetry(r, log, step)          after its backward pass: the -lq lines for main.log;
//                                               (default) nothing
// The linears. The model calls linear_forward, linear_forward_gelu and linear_backward (below), which
// ask the recipe once whether it quantizes the call and otherwise run the plain linear:
//   recipe_quantizes(r, id, N, C, OC, pass)     whether the recipe runs this pass of linear id (N x C
//                                               in, N x OC out) itself; (default) false: the plain
//                                               linear, as for the layers -sqf / -sql keep in BF16
//   recipe_before_plain_linear(r, id, pass, stream)   called before the plain linear runs a pass the
//                                               recipe does not quantize: bring its own state in line
//                                               (write what it left pending that the plain GEMM
//                                               reads); (default) nothing
//   recipe_linear_forward(r, id, out, inp, W, bias, N, C, OC, training, stream)
//                                               out (N x OC) = inp (N x C) W^T + bias
//   recipe_linear_forward_gelu(r, id, gelu_out, pre_gelu, inp, W, bias, N, C, OC, training, stream)
//                                               the same followed by GELU; pre_gelu is kept for backward.
//                                               A recipe may leave gelu_out unwritten for a while: the
//                                               model reads it only as the input of the next call, the
//                                               same layer's LIN_FCPROJ linear_forward, which may read
//                                               pre_gelu instead; any other recipe call writes it first
//                                               (PendingGeluOut; recipe_before_plain_linear included)
//   recipe_linear_backward(r, id, dinp, dW, dbias, dout, inp, W, pre_gelu, N, C, OC, stream)
//                                               backward-dx: dinp = dout W  (times gelu'(pre_gelu) when
//                                               pre_gelu is given), overwriting dinp; and backward-dw:
//                                               dW += dout^T inp, dbias += column sums of dout (FP32).
//                                               One call for both, so that a recipe quantizes dout once.
//                                               The backward of a linear always follows the training
//                                               forward of the same linear and micro-batch (a recipe
//                                               may keep what it needs from that forward).
//     The three run only where recipe_quantizes says so; (default) an error, for a recipe that
//     quantizes nothing.
//   recipe_needs_input_in_backward(r, id, N)    whether linear_backward reads `inp`; when not, the
//                                               model skips recomputing it (-r 1 / -r 2); (default) true
// The LM head. The model calls lm_head_forward, lm_head_grad_codes and lm_head_backward (below), one chunk
// of rows at a time (RecipeContext::head_rows at most), which run the plain BF16 head unless the recipe
// says otherwise:
//   recipe_quantizes_head(r, rows, C, Vp)      whether the recipe runs the head's GEMMs itself; (default)
//                                               false
//   recipe_head_forward(r, logits, lnf, wte, rows, C, Vp, training, stream)
//                                               logits (rows x Vp) = lnf (rows x C) wte^T
//   recipe_head_grad_codes(r, rows, Vp, bound, stream)   asked before the classifier of a training chunk:
//                                               where the classifier should also write the codes of its
//                                               dlogits (HeadGradCodes), whose every value is at most
//                                               `bound` in magnitude; (default) none
//   recipe_head_backward(r, dwte, dlnf, dlogits, lnf, wte, rows, C, Vp, stream)
//                                               dwte (FP32) += dlogits^T lnf, dlnf = dlogits wte; the next
//                                               call after the classifier of the same chunk
// The sites: kernels of the model other than the linears that can also write a linear operand in the
// recipe's quantized form (codes, a scale, an amax), where the recipe asks for it. RecipeSite (below)
// names each one: the operand, the kernel that makes it, and the linear that reads it. The model asks
// through site_output and site_again (below), which check first that the kernel can write codes for
// the shape:
//   recipe_site_output(r, site, id, rows, cols, training, stream)
//                                               asked before the site's kernel runs: where the recipe
//                                               wants that operand of linear id (rows x cols), as a
//                                               SiteTarget; (default) an inactive target: the kernel
//                                               writes its output as usual. When active, the kernel
//                                               writes the codes, and the next call of linear id
//                                               takes them instead of quantizing the operand (see
//                                               RecipeSite for what the kernel then leaves unwritten).
//                                               A target with no rows but an amax asks the kernel to
//                                               write its output as usual and record its amax there
//                                               (SiteTarget::amax_only).
//   recipe_site_again(r, site, id, stream)      asked right after a LayerNorm site's kernel: a target
//                                               with run_only_if set (a scale guessed before the
//                                               tensor existed) asks for the codes once more, from the
//                                               residual stream (or its gradient) the kernel stored,
//                                               by a kernel that runs only under that device flag;
//                                               (default) an inactive target, which asks for nothing
// and, from inside a step or recipe_weights_changed, g_cross_process (below): what a recipe may ask of
// the other processes (a tensor's first scale, process 0's; the split of a recipe's pieces under ZeRO-1).
// and the type RecipeBoundaries: the hooks of llmc/boundaries.h that the model's other kernels apply
// at the named forward boundaries (embedding, residual, LayerNorm, softmax, GELU, logits);
// IdentityBoundaries for every recipe but Q1.15.
// `training` is false for evaluation and sampling: a recipe must then leave its state untouched, so
// that how often a run validates never changes its training numbers.
#pragma once
#include <string>
#include <vector>
#include "cuda_common.h"
#include "matmul.cuh"
#include "gelu.cuh"
#include "formats/fp8_quantize.cuh"
#include "layernorm.cuh"
#include "flash_attention.cuh"
#include "checkpoint.h"
#include "profiler.h"
#include "boundaries.h"
#include "recipe_options.h"

// the project-wide names the recipe headers use
using llmc::ModelShape;
using llmc::StateReader;
using llmc::StateWriter;
using llmc::input_error;
using llmc::strfmt;

// the four linears of a transformer block, in the order the forward pass runs them
enum LinearKind { LIN_QKV = 0, LIN_ATTPROJ = 1, LIN_FC = 2, LIN_FCPROJ = 3, NUM_LINEAR_KINDS = 4 };
static const char* LINEAR_NAMES[NUM_LINEAR_KINDS] = {"qkv", "attproj", "fc", "fcproj"};

struct LinearId {
    int layer;
    LinearKind kind;
};
inline bool same_linear(LinearId a, LinearId b) { return a.layer == b.layer && a.kind == b.kind; }

// Data parallel: a recipe whose state must agree across the processes, or which keeps a piece of its
// state per process, asks through this. train_gpt.cu fills it in once NCCL is up; with one process (and
// in most tests) it stays empty and the recipe asks nothing. Every process must make the same calls in
// the same order: from the model's training forward and backward, and from recipe_weights_changed
// (init, load, optimizer step), which every process runs alike; never from evaluation or sampling
// (process 0 alone).
// All of them work in place on device memory, in order on stream st.
struct CrossProcess {
    void* ctx = nullptr;
    // the n uint32 at x of process 0 replace every other process's
    void (*broadcast_u32)(void* ctx, uint32_t* x, size_t n, cudaStream_t st) = nullptr;
    // the maximum over the processes of n uint32 (the bits of non-negative floats order like them)
    void (*all_reduce_max_u32)(void* ctx, uint32_t* x, size_t n, cudaStream_t st) = nullptr;
    // the sum over the processes of n doubles
    void (*all_reduce_sum_f64)(void* ctx, double* x, size_t n, cudaStream_t st) = nullptr;
    // for each of `count` buffers, cut into one piece per process (buffer i: piece r is the bytes
    // [r * piece_bytes[i], (r + 1) * piece_bytes[i]) of bufs[i]): each process's own piece to all
    void (*all_gather_pieces)(void* ctx, uint8_t* const* bufs, const size_t* piece_bytes, int count, cudaStream_t st) = nullptr;
    bool active() const { return broadcast_u32 != nullptr; }
    // whether a recipe can cut its state into pieces, one per process (TCFP-12's EF buffer under ZeRO-1)
    bool shares_pieces() const { return all_reduce_max_u32 && all_reduce_sum_f64 && all_gather_pieces; }
};
inline CrossProcess g_cross_process;

// recipe_cross_process_max: `count` non-negative floats, as bits (uint32 order = float order)
struct RecipeMaxState {
    uint32_t* bits = nullptr;
    size_t count = 0;
};

// input (C) and output (OC) widths of each linear, for channels C
inline int linear_in_features(LinearKind k, int C) { return k == LIN_FCPROJ ? 4 * C : C; }
inline int linear_out_features(LinearKind k, int C) {
    return k == LIN_QKV ? 3 * C : k == LIN_FC ? 4 * C : C;
}

// Lays out one buffer per quantized linear (the layers -sqf/-sql keep in BF16 get none) of a model with
// L layers of C channels: offset[i] for linear i = layer * 4 + kind, bytes_of(K, OC) its size (K = its
// input features, OC = its output features); returns the total.
template <typename BytesOf>
inline size_t quantized_linears_layout(const LayersKeptInBf16& o, int L, int C, std::vector<size_t>& offset, BytesOf bytes_of) {
    offset.assign((size_t)L * NUM_LINEAR_KINDS, 0);
    size_t total = 0;
    for (int l = 0; l < L; l++) {
        if (!layer_is_quantized(o, l, L)) continue;
        for (int k = 0; k < NUM_LINEAR_KINDS; k++) {
            offset[l * NUM_LINEAR_KINDS + k] = total;
            total += bytes_of(linear_in_features((LinearKind)k, C), linear_out_features((LinearKind)k, C));
        }
    }
    return total;
}

// A recipe's note that a kernel already made something for linear `id` (quantized codes, an amax),
// which that linear's next call takes: whether `slot` holds id, emptying it. A slot held for another
// linear means the model broke the contract at the top of this file: an error naming both.
inline bool take_given_for(LinearId& slot, LinearId id, const char* recipe, const char* what) {
    const bool given = same_linear(slot, id);
    if (slot.layer >= 0 && !given) {
        fprintf(stderr, "error: %s: the %s of layer %d's %s was not taken by the next call\n", recipe, what, slot.layer,
                LINEAR_NAMES[slot.kind]);
        exit(1);
    }
    slot.layer = -1;
    return given;
}

// An fc layer's GELU output left unwritten for the fc projection's forward, which runs next and
// quantizes gelu(pre) itself, rounded to floatX as gelu_forward stores it (the FP8 and TCFP-12 recipes,
// where nothing else reads that N x 4C tensor): saves writing and re-reading it. The recipe's other
// calls write it first (write), so a reader never sees it unwritten.
struct PendingGeluOut {
    floatX* out = nullptr;       // the GELU output, not yet written (null: nothing pending)
    const floatX* pre = nullptr; // the GELU's input, the fc layer's pre-activation
    long long n = 0;
    int layer = -1;
    // the fc layer's buffer holds its GELU factor instead of the pre-activation (the FP8 recipe's fused fc
    // GEMM, fp8_gemm::FcPreOut): the GELU output can no longer be made from it, only the fc projection that
    // already has its input's codes may take it over
    bool pre_is_derivative = false;
    void leave(floatX* gelu_out, const floatX* pre_gelu, long long count, int fc_layer, bool derivative = false) {
        out = gelu_out; pre = pre_gelu; n = count; layer = fc_layer; pre_is_derivative = derivative;
    }
    // whether linear id, reading inp, is the fc projection this output was left for
    bool is_for(LinearId id, const floatX* inp) const { return out != nullptr && out == inp && layer == id.layer && id.kind == LIN_FCPROJ; }
    // taken over by its fc projection: returns the pre-activation to read instead
    const floatX* take() { out = nullptr; return pre; }
    void write(cudaStream_t st) {
        if (!out) return;
        if (pre_is_derivative) {
            fprintf(stderr, "error: layer %d's GELU output is read by something other than its fc projection, but its "
                            "fc GEMM kept the GELU derivative, not the pre-activation (FP8 recipe, fused fc GEMM)\n", layer);
            exit(1);
        }
        PHASE("gelu (for a BF16 reader)");
        gelu_forward(out, pre, n, st);
        out = nullptr;
    }
};

// The weights of every linear: weight[k] points at layer 0's (OC x C) matrix of kind k; layer l's
// follows at l * OC * C (the checkpoint's layout). head: the LM head's (Vp x C), which is the token
// embedding (tied).
struct LinearWeights {
    const floatX* weight[NUM_LINEAR_KINDS];
    const floatX* head = nullptr;
};

// Scratch every recipe's linear backward needs: the bias gradient's partial sums (bias_backward), and
// one micro-step's bias gradient as the weight-gradient GEMM's epilogue writes it.
struct LinearScratch {
    float* bias_partials = nullptr; // BIAS_ROW_GROUPS * max OC floats
    float* bias_grad = nullptr;     // max OC floats
};
inline void linear_scratch_init(LinearScratch& s, int C) {
    s.bias_partials = (float*)cuda_malloc_or_die((size_t)BIAS_ROW_GROUPS * 4 * C * sizeof(float), "bias scratch");
    s.bias_grad = (float*)cuda_malloc_or_die((size_t)4 * C * sizeof(float), "bias gradient scratch");
}

// ---------------------------------------------------------------------------------------------
// The plain linear layer: cuBLASLt GEMMs on floatX operands with FP32 accumulation (BF16 tensor
// cores; FP32 operands in the PRECISION=FP32 reference build). W is (OC x C) row-major.

// out (N x OC) = inp (N x C) W^T + bias
inline void plain_linear_forward(floatX* out, const floatX* inp, const floatX* weight, const floatX* bias,
                                 int N, int C, int OC, cudaStream_t stream) {
    matmul(out, weight, inp, bias, OC, N, C, true, false, 1.0f, 0.0f, false, stream);
}

// gelu_out = gelu(inp W^T + bias), pre_gelu = inp W^T + bias: the GELU in the GEMM's epilogue, or
// (where autotuning measured that faster, matmul_prefer_split) the GEMM with its bias epilogue writing
// pre_gelu and the GELU kernel reading it. The two differ in the last bits: the epilogue applies the
// GELU to the FP32 sum, the kernel to its BF16 rounding.
inline void plain_linear_forward_gelu(floatX* gelu_out, floatX* pre_gelu, const floatX* inp, const floatX* weight,
                                      const floatX* bias, int N, int C, int OC, cudaStream_t stream) {
    auto fused = [&]() {
        matmul(gelu_out, weight, inp, bias, OC, N, C, true, false, 1.0f, 0.0f, false, stream, MatmulBatch(),
               EPI_GELU_BIAS, pre_gelu);
    };
    auto split = [&]() {
        matmul(pre_gelu, weight, inp, bias, OC, N, C, true, false, 1.0f, 0.0f, false, stream);
        gelu_forward(gelu_out, pre_gelu, (long long)N * OC, stream);
    };
    const MatmulKey key = matmul_key(OC, N, C, true, false, bias != nullptr, false, false, MatmulBatch(), EPI_GELU_BIAS);
    if (matmul_prefer_split(key, stream, fused, split)) split();
    else fused();
}

// dinp = dout W, times gelu'(pre_gelu) when pre_gelu is given: in the GEMM's DGELU epilogue, or (where
// autotuning measured that faster) the plain GEMM and then gelu_backward in place. The split form
// rounds dout W to BF16 before the product with gelu' (two roundings instead of one), as a framework's
// separate GELU backward does.
inline void plain_linear_backward_dx(floatX* dinp, const floatX* dout, const floatX* weight, const floatX* pre_gelu,
                                     int N, int C, int OC, cudaStream_t stream) {
    if (!pre_gelu) {
        matmul(dinp, weight, dout, nullptr, C, N, OC, false, false, 1.0f, 0.0f, false, stream);
        return;
    }
    auto fused = [&]() {
        matmul(dinp, weight, dout, nullptr, C, N, OC, false, false, 1.0f, 0.0f, false, stream, MatmulBatch(),
               EPI_DGELU, (void*)pre_gelu);
    };
    auto split = [&]() {
        matmul(dinp, weight, dout, nullptr, C, N, OC, false, false, 1.0f, 0.0f, false, stream);
        gelu_backward(dinp, pre_gelu, (long long)N * C, stream);
    };
    const MatmulKey key = matmul_key(C, N, OC, false, false, false, false, false, MatmulBatch(), EPI_DGELU);
    if (matmul_prefer_split(key, stream, fused, split)) split();
    else fused();
}

// dweight (OC x C, FP32) += dout^T inp
inline void plain_linear_backward_dw(float* dweight, const floatX* dout, const floatX* inp, int N, int C, int OC,
                                     cudaStream_t stream) {
    matmul(dweight, inp, dout, nullptr, C, OC, N, false, true, 1.0f, 1.0f, true, stream);
}

// dweight += dout^T inp and dbias += column sums of dout. The bias gradient comes out of the weight
// gradient's GEMM (the BGRADB epilogue sums B = dout over k = the N rows, from the tiles the GEMM
// reads anyway) into scratch, then is added into dbias: the epilogue overwrites its vector. This saves
// bias_backward's own read of dout (N x OC BF16). But the epilogue narrows cuBLASLt's choice of
// algorithms, so with autotuning on, the first call of each shape also times the plain GEMM +
// bias_backward and keeps the faster (matmul_prefer_split; dweight and dbias are restored after the
// timing). Where cuBLASLt has no BGRADB algorithm (the FP32 reference build, say), bias_backward makes
// the same sums (another order).
inline void plain_linear_backward_dw_bias(float* dweight, float* dbias, const floatX* dout, const floatX* inp,
                                          const LinearScratch& scratch, int N, int C, int OC, cudaStream_t stream) {
    const float one = 1.0f;
    auto split = [&]() {
        plain_linear_backward_dw(dweight, dout, inp, N, C, OC, stream);
        if (dbias) bias_backward(dbias, scratch.bias_partials, dout, N, OC, stream);
    };
    if (!dbias) { split(); return; }
    const MatmulKey key = matmul_key(C, OC, N, false, true, false, false, true, MatmulBatch(), EPI_BGRADB);
    if (!matmul_plan(key)) { split(); return; } // no BGRADB algorithm for this shape
    auto fused = [&]() {
        const bool ok = matmul_launch(dweight, inp, dout, nullptr, C, OC, N, false, true, &one, &one, false, true, stream,
                                      MatmulBatch(), EPI_BGRADB, scratch.bias_grad, false);
        if (!ok) matmul_no_algorithm(key);
        bias_grad_accumulate(dbias, scratch.bias_grad, OC, stream);
    };
    const bool prefer_split = matmul_prefer_split(key, stream, fused, split,
                                                  {{dweight, (size_t)OC * C * sizeof(float)}, {dbias, (size_t)OC * sizeof(float)}});
    if (prefer_split) split();
    else fused();
}

inline void plain_linear_backward(float* dweight, float* dbias, floatX* dinp, const floatX* dout, const floatX* inp,
                                  const floatX* weight, const floatX* pre_gelu, const LinearScratch& scratch,
                                  int N, int C, int OC, cudaStream_t stream) {
    plain_linear_backward_dw_bias(dweight, dbias, dout, inp, scratch, N, C, OC, stream);
    plain_linear_backward_dx(dinp, dout, weight, pre_gelu, N, C, OC, stream);
}

// ---------------------------------------------------------------------------------------------
// The defaults of the state hooks (the top of the file). They take `const R&`, so that a recipe's own
// definition, for Recipe& or const Recipe&, is never a worse match than the template.
template <class R>
inline void recipe_weights_changed(const R&, const LinearWeights&, cudaStream_t) {}
template <class R>
inline void recipe_step_end(const R&, cudaStream_t) {}
template <class R>
inline void recipe_step_skipped(const R&, cudaStream_t) {}
template <class R>
inline void recipe_save(const R&, StateWriter&) {}
template <class R>
inline void recipe_load(const R&, StateReader&) {}
template <class R>
inline bool recipe_begin_step(const R&, int) { return false; }
template <class R>
inline void recipe_begin_micro_step(const R&, int) {}
template <class R>
inline RecipeMaxState recipe_cross_process_max(const R&) { return RecipeMaxState(); }
template <class R>
inline void recipe_log_telemetry(const R&, FILE*, int) {}
template <class R>
inline bool recipe_needs_input_in_backward(const R&, LinearId, int) { return true; }

// ---------------------------------------------------------------------------------------------
// The sites (the top of the file): a kernel of the model that makes one of a linear's operands and can
// write it in the recipe's quantized form as well.
enum RecipeSite {
    // a LayerNorm's output is the input of the linear after it (ln1 -> qkv, ln2 -> fc): rows only; when
    // the target is active the LayerNorm leaves its BF16 output unwritten
    SITE_LAYERNORM_OUTPUT,
    // the flash attention forward's output is the input of the attention projection: rows, and columns
    // (the transpose) where the target has them; the kernel still writes its BF16 output (the backward
    // reads it)
    SITE_ATTENTION_OUTPUT,
    // a LayerNorm backward's output is the output gradient of the projection that ends the block below
    // it (the attention or the fc projection): rows only; when active, the kernel leaves that gradient
    // unwritten and gives its column sums as the projection's bias gradient (linear_backward's dbias is
    // then null)
    SITE_LAYERNORM_BACKWARD_OUTPUT,
    // the flash attention backward's dqkv is the output gradient of the qkv linear: rows and columns;
    // when active, the kernel leaves dqkv unwritten
    SITE_ATTENTION_BACKWARD_DQKV,
};

// Where a site's kernel writes a linear operand's codes: the kernels' own type (formats/fp8_quantize.cuh)
using SiteTarget = Fp8Target;

template <class R>
inline SiteTarget recipe_site_output(R&, RecipeSite, LinearId, int, int, bool, cudaStream_t) { return SiteTarget(); }
template <class R>
inline SiteTarget recipe_site_again(R&, RecipeSite, LinearId, cudaStream_t) { return SiteTarget(); }

// Whether the site's kernel can write codes for an operand of `cols` columns (LayerNorm sites: the model's
// channels) and heads of head_size (attention sites): the kernels' own checks, layernorm.cuh and
// flash_attention.cuh
inline bool site_kernel_writes_codes(RecipeSite site, int cols, int head_size) {
    (void)head_size;
    switch (site) {
    case SITE_LAYERNORM_OUTPUT: return layernorm_gives_fp8(cols);
    case SITE_LAYERNORM_BACKWARD_OUTPUT: return layernorm_backward_gives_fp8(cols);
#if !defined(ENABLE_FP32)
    case SITE_ATTENTION_OUTPUT: return flash_attention_forward_gives_fp8(head_size);
    case SITE_ATTENTION_BACKWARD_DQKV: return flash_attention_backward_gives_fp8(head_size);
#endif
    default: return false;
    }
}

// What the model asks before a site's kernel: the target the recipe wants there for linear id's operand
// (rows x cols), or an inactive one where the kernel cannot write codes for this shape (head_size: the
// attention heads'). Backward sites are asked in training only.
template <class R>
inline SiteTarget site_output(R& r, RecipeSite site, LinearId id, int rows, int cols, int head_size, bool training,
                              cudaStream_t stream) {
    if (!site_kernel_writes_codes(site, cols, head_size)) return SiteTarget();
    return recipe_site_output(r, site, id, rows, cols, training, stream);
}
// What the model asks right after a LayerNorm site's kernel: whether to run it once more, under the
// target's device flag (recipe_site_again)
template <class R>
inline SiteTarget site_again(R& r, RecipeSite site, LinearId id, cudaStream_t stream) {
    return recipe_site_again(r, site, id, stream);
}

// ---------------------------------------------------------------------------------------------
// The linears the model calls: the recipe's quantized path where recipe_quantizes says so, the plain
// linear otherwise.
enum LinearPass { PASS_FORWARD, PASS_FORWARD_GELU, PASS_BACKWARD };

template <class R>
inline bool recipe_quantizes(const R&, LinearId, int, int, int, LinearPass) { return false; }
template <class R>
inline void recipe_before_plain_linear(const R&, LinearId, LinearPass, cudaStream_t) {}

[[noreturn]] inline void recipe_has_no_quantized_path(LinearId id, const char* what) {
    fprintf(stderr, "error: the recipe quantizes layer %d's %s but defines no %s\n", id.layer, LINEAR_NAMES[id.kind], what);
    exit(1);
}
template <class R>
inline void recipe_linear_forward(const R&, LinearId id, floatX*, const floatX*, const floatX*, const floatX*, int, int, int,
                                  bool, cudaStream_t) {
    recipe_has_no_quantized_path(id, "recipe_linear_forward");
}
template <class R>
inline void recipe_linear_forward_gelu(const R&, LinearId id, floatX*, floatX*, const floatX*, const floatX*, const floatX*,
                                       int, int, int, bool, cudaStream_t) {
    recipe_has_no_quantized_path(id, "recipe_linear_forward_gelu");
}
template <class R>
inline void recipe_linear_backward(const R&, LinearId id, floatX*, float*, float*, const floatX*, const floatX*, const floatX*,
                                   const floatX*, int, int, int, cudaStream_t) {
    recipe_has_no_quantized_path(id, "recipe_linear_backward");
}

// ---------------------------------------------------------------------------------------------
// The LM head (the top of the file): logits = lnf wte^T, the weight tied to the token embedding; after
// the classifier has overwritten the logits with dlogits, dwte += dlogits^T lnf and dlnf = dlogits wte.

// The plain head: BF16 GEMMs, FP32 accumulation, the weight gradient accumulated in FP32
inline void plain_head_forward(floatX* logits, const floatX* lnf, const floatX* wte, int rows, int C, int Vp,
                               cudaStream_t stream) {
    matmul(logits, wte, lnf, nullptr, Vp, rows, C, true, false, 1.0f, 0.0f, false, stream);
}
inline void plain_head_backward_dw(float* dwte, const floatX* dlogits, const floatX* lnf, int rows, int C, int Vp,
                                   cudaStream_t stream) {
    matmul(dwte, lnf, dlogits, nullptr, C, Vp, rows, false, true, 1.0f, 1.0f, true, stream);
}
inline void plain_head_backward_dx(floatX* dlnf, const floatX* dlogits, const floatX* wte, int rows, int C, int Vp,
                                   cudaStream_t stream) {
    matmul(dlnf, wte, dlogits, nullptr, C, rows, Vp, false, false, 1.0f, 0.0f, false, stream);
}
inline void plain_head_backward(float* dwte, floatX* dlnf, const floatX* dlogits, const floatX* lnf, const floatX* wte,
                                int rows, int C, int Vp, cudaStream_t stream) {
    plain_head_backward_dw(dwte, dlogits, lnf, rows, C, Vp, stream);
    plain_head_backward_dx(dlnf, dlogits, wte, rows, C, Vp, stream);
}

// Where the classifier writes its dlogits a second time, as E5M2 codes of dlogit * scale (row-major, rows
// x Vp, the padded columns' codes 0): rows null = not wanted
struct HeadGradCodes {
    uint8_t* rows = nullptr;
    float scale = 1.0f;
};

template <class R>
inline bool recipe_quantizes_head(const R&, int, int, int) { return false; }
template <class R>
inline HeadGradCodes recipe_head_grad_codes(R&, int, int, float, cudaStream_t) { return HeadGradCodes(); }
template <class R>
inline void recipe_head_forward(R&, floatX*, const floatX*, const floatX*, int, int, int, bool, cudaStream_t) {
    fprintf(stderr, "error: the recipe quantizes the LM head but defines no recipe_head_forward\n");
    exit(1);
}
template <class R>
inline void recipe_head_backward(R&, float*, floatX*, const floatX*, const floatX*, const floatX*, int, int, int,
                                 cudaStream_t) {
    fprintf(stderr, "error: the recipe quantizes the LM head but defines no recipe_head_backward\n");
    exit(1);
}

template <class R>
inline void lm_head_forward(R& r, floatX* logits, const floatX* lnf, const floatX* wte, int rows, int C, int Vp,
                            bool training, cudaStream_t stream) {
    if (recipe_quantizes_head(r, rows, C, Vp)) recipe_head_forward(r, logits, lnf, wte, rows, C, Vp, training, stream);
    else plain_head_forward(logits, lnf, wte, rows, C, Vp, stream);
}
template <class R>
inline HeadGradCodes lm_head_grad_codes(R& r, int rows, int C, int Vp, float bound, cudaStream_t stream) {
    if (!recipe_quantizes_head(r, rows, C, Vp)) return HeadGradCodes();
    return recipe_head_grad_codes(r, rows, Vp, bound, stream);
}
template <class R>
inline void lm_head_backward(R& r, float* dwte, floatX* dlnf, const floatX* dlogits, const floatX* lnf,
                             const floatX* wte, int rows, int C, int Vp, cudaStream_t stream) {
    if (recipe_quantizes_head(r, rows, C, Vp)) recipe_head_backward(r, dwte, dlnf, dlogits, lnf, wte, rows, C, Vp, stream);
    else plain_head_backward(dwte, dlnf, dlogits, lnf, wte, rows, C, Vp, stream);
}

// LLMC_PROFILE=2 names each GEMM of the plain linear (profiler.h)
static const char* const PLAIN_FINE_FWD[NUM_LINEAR_KINDS] = {"  gemm qkv fwd", "  gemm attproj fwd",
                                                              "  gemm fc fwd (+GELU)", "  gemm fcproj fwd"};
static const char* const PLAIN_FINE_WGRAD[NUM_LINEAR_KINDS] = {"  gemm qkv wgrad+bias", "  gemm attproj wgrad+bias",
                                                                "  gemm fc wgrad+bias", "  gemm fcproj wgrad+bias"};
static const char* const PLAIN_FINE_DGRAD[NUM_LINEAR_KINDS] = {"  gemm qkv dgrad", "  gemm attproj dgrad",
                                                                "  gemm fc dgrad", "  gemm fcproj dgrad (+DGELU)"};

// out (N x OC) = inp (N x C) W^T + bias
template <class R>
inline void linear_forward(R& r, LinearId id, floatX* out, const floatX* inp, const floatX* weight, const floatX* bias,
                           int N, int C, int OC, bool training, cudaStream_t stream) {
    if (recipe_quantizes(r, id, N, C, OC, PASS_FORWARD)) {
        recipe_linear_forward(r, id, out, inp, weight, bias, N, C, OC, training, stream);
        return;
    }
    recipe_before_plain_linear(r, id, PASS_FORWARD, stream);
    PHASE_FINE(PLAIN_FINE_FWD[id.kind]);
    plain_linear_forward(out, inp, weight, bias, N, C, OC, stream);
}
// gelu_out = gelu(inp W^T + bias), pre_gelu = inp W^T + bias (the top of the file)
template <class R>
inline void linear_forward_gelu(R& r, LinearId id, floatX* gelu_out, floatX* pre_gelu, const floatX* inp,
                                const floatX* weight, const floatX* bias, int N, int C, int OC, bool training,
                                cudaStream_t stream) {
    if (recipe_quantizes(r, id, N, C, OC, PASS_FORWARD_GELU)) {
        recipe_linear_forward_gelu(r, id, gelu_out, pre_gelu, inp, weight, bias, N, C, OC, training, stream);
        return;
    }
    recipe_before_plain_linear(r, id, PASS_FORWARD_GELU, stream);
    PHASE_FINE(PLAIN_FINE_FWD[id.kind]);
    plain_linear_forward_gelu(gelu_out, pre_gelu, inp, weight, bias, N, C, OC, stream);
}
// dinp = dout W (times gelu'(pre_gelu)), dweight += dout^T inp, dbias += column sums of dout
template <class R>
inline void linear_backward(R& r, LinearId id, floatX* dinp, float* dweight, float* dbias, const floatX* dout,
                            const floatX* inp, const floatX* weight, const floatX* pre_gelu, int N, int C, int OC,
                            cudaStream_t stream) {
    if (recipe_quantizes(r, id, N, C, OC, PASS_BACKWARD)) {
        recipe_linear_backward(r, id, dinp, dweight, dbias, dout, inp, weight, pre_gelu, N, C, OC, stream);
        return;
    }
    recipe_before_plain_linear(r, id, PASS_BACKWARD, stream);
    PHASE_FINE(PLAIN_FINE_WGRAD[id.kind]);
    plain_linear_backward_dw_bias(dweight, dbias, dout, inp, r.scratch, N, C, OC, stream);
    PHASE_FINE(PLAIN_FINE_DGRAD[id.kind]);
    plain_linear_backward_dx(dinp, dout, weight, pre_gelu, N, C, OC, stream);
}
