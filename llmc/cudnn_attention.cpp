// cudnn_attention.cpp: the USE_CUDNN=1 attention (see cudnn_attention.h for layouts and contract).
//
// One cuDNN frontend graph per (B, T, NH, HS, direction): the forward is a single SDPA node with a
// causal mask (top-left diagonal, nothing right of it) that also writes the row statistics; the
// backward is an SDPA-backward node reading Q, K, V, O, dO and the statistics. Q, K and V are views
// into the interleaved qkv buffer (no copies), dQ, dK and dV views into dqkv.
#include "cudnn_attention.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <tuple>
#include <unordered_map>

#include <cudnn.h>
#include <cudnn_frontend.h>

namespace fe = cudnn_frontend;

namespace {

// tensor uids of the variant pack
enum : int64_t { UID_Q = 1, UID_K, UID_V, UID_O, UID_STATS, UID_DO, UID_DQ, UID_DK, UID_DV };

struct ShapeKey {
    int B, T, NH, HS, backward;
    bool operator<(const ShapeKey& o) const {
        return std::tie(B, T, NH, HS, backward) < std::tie(o.B, o.T, o.NH, o.HS, o.backward);
    }
};

cudnnHandle_t g_handle = nullptr;
std::map<ShapeKey, std::shared_ptr<fe::graph::Graph>> g_graphs;
void* g_workspace = nullptr;
size_t g_workspace_bytes = 0;

[[noreturn]] void die(const std::string& what) {
    fprintf(stderr, "error: cuDNN attention: %s\n", what.c_str());
    exit(1);
}

void check_cuda(cudaError_t e, const char* what) {
    if (e != cudaSuccess) die(std::string(what) + ": " + cudaGetErrorString(e));
}

cudnnHandle_t handle() {
    if (!g_handle) {
        const cudnnStatus_t s = cudnnCreate(&g_handle);
        if (s != CUDNN_STATUS_SUCCESS) die(std::string("cudnnCreate failed: ") + cudnnGetErrorString(s));
    }
    return g_handle;
}

// The backward's algorithm: deterministic unless LLMC_CUDNN_DETERMINISTIC=0 (then cuDNN may sum dQ with
// atomics, as PyTorch's SDPA does: a little faster, but runs and resumed runs no longer repeat their bits)
bool deterministic() {
    const char* env = getenv("LLMC_CUDNN_DETERMINISTIC");
    return !(env && env[0] == '0');
}

// Q, K or V of the qkv buffer (which = 0, 1, 2) as a (B, NH, T, HS) tensor: consecutive tokens are
// 3C apart, heads HS apart, batch rows T*3C apart
std::shared_ptr<fe::graph::Tensor_attributes> qkv_view(fe::graph::Graph& g, const char* name, int64_t uid,
                                                       const ShapeKey& k) {
    const int64_t C = (int64_t)k.NH * k.HS;
    return g.tensor(fe::graph::Tensor_attributes()
                        .set_name(name)
                        .set_uid(uid)
                        .set_dim({k.B, k.NH, k.T, k.HS})
                        .set_stride({(int64_t)k.T * 3 * C, k.HS, 3 * C, 1}));
}
// the output layout (B, T, NH, HS) as a (B, NH, T, HS) tensor
std::vector<int64_t> out_stride(const ShapeKey& k) {
    const int64_t C = (int64_t)k.NH * k.HS;
    return {(int64_t)k.T * C, k.HS, C, 1};
}

// Builds (validates, lowers, picks an engine, compiles) the graph of `key`; null with *why on failure.
std::shared_ptr<fe::graph::Graph> build(const ShapeKey& key, std::string* why) {
    auto g = std::make_shared<fe::graph::Graph>();
    g->set_io_data_type(fe::DataType_t::BFLOAT16)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    const float scale = 1.0f / std::sqrt((float)key.HS);
    auto Q = qkv_view(*g, "Q", UID_Q, key), K = qkv_view(*g, "K", UID_K, key), V = qkv_view(*g, "V", UID_V, key);
    if (!key.backward) {
        auto options = fe::graph::SDPA_attributes()
                           .set_name("causal_attention")
                           .set_generate_stats(true)
                           .set_causal_mask(true)
                           .set_attn_scale(scale);
        auto [O, stats] = g->sdpa(Q, K, V, options);
        O->set_output(true).set_uid(UID_O).set_dim({key.B, key.NH, key.T, key.HS}).set_stride(out_stride(key));
        stats->set_output(true).set_uid(UID_STATS).set_data_type(fe::DataType_t::FLOAT);
    } else {
        auto O = g->tensor(fe::graph::Tensor_attributes().set_name("O").set_uid(UID_O)
                               .set_dim({key.B, key.NH, key.T, key.HS}).set_stride(out_stride(key)));
        auto dO = g->tensor(fe::graph::Tensor_attributes().set_name("dO").set_uid(UID_DO)
                                .set_dim({key.B, key.NH, key.T, key.HS}).set_stride(out_stride(key)));
        auto stats = g->tensor(fe::graph::Tensor_attributes().set_name("stats").set_uid(UID_STATS)
                                   .set_dim({key.B, key.NH, key.T, 1}).set_stride({(int64_t)key.NH * key.T, key.T, 1, 1})
                                   .set_data_type(fe::DataType_t::FLOAT));
        auto options = fe::graph::SDPA_backward_attributes()
                           .set_name("causal_attention_backward")
                           .set_causal_mask(true)
                           .set_attn_scale(scale)
                           .set_deterministic_algorithm(deterministic());
        auto [dQ, dK, dV] = g->sdpa_backward(Q, K, V, O, dO, stats, options);
        const int64_t C = (int64_t)key.NH * key.HS;
        const std::vector<int64_t> dims = {key.B, key.NH, key.T, key.HS};
        const std::vector<int64_t> strides = {(int64_t)key.T * 3 * C, key.HS, 3 * C, 1};
        dQ->set_output(true).set_uid(UID_DQ).set_dim(dims).set_stride(strides);
        dK->set_output(true).set_uid(UID_DK).set_dim(dims).set_stride(strides);
        dV->set_output(true).set_uid(UID_DV).set_dim(dims).set_stride(strides);
    }
    auto fail = [&](const char* step, fe::error_t e) -> std::shared_ptr<fe::graph::Graph> {
        if (why) *why = std::string(step) + ": " + e.get_message();
        return nullptr;
    };
    fe::error_t e = g->validate();
    if (e.is_bad()) return fail("validate", e);
    e = g->build_operation_graph(handle());
    if (e.is_bad()) return fail("build_operation_graph", e);
    e = g->create_execution_plans({fe::HeurMode_t::A});
    if (e.is_bad()) return fail("create_execution_plans", e);
    e = g->check_support(handle());
    if (e.is_bad()) return fail("check_support", e);
    e = g->build_plans(handle());
    if (e.is_bad()) return fail("build_plans", e);
    return g;
}

// the cached graph of `key`, built on first use (the workspace grows to what it needs); null with *why
// when cuDNN refuses the shape
fe::graph::Graph* find_or_build(const ShapeKey& key, std::string* why) {
    auto it = g_graphs.find(key);
    if (it != g_graphs.end()) return it->second.get();
    auto g = build(key, why);
    if (!g) return nullptr;
    int64_t bytes = 0;
    fe::error_t e = g->get_workspace_size(bytes);
    if (e.is_bad()) die("get_workspace_size: " + e.get_message());
    if ((size_t)bytes > g_workspace_bytes) {
        // a larger workspace: the old one may still be in use by queued work
        if (g_workspace) {
            check_cuda(cudaDeviceSynchronize(), "synchronize before growing the workspace");
            check_cuda(cudaFree(g_workspace), "free the workspace");
        }
        g_workspace = nullptr;
        if (cudaMalloc(&g_workspace, (size_t)bytes) != cudaSuccess) {
            die("out of GPU memory for the " + std::to_string(bytes >> 20) + " MiB workspace");
        }
        g_workspace_bytes = (size_t)bytes;
    }
    return g_graphs.emplace(key, g).first->second.get();
}
fe::graph::Graph& graph(const ShapeKey& key) {
    std::string why;
    fe::graph::Graph* g = find_or_build(key, &why);
    if (!g) {
        die("no " + std::string(key.backward ? "backward" : "forward") + " graph for B=" + std::to_string(key.B) +
            " T=" + std::to_string(key.T) + " NH=" + std::to_string(key.NH) + " HS=" + std::to_string(key.HS) + ": " + why);
    }
    return *g;
}

void execute(fe::graph::Graph& g, std::unordered_map<int64_t, void*>& pack, cudaStream_t stream, const char* what) {
    const cudnnStatus_t s = cudnnSetStream(handle(), stream);
    if (s != CUDNN_STATUS_SUCCESS) die(std::string("cudnnSetStream: ") + cudnnGetErrorString(s));
    fe::error_t e = g.execute(handle(), pack, g_workspace);
    if (e.is_bad()) die(std::string(what) + ": " + e.get_message());
}

} // namespace

