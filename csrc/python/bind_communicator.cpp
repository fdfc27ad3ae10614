// Bindings of Communicator, RegisteredMemory and Semaphore. Every call that
// may block (store waits, semaphore waits, CUDA synchronization) releases the GIL.
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/utils/pybind.h>
#include <torch/python.h>

#include "core/communicator.hpp"
#include "core/errors.hpp"
#include "core/proxy.hpp"
#include "core/switch_channel.hpp"
#include "diagnostics/channel_ops.hpp"
#include "diagnostics/pingpong.hpp"
#include "diagnostics/selftest.hpp"
#include "python/bindings.hpp"
#include "torch/store_adapter.hpp"
#include "torch/tensor_memory.hpp"

namespace py = pybind11;

namespace pyccl {
namespace {

py::bytes toPyBytes(const Bytes& b) {
  return py::bytes(reinterpret_cast<const char*>(b.data()), b.size());
}

Bytes fromPyBytes(const py::bytes& b) {
  std::string s = b;
  return Bytes(s.begin(), s.end());
}

py::dict topologyDict(const Communicator& c) {
  const Topology& t = c.topology();
  py::list ranks;
  for (size_t p = 0; p < t.ranks.size(); ++p) {
    const auto& r = t.ranks[p];
    py::dict d;
    d["rank"] = r.rank;
    d["hostname"] = r.hostname;
    d["node"] = r.nodeKey;
    d["pid"] = r.pid;
    d["device"] = r.device;
    d["device_uuid"] = r.deviceUuid;
    d["pci_bus_id"] = r.pciBusId;
    d["same_node"] = static_cast<bool>(t.sameNode[p]);
    d["p2p"] = static_cast<bool>(t.p2p[c.rank()][p]);
    ranks.append(d);
  }
  py::list matrix;
  for (const auto& row : t.p2p) {
    py::list r;
    for (bool v : row) r.append(v);
    matrix.append(r);
  }
  py::dict out;
  out["ranks"] = ranks;
  out["p2p"] = matrix;
  out["ranks_on_node"] = t.numRanksOnNode();
  return out;
}

}  // namespace

void bindCommunicator(py::module_& m) {
  py::class_<RegisteredMemory>(m, "RegisteredMemory",
                               "Memory registered by a rank, local or mapped from a peer.")
      .def_property_readonly("data_ptr", [](const RegisteredMemory& r) {
        return reinterpret_cast<uintptr_t>(r.data());
      })
      .def_property_readonly("size", &RegisteredMemory::size)
      .def_property_readonly("rank", &RegisteredMemory::rank)
      .def_property_readonly("is_local", &RegisteredMemory::isLocal)
      .def_property_readonly("kind", [](const RegisteredMemory& r) {
        return std::string(memoryKindName(r.kind()));
      })
      .def_property_readonly("device", &RegisteredMemory::device)
      .def_property_readonly("num_chunks", &RegisteredMemory::numChunks)
      .def_property_readonly("valid", &RegisteredMemory::valid)
      .def("serialize", [](const RegisteredMemory& r) { return toPyBytes(r.serialize()); })
      .def("release", &RegisteredMemory::release, py::call_guard<py::gil_scoped_release>())
      .def("__repr__", [](const RegisteredMemory& r) {
        if (!r.valid()) return std::string("<pyccl.RegisteredMemory released>");
        return strCat("<pyccl.RegisteredMemory rank=", r.rank(), " kind=", memoryKindName(r.kind()),
                      " size=", r.size(), r.isLocal() ? " local" : " imported", ">");
      });

  py::class_<Semaphore, std::shared_ptr<Semaphore>>(
      m, "Semaphore", "A 64-bit semaphore between this rank and one peer.")
      .def_property_readonly("peer", &Semaphore::peer)
      .def_property_readonly("valid", &Semaphore::valid)
      .def_property_readonly("received", &Semaphore::received)
      .def("signal", &Semaphore::signal, py::call_guard<py::gil_scoped_release>(),
           "Signals the peer (ordered after this thread's earlier writes).")
      .def("wait", [](Semaphore& s, int64_t timeoutMs) {
        s.wait(std::chrono::milliseconds(timeoutMs));
      }, py::arg("timeout_ms") = 0, py::call_guard<py::gil_scoped_release>(),
           "Waits for the peer's next signal; bounded by timeout_ms (0: the communicator's).");

  py::class_<MemoryChannel, std::shared_ptr<MemoryChannel>>(
      m, "MemoryChannel", "Load/store channel to one peer (HB puts and LL packets).")
      .def_property_readonly("peer", &MemoryChannel::peer)
      .def_property_readonly("valid", &MemoryChannel::valid)
      .def_property_readonly("local_size", &MemoryChannel::localSize)
      .def_property_readonly("remote_size", &MemoryChannel::remoteSize)
      .def_property_readonly("packet_bytes", &MemoryChannel::packetBytes);

  py::class_<PortChannel, std::shared_ptr<PortChannel>>(
      m, "PortChannel", "Proxy-driven channel to one peer (copy engine, host copy).")
      .def_property_readonly("peer", &PortChannel::peer)
      .def_property_readonly("valid", &PortChannel::valid)
      .def_property_readonly("transport", &PortChannel::transport)
      .def_property_readonly("channel_id", &PortChannel::channelId);

  py::class_<SwitchChannel, std::shared_ptr<SwitchChannel>>(
      m, "SwitchChannel", "NVLink SHARP multicast over one buffer of every GPU (off by default).");

  py::class_<Communicator, std::shared_ptr<Communicator>>(m, "Communicator")
      .def(py::init([](c10::intrusive_ptr<c10d::Store> store, int rank, int worldSize, int device,
                       std::string name, int64_t timeoutMs) {
             CommunicatorOptions opts;
             opts.name = std::move(name);
             opts.timeout = std::chrono::milliseconds(timeoutMs);
             auto adapter = std::make_shared<C10dStore>(std::move(store));
             py::gil_scoped_release release;
             return std::make_shared<Communicator>(adapter, rank, worldSize, device, opts);
           }),
           py::arg("store"), py::arg("rank"), py::arg("world_size"), py::arg("device"),
           py::arg("name"), py::arg("timeout_ms"))
      .def_property_readonly("rank", &Communicator::rank)
      .def_property_readonly("world_size", &Communicator::worldSize)
      .def_property_readonly("device", &Communicator::device)
      .def_property_readonly("host_mode", &Communicator::hostMode)
      .def_property_readonly("name", &Communicator::name)
      .def_property_readonly("timeout_ms", [](const Communicator& c) { return c.timeout().count(); })
      .def_property_readonly("closed", &Communicator::closed)
      .def_property_readonly("aborted", &Communicator::aborted)
      .def("topology", &topologyDict)
      .def("can_access_peer", &Communicator::canAccessPeer, py::arg("peer"))
      .def("all_gather_bytes", [](Communicator& c, const py::bytes& mine) {
        Bytes b = fromPyBytes(mine);
        std::vector<Bytes> all;
        {
          py::gil_scoped_release release;
          all = c.allGather(b);
        }
        py::list out;
        for (const auto& x : all) out.append(toPyBytes(x));
        return out;
      }, py::arg("data"))
      .def("barrier", &Communicator::barrier, py::call_guard<py::gil_scoped_release>())
      .def("send_bytes", [](Communicator& c, int peer, int tag, const py::bytes& data) {
        Bytes b = fromPyBytes(data);
        py::gil_scoped_release release;
        c.send(peer, tag, b);
      }, py::arg("peer"), py::arg("tag"), py::arg("data"))
      .def("recv_bytes", [](Communicator& c, int peer, int tag) {
        Bytes b;
        {
          py::gil_scoped_release release;
          b = c.recv(peer, tag);
        }
        return toPyBytes(b);
      }, py::arg("peer"), py::arg("tag"))
      .def("register_tensor", [](Communicator& c, const at::Tensor& t) {
        if (c.hostMode()) {
          PYCCL_CHECK_ARG(t.device().is_cpu(), "tensor", "is on ", t.device(),
                          " but this communicator is in host mode (cpu)");
        } else {
          PYCCL_CHECK_ARG(t.device().is_cuda(), "tensor", "is on ", t.device(),
                          " but this communicator is on cuda:", c.device());
          PYCCL_CHECK_ARG(t.device().index() == c.device(), "tensor", "is on ", t.device(),
                          " but this communicator is on cuda:", c.device());
        }
        auto [ptr, size] = tensorRange(t, "tensor");
        auto owner = std::make_shared<at::Tensor>(t);
        py::gil_scoped_release release;
        return c.registerMemory(ptr, size, owner);
      }, py::arg("tensor"))
      .def("register_memory", [](Communicator& c, uintptr_t ptr, size_t size) {
        py::gil_scoped_release release;
        return c.registerMemory(reinterpret_cast<void*>(ptr), size);
      }, py::arg("ptr"), py::arg("size"))
      .def("import_memory", [](Communicator& c, const py::bytes& desc) {
        Bytes b = fromPyBytes(desc);
        py::gil_scoped_release release;
        return c.importMemory(b);
      }, py::arg("descriptor"))
      .def("exchange_memory", &Communicator::exchangeMemory, py::arg("memory"),
           py::call_guard<py::gil_scoped_release>())
      .def("exchange_memories",
           [](Communicator& c, const std::vector<RegisteredMemory>& locals) {
             return c.exchangeMemories(locals);
           },
           py::arg("memories"), py::call_guard<py::gil_scoped_release>())
      .def("create_semaphore", &Communicator::createSemaphore, py::arg("peer"),
           py::call_guard<py::gil_scoped_release>())
      .def("device_error", [](const Communicator& c) -> py::object {
        DeviceErrorRecord rec = c.deviceError();
        if (rec.status == 0) return py::none();
        py::dict d;
        d["status"] = rec.status == static_cast<uint32_t>(WaitStatus::kTimeout)        ? "timeout"
                      : rec.status == static_cast<uint32_t>(WaitStatus::kUnregistered) ? "unregistered"
                      : rec.status == static_cast<uint32_t>(WaitStatus::kMismatch)     ? "mismatch"
                                                                                        : "aborted";
        d["peer"] = rec.peer;
        d["expected"] = rec.expected;
        d["observed"] = rec.observed;
        d["call"] = describeCallTag(rec.call);
        d["peers"] = ranksInMask(rec.peerMask);
        return d;
      })
      .def("history", [](const Communicator& c) {
        const uint64_t failed = c.failedCallTag();
        py::list out;
        for (const CallRecord& r : c.history()) {
          py::dict d;
          d["seq"] = r.seq;
          d["op"] = callOpName(r.op);
          d["bytes"] = r.bytes;
          d["dtype"] = r.dtype.empty() ? py::object(py::none()) : py::object(py::str(r.dtype));
          d["algorithm"] = r.algorithm;
          d["captured"] = r.captured;
          d["enqueued_us"] = r.enqueuedUs;
          d["state"] = callState(r, failed);
          out.append(std::move(d));
        }
        return out;
      })
      .def_property_readonly("history_total", &Communicator::historyTotal)
      // The text a breaking communicator logs (describeHistory): one format for every dump of the recorder.
      .def("describe_history", [](const Communicator& c) {
        return describeHistory(c.history(), c.failedCallTag(), c.historyTotal());
      })
      .def("create_memory_channel", [](Communicator& c, int peer, const RegisteredMemory& local,
                                       std::optional<RegisteredMemory> packets) {
        py::gil_scoped_release release;
        return c.createMemoryChannel(peer, local, packets.value_or(RegisteredMemory()));
      }, py::arg("peer"), py::arg("memory"), py::arg("packets") = py::none())
      .def("create_port_channel", &Communicator::createPortChannel, py::arg("peer"),
           py::arg("memory"), py::arg("transport") = "auto",
           py::call_guard<py::gil_scoped_release>())
      .def("create_switch_channel", [](Communicator& c, const RegisteredMemory& local) {
        return createSwitchChannel(c, local);
      }, py::arg("memory"), py::call_guard<py::gil_scoped_release>())
      .def("proxy_stats", [](Communicator& c) {
        auto p = c.proxyService();
        py::dict d;
        d["running"] = p->running();
        d["executed"] = p->executed();
        d["dropped"] = p->dropped();
        d["error"] = p->error();
        return d;
      })
      .def("stop_proxy", [](Communicator& c) { c.proxyService()->stop(); },
           py::call_guard<py::gil_scoped_release>(),
           "Stops the proxy now (pending triggers are dropped); for tests of shutdown.")
      .def_property_readonly("failure", [](const Communicator& c) { return c.health().failure(); })
      .def_property_readonly("sequence", [](const Communicator& c) { return c.health().lastSequence(); })
      .def("_inject_proxy_failure", [](Communicator& c, const std::string& reason) {
        c.proxyService()->injectFailure(reason);
      }, py::arg("reason"))
      .def("abort", &Communicator::abort)
      .def("close", &Communicator::close, py::call_guard<py::gil_scoped_release>());
}

void bindTensors(py::module_& m) {
  m.def("empty_shared", [](std::vector<int64_t> sizes, py::object dtype, const std::string& device) {
    at::ScalarType st = torch::python::detail::py_object_to_dtype(dtype);
    at::Device dev(device);
    py::gil_scoped_release release;
    return emptyShared(sizes, st, dev);
  }, py::arg("sizes"), py::arg("dtype"), py::arg("device"));
  m.def("tensor_of", [](const RegisteredMemory& mem, py::object dtype, std::vector<int64_t> shape,
                        int device) {
    at::ScalarType st = torch::python::detail::py_object_to_dtype(dtype);
    return tensorOf(mem, st, std::move(shape), device);
  }, py::arg("memory"), py::arg("dtype"), py::arg("shape"), py::arg("device"));
}

void bindSelftest(py::module_& m) {
  m.def("_run_channel_ops", [](Communicator& comm,
                               std::vector<std::shared_ptr<MemoryChannel>> memory,
                               std::vector<std::shared_ptr<PortChannel>> port,
                               std::vector<std::tuple<uint32_t, uint32_t, uint64_t, uint64_t, uint64_t, uint32_t>> ops,
                               int repeat, uint32_t blocks, uint32_t threads) {
    PYCCL_CHECK_ARG(memory.size() <= kMaxOpChannels && port.size() <= kMaxOpChannels, "channels",
                    "at most ", kMaxOpChannels, " of each kind");
    PYCCL_CHECK_ARG(!ops.empty() && ops.size() <= kMaxChannelOps, "ops", "1 to ", kMaxChannelOps, " ops");
    PYCCL_CHECK_ARG(repeat >= 1, "repeat", "must be >= 1");
    PYCCL_CHECK_ARG(blocks >= 1 && blocks <= 1024, "blocks", "must be in [1, 1024]");
    PYCCL_CHECK_ARG(threads >= 1 && threads <= 1024, "threads", "must be in [1, 1024]");
    ChannelOpsArgs args{};
    for (size_t i = 0; i < memory.size(); ++i) args.memory[i] = memory[i]->deviceHandle();
    for (size_t i = 0; i < port.size(); ++i) args.port[i] = port[i]->deviceHandle();
    for (size_t i = 0; i < ops.size(); ++i) {
      auto [code, channel, a, b, c, flag] = ops[i];
      PYCCL_CHECK_ARG(code >= 1 && code <= 15, "ops", "op ", i, " has unknown code ", code);
      const bool portOp = code >= 9 && code <= 13;
      PYCCL_CHECK_ARG(channel < (portOp ? port.size() : memory.size()), "ops", "op ", i,
                      " uses channel ", channel, " of ", portOp ? port.size() : memory.size());
      args.ops[i] = ChannelOp{code, channel, a, b, c, flag, 0};
    }
    args.numOps = static_cast<int>(ops.size());
    args.repeat = repeat;
    py::gil_scoped_release release;
    Communicator::HostKernelScope active(comm);
    ChannelOpsResult r;
#ifdef PYCCL_WITH_CUDA
    r = comm.hostMode() ? runChannelOpsHost(args, blocks) : runChannelOpsDevice(comm.device(), args, blocks, threads);
#else
    r = runChannelOpsHost(args, blocks);
#endif
    return std::make_tuple(r.failures, r.elapsedNs, r.launchToDoneUs);
  }, py::arg("comm"), py::arg("memory_channels"), py::arg("port_channels"), py::arg("ops"),
     py::arg("repeat") = 1, py::arg("blocks") = 1, py::arg("threads") = 512);

  m.def("_run_pingpong", [](Communicator& comm, std::shared_ptr<MemoryChannel> memory,
                            std::shared_ptr<PortChannel> port, uint32_t mode, uint64_t rounds,
                            bool initiator, uint32_t flagBase, bool check) {
    PYCCL_CHECK_ARG(mode <= static_cast<uint32_t>(PingPongMode::kPortSignal), "mode", "unknown mode ", mode);
    PYCCL_CHECK_ARG(rounds >= 1, "rounds", "must be >= 1");
    PYCCL_CHECK_ARG(memory != nullptr, "memory_channel", "is required (its buffer carries the checked words)");
    const auto m = static_cast<PingPongMode>(mode);
    const bool packets = m == PingPongMode::kPackets8 || m == PingPongMode::kPackets16;
    PYCCL_CHECK_ARG(!packets || memory->packetBytes() >= 16, "memory_channel",
                    "LL modes need a channel with a packet buffer");
    PYCCL_CHECK_ARG(!packets || (flagBase != 0 && flagBase + rounds - 1 >= flagBase), "flag_base",
                    "must be non-zero and leave room for ", rounds, " rounds without wrapping to 0");
    PYCCL_CHECK_ARG(m != PingPongMode::kPortSignal || port != nullptr, "port_channel",
                    "is required for the port mode");
    PYCCL_CHECK_ARG(!check || (memory->localSize() >= kPingPongLandingOffset + 8 &&
                               memory->remoteSize() >= kPingPongLandingOffset + 8),
                    "memory_channel", "check needs buffers of at least ", kPingPongLandingOffset + 8, " bytes");
    PingPongArgs args{};
    args.memory = memory->deviceHandle();
    if (port) args.port = port->deviceHandle();
    args.rounds = rounds;
    args.mode = mode;
    args.initiator = initiator ? 1 : 0;
    args.flagBase = flagBase;
    args.check = check ? 1 : 0;
    py::gil_scoped_release release;
    Communicator::HostKernelScope active(comm);
    PingPongResult r;
#ifdef PYCCL_WITH_CUDA
    r = comm.hostMode() ? runPingPongHost(args) : runPingPongDevice(comm.device(), args);
#else
    r = runPingPongHost(args);
#endif
    return std::make_tuple(r.failures, r.mismatches, r.elapsedNs, r.roundsDone);
  }, py::arg("comm"), py::arg("memory_channel"), py::arg("port_channel"), py::arg("mode"),
     py::arg("rounds"), py::arg("initiator"), py::arg("flag_base") = 1, py::arg("check") = false);

  m.def("_selftest_exchange", [](Communicator& comm, std::vector<std::optional<RegisteredMemory>> buffers,
                                 const RegisteredMemory& local,
                                 std::vector<std::shared_ptr<Semaphore>> semaphores,
                                 uint64_t wordsPerRank, uint32_t seed) {
    SelftestArgs args{};
    args.rank = comm.rank();
    args.localBuffer = static_cast<int32_t*>(local.data());
    args.wordsPerRank = wordsPerRank;
    args.seed = seed;
    PYCCL_CHECK_ARG(local.size() >= wordsPerRank * 4 * comm.worldSize(), "words_per_rank",
                    "needs ", wordsPerRank * 4 * comm.worldSize(), " bytes, buffer has ",
                    local.size());
    for (const auto& sem : semaphores) {
      PYCCL_CHECK_ARG(sem != nullptr, "semaphores", "contains None");
      const int p = sem->peer();
      PYCCL_CHECK_ARG(p < static_cast<int>(buffers.size()) && buffers[p].has_value(), "buffers",
                      "has no mapping of rank ", p);
      PYCCL_CHECK_ARG(args.numPeers < kSelftestMaxPeers, "semaphores", "too many peers");
      args.peerBuffers[args.numPeers] = static_cast<int32_t*>(buffers[p]->data());
      args.semaphores[args.numPeers] = sem->deviceHandle();
      args.peers[args.numPeers] = p;
      ++args.numPeers;
    }
    py::gil_scoped_release release;
    Communicator::HostKernelScope active(comm);
    SelftestResult r;
#ifdef PYCCL_WITH_CUDA
    r = comm.hostMode() ? runSelftestHost(args) : runSelftestDevice(comm.device(), args);
#else
    r = runSelftestHost(args);
#endif
    return std::make_pair(r.mismatches, r.waitFailures);
  }, py::arg("comm"), py::arg("buffers"), py::arg("local"), py::arg("semaphores"),
     py::arg("words_per_rank"), py::arg("seed"));
}

}  // namespace pyccl
