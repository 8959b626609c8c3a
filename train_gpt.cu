// train_gpt.cu: GPT-2 / GPT-3 pretraining in one CUDA source.
//
// Read top to bottom: the parameters and activations of the model, the forward pass, the backward
// pass, the optimizer step, checkpoints, and then main(): flags and input files are checked first
// (before the GPU is touched), then the training loop with validation, sampling and logging.
//
// The precision recipe is chosen at compile time (make train_gpt_<recipe>); its code lives in one
// header, llmc/recipes/<name>/recipe.h, and the model reaches it only through the recipe API of
// llmc/recipe_api.h: linear_forward, linear_forward_gelu and linear_backward (the recipe's quantized
// linear, or the plain BF16 one where it quantizes none), the sites (site_output, site_again: a
// LayerNorm or attention kernel that can also hand the next linear its operand in the recipe's
// quantized form), and the recipe_* state hooks; and through the boundary hooks of llmc/boundaries.h
// (`Boundaries` below: embedding, residual, LayerNorm, softmax, GELU, logits), which a recipe may
// fill.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>
#include <chrono>
#include <memory>

#include "llmc/common.h"
#include "llmc/cli.h"
#include "llmc/rand.h"
#include "llmc/dataloader.h"
#include "llmc/hellaswag.h"
#include "llmc/tokenizer.h"
#include "llmc/schedulers.h"
#include "llmc/spike_guard.h"
#include "llmc/checkpoint.h"
#include "llmc/cuda_common.h"
#include "llmc/encoder.cuh"
#include "llmc/layernorm.cuh"
#include "llmc/matmul.cuh"
#include "llmc/attention.cuh"
#include "llmc/flash_attention.cuh"
#if defined(ENABLE_CUDNN)
#include "llmc/cudnn_attention.h" // make USE_CUDNN=1: cuDNN's fused attention (llmc/cudnn_attention.cpp)
#endif
#include "llmc/gelu.cuh"
#include "llmc/fused_classifier.cuh"
#include "llmc/adamw.cuh"
#include "llmc/zero.h"
#include "llmc/multi_gpu.cuh"
// The precision recipe of this binary: the Makefile names its header (llmc/recipes/<name>/recipe.h)
#ifndef RECIPE_HEADER
#error "pick a recipe: build with make train_gpt_<recipe>, or pass -DRECIPE_HEADER='\"llmc/recipes/<name>/recipe.h\"'"
#endif
#include RECIPE_HEADER
// the recipe's forward-pass boundaries (llmc/boundaries.h): IdentityBoundaries unless it has some
using Boundaries = RecipeBoundaries;
// -Q NAME passes when NAME is the recipe's name or its alias (RECIPE_CHECK_ALIAS, a recipe's second name)
#ifndef RECIPE_CHECK_ALIAS
#define RECIPE_CHECK_ALIAS RECIPE_NAME
#endif
#include "llmc/profiler.h"

using namespace llmc;

// ----------------------------------------------------------------------------------------------
// Parameters: 16 tensors, one contiguous buffer, in llm.c's checkpoint order.
#define NUM_PARAMETER_TENSORS 16
enum ParamIndex {
    P_WTE, P_WPE, P_LN1W, P_LN1B, P_QKVW, P_QKVB, P_ATTPROJW, P_ATTPROJB,
    P_LN2W, P_LN2B, P_FCW, P_FCB, P_FCPROJW, P_FCPROJB, P_LNFW, P_LNFB
};
[[maybe_unused]] static const char* PARAM_NAMES[NUM_PARAMETER_TENSORS] = {
    "wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
    "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb"};
// weight decay applies to the matrices only (embeddings and linear weights), not to biases and norms
static const bool PARAM_DECAYED[NUM_PARAMETER_TENSORS] = {
    true, true, false, false, true, false, true, false, false, false, true, false, true, false, false, false};
// the tensors made of one block per layer (the others: wte, wpe, lnfw, lnfb); multi-GPU runs reduce
// the gradients block by block, layer by layer (zero.h)
static const bool PARAM_PER_LAYER[NUM_PARAMETER_TENSORS] = {
    false, false, true, true, true, true, true, true, true, true, true, true, true, true, false, false};

inline void parameter_sizes(size_t sizes[NUM_PARAMETER_TENSORS], const ModelShape& s) {
    size_t Vp = s.padded_vocab_size, C = s.channels, L = s.num_layers, maxT = s.max_seq_len;
    sizes[P_WTE] = Vp * C;        sizes[P_WPE] = maxT * C;
    sizes[P_LN1W] = L * C;        sizes[P_LN1B] = L * C;
    sizes[P_QKVW] = L * 3 * C * C; sizes[P_QKVB] = L * 3 * C;
    sizes[P_ATTPROJW] = L * C * C; sizes[P_ATTPROJB] = L * C;
    sizes[P_LN2W] = L * C;        sizes[P_LN2B] = L * C;
    sizes[P_FCW] = L * 4 * C * C; sizes[P_FCB] = L * 4 * C;
    sizes[P_FCPROJW] = L * C * 4 * C; sizes[P_FCPROJB] = L * C;
    sizes[P_LNFW] = C;            sizes[P_LNFB] = C;
}

// pointers into one buffer, for the parameters (floatX) and their gradients (FP32)
template <typename T>
struct ParamPointers {
    T* t[NUM_PARAMETER_TENSORS];
    void point_into(T* base, const size_t sizes[NUM_PARAMETER_TENSORS]) {
        for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) { t[i] = base; base += sizes[i]; }
    }
};

// ----------------------------------------------------------------------------------------------
// Activations kept from the forward pass for the backward pass, and scratch buffers.
struct Activations {
    // The residual stream is FP32 in every build (see layernorm.cuh); everything else is floatX.
    float* encoded;      // (B,T,C) token + position embedding = residual stream into layer 0
    // The LayerNorm outputs in front of the qkv (ln1) and fc (ln2) layers, (B,T,C) slots: a layer has a
    // slot of its own where its backward reads the output, and shares the last slot with the others
    // (ln_slot; gpt_allocate says when)
    floatX* ln1;
    std::vector<int> ln1_slot, ln2_slot; // layer -> slot
    int ln_shared_slot = -1;             // the slot the layers without one of their own share (-1: none)
    float* ln1_mean;     // (L,B,T)
    float* ln1_rstd;     // (L,B,T)
    floatX* qkv;         // (L,B,T,3C)
    floatX* atty;        // (L,B,T,C) attention output before its projection
    floatX* att;         // (L,B,NH,T,T) attention probabilities (materialized attention only)
    float* att_lse;      // (L,B,NH,T) log-sum-exp of each query row (flash attention only)
    void* flash_scratch; // flash attention's backward scratch
    float* qkv_bias_partials; // flash attention's backward: partial column sums of dqkv (the qkv bias gradient)
    float* residual2;    // (L,B,T,C) residual after the attention block
    floatX* ln2;         // like ln1 (ln2_slot)
    float* ln2_mean;     // (L,B,T)
    float* ln2_rstd;     // (L,B,T)
    floatX* fch;         // (L,B,T,4C) fc output before GELU
    floatX* fch_gelu;    // (L,B,T,4C), or one (B,T,4C) buffer when recompute >= 1
    float* residual3;    // (L,B,T,C) residual after the MLP block
    floatX* lnf;         // (B,T,C)
    float* lnf_mean;     // (B,T)
    float* lnf_rstd;     // (B,T)
    floatX* logits;      // (chunk,Vp) logits of one chunk of rows, overwritten by dlogits in training
    float* losses;       // (B,T) per-position loss
    // backward scratch
    float* dresidual;    // (B,T,C) gradient of the residual stream, accumulated in FP32
    floatX* dresidual_x; // (B,T,C) its floatX copy, read by the GEMMs
    floatX* dbtc;        // (B,T,C)
    floatX* dfch;        // (B,T,4C)
    floatX* dqkv;        // (B,T,3C)
    floatX* dq; floatX* dk; floatX* dv; // (B,NH,T,HS) each
    floatX* btc_scratch; // (B,T,C) projection outputs in forward
    float* ln_partials;  // layernorm_backward_scratch_floats(C)
    AttentionScratch attn;
};

struct GPT {
    ModelShape shape;
    size_t param_sizes[NUM_PARAMETER_TENSORS];
    size_t num_params = 0;
    floatX* params_memory = nullptr;  // parameters used by the forward/backward pass
    float* grads_memory = nullptr;    // FP32 gradients, accumulated over micro-steps
    // the optimizer state this process owns (all of it, or its ZeRO-1 shard: zero.h), packed
    ShardLayout shard;
    float* master_memory = nullptr;   // FP32 master weights
    float* m_memory = nullptr;        // AdamW moments
    float* v_memory = nullptr;
    MultiGpu* mg = nullptr;           // the other processes of a data-parallel run (null: none)
    ParamPointers<floatX> params;
    ParamPointers<float> grads;
    Activations acts;
    Recipe recipe;                    // the precision recipe's state (scales, quantized weights, ...)
    int B = 0, T = 0;                 // the sizes the activations were allocated for
    int recompute = 1;
    bool recompute_auto = false; // -r -1: gpt_allocate chose `recompute` from the free memory
    bool flash_attention = false;     // fused attention (BF16, head size 64/128), else materialized
    bool cudnn_attention = false;     // USE_CUDNN=1 builds: cuDNN's fused kernels instead of ours (same buffers)
    int classifier_chunk = 0;         // rows of the LM head computed at once (bounds the logits buffer)
    int* inputs_dev = nullptr;        // (B,T)
    int* targets_dev = nullptr;       // (B,T)
    int* buckets_dev = nullptr;       // 3*B*T+1 ints for the embedding backward
    // page-locked staging buffers for the uploads above, so that they do not stall the host; each
    // event marks the end of the last upload from its buffer (the host waits on it before rewriting)
    int* inputs_pinned = nullptr;     // 2*B*T: inputs | targets
    int* buckets_pinned = nullptr;    // 3*B*T+1
    cudaEvent_t inputs_uploaded, buckets_uploaded;
    float* loss_sum_dev = nullptr;    // running sum of per-position losses (see gpt_read_loss)
    float* norm_partials = nullptr;   // NORM_BLOCKS
    float* norm_dev = nullptr;        // 1
    EmbeddingBuckets buckets;
    cudaStream_t stream = 0;
    int adam_steps = 0;               // optimizer steps taken so far (AdamW's t - 1)
};

// blocks of tensor i: one per layer, or one (zero.h); the unit of the layer-by-layer gradient reduction
inline size_t param_blocks(int i, const ModelShape& s) { return PARAM_PER_LAYER[i] ? (size_t)s.num_layers : 1; }
// tensor i's block of layer l (l = -1: a tensor outside the layers, one block), and its length
template <class T>
inline T* param_block(T* tensor, const GPT* model, int i, int l, size_t* block) {
    *block = model->param_sizes[i] / param_blocks(i, model->shape);
    return tensor + (l >= 0 ? (size_t)l * *block : 0);
}

// owners = 1: this process keeps all of the optimizer state (owner = 0); else it keeps the ZeRO-1
// shard `owner` of `owners`
inline void gpt_build(GPT* model, const ModelShape& shape, int owner = 0, int owners = 1) {
    model->shape = shape;
    parameter_sizes(model->param_sizes, shape);
    model->num_params = 0;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) model->num_params += model->param_sizes[i];
    size_t blocks[NUM_PARAMETER_TENSORS];
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) blocks[i] = param_blocks(i, shape);
    model->shard.build(model->param_sizes, blocks, NUM_PARAMETER_TENSORS, owner, owners);
}

template <typename T>
T* alloc_n(size_t n, const char* what) { return (T*)cuda_malloc_or_die(n * sizeof(T), what); }

// The slots of ln1 and ln2 (Activations::ln1_slot, ln2_slot) for a recompute setting and N = B*T rows: layer l's
// own where its qkv (fc) layer's backward reads the LayerNorm output and it is not recomputed (-r 2), else the
// shared one. The qkv and fc layers of one layer run under the same recipe decision, so both tensors get the same
// number of slots; returns it.
inline size_t assign_ln_slots(GPT* model, int recompute, int N) {
    Activations& a = model->acts;
    const int L = model->shape.num_layers;
    size_t slots[2] = {0, 0};
    bool shared = false;
    const LinearKind kinds[2] = {LIN_QKV, LIN_FC};
    std::vector<int>* slot_of[2] = {&a.ln1_slot, &a.ln2_slot};
    for (int t = 0; t < 2; t++) {
        slot_of[t]->assign(L, -1);
        for (int l = 0; l < L; l++) {
            if (recompute < 2 && recipe_needs_input_in_backward(model->recipe, {l, kinds[t]}, N)) (*slot_of[t])[l] = (int)slots[t]++;
            else shared = true;
        }
    }
    const size_t own = std::max(slots[0], slots[1]);
    a.ln_shared_slot = shared ? (int)own : -1;
    for (int t = 0; t < 2; t++)
        for (int l = 0; l < L; l++)
            if ((*slot_of[t])[l] < 0) (*slot_of[t])[l] = a.ln_shared_slot;
    return own + (shared ? 1 : 0);
}

