// recipes/fp8/recipe.h: the FP8-hybrid precision recipe: E4M3 for weights and activations in the
// forward pass, E5M2 for gradients in the backward pass, per-tensor delayed scaling.
//
// Which GEMMs. The four linears of every transformer layer (qkv, attention projection, fc, fc
// projection) run on Hopper's FP8 tensor cores, except in the first -sqf and last -sql layers,
// which run the plain BF16 linear. Embeddings, attention and the norms stay BF16, and so do the master
// weights (FP32) and AdamW; the LM head too, unless -flh 1 (its own section below). Per linear, with x the input, W the weight and dy the
// gradient of the output (N rows = tokens):
//   forward   y  = x W^T          E4M3 x E4M3, fast accumulation, bias in the epilogue (the fc layer's
//                                 GELU is applied by the fc projection's quantize pass)
//   dgrad     dx = dy W           E5M2 x E4M3 (W^T kept as a second FP8 copy), FP32 accumulation
//   wgrad     dW += dy^T x        E5M2 x E4M3 (x^T and dy^T made by the quantize-transpose kernel),
//                                 FP32 accumulation straight into the FP32 gradient
// Hopper's FP8 GEMMs want both operands K-major, hence the transposed copies: W and W^T are made
// once per optimizer step (recipe_weights_changed), x and x^T in one pass per forward (x^T is kept
// for the backward), dy and dy^T in one pass per backward.
//
// Scaling (formats/fp8_scaling.h): three quantized tensors per linear (W, x, dy), each with its own scale
// s = FP8_MAX / max(amax history) / 2^margin, constant within an optimizer step. The quantize
// kernels record the amax of the step on the GPU in the pass that quantizes; recipe_step_end pushes
// it into the history (-fh steps) and derives the next scale. A tensor quantized for the first
// time has no history: its scale is then computed from its own amax first (one extra pass, once
// per tensor per run), so step 0 is as well scaled as the rest. Evaluation and sampling use the
// scales but record nothing.
//
// Telemetry (-lq N): every N steps, one main.log line per quantized tensor with the step's amax,
// the scale it was quantized with, and the fractions of values saturated and flushed to zero.
#pragma once
// FP8 tensor-core GEMMs and the E4M3 / E5M2 conversions exist from sm_89 (Ada) on: a build for an older GPU stops
// here, not at run time
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 890
#error "the fp8 recipe needs an sm_89 or newer GPU: build with GPU_ARCH=sm_89, sm_90a (the default) or newer"
#endif
#include <vector>
#include "llmc/recipe_api.h"
#include "options.h"
#include "llmc/formats/fp8_quantize.cuh"
#include "llmc/formats/fp8_block_quantize.cuh"
#include "fp8_gemm.cuh"
#include "llmc/gelu.cuh"
#include "llmc/profiler.h"

#define RECIPE_NAME "fp8"
using RecipeOptions = Fp8Options; // its flags (options.h)
using RecipeBoundaries = IdentityBoundaries; // no boundaries outside the linears (boundaries.h)

#if defined(ENABLE_FP32)
#error "the fp8 recipe is a BF16 build (PRECISION=FP32 is the BF16 recipe's reference build)"
#endif

static const int FP8_INV_STRIDE = 4; // floats: 16 bytes per dequantization factor

enum Fp8Role { FP8_W = 0, FP8_X = 1, FP8_DY = 2, NUM_FP8_ROLES = 3 };
static const char* FP8_ROLE_NAMES[NUM_FP8_ROLES] = {"w", "x", "dy"};

struct Recipe {
    RecipeOptions options;
    LinearScratch scratch;
    int L = 0, C = 0, B = 0, T = 0;
    int num_linears = 0;               // 4 L
    int num_tensors = 0;               // 3 per linear, role-major: t = role * num_linears + layer * 4 + kind
    // device state, one entry per tensor (history: H per tensor)
    float* scale = nullptr;            // s: q = fp8(x * s)
    float* inv_scale = nullptr;        // 1 / s: what the GEMMs multiply by; tensor t's at t * FP8_INV_STRIDE
                                       // (cuBLASLt wants its scale pointers 16-byte aligned)
    uint32_t* amax_now = nullptr;      // this step's amax so far (bits of a non-negative float)
    float* history = nullptr;          // (num_tensors x H) ring buffers
    unsigned long long* stats = nullptr; // (num_tensors x 3): values, saturated, flushed (this step)
    // host state
    std::vector<uint8_t> calibrated;   // per tensor: has a scale from its own data
    long long steps_pushed = 0;        // optimizer steps recorded in the histories
    // FP8 copies of the weights, per linear: W (OC x C) then W^T (C x OC), E4M3
    uint8_t* weights8 = nullptr;
    std::vector<size_t> weight_offset; // per linear, into weights8
    // scratch: x (N x K), dy (N x OC), dy^T (OC x N); the scale of an evaluation-only
    // calibration (2 floats) and its amax
    uint8_t *x8 = nullptr, *dy8 = nullptr, *dyt8 = nullptr;
    // x^T of every quantized linear, written by the training forward pass for its backward pass
    // (so the backward needs neither the BF16 input nor its recomputation): (K x N) per linear
    uint8_t* saved_xt = nullptr;
    std::vector<size_t> saved_xt_offset; // per linear, into saved_xt
    float* eval_scale = nullptr;       // [0] = s, [FP8_INV_STRIDE] = 1 / s
    uint32_t* eval_amax = nullptr;
    float* col_partials = nullptr;     // ceil(N / 64) x 4C: the bias gradient's per-tile column sums
    // The fc layer's GELU output is left unwritten by its forward (recipe_api.h): its GEMM writes the
    // pre-activation (bias in the epilogue), and the fc projection's quantize pass, which runs next,
    // reads that and applies the GELU itself. Nothing else reads it in the FP8 layers (their backward
    // takes x^T from the forward). Any other recipe call first writes it (fp8_write_gelu_out).
    PendingGeluOut pending_gelu_out;
    // The GELU derivative between the fc projection's input gradient and the fc layer's output
    // gradient is applied by the fc layer's dy quantization pass, not by gelu_backward: the fc
    // projection's backward leaves d(gelu output) in its dinp and notes it here; the fc layer's
    // backward, which runs next, quantizes dinp * bf16(gelu'(pre)). Saves writing and re-reading that
    // N x 4C tensor (two passes over 2 bytes a value). Bit-identical to the separate pass.
    struct {
        floatX* grad = nullptr;      // d(gelu output), to become d(gelu input)
        const floatX* pre = nullptr; // the GELU's input (or its factor: see fc_keeps_gelu_factor)
        long long n = 0;
        int layer = -1;
        void leave(floatX* d_gelu_out, const floatX* pre_gelu, long long count, int fc_layer) {
            grad = d_gelu_out; pre = pre_gelu; n = count; layer = fc_layer;
        }
    } pending_gelu;
    // The recipe's GELU backward multiplies by bf16(gelu'(pre)), the derivative rounded to BF16 (gelu.cuh,
    // GeluFactor::ROUNDED), on every path. The fused fc GEMM (below) stores that factor in place of the
    // pre-activation (fp8_gemm::FcPreOut), so that the fused dgrad multiplies instead of evaluating gelu'
    // (GeluFactor::GIVEN); per layer, whether its forward did (set by linear_forward_gelu, read by the backward).
    std::vector<uint8_t> fc_keeps_gelu_factor;
    bool count_stats = false;          // this step's activations and gradients are counted (-lq)
    // the linear whose output gradient a kernel wrote as E5M2 codes into dy8 / dyt8 (with its amax)
    // through recipe_site_output: its linear_backward, the next call, takes them as they are
    // (and makes dy^T from the rows when the kernel wrote the rows only)
    LinearId dy_given{-1, LIN_QKV};
    bool dy_given_rows_only = false;
    bool dy_given_bias_partials = false; // dy_given with the bias gradient's column sums per 128 rows in col_partials (fc_dy_ws)
    // the linear whose input the LayerNorm before it wrote as E4M3 codes into x8 (with its amax, when
    // training) through recipe_site_output: its forward, the next call, takes them and only
    // transposes them for x^T (unless x^T is written too: the fused fc GEMM, below)
    LinearId x_given{-1, LIN_QKV};
    bool x_given_with_t = false;
    // The MLP's fused FP8 GEMMs (recipes/fp8/fp8_gemm.cuh's persistent kernels; Hopper, training steps without
    // telemetry, once the tensors have scales): the fc layer's GEMM writes the fc projection's input,
    // E4M3 codes of gelu(pre) in both layouts (and keeps bf16(gelu'(pre)), not pre), and the fc projection's
    // dgrad writes the fc layer's output gradient, E5M2 codes of d(gelu output) bf16(gelu'(pre)) in both layouts
    // with its bias sums, each from its epilogue, instead of cuBLASLt's GEMM and a pass. LLMC_FP8_FUSED_GEMM=0 turns them off (A/B runs).
    bool fused_gemm = true;
    // -fs (options.h): FP8_SCALING_DELAYED, _CURRENT or _BLOCK
    int mode = FP8_SCALING_DELAYED;
    // Current scaling: the amax of an input ([0]) or an output gradient ([1]) that the kernel which wrote the
    // tensor recorded (recipe_site_output, an amax-only target; gelu_backward for the fc layer's output
    // gradient: fp8_gelu_grad_amax_target), and the linear whose next call takes it in place of an amax pass of
    // its own
    uint32_t* given_amax = nullptr;
    LinearId x_amax_given{-1, LIN_QKV}, dy_amax_given{-1, LIN_QKV};
    // Block scaling: the dequantization factors of the codes above (formats/fp8_block_scaling.h's layouts)
    float* weight_inv = nullptr;              // per linear: W's (128 x 128 blocks of OC x C), then W^T's (of C x OC)
    std::vector<size_t> weight_inv_offset;    // floats, per linear, into weight_inv
    float* saved_xt_inv = nullptr;            // per linear: x^T's (1 x 128 blocks of C x N, along the tokens)
    std::vector<size_t> saved_xt_inv_offset;  // floats, per linear
    float *x_inv = nullptr, *dy_inv = nullptr, *dyt_inv = nullptr; // scratch: x's, dy's (along K), dy^T's (along N)
    uint32_t* scale_hist = nullptr;           // (num_tensors x 256) telemetry: counts of floor(log2 s) + 128
    // (where cuBLASLt has no block-scaled GEMM with an FP32 output: the wgrad's BF16 product, added to the
    // FP32 gradient by a kernel of ours; allocated on that first need)
    floatX* wgrad_bf16 = nullptr;
    // The LM head in FP8 (-flh 1; the section "the LM head" below)
    struct {
        bool on = false;
        int rows = 0, Vp = 0;          // the most rows of one call; the padded vocabulary
        uint8_t* w = nullptr;          // wte's E4M3 codes (Vp x C), then their transpose (C x Vp) at wt
        uint8_t* wt = nullptr;
        bool w_ready = false;          // w and wt hold the weights now in use
        uint8_t* x = nullptr;          // one chunk of lnf as E4M3 codes (rows x C)
        uint8_t* grad = nullptr;       // the chunk's dlogits as E5M2 codes (rows x Vp), written by the classifier
        float* scales = nullptr;       // device, FP8_INV_STRIDE floats apart: w's s, 1/s; x's s, 1/s; grad's 1/s
        uint32_t* amax = nullptr;      // device: w's, x's, and a slot the quantizers' own amax goes to
        float grad_scale = 0.0f;       // the scale of the grad codes (host; 0 before the first)
        bool grad_given = false;       // the classifier wrote this chunk's grad codes
    } head;
};
// the head's scale slots (Recipe::head.scales)
enum Fp8HeadScale { HEAD_W_S = 0, HEAD_W_INV = 4, HEAD_X_S = 8, HEAD_X_INV = 12, HEAD_GRAD_INV = 16, HEAD_SCALE_FLOATS = 20 };
static const int FP8_SCALE_HIST_BINS = 256;

