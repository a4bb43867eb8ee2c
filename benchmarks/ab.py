"""This checkout against a git ref, alternating in one run: the project's one A/B benchmark.

On a shared machine a process's speed moves by more than most changes do (up to 30% on this project's 2-core
CPUs), so both sides run in the same run, round after round, in an order reversed every round; the ratio
this / base is taken within each round, and the output gives its median, least and greatest over the rounds.

    python benchmarks/ab.py --base REF step [--jit-compile] [--architectures elita transformer]
    python benchmarks/ab.py --base REF --backend torch step     # on another Keras backend
    python benchmarks/ab.py --base REF kernel [--shape 4 4 16384 64]
    python benchmarks/ab.py --base REF decoding [--contexts 256 4096]
    python benchmarks/ab.py --base REF first-step [--size 25m --sequence-length 2048]
    python benchmarks/ab.py --base REF train [--architectures elita transformer] [elita-train flags]

REF (a commit, a branch, `HEAD`) is checked out in a temporary `git worktree`, removed at the end, also on
an error. "this" is this checkout's working tree, uncommitted changes included. The subjects:

- `step`: one compiled training step (`train_on_batch`, as `elita-train` compiles it) of each architecture,
  both sides in this process with the same weights and batch (its loss too, which a numerical change moves);
- `kernel`: the causal-mean kernel `causal_softmax_mean`, forward and forward+backward (the fastest of
  `--repeats` calls a round), and its forward over one elementwise pass (`v * 2`, the memory-bound floor);
- `decoding`: `ElitaCausalLM.generate`'s milliseconds per new token (`decoding.py`'s slope), batch 1;
- `first-step`: the first training step (tracing, compilation, one step) and the steps after it
  (`training_step.py`), a fresh process for each side and round, and the last step's loss (the same seeded
  weights and batch on both sides);
- `train`: `elita-train` end to end (its `results.json` step time and peak memory), a process for each side
  and round; flags `ab.py` does not know go to `elita-train`.

The subjects that run in this process import REF's `elita_tf/` as a package named `elita_base` (a copy with
every `elita_tf` renamed, so both register their Keras classes side by side); the others run REF's tree on
`PYTHONPATH` in processes of their own. Prints one JSON line per label and metric, then a markdown table.
"""

import argparse
import contextlib
import importlib
import itertools
import json
import os
import pathlib
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = {"this": "elita_tf", "base": "elita_base"}


def git(*args):
    proc = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"git {' '.join(args)}: {proc.stderr.strip()}")
    return proc.stdout.strip()


@contextlib.contextmanager
def base_checkout(ref):
    """Yields `(tree, scratch)`: REF in a temporary git worktree, and a folder whose `packages/` holds REF's
    package renamed `elita_base`."""
    scratch = pathlib.Path(tempfile.mkdtemp(prefix="elita-ab-"))
    tree = scratch / "tree"
    try:
        git("worktree", "add", "--detach", str(tree), ref)
        renamed = scratch / "packages" / PACKAGES["base"]
        shutil.copytree(tree / "elita_tf", renamed, ignore=shutil.ignore_patterns("__pycache__"))
        for path in renamed.rglob("*.py"):
            path.write_text(path.read_text().replace("elita_tf", PACKAGES["base"]))
        yield tree, scratch
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], capture_output=True)
        shutil.rmtree(scratch, ignore_errors=True)


def timed(fn):
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def model_size(args):
    from elita_tf.models import MODEL_SIZES

    size = {**MODEL_SIZES[args.size], "vocabulary_size": args.vocabulary_size}
    return {**size, **({"num_layers": args.num_layers} if args.num_layers else {})}


def step_subject(args, tree, scratch):
    import numpy as np

    from measure import training_model

    ids = np.random.default_rng(0).integers(0, args.vocabulary_size, (args.batch_size, args.sequence_length + 1))
    x = {"token_ids": ids[:, :-1].astype("int32"), "padding_mask": np.ones_like(ids[:, :-1], "int32")}
    y = ids[:, 1:].astype("int32")
    size = {**model_size(args), "max_sequence_length": args.sequence_length}
    measures = {}
    for architecture in args.architectures:
        models = {
            side: training_model(
                architecture, jit_compile=args.jit_compile or args.backend == "jax", package=package, **size
            )
            for side, package in PACKAGES.items()
        }
        for model in models.values():
            model(x)
        models["base"].set_weights(models["this"].get_weights())
        for side, model in models.items():
            model.train_on_batch(x, y)  # traces and compiles

            def step(model=model):
                seconds, loss = timed(lambda: model.train_on_batch(x, y))
                return {"step_s": seconds, "loss": float(loss)}

            measures[architecture, side] = step
    return measures