// device memory for parameters, optimizer state, activations and scratch
// (recipe_options: the recipe's flags; recipe_context: the run's seed and -Q, and gpt_allocate fills its ZeRO-1 owners)
inline void gpt_allocate(GPT* model, int B, int T, int recompute, const RecipeOptions& recipe_options = RecipeOptions(),
                         RecipeContext recipe_context = RecipeContext()) {
    const ModelShape& s = model->shape;
    const size_t L = s.num_layers, C = s.channels, NH = s.num_heads, Vp = s.padded_vocab_size;
    const size_t BT = (size_t)B * T, N = model->num_params, NS = model->shard.shard_elements;
    model->B = B; model->T = T; model->recompute = recompute;
    model->params_memory = alloc_n<floatX>(N, "parameters");
    model->grads_memory = alloc_n<float>(N, "gradients");
    model->master_memory = alloc_n<float>(NS, "master weights");
    model->m_memory = alloc_n<float>(NS, "AdamW first moments");
    model->v_memory = alloc_n<float>(NS, "AdamW second moments");
    cudaCheck(cudaMemset(model->grads_memory, 0, N * sizeof(float)));
    cudaCheck(cudaMemset(model->m_memory, 0, NS * sizeof(float)));
    cudaCheck(cudaMemset(model->v_memory, 0, NS * sizeof(float)));
    model->params.point_into(model->params_memory, model->param_sizes);
    model->grads.point_into(model->grads_memory, model->param_sizes);

    Activations& a = model->acts;
    a.encoded = alloc_n<float>(BT * C, "activations (encoded)");
    a.ln1_mean = alloc_n<float>(L * BT, "activations (ln1 mean)");
    a.ln1_rstd = alloc_n<float>(L * BT, "activations (ln1 rstd)");
    a.qkv = alloc_n<floatX>(L * BT * 3 * C, "activations (qkv)");
    a.atty = alloc_n<floatX>(L * BT * C, "activations (attention output)");
    // Flash attention keeps one log-sum-exp per query row instead of the (T x T) probabilities. The
    // FP32 reference build, and head sizes the fused kernels do not cover, use the materialized path.
#if defined(ENABLE_FP32)
    model->flash_attention = false;
#else
    // (a recipe's attention boundaries run in the fused kernels too: flash_attention.cuh)
    model->flash_attention = C / NH == 64 || C / NH == 128;
#endif
    a.att = nullptr; a.att_lse = nullptr; a.flash_scratch = nullptr; a.qkv_bias_partials = nullptr;
    a.attn.q = a.attn.k = a.attn.v = a.attn.y = a.attn.scores = nullptr;
    a.dq = a.dk = a.dv = nullptr;
#if defined(ENABLE_CUDNN) && !defined(ENABLE_FP32)
    // USE_CUDNN=1: cuDNN's SDPA kernels where they take the shape and the recipe has no attention
    // boundaries; they keep the same log-sum-exp per row. The graphs and cuDNN's workspace are made
    // here, before the -r -1 decision below reads the free memory.
    if (model->flash_attention && !Boundaries::ACTIVE) {
        std::string why;
        model->cudnn_attention = cudnn_attention_prepare(B, T, NH, C / NH, &why);
        if (!model->cudnn_attention) fprintf(stderr, "warning: cuDNN attention unavailable (%s); using flash attention\n", why.c_str());
    }
#endif
    if (model->flash_attention) {
        a.att_lse = alloc_n<float>(L * (size_t)B * NH * T, "activations (attention log-sum-exp)");
#if !defined(ENABLE_FP32)
        if (!model->cudnn_attention) {
            a.flash_scratch = cuda_malloc_or_die(flash_attention_backward_scratch_bytes(B, T, NH, C / NH), "attention scratch");
            a.qkv_bias_partials = alloc_n<float>((size_t)flash_attention_bias_partial_rows(B, T) * 3 * C, "attention scratch");
        }
#endif
    } else {
        a.att = alloc_n<floatX>(L * (size_t)B * NH * T * T, "activations (attention probabilities)");
        a.dq = alloc_n<floatX>(BT * C, "backward scratch");
        a.dk = alloc_n<floatX>(BT * C, "backward scratch");
        a.dv = alloc_n<floatX>(BT * C, "backward scratch");
        a.attn.q = alloc_n<floatX>(BT * C, "attention scratch");
        a.attn.k = alloc_n<floatX>(BT * C, "attention scratch");
        a.attn.v = alloc_n<floatX>(BT * C, "attention scratch");
        a.attn.y = alloc_n<floatX>(BT * C, "attention scratch");
        a.attn.scores = alloc_n<floatX>((size_t)B * NH * T * T, "attention scratch (scores)");
    }
    a.residual2 = alloc_n<float>(L * BT * C, "activations (residual2)");
    a.ln2_mean = alloc_n<float>(L * BT, "activations (ln2 mean)");
    a.ln2_rstd = alloc_n<float>(L * BT, "activations (ln2 rstd)");
    a.fch = alloc_n<floatX>(L * BT * 4 * C, "activations (fc)");
    a.residual3 = alloc_n<float>(L * BT * C, "activations (residual3)");
    a.lnf = alloc_n<floatX>(BT * C, "activations (lnf)");
    a.lnf_mean = alloc_n<float>(BT, "activations (lnf mean)");
    a.lnf_rstd = alloc_n<float>(BT, "activations (lnf rstd)");
    // The LM head runs over chunks of rows: max(8192, T) rows keeps its GEMMs large while the logits
    // buffer stays small (8192 x 50304 BF16 = 0.8 GB instead of 6.6 GB at B=64, T=1024).
    model->classifier_chunk = (int)std::min<size_t>(BT, std::max<size_t>(8192, T));
    a.logits = alloc_n<floatX>((size_t)model->classifier_chunk * Vp, "activations (logits)");
    a.losses = alloc_n<float>(BT, "losses");
    a.dresidual = alloc_n<float>(BT * C, "backward scratch");
    a.dresidual_x = alloc_n<floatX>(BT * C, "backward scratch");
    a.dbtc = alloc_n<floatX>(BT * C, "backward scratch");
    a.dfch = alloc_n<floatX>(BT * 4 * C, "backward scratch");
    a.dqkv = alloc_n<floatX>(BT * 3 * C, "backward scratch");
    a.btc_scratch = alloc_n<floatX>(BT * C, "forward scratch");
    a.ln_partials = alloc_n<float>(layernorm_backward_scratch_floats(C), "layernorm scratch");
    recipe_context.state_owner = model->shard.rank; // (the recipe may cut its own state like the optimizer's: zero.h)
    recipe_context.state_owners = model->shard.owners;
    recipe_context.head_rows = model->classifier_chunk;
    recipe_init(model->recipe, recipe_options, s, B, T, recipe_context);
    // ln1 / ln2: a layer keeps its LayerNorm output only where its backward reads it: the BF16 weight gradient of
    // the qkv / fc layer, unless -r 2 recomputes it there. Where the backward reads something else (a recipe
    // whose weight gradient reads the x^T codes its forward saved: recipe_needs_input_in_backward), the layers
    // share one slot, which the LayerNorm writes (or leaves unwritten, writing the codes) and the linear reads
    // right away: 2 x L x B x T x C BF16 values not kept. (gpt_backward recomputes the output into the shared
    // slot for any layer whose backward does read it.)
    const size_t ln_slots = assign_ln_slots(model, recompute, (int)BT);
    a.ln1 = alloc_n<floatX>(ln_slots * BT * C, "activations (ln1)");
    a.ln2 = alloc_n<floatX>(ln_slots * BT * C, "activations (ln2)");
    model->inputs_dev = alloc_n<int>(BT, "inputs");
    model->targets_dev = alloc_n<int>(BT, "targets");
    model->buckets_dev = alloc_n<int>(3 * BT + 1, "embedding buckets");
    cudaCheck(cudaMallocHost(&model->inputs_pinned, 2 * BT * sizeof(int)));
    cudaCheck(cudaMallocHost(&model->buckets_pinned, (3 * BT + 1) * sizeof(int)));
    cudaCheck(cudaEventCreateWithFlags(&model->inputs_uploaded, cudaEventDisableTiming));
    cudaCheck(cudaEventCreateWithFlags(&model->buckets_uploaded, cudaEventDisableTiming));
    model->loss_sum_dev = alloc_n<float>(1, "loss sum");
    cudaCheck(cudaMemset(model->loss_sum_dev, 0, sizeof(float)));
    model->norm_partials = alloc_n<float>(NORM_BLOCKS, "norm scratch");
    model->norm_dev = alloc_n<float>(1, "norm");
    // The GELU outputs, allocated last: -r -1 (auto, the default) keeps every layer's (no recompute,
    // one elementwise pass per layer less in backward) when they fit with room to spare once
    // everything else is allocated: a reserve of max(1 GiB, 1/16 of the GPU) for what cuBLASLt, NCCL
    // and the CUDA context may still take. Otherwise one layer's, recomputed in backward (-r 1).
    // The two differ in the last bits: the kept outputs are the fc GEMM epilogue's GELU (what the
    // forward used), the recomputed ones the GELU kernel's. The checkpoint records the choice, and a
    // resume with -r -1 takes it from there (main).
    // A recipe that reads no layer's GELU output in backward (it keeps its own quantized x^T) has
    // nothing to recompute: one buffer.
    if (recompute < 0) {
        bool read_in_backward = false;
        for (size_t l = 0; l < L; l++)
            read_in_backward = read_in_backward || recipe_needs_input_in_backward(model->recipe, {(int)l, LIN_FCPROJ}, (int)BT);
        size_t free_b = 0, total_b = 0;
        cudaCheck(cudaMemGetInfo(&free_b, &total_b));
        const size_t kept = (L - 1) * BT * 4 * C * sizeof(floatX);
        const size_t reserve = std::max<size_t>(1ull << 30, total_b / 16);
        model->recompute = recompute = read_in_backward && free_b > kept + reserve ? 0 : 1;
        model->recompute_auto = true;
    }
    a.fch_gelu = alloc_n<floatX>((recompute >= 1 ? 1 : L) * BT * 4 * C, "activations (gelu)");
}

// ----------------------------------------------------------------------------------------------
// Initialization and parameter transfer. Host arrays are FP32 in checkpoint order.

// GPT-2's init: N(0, 0.02) for embeddings and linear weights, residual projections scaled by
// 1/sqrt(2L), zero biases, LayerNorm weight 1 / bias 0; the padded vocabulary rows stay zero.
inline std::vector<float> gpt_random_init(const GPT* model, uint64_t seed) {
    const ModelShape& s = model->shape;
    std::vector<float> p(model->num_params, 0.0f);
    size_t offsets[NUM_PARAMETER_TENSORS];
    size_t off = 0;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) { offsets[i] = off; off += model->param_sizes[i]; }
    Rng rng(seed);
    const float std = 0.02f, residual_std = 0.02f / sqrtf(2.0f * s.num_layers);
    rng.fill_normal(&p[offsets[P_WTE]], (size_t)s.vocab_size * s.channels, 0.0f, std);
    rng.fill_normal(&p[offsets[P_WPE]], model->param_sizes[P_WPE], 0.0f, std);
    for (int i : {P_LN1W, P_LN2W, P_LNFW})
        for (size_t j = 0; j < model->param_sizes[i]; j++) p[offsets[i] + j] = 1.0f;
    rng.fill_normal(&p[offsets[P_QKVW]], model->param_sizes[P_QKVW], 0.0f, std);
    rng.fill_normal(&p[offsets[P_ATTPROJW]], model->param_sizes[P_ATTPROJW], 0.0f, residual_std);
    rng.fill_normal(&p[offsets[P_FCW]], model->param_sizes[P_FCW], 0.0f, std);
    rng.fill_normal(&p[offsets[P_FCPROJW]], model->param_sizes[P_FCPROJW], 0.0f, residual_std);
    return p;
}

__global__ void float_to_floatX_kernel(floatX* out, const float* in, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = (floatX)in[i];
}

inline LinearWeights gpt_linear_weights(const GPT* model) {
    LinearWeights w;
    w.weight[LIN_QKV] = model->params.t[P_QKVW];
    w.weight[LIN_ATTPROJ] = model->params.t[P_ATTPROJW];
    w.weight[LIN_FC] = model->params.t[P_FCW];
    w.weight[LIN_FCPROJ] = model->params.t[P_FCPROJW];
    w.head = model->params.t[P_WTE];
    return w;
}

