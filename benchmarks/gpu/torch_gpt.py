"""The PyTorch peer in the GPU script's run: a GPT of exactly the `transformer` architecture's shape, and the attention
ops alone, timed as `training_step.py` and `layers.py` time ours.

`steps`: the GPT's training step at each T, eager and `torch.compile`d: causal attention by
`scaled_dot_product_attention(is_causal=True)` (FlashAttention on a GPU), bfloat16 autocast over float32
weights (Keras' mixed_bfloat16), fused AdamW, cross-entropy on the `[B, T, V]` logits. The network is
`ElitaBackbone.from_architecture("transformer", max_sequence_length=T)` layer for layer, weights and
epsilons included (its parameter count is the Keras model's):

    token embedding [V, d] + learned positions [T, d]
    L x:  x += W_O SDPA_causal(split_heads(W_QKV LN(x)))     (LN epsilon 1e-5; H heads of D; biases)
          x += W_2 GELU(W_1 LN(x))                           (4d, exact GELU, biases; LN epsilon 1e-5)
    final LN (epsilon 1e-3), untied head [d, V] with a bias

(the query, key and value projections as one matrix product, as GPT implementations take them: the same
weights as Keras' three). `ops`: forward and forward+backward of the attention op alone on bfloat16
`[B, H, T, D]` inputs: `sdpa`, causal SDPA (PyTorch's FlashAttention-2 kernel on a GPU), and `fla`,
flash-linear-attention's `chunk_linear_attn` (`[B, T, H, D]`, normalised; positive queries and keys, as
a feature map gives), when it imports.

Runs from a Python with PyTorch and without TensorFlow (a lent GPU machine's own `python3`); it imports
`MODEL_SIZES` from elita_tf (no TensorFlow). Each setting runs in a process of its own and prints one JSON
line per measurement; on a CPU (CI's `--quick` run) `torch.compile` and fla are reported skipped: they
need CUDA and Triton.

    python benchmarks/gpu/torch_gpt.py steps --size 25m --sequence-lengths 8192 2048 --tokens 16384
    python benchmarks/gpu/torch_gpt.py ops --subjects sdpa fla --sequence-lengths 8192 65536 --tokens 65536
"""

import argparse
import json
import os
import platform
import resource
import statistics
import sys
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parents[2])]

from measure import rss_mib, run_measurements, time_left  # noqa: E402  (after the path)

from elita_tf.models import MODEL_SIZES  # noqa: E402

# The `transformer` architecture's epsilons (elita_tf/models/elita_backbone.py): its blocks' LayerNorms, the final one.
BLOCK_NORM_EPSILON = 1e-5
FINAL_NORM_EPSILON = 1e-3
NEEDS_CUDA = "needs CUDA and Triton"