// Whether tensor t's scale is known before the tensor exists: delayed scaling, once the tensor has a history.
// Only then can a kernel write its codes as it produces it (the LayerNorm and attention sites, the fused MLP
// GEMMs, the GELU derivative applied in the fc layer's dy pass); current scaling needs the finished tensor's amax
// first (which those producers record instead: fp8_current_amax_target, fp8_gelu_grad_amax_target), and block
// scaling has its own passes (fp8_block_forward, fp8_block_backward).
inline bool fp8_scale_known(const Recipe& r, int t) { return r.mode == FP8_SCALING_DELAYED && r.calibrated[t]; }

inline int fp8_tensor(const Recipe& r, LinearId id, Fp8Role role) {
    return role * r.num_linears + id.layer * NUM_LINEAR_KINDS + id.kind;
}
inline int fp8_linear_index(LinearId id) { return id.layer * NUM_LINEAR_KINDS + id.kind; }

inline void recipe_init(Recipe& r, const RecipeOptions& o, const ModelShape& shape, int B, int T,
                        const RecipeContext& context = RecipeContext()) {
    r.options = o;
    resolve_fp8_defaults(r.options);
    r.mode = fp8_scaling_mode(o);
    r.L = shape.num_layers; r.C = shape.channels; r.B = B; r.T = T;
    linear_scratch_init(r.scratch, r.C);
    r.num_linears = r.L * NUM_LINEAR_KINDS;
    r.num_tensors = r.num_linears * NUM_FP8_ROLES;
    const size_t nt = r.num_tensors, H = o.amax_history;
    r.scale = (float*)cuda_malloc_or_die(nt * sizeof(float), "fp8 scales");
    r.inv_scale = (float*)cuda_malloc_or_die(nt * FP8_INV_STRIDE * sizeof(float), "fp8 scales");
    r.amax_now = (uint32_t*)cuda_malloc_or_die(nt * sizeof(uint32_t), "fp8 amax");
    r.history = (float*)cuda_malloc_or_die(nt * H * sizeof(float), "fp8 amax history");
    r.stats = (unsigned long long*)cuda_malloc_or_die(nt * 3 * sizeof(unsigned long long), "fp8 telemetry");
    std::vector<float> ones(nt * FP8_INV_STRIDE, 1.0f);
    cudaCheck(cudaMemcpy(r.scale, ones.data(), nt * sizeof(float), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(r.inv_scale, ones.data(), nt * FP8_INV_STRIDE * sizeof(float), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemset(r.amax_now, 0, nt * sizeof(uint32_t)));
    cudaCheck(cudaMemset(r.history, 0, nt * H * sizeof(float)));
    cudaCheck(cudaMemset(r.stats, 0, nt * 3 * sizeof(unsigned long long)));
    r.calibrated.assign(nt, 0);
    r.fc_keeps_gelu_factor.assign(r.L, 0);
    r.steps_pushed = 0;
    // per quantized linear: its FP8 weights (W and W^T) and the x^T its forward saves for backward
    const size_t weight_bytes =
        quantized_linears_layout(r.options, r.L, r.C, r.weight_offset, [&](int K, int OC) { return 2 * (size_t)K * OC; });
    const size_t saved_bytes =
        quantized_linears_layout(r.options, r.L, r.C, r.saved_xt_offset, [&](int K, int) { return (size_t)B * T * K; });
    r.weights8 = weight_bytes ? (uint8_t*)cuda_malloc_or_die(weight_bytes, "fp8 weights") : nullptr;
    r.saved_xt = saved_bytes ? (uint8_t*)cuda_malloc_or_die(saved_bytes, "fp8 activations (x^T for backward)") : nullptr;
    const size_t widest = (size_t)B * T * 4 * r.C;
    r.x8 = (uint8_t*)cuda_malloc_or_die(widest, "fp8 activations");
    r.dy8 = (uint8_t*)cuda_malloc_or_die(widest, "fp8 gradients");
    r.dyt8 = (uint8_t*)cuda_malloc_or_die(widest, "fp8 gradients");
    r.eval_scale = (float*)cuda_malloc_or_die(2 * FP8_INV_STRIDE * sizeof(float), "fp8 scales");
    r.eval_amax = (uint32_t*)cuda_malloc_or_die(sizeof(uint32_t), "fp8 amax");
    r.given_amax = (uint32_t*)cuda_malloc_or_die(2 * sizeof(uint32_t), "fp8 amax");
    cudaCheck(cudaMemset(r.given_amax, 0, 2 * sizeof(uint32_t)));
    r.col_partials = (float*)cuda_malloc_or_die((size_t)ceil_div((long long)B * T, FP8_TILE) * 4 * r.C * sizeof(float),
                                                "bias gradient scratch");
    if (const char* e = getenv("LLMC_FP8_FUSED_GEMM")) {
        if (strcmp(e, "0") && strcmp(e, "1")) input_error("LLMC_FP8_FUSED_GEMM must be 0 (cuBLASLt and the passes) or 1 (the fused MLP GEMMs), got '%s'", e);
        r.fused_gemm = e[0] == '1';
    }
    if (r.mode != FP8_SCALING_DELAYED) r.fused_gemm = false; // (its epilogues quantize with a scale known in advance)
    if (o.head) {
        auto& h = r.head;
        h.on = true;
        h.rows = context.head_rows > 0 ? context.head_rows : B * T;
        h.Vp = shape.padded_vocab_size;
        const size_t wbytes = (size_t)h.Vp * r.C;
        h.w = (uint8_t*)cuda_malloc_or_die(2 * wbytes, "fp8 LM head weights");
        h.wt = h.w + wbytes;
        h.x = (uint8_t*)cuda_malloc_or_die((size_t)h.rows * r.C, "fp8 LM head activations");
        h.grad = (uint8_t*)cuda_malloc_or_die((size_t)h.rows * h.Vp, "fp8 LM head gradients");
        h.scales = (float*)cuda_malloc_or_die(HEAD_SCALE_FLOATS * sizeof(float), "fp8 scales");
        h.amax = (uint32_t*)cuda_malloc_or_die(4 * sizeof(uint32_t), "fp8 amax");
        cudaCheck(cudaMemset(h.scales, 0, HEAD_SCALE_FLOATS * sizeof(float)));
        cudaCheck(cudaMemset(h.amax, 0, 4 * sizeof(uint32_t)));
    }
    if (r.mode == FP8_SCALING_BLOCK) {
        using namespace llmc;
        const size_t N = (size_t)B * T;
        const size_t winv = quantized_linears_layout(r.options, r.L, r.C, r.weight_inv_offset, [&](int K, int OC) {
            return fp8_blk128_scale_count(OC, K) + fp8_blk128_scale_count(K, OC);
        });
        const size_t xtinv = quantized_linears_layout(r.options, r.L, r.C, r.saved_xt_inv_offset,
                                                      [&](int K, int) { return fp8_vec128_scale_count(K, (int)N); });
        const size_t widest = std::max(fp8_vec128_scale_count((int)N, 4 * r.C), fp8_vec128_scale_count(4 * r.C, (int)N));
        auto alloc = [&](size_t floats) {
            float* p = (float*)cuda_malloc_or_die(std::max<size_t>(floats, 4) * sizeof(float), "fp8 block scales");
            cudaCheck(cudaMemset(p, 0, std::max<size_t>(floats, 4) * sizeof(float))); // (the layouts' padding stays 0)
            return p;
        };
        r.weight_inv = alloc(winv);
        r.saved_xt_inv = alloc(xtinv);
        r.x_inv = alloc(widest);
        r.dy_inv = alloc(widest);
        r.dyt_inv = alloc(widest);
        r.scale_hist = (uint32_t*)cuda_malloc_or_die(nt * FP8_SCALE_HIST_BINS * sizeof(uint32_t), "fp8 telemetry");
        cudaCheck(cudaMemset(r.scale_hist, 0, nt * FP8_SCALE_HIST_BINS * sizeof(uint32_t)));
    }
}

inline std::string recipe_describe(const Recipe& r) {
    const RecipeOptions& o = r.options;
    int q0 = o.skip_first, q1 = r.L - o.skip_last;
    std::string layers = q1 > q0 ? strfmt("layers %d-%d in FP8", q0, q1 - 1) : std::string("no layer in FP8");
    std::string scaling = strfmt("E4M3 forward / E5M2 backward, delayed scaling (history %d, margin %d)", o.amax_history,
                                 o.scale_margin);
    if (r.mode == FP8_SCALING_CURRENT)
        scaling = strfmt("E4M3 forward / E5M2 backward, current scaling (margin %d)", o.scale_margin);
    if (r.mode == FP8_SCALING_BLOCK)
        scaling = strfmt("E4M3 forward / %s backward, block scaling (1x128 activations and gradients, 128x128 weights%s)",
                         fp8_block_grads_e5m2(o) ? "E5M2" : "E4M3", o.pow2_scales ? ", power-of-two scales" : "");
    if (r.head.on) layers += ", the LM head's forward and input gradient in FP8";
    return strfmt("fp8: %s, %s, -sqf %d -sql %d, GELU' rounded to BF16%s", scaling.c_str(), layers.c_str(), o.skip_first,
                  o.skip_last,
                  r.fused_gemm && gemm_wgmma::available() ? "; the MLP's FP8 operands from the fc GEMM's and the fc projection dgrad's epilogues" : "");
}

// ---- scales -------------------------------------------------------------------------------------
__global__ void fp8_scale_from_amax_kernel(float* scale, float* inv_scale, const uint32_t* amax, float fp8_max, int margin) {
    float s = llmc::fp8_delayed_scale(__uint_as_float(*amax), fp8_max, margin, 1.0f);
    *scale = s;
    *inv_scale = llmc::fp8_inverse(s);
}

__global__ void fp8_step_end_kernel(float* history, int H, long long steps, uint32_t* amax_now, float* scale,
                                    float* inv_scale, int num_tensors, int num_linears, int margin) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= num_tensors) return;
    const float fp8_max = t / num_linears == FP8_DY ? llmc::FP8_E5M2_MAX : llmc::FP8_E4M3_MAX;
    llmc::fp8_history_push(history + (size_t)t * H, H, steps, reinterpret_cast<float*>(amax_now + t), scale + t,
                           inv_scale + (size_t)t * FP8_INV_STRIDE, fp8_max, margin);
}

