"""Memory and communication per device for QA training under each strategy: the planner's formulas.

Model states follow the ZeRO paper's accounting, written as DeepSpeed's own estimators write it where
they exist (ZeRO-2 and ZeRO-3, with and without offload; `tests/unit/test_plan.py` holds them to 1%), and as
qa_train really trains where they do not (DDP and FSDP keep fp32 weights under autocast). Activations
are counted tensor by tensor from the model's shape (what autograd keeps for the backward pass of one
BERT layer; with gradient checkpointing, each layer's input and one recomputed layer), then calibrated
against measured peaks (`CPU_CALIBRATION`).
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 1024**3
ADAM_BYTES = 8  # fp32 exp_avg + exp_avg_sq per parameter
FP32 = 4
DS_BUFFER_FACTOR = 1.5  # DeepSpeed's additional_buffer_factor for host memory
# Also the speed order the planner recommends by, fastest first: transformers' DeepSpeed guide ranks
# "Stage 0 (DDP) > Stage 1 > Stage 2 > Stage 2 + offload > Stage 3 > Stage 3 + offload"; FSDP's full shard
# moves what ZeRO-3 moves (3 x P per step against DDP's and ZeRO-1/2's 2 x P) and sits just ahead of it.
CONFIGS = ("ddp", "zero1", "zero2", "zero2_offload", "fsdp", "zero3", "zero3_offload")
SPEED_ORDER = CONFIGS


@dataclass(frozen=True)
class Calibration:
    """Measured activations = scale x the tensor count, plus a fixed working overhead per process."""

    activation_scale: float
    overhead_bytes: float
    source: str


# CPU (fp32; memory = host RSS during training above the idle baseline, the kernel's high-water mark): scale and
# overhead fitted by `python tools/calibrate_planner.py` over BERT shapes with SDPA
# (docs/benchmarks/2026-11-22-planner-calibration.md). The overhead is what a step needs besides tensors (oneDNN
# scratch, the autograd graph, thread stacks); the scale is glibc's heap slack between steps and small copies the
# count leaves out.
CPU_CALIBRATION = Calibration(
    1.09, 29 * 2**20, "calibrated on CPU runs: x1.09 + 29 MiB, docs/benchmarks/2026-11-22-planner-calibration.md"
)
# DDP on CPU processes: what gloo and DDP's reducer hold besides the buckets, the same at two model sizes
# (docs/benchmarks/2026-11-22-planner-calibration.md). NCCL's buffers on GPUs sit outside PyTorch's allocator and
# its peak, so there is no such term for CUDA.
CPU_DDP_RUNTIME_BYTES = 85 * 2**20
# CUDA: the tensor count as it stands. Checked on one H100 it reads slightly high, which a "will it fit" answer can
# afford, so no scale is fitted from one GPU's runs (docs/benchmarks/2026-11-22-planner-calibration.md).
CUDA_CALIBRATION = Calibration(1.0, 0.0, "the count unscaled: 0.99-1.10x the CUDA peak of 8 runs on one H100")
# ZeRO's gradient reduce bucket, in elements: what ds_configs' zero1, zero2, zero3 and zero3_offload set (a test
# holds them equal). In the gradients' dtype: two for ZeRO-1/2 (overlap_comm), one for ZeRO-3.
ZERO_REDUCE_BUCKET = 50_000_000
REDUCE_BUCKETS = {"zero1": 2, "zero2": 2, "zero3": 1, "zero3_offload": 1}


@dataclass(frozen=True)
class ModelShape:
    """What the formulas need of an encoder: sizes from its config, parameter counts from the model itself."""

    layers: int
    hidden: int
    heads: int
    intermediate: int
    num_parameters: int
    largest_layer_params: int  # the biggest single module's own parameters (DeepSpeed's "largest layer")
    matmul_params: int  # weights of the Linear layers: what autocast copies to 16 bits
    hidden_dropout: float
    attention_dropout: float


@dataclass(frozen=True)
class Setup:
    """The training the plan is for."""

    num_gpus: int
    num_nodes: int
    batch: int
    seq: int
    mixed_precision: str = "bf16"  # bf16, fp16 or no (fp32; the only choice on CPU)
    attention: str = "sdpa"  # sdpa or eager
    device: str = "cuda"  # cuda, or cpu (host RSS above the idle baseline is the memory)
    gradient_checkpointing: bool = False  # keep each layer's input, recompute the layer in the backward pass

    @property
    def gpus_per_node(self) -> int:
        return self.num_gpus // self.num_nodes

    @property
    def half(self) -> bool:
        return self.mixed_precision in ("bf16", "fp16")


@dataclass
class Estimate:
    """One config's figures per device, in bytes."""

    config: str
    model_states: float
    model_states_formula: str
    activations: float
    host_per_node: float | None  # DeepSpeed's host-memory estimate per node; None outside DeepSpeed
    comm_bytes: float
    comm_formula: str

    @property
    def total(self) -> float:
        return self.model_states + self.activations