def kernel_subject(args, tree, scratch):
    from measure import kernel_inputs, loss_functions, wait_for

    inputs = kernel_inputs(*args.shape)
    elementwise, _ = loss_functions(lambda logits, values: values * 2.0)

    def fastest(fn):
        return min(timed(lambda: wait_for(fn(*inputs)))[0] for _ in range(args.repeats))

    measures = {}
    for side, package in PACKAGES.items():
        kernel = importlib.import_module(f"{package}.ops").causal_softmax_mean
        fwd, fwd_bwd = loss_functions(lambda logits, values, kernel=kernel: kernel(logits, values)[0])
        for fn in (fwd, fwd_bwd, elementwise):
            fastest(fn)  # traces

        def kernel_times(fwd=fwd, fwd_bwd=fwd_bwd):
            forward, backward, floor = fastest(fwd), fastest(fwd_bwd), fastest(elementwise)
            return {"fwd_s": forward, "fwd_bwd_s": backward, "fwd_per_elementwise": forward / floor}

        measures["B={} H={} T={} D={}".format(*args.shape), side] = kernel_times
    return measures


def decoding_subject(args, tree, scratch):
    import keras
    import numpy as np

    from decoding import per_token_ms

    measures = {}
    for context in args.contexts:
        prompt = np.random.default_rng(0).integers(3, args.vocabulary_size, size=(1, context))
        for architecture in args.architectures:
            for side, package in PACKAGES.items():
                models = importlib.import_module(f"{package}.models")
                keras.utils.set_random_seed(0)
                size = {**model_size(args), "max_sequence_length": args.training_length}
                backbone = models.ElitaBackbone.from_architecture(architecture, **size)
                if backbone.decode_limit is not None:  # key/value buffers: sized to hold the generation
                    size["max_sequence_length"] = context + 4 * args.steps
                    backbone = models.ElitaBackbone.from_architecture(architecture, **size)
                causal_lm = models.ElitaCausalLM(backbone)
                causal_lm.compile(sampler="greedy")

                def generate(steps, causal_lm=causal_lm):
                    token_ids = np.zeros((1, context + steps), "int32")
                    token_ids[:, :context] = prompt
                    padding_mask = np.zeros_like(token_ids)
                    padding_mask[:, :context] = 1
                    inputs = {"token_ids": token_ids, "padding_mask": padding_mask}
                    return lambda: causal_lm.generate(inputs, stop_token_ids=None)

                measures[f"{architecture}, context {context}", side] = lambda generate=generate: {
                    "token_ms": per_token_ms(generate, args.steps, repeats=1)[0]
                }
    return measures


def python_paths(tree):
    """Each side's `PYTHONPATH`, for the subjects that run processes of their own."""
    return {"this": str(ROOT), "base": str(tree)}


