"""The causal-mean kernel of this checkout against another's, and against one elementwise pass, in one process.

`layers.py` runs each subject in a process of its own, and on a shared 2-core machine a process's
speed moves by up to 30%: more than most changes to the kernel. Here one process times, round after
round: this checkout's kernel, another checkout's (its `elita_tf/` copied as a package named
`elita_other`, as `step_ab.py` says), and one elementwise pass over the same values (`v * 2`, the memory-bound floor of the issue's goal). Each round takes the fastest
of `--repeats` calls of each, in an order reversed every round; the table gives the median and the
fastest round. The ratios (to the elementwise pass, and to this checkout's kernel) are taken within
each round, so both sides of each ran in the same state of the machine. Forward and forward+backward
are `layers.py`'s (`reduce_sum` of the mean, and its gradients).

    python benchmarks/kernel_ab.py                                   # T = 16K, B = 4, H = 4, D = 64
    mkdir -p OTHER && cp -r CHECKOUT/elita_tf OTHER/elita_other
    grep -rl elita_tf OTHER/elita_other | xargs sed -i 's/elita_tf/elita_other/g'
    PYTHONPATH=OTHER python benchmarks/kernel_ab.py --other         # against that checkout
    PYTHONPATH=OTHER python benchmarks/kernel_ab.py --other --shape 128 4 256 16   # ELiTA's seed shape
"""

import argparse
import importlib
import os
import platform
import statistics
import time

from measure import device_description, kernel_inputs, loss_functions, wait_for


def other_kernel():
    """`causal_softmax_mean` of the other checkout (`elita_other`), or None when it is not on the path."""
    try:
        return importlib.import_module("elita_other.ops").causal_softmax_mean
    except ImportError:
        return None


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--other", action="store_true", help="also time elita_other's kernel (see above)")
    parser.add_argument("--shape", type=int, nargs=4, default=[4, 4, 16384, 64], metavar=("B", "H", "T", "D"))
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--repeats", type=int, default=5, help="calls a round; the fastest counts")
    args = parser.parse_args()
    for name in ("rounds", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1. Received: {getattr(args, name)}")
    if min(args.shape) < 1:
        parser.error(f"--shape needs four positive sizes. Received: {args.shape}")
    if args.other and other_kernel() is None:
        parser.error("--other: no package elita_other on the path: copy the other checkout as the docstring says.")

    import tensorflow as tf

    from elita_tf.ops import causal_softmax_mean

    batch, heads, length, depth = args.shape
    logits, values = kernel_inputs(batch, heads, length, depth)

    kernels = {"this checkout": causal_softmax_mean}
    if args.other:
        kernels["other checkout"] = other_kernel()
    subjects = {}
    for name, kernel in kernels.items():
        subjects[(name, "fwd")], subjects[(name, "fwd+bwd")] = loss_functions(lambda l, v, k=kernel: k(l, v)[0])
    subjects[("elementwise", "fwd")], _ = loss_functions(lambda l, v: v * 2.0)

    def fastest(fn):
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            wait_for(fn(logits, values))
            times.append(time.perf_counter() - start)
        return min(times) * 1e3

    for fn in subjects.values():
        fastest(fn)  # trace and warm up
    rounds = {key: [] for key in subjects}
    order = list(subjects)
    for _ in range(args.rounds):
        for key in order:
            rounds[key].append(fastest(subjects[key]))
        order.reverse()  # neither kernel always runs first

    print(
        f"# {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, {device_description()}, "
        f"python {platform.python_version()}, tensorflow {tf.__version__}"
    )
    print(f"# B={batch} H={heads} T={length} D={depth}, {args.rounds} rounds of {args.repeats} calls, one process")
    print(
        "| kernel | fwd ms, median (fastest) | fwd+bwd ms, median (fastest) | fwd / elementwise, median of rounds "
        "| fwd, fwd+bwd / this checkout's, median of rounds |"
    )
    print("|---|---|---|---|---|")
    element = rounds[("elementwise", "fwd")]
    within = lambda a, b: statistics.median(x / y for x, y in zip(a, b))  # noqa: E731  (ratios round by round)
    for name in kernels:
        fwd, fwd_bwd = rounds[(name, "fwd")], rounds[(name, "fwd+bwd")]
        mine = within(fwd, rounds[("this checkout", "fwd")]), within(fwd_bwd, rounds[("this checkout", "fwd+bwd")])
        print(
            f"| {name} | {statistics.median(fwd):.1f} ({min(fwd):.1f}) | "
            f"{statistics.median(fwd_bwd):.1f} ({min(fwd_bwd):.1f}) | {within(fwd, element):.2f}x | "
            f"{mine[0]:.3f}x, {mine[1]:.3f}x |"
        )
    print(f"| elementwise pass | {statistics.median(element):.1f} ({min(element):.1f}) | | | |")


if __name__ == "__main__":
    main()