def unplanned(config: str, setup: Setup) -> str | None:
    """Why the planner has no figure for `config` on `setup`'s device, or None. On CPU processes the host is the
    device: the states offload moves stay in the same process's RSS (DeepSpeed's host figure, counted apart from
    the device's, would read as freed)."""
    if setup.device == "cpu" and config.endswith("_offload"):
        return f"{config} on CPU: offloading to the host frees nothing when the host is the device"
    return None


def autocasts(config: str, setup: Setup) -> bool:
    """accelerate runs the forward pass under autocast except under DeepSpeed, whose engine holds 16-bit weights."""
    return setup.half and config in ("single", "ddp", "fsdp")


# --- model states ------------------------------------------------------------------------------


def model_states(config: str, shape: ModelShape, setup: Setup) -> tuple[float, str, float | None]:
    """(bytes per device, the formula in words, host bytes per node or None)."""
    p, n, big = shape.num_parameters, setup.num_gpus, shape.largest_layer_params
    w = 2 if setup.half else FP32  # what DeepSpeed keeps weights and gradients in on the device
    if config in ("single", "ddp"):
        # Autocast leaves the weights fp32 (4 + gradients 4 + Adam 8) and keeps a 16-bit copy of each matmul
        # weight for the backward pass; DDP's gradient buckets (accelerate leaves gradient_as_bucket_view off)
        # are a second copy of the gradients.
        copies = 2.0 * shape.matmul_params if autocasts(config, setup) else 0.0
        plus, why = (" + 2M", "; autocast's 16-bit copies of the M matmul weights") if copies else ("", "")
        if n == 1:
            return 16.0 * p + copies, f"16P{plus} (fp32 weights 4 + gradients 4 + Adam 8{why})", None
        runtime, on_cpu = (CPU_DDP_RUNTIME_BYTES, " + 85 MiB gloo/DDP runtime") if setup.device == "cpu" else (0, "")
        return (
            20.0 * p + copies + runtime,
            f"20P{plus}{on_cpu} (fp32 weights 4 + gradients 4 + DDP buckets 4 + Adam 8{why})",
            None,
        )
    buckets = reduce_buckets(config, shape, setup)
    if config == "zero1":
        per = FP32 + FP32 + ADAM_BYTES
        return (
            2 * w * p + per * p / n + buckets,
            f"{2 * w}P + {per}P/N + 2B (weights and gradients whole; fp32 gradients, master and Adam split; "
            f"two reduce buckets)",
            None,
        )
    if config == "zero2":
        # DeepSpeed's estimate_zero2_model_states_mem_needs: 2P + 18P/N, host 4P per GPU x 1.5; plus the buckets.
        per = w + FP32 + FP32 + ADAM_BYTES
        host = p * FP32 * setup.gpus_per_node * DS_BUFFER_FACTOR
        return (
            w * p + per * p / n + buckets,
            f"{w}P + {per}P/N + 2B (weights whole; gradients, master and Adam split; two reduce buckets)",
            host,
        )
    if config == "zero2_offload":
        host = p * max(4 * n, 16) * DS_BUFFER_FACTOR
        return w * p, f"{w}P (weights only; master, gradients and Adam on the host)", host
    if config == "zero3":
        # DeepSpeed's estimate_zero3_model_states_mem_needs with zero_init off (zero3_init_flag: false in our
        # YAMLs): 18P/N + 4L, host 4P per GPU x 1.5 (each process builds the whole model before partitioning).
        per = w + FP32 + FP32 + ADAM_BYTES
        host = p * FP32 * setup.gpus_per_node * DS_BUFFER_FACTOR
        return (
            per * p / n + FP32 * big + buckets,
            f"{per}P/N + 4L + B (everything split; L = largest layer, gathered; one reduce bucket)",
            host,
        )
    if config == "zero3_offload":
        host = p * max(4 * setup.gpus_per_node, 18 / setup.num_nodes) * DS_BUFFER_FACTOR
        return (
            FP32 * big + buckets,
            "4L + B (only the layer being computed and one reduce bucket; the rest on the host)",
            host,
        )
    if config == "fsdp":
        # FSDP2 keeps fp32 shards of weights, gradients and Adam state and gathers one unit at a time: DeepSpeed's
        # ZeRO-3 allowance for the gathered unit. It read high on one H100 (docs/benchmarks/2026-11-25-gpu-h100.md), and
        # low on CPU where glibc's heap keeps the gathered buffers (docs/benchmarks/2026-11-25-cpu-fsdp.md).
        cpu = setup.device == "cpu"
        heap = "; on CPU glibc's heap keeps the gathers unless MALLOC_MMAP_THRESHOLD_=131072" if cpu else ""
        return 16.0 * p / n + FP32 * big, f"16P/N + 4L (fp32 shards; L = largest unit, gathered{heap})", None
    raise ValueError(f"unknown config {config!r}; one of single, {', '.join(CONFIGS)}")


