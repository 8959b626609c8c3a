// process_group.h: who this process is in a data-parallel run, and how the processes agree on
// NCCL's unique id before NCCL can talk. Plain C++ and POSIX (no CUDA, no NCCL), so the CPU tests
// run all of it.
//
// Ranks. -pn / -pr on the command line win; otherwise the launcher's environment tells:
//   scripts/launch.sh   LLMC_WORLD_SIZE, LLMC_RANK, LLMC_LOCAL_RANK
//   Open MPI mpirun     OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_LOCAL_RANK
//   MPICH / Intel MPI   PMI_SIZE, PMI_RANK, MPI_LOCALRANKID
//   Slurm srun          SLURM_NTASKS, SLURM_PROCID, SLURM_LOCALID
// (the trainer does not link MPI: mpirun and srun only start the processes). The GPU of a process is
// its local rank, or rank % -pg when -pg is given.
//
// The id. Rank 0 asks NCCL for a 128-byte unique id and hands it to the others, one of two ways:
//   fs   (-pf DIR)        rank 0 writes DIR/nccl_id_<world>.bin (a temporary name, then rename, so a
//                         reader never sees half a file); the others poll for it. DIR must be seen by
//                         every process and be fresh for each run (an id left by a crashed run would
//                         be taken for this run's); rank 0 deletes the file once NCCL is up.
//   tcp  (-ps HOST:PORT)  rank 0 listens on PORT; each other process connects, says its rank and the
//                         world size (a mismatch is an error on both sides), and reads the id.
// Both give up after a timeout with an error that names what was missing.
#pragma once
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>
#include <array>
#include <chrono>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>
#include "common.h"
#include "cli.h"