// FP32 host values -> master weights (exact; this process's shard) and parameters (rounded to
// nearest; all of them); a recipe that constrains the weights constrains them
// from the start
inline void gpt_set_params(GPT* model, const std::vector<float>& host_values) {
    std::vector<float> constrained;
    if constexpr (Boundaries::CONSTRAINS_WEIGHTS) {
        constrained = host_values;
        for (float& x : constrained) x = Boundaries::constrain_weight(x);
    }
    const std::vector<float>& host = Boundaries::CONSTRAINS_WEIGHTS ? constrained : host_values;
    const std::vector<float> shard = model->shard.extract(host.data());
    cudaCheck(cudaMemcpy(model->master_memory, shard.data(), shard.size() * sizeof(float), cudaMemcpyHostToDevice));
    // (the FP32 values pass through the gradient buffer, which is zeroed again right after)
    cudaCheck(cudaMemcpy(model->grads_memory, host.data(), model->num_params * sizeof(float), cudaMemcpyHostToDevice));
    float_to_floatX_kernel<<<ceil_div(model->num_params, 512), 512>>>(model->params_memory, model->grads_memory, model->num_params);
    cudaCheckLaunch();
    cudaCheck(cudaMemset(model->grads_memory, 0, model->num_params * sizeof(float)));
    recipe_weights_changed(model->recipe, gpt_linear_weights(model), 0);
    cudaCheck(cudaDeviceSynchronize());
}

// read an llm.c model file (fp32 version 3 or bf16 version 5) as FP32 host values
inline std::vector<float> read_params_fp32(const std::string& path, const ModelFileInfo& info, size_t num_params) {
    std::vector<float> out(num_params);
    if (info.version == 3) {
        read_model_params(path, info, out.data(), num_params * sizeof(float));
    } else {
        std::vector<uint16_t> raw(num_params);
        read_model_params(path, info, raw.data(), num_params * sizeof(uint16_t));
        for (size_t i = 0; i < num_params; i++) {
            uint32_t bits = (uint32_t)raw[i] << 16;
            memcpy(&out[i], &bits, 4);
        }
    }
    return out;
}

// parameters (floatX) -> host bytes in the checkpoint's precision
inline std::vector<floatX> gpt_get_params(const GPT* model) {
    std::vector<floatX> host(model->num_params);
    cudaCheck(cudaMemcpy(host.data(), model->params_memory, model->num_params * sizeof(floatX), cudaMemcpyDeviceToHost));
    return host;
}

// One layer's slices of the activations: the per-layer buffers, or the single shared buffer of what
// is recomputed in backward or not read there (ln1/ln2: assign_ln_slots; the GELU output with -r >= 1).
struct LayerActs {
    const float* residual_in; // the residual stream entering the layer
    floatX* ln1; floatX* ln2; floatX* qkv; floatX* atty;
    bool ln1_shared, ln2_shared; // ln1 / ln2 in the shared slot: overwritten by the next layer's forward
    floatX* att; float* lse;  // attention probabilities (materialized) or log-sum-exp (flash)
    float* residual2; floatX* fch; floatX* fch_gelu; float* residual3;
};
inline LayerActs layer_acts(GPT* model, int l, int B, int T) {
    Activations& a = model->acts;
    const size_t NC = (size_t)B * T * model->shape.channels, NH = model->shape.num_heads;
    LayerActs r;
    r.residual_in = l == 0 ? a.encoded : a.residual3 + (l - 1) * NC;
    r.ln1 = a.ln1 + a.ln1_slot[l] * NC;
    r.ln2 = a.ln2 + a.ln2_slot[l] * NC;
    r.ln1_shared = a.ln1_slot[l] == a.ln_shared_slot;
    r.ln2_shared = a.ln2_slot[l] == a.ln_shared_slot;
    r.qkv = a.qkv + l * NC * 3;
    r.atty = a.atty + l * NC;
    r.att = a.att ? a.att + (size_t)l * B * NH * T * T : nullptr;
    r.lse = a.att_lse ? a.att_lse + (size_t)l * B * NH * T : nullptr;
    r.residual2 = a.residual2 + l * NC;
    r.fch = a.fch + l * NC * 4;
    r.fch_gelu = a.fch_gelu + (model->recompute >= 1 ? 0 : l * NC * 4);
    r.residual3 = a.residual3 + l * NC;
    return r;
}

// ----------------------------------------------------------------------------------------------
// Forward pass. inputs/targets are host arrays of B*T tokens (B, T <= the allocated sizes).
// Asynchronous: with targets, the sum of the per-position losses is added to a device counter that
// gpt_read_loss() reads (one synchronization per optimizer step, not per micro-step). With training,
// the classifier also leaves dloss/dlogits (scaled by dloss_scale) in acts.logits for gpt_backward.
inline void gpt_forward(GPT* model, const int* inputs, const int* targets, int B, int T,
                        bool training = false, float dloss_scale = 1.0f) {
    const ModelShape& s = model->shape;
    const int L = s.num_layers, C = s.channels, NH = s.num_heads, HS = C / NH;
    const int V = s.vocab_size, Vp = s.padded_vocab_size;
    const int N = B * T;
    const size_t NC = (size_t)N * C;
    cudaStream_t st = model->stream;
    Activations& a = model->acts;
    ParamPointers<floatX>& p = model->params;
    Recipe& rc = model->recipe;

    PHASE("fwd: upload");
    cudaCheck(cudaEventSynchronize(model->inputs_uploaded));
    memcpy(model->inputs_pinned, inputs, N * sizeof(int));
    if (targets) memcpy(model->inputs_pinned + N, targets, N * sizeof(int));
    cudaCheck(cudaMemcpyAsync(model->inputs_dev, model->inputs_pinned, N * sizeof(int), cudaMemcpyHostToDevice, st));
    if (targets) {
        cudaCheck(cudaMemcpyAsync(model->targets_dev, model->inputs_pinned + N, N * sizeof(int), cudaMemcpyHostToDevice, st));
    }
    cudaCheck(cudaEventRecord(model->inputs_uploaded, st));

    PHASE("fwd: embedding + layernorm");
    encoder_forward<Boundaries>(a.encoded, model->inputs_dev, p.t[P_WTE], p.t[P_WPE], B, T, C, st);
    // the output of a LayerNorm feeds the linear after it: the LayerNorm may write that linear's input in the
    // recipe's quantized form instead (a site: recipe_api.h) ...
    auto ln_target = [&](int layer, LinearKind kind) {
        return site_output(rc, SITE_LAYERNORM_OUTPUT, {layer, kind}, N, C, HS, training, st);
    };
    // ... and the recipe may ask for it once more, from the residual stream the LayerNorm read (where the
    // scale it guessed was not the fresh one; the kernel then runs under a device flag)
    auto ln_again = [&](int layer, LinearKind kind, floatX* out, float* mean, float* rstd, const float* residual,
                        const floatX* w, const floatX* b) {
        const auto again = site_again(rc, SITE_LAYERNORM_OUTPUT, {layer, kind}, st);
        if (again.active()) layernorm_forward<Boundaries>(out, mean, rstd, residual, w, b, N, C, st, again);
    };
    floatX* ln1_first = a.ln1 + a.ln1_slot[0] * NC;
    layernorm_forward<Boundaries>(ln1_first, a.ln1_mean, a.ln1_rstd, a.encoded, p.t[P_LN1W], p.t[P_LN1B], N, C, st,
                                  ln_target(0, LIN_QKV));
    ln_again(0, LIN_QKV, ln1_first, a.ln1_mean, a.ln1_rstd, a.encoded, p.t[P_LN1W], p.t[P_LN1B]);
    for (int l = 0; l < L; l++) {
        const LayerActs la = layer_acts(model, l, B, T);
        // attention block
        PHASE("fwd: linear");
        linear_forward(rc, {l, LIN_QKV}, la.qkv, la.ln1, p.t[P_QKVW] + (size_t)l * 3 * C * C, p.t[P_QKVB] + l * 3 * C,
                       N, C, 3 * C, training, st);
        PHASE("fwd: attention");
#if !defined(ENABLE_FP32)
#if defined(ENABLE_CUDNN)
        if (model->cudnn_attention) cudnn_attention_forward(la.atty, la.lse, la.qkv, B, T, NH, HS, st);
        else
#endif
        if (model->flash_attention) {
            // the attention output feeds the attention projection: also in the recipe's quantized form,
            // where the recipe takes it
            const auto atty_target = site_output(rc, SITE_ATTENTION_OUTPUT, {l, LIN_ATTPROJ}, N, C, HS, training, st);
            flash_attention_forward<Boundaries>(la.atty, la.lse, la.qkv, B, T, NH, HS, st, nullptr, atty_target);
        } else
#endif
        attention_forward<Boundaries>(la.atty, la.att, la.qkv, a.attn, B, T, NH, HS, st);
        PHASE("fwd: linear");
        linear_forward(rc, {l, LIN_ATTPROJ}, a.btc_scratch, la.atty, p.t[P_ATTPROJW] + (size_t)l * C * C,
                       p.t[P_ATTPROJB] + l * C, N, C, C, training, st);
        PHASE("fwd: residual + layernorm");
        fused_residual_layernorm_forward<Boundaries>(la.residual2, la.ln2, a.ln2_mean + l * N, a.ln2_rstd + l * N,
                                                     la.residual_in, a.btc_scratch, p.t[P_LN2W] + l * C,
                                                     p.t[P_LN2B] + l * C, N, C, st, ATTENTION_BRANCH, ln_target(l, LIN_FC));
        ln_again(l, LIN_FC, la.ln2, a.ln2_mean + l * N, a.ln2_rstd + l * N, la.residual2, p.t[P_LN2W] + l * C, p.t[P_LN2B] + l * C);
        // MLP block
        PHASE("fwd: linear");
        linear_forward_gelu(rc, {l, LIN_FC}, la.fch_gelu, la.fch, la.ln2, p.t[P_FCW] + (size_t)l * 4 * C * C,
                            p.t[P_FCB] + l * 4 * C, N, C, 4 * C, training, st);
        linear_forward(rc, {l, LIN_FCPROJ}, a.btc_scratch, la.fch_gelu, p.t[P_FCPROJW] + (size_t)l * 4 * C * C,
                       p.t[P_FCPROJB] + l * C, N, 4 * C, C, training, st);
        // the residual add fused with the next LayerNorm: the next layer's ln1, or the final one
        PHASE("fwd: residual + layernorm");
        if (l + 1 < L) {
            floatX* ln1_next = a.ln1 + a.ln1_slot[l + 1] * NC;
            fused_residual_layernorm_forward<Boundaries>(la.residual3, ln1_next, a.ln1_mean + (l + 1) * N,
                                                         a.ln1_rstd + (l + 1) * N, la.residual2, a.btc_scratch,
                                                         p.t[P_LN1W] + (l + 1) * C, p.t[P_LN1B] + (l + 1) * C, N, C, st,
                                                         MLP_BRANCH, ln_target(l + 1, LIN_QKV));
            ln_again(l + 1, LIN_QKV, ln1_next, a.ln1_mean + (l + 1) * N, a.ln1_rstd + (l + 1) * N, la.residual3,
                    p.t[P_LN1W] + (l + 1) * C, p.t[P_LN1B] + (l + 1) * C);
        } else {
            fused_residual_layernorm_forward<Boundaries>(la.residual3, a.lnf, a.lnf_mean, a.lnf_rstd, la.residual2,
                                                         a.btc_scratch, p.t[P_LNFW], p.t[P_LNFB], N, C, st, MLP_BRANCH);
        }
    }
    // LM head, tied to the token embedding: logits = lnf wte^T over all Vp rows, one chunk of rows at a
    // time. In training the chunk's backward runs right away (the logits are not needed afterwards):
    //   dwte += dlogits^T lnf,   dlnf = dlogits wte   (dlnf into acts.dbtc, read by gpt_backward)
    // Its GEMMs are the recipe's where it runs the head itself (recipe_api.h, the LM head).
    const int chunk = model->classifier_chunk;
    for (int r0 = 0; r0 < N; r0 += chunk) {
        const int rows = std::min(chunk, N - r0);
        const floatX* lnf_rows = a.lnf + (size_t)r0 * C;
        PHASE("lm head");
        lm_head_forward(model->recipe, a.logits, lnf_rows, p.t[P_WTE], rows, C, Vp, training, st);
        if (!targets) continue; // sampling: the logits of the (single) chunk stay in acts.logits
        // (every dlogit is at most |dloss_scale| LOGIT_SCALE in magnitude: |softmax - one-hot| <= 1)
        const HeadGradCodes codes = training ? lm_head_grad_codes(model->recipe, rows, C, Vp,
                                                                  fabsf(dloss_scale) * Boundaries::LOGIT_SCALE, st)
                                             : HeadGradCodes();
        PHASE("classifier");
        fused_classifier<Boundaries>(a.logits, a.losses + r0, model->targets_dev + r0, dloss_scale, rows, V, Vp, training, st,
                                     ClassifierForm::AUTO, codes.rows, codes.scale);
        if (training) {
            PHASE("lm head");
            lm_head_backward(model->recipe, model->grads.t[P_WTE], a.dbtc + (size_t)r0 * C, a.logits, lnf_rows, p.t[P_WTE],
                             rows, C, Vp, st);
        }
    }
    if (!targets) return;
    accumulate_loss(model->loss_sum_dev, a.losses, N, st);
    // the host groups the positions by token for the embedding backward while the GPU runs
    if (training) model->buckets.build(inputs, N);
}