struct Fp8ScalePtrs { const float* scale; const float* inv; };
inline float* fp8_inv(const Recipe& r, int t) { return r.inv_scale + (size_t)t * FP8_INV_STRIDE; }

// The scale to quantize tensor t (the values x, n of them) with. A tensor seen for the first time
// is calibrated from its own amax: into its state when training, else into a scratch slot. In a
// data-parallel run the training calibration takes process 0's amax (its first slice), the one a
// single process with every micro-step would have used, so that all processes quantize the step's
// slices with the same scales, those of one process.
// Current scaling calibrates every time, the same way, from the amax of the tensor about to be quantized:
// amax_given when the kernel that wrote it recorded that (recipe_site_output, gelu_backward), else from a pass
// of its own over x. Each process scales its own slice (the weights, alike on every process, get alike scales).
// gelu_of_input: x is a GELU's input and the tensor is gelu(x) as gelu_forward stores it (the fc projection's
// input, left unwritten: Recipe::pending_gelu_out); the amax pass takes the GELU of each value itself.
inline Fp8ScalePtrs fp8_scale_for(Recipe& r, int t, const floatX* x, long long n, bool training, cudaStream_t st,
                                  const uint32_t* amax_given = nullptr, bool gelu_of_input = false) {
    if (r.mode == FP8_SCALING_DELAYED && r.calibrated[t]) return {r.scale + t, fp8_inv(r, t)};
    float* s = training ? r.scale + t : r.eval_scale;
    float* inv = training ? fp8_inv(r, t) : r.eval_scale + FP8_INV_STRIDE;
    const uint32_t* amax = amax_given;
    if (!amax) {
        cudaCheck(cudaMemsetAsync(r.eval_amax, 0, sizeof(uint32_t), st));
        tensor_amax(r.eval_amax, x, n, st, gelu_of_input);
        if (training && r.mode == FP8_SCALING_DELAYED && g_cross_process.active())
            g_cross_process.broadcast_u32(g_cross_process.ctx, r.eval_amax, 1, st);
        amax = r.eval_amax;
    }
    const float fp8_max = t / r.num_linears == FP8_DY ? llmc::FP8_E5M2_MAX : llmc::FP8_E4M3_MAX;
    fp8_scale_from_amax_kernel<<<1, 1, 0, st>>>(s, inv, amax, fp8_max, r.options.scale_margin);
    cudaCheckLaunch();
    if (training) r.calibrated[t] = 1;
    return {s, inv};
}

inline Fp8Stats fp8_stats_of(const Recipe& r, int t) { Fp8Stats s; s.counts = r.stats + (size_t)t * 3; return s; }

inline uint8_t* fp8_weight(const Recipe& r, LinearId id) { return r.weights8 + r.weight_offset[fp8_linear_index(id)]; }
inline uint8_t* fp8_weight_t(const Recipe& r, LinearId id) {
    return fp8_weight(r, id) + (size_t)linear_in_features(id.kind, r.C) * linear_out_features(id.kind, r.C);
}

// FP8 GEMMs need every leading dimension to be a multiple of 16 bytes; other shapes (and the
// layers kept in BF16) take the plain linear. Block scaling also needs each of its GEMMs' K (C, OC and
// the tokens N) to be a multiple of 128, cuBLASLt's block-scaled GEMMs' condition: a linear of another
// shape runs in BF16 (the quantizers themselves define a shorter last block: fp8_block_scaling.h).
inline bool fp8_applies(const Recipe& r, LinearId id, int N, int C, int OC) {
    if (r.mode == FP8_SCALING_BLOCK && (N % llmc::FP8_BLOCK != 0 || C % llmc::FP8_BLOCK != 0 || OC % llmc::FP8_BLOCK != 0))
        return false;
    return layer_is_quantized(r.options, id.layer, r.L) && N % 16 == 0 && C % 16 == 0 && OC % 16 == 0;
}

// ---- block scaling (-fs block) ------------------------------------------------------------------
// Which GEMMs and which blocks (doc/recipes/fp8.md):
//   forward  y  = x W^T   A = W   (OC x C),  128 x 128 blocks    B = x  (N x C),  1 x 128 along C
//   dgrad    dx = dy W    A = W^T (C x OC),  128 x 128 blocks    B = dy (N x OC), 1 x 128 along OC
//                         (W's blocks transposed: the same scales, another layout of them)
//   wgrad    dW += dy^T x A = x^T (C x N),   1 x 128 along N     B = dy^T (OC x N), 1 x 128 along N
// A GEMM's blocks lie along its own K, so the wgrad's operands are not the transposed codes of x and dy
// (whose blocks lie along C and OC) but their own quantization, by columns, from the same read of the BF16
// tensor (fp8_block_quantize's cols layout): x^T in the forward pass (saved for the backward), dy^T with dy.
// E4M3 for the weights and activations, E4M3 (or E5M2, -fbg e5m2) for the gradients; FP32 accumulation,
// promoted every 128 values of K (no fast accumulation).
inline float* fp8_weight_inv(const Recipe& r, LinearId id) { return r.weight_inv + r.weight_inv_offset[fp8_linear_index(id)]; }
inline float* fp8_weight_t_inv(const Recipe& r, LinearId id) {
    const int C = linear_in_features(id.kind, r.C), OC = linear_out_features(id.kind, r.C);
    return fp8_weight_inv(r, id) + llmc::fp8_blk128_scale_count(OC, C);
}
inline float* fp8_saved_xt_inv(const Recipe& r, LinearId id) { return r.saved_xt_inv + r.saved_xt_inv_offset[fp8_linear_index(id)]; }
inline uint32_t* fp8_scale_hist(const Recipe& r, int t) { return r.scale_hist + (size_t)t * FP8_SCALE_HIST_BINS; }
[[noreturn]] inline void fp8_no_block_gemm(const char* what, int m, int n, int k) {
    fprintf(stderr, "error: cuBLASLt has no block-scaled FP8 GEMM for the %s (m=%d n=%d k=%d; -fs block needs CUDA 12.9+ "
                    "and Hopper)\n", what, m, n, k);
    exit(1);
}

// ---- the LM head (-flh 1) ------------------------------------------------------------------------
// logits = lnf wte^T (rows x Vp, K = C) and the input gradient dlnf = dlogits wte (rows x C, K = Vp) run on
// the FP8 tensor cores; the weight gradient dwte += dlogits^T lnf stays a BF16 GEMM (in FP8 it would need
// the dlogits' codes transposed as well, a second pass over rows x Vp bytes per chunk).
//   forward  logits = lnf wte^T     E4M3 x E4M3, fast accumulation (K = C, as the linears' forward)
//   dgrad    dlnf   = dlogits wte   E5M2 x E4M3 (wte^T kept as a second copy), FP32 accumulation
// Scales. wte: its own amax, once per optimizer step, when its codes are made (recipe_weights_changed); lnf:
// the chunk's own amax, an extra read of rows x C BF16 values (small beside the rows x Vp logits). Neither
// keeps a history: the head has no state to save or resume. dlogits: a fixed scale, known before they
// exist, from their bound: every dlogit is (softmax - one-hot) dloss with |softmax - one-hot| <= 1, so
// |dlogit| <= |dloss|, and the scale is the largest power of two s with |dloss| s <= E5M2's largest value:
// nothing saturates, 1 / s is exact, and the classifier writes the codes as it writes the dlogits
// (fused_classifier.cuh), with no pass of its own. A dlogit with |dlogit| s below 2^-17 (half E5M2's smallest
// subnormal) flushes to zero: probabilities below 2^-17 / (|dloss| s), at most 2.7e-10 (|dloss| s > 57344 / 2),
// a loss the sum over the vocabulary hardly sees.
__global__ void fp8_set_value_kernel(float* p, float v) { *p = v; }

// d = a^T b (m x n, column-major) for one of the head's GEMMs, or a clear stop where cuBLASLt has none
inline void fp8_head_gemm(void* d, bool d_fp32, Fp8Operand a, Fp8Operand b, int m, int n, int k, float beta, bool fast_accum,
                          const char* what, cudaStream_t st) {
    if (!matmul_fp8(d, d_fp32, a, b, nullptr, m, n, k, beta, fast_accum, st)) {
        fprintf(stderr, "error: cuBLASLt has no FP8 GEMM for the LM head's %s (m=%d n=%d k=%d)\n", what, m, n, k);
        exit(1);
    }
}