bool cudnn_attention_prepare(int B, int T, int NH, int HS, std::string* why) {
    for (int backward = 0; backward < 2; backward++) {
        std::string reason;
        if (!find_or_build({B, T, NH, HS, backward}, &reason)) {
            if (why) *why = std::string(backward ? "backward" : "forward") + ": " + reason;
            return false;
        }
    }
    return true;
}

void cudnn_attention_forward(void* out, float* stats, const void* qkv, int B, int T, int NH, int HS,
                             cudaStream_t stream) {
    fe::graph::Graph& g = graph({B, T, NH, HS, 0});
    const size_t C = (size_t)NH * HS;
    char* base = (char*)const_cast<void*>(qkv);
    const size_t elem = 2; // BF16
    std::unordered_map<int64_t, void*> pack = {
        {UID_Q, base}, {UID_K, base + C * elem}, {UID_V, base + 2 * C * elem}, {UID_O, out}, {UID_STATS, stats}};
    execute(g, pack, stream, "forward");
}

void cudnn_attention_backward(void* dqkv, const void* dout, const void* qkv, const void* out, const float* stats,
                              int B, int T, int NH, int HS, cudaStream_t stream) {
    fe::graph::Graph& g = graph({B, T, NH, HS, 1});
    const size_t C = (size_t)NH * HS;
    const size_t elem = 2;
    char* base = (char*)const_cast<void*>(qkv);
    char* dbase = (char*)dqkv;
    std::unordered_map<int64_t, void*> pack = {
        {UID_Q, base}, {UID_K, base + C * elem}, {UID_V, base + 2 * C * elem},
        {UID_O, const_cast<void*>(out)}, {UID_DO, const_cast<void*>(dout)}, {UID_STATS, const_cast<float*>(stats)},
        {UID_DQ, dbase}, {UID_DK, dbase + C * elem}, {UID_DV, dbase + 2 * C * elem}};
    execute(g, pack, stream, "backward");
}

size_t cudnn_attention_workspace_bytes() { return g_workspace_bytes; }

void cudnn_attention_free() {
    g_graphs.clear();
    if (g_workspace) cudaFree(g_workspace);
    g_workspace = nullptr;
    g_workspace_bytes = 0;
    if (g_handle) cudnnDestroy(g_handle);
    g_handle = nullptr;
}