// The mean loss since the last call: the device's loss sum over `count` positions. Synchronizes.
inline float gpt_read_loss(GPT* model, long long count) {
    float sum = 0.0f;
    cudaCheck(cudaMemcpyAsync(&sum, model->loss_sum_dev, sizeof(float), cudaMemcpyDeviceToHost, model->stream));
    cudaCheck(cudaMemsetAsync(model->loss_sum_dev, 0, sizeof(float), model->stream));
    cudaCheck(cudaStreamSynchronize(model->stream));
    return (float)(sum / (double)count);
}

// forward + the mean loss of this batch (for evaluation and tests)
inline float gpt_forward_loss(GPT* model, const int* inputs, const int* targets, int B, int T,
                              bool training = false, float dloss_scale = 1.0f) {
    gpt_read_loss(model, 1); // start from zero
    gpt_forward(model, inputs, targets, B, T, training, dloss_scale);
    return gpt_read_loss(model, (long long)B * T);
}

// forward + the loss of every position, copied to losses[B*T] on the host (HellaSwag: llmc/hellaswag.h)
inline void gpt_forward_token_losses(GPT* model, const int* inputs, const int* targets, int B, int T, float* losses) {
    gpt_forward_loss(model, inputs, targets, B, T); // (synchronizes, and leaves the loss counter at zero)
    cudaCheck(cudaMemcpyAsync(losses, model->acts.losses, (size_t)B * T * sizeof(float), cudaMemcpyDeviceToHost, model->stream));
    cudaCheck(cudaStreamSynchronize(model->stream));
}

// ----------------------------------------------------------------------------------------------
// Data parallelism: the gradient blocks of layer l (l >= 0: one block of every per-layer tensor) or
// of the tensors outside the layers (l = -1), summed over the processes on the NCCL stream while
// the compute stream goes on: all-reduced (-z 0) or reduce-scattered into each process's pieces
// (-z 1; zero.h). Nothing without other processes.
inline void gpt_reduce_gradients(GPT* model, int l) {
    MultiGpu* mg = model->mg;
    if (!mg || !mg->active) return;
    PHASE("bwd: enqueue gradient reduction");
    multi_gpu_after_compute(mg, model->stream);
    multi_gpu_begin(mg);
    ncclCheck(ncclGroupStart());
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        if (PARAM_PER_LAYER[i] != (l >= 0)) continue;
        size_t block;
        float* g = param_block(model->grads.t[i], model, i, l, &block);
        if (mg->zero_stage == 1) {
            const size_t piece = block / mg->world;
            ncclCheck(ncclReduceScatter(g, g + mg->rank * piece, piece, ncclFloat, ncclSum, mg->comm, mg->stream));
        } else {
            ncclCheck(ncclAllReduce(g, g, block, ncclFloat, ncclSum, mg->comm, mg->stream));
        }
    }
    ncclCheck(ncclGroupEnd());
    multi_gpu_end(mg, l >= 0 ? strfmt("the gradient reduction of layer %d", l) : std::string("the gradient reduction of the embeddings"));
}

// ZeRO-1, after the optimizer step: every process's updated pieces of the parameters to all
inline void gpt_gather_parameters(GPT* model) {
    MultiGpu* mg = model->mg;
    if (!mg || !mg->active || mg->zero_stage != 1) return;
    PHASE("optimizer: parameter all-gather");
    multi_gpu_collective(mg, model->stream, "the parameter all-gather", [&] {
        for (int l = -1; l < model->shape.num_layers; l++) {
            ncclCheck(ncclGroupStart());
            for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
                if (PARAM_PER_LAYER[i] != (l >= 0)) continue;
                size_t block;
                floatX* p = param_block(model->params.t[i], model, i, l, &block);
                const size_t piece = block / mg->world;
                ncclCheck(ncclAllGather(p + mg->rank * piece, p, piece, NCCL_FLOATX, mg->comm, mg->stream));
            }
            ncclCheck(ncclGroupEnd());
        }
    });
}

// ----------------------------------------------------------------------------------------------
// Backward pass: after gpt_forward(..., training=true), which already did the LM head's backward
// (dwte from the head, and dlnf in acts.dbtc). Accumulates into the FP32 gradients. With
// reduce (the last micro-step of a data-parallel step), each layer's gradients start their way to
// the other processes as soon as the layer is done.
inline void gpt_backward(GPT* model, int B, int T, bool reduce = false) {
    const ModelShape& s = model->shape;
    const int L = s.num_layers, C = s.channels, NH = s.num_heads, HS = C / NH;
    const int N = B * T;
    const size_t NC = (size_t)N * C;
    cudaStream_t st = model->stream;
    Activations& a = model->acts;
    ParamPointers<floatX>& p = model->params;
    ParamPointers<float>& g = model->grads;
    Recipe& rc = model->recipe;

    // the LayerNorm backward's output is the output gradient of the projection that ends the block below
    // it: the kernel may hand it over in the recipe's quantized form (a site: recipe_api.h) ...
    auto ln_backward_target = [&](int layer, LinearKind kind) {
        return site_output(rc, SITE_LAYERNORM_BACKWARD_OUTPUT, {layer, kind}, N, C, HS, true, st);
    };
    // ... and the recipe may ask for those codes once more, from the residual gradient it stored (where the
    // scale it guessed was not the fresh one; the kernel then runs under a device flag), before anything
    // adds to it
    auto ln_backward_again = [&](int layer, LinearKind kind, float branch_scale) {
        const auto again = site_again(rc, SITE_LAYERNORM_BACKWARD_OUTPUT, {layer, kind}, st);
        if (again.active()) layernorm_backward_codes_again(again, a.dresidual, N, C, branch_scale, st);
    };
    PHASE("bwd: layernorm");
    cudaCheck(cudaMemsetAsync(a.dresidual, 0, NC * sizeof(float), st));
    // (each LayerNorm backward hands the residual gradient, times the branch scale, to the branch
    // that wrote into the residual stream: lnf and ln1 to an MLP, ln2 to an attention block; it also
    // adds that branch's last bias gradient, the column sums of what it hands over, so the fc and
    // attention projections' backward passes get no dbias)
    layernorm_backward(a.dresidual, a.dresidual_x, g.t[P_LNFW], g.t[P_LNFB], a.ln_partials, a.dbtc, a.residual3 + (L - 1) * NC,
                       p.t[P_LNFW], a.lnf_mean, a.lnf_rstd, N, C, st, Boundaries::MLP_RESIDUAL_SCALE,
                       g.t[P_FCPROJB] + (size_t)(L - 1) * C, ln_backward_target(L - 1, LIN_FCPROJ));
    ln_backward_again(L - 1, LIN_FCPROJ, Boundaries::MLP_RESIDUAL_SCALE);
    for (int l = L - 1; l >= 0; l--) {
        const LayerActs la = layer_acts(model, l, B, T);
        const floatX* ln1w = p.t[P_LN1W] + l * C;
        const floatX* ln2w = p.t[P_LN2W] + l * C;
        // recompute what was not kept (identical kernels on identical inputs: identical values), where
        // the recipe's backward reads it
        PHASE("bwd: recompute");
        if (model->recompute >= 1 && recipe_needs_input_in_backward(rc, {l, LIN_FCPROJ}, N)) gelu_forward<Boundaries>(la.fch_gelu, la.fch, NC * 4, st);
        if (la.ln2_shared && recipe_needs_input_in_backward(rc, {l, LIN_FC}, N)) {
            layernorm_forward<Boundaries>(la.ln2, a.ln2_mean + l * N, a.ln2_rstd + l * N, la.residual2, ln2w, p.t[P_LN2B] + l * C, N, C, st);
        }
        // MLP block; dresidual holds d(la.residual3)
        PHASE("bwd: linear");
        // the fc projection's input gradient passes through the GELU (its derivative at la.fch)
        linear_backward(rc, {l, LIN_FCPROJ}, a.dfch, g.t[P_FCPROJW] + (size_t)l * 4 * C * C, nullptr,
                        a.dresidual_x, la.fch_gelu, p.t[P_FCPROJW] + (size_t)l * 4 * C * C, la.fch, N, 4 * C, C, st);
        linear_backward(rc, {l, LIN_FC}, a.dbtc, g.t[P_FCW] + (size_t)l * 4 * C * C, g.t[P_FCB] + l * 4 * C, a.dfch,
                        la.ln2, p.t[P_FCW] + (size_t)l * 4 * C * C, nullptr, N, C, 4 * C, st);
        PHASE("bwd: layernorm");
        layernorm_backward(a.dresidual, a.dresidual_x, g.t[P_LN2W] + l * C, g.t[P_LN2B] + l * C, a.ln_partials, a.dbtc, la.residual2,
                           ln2w, a.ln2_mean + l * N, a.ln2_rstd + l * N, N, C, st, Boundaries::ATTENTION_RESIDUAL_SCALE,
                           g.t[P_ATTPROJB] + (size_t)l * C, ln_backward_target(l, LIN_ATTPROJ));
        ln_backward_again(l, LIN_ATTPROJ, Boundaries::ATTENTION_RESIDUAL_SCALE);
        // attention block; dresidual now holds d(la.residual2)
        PHASE("bwd: linear");
        linear_backward(rc, {l, LIN_ATTPROJ}, a.dbtc, g.t[P_ATTPROJW] + (size_t)l * C * C, nullptr,
                        a.dresidual_x, la.atty, p.t[P_ATTPROJW] + (size_t)l * C * C, nullptr, N, C, C, st);
        PHASE("bwd: attention");
        bool qkv_bias_done = false;
#if !defined(ENABLE_FP32)
#if defined(ENABLE_CUDNN)
        if (model->cudnn_attention) cudnn_attention_backward(a.dqkv, a.dbtc, la.qkv, la.atty, la.lse, B, T, NH, HS, st);
        else
#endif
        if (model->flash_attention) {
            // the qkv bias gradient too, where the kernels give its partial sums (the tiles they write anyway),
            // and the attention backward's dqkv, the qkv linear's output gradient, in the recipe's quantized
            // form, where the recipe takes it
            const auto dqkv_target = site_output(rc, SITE_ATTENTION_BACKWARD_DQKV, {l, LIN_QKV}, N, 3 * C, HS, true, st);
            qkv_bias_done = flash_attention_backward<Boundaries>(a.dqkv, a.dbtc, la.qkv, la.atty, la.lse, a.flash_scratch,
                                                                 B, T, NH, HS, st, a.qkv_bias_partials, dqkv_target);
            if (qkv_bias_done)
                bias_backward_reduce(g.t[P_QKVB] + (size_t)l * 3 * C, a.qkv_bias_partials, 3 * C,
                                     flash_attention_bias_partial_rows(B, T), st);
        } else
#endif
        attention_backward(a.dqkv, a.dbtc, la.qkv, la.att, a.attn, a.dq, a.dk, a.dv, B, T, NH, HS, st);
        PHASE("bwd: recompute");
        if (la.ln1_shared && recipe_needs_input_in_backward(rc, {l, LIN_QKV}, N)) {
            layernorm_forward<Boundaries>(la.ln1, a.ln1_mean + l * N, a.ln1_rstd + l * N, la.residual_in, ln1w, p.t[P_LN1B] + l * C, N, C, st);
        }
        PHASE("bwd: linear");
        linear_backward(rc, {l, LIN_QKV}, a.dbtc, g.t[P_QKVW] + (size_t)l * 3 * C * C,
                        qkv_bias_done ? nullptr : g.t[P_QKVB] + (size_t)l * 3 * C, a.dqkv,
                        la.ln1, p.t[P_QKVW] + (size_t)l * 3 * C * C, nullptr, N, C, 3 * C, st);
        PHASE("bwd: layernorm");
        layernorm_backward(a.dresidual, a.dresidual_x, g.t[P_LN1W] + l * C, g.t[P_LN1B] + l * C, a.ln_partials, a.dbtc, la.residual_in,
                           ln1w, a.ln1_mean + l * N, a.ln1_rstd + l * N, N, C, st, Boundaries::MLP_RESIDUAL_SCALE,
                           l > 0 ? g.t[P_FCPROJB] + (size_t)(l - 1) * C : nullptr,
                           l > 0 ? ln_backward_target(l - 1, LIN_FCPROJ) : SiteTarget());
        if (l > 0) ln_backward_again(l - 1, LIN_FCPROJ, Boundaries::MLP_RESIDUAL_SCALE);
        if (reduce) gpt_reduce_gradients(model, l);
    }
    // dresidual = d(encoded)
    PHASE("bwd: embedding");
    encoder_backward(g.t[P_WTE], g.t[P_WPE], a.dresidual, model->buckets, model->buckets_dev, model->buckets_pinned,
                     model->buckets_uploaded, B, T, C, st);
    if (reduce) gpt_reduce_gradients(model, -1);
}