// wte's E4M3 codes and their transpose, with a scale from its amax (every process alike: the weights are)
inline void fp8_head_quantize_weights(Recipe& r, const floatX* wte, cudaStream_t st) {
    auto& h = r.head;
    cudaCheck(cudaMemsetAsync(h.amax, 0, sizeof(uint32_t), st));
    tensor_amax(h.amax, wte, (long long)h.Vp * r.C, st);
    fp8_scale_from_amax_kernel<<<1, 1, 0, st>>>(h.scales + HEAD_W_S, h.scales + HEAD_W_INV, h.amax, llmc::FP8_E4M3_MAX, 0);
    cudaCheckLaunch();
    fp8_quantize_transpose<Fp8Kind::E4M3>(h.w, h.wt, wte, h.Vp, r.C, h.scales + HEAD_W_S, h.amax + 2, Fp8Stats(), st);
    h.w_ready = true;
}

inline bool recipe_quantizes_head(const Recipe& r, int rows, int C, int Vp) {
    // (FP8 GEMMs want 16-byte leading dimensions: C and Vp bytes of codes, C and Vp BF16 outputs)
    return r.head.on && rows <= r.head.rows && C == r.C && Vp == r.head.Vp && C % 16 == 0 && Vp % 16 == 0;
}

inline void recipe_head_forward(Recipe& r, floatX* logits, const floatX* lnf, const floatX* wte, int rows, int C, int Vp,
                                bool training, cudaStream_t st) {
    (void)training; // (the head's scales are the tensors' own: evaluation quantizes as training does, and keeps nothing)
    auto& h = r.head;
    r.pending_gelu_out.write(st); // (fp8_write_gelu_out, below)
    if (!h.w_ready) fp8_head_quantize_weights(r, wte, st);
    PHASE("fp8: head quantize");
    const long long n = (long long)rows * C;
    cudaCheck(cudaMemsetAsync(h.amax + 1, 0, sizeof(uint32_t), st));
    tensor_amax(h.amax + 1, lnf, n, st);
    fp8_scale_from_amax_kernel<<<1, 1, 0, st>>>(h.scales + HEAD_X_S, h.scales + HEAD_X_INV, h.amax + 1, llmc::FP8_E4M3_MAX, 0);
    cudaCheckLaunch();
    fp8_quantize<Fp8Kind::E4M3>(h.x, lnf, n, h.scales + HEAD_X_S, h.amax + 2, Fp8Stats(), st);
    PHASE("fp8: head gemm forward");
    fp8_head_gemm(logits, false, {h.w, CUDA_R_8F_E4M3, h.scales + HEAD_W_INV}, {h.x, CUDA_R_8F_E4M3, h.scales + HEAD_X_INV},
                  Vp, rows, C, 0.0f, true, "forward", st);
}

// bound: the largest |dlogit| there can be (train_gpt.cu: |dloss| times the logit scale)
inline HeadGradCodes recipe_head_grad_codes(Recipe& r, int rows, int Vp, float bound, cudaStream_t st) {
    (void)rows; (void)Vp;
    auto& h = r.head;
    h.grad_given = false;
    const float s = llmc::fp8_bound_scale(bound, llmc::FP8_E5M2_MAX);
    if (s == 0.0f) return HeadGradCodes(); // (no such scale: the BF16 input gradient then)
    if (s != h.grad_scale) {
        fp8_set_value_kernel<<<1, 1, 0, st>>>(h.scales + HEAD_GRAD_INV, 1.0f / s);
        cudaCheckLaunch();
        h.grad_scale = s;
    }
    h.grad_given = true;
    HeadGradCodes codes;
    codes.rows = h.grad;
    codes.scale = s;
    return codes;
}

inline void recipe_head_backward(Recipe& r, float* dwte, floatX* dlnf, const floatX* dlogits, const floatX* lnf,
                                 const floatX* wte, int rows, int C, int Vp, cudaStream_t st) {
    auto& h = r.head;
    plain_head_backward_dw(dwte, dlogits, lnf, rows, C, Vp, st);
    if (!h.grad_given) {
        plain_head_backward_dx(dlnf, dlogits, wte, rows, C, Vp, st);
        return;
    }
    h.grad_given = false;
    PHASE("fp8: head gemm dgrad");
    fp8_head_gemm(dlnf, false, {h.wt, CUDA_R_8F_E4M3, h.scales + HEAD_W_INV}, {h.grad, CUDA_R_8F_E5M2, h.scales + HEAD_GRAD_INV},
                  C, rows, Vp, 0.0f, false, "input gradient", st);
}

// ---- the API ------------------------------------------------------------------------------------
inline void recipe_weights_changed(Recipe& r, const LinearWeights& w, cudaStream_t st) {
    r.head.w_ready = false;
    if (r.head.on && w.head) fp8_head_quantize_weights(r, w.head, st);
    const int nl = r.num_linears;
    // the weights' amax and counts describe the weights now in use
    cudaCheck(cudaMemsetAsync(r.amax_now + FP8_W * nl, 0, nl * sizeof(uint32_t), st));
    cudaCheck(cudaMemsetAsync(r.stats + (size_t)FP8_W * nl * 3, 0, (size_t)nl * 3 * sizeof(unsigned long long), st));
    for (int l = 0; l < r.L; l++) {
        if (!layer_is_quantized(r.options, l, r.L)) continue;
        for (int k = 0; k < NUM_LINEAR_KINDS; k++) {
            LinearId id{l, (LinearKind)k};
            const int C = linear_in_features(id.kind, r.C), OC = linear_out_features(id.kind, r.C);
            const floatX* W = w.weight[k] + (size_t)l * OC * C;
            const int t = fp8_tensor(r, id, FP8_W);
            if (r.mode == FP8_SCALING_BLOCK) { // W and W^T with their 128 x 128 block scales, from one read
                Fp8BlockOutput o;
                o.rows = fp8_weight(r, id);
                o.rows_inv = fp8_weight_inv(r, id);
                o.cols = fp8_weight_t(r, id);
                o.cols_inv = fp8_weight_t_inv(r, id);
                fp8_block_quantize<Fp8Kind::E4M3>(W, OC, C, true, r.options.pow2_scales != 0, o, r.amax_now + t, fp8_stats_of(r, t), st);
                continue;
            }
            Fp8ScalePtrs s = fp8_scale_for(r, t, W, (long long)OC * C, true, st);
            fp8_quantize_transpose<Fp8Kind::E4M3>(fp8_weight(r, id), fp8_weight_t(r, id), W, OC, C, s.scale,
                                                  r.amax_now + t, fp8_stats_of(r, t), st);
        }
    }
}

// Data parallel: the step's amax of a tensor is the maximum over every process's micro-steps, what
// one process taking all of them would have recorded, so that every process pushes the same history
// and derives the same scales (the weights' FP8 copies agree too). A tensor's first calibration (no
// history yet) takes process 0's amax (fp8_scale_for), as one process would have calibrated on the
// step's first slice.
inline RecipeMaxState recipe_cross_process_max(Recipe& r) {
    RecipeMaxState s;
    s.bits = r.amax_now;
    s.count = (size_t)r.num_tensors;
    return s;
}

inline void recipe_step_end(Recipe& r, cudaStream_t st) {
    fp8_step_end_kernel<<<ceil_div(r.num_tensors, 128), 128, 0, st>>>(r.history, r.options.amax_history, r.steps_pushed,
                                                                       r.amax_now, r.scale, r.inv_scale, r.num_tensors,
                                                                       r.num_linears, r.options.scale_margin);
    cudaCheckLaunch();
    r.steps_pushed += 1;
    // the activations' and gradients' counts start again (the weights' are reset with the weights)
    const int nl = r.num_linears;
    cudaCheck(cudaMemsetAsync(r.stats + (size_t)FP8_X * nl * 3, 0, (size_t)2 * nl * 3 * sizeof(unsigned long long), st));
    if (r.scale_hist)
        cudaCheck(cudaMemsetAsync(fp8_scale_hist(r, FP8_X * nl), 0, (size_t)2 * nl * FP8_SCALE_HIST_BINS * sizeof(uint32_t), st));
}

// A skipped update (recipe_api.h): the step's activation and gradient amaxes (NaN, where a NaN went
// through the step) and counts are dropped, so that the history never sees them. The weights did not
// change: their FP8 copies, amaxes and counts stay. Before the first step that was taken, the activations'
// and gradients' scales were all calibrated on the skipped step's own tensors (fp8_scale_for): they are
// calibrated afresh on the next step's.
inline void recipe_step_skipped(Recipe& r, cudaStream_t st) {
    const int nl = r.num_linears;
    cudaCheck(cudaMemsetAsync(r.amax_now + FP8_X * nl, 0, (size_t)2 * nl * sizeof(uint32_t), st));
    cudaCheck(cudaMemsetAsync(r.stats + (size_t)FP8_X * nl * 3, 0, (size_t)2 * nl * 3 * sizeof(unsigned long long), st));
    if (r.steps_pushed == 0)
        for (int t = FP8_X * nl; t < NUM_FP8_ROLES * nl; t++) r.calibrated[t] = 0;
}

inline uint8_t* fp8_saved_xt(const Recipe& r, LinearId id) { return r.saved_xt + r.saved_xt_offset[fp8_linear_index(id)]; }

// writes the GELU output an fc layer's forward left pending (Recipe::pending_gelu_out), if any
inline void fp8_write_gelu_out(Recipe& r, cudaStream_t st) { r.pending_gelu_out.write(st); }

// The LayerNorm in front of the qkv and fc layers writes their E4M3 input codes itself (recipe_api.h), once
// the input has a scale (the first use calibrates from the BF16 tensor), except on telemetry steps (the
// quantize pass counts saturated and flushed values; the LayerNorm does not): saves writing the BF16
// LayerNorm output and the quantize pass over it; x^T is then made from the codes (fp8_transpose).
inline Fp8Target fp8_input_target(Recipe& r, LinearId id, int N, int C, bool training) {
    Fp8Target t;
    const int t_x = fp8_tensor(r, id, FP8_X);
    if (!fp8_applies(r, id, N, C, linear_out_features(id.kind, r.C)) || !fp8_scale_known(r, t_x) || r.count_stats) return t;
    t.rows = r.x8;
    t.scale = r.scale + t_x;
    t.amax = training ? r.amax_now + t_x : nullptr; // evaluation records nothing
    r.x_given = id;
    return t;
}