def environment(path):
    return {**os.environ, "PYTHONPATH": path, "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "3")}


def first_step_subject(args, tree, scratch):
    from measure import run_measurement

    measures = {}
    for architecture in args.architectures:
        for side, path in python_paths(tree).items():
            # This checkout's script on both sides: the package is what differs.
            cmd = [sys.executable, str(ROOT / "benchmarks" / "training_step.py"), "--architecture", architecture]
            cmd += ["--sequence-length", str(args.sequence_length), "--tokens", str(args.tokens)]
            cmd += ["--size", args.size, "--vocabulary-size", str(args.vocabulary_size), "--output-head", "chunked"]
            cmd += ["--repeats", str(args.repeats)] + (["--jit-compile"] if args.jit_compile else [])
            cmd += ["--num-layers", str(args.num_layers)] if args.num_layers else []

            def first_step(cmd=cmd, path=path):
                result, reason = run_measurement(cmd, args.timeout, environment(path))
                if result is None:
                    raise SystemExit(f"{' '.join(cmd)}: {reason}")
                times = {"first_step_s": result["compile_s"], "step_s": result["step_s"]}
                return {**times, "peak_mib": result["peak_mib"], "loss": result["loss"]}

            measures[architecture, side] = first_step
    return measures


def train_subject(args, tree, scratch):
    runs = itertools.count()
    measures = {}
    for architecture in args.architectures:
        for side, path in python_paths(tree).items():

            def train(architecture=architecture, path=path):
                run_dir = scratch / "runs" / str(next(runs))
                cmd = [sys.executable, "-m", "elita_tf.cli.train", "--architecture", architecture]
                cmd += ["--output-dir", str(run_dir), "--max-steps", str(args.max_steps), "--eval-batches", "1"]
                cmd += ["--force-new", "--verbose", "0", *args.train_flags]
                # From the scratch folder: `python -m` puts the working directory first on the path.
                proc = subprocess.run(cmd, env=environment(path), cwd=scratch, capture_output=True, text=True)
                if proc.returncode:
                    raise SystemExit(f"{' '.join(cmd)}: exit status {proc.returncode}:\n{proc.stderr[-3000:]}")
                result = json.loads((run_dir / "results.json").read_text())
                return {"step_s": result["step_time_s"], "peak_mib": result["peak_memory_mib"]}

            measures[architecture, side] = train
    return measures


def alternate(measures, rounds):
    """`{key: [metrics of each round]}`: every measure once a round, in an order reversed every round."""
    order = list(measures)
    results = {key: [] for key in order}
    for _ in range(rounds):
        for key in order:
            results[key].append(measures[key]())
        order.reverse()
    return results


def summarize(results):
    """One dict per label and metric: both sides' medians and the ratio this / base of each round."""
    for label in dict.fromkeys(label for label, _ in results):
        this, base = results[label, "this"], results[label, "base"]
        for metric in this[0]:
            ratios = [a[metric] / b[metric] for a, b in zip(this, base)]
            yield {
                "label": label,
                "metric": metric,
                "this": statistics.median(r[metric] for r in this),
                "base": statistics.median(r[metric] for r in base),
                "ratio_median": statistics.median(ratios),
                "ratio_min": min(ratios),
                "ratio_max": max(ratios),
                "rounds": len(ratios),
            }


SUBJECTS = {
    "step": (step_subject, 8),
    "kernel": (kernel_subject, 15),
    "decoding": (decoding_subject, 3),
    "first-step": (first_step_subject, 2),
    "train": (train_subject, 3),
}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", required=True, help="the git ref to compare with (a commit, a branch, HEAD)")
    parser.add_argument(
        "--backend",
        choices=["tensorflow", "jax", "torch"],
        default=os.environ.get("KERAS_BACKEND", "tensorflow"),
        help="the Keras backend both sides run on (default: KERAS_BACKEND's, else TensorFlow); JAX's step is compiled",
    )
    subjects = parser.add_subparsers(dest="subject", required=True)
    for name, (_, rounds) in SUBJECTS.items():
        sub = subjects.add_parser(name)
        sub.add_argument("--rounds", type=int, default=rounds, help="each side is measured once a round")
        if name != "kernel":
            sub.add_argument("--architectures", nargs="+", default=["elita", "transformer"])
    for name in ("step", "decoding", "first-step"):
        sub = subjects.choices[name]
        sub.add_argument("--size", default="25m" if name == "first-step" else "seed", help="MODEL_SIZES' name")
        sub.add_argument("--num-layers", type=int, help="instead of the size's")
        sub.add_argument("--vocabulary-size", type=int, default=5000)
    for name in ("step", "first-step"):
        sub = subjects.choices[name]
        sub.add_argument("--sequence-length", type=int, default=2048 if name == "first-step" else 256)
        sub.add_argument("--jit-compile", action=argparse.BooleanOptionalAction, default=name == "first-step")
    subjects.choices["step"].add_argument("--batch-size", type=int, default=128)
    subjects.choices["first-step"].add_argument("--tokens", type=int, default=2048, help="tokens a batch")
    subjects.choices["first-step"].add_argument("--repeats", type=int, default=2, help="steps after the first")
    subjects.choices["first-step"].add_argument("--timeout", type=int, default=1800, help="seconds a process")
    kernel = subjects.choices["kernel"]
    kernel.add_argument("--shape", type=int, nargs=4, default=[4, 4, 16384, 64], metavar=("B", "H", "T", "D"))
    kernel.add_argument("--repeats", type=int, default=5, help="calls a round; the fastest counts")
    decoding = subjects.choices["decoding"]
    decoding.add_argument("--contexts", nargs="+", type=int, default=[256, 4096])
    decoding.add_argument("--steps", type=int, default=64, help="new tokens: 1 to 4 times this, for the slope")
    decoding.add_argument("--training-length", type=int, default=256, help="constant-state models' length")
    subjects.choices["train"].add_argument("--max-steps", type=int, default=8)
    args, unknown = parser.parse_known_args(argv)
    if unknown and args.subject != "train":
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    args.train_flags = unknown
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1. Received: {args.rounds}")
    return args


def markdown(rows):
    lines = ["| subject | label | metric | this | base | this / base, median (least-greatest) |", "|---" * 6 + "|"]
    for r in rows:
        lines.append(
            f"| {r['subject']} | {r['label']} | {r['metric']} | {r['this']:.4g} | {r['base']:.4g} | "
            f"{r['ratio_median']:.3f}x ({r['ratio_min']:.3f}-{r['ratio_max']:.3f}) |"
        )
    return "\n".join(lines)


def main(argv=None):
    args = parse_args(argv)
    os.environ["KERAS_BACKEND"] = args.backend  # before Keras is imported, here and in the processes started
    sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT)]
    dirty = "-dirty" if git("status", "--porcelain", "--untracked-files=no") else ""
    commits = {"this_commit": git("rev-parse", "--short", "HEAD") + dirty}
    commits["base_commit"] = git("rev-parse", "--short", f"{args.base}^{{commit}}")
    print(
        f"# {platform.machine()}, {os.cpu_count()} CPUs, python {platform.python_version()}, {args.backend}; "
        f"{json.dumps(commits)}"
    )
    with base_checkout(args.base) as (tree, scratch):
        sys.path.insert(2, str(scratch / "packages"))
        measures = SUBJECTS[args.subject][0](args, tree, scratch)
        rows = [
            {"subject": args.subject, **row, "backend": args.backend, "base_ref": args.base, **commits}
            for row in summarize(alternate(measures, args.rounds))
        ]
    for row in rows:
        print(json.dumps(row), flush=True)
    print(markdown(rows))


if __name__ == "__main__":
    main()