inline void gpt_zero_grad(GPT* model) {
    PHASE("zero grad");
    cudaCheck(cudaMemsetAsync(model->grads_memory, 0, model->num_params * sizeof(float), model->stream));
}

// ----------------------------------------------------------------------------------------------
// Optimizer step: global gradient norm (gpt_grad_norm), then clipping and AdamW (gpt_apply_update), or,
// where the trainer skips the step's update (llmc/spike_guard.h), nothing but the recipe's
// recipe_step_skipped (gpt_skip_update). gpt_update does the first two and returns the norm.
struct OptimizerSettings {
    float lr, beta1, beta2, eps, weight_decay, grad_clip;
    uint64_t seed;
};

// The global norm of the step's gradients (all processes' summed gradients). The same on every process:
// with -z 0 each computes it from the same all-reduced gradients, under ZeRO-1 it is the all-reduced sum
// of the pieces' squares. NaN or Inf where a gradient is.
inline float gpt_grad_norm(GPT* model) {
    cudaStream_t st = model->stream;
    MultiGpu* mg = model->mg && model->mg->active ? model->mg : nullptr;
    const ShardLayout& sh = model->shard;
    PHASE("optimizer: grad norm");
    if (mg) multi_gpu_before_compute(mg, st); // the reduced gradients
    if (sh.owners == 1) {
        global_norm_squared(model->norm_dev, model->norm_partials, model->grads_memory, (long long)model->num_params, st);
    } else {
        // ZeRO-1: the norm of this process's pieces (the sums of the reduce-scatter), then the sum over the processes
        cudaCheck(cudaMemsetAsync(model->norm_partials, 0, NORM_BLOCKS * sizeof(float), st));
        for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
            const ShardedTensor& t = sh.tensors[i];
            sum_squares_pieces_kernel<<<NORM_BLOCKS, 512, 0, st>>>(model->norm_partials, model->grads.t[i],
                                                                   (long long)t.shard_size(), (long long)t.piece,
                                                                   (long long)t.row, (long long)t.piece_offset);
            cudaCheckLaunch();
        }
        sum_partials_kernel<<<1, 512, 0, st>>>(model->norm_dev, model->norm_partials, NORM_BLOCKS);
        cudaCheckLaunch();
        if (mg) multi_gpu_all_reduce_sum(mg, model->norm_dev, 1, st, "the gradient norm");
    }
    float norm_sq = 0.0f;
    cudaCheck(cudaMemcpyAsync(&norm_sq, model->norm_dev, sizeof(float), cudaMemcpyDeviceToHost, st));
    cudaCheck(cudaStreamSynchronize(st));
    return sqrtf(norm_sq);
}

// AdamW on the step's gradients, whose global norm is `norm` (gpt_grad_norm)
inline void gpt_apply_update(GPT* model, const OptimizerSettings& o, float norm) {
    cudaStream_t st = model->stream;
    MultiGpu* mg = model->mg && model->mg->active ? model->mg : nullptr;
    const ShardLayout& sh = model->shard;
    // torch.nn.utils.clip_grad_norm_ semantics
    float grad_scale = 1.0f;
    if (o.grad_clip > 0.0f) grad_scale = fminf(1.0f, o.grad_clip / (norm + 1e-6f));
    model->adam_steps += 1;
    PHASE("optimizer: adamw");
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        const ShardedTensor& t = sh.tensors[i];
        // stochastic rounding bits: a pure function of (seed, step, tensor, index), so resuming
        // reproduces them, and so does any sharding of the optimizer state
        uint32_t seed = (uint32_t)mix64(mix64(o.seed, (uint64_t)model->adam_steps), (uint64_t)i);
        adamw_update_pieces<Boundaries>(model->params.t[i], model->master_memory + t.shard_offset, model->grads.t[i],
                                        model->m_memory + t.shard_offset, model->v_memory + t.shard_offset,
                                        (long long)t.shard_size(), (long long)t.piece, (long long)t.row,
                                        (long long)t.piece_offset, o.lr, o.beta1, o.beta2, model->adam_steps, o.eps,
                                        PARAM_DECAYED[i] ? o.weight_decay : 0.0f, grad_scale, seed, st);
    }
    gpt_gather_parameters(model);
    // the recipe's per-step bookkeeping (amax histories -> next scales, say), then whatever it
    // derives from the new weights (their quantized copies), once per optimizer step; state that
    // every process must agree on is combined first (the step's amax, the maximum over all)
    PHASE("optimizer: recipe");
    if (mg) {
        RecipeMaxState ms = recipe_cross_process_max(model->recipe);
        multi_gpu_all_reduce_max_u32(mg, ms.bits, ms.count, st, "the recipe's amax reduction");
    }
    recipe_step_end(model->recipe, st);
    recipe_weights_changed(model->recipe, gpt_linear_weights(model), st);
}

// A skipped update: the parameters, the master weights, AdamW's moments and its step count (the bias
// correction's t counts the updates applied) stay as they are; the recipe drops what the step's forward
// and backward left in its state. Every process takes the same decision, so no collective runs here on
// any of them (neither the amax reduction nor ZeRO-1's parameter all-gather).
inline void gpt_skip_update(GPT* model) {
    PHASE("optimizer: recipe");
    recipe_step_skipped(model->recipe, model->stream);
}

inline float gpt_update(GPT* model, const OptimizerSettings& o) {
    const float norm = gpt_grad_norm(model);
    gpt_apply_update(model, o, norm);
    return norm;
}