// The flash attention forward writes the attention projection's E4M3 input codes likewise (recipe_api.h), and in
// training x^T's codes as well, into the slot the backward reads: it still writes its BF16 output (the
// backward reads that), so what this saves is the quantize-transpose pass over it (a read of 2 bytes and
// writes of 1 + 1 a value), at the cost of the kernel's own writes of 1 + 1.
inline Fp8Target fp8_attention_output_target(Recipe& r, LinearId id, int N, int C, bool training) {
    Fp8Target t = fp8_input_target(r, id, N, C, training);
    if (t.active() && training && (uintptr_t)fp8_saved_xt(r, id) % 16 == 0) {
        t.cols = fp8_saved_xt(r, id);
        r.x_given_with_t = true;
    }
    return t;
}

// Whether another kernel wrote linear id's codes into the slot (Recipe::x_given, ::dy_given)
inline bool fp8_take_given(LinearId& slot, LinearId id, const char* what) { return take_given_for(slot, id, "fp8", what); }

// x (N x C) -> r.x8 with x's scale, and in training also x^T for the backward pass (one read of x);
// returns the dequantization factor. With gelu_of_input, `inp` is a GELU's input and x = gelu(inp) (x's
// scale must exist already, or be current scaling's, whose amax pass takes the GELU too: delayed scaling's
// first calibration reads x itself).
// xt_elsewhere: when the codes were given, x^T is left to the caller's GEMM (fc_gelu_ws writes it).
inline const float* fp8_quantize_input(Recipe& r, LinearId id, const floatX* inp, int N, int C, bool training, cudaStream_t st,
                                       bool gelu_of_input = false, bool xt_elsewhere = false) {
    const int t = fp8_tensor(r, id, FP8_X);
    if (fp8_take_given(r.x_given, id, "E4M3 input")) { // the LayerNorm (or the fused fc GEMM) wrote the codes into r.x8
        if (training && !r.x_given_with_t && !xt_elsewhere) fp8_transpose(fp8_saved_xt(r, id), r.x8, N, C, st);
        r.x_given_with_t = false;
        return fp8_inv(r, t);
    }
    const bool amax_given = fp8_take_given(r.x_amax_given, id, "input amax");
    Fp8ScalePtrs s = fp8_scale_for(r, t, inp, (long long)N * C, training, st, amax_given ? r.given_amax : nullptr, gelu_of_input);
    if (training) {
        fp8_quantize_transpose<Fp8Kind::E4M3>(r.x8, fp8_saved_xt(r, id), inp, N, C, s.scale, r.amax_now + t,
                                              r.count_stats ? fp8_stats_of(r, t) : Fp8Stats(), st, nullptr, nullptr,
                                              nullptr, gelu_of_input);
    } else if (gelu_of_input) {
        fp8_quantize_transpose<Fp8Kind::E4M3>(r.x8, nullptr, inp, N, C, s.scale, nullptr, Fp8Stats(), st, nullptr, nullptr,
                                              nullptr, true);
    } else {
        fp8_quantize<Fp8Kind::E4M3>(r.x8, inp, (long long)N * C, s.scale, nullptr, Fp8Stats(), st);
    }
    return s.inv;
}

// Whether linear_backward reads its BF16 input `inp`: not for the layers in FP8, whose x^T was saved
// by the forward pass, so the model can skip recomputing it (-r 1: the GELU output, -r 2: ln1/ln2).
inline bool recipe_needs_input_in_backward(const Recipe& r, LinearId id, int N) {
    return !fp8_applies(r, id, N, linear_in_features(id.kind, r.C), linear_out_features(id.kind, r.C));
}

// The forward GEMM under block scaling: x with its 1 x 128 blocks along C (and, in training, x^T with its blocks
// along the tokens, for the backward's wgrad) from one read of x, then the GEMM against W's 128 x 128 blocks.
// gelu_of_input: inp is the fc layer's pre-activation and x = gelu(inp), its GELU output left unwritten
// (Recipe::pending_gelu_out): the block scales need no amax before the pass, so this holds on every step.
inline void fp8_block_forward(Recipe& r, LinearId id, floatX* out, const floatX* inp, const floatX* bias, int N, int C, int OC,
                              bool training, cudaStream_t st, bool gelu_of_input = false) {
    const int t_x = fp8_tensor(r, id, FP8_X);
    PHASE("fp8: block-quantize x");
    Fp8BlockOutput o;
    o.rows = r.x8;
    o.rows_inv = r.x_inv;
    if (training) {
        o.cols = fp8_saved_xt(r, id);
        o.cols_inv = fp8_saved_xt_inv(r, id);
    }
    const bool counted = training && r.count_stats;
    Fp8BlockInput fn;
    fn.gelu_of_input = gelu_of_input;
    fp8_block_quantize<Fp8Kind::E4M3>(inp, N, C, false, r.options.pow2_scales != 0, o, training ? r.amax_now + t_x : nullptr,
                                      counted ? fp8_stats_of(r, t_x) : Fp8Stats(), st, fn);
    if (counted) fp8_scale_log2_histogram(r.x_inv, (long long)llmc::fp8_vec128_scale_count(N, C), fp8_scale_hist(r, t_x), st);
    PHASE("fp8: gemm forward");
    if (!matmul_fp8_block_scaled(out, fp8_weight(r, id), CUDA_R_8F_E4M3, fp8_weight_inv(r, id), r.x8, CUDA_R_8F_E4M3, r.x_inv,
                                 bias, OC, N, C, st, EPI_NONE, nullptr, MATMUL_BLOCKS_A128x128_B1x128))
        fp8_no_block_gemm("forward pass", OC, N, C);
}

inline void recipe_linear_forward(Recipe& r, LinearId id, floatX* out, const floatX* inp, const floatX* weight,
                                  const floatX* bias, int N, int C, int OC, bool training, cudaStream_t st) {
    (void)weight;
    // the fc projection reads its input, the GELU output that the fc layer left unwritten, from the
    // pre-activation: once its scale exists (delayed scaling: a first calibration reads the GELU output
    // itself), under current scaling, whose amax pass before the quantize pass reads the pre-activation too
    // (fp8_scale_for's gelu_of_input): 2 + 2 bytes a value fewer than writing the GELU output first, and under
    // block scaling, whose scales need nothing ahead of the pass
    const bool gelu_of_input = r.pending_gelu_out.is_for(id, inp) &&
                               (r.mode != FP8_SCALING_DELAYED || fp8_scale_known(r, fp8_tensor(r, id, FP8_X)));
    const floatX* x_source = inp;
    if (gelu_of_input) {
        if (r.pending_gelu_out.pre_is_derivative && !same_linear(r.x_given, id)) {
            fprintf(stderr, "error: fp8: layer %d's fc projection has no input codes, and its fc layer kept the GELU "
                            "derivative, not the pre-activation\n", id.layer);
            exit(1);
        }
        x_source = r.pending_gelu_out.take();
    } else {
        fp8_write_gelu_out(r, st);
    }
    if (r.mode == FP8_SCALING_BLOCK) {
        fp8_block_forward(r, id, out, x_source, bias, N, C, OC, training, st, gelu_of_input);
        return;
    }
    PHASE("fp8: quantize x");
    const float* x_inv = fp8_quantize_input(r, id, x_source, N, C, training, st, gelu_of_input);
    Fp8Operand a{fp8_weight(r, id), CUDA_R_8F_E4M3, fp8_inv(r, fp8_tensor(r, id, FP8_W))};
    Fp8Operand b{r.x8, CUDA_R_8F_E4M3, x_inv};
    PHASE("fp8: gemm forward");
    if (!matmul_fp8(out, false, a, b, bias, OC, N, C, 0.0f, true, st)) {
        fprintf(stderr, "error: cuBLASLt has no FP8 GEMM for the forward pass (m=%d n=%d k=%d)\n", OC, N, C);
        exit(1);
    }
}

inline void recipe_linear_forward_gelu(Recipe& r, LinearId id, floatX* gelu_out, floatX* pre_gelu, const floatX* inp,
                                       const floatX* weight, const floatX* bias, int N, int C, int OC, bool training,
                                       cudaStream_t st) {
    (void)weight;
    fp8_write_gelu_out(r, st);
    r.fc_keeps_gelu_factor[id.layer] = 0;
    if (r.mode == FP8_SCALING_BLOCK) { // (the GELU left to the fc projection's block quantization)
        fp8_block_forward(r, id, pre_gelu, inp, bias, N, C, OC, training, st);
        r.pending_gelu_out.leave(gelu_out, pre_gelu, (long long)N * OC, id.layer);
        return;
    }
    Fp8Operand a{fp8_weight(r, id), CUDA_R_8F_E4M3, fp8_inv(r, fp8_tensor(r, id, FP8_W))};
    const LinearId fcp{id.layer, LIN_FCPROJ};
    const int t_xp = fp8_tensor(r, fcp, FP8_X);
    const bool fused = training && r.fused_gemm && !r.count_stats && fp8_applies(r, fcp, N, OC, C) && fp8_scale_known(r, t_xp) &&
                       fp8_gemm::supported(N, OC, C, {pre_gelu, r.x8, r.dy8, a.data, fp8_saved_xt(r, fcp), bias});
    // x's codes from the LayerNorm (no quantize pass, which would write x^T too): the fused GEMM, which loads
    // every tile of x anyway, writes x^T, instead of a transpose pass over x
    const bool xt_in_gemm = fused && same_linear(r.x_given, id) && !r.x_given_with_t &&
                            fp8_gemm::writes_x_t_supported(OC, C) && (uintptr_t)fp8_saved_xt(r, id) % 16 == 0;
    PHASE("fp8: quantize x");
    const float* x_inv = fp8_quantize_input(r, id, inp, N, C, training, st, false, xt_in_gemm);
    Fp8Operand b{r.x8, CUDA_R_8F_E4M3, x_inv};
    PHASE("fp8: gemm forward");
    if (fused) {
        // the fc projection's codes go to r.dy8 (free during the forward pass; the GEMM reads r.x8), then
        // the two buffers trade places, so that the fc projection finds its input in r.x8 as usual
        // pre_gelu gets the backward's GELU factor, bf16(gelu'(pre)), in place of the pre-activation (fc_keeps_gelu_factor)
        fp8_gemm::fc_gelu_ws(pre_gelu, fp8_gemm::FcPreOut::GELU_DERIVATIVE, r.dy8, fp8_saved_xt(r, fcp), r.x8, x_inv,
                             fp8_weight(r, id), a.scale, bias, r.scale + t_xp, r.amax_now + t_xp, N, OC, C, st,
                             xt_in_gemm ? fp8_saved_xt(r, id) : nullptr);
        std::swap(r.x8, r.dy8);
        r.fc_keeps_gelu_factor[id.layer] = 1;
        r.pending_gelu_out.leave(gelu_out, pre_gelu, (long long)N * OC, id.layer, true);
        r.x_given = fcp;
        r.x_given_with_t = true;
        return;
    }
    // the GEMM with its bias writes the pre-activation; the GELU is left to the fc projection's
    // quantize pass (Recipe::pending_gelu_out). (cuBLASLt's GELU_AUX_BIAS epilogue would write both
    // the pre-activation and the BF16 GELU output, which only that pass would read.)
    if (!matmul_fp8(pre_gelu, false, a, b, bias, OC, N, C, 0.0f, true, st)) {
        fprintf(stderr, "error: cuBLASLt has no FP8 GEMM for the forward pass (m=%d n=%d k=%d)\n", OC, N, C);
        exit(1);
    }
    r.pending_gelu_out.leave(gelu_out, pre_gelu, (long long)N * OC, id.layer);
}