def reduce_buckets(config: str, shape: ModelShape, setup: Setup) -> float:
    """Bytes of ZeRO's gradient reduce buckets on the device: allocated whole on CUDA; on CPU only the elements
    the gradients fill are ever touched, so the host's resident memory sees at most the parameter count."""
    elements = ZERO_REDUCE_BUCKET if setup.device == "cuda" else min(ZERO_REDUCE_BUCKET, shape.num_parameters)
    return REDUCE_BUCKETS.get(config, 0) * float(elements) * (2 if setup.half else FP32)


# --- activations -------------------------------------------------------------------------------


def stores_scores(shape: ModelShape, setup: Setup) -> bool:
    """Whether a layer keeps the b x heads x s x s attention probabilities for its backward pass.

    Eager attention always does. SDPA's flash kernels keep only the output and a log-sum-exp, except on
    CPU with attention dropout, where PyTorch falls back to the math kernel that materialises them."""
    if setup.attention == "eager":
        return True
    return setup.device == "cpu" and shape.attention_dropout > 0


def saved_activation_bytes(shape: ModelShape, setup: Setup, autocast: bool = False) -> float:
    """Bytes autograd saves in one micro-batch's forward pass for the backward, counted tensor by tensor.

    Per layer (Korthikanti et al. 2022, "Reducing Activation Recomputation", Sec. 4.1, for BERT's
    post-LayerNorm block): the inputs of the Q/K/V, output and two MLP projections, Q, K and V, the two
    LayerNorm inputs and the GELU input = 8 b s h + 2 b s i values; two dropout masks where dropout is on
    (1 byte per value on CUDA; PyTorch keeps them in the values' dtype on CPU); then either the
    b x heads x s x s attention probabilities (the softmax output in fp32, as transformers' eager path and
    the CPU math kernel compute it, a 16-bit copy for the next matmul, and dropout's mask and output) or
    the flash kernel's output and log-sum-exp. At i = 4h, 2-byte values and 1-byte masks that is the paper's
    34 s b h + 5 a s^2 b. Under autocast the LayerNorm inputs stay fp32 and each of Q, K and V casts (and
    keeps) its own 16-bit copy of the layer input. Once per micro-batch: the embeddings' LayerNorm input
    (and dropout mask), the QA head's input, and SDPA's b x s x s attention mask.
    With gradient checkpointing see `checkpointed_bytes`.
    `tests/unit/test_plan.py` holds this to the tensors autograd really saves.
    """
    if setup.gradient_checkpointing:
        return sum(checkpointed_bytes(shape, setup, autocast))
    per_layer, once = layer_and_once_bytes(shape, setup, autocast)
    return shape.layers * per_layer + once


def layer_and_once_bytes(shape: ModelShape, setup: Setup, autocast: bool) -> tuple[float, float]:
    """(what one layer saves, what the micro-batch saves once outside the layers): `saved_activation_bytes`'s terms."""
    b, s, h, i, a = setup.batch, setup.seq, shape.hidden, shape.intermediate, shape.heads
    d = activation_dtype_bytes(setup)
    norm = FP32 if autocast else d  # LayerNorm runs in fp32 under autocast
    mask = 1 if setup.device == "cuda" else d  # dropout masks: bool on CUDA, the values' dtype on CPU
    sbh, sbi, scores = s * b * h, s * b * i, a * s * s * b
    per_layer = d * ((8 if autocast else 6) * sbh + 2 * sbi) + norm * 2 * sbh
    per_layer += 2 * mask * sbh if shape.hidden_dropout > 0 else 0
    once = norm * sbh + d * sbh + (mask * sbh if shape.hidden_dropout > 0 else 0)
    if stores_scores(shape, setup):
        per_layer += (FP32 + (d if d != FP32 else 0)) * scores
        per_layer += (mask + d) * scores if shape.attention_dropout > 0 else 0
    else:
        per_layer += d * sbh + FP32 * a * s * b
        once += d * b * s * s
    return per_layer, once