namespace llmc {

constexpr size_t kProcessIdBytes = 128;                 // NCCL_UNIQUE_ID_BYTES
using ProcessId = std::array<char, kProcessIdBytes>;

// ---- ranks --------------------------------------------------------------------------------------

// Reads an environment variable as a non-negative integer; -1 when unset; an error when malformed.
template <class Getenv>
inline int env_int(Getenv getenv_fn, const char* name) {
    const char* v = getenv_fn(name);
    if (!v) return -1;
    char* end = nullptr;
    errno = 0;
    long x = std::strtol(v, &end, 10);
    if (v[0] == '\0' || *end != '\0' || errno != 0 || x < 0 || x > 1000000)
        input_error("environment variable %s='%s' is not a process count or rank", name, v);
    return (int)x;
}

// Fills -pn / -pr from the launcher's environment where the command line left them unset (0 / -1),
// and returns the local rank (the GPU index before -pg), or -1 when nothing tells it.
// getenv_fn is std::getenv in the trainer and a table in the tests.
template <class Getenv>
inline int resolve_processes(TrainConfig& cfg, Getenv getenv_fn) {
    struct Launcher { const char* size; const char* rank; const char* local; };
    static const Launcher launchers[] = {
        {"LLMC_WORLD_SIZE", "LLMC_RANK", "LLMC_LOCAL_RANK"},
        {"OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK"},
        {"PMI_SIZE", "PMI_RANK", "MPI_LOCALRANKID"},
        {"SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID"},
    };
    int local_rank = -1;
    for (const Launcher& l : launchers) {
        const int size = env_int(getenv_fn, l.size);
        if (size < 1) continue;
        const int rank = env_int(getenv_fn, l.rank);
        if (rank < 0) input_error("environment variable %s=%d is set but %s is not", l.size, size, l.rank);
        if (cfg.num_processes == 0) cfg.num_processes = size;
        if (cfg.process_rank == -1) cfg.process_rank = rank;
        local_rank = env_int(getenv_fn, l.local);
        break;
    }
    if (cfg.num_processes == 0) cfg.num_processes = 1;
    if (cfg.process_rank == -1) cfg.process_rank = 0;
    return local_rank;
}

// The GPU this process uses: rank % -pg, else the launcher's local rank, else the rank (one node).
inline int choose_gpu(const TrainConfig& cfg, int local_rank, int device_count) {
    int gpu = cfg.gpus_per_node > 0 ? cfg.process_rank % cfg.gpus_per_node : local_rank >= 0 ? local_rank : cfg.process_rank;
    if (device_count > 0 && gpu >= device_count)
        input_error("process %d wants GPU %d but this node has %d; start at most %d processes per node (or set -pg)",
                    cfg.process_rank, gpu, device_count, device_count);
    return gpu;
}

// ---- exchanging the id --------------------------------------------------------------------------

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

inline std::string fs_id_path(const std::string& dir, int world) { return dir + strfmt("/nccl_id_%d.bin", world); }

// fs: rank 0 publishes `id`; the others read it (waiting up to timeout_s). Returns the id.
inline ProcessId exchange_id_fs(const std::string& dir, int rank, int world, const ProcessId& id, int timeout_s) {
    const std::string path = fs_id_path(dir, world);
    if (rank == 0) {
        struct stat sb;
        if (stat(dir.c_str(), &sb) != 0 || !S_ISDIR(sb.st_mode))
            input_error("-pf %s: not a directory; it must exist and be shared by every process", dir.c_str());
        const std::string tmp = path + strfmt(".tmp.%d", (int)getpid());
        FILE* f = std::fopen(tmp.c_str(), "wb");
        if (!f) input_error("-pf %s: cannot write %s: %s", dir.c_str(), tmp.c_str(), std::strerror(errno));
        bool ok = std::fwrite(id.data(), 1, id.size(), f) == id.size();
        ok = (std::fflush(f) == 0) && ok;
        ok = (fsync(fileno(f)) == 0) && ok;
        ok = (std::fclose(f) == 0) && ok;
        if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
            std::remove(tmp.c_str());
            input_error("-pf %s: cannot write %s: %s", dir.c_str(), path.c_str(), std::strerror(errno));
        }
        return id;
    }
    const auto t0 = std::chrono::steady_clock::now();
    for (;;) {
        FILE* f = std::fopen(path.c_str(), "rb");
        if (f) {
            ProcessId got;
            size_t n = std::fread(got.data(), 1, got.size(), f);
            std::fclose(f);
            if (n == got.size()) return got;
        }
        if (seconds_since(t0) > timeout_s)
            input_error("-pf %s: rank 0 did not publish %s within %d s; is rank 0 running, with the same -pf and -pn %d?",
                        dir.c_str(), path.c_str(), timeout_s, world);
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
}

// rank 0, once every process holds the id: the file is not needed any more (nor wanted by the next run)
inline void remove_fs_id(const std::string& dir, int world) { std::remove(fs_id_path(dir, world).c_str()); }

// "host:port" -> (host, port)
inline void split_host_port(const std::string& s, std::string* host, int* port) {
    const size_t colon = s.rfind(':');
    char* end = nullptr;
    long p = colon == std::string::npos ? -1 : std::strtol(s.c_str() + colon + 1, &end, 10);
    if (colon == std::string::npos || colon == 0 || end == s.c_str() + colon + 1 || *end != '\0' || p < 1 || p > 65535)
        input_error("-ps %s: expected HOST:PORT with a port in [1, 65535]", s.c_str());
    *host = s.substr(0, colon);
    *port = (int)p;
}

// send/recv all of n bytes, or false (peer gone, or the deadline passed)
inline bool socket_io(int fd, void* buf, size_t n, bool sending, std::chrono::steady_clock::time_point deadline) {
    char* p = (char*)buf;
    while (n > 0) {
        const int left_ms = (int)std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
        if (left_ms <= 0) return false;
        pollfd pfd{fd, (short)(sending ? POLLOUT : POLLIN), 0};
        if (poll(&pfd, 1, left_ms) <= 0) return false;
        ssize_t k = sending ? send(fd, p, n, MSG_NOSIGNAL) : recv(fd, p, n, 0);
        if (k <= 0) return false;
        p += k; n -= (size_t)k;
    }
    return true;
}

// tcp: rank 0 serves `id` to world-1 peers on host:port; the others fetch it. Returns the id.
inline ProcessId exchange_id_tcp(const std::string& server, int rank, int world, const ProcessId& id, int timeout_s) {
    std::string host;
    int port = 0;
    split_host_port(server, &host, &port);
    const auto t0 = std::chrono::steady_clock::now();
    const auto deadline = t0 + std::chrono::seconds(timeout_s);
    if (rank == 0) {
        int ls = socket(AF_INET, SOCK_STREAM, 0);
        if (ls < 0) input_error("-ps %s: socket: %s", server.c_str(), std::strerror(errno));
        int one = 1;
        setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        sockaddr_in addr{};
        addr.sin_family = AF_INET;
        addr.sin_addr.s_addr = htonl(INADDR_ANY);
        addr.sin_port = htons((uint16_t)port);
        if (bind(ls, (sockaddr*)&addr, sizeof(addr)) != 0 || listen(ls, world) != 0) {
            int e = errno;
            close(ls);
            input_error("-ps %s: rank 0 cannot listen on port %d: %s", server.c_str(), port, std::strerror(e));
        }
        std::vector<bool> seen(world, false);
        for (int served = 1; served < world;) {
            const int left_ms = (int)std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
            pollfd pfd{ls, POLLIN, 0};
            if (left_ms <= 0 || poll(&pfd, 1, left_ms) <= 0) {
                close(ls);
                input_error("-ps %s: only %d of the %d other processes connected to rank 0 within %d s", server.c_str(),
                            served - 1, world - 1, timeout_s);
            }
            int fd = accept(ls, nullptr, nullptr);
            if (fd < 0) continue;
            int32_t hello[2] = {-1, -1}; // (rank, world) of the peer
            bool ok = socket_io(fd, hello, sizeof(hello), false, deadline);
            const int32_t verdict = !ok ? -1 : hello[1] != world ? 1 : (hello[0] < 1 || hello[0] >= world || seen[hello[0]]) ? 2 : 0;
            ok = ok && socket_io(fd, (void*)&verdict, sizeof(verdict), true, deadline);
            if (ok && verdict == 0) ok = socket_io(fd, (void*)id.data(), id.size(), true, deadline);
            close(fd);
            if (verdict == 1 || verdict == 2) {
                close(ls);
                input_error("-ps %s: a process said it is rank %d of %d, but rank 0 has -pn %d%s", server.c_str(),
                            hello[0], hello[1], world, verdict == 2 ? " (or that rank came twice)" : "");
            }
            if (ok) { seen[hello[0]] = true; served++; }
        }
        close(ls);
        return id;
    }
    addrinfo hints{}, *res = nullptr;
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0 || !res)
        input_error("-ps %s: cannot resolve host '%s'", server.c_str(), host.c_str());
    for (;;) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
            int32_t hello[2] = {rank, world}, verdict = -1;
            ProcessId got;
            bool ok = socket_io(fd, hello, sizeof(hello), true, deadline) && socket_io(fd, &verdict, sizeof(verdict), false, deadline);
            if (ok && verdict != 0) {
                close(fd);
                freeaddrinfo(res);
                input_error("-ps %s: rank 0 refused rank %d of %d (its -pn differs, or two processes have rank %d)",
                            server.c_str(), rank, world, rank);
            }
            ok = ok && socket_io(fd, got.data(), got.size(), false, deadline);
            close(fd);
            if (ok) { freeaddrinfo(res); return got; }
        } else if (fd >= 0) {
            close(fd);
        }
        if (seconds_since(t0) > timeout_s) {
            freeaddrinfo(res);
            input_error("-ps %s: could not get the NCCL id from rank 0 within %d s; is rank 0 running, with the same -ps?",
                        server.c_str(), timeout_s);
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
}

// The method the flags ask for: -pi, else tcp when -ps is given, else fs when -pf is given, else "".
inline std::string init_method_of(const TrainConfig& cfg) {
    if (!cfg.init_method.empty()) return cfg.init_method;
    if (!cfg.init_server.empty()) return "tcp";
    if (!cfg.init_dir.empty()) return "fs";
    return "";
}

// Every process returns rank 0's id. timeout_s bounds the wait for the other processes to start.
inline ProcessId exchange_process_id(const TrainConfig& cfg, const ProcessId& id, int timeout_s) {
    const std::string m = init_method_of(cfg);
    if (m == "tcp") return exchange_id_tcp(cfg.init_server, cfg.process_rank, cfg.num_processes, id, timeout_s);
    if (m == "fs") return exchange_id_fs(cfg.init_dir, cfg.process_rank, cfg.num_processes, id, timeout_s);
    input_error("the NCCL id needs -pf DIR or -ps HOST:PORT");
}

} // namespace llmc