// The flash attention backward writes the qkv layer's output gradient as E5M2 codes in both layouts
// (recipe_api.h), from the BF16 tiles it stages, once that gradient has a scale (the first use calibrates
// from the BF16 tensor): saves the dy pass over dqkv and dqkv's own store.
// The LayerNorm backward writes the attention and fc projections' output gradient as row-major E5M2
// codes (rows_only), which linear_backward then transposes for dy^T: 1 byte written by the LayerNorm
// and 1 + 1 by the transpose per value, against 2 (its BF16 output) + 2 + 2 for the quantize pass.
// It does not count saturated and flushed values, so telemetry steps keep the quantize pass.
inline Fp8Target fp8_gradient_target(Recipe& r, LinearId id, int N, int OC, bool rows_only) {
    Fp8Target t;
    const int t_dy = fp8_tensor(r, id, FP8_DY);
    if (!fp8_applies(r, id, N, linear_in_features(id.kind, r.C), OC) || !fp8_scale_known(r, t_dy)) return t;
    if (rows_only && r.count_stats) return t;
    t.rows = r.dy8;
    t.cols = rows_only ? nullptr : r.dyt8;
    t.scale = r.scale + t_dy;
    t.amax = r.amax_now + t_dy;
    if (r.count_stats) t.stats = fp8_stats_of(r, t_dy);
    r.dy_given = id;
    r.dy_given_rows_only = rows_only;
    return t;
}

// The sites of recipe_api.h: the LayerNorm and attention outputs as the next linear's E4M3 input, the
// LayerNorm backward's output and the attention backward's dqkv as E5M2 output gradients (above)
// Current scaling: the LayerNorm forward and backward and the attention forward and backward write their BF16
// output as usual and record its amax (an amax-only target), so that the linear next in line scales it without
// an amax pass of its own (its quantize pass still reads the BF16 tensor: the scale must exist before the
// codes). The same amax, bit for bit, as the pass over the stored BF16 values would find.
inline Fp8Target fp8_current_amax_target(Recipe& r, RecipeSite site, LinearId id, int rows, int cols, cudaStream_t st) {
    Fp8Target t;
    const bool input = site == SITE_LAYERNORM_OUTPUT || site == SITE_ATTENTION_OUTPUT;
    if (!input && site != SITE_LAYERNORM_BACKWARD_OUTPUT && site != SITE_ATTENTION_BACKWARD_DQKV) return t;
    const int K = input ? cols : linear_in_features(id.kind, r.C), OC = input ? linear_out_features(id.kind, r.C) : cols;
    if (!fp8_applies(r, id, rows, K, OC)) return t;
    t.amax = r.given_amax + (input ? 0 : 1);
    cudaCheck(cudaMemsetAsync(t.amax, 0, sizeof(uint32_t), st));
    (input ? r.x_amax_given : r.dy_amax_given) = id;
    return t;
}

inline Fp8Target recipe_site_output(Recipe& r, RecipeSite site, LinearId id, int rows, int cols, bool training, cudaStream_t st) {
    if (r.mode == FP8_SCALING_CURRENT) return fp8_current_amax_target(r, site, id, rows, cols, st);
    if (r.mode == FP8_SCALING_BLOCK) return Fp8Target();
    switch (site) {
    case SITE_LAYERNORM_OUTPUT: return fp8_input_target(r, id, rows, cols, training);
    case SITE_ATTENTION_OUTPUT: return fp8_attention_output_target(r, id, rows, cols, training);
    case SITE_LAYERNORM_BACKWARD_OUTPUT: return fp8_gradient_target(r, id, rows, cols, true);
    case SITE_ATTENTION_BACKWARD_DQKV: return fp8_gradient_target(r, id, rows, cols, false);
    }
    return Fp8Target();
}

// What every backward call does first, quantized or not: writes a pending GELU output, takes the output
// gradient's codes if a kernel gave them, and applies a GELU derivative left for this call's dy pass
// (kept, in gelu_pre and gelu_factor, where this call is the fc layer's quantized backward that takes dout
// = that gradient; applied as a separate pass otherwise)
struct Fp8BackwardStart {
    bool dy_given = false;
    bool dy_amax_given = false; // (current scaling: the amax of dout, in r.given_amax[1])
    bool bias_partials = false;
    const floatX* gelu_pre = nullptr;
    GeluFactor gelu_factor = GeluFactor::ROUNDED;
};
inline Fp8BackwardStart fp8_backward_start(Recipe& r, LinearId id, float* dbias, const floatX* dout, bool quantized,
                                           cudaStream_t st) {
    Fp8BackwardStart b;
    fp8_write_gelu_out(r, st);
    b.dy_given = fp8_take_given(r.dy_given, id, "E5M2 output gradient");
    b.dy_amax_given = fp8_take_given(r.dy_amax_given, id, "output gradient amax");
    b.bias_partials = b.dy_given && r.dy_given_bias_partials;
    r.dy_given_bias_partials = false;
    if (b.dy_given && ((dbias && !b.bias_partials) || r.pending_gelu.grad)) {
        fprintf(stderr, "error: fp8: a linear whose output gradient arrives quantized gets no bias gradient or GELU here\n");
        exit(1);
    }
    // what the fc layer's forward kept in the pre-activation's buffer: the GELU factor itself, or the pre-activation
    auto kept_factor = [&](int layer) { return r.fc_keeps_gelu_factor[layer] ? GeluFactor::GIVEN : GeluFactor::ROUNDED; };
    if (r.pending_gelu.grad) {
        if (r.pending_gelu.grad == dout && r.pending_gelu.layer == id.layer && id.kind == LIN_FC && quantized) {
            b.gelu_pre = r.pending_gelu.pre;
            b.gelu_factor = kept_factor(r.pending_gelu.layer);
        } else {
            gelu_backward(r.pending_gelu.grad, r.pending_gelu.pre, r.pending_gelu.n, st, kept_factor(r.pending_gelu.layer));
        }
        r.pending_gelu.grad = nullptr;
    }
    return b;
}

// The linears the recipe keeps in BF16 (and the shapes FP8 GEMMs cannot take) run the plain linear; what
// this recipe left pending is settled first, as its own calls do
inline bool recipe_quantizes(const Recipe& r, LinearId id, int N, int C, int OC, LinearPass) { return fp8_applies(r, id, N, C, OC); }
inline void recipe_before_plain_linear(Recipe& r, LinearId id, LinearPass pass, cudaStream_t st) {
    if (pass == PASS_BACKWARD) {
        fp8_backward_start(r, id, nullptr, nullptr, false, st);
        return;
    }
    fp8_write_gelu_out(r, st);
    if (pass == PASS_FORWARD_GELU) r.fc_keeps_gelu_factor[id.layer] = 0;
}

// dst[i] += src[i] (the block-scaled wgrad's fallback through BF16)
__global__ void fp8_add_bf16_to_fp32_kernel(float* dst, const floatX* src, long long n) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        dst[i] += (float)src[i];
}
inline void fp8_add_bf16_to_fp32(float* dst, const floatX* src, long long n, cudaStream_t st) {
    fp8_add_bf16_to_fp32_kernel<<<fp8_grid_size(n, 256), 256, 0, st>>>(dst, src, n);
    cudaCheckLaunch();
}