// ----------------------------------------------------------------------------------------------
// Checkpoints: the model file (llm.c format, in the build's precision; written by process 0) plus
// one state file per process with its optimizer state and FP32 master weights (all of them, or its
// ZeRO-1 shard), its data position and the recipe's state.
// Every random stream of a run (data shuffling, stochastic rounding, sampling) is a pure function of
// the seed and the step or epoch, so the seed is the whole RNG state a resume needs.
inline void save_checkpoint(const GPT* model, const std::string& dir, int step, const DataLoaderState& data,
                            uint64_t seed, int rank, int num_processes, int grad_accum_steps = 1,
                            const SpikeGuard* spike_guard = nullptr) {
    uint64_t model_xxh64 = 0;
    if (rank == 0) {
        std::vector<floatX> host = gpt_get_params(model);
        model_xxh64 = write_model_file(model_path(dir, step), model->shape, CHECKPOINT_VERSION, host.data(),
                                       host.size() * sizeof(floatX));
    }
    const size_t N = model->shard.shard_elements;
    std::vector<float> m(N), v(N), master(N);
    cudaCheck(cudaMemcpy(m.data(), model->m_memory, N * sizeof(float), cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(v.data(), model->v_memory, N * sizeof(float), cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(master.data(), model->master_memory, N * sizeof(float), cudaMemcpyDeviceToHost));
    int64_t adam_steps = model->adam_steps;
    StateWriter w(step, rank, num_processes, RECIPE_NAME);
    w.add("adam_m", m.data(), N * sizeof(float));
    w.add("adam_v", v.data(), N * sizeof(float));
    w.add("master_weights", master.data(), N * sizeof(float));
    // how the optimizer state is split: (owners of a shard, this one's index); (1, 0) = all of it
    int32_t sharding[2] = {model->shard.owners, model->shard.rank};
    w.add("optimizer_sharding", sharding, sizeof(sharding));
    w.add("dataloader", &data, sizeof(data));
    w.add("adam_steps", &adam_steps, sizeof(adam_steps));
    // the data position only means something for the same micro-batch shape
    int32_t batch_shape[2] = {model->B, model->T};
    w.add("batch_shape", batch_shape, sizeof(batch_shape));
    w.add("seed", &seed, sizeof(seed));
    int32_t accumulation = grad_accum_steps;
    w.add("grad_accum_steps", &accumulation, sizeof(accumulation));
    // the GEMM algorithms autotuning chose, so that a resumed run computes the same bits (matmul.cuh)
    // where the GELU outputs came from (kept from the fc GEMM's epilogue, or recomputed by the GELU
    // kernel: the two round differently in the last bits), so that -r -1 resumes alike
    int32_t recompute = model->recompute;
    w.add("recompute", &recompute, sizeof(recompute));
    const std::vector<MatmulChoice> gemm_choices = matmul_choices();
    if (!gemm_choices.empty()) w.add("gemm_algorithms", gemm_choices.data(), gemm_choices.size() * sizeof(MatmulChoice));
    // (the model file's checksum: llm.c's format has no room for it)
    if (rank == 0) w.add("model_xxh64", &model_xxh64, sizeof(model_xxh64));
    // the windows that judge the next steps' updates and the skip counts (llmc/spike_guard.h)
    if (spike_guard) {
        const std::vector<uint8_t> window = spike_guard->to_bytes();
        w.add_copy(SpikeGuard::kSection, window.data(), window.size());
    }
    recipe_save(model->recipe, w);
    w.write_atomic(state_path(dir, step, rank));
    // read back and verified (its checksum) before the checkpoint may be marked complete
    { StateReader back; back.open(state_path(dir, step, rank)); }
    // the checkpoint is complete once every process has written its state file
    if (model->mg) multi_gpu_barrier(model->mg, model->stream, "the barrier after writing the checkpoint",
                                     std::max(600.0, model->mg->timeout_s));
    if (rank == 0) write_done_marker(dir, step, &model_xxh64);
}

// Checks the checkpoint of `step` in `dir` against the model shape, the batch shape and this recipe
// (another recipe's checkpoint, or this recipe's written under other recipe settings, is refused unless
// convert_recipe: then its model and optimizer state are taken and this recipe's state starts afresh).
// Returns whether the checkpoint's recipe state is taken too (load_checkpoint's take_recipe_state). No GPU
// needed.
inline bool check_checkpoint(const std::string& dir, int step, const ModelShape& shape, int B, int T, uint64_t seed,
                             int rank, int num_processes, bool convert_recipe = false, int zero_owners = 1,
                             int grad_accum_steps = 1, const DataLoader* train_loader = nullptr,
                             const RecipeOptions* recipe_options = nullptr) {
    check_checkpoint_files(dir, step, rank);
    ModelFileInfo info = read_model_header(model_path(dir, step));
    if (info.version != CHECKPOINT_VERSION) {
        input_error("checkpoint %s stores %s parameters, this build keeps them in %s; resume it with a build of its "
                    "precision (%s)", model_path(dir, step).c_str(), info.version == kModelVersionFp32 ? "fp32" : "bf16",
                    PRECISION_NAME, info.version == kModelVersionFp32 ? "make train_gpt_fp32" : "the BF16 builds");
    }
    const ModelShape& c = info.shape;
    if (c.num_layers != shape.num_layers || c.channels != shape.channels || c.num_heads != shape.num_heads ||
        c.max_seq_len != shape.max_seq_len || c.padded_vocab_size != shape.padded_vocab_size || c.vocab_size != shape.vocab_size) {
        input_error("checkpoint %s has shape L=%d C=%d NH=%d maxT=%d Vp=%d, but the model (-e) is L=%d C=%d NH=%d maxT=%d Vp=%d; "
                    "pass the matching -e or another -o", model_path(dir, step).c_str(), c.num_layers, c.channels,
                    c.num_heads, c.max_seq_len, c.padded_vocab_size, shape.num_layers, shape.channels, shape.num_heads,
                    shape.max_seq_len, shape.padded_vocab_size);
    }
    StateReader r;
    r.open(state_path(dir, step, rank));
    if (r.rank() != rank)
        input_error("%s says it is process %d's state, not process %d's; the checkpoint's files were mixed up",
                    state_path(dir, step, rank).c_str(), r.rank(), rank);
    if (r.has("model_xxh64")) {
        uint64_t want = 0;
        r.read("model_xxh64", &want, sizeof(want));
        if (file_xxh64(model_path(dir, step)) != want)
            input_error("%s is corrupt (its checksum, kept in %s, does not match)", model_path(dir, step).c_str(),
                        state_path(dir, step, rank).c_str());
    }
    if (r.recipe() != RECIPE_NAME && !convert_recipe) {
        input_error("checkpoint %s was written by the '%s' recipe, this binary is '%s'; resume it with train_gpt_%s, "
                    "or pass -cr 1 to continue it under '%s' (its recipe state starts afresh)",
                    state_path(dir, step, rank).c_str(), r.recipe().c_str(), RECIPE_NAME, r.recipe().c_str(), RECIPE_NAME);
    }
    int32_t batch_shape[2] = {0, 0};
    r.read("batch_shape", batch_shape, sizeof(batch_shape));
    if (batch_shape[0] != B || batch_shape[1] != T) {
        input_error("checkpoint %s was written with -b %d -t %d, this run has -b %d -t %d; the data position would not "
                    "carry over, so resume with the same -b and -t", state_path(dir, step, rank).c_str(), batch_shape[0],
                    batch_shape[1], B, T);
    }
    uint64_t saved_seed = 0;
    r.read("seed", &saved_seed, sizeof(saved_seed));
    if (saved_seed != seed) {
        input_error("checkpoint %s was written with -sd %llu, this run has -sd %llu; the data order and rounding would "
                    "not carry over, so resume with -sd %llu", state_path(dir, step, rank).c_str(),
                    (unsigned long long)saved_seed, (unsigned long long)seed, (unsigned long long)saved_seed);
    }
    if (r.num_processes() != num_processes) {
        input_error("checkpoint %s was written by %d processes, this run has %d; resume it with -pn %d (each process "
                    "holds its own data position and optimizer state)", state_path(dir, step, rank).c_str(),
                    r.num_processes(), num_processes, r.num_processes());
    }
    int32_t sharding[2] = {1, 0};
    if (r.has("optimizer_sharding")) r.read("optimizer_sharding", sharding, sizeof(sharding));
    if (sharding[0] != zero_owners) {
        input_error("checkpoint %s holds the optimizer state %s, this run wants it %s; resume with -z %d",
                    state_path(dir, step, rank).c_str(),
                    sharding[0] == 1 ? "whole (-z 0)" : strfmt("sharded over %d processes (-z 1)", sharding[0]).c_str(),
                    zero_owners == 1 ? "whole (-z 0)" : strfmt("sharded over %d processes (-z 1)", zero_owners).c_str(),
                    sharding[0] == 1 ? 0 : 1);
    }
    int32_t accumulation = 1;
    if (r.has("grad_accum_steps")) r.read("grad_accum_steps", &accumulation, sizeof(accumulation));
    if (accumulation != grad_accum_steps) {
        input_error("checkpoint %s was written with %d accumulation micro-steps per step, this run has %d; the data "
                    "position would not carry over, so resume with the same -d", state_path(dir, step, rank).c_str(),
                    accumulation, grad_accum_steps);
    }
    // the spike windows (a checkpoint written before they were kept has none: the windows start empty)
    if (r.has(SpikeGuard::kSection)) {
        std::vector<uint8_t> window(r.size_of(SpikeGuard::kSection));
        r.read(SpikeGuard::kSection, window.data(), window.size());
        SpikeGuard g;
        g.from_bytes(window.data(), window.size(), state_path(dir, step, rank));
    }
    // the optimizer state is this model's (whole state: one FP32 value per parameter and section)
    if (zero_owners == 1) {
        const size_t want = num_parameters(shape) * sizeof(float);
        for (const char* name : {"adam_m", "adam_v", "master_weights"}) {
            if (r.size_of(name) != want)
                input_error("%s: section '%s' holds %zu bytes, this model's needs %zu; the file does not belong to this "
                            "checkpoint", state_path(dir, step, rank).c_str(), name, r.size_of(name), want);
        }
    }
    // the recipe's state against this run's options (a checkpoint of another recipe, taken with -cr 1, has none;
    // one of this recipe under other settings, taken with -cr 1, is not taken)
    bool take_recipe_state = r.recipe() == RECIPE_NAME;
    if (recipe_options && take_recipe_state) {
        try {
            check_recipe_checkpoint(*recipe_options, shape.num_layers, r);
        } catch (const InputError&) {
            if (!convert_recipe) throw;
            take_recipe_state = false;
        }
    }
    if (train_loader) {
        DataLoaderState data;
        r.read("dataloader", &data, sizeof(data));
        try { train_loader->check_position(data); }
        catch (const InputError& e) { input_error("checkpoint %s: %s", state_path(dir, step, rank).c_str(), e.what()); }
    }
    return take_recipe_state;
}

// The -r a checkpoint was written with, or -1 (a checkpoint from before it was recorded)
inline int checkpoint_recompute(const std::string& dir, int step, int rank) {
    StateReader r;
    r.open(state_path(dir, step, rank));
    int32_t recompute = -1;
    if (r.has("recompute")) r.read("recompute", &recompute, sizeof(recompute));
    return recompute;
}

// take_recipe_state: false when check_checkpoint said the recipe's state starts afresh (-cr 1)
inline void load_checkpoint(GPT* model, const std::string& dir, int step, DataLoaderState* data, int rank,
                            SpikeGuard* spike_guard = nullptr, bool take_recipe_state = true) {
    const std::string mpath = model_path(dir, step);
    ModelFileInfo info = read_model_header(mpath);
    const size_t N = model->num_params, NS = model->shard.shard_elements;
    StateReader r;
    r.open(state_path(dir, step, rank));
    std::vector<float> buf(NS);
    r.read("master_weights", buf.data(), NS * sizeof(float));
    cudaCheck(cudaMemcpy(model->master_memory, buf.data(), NS * sizeof(float), cudaMemcpyHostToDevice));
    r.read("adam_m", buf.data(), NS * sizeof(float));
    cudaCheck(cudaMemcpy(model->m_memory, buf.data(), NS * sizeof(float), cudaMemcpyHostToDevice));
    r.read("adam_v", buf.data(), NS * sizeof(float));
    cudaCheck(cudaMemcpy(model->v_memory, buf.data(), NS * sizeof(float), cudaMemcpyHostToDevice));
    r.read("dataloader", data, sizeof(*data));
    int64_t adam_steps = 0;
    r.read("adam_steps", &adam_steps, sizeof(adam_steps));
    model->adam_steps = (int)adam_steps;
    if (spike_guard) {
        spike_guard->clear_state();
        if (r.has(SpikeGuard::kSection)) {
            std::vector<uint8_t> window(r.size_of(SpikeGuard::kSection));
            r.read(SpikeGuard::kSection, window.data(), window.size());
            spike_guard->from_bytes(window.data(), window.size(), state_path(dir, step, rank));
        }
    }
    // the parameters exactly as they were (not re-rounded from the master weights)
    if (info.version != CHECKPOINT_VERSION) {
        input_error("checkpoint %s stores %s parameters, this build is %s", mpath.c_str(),
                    info.version == 3 ? "fp32" : "bf16", PRECISION_NAME);
    }
    std::vector<floatX> host(N);
    read_model_params(mpath, info, host.data(), N * sizeof(floatX));
    cudaCheck(cudaMemcpy(model->params_memory, host.data(), N * sizeof(floatX), cudaMemcpyHostToDevice));
    // the recipe's state (a checkpoint of another recipe, allowed by -cr 1, has none for this one; one of this
    // recipe under other settings, allowed by -cr 1, has one that means nothing here)
    if (r.recipe() == RECIPE_NAME && take_recipe_state) recipe_load(model->recipe, r);
    if (r.has("gemm_algorithms")) {
        if (r.size_of("gemm_algorithms") % sizeof(MatmulChoice) == 0) {
            std::vector<MatmulChoice> gemm_choices(r.size_of("gemm_algorithms") / sizeof(MatmulChoice));
            r.read("gemm_algorithms", gemm_choices.data(), gemm_choices.size() * sizeof(MatmulChoice));
            matmul_set_choices(gemm_choices.data(), gemm_choices.size());
        } else {
            // (another build's record layout: the run goes on, but with freshly chosen algorithms)
            fprintf(stderr, "warning: %s: the GEMM algorithm choices were written by another build and are ignored; "
                    "the resumed run may differ from the original in the last bits\n", state_path(dir, step, rank).c_str());
        }
    }
    recipe_weights_changed(model->recipe, gpt_linear_weights(model), model->stream);
    cudaCheck(cudaDeviceSynchronize());
}

// ----------------------------------------------------------------------------------------------
// Sampling: generate tokens one at a time from <|endoftext|>, full forward pass per token (B=1).
inline std::vector<int> gpt_sample(GPT* model, int num_tokens, int eot, uint64_t seed) {
    const int T = model->T, Vp = model->shape.padded_vocab_size, V = model->shape.vocab_size;
    num_tokens = std::min(num_tokens, T - 1);
    std::vector<int> tokens(T, eot);
    std::vector<floatX> row(Vp);
    std::vector<float> probs(V);
    Rng rng(seed);
    for (int t = 1; t <= num_tokens; t++) {
        gpt_forward(model, tokens.data(), nullptr, 1, T);
        cudaCheck(cudaMemcpy(row.data(), model->acts.logits + (size_t)(t - 1) * Vp, Vp * sizeof(floatX), cudaMemcpyDeviceToHost));
        // what the classifier's softmax reads (boundaries.h): the LM head's output through the
        // recipe's logits boundary, times its logit scale
        for (int i = 0; i < V; i++) probs[i] = Boundaries::LOGIT_SCALE * Boundaries::logits((float)row[i]);
        float maxv = -INFINITY;
        for (int i = 0; i < V; i++) maxv = fmaxf(maxv, probs[i]);
        double sum = 0.0;
        for (int i = 0; i < V; i++) { probs[i] = expf(probs[i] - maxv); sum += probs[i]; }
        double coin = rng.next_float01() * sum, cdf = 0.0;
        int next = V - 1;
        for (int i = 0; i < V; i++) { cdf += probs[i]; if (coin < cdf) { next = i; break; } }
        tokens[t] = next;
    }
    return std::vector<int>(tokens.begin() + 1, tokens.begin() + 1 + num_tokens);
}

inline void gpt_free(GPT* model) {
    // the process exits right after; the CUDA context releases everything
    (void)model;
}

// ----------------------------------------------------------------------------------------------
// Helpers for main: the GPU's peak BF16 rate (for MFU), a human time, and LLMC_TEST_NAN_AT's NaN.

// one quiet NaN written at dst (device memory), in the stream's order (LLMC_TEST_NAN_AT)
template <class T>
inline void inject_nan(T* dst, cudaStream_t stream) {
    static const T nan_value = (T)NAN;
    cudaCheck(cudaMemcpyAsync(dst, &nan_value, sizeof(T), cudaMemcpyHostToDevice, stream));
}

inline double peak_bf16_flops(const cudaDeviceProp& prop) {
    std::string name = prop.name;
    if (name.find("H100") != std::string::npos || name.find("H200") != std::string::npos || name.find("H800") != std::string::npos)
        return 989.4e12; // dense BF16, SXM
    if (name.find("A100") != std::string::npos || name.find("A800") != std::string::npos) return 312e12;
    return -1.0; // unknown: MFU is not printed
}

inline std::string human_seconds(double s) {
    if (s < 0) s = 0;
    int h = (int)(s / 3600), m = (int)(s / 60) % 60, sec = (int)s % 60;
    return h > 0 ? strfmt("%dh%02dm", h, m) : strfmt("%dm%02ds", m, sec);
}

#ifndef TESTING
// ----------------------------------------------------------------------------------------------
int main(int argc, char** argv) {
    // 1. Everything that can be wrong with the flags and the input files, before the GPU.
    TrainConfig cfg;
    // the recipe's flags: the parser fills recipe_options through their rows; -h and the usage print the
    // rows over recipe_defaults
    RecipeOptions recipe_options, recipe_defaults;
    RecipeFlags recipe_flags{RECIPE_NAME, {}}, recipe_usage{RECIPE_NAME, {}};
    append_recipe_flags(recipe_flags.rows, recipe_options);
    append_recipe_flags(recipe_usage.rows, recipe_defaults);
    ModelShape shape;
    bool from_checkpoint_file = false;
    ModelFileInfo init_info;
    std::unique_ptr<DataLoader> train_loader, val_loader;
    std::vector<EvalExample> hellaswag_examples; // -h 1: the eval file's examples, packed into batches of -b rows
    std::vector<EvalBatch> hellaswag_batches;
    Tokenizer tokenizer;
    int resume_step = -1;
    bool take_recipe_state = true; // (check_checkpoint's answer)
    int recompute_from_checkpoint = -1; // -r -1 on resume: the -r the checkpoint was written with
    int local_rank = -1;
    NanInjections test_nan; // LLMC_TEST_NAN_AT (tests only)
    try {
        cfg = parse_args(argc, argv, recipe_flags);
        local_rank = resolve_processes(cfg, std::getenv); // -pn / -pr, else the launcher's environment
        validate_config(cfg);
        check_recipe_options(recipe_options, !cfg.output_dir.empty());
        if (!cfg.recipe_check.empty() && cfg.recipe_check != RECIPE_NAME && cfg.recipe_check != RECIPE_CHECK_ALIAS) {
            input_error("-Q %s: this binary is the '%s' recipe (train_gpt_%s)", cfg.recipe_check.c_str(), RECIPE_NAME, RECIPE_NAME);
        }
        from_checkpoint_file = !parse_model_descriptor(cfg.model, &shape);
        if (!from_checkpoint_file) check_seq_len(cfg, shape);
        if (!cfg.init_server.empty()) { std::string host; int port; split_host_port(cfg.init_server, &host, &port); }
    } catch (const InputError& e) {
        // a bad flag: the usage, then the reason last so that it is what the user sees
        fprintf(stderr, "%s\nerror: %s\n", usage(recipe_usage).c_str(), e.what());
        return 1;
    }
    // -o: one run per directory, one trainer at a time (process 0 holds its lock until the process ends)
    OutputDirLock output_lock;
    RemoveIfUnused made_dirs; // (declared after the lock, so it goes first: the lock file before its directory)
    const bool master_process = cfg.process_rank == 0; // prints, writes main.log and the model files, samples
    try {
        if (from_checkpoint_file) {
            init_info = read_model_header(cfg.model);
            shape = init_info.shape;
            check_seq_len(cfg, shape);
        }
        check_bf16_layers_for_model(recipe_options, shape.num_layers);
        // the environment switches, the recipe's and the trainer's
        check_recipe_environment(recipe_options);
        check_env_choice("LLMC_PROFILE", {"0", "1", "2"}, "0 (off), 1 (the per-phase GPU time table) or 2 (with the linears "
                         "split into their GEMMs)");
        check_env_choice("LLMC_CUDNN_DETERMINISTIC", {"0", "1"}, "0 (cuDNN's faster attention backward) or 1 (its "
                         "deterministic one)");
        test_nan = parse_test_nan_at(std::getenv("LLMC_TEST_NAN_AT"));
        if (!cfg.init_dir.empty()) {
            struct stat st;
            if (stat(cfg.init_dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
                input_error("-pf %s: not a directory; the processes meet in a directory all of them see, made before the run",
                            cfg.init_dir.c_str());
        }
        train_loader.reset(new DataLoader(cfg.train_pattern, "-i", cfg.B, cfg.T, cfg.process_rank, cfg.num_processes,
                                          true, cfg.seed, shape.vocab_size, cfg.grad_accum_steps));
        if (!cfg.val_pattern.empty() && cfg.val_every > 0) {
            val_loader.reset(new DataLoader(cfg.val_pattern, "-j", cfg.B, cfg.T, cfg.process_rank, cfg.num_processes,
                                            false, cfg.seed, shape.vocab_size));
        }
        // every token id now where the data is small enough to read at start-up (up to 1G tokens, on 8
        // threads); larger data is checked shard by shard as training reaches it
        train_loader->check_all_tokens(1ll << 30, 8);
        if (val_loader) val_loader->check_all_tokens(1ll << 30, 8);
        // -h 1: the HellaSwag file, read whole and checked (every token id, every example within -t, -b rows)
        if (cfg.hellaswag)
            hellaswag_examples = load_hellaswag(cfg.hellaswag_path, shape.vocab_size, cfg.T, cfg.B, &hellaswag_batches);
        // ZeRO-1 cuts every parameter block into one piece per process (zero.h)
        const bool sharded = cfg.num_processes > 1 && cfg.zero_stage == 1;
        if (sharded && shape.channels % cfg.num_processes != 0)
            input_error("-z 1: ZeRO-1 splits every parameter block into %d equal pieces, which needs -pn %d to divide "
                        "the channels C = %d; use -z 0 or another number of processes", cfg.num_processes,
                        cfg.num_processes, shape.channels);
        if (!cfg.output_dir.empty()) {
            const std::string& dir = cfg.output_dir;
            check_output_dir_path(dir);
            struct stat st;
            if (master_process && stat(dir.c_str(), &st) == 0) output_lock.acquire(dir);
            // a new run never mixes with an old one (their main.log lines, same-step checkpoints and -nk's
            // pruning would), so -y 0 into a directory holding a run is refused unless -ow 1 replaces it
            const RunFiles run = run_files(dir);
            if (!cfg.resume && !cfg.overwrite && !run.empty()) {
                const std::string held = run.checkpoint_files.empty()
                    ? std::string("main.log")
                    : strfmt("%smain.log, %zu checkpoint file(s)", run.has_log ? "" : "no ", run.checkpoint_files.size());
                input_error("-o %s holds a run already (%s); resume it with -y 1, delete it and start afresh with -ow 1, "
                            "or choose another -o", dir.c_str(), held.c_str());
            }
            if (cfg.resume) {
                resume_step = find_latest_checkpoint(dir);
                if (resume_step >= 0) take_recipe_state = check_checkpoint(dir, resume_step, shape, cfg.B, cfg.T, cfg.seed, cfg.process_rank,
                                                     cfg.num_processes, cfg.convert_recipe != 0, sharded ? cfg.num_processes : 1,
                                                     cfg.grad_accum_steps, train_loader.get(), &recipe_options);
                // -r -1 resumes with the checkpoint's choice (the same bits); an explicit -r is taken as given
                if (resume_step >= 0 && cfg.recompute < 0) {
                    recompute_from_checkpoint = checkpoint_recompute(dir, resume_step, cfg.process_rank);
                    if (recompute_from_checkpoint >= 0) cfg.recompute = recompute_from_checkpoint;
                }
            }
            // the last check: -o can be made and written to (made here, it goes again if the run does not start)
            made_dirs = RemoveIfUnused(ensure_output_dir(dir));
            if (master_process && !output_lock.held()) output_lock.acquire(dir);
        }
    } catch (const InputError& e) {
        fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
    if (cfg.sample_every > 0 && master_process) {
        try { tokenizer.load(cfg.tokenizer_path); }
        catch (const InputError& e) { fprintf(stderr, "warning: %s; samples will print token ids\n", e.what()); }
    }
    const int B = cfg.B, T = cfg.T;
    const long long tokens_per_step = (long long)B * T * cfg.num_processes * cfg.grad_accum_steps;
    int max_steps = cfg.max_steps;
    // (a chunk of the training loader is one optimizer step: dataloader.h)
    if (max_steps < 0) max_steps = (int)std::max<int64_t>(1, train_loader->batches_per_epoch());

    // 2. The GPU.
    int device_count = 0;
    if (cudaGetDeviceCount(&device_count) != cudaSuccess || device_count == 0) {
        fprintf(stderr, "error: no CUDA device found; the trainer needs an NVIDIA GPU (without one, make test runs the CPU tests)\n");
        return 1;
    }
    int gpu = 0;
    try {
        gpu = choose_gpu(cfg, local_rank, device_count);
        // every check has passed, the GPU's too: only now is the old run deleted (-ow 1)
        if (!cfg.output_dir.empty() && master_process && cfg.overwrite) remove_run_files(cfg.output_dir);
    } catch (const InputError& e) { fprintf(stderr, "error: %s\n", e.what()); return 1; }
    cudaCheck(cudaSetDevice(gpu));
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, gpu));
    // the other processes (nothing to join for a one-process run without -pf / -ps)
    MultiGpu mg;
    try { multi_gpu_init(&mg, cfg, gpu); }
    catch (const InputError& e) { fprintf(stderr, "error: process %d: %s\n", cfg.process_rank, e.what()); return 1; }
    if (mg.active) { // what a recipe may ask of the other processes inside a step (recipe_api.h)
        g_cross_process.ctx = &mg;
        g_cross_process.broadcast_u32 = [](void* ctx, uint32_t* x, size_t n, cudaStream_t st) {
            multi_gpu_broadcast_u32((MultiGpu*)ctx, x, n, st, "a recipe's broadcast from process 0");
        };
        g_cross_process.all_reduce_max_u32 = [](void* ctx, uint32_t* x, size_t n, cudaStream_t st) {
            multi_gpu_all_reduce_max_u32((MultiGpu*)ctx, x, n, st, "a recipe's maximum over the processes");
        };
        g_cross_process.all_reduce_sum_f64 = [](void* ctx, double* x, size_t n, cudaStream_t st) {
            multi_gpu_all_reduce_sum_f64((MultiGpu*)ctx, x, n, st, "a recipe's sum over the processes");
        };
        g_cross_process.all_gather_pieces = [](void* ctx, uint8_t* const* bufs, const size_t* bytes, int count, cudaStream_t st) {
            multi_gpu_all_gather_pieces((MultiGpu*)ctx, bufs, bytes, count, st, "a recipe's all-gather of its pieces");
        };
    }
    matmul_init();
    matmul_set_autotune(cfg.gemm_autotune == 1);
    g_profiler.init(0);

    GPT model;
    // ZeRO-1: one owner per process; -z 0 (or one process): this process owns all, as owner 0 of 1
    const int owners = mg.zero_stage == 1 ? mg.world : 1;
    gpt_build(&model, shape, owners > 1 ? mg.rank : 0, owners);
    model.mg = &mg;
    // (the recipe's setup checks its options and its environment variables)
    try { gpt_allocate(&model, B, T, cfg.recompute, recipe_options, recipe_context_of_run(cfg.seed, cfg.recipe_check)); }
    catch (const InputError& e) { fprintf(stderr, "error: %s\n", e.what()); return 1; }
    // which updates are skipped (llmc/spike_guard.h): its windows come from the checkpoint on resume
    SpikeGuard spike_guard;
    spike_guard.loss_z = cfg.skip_loss_z;
    spike_guard.grad_z = cfg.skip_grad_z;
    DataLoaderState resume_data;
    if (resume_step >= 0) {
        try { load_checkpoint(&model, cfg.output_dir, resume_step, &resume_data, cfg.process_rank, &spike_guard,
                              take_recipe_state); }
        catch (const InputError& e) { fprintf(stderr, "error: %s\n", e.what()); return 1; }
        train_loader->restore(resume_data);
    } else if (from_checkpoint_file) {
        gpt_set_params(&model, read_params_fp32(cfg.model, init_info, model.num_params));
    } else {
        gpt_set_params(&model, gpt_random_init(&model, cfg.seed));
    }
    const int start_step = resume_step >= 0 ? resume_step : 0;

    // banner
    const double flops_per_token = 6.0 * model.num_params + 6.0 * shape.num_layers * shape.channels * T;
    const double peak = peak_bf16_flops(prop);
    size_t free_b, total_b;
    cudaCheck(cudaMemGetInfo(&free_b, &total_b));
    // (the optimizer state: FP32 master weights and the two AdamW moments, 12 bytes per parameter owned)
    const double optimizer_gib = 12.0 * model.shard.shard_elements / 1073741824.0;
    if (master_process) {
    printf("+-----------------------+----------------------------------------------------+\n");
    printf("| train_gpt             | recipe %-10s precision %-24s |\n", RECIPE_NAME, PRECISION_NAME);
    printf("| device                | %-50s |\n", prop.name);
    printf("| model                 | %-50s |\n", cfg.model.c_str());
    printf("| L, C, NH, maxT, Vp    | %-50s |\n", strfmt("%d, %d, %d, %d, %d", shape.num_layers, shape.channels,
                                                        shape.num_heads, shape.max_seq_len, shape.padded_vocab_size).c_str());
    printf("| parameters            | %-50zu |\n", model.num_params);
    printf("| B, T, accumulation    | %-50s |\n", strfmt("%d, %d, %d (%lld tokens per step)", B, T, cfg.grad_accum_steps, tokens_per_step).c_str());
    printf("| train data            | %-50s |\n", strfmt("%zu shard(s), %lld tokens", train_loader->num_shards(), (long long)train_loader->total_tokens()).c_str());
    printf("| steps                 | %-50s |\n", strfmt("%d (from %d)", max_steps, start_step).c_str());
    printf("| lr, schedule, warmup  | %-50s |\n", strfmt("%g, %s to %g x, %d", cfg.learning_rate, cfg.lr_schedule.c_str(), cfg.final_lr_fraction, cfg.warmup_iterations).c_str());
    printf("| weight decay, clip    | %-50s |\n", strfmt("%g, %g", cfg.weight_decay, cfg.grad_clip).c_str());
    auto z_rule = [](float z) { return z > 0 ? strfmt("z > %g", z) : std::string("off"); };
    printf("| skipped updates       | %-50s |\n", strfmt("NaN/Inf; loss %s, norm %s; window %d", z_rule(cfg.skip_loss_z).c_str(),
                                                        z_rule(cfg.skip_grad_z).c_str(), kSpikeWindow).c_str());
    printf("| recompute, seed       | %-50s |\n", strfmt("%d%s, %llu", model.recompute, model.recompute_auto ? " (auto)"
                                                        : recompute_from_checkpoint >= 0 ? " (the checkpoint's)" : "",
                                                        (unsigned long long)cfg.seed).c_str());
    printf("| attention             | %-50s |\n", model.cudnn_attention ? "cuDNN SDPA (USE_CUDNN=1)"
                                                        : model.flash_attention ? "flash (llmc/flash_attention.cuh)"
                                                        : "materialized (llmc/attention.cuh)");
    printf("| GEMM algorithms       | %-50s |\n", cfg.gemm_autotune ? "fastest of cuBLASLt's candidates (-ga 1)" : "cuBLASLt heuristic's first (-ga 0)");
    printf("| recipe                | %-50s |\n", recipe_describe(model.recipe).substr(0, 50).c_str());
    printf("| processes, gradients  | %-50s |\n", !mg.active ? "1 (no NCCL)" : strfmt("%d, %s", mg.world,
           mg.zero_stage == 1 ? "ZeRO-1 (reduce-scatter, sharded AdamW)" : "all-reduce (-z 0)").c_str());
    printf("| optimizer state / GPU | %-50s |\n", strfmt("%.3f GiB (%zu of %zu parameters)", optimizer_gib,
           model.shard.shard_elements, model.num_params).c_str());
    printf("| GPU memory in use     | %-50s |\n", strfmt("%.2f GiB of %.2f GiB", (total_b - free_b) / 1073741824.0, total_b / 1073741824.0).c_str());
    printf("+-----------------------+----------------------------------------------------+\n");
    if (test_nan.active()) printf("warning: LLMC_TEST_NAN_AT is set: NaNs are injected on purpose (a test switch)\n");
    fflush(stdout);
    }

    // main.log: always appended to (a new run starts in a directory without one: -ow 1 deleted the old)
    FILE* logfile = nullptr;
    const std::string log_path = cfg.output_dir + "/main.log";
    // (a write error of the log ends the run with one line; the newest checkpoint stays)
    auto log_written = [&]() {
        if (!logfile || (fflush(logfile) == 0 && !ferror(logfile))) return true;
        fprintf(stderr, "error: cannot write %s: %s; the run stops here (resume it with -y 1 once there is room)\n",
                log_path.c_str(), strerror(errno));
        return false;
    };
    if (!cfg.output_dir.empty() && master_process) {
        logfile = fopen(log_path.c_str(), "a");
        if (!logfile) { fprintf(stderr, "error: cannot open %s for writing: %s\n", log_path.c_str(), strerror(errno)); return 1; }
        fprintf(logfile, "# recipe:%s precision:%s model:%s params:%zu B:%d T:%d tokens_per_step:%lld seed:%llu\n", RECIPE_NAME,
                PRECISION_NAME, cfg.model.c_str(), model.num_params, B, T, tokens_per_step, (unsigned long long)cfg.seed);
        fprintf(logfile, "# %s\n", recipe_describe(model.recipe).c_str());
        if (mg.active) fprintf(logfile, "# processes:%d zero:%d optimizer_state_gib_per_gpu:%.4f\n", mg.world, mg.zero_stage, optimizer_gib);
        if (!log_written()) return 1;
    }

    made_dirs.keep(); // (the run has started: -o stays, whatever happens from here)

    LRSchedule schedule;
    schedule.kind = parse_schedule_kind(cfg.lr_schedule);
    schedule.base_lr = cfg.learning_rate;
    schedule.warmup = cfg.warmup_iterations;
    schedule.total_steps = max_steps;
    schedule.final_fraction = cfg.final_lr_fraction;

    std::vector<int> inputs(B * T), targets(B * T);
    // the next batch; a shard found bad when training first reaches it ends the run with one line (the data
    // larger than the start-up check reads), and its newest checkpoint stays
    auto fetch_batch = [&](DataLoader* loader) {
        try { loader->next_batch(inputs.data(), targets.data()); return true; }
        catch (const InputError& e) {
            fprintf(stderr, "error: process %d: %s; the run stops here (its newest checkpoint is kept: fix the data and "
                    "resume with -y 1)\n", cfg.process_rank, e.what());
            return false;
        }
    };
    double total_train_seconds = 0.0;
    int timed_steps = 0;
    for (int step = start_step; step <= max_steps; step++) {
        const bool last_step = step == max_steps;
        mg.step = step;
        // validation
        if (val_loader && (step % cfg.val_every == 0 || last_step)) {
            val_loader->reset();
            int64_t batches = val_loader->batches_per_epoch();
            if (cfg.val_max_steps > 0) batches = std::min<int64_t>(batches, cfg.val_max_steps);
            double sum = 0.0;
            for (int64_t i = 0; i < batches; i++) {
                if (!fetch_batch(val_loader.get())) return 1;
                sum += gpt_forward_loss(&model, inputs.data(), targets.data(), B, T);
            }
            // (each process evaluated its own slices of the same chunks: the mean of the means)
            float val_loss = (float)multi_gpu_mean(&mg, sum / batches, model.stream, "the validation loss");
            if (master_process) printf("val loss %.6f (step %d, %lld batches)\n", val_loss, step, (long long)batches * mg.world);
            if (logfile) fprintf(logfile, "s:%d tel:%.6f\n", step, val_loss);
            if (!log_written()) return 1;
        }
        // HellaSwag (-h 1) at the validation steps: each process scores its share of the batches, the counts are
        // summed (the same whatever the number of processes: llmc/hellaswag.h)
        if (cfg.hellaswag && (step % cfg.val_every == 0 || last_step)) {
            const EvalCounts mine = score_eval_examples(hellaswag_examples, hellaswag_batches, B, T, cfg.process_rank,
                cfg.num_processes, [&](const int* in, const int* tg, float* losses) {
                    gpt_forward_token_losses(&model, in, tg, B, T, losses);
                });
            double counts[2] = {(double)mine.correct, (double)mine.examples};
            multi_gpu_sum_host(&mg, counts, 2, model.stream, "the HellaSwag counts");
            const double accuracy = counts[0] / counts[1];
            if (master_process) printf("HellaSwag: %.0f/%.0f = %.4f (step %d)\n", counts[0], counts[1], accuracy, step);
            if (logfile) fprintf(logfile, "s:%d eval:%.6f\n", step, accuracy);
            if (!log_written()) return 1;
        }
        // sample
        if (master_process && cfg.sample_every > 0 && cfg.gen_tokens > 0 && step > start_step &&
            (step % cfg.sample_every == 0 || last_step)) {
            int eot = tokenizer.loaded() ? (int)tokenizer.eot_token() : 50256;
            std::vector<int> gen = gpt_sample(&model, cfg.gen_tokens, eot, mix64(cfg.seed, (uint64_t)step));
            printf("generating:\n---\n");
            for (int tok : gen) {
                if (tokenizer.loaded()) printf("%s", printable(tokenizer.decode(tok)).c_str());
                else printf("%d ", tok);
            }
            printf("\n---\n");
        }
        // checkpoint (the state after `step` optimizer steps)
        if (!cfg.output_dir.empty() && step > start_step &&
            ((cfg.checkpoint_every > 0 && step % cfg.checkpoint_every == 0) || last_step)) {
            try {
                save_checkpoint(&model, cfg.output_dir, step, train_loader->state(), cfg.seed, cfg.process_rank,
                                cfg.num_processes, cfg.grad_accum_steps, &spike_guard);
                if (master_process) prune_checkpoints(cfg.output_dir, cfg.checkpoint_keep);
            } catch (const std::exception& e) {
                fprintf(stderr, "error: process %d: %s\n", cfg.process_rank, e.what());
                return 1;
            }
            if (master_process) printf("checkpoint written: %s\n", model_path(cfg.output_dir, step).c_str());
        }
        if (last_step) break;

        // one optimizer step over grad_accum_steps micro-batches
        auto t0 = std::chrono::steady_clock::now();
        g_profiler.step_begin();
        const bool log_quantization = recipe_begin_step(model.recipe, step) && logfile;
        gpt_zero_grad(&model);
        // the mean over the step's tokens, all processes' together (their gradients are summed)
        const float dloss = 1.0f / (float)tokens_per_step;
        for (int micro = 0; micro < cfg.grad_accum_steps; micro++) {
            recipe_begin_micro_step(model.recipe, train_loader->next_slice());
            if (!fetch_batch(train_loader.get())) return 1;
            gpt_forward(&model, inputs.data(), targets.data(), B, T, true, dloss);
            // LLMC_TEST_NAN_AT=grad:STEP: a NaN in the gradient the backward pass starts from (process 0's
            // first micro-step): it reaches the recipe's backward GEMMs, every gradient and the norm
            if (micro == 0 && master_process && test_nan.due(NAN_IN_GRAD, step)) inject_nan(model.acts.dbtc, model.stream);
            // (the last micro-step hands each layer's gradients to the other processes as it finishes)
            gpt_backward(&model, B, T, micro == cfg.grad_accum_steps - 1);
        }
        // LLMC_TEST_NAN_AT=loss:STEP: process 0's loss sum, before the sum over the processes
        if (master_process && test_nan.due(NAN_IN_LOSS, step)) inject_nan(model.loss_sum_dev, model.stream);
        multi_gpu_all_reduce_sum(&mg, model.loss_sum_dev, 1, model.stream, "the training loss");
        const float train_loss = gpt_read_loss(&model, (long long)B * T * cfg.grad_accum_steps * mg.world);
        // quantization telemetry of this step (before the optimizer step moves the scales on)
        if (log_quantization) recipe_log_telemetry(model.recipe, logfile, step);
        // The update, or not: judged from the all-reduced loss and the global norm, the same on every
        // process. A skipped step still moves the step counter, the learning-rate schedule and the data on
        // (as llm.c); AdamW's own step count (bias correction, rounding seeds) counts applied updates.
        OptimizerSettings opt{schedule.lr_at(step), cfg.beta1, cfg.beta2, cfg.eps, cfg.weight_decay, cfg.grad_clip, cfg.seed};
        const float norm = gpt_grad_norm(&model);
        const SkipDecision skip = spike_guard.judge(train_loss, norm);
        if (skip.skip()) gpt_skip_update(&model);
        else gpt_apply_update(&model, opt, norm);
        spike_guard.record(skip, train_loss, norm);
        cudaCheck(cudaDeviceSynchronize());
        double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        g_profiler.step_end();
        if (step == start_step) g_profiler.reset(); // the first step warms up
        if (step > start_step) { total_train_seconds += seconds; timed_steps++; }
        const double tok_s = tokens_per_step / seconds;
        // tok_s is the whole job's (all processes' tokens); MFU is per GPU, against one GPU's peak
        const double mfu = peak > 0 ? 100.0 * flops_per_token * tok_s / (peak * mg.world) : -1.0;
        const double avg = timed_steps > 0 ? total_train_seconds / timed_steps : seconds;
        // a skipped step: "s:STEP skip:REASON loss:... lr:... norm:..." (with z:... for a spike) in main.log,
        // where an applied one has "s:STEP trl:...": the train-loss curve has only the steps that trained
        const std::string skip_z = std::isfinite(skip.z) ? strfmt(" z:%.4f", skip.z) : std::string();
        if (master_process)
        printf("step %5d/%d | loss %.6f | norm %7.4f | lr %.2e | %8.2f ms | %9.0f tok/s | MFU %s | ETA %s%s\n", step + 1,
               max_steps, train_loss, norm, opt.lr, seconds * 1000.0, tok_s,
               mfu >= 0 ? strfmt("%5.1f%%", mfu).c_str() : "n/a", human_seconds(avg * (max_steps - step - 1)).c_str(),
               skip.skip() ? strfmt(" | update skipped: %s%s", SKIP_REASON_NAMES[skip.reason], skip_z.c_str()).c_str() : "");
        fflush(stdout);
        if (logfile && skip.skip())
            fprintf(logfile, "s:%d skip:%s loss:%.6f lr:%.6e norm:%.6f%s\n", step, SKIP_REASON_NAMES[skip.reason],
                    train_loss, opt.lr, norm, skip_z.c_str());
        else if (logfile) fprintf(logfile, "s:%d trl:%.6f lr:%.6e norm:%.6f\n", step, train_loss, opt.lr, norm);
        if (!log_written()) return 1;
        if (spike_guard.stuck()) {
            fprintf(stderr, "error: the loss or the gradient norm has not been finite for %d steps in a row (steps %d to %d; "
                    "each update was skipped); lower -l or check the data\n", kMaxNonFiniteInARow,
                    step + 2 - kMaxNonFiniteInARow, step + 1);
            return 1;
        }
    }
    multi_gpu_finish(&mg);
    if (master_process) {
        g_profiler.report();
        if (MATMUL_COMPUTE != CUBLAS_COMPUTE_32F) {
            printf("cuBLASLt compute type %s: %zu GEMM shapes, %d of them fell back to CUBLAS_COMPUTE_32F\n",
                   MATMUL_COMPUTE == CUBLAS_COMPUTE_32F_FAST_16BF ? "CUBLAS_COMPUTE_32F_FAST_16BF" : "other",
                   g_matmul_plans.size(), g_matmul_compute_fallbacks);
        }
        // (the counts are the whole run's, steps before a resume included: they are in the checkpoint)
        const int64_t* sk = spike_guard.skipped;
        const std::string skipped = strfmt("updates skipped: %lld of %d steps (nan-loss %lld, nan-grad %lld, loss-spike %lld, "
                                           "grad-spike %lld)", (long long)spike_guard.total_skipped(), max_steps,
                                           (long long)sk[SKIP_NAN_LOSS], (long long)sk[SKIP_NAN_GRAD],
                                           (long long)sk[SKIP_LOSS_SPIKE], (long long)sk[SKIP_GRAD_SPIKE]);
        printf("%s\n", skipped.c_str());
        if (logfile) fprintf(logfile, "# %s\n", skipped.c_str());
        if (timed_steps > 0) {
            double avg = total_train_seconds / timed_steps;
            printf("average step %.2f ms, %.0f tok/s over %d steps\n", avg * 1000.0, tokens_per_step / avg, timed_steps);
        }
        size_t free_end;
        cudaCheck(cudaMemGetInfo(&free_end, &total_b));
        printf("GPU memory in use at the end: %.2f GiB\n", (total_b - free_end) / 1073741824.0);
    }
    if (logfile) fclose(logfile);
    matmul_free();
    return 0;
}
#endif
