// test_multi_gpu.cpp: the CPU side of data parallelism: the flags, who a process is (flags and the
// launchers' environments), the NCCL id exchange through a directory and over TCP (real processes,
// fork), and the ZeRO-1 partition of the optimizer state. (The NCCL collectives themselves need GPUs:
// test_gpt.cu checks the sharded optimizer step, dev/test/gpu/multi_gpu.sh a real multi-GPU run.)
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <algorithm>
#include <map>
#include <set>
#include "llmc/cli.h"
#include "llmc/process_group.h"
#include "llmc/zero.h"
#include "dev/test/cpu/test_util.h"

using llmc::ProcessId;
using llmc::ShardLayout;
using llmc::TrainConfig;
using test_util::contains;
using test_util::error_of;

namespace {

TrainConfig parse_mg(std::vector<std::string> args) {
    std::vector<std::string> storage = {"train_gpt"};
    storage.insert(storage.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (std::string& s : storage) argv.push_back(&s[0]);
    return llmc::parse_args((int)argv.size(), argv.data());
}

// a fake environment for resolve_processes
struct Env {
    std::map<std::string, std::string> vars;
    const char* operator()(const char* name) const {
        auto it = vars.find(name);
        return it == vars.end() ? nullptr : it->second.c_str();
    }
};

ProcessId make_id(char seed) {
    ProcessId id;
    for (size_t i = 0; i < id.size(); i++) id[i] = (char)(seed + 7 * i);
    return id;
}

// runs `body(rank)` in world-1 child processes (ranks 1..world-1) and in this one (rank 0);
// returns how many children failed (exit status != 0)
int run_ranks(int world, const std::function<int(int)>& body, int* rank0_status) {
    std::vector<pid_t> kids;
    for (int r = 1; r < world; r++) {
        pid_t pid = fork();
        if (pid == 0) _exit(body(r));
        kids.push_back(pid);
    }
    *rank0_status = body(0);
    int failed = 0;
    for (pid_t pid : kids) {
        int st = 0;
        waitpid(pid, &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) failed++;
    }
    return failed;
}

// `world` processes exchange the id with the given -pf / -ps flags, rank 0 starting 0.3 s late;
// each checks that it got `id`. Returns how many of ranks 1.. failed; *rank0_status: rank 0's result.
int exchange_in_processes(int world, const std::vector<std::string>& method, const ProcessId& id, int* rank0_status) {
    return run_ranks(world, [&](int rank) {
        try {
            std::vector<std::string> args = {"-pn", std::to_string(world), "-pr", std::to_string(rank)};
            args.insert(args.end(), method.begin(), method.end());
            TrainConfig c = parse_mg(args);
            if (rank == 0) usleep(300000);
            ProcessId got = llmc::exchange_process_id(c, rank == 0 ? id : make_id(0), 20);
            return got == id ? 0 : 1;
        } catch (...) {
            return 2;
        }
    }, rank0_status);
}

// a TCP port nobody listens on right now
int free_port() {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    REQUIRE(bind(fd, (sockaddr*)&a, sizeof(a)) == 0);
    socklen_t len = sizeof(a);
    getsockname(fd, (sockaddr*)&a, &len);
    close(fd);
    return ntohs(a.sin_port);
}

std::string temp_dir() {
    char tmpl[] = "/tmp/llmc_mg_XXXXXX";
    REQUIRE(mkdtemp(tmpl) != nullptr);
    return tmpl;
}

} // namespace

TEST_CASE("multi-gpu flags: parse, defaults, and what validation refuses") {
    TrainConfig d = parse_mg({});
    CHECK(d.num_processes == 0);     // from the environment
    CHECK(d.process_rank == -1);
    CHECK(d.zero_stage == 1);
    CHECK(d.comm_timeout == 30);
    TrainConfig c = parse_mg({"-pn", "4", "-pr", "3", "-pg", "8", "-pi", "tcp", "-ps", "node0:29500", "-pf", "/shared/x",
                              "-z", "0", "-pt", "45"});
    CHECK(c.num_processes == 4);
    CHECK(c.process_rank == 3);
    CHECK(c.gpus_per_node == 8);
    CHECK(c.init_method == "tcp");
    CHECK(c.init_server == "node0:29500");
    CHECK(c.init_dir == "/shared/x");
    CHECK(c.zero_stage == 0);
    CHECK(c.comm_timeout == 45);
    llmc::validate_config(c);
    // one process, nothing given: a plain run
    TrainConfig one = parse_mg({});
    llmc::validate_config(one);
    CHECK(one.num_processes == 1);
    CHECK(one.process_rank == 0);
    auto err = [](std::vector<std::string> a) { return error_of([&] { TrainConfig t = parse_mg(a); llmc::validate_config(t); }); };
    CHECK(contains(err({"-pn", "2", "-pr", "2", "-pf", "/tmp"}), "-pr 2: the process rank must be in [0, 2)"));
    CHECK(contains(err({"-pn", "2", "-pr", "0"}), "-pf DIR"));
    CHECK(contains(err({"-pn", "2", "-pr", "0"}), "scripts/launch.sh"));
    CHECK(contains(err({"-z", "2"}), "-z 2: the ZeRO stage must be 0"));
    CHECK(contains(err({"-pt", "0"}), "-pt 0"));
    CHECK(contains(err({"-pi", "mpi"}), "-pi mpi: unknown init method"));
    CHECK(contains(err({"-pi", "fs"}), "pass it with -pf DIR"));
    CHECK(contains(err({"-pi", "tcp"}), "pass it with -ps"));
    CHECK(contains(err({"-pg", "-1"}), "-pg -1"));
    // the total batch counts every process
    TrainConfig acc = parse_mg({"-pn", "2", "-pr", "1", "-pf", "/tmp", "-b", "4", "-t", "64", "-d", "1024"});
    llmc::validate_config(acc);
    CHECK(acc.grad_accum_steps == 2);
}

TEST_CASE("multi-gpu ranks: the launchers' environments, and the flags win") {
    struct Case { std::map<std::string, std::string> env; int world, rank, local; };
    const Case cases[] = {
        {{}, 1, 0, -1},
        {{{"LLMC_WORLD_SIZE", "4"}, {"LLMC_RANK", "2"}, {"LLMC_LOCAL_RANK", "2"}}, 4, 2, 2},
        {{{"OMPI_COMM_WORLD_SIZE", "16"}, {"OMPI_COMM_WORLD_RANK", "9"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}}, 16, 9, 1},
        {{{"PMI_SIZE", "2"}, {"PMI_RANK", "1"}}, 2, 1, -1},
        {{{"SLURM_NTASKS", "8"}, {"SLURM_PROCID", "5"}, {"SLURM_LOCALID", "5"}}, 8, 5, 5},
        // the project's launcher first, then MPI, then Slurm (srun inside mpirun: MPI's ranks)
        {{{"OMPI_COMM_WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_RANK", "1"}, {"SLURM_NTASKS", "1"}, {"SLURM_PROCID", "0"}}, 2, 1, -1},
    };
    for (const Case& k : cases) {
        TrainConfig c = parse_mg({});
        Env env{k.env};
        int local = llmc::resolve_processes(c, env);
        CHECK(c.num_processes == k.world);
        CHECK(c.process_rank == k.rank);
        CHECK(local == k.local);
    }
    // -pn / -pr on the command line win over the environment
    TrainConfig c = parse_mg({"-pn", "2", "-pr", "0"});
    Env env{{{"LLMC_WORLD_SIZE", "4"}, {"LLMC_RANK", "3"}}};
    llmc::resolve_processes(c, env);
    CHECK(c.num_processes == 2);
    CHECK(c.process_rank == 0);
    // a malformed or half-set environment is an error that names the variable
    TrainConfig bad = parse_mg({});
    Env e1{{{"LLMC_WORLD_SIZE", "two"}, {"LLMC_RANK", "0"}}};
    CHECK(contains(error_of([&] { llmc::resolve_processes(bad, e1); }), "LLMC_WORLD_SIZE='two'"));
    Env e2{{{"SLURM_NTASKS", "2"}}};
    CHECK(contains(error_of([&] { llmc::resolve_processes(bad, e2); }), "SLURM_PROCID is not"));
}

TEST_CASE("multi-gpu ranks: the GPU of a process") {
    TrainConfig c = parse_mg({"-pn", "16", "-pr", "11"});
    CHECK(llmc::choose_gpu(c, 3, 8) == 3);    // the launcher's local rank
    c.gpus_per_node = 8;
    CHECK(llmc::choose_gpu(c, 3, 8) == 3);    // rank % -pg
    c.gpus_per_node = 0;
    CHECK(contains(error_of([&] { llmc::choose_gpu(c, -1, 8); }), "wants GPU 11 but this node has 8"));
    TrainConfig one = parse_mg({"-pn", "2", "-pr", "1"});
    CHECK(llmc::choose_gpu(one, -1, 2) == 1); // one node, no local rank: the rank
}

TEST_CASE("multi-gpu id exchange through a directory: every process gets rank 0's id") {
    const std::string dir = temp_dir();
    const int world = 4;
    int rank0 = -1;
    // the others may start first and wait; rank 0 publishes a little later
    int failed = exchange_in_processes(world, {"-pf", dir}, make_id(42), &rank0);
    CHECK(rank0 == 0);
    CHECK(failed == 0);
    // no temporary file is left, and rank 0 removes the published one once NCCL is up
    llmc::remove_fs_id(dir, world);
    CHECK(rmdir(dir.c_str()) == 0);
}

TEST_CASE("multi-gpu id exchange through a directory: a missing rank 0 is a timely, clear error") {
    const std::string dir = temp_dir();
    TrainConfig c = parse_mg({"-pn", "2", "-pr", "1", "-pf", dir});
    auto t0 = std::chrono::steady_clock::now();
    std::string msg = error_of([&] { llmc::exchange_process_id(c, make_id(0), 1); });
    CHECK(llmc::seconds_since(t0) < 5.0);
    CHECK(contains(msg, "rank 0 did not publish"));
    CHECK(contains(msg, "within 1 s"));
    rmdir(dir.c_str());
    TrainConfig r0 = parse_mg({"-pn", "2", "-pr", "0", "-pf", "/nonexistent/dir"});
    CHECK(contains(error_of([&] { llmc::exchange_process_id(r0, make_id(1), 1); }), "not a directory"));
}

TEST_CASE("multi-gpu id exchange over TCP: every process gets rank 0's id") {
    const int port = free_port();
    const int world = 3;
    int rank0 = -1;
    // the others retry until rank 0 listens
    int failed = exchange_in_processes(world, {"-ps", "127.0.0.1:" + std::to_string(port)}, make_id(9), &rank0);
    CHECK(rank0 == 0);
    CHECK(failed == 0);
}

TEST_CASE("multi-gpu id exchange over TCP: a process count mismatch and a missing rank 0 are clear errors") {
    const int port = free_port();
    const std::string server = "127.0.0.1:" + std::to_string(port);
    int rank0 = -1;
    std::string rank0_msg;
    // rank 0 thinks there are 2 processes, the other one thinks 3
    int failed = run_ranks(2, [&](int rank) {
        TrainConfig c = parse_mg({"-pn", rank == 0 ? "2" : "3", "-pr", std::to_string(rank), "-ps", server});
        try {
            llmc::exchange_process_id(c, make_id(1), 5);
            return 0;
        } catch (const llmc::InputError& e) {
            if (rank == 0) rank0_msg = e.what();
            return 3;
        }
    }, &rank0);
    CHECK(rank0 == 3);
    CHECK(failed == 1);
    CHECK(contains(rank0_msg, "rank 1 of 3, but rank 0 has -pn 2"));
    // nobody listens
    TrainConfig c = parse_mg({"-pn", "2", "-pr", "1", "-ps", "127.0.0.1:" + std::to_string(free_port())});
    CHECK(contains(error_of([&] { llmc::exchange_process_id(c, make_id(0), 1); }), "could not get the NCCL id from rank 0 within 1 s"));
    TrainConfig bad = parse_mg({"-pn", "2", "-pr", "1", "-ps", "node0"});
    CHECK(contains(error_of([&] { llmc::exchange_process_id(bad, make_id(0), 1); }), "expected HOST:PORT"));
}

TEST_CASE("zero-1: the processes' pieces partition every tensor exactly once, block by block") {
    // a small GPT's 16 tensors: L = 3 layers, C = 12, Vp = 24, maxT = 8
    const size_t L = 3, C = 12, Vp = 24, maxT = 8;
    const size_t sizes[16] = {Vp * C, maxT * C, L * C, L * C, L * 3 * C * C, L * 3 * C, L * C * C, L * C,
                              L * C, L * C, L * 4 * C * C, L * 4 * C, L * 4 * C * C, L * C, C, C};
    const size_t blocks[16] = {1, 1, L, L, L, L, L, L, L, L, L, L, L, L, 1, 1};
    size_t total = 0;
    for (size_t s : sizes) total += s;
    for (int P : {1, 2, 3, 4, 6, 12}) {
        CAPTURE(P);
        std::vector<int> owner(total, -1);
        size_t owned = 0;
        for (int r = 0; r < P; r++) {
            ShardLayout lay;
            lay.build(sizes, blocks, 16, r, P);
            CHECK(lay.full_elements == total);
            CHECK(lay.shard_elements * (size_t)P == total);
            owned += lay.shard_elements;
            int fails = 0;
            for (const llmc::ShardedTensor& t : lay.tensors) {
                for (size_t j = 0; j < t.shard_size() && fails < 5; j++) {
                    const size_t f = t.full_index(j);
                    EXPECT_IN_LOOP(f >= t.offset && f < t.offset + t.rows * t.row, "index outside its tensor");
                    EXPECT_IN_LOOP(owner[f] == -1, "element owned twice");
                    owner[f] = r;
                    // each block's piece is contiguous and belongs to rank r's slot of the block
                    EXPECT_IN_LOOP(((f - t.offset) % t.row) / t.piece == (size_t)r, "piece in the wrong slot");
                }
            }
            // extract then scatter puts every owned value back where it was
            std::vector<float> full(total), back(total, -1.0f);
            for (size_t i = 0; i < total; i++) full[i] = (float)i;
            std::vector<float> shard = lay.extract(full.data());
            lay.scatter(shard.data(), back.data());
            for (size_t i = 0; i < total; i++) if (owner[i] == r) CHECK(back[i] == full[i]);
        }
        CHECK(owned == total);
        CHECK(std::count(owner.begin(), owner.end(), -1) == 0);
    }
    // one owner: the plain layout (shard index = full index)
    ShardLayout one;
    one.build(sizes, blocks, 16, 0, 1);
    for (const llmc::ShardedTensor& t : one.tensors) {
        CHECK(t.rows == 1);
        CHECK(t.full_index(t.shard_size() - 1) == t.offset + t.shard_size() - 1);
        CHECK(t.shard_offset == t.offset);
    }
    // a process count that does not divide the blocks
    ShardLayout bad;
    CHECK(contains(error_of([&] { bad.build(sizes, blocks, 16, 0, 5); }), "must divide the channels C"));
    // an owner outside [0, owners): rank 1 of a -z 0 run owns everything as owner 0 of 1, and the
    // layout of "owner 1 of 1" would point past the end of every tensor
    CHECK(contains(error_of([&] { bad.build(sizes, blocks, 16, 1, 1); }), "owner 1 of 1"));
    CHECK(contains(error_of([&] { bad.build(sizes, blocks, 16, 2, 2); }), "owner 2 of 2"));
    CHECK(contains(error_of([&] { bad.build(sizes, blocks, 16, -1, 2); }), "owner -1 of 2"));
}