// The backward GEMMs under block scaling: dy (1 x 128 along OC) and dy^T (1 x 128 along the tokens), and the
// bias gradient (the column sums of the values quantized), from one read of dout; the wgrad (x^T saved by the
// forward against dy^T, FP32 accumulated into dweight) and the dgrad (W^T's 128 x 128 blocks against dy).
// gelu_pre: dout is the fc projection's input gradient, still to be multiplied by the GELU derivative of
// gelu_pre (Recipe::pending_gelu), which the quantization applies as it reads. The fc projection leaves that
// derivative to the fc layer's quantization the same way when that layer is in FP8, else applies it itself.
inline void fp8_block_backward(Recipe& r, LinearId id, floatX* dinp, float* dweight, float* dbias, const floatX* dout,
                               const floatX* pre_gelu, int N, int C, int OC, cudaStream_t st, const floatX* gelu_pre,
                               GeluFactor gelu_factor) {
    const int t_dy = fp8_tensor(r, id, FP8_DY);
    const bool e5m2 = fp8_block_grads_e5m2(r.options), pow2 = r.options.pow2_scales != 0;
    const cudaDataType_t grad_type = e5m2 ? CUDA_R_8F_E5M2 : CUDA_R_8F_E4M3;
    PHASE("fp8: block-quantize dy + bias grad");
    Fp8BlockInput fn;
    fn.gelu_pre = gelu_pre;
    fn.gelu_factor = gelu_factor;
    fn.col_partials = dbias ? r.col_partials : nullptr; // (ceil(N / 128) x OC floats: within its ceil(N / 64) x 4C)
    Fp8BlockOutput o;
    o.rows = r.dy8;
    o.rows_inv = r.dy_inv;
    o.cols = r.dyt8;
    o.cols_inv = r.dyt_inv;
    const Fp8Stats stats = r.count_stats ? fp8_stats_of(r, t_dy) : Fp8Stats();
    if (e5m2) fp8_block_quantize<Fp8Kind::E5M2>(dout, N, OC, false, pow2, o, r.amax_now + t_dy, stats, st, fn, dbias);
    else fp8_block_quantize<Fp8Kind::E4M3>(dout, N, OC, false, pow2, o, r.amax_now + t_dy, stats, st, fn, dbias);
    if (r.count_stats) fp8_scale_log2_histogram(r.dy_inv, (long long)llmc::fp8_vec128_scale_count(N, OC), fp8_scale_hist(r, t_dy), st);
    PHASE("fp8: gemm wgrad");
    if (!matmul_fp8_block_scaled(dweight, fp8_saved_xt(r, id), CUDA_R_8F_E4M3, fp8_saved_xt_inv(r, id), r.dyt8, grad_type,
                                 r.dyt_inv, nullptr, C, OC, N, st, EPI_NONE, nullptr, MATMUL_BLOCKS_A1x128_B1x128, true, 1.0f)) {
        // no FP32 output for this GEMM: its product in BF16, then added to the FP32 gradient (one BF16 rounding
        // of each micro-step's dW, relative 2^-9, far below the FP8 operands' error)
        if (!r.wgrad_bf16) {
            r.wgrad_bf16 = (floatX*)cuda_malloc_or_die((size_t)4 * r.C * r.C * sizeof(floatX), "fp8 weight gradient scratch");
            fprintf(stderr, "note: fp8: cuBLASLt has no block-scaled FP8 GEMM with an FP32 output here; the weight "
                            "gradients go through BF16 before their FP32 accumulation\n");
        }
        if (!matmul_fp8_block_scaled(r.wgrad_bf16, fp8_saved_xt(r, id), CUDA_R_8F_E4M3, fp8_saved_xt_inv(r, id), r.dyt8,
                                     grad_type, r.dyt_inv, nullptr, C, OC, N, st, EPI_NONE, nullptr, MATMUL_BLOCKS_A1x128_B1x128))
            fp8_no_block_gemm("weight gradient", C, OC, N);
        fp8_add_bf16_to_fp32(dweight, r.wgrad_bf16, (long long)C * OC, st);
    }
    PHASE("fp8: gemm dgrad");
    if (!matmul_fp8_block_scaled(dinp, fp8_weight_t(r, id), CUDA_R_8F_E4M3, fp8_weight_t_inv(r, id), r.dy8, grad_type, r.dy_inv,
                                 nullptr, C, N, OC, st, EPI_NONE, nullptr, MATMUL_BLOCKS_A128x128_B1x128))
        fp8_no_block_gemm("input gradient", C, N, OC);
    if (!pre_gelu) return;
    const LinearId fc{id.layer, LIN_FC};
    if (id.kind == LIN_FCPROJ && fp8_applies(r, fc, N, OC, C)) { // (the fc layer's backward, next, applies it)
        r.pending_gelu.leave(dinp, pre_gelu, (long long)N * C, id.layer);
        return;
    }
    PHASE("fp8: gelu backward");
    gelu_backward(dinp, pre_gelu, (long long)N * C, st,
                  r.fc_keeps_gelu_factor[id.layer] ? GeluFactor::GIVEN : GeluFactor::ROUNDED);
}

// Current scaling: the fc layer's output gradient is what gelu_backward makes of the fc projection's input
// gradient, and the fc layer's backward, next, quantizes it; gelu_backward records the amax of the BF16 values
// it stores (its amax_out) into given_amax[1], which that backward takes in place of an amax pass over them
// (Recipe::dy_amax_given): one read of 2 bytes a value fewer, the same amax bit for bit. fc (N tokens, K
// inputs, OC outputs): the fc layer; null where that layer is not quantized or the scaling not current.
inline uint32_t* fp8_gelu_grad_amax_target(Recipe& r, LinearId fc, int N, int K, int OC, cudaStream_t st) {
    if (r.mode != FP8_SCALING_CURRENT || !fp8_applies(r, fc, N, K, OC)) return nullptr;
    uint32_t* amax = r.given_amax + 1;
    cudaCheck(cudaMemsetAsync(amax, 0, sizeof(uint32_t), st));
    r.dy_amax_given = fc;
    return amax;
}

inline void recipe_linear_backward(Recipe& r, LinearId id, floatX* dinp, float* dweight, float* dbias, const floatX* dout,
                                   const floatX* inp, const floatX* weight, const floatX* pre_gelu, int N, int C, int OC,
                                   cudaStream_t st) {
    (void)weight;
    const Fp8BackwardStart start = fp8_backward_start(r, id, dbias, dout, true, st);
    if (r.mode == FP8_SCALING_BLOCK) {
        fp8_block_backward(r, id, dinp, dweight, dbias, dout, pre_gelu, N, C, OC, st, start.gelu_pre, start.gelu_factor);
        return;
    }
    const bool dy_given = start.dy_given;
    const bool bias_partials = start.bias_partials;
    // a GELU derivative left for this layer's dy pass (see Recipe::pending_gelu)
    const floatX* gelu_pre = start.gelu_pre;
    const GeluFactor gelu_factor = start.gelu_factor;
    // (used only with pre_gelu: the fc projection's)
    const GeluFactor pre_factor = r.fc_keeps_gelu_factor[id.layer] ? GeluFactor::GIVEN : GeluFactor::ROUNDED;
    const int t_dy = fp8_tensor(r, id, FP8_DY), t_x = fp8_tensor(r, id, FP8_X), t_w = fp8_tensor(r, id, FP8_W);
    Fp8Operand wt{fp8_weight_t(r, id), CUDA_R_8F_E4M3, fp8_inv(r, t_w)};
    // The fc projection's dgrad with the fc layer's dy pass in its epilogue (fp8_gemm::fc_dy_ws; below), when it
    // applies. When this layer's dy came as rows only (the LayerNorm backward), that kernel's producer warp also
    // writes dy^T from the dy tiles it loads, in place of the fp8_transpose pass, into the part of r.dy8's buffer
    // that dy (N x OC of its N x 4C bytes) leaves free, where that pays (fc_dy_writes_dy_t_pays: C <= 1024); the
    // wgrad then runs after the dgrad.
    const LinearId fc{id.layer, LIN_FC};
    const int t_dyf = fp8_tensor(r, fc, FP8_DY);
    const bool fused_dy = pre_gelu && id.kind == LIN_FCPROJ && r.fused_gemm && !r.count_stats && fp8_applies(r, fc, N, OC, C) &&
                          fp8_scale_known(r, t_dyf) && fp8_gemm::supported(N, C, OC, {r.x8, r.dyt8, r.dy8, wt.data, pre_gelu});
    const bool dyt_in_dgrad = fused_dy && dy_given && r.dy_given_rows_only && fp8_gemm::fc_dy_writes_dy_t_pays(C, OC);
    // dy and dy^T in E5M2, and the bias gradient (column sums of the BF16 dy), from one read of dy
    // (unless the kernel that wrote dy gave them: recipe_site_output)
    PHASE("fp8: quantize dy + bias grad");
    Fp8ScalePtrs sdy{r.scale + t_dy, fp8_inv(r, t_dy)};
    if (!dy_given) {
        sdy = fp8_scale_for(r, t_dy, dout, (long long)N * OC, true, st, start.dy_amax_given ? r.given_amax + 1 : nullptr);
        fp8_quantize_transpose<Fp8Kind::E5M2>(r.dy8, r.dyt8, dout, N, OC, sdy.scale, r.amax_now + t_dy,
                                              r.count_stats ? fp8_stats_of(r, t_dy) : Fp8Stats(), st, dbias,
                                              dbias ? r.col_partials : nullptr, gelu_pre, false, nullptr, gelu_factor);
    } else if (r.dy_given_rows_only) {
        if (!dyt_in_dgrad) fp8_transpose(r.dyt8, r.dy8, N, OC, st);
    } else if (bias_partials && dbias) {
        bias_backward_reduce(dbias, r.col_partials, OC, N / gemm_wgmma::BM, st); // the fused fc projection dgrad left them
    }
    // wgrad: x^T as the training forward pass saved it (same scale, same codes), against dy^T
    (void)inp;
    auto wgrad = [&](uint8_t* dyt_codes) {
        Fp8Operand xt{fp8_saved_xt(r, id), CUDA_R_8F_E4M3, fp8_inv(r, t_x)}, dyt{dyt_codes, CUDA_R_8F_E5M2, sdy.inv};
        PHASE("fp8: gemm wgrad");
        if (!matmul_fp8(dweight, true, xt, dyt, nullptr, C, OC, N, 1.0f, false, st)) {
            fprintf(stderr, "error: cuBLASLt has no FP8 GEMM for the weight gradient (m=%d n=%d k=%d)\n", C, OC, N);
            exit(1);
        }
    };
    if (!dyt_in_dgrad) wgrad(r.dyt8);
    PHASE("fp8: gemm dgrad");
    // dgrad: W^T (C x OC) against dy (N x OC), with the GELU derivative in the epilogue when asked
    Fp8Operand dy{r.dy8, CUDA_R_8F_E5M2, sdy.inv};
    if (fused_dy) {
        // the fc layer's output gradient straight from this dgrad (fp8_gemm::fc_dy_ws): its E5M2 rows go to
        // r.x8 (free in the backward pass; the kernel reads r.dy8), then the two buffers trade places; its
        // dy^T to r.dyt8 (this layer's, read by the wgrad above unless written here); the bias sums to
        // col_partials. dinp, the BF16 d(gelu output), is not written: the fc layer's backward, next, takes
        // the codes.
        uint8_t* dyt_here = dyt_in_dgrad ? r.dy8 + (size_t)N * OC : nullptr; // (16-byte aligned: N % 128 == 0)
        fp8_gemm::fc_dy_ws(r.x8, r.dyt8, r.col_partials, r.dy8, sdy.inv, fp8_weight_t(r, id), wt.scale, pre_gelu, pre_factor,
                           r.scale + t_dyf, r.amax_now + t_dyf, N, C, OC, st, nullptr, dyt_here);
        std::swap(r.x8, r.dy8);
        r.dy_given = fc;
        r.dy_given_rows_only = false;
        r.dy_given_bias_partials = true;
        if (dyt_in_dgrad) wgrad(dyt_here); // (dyt_here now lies in r.x8's buffer, which nothing else uses before it)
        return;
    }
    // The GELU derivative is a separate pass, not cuBLASLt's DGELU epilogue: with FP8 operands that
    // epilogue makes the fc projection's dgrad several times slower than the other three dgrads
    // together (doc/results.md).
    if (!matmul_fp8(dinp, false, wt, dy, nullptr, C, N, OC, 0.0f, false, st)) {
        fprintf(stderr, "error: cuBLASLt has no FP8 GEMM for the input gradient (m=%d n=%d k=%d)\n", C, N, OC);
        exit(1);
    }
    if (!pre_gelu) return;
    // the fc layer of this block quantizes dinp next: leave the derivative to its dy pass, once its dy
    // scale exists (the calibrating first pass reads dy's amax from the finished tensor)
    if (id.kind == LIN_FCPROJ && fp8_applies(r, fc, N, OC, C) && fp8_scale_known(r, t_dyf)) {
        r.pending_gelu.leave(dinp, pre_gelu, (long long)N * C, id.layer);
        return;
    }
    PHASE("fp8: gelu backward");
    gelu_backward(dinp, pre_gelu, (long long)N * C, st, pre_factor, fp8_gelu_grad_amax_target(r, fc, N, OC, C, st));
}