def gpt(vocabulary_size, hidden_dim, num_layers, num_heads, head_dim, max_sequence_length):
    """The GPT as a `torch.nn.Module` whose `forward(token_ids, labels)` returns the mean cross-entropy."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    width = num_heads * head_dim

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.mixer_norm = nn.LayerNorm(hidden_dim, eps=BLOCK_NORM_EPSILON)
            self.qkv = nn.Linear(hidden_dim, 3 * width)
            self.attention_output = nn.Linear(width, hidden_dim)
            self.ffn_norm = nn.LayerNorm(hidden_dim, eps=BLOCK_NORM_EPSILON)
            self.inner = nn.Linear(hidden_dim, 4 * hidden_dim)
            self.outer = nn.Linear(4 * hidden_dim, hidden_dim)

        def forward(self, x):
            batch, length, _ = x.shape
            qkv = self.qkv(self.mixer_norm(x)).view(batch, length, 3, num_heads, head_dim)
            q, k, v = qkv.permute(2, 0, 3, 1, 4)  # each [B, H, T, D]
            context = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.attention_output(context.transpose(1, 2).reshape(batch, length, width))
            return x + self.outer(F.gelu(self.inner(self.ffn_norm(x))))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.token_embedding = nn.Embedding(vocabulary_size, hidden_dim)
            self.position_embedding = nn.Parameter(torch.randn(max_sequence_length, hidden_dim) * 0.02)
            self.blocks = nn.ModuleList(Block() for _ in range(num_layers))
            self.final_norm = nn.LayerNorm(hidden_dim, eps=FINAL_NORM_EPSILON)
            self.logits = nn.Linear(hidden_dim, vocabulary_size)

        def forward(self, token_ids, labels):
            x = self.token_embedding(token_ids) + self.position_embedding[: token_ids.shape[1]]
            for block in self.blocks:
                x = block(x)
            logits = self.logits(self.final_norm(x))
            return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten())

    return GPT()


def _device():
    import torch

    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _environment(device):
    import torch

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    return {"framework": "pytorch", "device": name, "torch": torch.__version__}


def _peak_mib(device, base_rss):
    """The most memory the measured work held: PyTorch's allocator peak on a GPU, else the resident set's."""
    import torch

    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20, "gpu"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - base_rss, "rss"


def run_step(args):
    """One (mode, T): the first step (compilation) apart, then the median of `--repeats` steps."""
    import torch

    device = _device()
    base = rss_mib()
    torch.manual_seed(0)
    torch.set_float32_matmul_precision("high")
    batch = max(1, args.tokens // args.sequence_length)
    module = gpt(
        args.vocabulary_size, args.hidden_dim, args.num_layers, args.num_heads, args.head_dim, args.sequence_length
    ).to(device)
    params = sum(p.numel() for p in module.parameters())
    try:
        optimizer, kind = torch.optim.AdamW(module.parameters(), lr=1e-3, fused=True), "AdamW(fused)"
    except (RuntimeError, ValueError):  # a CPU build without the fused kernel
        optimizer, kind = torch.optim.AdamW(module.parameters(), lr=1e-3, foreach=True), "AdamW(foreach)"
    model = torch.compile(module) if args.mode == "compiled" else module
    shape = (batch, args.sequence_length)
    x = torch.randint(0, args.vocabulary_size, shape, device=device)
    y = torch.randint(0, args.vocabulary_size, shape, device=device)

    def step():
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = model(x, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(loss)  # waits for the step

    times = []
    for i in range(args.repeats + 1):
        start = time.perf_counter()
        loss = step()
        times.append(time.perf_counter() - start)
        if i == 0 and device.type == "cuda":  # from here on, the allocator's peak is the steps' own
            torch.cuda.reset_peak_memory_stats(device)
    peak, where = _peak_mib(device, base)
    result = {
        "torch_gpt": args.mode,
        "size": args.size,
        "T": args.sequence_length,
        "B": batch,
        "params": params,
        "compile_s": times[0],
        "step_s": statistics.median(times[1:]),
        "loss": loss,
        "dtype": "bfloat16 autocast",
        "optimizer": kind,
        "peak_mib": peak,
        "peak_memory": where,
        **_environment(device),
    }
    print(json.dumps(result), flush=True)


def _attention_op(subject, batch, heads, length, depth, device):
    """`(inputs, forward)` of an attention op at one shape, its inputs leaf tensors that take gradients."""
    import torch
    import torch.nn.functional as F

    if subject == "sdpa":
        inputs = [torch.randn(batch, heads, length, depth, device=device, dtype=torch.bfloat16) for _ in range(3)]
        if device.type == "cuda":
            from torch.nn.attention import SDPBackend, sdpa_kernel

            def forward(q, k, v):
                with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=True)

            return inputs, forward, "flash"
        return inputs, lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), "default"
    from fla.ops.linear_attn import chunk_linear_attn

    # Positive queries and keys (a feature map's output), so that the normaliser stays away from zero.
    q, k = (torch.rand(batch, length, heads, depth, device=device, dtype=torch.bfloat16) for _ in range(2))
    v = torch.randn(batch, length, heads, depth, device=device, dtype=torch.bfloat16)
    return [q, k, v], lambda q, k, v: chunk_linear_attn(q, k, v)[0], "chunk"


def run_ops(args):
    """Every subject at one (T, B): forward, and forward with the gradients of every input; one JSON line each."""
    for subject in args.subjects:
        print(json.dumps(_time_op(subject, args)), flush=True)


def _time_op(subject, args):
    import torch

    device = _device()
    batch = max(1, args.tokens // args.sequence_length)
    base = rss_mib()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    torch.manual_seed(0)
    inputs, forward, backend = _attention_op(subject, batch, args.heads, args.sequence_length, args.head_dim, device)
    for tensor in inputs:
        tensor.requires_grad_(True)

    def fwd():
        with torch.no_grad():
            return [forward(*inputs).float().sum()]

    def fwd_bwd():
        loss = forward(*inputs).float().sum()
        return [loss, *torch.autograd.grad(loss, inputs)]

    def timed(fn):
        start = time.perf_counter()
        out = fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - start, out

    result = {"subject": subject, "T": args.sequence_length, "B": batch, "H": args.heads, "D": args.head_dim}
    result.update(dtype_policy="bfloat16", backend=backend)
    for name, fn in [("fwd", fwd), ("fwd_bwd", fwd_bwd)]:
        compile_s, out = timed(fn)
        finite = all(bool(torch.isfinite(t).all()) for t in out)
        median = statistics.median(timed(fn)[0] for _ in range(args.repeats))
        result.update(
            {
                f"{name}_compile_s": compile_s,
                f"{name}_ms": median * 1e3,
                f"{name}_tokens_per_s": batch * args.sequence_length / median,
                f"{name}_finite": finite,
            }
        )
    result["peak_mib"], result["peak_memory"] = _peak_mib(device, base)
    return {**result, **_environment(device)}


def _skip(row, reason, out):
    row = {**row, "skipped": reason, "framework": "pytorch"}
    if out:
        with open(out, "a") as f:
            f.write(json.dumps(row) + "\n")
    return row


def _fla_missing():
    """Why fla cannot run here, or None."""
    try:
        import fla.ops.linear_attn  # noqa: F401
    except Exception as error:  # ImportError, or Triton failing to find a GPU
        return f"fla does not import: {type(error).__name__}: {str(error)[:60]}"
    return None


def steps(args):
    import torch

    cuda = torch.cuda.is_available()
    print(
        f"# {platform.machine()}, {os.cpu_count()} CPUs, python {platform.python_version()}, torch {torch.__version__}"
    )
    print(
        f"# PyTorch GPT, size={args.size} tokens/batch={args.tokens} vocab={args.vocabulary_size} d={args.hidden_dim} "
        f"L={args.num_layers} H={args.num_heads} D={args.head_dim}, bfloat16 autocast, SDPA causal, fused AdamW"
    )
    print("| mode | T | B | params | step ms | tokens/s | peak MiB | first step s |")
    print("|---|---|---|---|---|---|---|---|")
    for length in args.sequence_lengths:
        for mode in args.modes:
            batch = max(1, args.tokens // length)
            row = {"torch_gpt": mode, "size": args.size, "T": length, "B": batch}
            if mode == "compiled" and not cuda:
                _skip(row, NEEDS_CUDA, args.out)
                print(f"| {mode} | {length} | {batch} | | skipped: {NEEDS_CUDA} | | | |", flush=True)
                continue
            timeout = time_left(args.deadline, args.timeout)
            if timeout is None:
                print(f"| {mode} | {length} | {batch} | | skipped: past the deadline | | | |", flush=True)
                continue
            cmd = [sys.executable, __file__, "steps", "--child", "--mode", mode, "--sequence-length", str(length)]
            for flag in ["size", "tokens", "vocabulary_size", "hidden_dim", "num_layers", "num_heads", "head_dim"]:
                cmd += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
            results, reason = run_measurements(cmd + ["--repeats", str(args.repeats)], timeout)
            if not results:
                print(f"| {mode} | {length} | {batch} | | {reason} | | | |", flush=True)
                continue
            r = results[-1]
            if args.out:
                with open(args.out, "a") as f:
                    f.write(json.dumps(r) + "\n")
            print(
                f"| {mode} | {length} | {r['B']} | {r['params']:,} | {r['step_s'] * 1e3:.1f} | "
                f"{r['B'] * length / r['step_s']:,.0f} | {r['peak_mib']:,.0f} | {r['compile_s']:.1f} |",
                flush=True,
            )


def ops(args):
    import torch

    cuda = torch.cuda.is_available()
    print(f"# PyTorch attention ops, bfloat16, H={args.heads} D={args.head_dim} tokens/batch={args.tokens}")
    print("| op | T | B | fwd ms | fwd+bwd ms | fwd+bwd tokens/s | peak MiB | first call s | finite |")
    print("|---|---|---|---|---|---|---|---|---|")
    for length in args.sequence_lengths:
        batch = max(1, args.tokens // length)
        subjects = []
        for subject in args.subjects:
            reason = None if subject != "fla" else (NEEDS_CUDA if not cuda else _fla_missing())
            if reason:
                _skip({"subject": subject, "T": length, "B": batch}, reason, args.out)
                print(f"| {subject} | {length} | {batch} | | skipped: {reason} | | | | |", flush=True)
            else:
                subjects.append(subject)
        timeout = time_left(args.deadline, args.timeout)
        if not subjects or timeout is None:
            if subjects:
                print(f"| {' '.join(subjects)} | {length} | {batch} | | skipped: past the deadline | | | | |")
            continue
        cmd = [sys.executable, __file__, "ops", "--child", "--sequence-length", str(length), "--subjects", *subjects]
        for flag in ["tokens", "heads", "head_dim", "repeats"]:
            cmd += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
        results, reason = run_measurements(cmd, timeout)
        if not results:
            print(f"| {' '.join(subjects)} | {length} | {batch} | | {reason} | | | | |", flush=True)
        for r in results:
            if args.out:
                with open(args.out, "a") as f:
                    f.write(json.dumps(r) + "\n")
            print(
                f"| {r['subject']} | {length} | {r['B']} | {r['fwd_ms']:.2f} | {r['fwd_bwd_ms']:.2f} | "
                f"{r['fwd_bwd_tokens_per_s']:,.0f} | {r['peak_mib']:,.0f} | "
                f"{r['fwd_compile_s'] + r['fwd_bwd_compile_s']:.1f} | {r['fwd_finite'] and r['fwd_bwd_finite']} |",
                flush=True,
            )


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    step_parser = commands.add_parser("steps", help="the GPT's training step")
    step_parser.add_argument("--size", default="25m", choices=sorted(MODEL_SIZES), help="width, depth and heads")
    step_parser.add_argument("--vocabulary-size", type=int, default=5000)
    for name in ("hidden-dim", "num-layers", "num-heads", "head-dim"):
        step_parser.add_argument(f"--{name}", type=int)
    step_parser.add_argument("--modes", nargs="+", choices=["compiled", "eager"], default=["compiled", "eager"])
    step_parser.add_argument("--mode", help=argparse.SUPPRESS)
    op_parser = commands.add_parser("ops", help="the attention ops alone")
    op_parser.add_argument("--subjects", nargs="+", choices=["sdpa", "fla"], default=["sdpa", "fla"])
    op_parser.add_argument("--heads", type=int, default=8)
    op_parser.add_argument("--head-dim", type=int, default=64)
    for sub, repeats in ((step_parser, 5), (op_parser, 10)):
        sub.add_argument("--sequence-lengths", nargs="+", type=int, default=[8192, 2048])
        sub.add_argument("--tokens", type=int, default=16384, help="tokens a batch: B = tokens // T")
        sub.add_argument("--repeats", type=int, default=repeats)
        sub.add_argument("--timeout", type=int, default=300, help="seconds a process")
        sub.add_argument("--deadline", type=float, help="a Unix time: every process ends by it")
        sub.add_argument("--out", help="also append the JSON lines to this file")
        sub.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
        sub.add_argument("--sequence-length", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.command == "steps":
        for name, value in MODEL_SIZES[args.size].items():
            if getattr(args, name) is None:
                setattr(args, name, value)
    if args.child:
        return run_step(args) if args.command == "steps" else run_ops(args)
    return steps(args) if args.command == "steps" else ops(args)


if __name__ == "__main__":
    main()
