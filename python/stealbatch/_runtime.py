"""The Runtime: a torch.nn.Module trained on stealbatch's runtime (the _core extension)."""
import contextlib
import copy
import os
import threading

import torch

from . import _core, _torchrun


class _CudaArray:
    """GPU memory the runtime owns, seen by torch.as_tensor through the CUDA array interface (no copy)."""

    def __init__(self, address, count):
        self.__cuda_array_interface__ = {"shape": (count,), "typestr": "<f4", "data": (address, False), "version": 2}


def launch_environment():
    """What the launcher set: (rank, world size, local rank) from torchrun's or Open MPI's variables, else (0, 1, 0)."""
    env = os.environ
    for rank, size, local in (("RANK", "WORLD_SIZE", "LOCAL_RANK"),
                              ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK")):
        if rank in env and size in env:
            return int(env[rank]), int(env[size]), int(env.get(local, "0"))
    return 0, 1, 0


def _cluster(cluster):
    """cluster="auto": "mpi" when mpirun started several processes, "torchrun" when torchrun did, "none" for one."""
    if cluster != "auto":
        return cluster
    _, world, _ = launch_environment()
    if world <= 1:
        return "none"
    if "OMPI_COMM_WORLD_SIZE" in os.environ or "PMI_SIZE" in os.environ:
        return "mpi"
    return "torchrun"


def _torchrun_ranks():
    """(rank, world size) from torchrun's RANK and WORLD_SIZE."""
    try:
        return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    except (KeyError, ValueError) as e:
        raise _core.ConfigError(f"cluster = 'torchrun': RANK and WORLD_SIZE must be set to integers, as torchrun sets them ({e})") from None


def _usable_cores():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


class Runtime:
    """Trains `module` on the given devices; see the package's docstring.

    module: a torch.nn.Module whose parameters are float32. It stays yours: the runtime trains one replica of it per
        device (copies made here) and copy_to() writes the trained values back into it.
    devices: "cpu:N", "cuda:all", "cuda:0,1", "vgpu:64,16" (parts of one GPU), "sim:1,0.5"; "" = every GPU, else CPUs.
    optimizer: "sgd" (lr, momentum, weight_decay) or "adam" (lr, betas, eps, weight_decay): the runtime's own, applied
        once per step to every replica.
    policy: "steal" (the default) or "static" (an equal split, no stealing: what DDP does).
    chunk_size: samples per chunk; 0 picks each device's size from its measured throughput.
    cluster: "auto" (the default: "mpi" under mpirun with more than one process, "torchrun" under torchrun with more
        than one, else "none"), "none", "mpi" or "torchrun": one process per node (or per device), every rank calling
        step() with the same batch. torchrun's processes join through an MPI port whose name goes around through
        torch.distributed's store (MASTER_ADDR:MASTER_PORT, shared with init_process_group's), with Open MPI's
        ompi-server, which rank 0 starts. As with DDP, every rank starts from rank 0's parameters.
    wire: across ranks, the gradient's format on the wire: "float32" or "bf16" (half the bytes, as DDP's
        bf16_compress_hook; each value rounded, the sum within RuntimeOptions::cluster.wire's bound).
    The rest are RuntimeOptions' (runtime.hpp): placement, placement_weights, deterministic, merge_stolen, endgame,
    threads_per_device, slowdown, stall_timeout, heartbeat_timeout, on_device_failure, trace (a Chrome trace's path),
    seed, in_flight. (gpu.graphs is not offered: a Python loss runs host code and allocates at every call, which a
    graph's replay would skip.)

    A module's buffers (BatchNorm's running statistics) are each replica's own, as DDP's are each rank's between its
    broadcasts: copy_to() and state_dict() take device 0's.
    """

    def __init__(self, module, *, devices="", optimizer="sgd", lr=0.05, momentum=0.9, betas=(0.9, 0.999), eps=1e-8,
                 weight_decay=0.0, policy="steal", chunk_size=0, placement="auto", placement_weights=None,
                 deterministic=False, merge_stolen=True, endgame=True, threads_per_device=0, slowdown=None, stall_timeout=600.0,
                 heartbeat_timeout=10.0, on_device_failure="fail", trace=None, cluster="auto", seed=0x5eedba7c,
                 in_flight=2, wire="float32"):
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
        named = list(module.named_parameters())
        if not named:
            raise _core.ConfigError("module: it has no parameters")
        for name, p in named:
            if p.dtype != torch.float32:
                raise _core.ConfigError(f"module: parameter '{name}' is {p.dtype}; the runtime trains float32 parameters")
        o = _core.Options()
        o.devices, o.optimizer, o.lr, o.momentum = devices, optimizer, float(lr), float(momentum)
        o.beta1, o.beta2, o.eps, o.weight_decay = float(betas[0]), float(betas[1]), float(eps), float(weight_decay)
        o.policy, o.chunk_size, o.placement = policy, int(chunk_size), placement
        o.placement_weights = list(placement_weights or [])
        o.deterministic, o.merge_stolen, o.endgame = bool(deterministic), bool(merge_stolen), bool(endgame)
        o.threads_per_device = int(threads_per_device)
        o.slowdown = list(slowdown or [])
        o.stall_timeout, o.heartbeat_timeout, o.on_device_failure = float(stall_timeout), float(heartbeat_timeout), on_device_failure
        o.trace_path, o.seed, o.in_flight, o.wire = trace or "", int(seed), int(in_flight), wire
        o.cluster = _cluster(cluster)
        if o.cluster == "torchrun":
            o.job, o.cluster = _torchrun.join(*_torchrun_ranks()), "none"
        self._rt = _core.Runtime(o)
        self._module = module
        self._slots = []  # (offset, count, shape) per parameter, in named_parameters() order
        offset = 0
        for _, p in named:
            self._slots.append((offset, p.numel(), tuple(p.shape)))
            offset += p.numel()
        initial = torch.cat([p.detach().reshape(-1).to("cpu", torch.float32) for _, p in named]).contiguous()
        self._rt.register_parameters([(n, list(p.shape)) for n, p in named], initial.data_ptr(), initial.numel())
        count = self._rt.device_count
        self._replicas = [copy.deepcopy(module) for _ in range(count)]
        self._bound = [None] * count  # the (params, grad) addresses each replica is bound to
        self._grads = [None] * count  # each replica's gradient views (_bind), which _settle() restores
        # torch's intra-op threads on each device's worker: the runtime's CPU devices' share of the cores, one in
        # deterministic mode (a sum's order must not depend on the thread count).
        self._threads = 1 if deterministic else int(threads_per_device) or self._rt.threads_per_device or max(1, _usable_cores() // count)
        self._threads_set = set()  # the OS threads (threading.get_ident()) whose intra-op threads are set

    # -- what a DDP user calls -------------------------------------------------------------------------------------

    def step(self, samples, loss_fn, *, data=None, cost=None):
        """One training step over `samples` (sample ids: a tensor or a sequence of ints) and the optimizer's update.

        loss_fn(replica, ids) -> the summed loss of those samples (a scalar tensor); with data=(X, Y, ...), tensors
        whose first dimension is the sample, loss_fn(replica, X[ids], Y[ids], ...) instead. The runtime divides the
        summed gradient by the number of samples. cost: one positive number per sample (its tokens, say), with
        which the batch is cut and placed by cost. Returns a StepReport."""
        return self._step(samples, loss_fn, data, cost, update=True)

    def compute_gradient(self, samples, loss_fn, *, data=None, cost=None):
        """As step(), without the update: gradient() then holds the full-batch mean gradient."""
        return self._step(samples, loss_fn, data, cost, update=False)

    def gradient(self):
        """The last compute_gradient()'s mean gradient, flat, in the module's named_parameters() order (a copy)."""
        return torch.frombuffer(bytearray(self._rt.gradient()), dtype=torch.float32)

    def parameters(self, device=0):
        """The trained values, flat, in named_parameters() order (a copy)."""
        return torch.frombuffer(bytearray(self._rt.parameters(device)), dtype=torch.float32)

    def state_dict(self):
        """The trained values as {name: tensor} (copies), as the module's state_dict() names them: the parameters,
        and device 0's buffers."""
        flat = self.parameters()
        names = [n for n, _ in self._module.named_parameters()]
        out = {n: flat[o:o + c].view(s).clone() for n, (o, c, s) in zip(names, self._slots)}
        out.update({n: b.detach().to("cpu").clone() for n, b in self._replicas[0].named_buffers()})
        return out

    def copy_to(self, module=None):
        """Writes the trained values into `module` (default: the module given at construction) and returns it: the
        parameters, and device 0's buffers."""
        module = self._module if module is None else module
        flat = self.parameters()
        with torch.no_grad():
            for (o, c, s), p in zip(self._slots, module.parameters()):
                p.copy_(flat[o:o + c].view(s))
            for b, mine in zip(module.buffers(), self._replicas[0].buffers()):
                b.copy_(mine)
        return module

    @property
    def lr(self):
        raise AttributeError("lr is write-only: set it for the following steps")

    @lr.setter
    def lr(self, value):
        self._rt.set_learning_rate(float(value))

    def save_checkpoint(self, path, metadata=None):
        """Writes the parameters, the optimizer's state and `metadata` (str -> str) in safetensors, crash-safe."""
        self._rt.save_checkpoint(os.fspath(path), {str(k): str(v) for k, v in (metadata or {}).items()})

    def load_checkpoint(self, path):
        """Restores what save_checkpoint() (here or in C++) wrote; returns its metadata. Checked before applied."""
        return dict(self._rt.load_checkpoint(os.fspath(path)))

    @property
    def device_count(self):
        return self._rt.device_count

    @property
    def device_names(self):
        return [self._rt.device_name(d) for d in range(self._rt.device_count)]

    # -- the chunks ------------------------------------------------------------------------------------------------

    def _step(self, samples, loss_fn, data, cost, update):
        if not callable(loss_fn):
            raise TypeError(f"loss_fn must be callable, got {type(loss_fn).__name__}")
        ids = torch.as_tensor(samples)
        if ids.dim() != 1 or ids.dtype.is_floating_point or ids.dtype == torch.bool:
            raise _core.ConfigError(f"samples: one-dimensional integer sample ids expected, got {tuple(ids.shape)} {ids.dtype}")
        ids = ids.to("cpu", torch.int64).contiguous()
        if data is not None:
            data = tuple(data) if isinstance(data, (tuple, list)) else (data,)
            for i, t in enumerate(data):
                if not isinstance(t, torch.Tensor):
                    raise TypeError(f"data[{i}] must be a tensor, got {type(t).__name__}")
        costs = None
        if cost is not None:
            costs = torch.as_tensor(cost, dtype=torch.float64).to("cpu").contiguous()
            if costs.shape != ids.shape:
                raise _core.ConfigError(f"cost: one per sample expected ({ids.numel()}), got shape {tuple(costs.shape)}")

        def chunk(c):
            self._run_chunk(c, loss_fn, data)

        return self._rt.step(ids.data_ptr(), ids.numel(), chunk, 0 if costs is None else costs.data_ptr(), update)

    def _run_chunk(self, c, loss_fn, data):
        d = c.device
        replica = self._replicas[d]
        if c.on_gpu:
            return self._run_gpu_chunk(c, replica, loss_fn, data)
        if threading.get_ident() not in self._threads_set:  # each chunk call has a thread state of its own: keyed by OS thread
            torch.set_num_threads(self._threads)  # this worker's intra-op threads
            self._threads_set.add(threading.get_ident())
        if self._bound[d] != (c.params_address, c.grad_address):
            self._bind(d, torch.frombuffer(c.params(), dtype=torch.float32), torch.frombuffer(c.grad(), dtype=torch.float32))
            self._bound[d] = (c.params_address, c.grad_address)
        ids = torch.frombuffer(c.samples, dtype=torch.int64)  # a copy of the chunk's own
        loss = self._loss(loss_fn, replica, ids, data, None)
        loss.backward()
        self._settle(replica, d)
        c.add_loss(float(loss.detach()))

    def _run_gpu_chunk(self, c, replica, loss_fn, data):
        device = torch.device("cuda", torch.cuda.current_device() if c.gpu_index < 0 else c.gpu_index)
        stream = torch.cuda.ExternalStream(c.stream, device=device)
        with torch.cuda.device(device), torch.cuda.stream(stream):
            if self._bound[c.device] != (c.params_address, c.grad_address):
                replica.to(device)  # its buffers; its parameters become views of the device's below
                flat_p = torch.as_tensor(_CudaArray(c.params_address, c.size), device=device)
                flat_g = torch.as_tensor(_CudaArray(c.grad_address, c.size), device=device)
                self._bind(c.device, flat_p, flat_g)
                self._bound[c.device] = (c.params_address, c.grad_address)
            ids = torch.frombuffer(c.samples, dtype=torch.int64)
            # Every part of a GPU is one device index, whose backward passes libtorch would run on one engine thread:
            # with its multithreading off (torch 2.0 and later) this worker runs its own, on its own stream.
            off = getattr(torch.autograd, "set_multithreading_enabled", None)
            with (off(False) if off is not None else contextlib.nullcontext()):
                loss = self._loss(loss_fn, replica, ids, data, device)
                loss.backward()
            self._settle(replica, c.device)
            total = torch.as_tensor(_CudaArray(c.device_loss_address, 1), device=device)
            total.add_(loss.detach().to(torch.float32).reshape(1))  # in stream order; read after the step's chunks

    @staticmethod
    def _loss(loss_fn, replica, ids, data, device):
        if data is None:
            loss = loss_fn(replica, ids if device is None else _to(ids, device))
        else:
            rows = [t.index_select(0, ids if t.device.type == "cpu" else _to(ids, t.device)) for t in data]
            if device is not None:
                rows = [_to(r, device) for r in rows]
            loss = loss_fn(replica, *rows)
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            raise TypeError(f"loss_fn must return the chunk's summed loss as a one-element tensor, got {_describe(loss)}")
        return loss

    def _bind(self, d, flat_p, flat_g):
        """Replica d's parameters become views of the device's parameters, their gradients views of its gradient."""
        self._grads[d] = [flat_g[o:o + c].view(s) for o, c, s in self._slots]
        for (o, c, s), p, grad in zip(self._slots, self._replicas[d].parameters(), self._grads[d]):
            p.data = flat_p[o:o + c].view(s)
            p.grad = grad

    def _settle(self, replica, d):
        """A gradient that autograd replaced instead of accumulating in place is added to the view and the view restored."""
        for p, view in zip(replica.parameters(), self._grads[d]):
            g = p.grad
            if g is None or g.data_ptr() != view.data_ptr():
                if g is not None:
                    view.copy_(g)  # the replaced gradient holds what the view held plus this chunk's
                p.grad = view


def _to(t, device):
    """`t` on `device`, from the host through pinned memory and without blocking (a copy from pageable memory would
    wait for the stream, and the device's chunks in flight with it); between GPUs as torch copies."""
    if t.device == device:
        return t
    if t.device.type == "cpu" and device.type == "cuda":
        t = t.pin_memory()
    return t.to(device, non_blocking=True)


def _describe(x):
    if isinstance(x, torch.Tensor):
        return f"a tensor of shape {tuple(x.shape)}"
    return type(x).__name__