// ---- checkpoint state -----------------------------------------------------------------------------
inline void recipe_save(const Recipe& r, StateWriter& w) {
    const size_t nt = r.num_tensors, H = r.options.amax_history;
    std::vector<float> scale(nt), inv(nt), hist(nt * H);
    std::vector<uint32_t> amax(nt);
    cudaCheck(cudaMemcpy(scale.data(), r.scale, nt * sizeof(float), cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy2D(inv.data(), sizeof(float), r.inv_scale, FP8_INV_STRIDE * sizeof(float), sizeof(float), nt,
                           cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(amax.data(), r.amax_now, nt * sizeof(uint32_t), cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(hist.data(), r.history, nt * H * sizeof(float), cudaMemcpyDeviceToHost));
    int32_t opts[4] = {r.options.amax_history, r.options.scale_margin, r.options.skip_first, r.options.skip_last};
    int64_t steps = r.steps_pushed;
    w.add_copy("fp8_options", opts, sizeof(opts));
    if (fp8_records_scaling(r.options)) { // (delayed scaling's checkpoints have no such section: options.h)
        int32_t scaling[3];
        fp8_scaling_record(r.options, scaling);
        w.add_copy("fp8_scaling", scaling, sizeof(scaling));
    }
    w.add_copy("fp8_steps", &steps, sizeof(steps));
    w.add_copy("fp8_scale", scale.data(), nt * sizeof(float));
    w.add_copy("fp8_inv_scale", inv.data(), nt * sizeof(float));
    w.add_copy("fp8_amax_now", amax.data(), nt * sizeof(uint32_t));
    w.add_copy("fp8_amax_history", hist.data(), nt * H * sizeof(float));
    w.add_copy("fp8_calibrated", r.calibrated.data(), nt);
}

// Throws InputError when the checkpoint's FP8 settings differ from this run's.
inline void recipe_load(Recipe& r, StateReader& rd) {
    const size_t nt = r.num_tensors, H = r.options.amax_history;
    // (its settings were checked before the GPU too: options.h; the same check, for any other caller)
    if (!rd.has("fp8_options")) input_error("the checkpoint has no FP8 settings (section fp8_options)");
    check_recipe_checkpoint(r.options, r.L, rd);
    int64_t steps = 0;
    rd.read("fp8_steps", &steps, sizeof(steps));
    r.steps_pushed = steps;
    std::vector<float> scale(nt), inv(nt), hist(nt * H);
    std::vector<uint32_t> amax(nt);
    rd.read("fp8_scale", scale.data(), nt * sizeof(float));
    rd.read("fp8_inv_scale", inv.data(), nt * sizeof(float));
    rd.read("fp8_amax_now", amax.data(), nt * sizeof(uint32_t));
    rd.read("fp8_amax_history", hist.data(), nt * H * sizeof(float));
    rd.read("fp8_calibrated", r.calibrated.data(), nt);
    cudaCheck(cudaMemcpy(r.scale, scale.data(), nt * sizeof(float), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy2D(r.inv_scale, FP8_INV_STRIDE * sizeof(float), inv.data(), sizeof(float), sizeof(float), nt,
                           cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(r.amax_now, amax.data(), nt * sizeof(uint32_t), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(r.history, hist.data(), nt * H * sizeof(float), cudaMemcpyHostToDevice));
}

// ---- telemetry ----------------------------------------------------------------------------------
inline bool recipe_begin_step(Recipe& r, int step) {
    r.count_stats = r.options.telemetry_every > 0 && step % r.options.telemetry_every == 0;
    return r.count_stats;
}

// The spread of a tensor's block scales from its histogram of floor(log2 s) (fp8_scale_log2_histogram): the
// smallest, the median (the lower one of an even count) and the largest bin, as " log2s:MIN/MEDIAN/MAX"
// ("" for a tensor with no blocks counted)
inline std::string fp8_log2_scale_spread(const uint32_t* hist) {
    unsigned long long total = 0;
    int lo = -1, hi = -1;
    for (int b = 0; b < FP8_SCALE_HIST_BINS; b++) {
        if (!hist[b]) continue;
        total += hist[b];
        if (lo < 0) lo = b;
        hi = b;
    }
    if (total == 0) return "";
    unsigned long long seen = 0;
    int median = lo;
    for (int b = lo; b <= hi; b++) {
        seen += hist[b];
        if (2 * seen >= total) { median = b; break; }
    }
    return strfmt(" log2s:%d/%d/%d", lo - 128, median - 128, hi - 128);
}

// One line per quantized tensor, for the optimizer step that just ran its backward pass:
//   s:STEP lq:l3.fc.dy amax:... scale:... sat:... ftz:...
// scale: the tensor's scale (delayed and current scaling: the one it was last quantized with). Under block
// scaling there is no one scale; the line ends with the spread of its block scales instead,
//   s:STEP lq:l3.fc.dy amax:... sat:... ftz:... log2s:MIN/MEDIAN/MAX
// (floor(log2 s) over the blocks: the weights' 128 x 128 blocks now in use; the activations' and gradients'
// 1 x 128 blocks along K over the step's micro-steps), and sat / ftz count the codes of both layouts.
inline void recipe_log_telemetry(Recipe& r, FILE* log, int step) {
    const size_t nt = r.num_tensors;
    std::vector<float> scale(nt);
    std::vector<uint32_t> amax(nt);
    std::vector<unsigned long long> stats(nt * 3);
    std::vector<uint32_t> hist;
    if (r.mode == FP8_SCALING_BLOCK) {
        // the weights' block scales, as they are now (the activations' and gradients' were counted as they were made)
        const int nl = r.num_linears;
        cudaCheck(cudaMemset(fp8_scale_hist(r, FP8_W * nl), 0, (size_t)nl * FP8_SCALE_HIST_BINS * sizeof(uint32_t)));
        for (int l = 0; l < r.L; l++) {
            if (!layer_is_quantized(r.options, l, r.L)) continue;
            for (int k = 0; k < NUM_LINEAR_KINDS; k++) {
                const LinearId id{l, (LinearKind)k};
                const int C = linear_in_features(id.kind, r.C), OC = linear_out_features(id.kind, r.C);
                fp8_scale_log2_histogram(fp8_weight_inv(r, id), (long long)llmc::fp8_blk128_scale_count(OC, C),
                                         fp8_scale_hist(r, fp8_tensor(r, id, FP8_W)), 0);
            }
        }
        hist.resize(nt * FP8_SCALE_HIST_BINS);
    }
    cudaCheck(cudaDeviceSynchronize());
    if (!hist.empty())
        cudaCheck(cudaMemcpy(hist.data(), r.scale_hist, hist.size() * sizeof(uint32_t), cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(scale.data(), r.scale, nt * sizeof(float), cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(amax.data(), r.amax_now, nt * sizeof(uint32_t), cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(stats.data(), r.stats, nt * 3 * sizeof(unsigned long long), cudaMemcpyDeviceToHost));
    for (int role = 0; role < NUM_FP8_ROLES; role++) {
        for (int l = 0; l < r.L; l++) {
            if (!layer_is_quantized(r.options, l, r.L)) continue;
            for (int k = 0; k < NUM_LINEAR_KINDS; k++) {
                const int t = fp8_tensor(r, LinearId{l, (LinearKind)k}, (Fp8Role)role);
                const unsigned long long* c = &stats[(size_t)t * 3];
                const double n = c[0] ? (double)c[0] : 1.0;
                float a;
                memcpy(&a, &amax[t], 4);
                if (r.mode == FP8_SCALING_BLOCK) {
                    fprintf(log, "s:%d lq:l%d.%s.%s amax:%.6e sat:%.6e ftz:%.6e%s\n", step, l, LINEAR_NAMES[k],
                            FP8_ROLE_NAMES[role], a, c[1] / n, c[2] / n,
                            fp8_log2_scale_spread(&hist[(size_t)t * FP8_SCALE_HIST_BINS]).c_str());
                    continue;
                }
                fprintf(log, "s:%d lq:l%d.%s.%s amax:%.6e scale:%.6e sat:%.6e ftz:%.6e\n", step, l, LINEAR_NAMES[k],
                        FP8_ROLE_NAMES[role], a, scale[t], c[1] / n, c[2] / n);
            }
        }
    }
    fflush(log);
}