def checkpointed_bytes(shape: ModelShape, setup: Setup, autocast: bool = False) -> tuple[float, float]:
    """(what autograd holds after the forward pass with gradient checkpointing, what one recomputed layer adds).

    Each encoder layer's forward runs inside torch.utils.checkpoint, which keeps only the layer's inputs: the
    hidden states (a LayerNorm's output, so fp32 under autocast) and the attention mask, one tensor for all the
    layers (bool for SDPA, the model's dtype for eager attention); what a layer would save is recomputed from
    them in the backward pass, one layer at a time (Chen et al. 2016, "Training Deep Nets with Sublinear Memory
    Cost"; Korthikanti et al. 2022 count full recomputation as 2 s b h bytes per layer at 2-byte values).
    Outside the layers, as without checkpointing: the embeddings' and the QA head's tensors; SDPA's
    floating-point mask is made inside the layer, so it comes back with the recomputed layer. The recomputed
    layer's own input is counted twice (s b h values, a layer's 2-3%)."""
    b, s = setup.batch, setup.seq
    per_layer, once = layer_and_once_bytes(shape, setup, autocast)
    model_dtype = FP32 if autocast else activation_dtype_bytes(setup)  # fp32 master weights under autocast
    float_mask = 0 if stores_scores(shape, setup) else activation_dtype_bytes(setup) * b * s * s
    mask_input = (1 if setup.attention == "sdpa" else model_dtype) * b * s * s
    kept = shape.layers * model_dtype * s * b * shape.hidden + once - float_mask + mask_input
    return kept, per_layer + float_mask


def backward_transient_bytes(shape: ModelShape, setup: Setup) -> float:
    """The largest gradients alive at once on top of the saved activations: in a layer's backward pass, two
    of the GELU's size (fc2's input gradient and the GELU's), or two of the attention probabilities' where
    those are kept (softmax's input and output gradients)."""
    d, b, s = activation_dtype_bytes(setup), setup.batch, setup.seq
    largest = max(s * b * shape.intermediate, shape.heads * s * s * b if stores_scores(shape, setup) else 0)
    return 2 * d * largest


def activation_dtype_bytes(setup: Setup) -> int:
    return 2 if setup.half else FP32


def calibration(setup: Setup) -> Calibration:
    return CPU_CALIBRATION if setup.device == "cpu" else CUDA_CALIBRATION


def activation_bytes(config: str, shape: ModelShape, setup: Setup) -> float:
    """The planner's activation memory for one micro-batch: the tensor count, calibrated (`CPU_CALIBRATION`)."""
    cal = calibration(setup)
    tensors = saved_activation_bytes(shape, setup, autocasts(config, setup)) + backward_transient_bytes(shape, setup)
    return cal.activation_scale * tensors + cal.overhead_bytes


# --- communication -----------------------------------------------------------------------------


def comm_volume(config: str, shape: ModelShape, setup: Setup) -> tuple[float, str]:
    """Bytes each device sends per optimizer step without accumulation, and the formula. Ring collectives:
    an all-reduce sends 2(N-1)/N of its buffer, a reduce-scatter or an all-gather (N-1)/N."""
    n, p = setup.num_gpus, shape.num_parameters
    if n == 1:
        return 0.0, "none (one device)"
    ring = (n - 1) / n
    w = 2 if setup.half else FP32
    if config == "ddp":
        return 2 * ring * FP32 * p, "all-reduce of fp32 gradients: 2(N-1)/N x 4P"
    if config in ("zero1", "zero2"):
        return 2 * ring * w * p, f"reduce-scatter gradients + all-gather weights: 2(N-1)/N x {w}P"
    if config == "zero2_offload":
        return 2 * ring * w * p, f"2(N-1)/N x {w}P, plus {w}P/N each way over PCIe"
    if config in ("zero3", "fsdp"):
        return 3 * ring * w * p, f"all-gather weights twice + reduce-scatter gradients: 3(N-1)/N x {w}P"
    return 3 * ring * w * p, f"3(N-1)/N x {w}P, every gathered weight also crossing PCIe"


def estimate(config: str, shape: ModelShape, setup: Setup) -> Estimate:
    states, states_formula, host = model_states(config, shape, setup)
    comm, comm_formula = comm_volume(config, shape, setup)
    return Estimate(config, states, states_formula, activation_bytes(config, shape, setup), host, comm, comm_formula)
