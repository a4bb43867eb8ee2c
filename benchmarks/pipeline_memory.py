"""The data pipeline's memory and speed as the corpus grows, beside elita-train's step.

    python benchmarks/pipeline_memory.py --sizes-mb 20 2048 --out benchmarks/results/MACHINE-DATE/pipeline_memory.json

For each size it writes a synthetic corpus of plain-text files (documents of random words, Zipf-distributed), then,
in a process of its own so that the peak memory is its own, runs the path `elita-train` runs:
`load_corpus` (every file read and hashed), `write_token_file` (SentencePiece in the tf.data
graph, parallel, into the token files), and `lm_dataset` over the files at the default
configuration (T = 256, B = 128), shuffled, reading `--batches` batches. It reports the peak
resident memory, tokenization's and the stream's tokens/s. The tokenizer (5,000 pieces) is trained
once, on the smallest corpus, and shared, so that every size measures the pipeline alone. Last,
`elita-train` at its defaults (elita, seed size) runs `--train-steps` steps on the smallest corpus
for its tokens/s, the rate the pipeline must outrun.
"""

import argparse
import glob as glob_module
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from measure import environment, run_measurement  # noqa: E402

SEQUENCE_LENGTH, BATCH_SIZE = 256, 128


def write_corpus(folder, megabytes, seed=0):
    """Plain-text files of about 1 MB, documents of 20-80 lines of random words: `megabytes` MB in all."""
    import numpy as np

    done = os.path.join(folder, "COMPLETE")
    if os.path.exists(done):  # written by an earlier run: the same seed writes the same text
        with open(done) as f:
            return os.path.join(folder, "*.txt"), int(f.read())
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    words = np.array(["".join(rng.choice(letters, rng.integers(2, 9))) for _ in range(8000)])
    weights = 1.0 / (np.arange(len(words)) + 10.0)  # Zipf-like, as words in text
    weights /= weights.sum()
    written, index = 0, 0
    while written < megabytes * 2**20:
        lengths = rng.integers(6, 16, 16000)  # about 1 MB of lines
        drawn = iter(words[rng.choice(len(words), lengths.sum(), p=weights)].tolist())
        lines = [" ".join(next(drawn) for _ in range(n)) + " ." for n in lengths]
        # Documents of 50 lines, blank lines between them.
        text = "\n\n".join("\n".join(lines[i : i + 50]) for i in range(0, len(lines), 50)) + "\n"
        with open(os.path.join(folder, f"part-{index:05d}.txt"), "w") as f:
            f.write(text)
        written, index = written + len(text), index + 1
    with open(done, "w") as f:
        f.write(str(written))
    return os.path.join(folder, "*.txt"), written


def peak_rss_mib():
    """This process's own peak resident memory (`VmHWM`). Not `ru_maxrss`: after a fork and exec, that
    keeps the parent's peak at the fork (here over 1 GB, TensorFlow and the tokenizer's training)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM")) / 1024


def measure_pipeline(glob, proto_path, cache, batches):
    """One process: the corpus through the token files and `lm_dataset`; prints one JSON line."""
    os.environ["ELITA_CACHE_DIR"] = cache
    from elita_tf.data import CorpusSettings, lm_dataset, load_corpus
    from elita_tf.data.token_files import FileSequences, write_token_file
    from elita_tf.models import ElitaTokenizer

    with open(proto_path, "rb") as f:
        tokenizer = ElitaTokenizer(proto=f.read())
    start = time.perf_counter()
    corpus = CorpusSettings(glob, document_separator="blank-line", holdout_fraction=0.01)
    splits, info = load_corpus(corpus, document_starts=True)
    checked = time.perf_counter()
    tokens = write_token_file(splits["train"], tokenizer, os.path.join(cache, "train"), vocabulary_size=5000)
    tokenized = time.perf_counter()
    stream = lm_dataset(FileSequences(tokens, SEQUENCE_LENGTH + 1), BATCH_SIZE, seed=0, epochs=None)
    iterator = iter(stream)
    next(iterator)  # the first batch: the epoch's order and the pipeline's threads
    read = time.perf_counter()
    for _ in range(batches):
        next(iterator)
    streamed = time.perf_counter()
    result = {
        "corpus_bytes": sum(os.path.getsize(path) for path in glob_module.glob(glob)),
        "train_tokens": len(tokens),
        "sequences": len(FileSequences(tokens, SEQUENCE_LENGTH + 1)),
        "check_s": checked - start,
        "tokenize_s": tokenized - checked,
        "tokenize_tokens_per_s": len(tokens) / (tokenized - checked),
        "stream_batches": batches,
        "stream_tokens_per_s": batches * BATCH_SIZE * SEQUENCE_LENGTH / (streamed - read),
        "peak_rss_mib": peak_rss_mib(),
    }
    print(json.dumps(result), flush=True)


def train_sentencepiece_once(glob, proto_path):
    from elita_tf.data import CorpusSettings, load_corpus, sample_text, train_sentencepiece

    splits, _ = load_corpus(CorpusSettings(glob, document_separator="blank-line", holdout_fraction=0.01))
    proto = train_sentencepiece(sample_text(splits["train"], 10**9), vocabulary_size=5000)
    with open(proto_path, "wb") as f:
        f.write(proto)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes-mb", type=int, nargs="+", default=[20, 2048])
    parser.add_argument("--workdir", default="/tmp/elita-pipeline")
    parser.add_argument("--batches", type=int, default=300)
    parser.add_argument("--train-steps", type=int, default=6)
    parser.add_argument("--out", help="write the results here as JSON")
    parser.add_argument("--measure", nargs=4, metavar=("GLOB", "PROTO", "CACHE", "BATCHES"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        glob, proto, cache, batches = args.measure
        return measure_pipeline(glob, proto, cache, int(batches))

    sizes = sorted(args.sizes_mb)
    proto = os.path.join(args.workdir, "sentencepiece.model")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    results = {"environment": environment(), "commit": commit, "command": " ".join(sys.argv), "pipeline": {}}
    for size in sizes:
        folder = os.path.join(args.workdir, f"corpus-{size}mb")
        glob, written = write_corpus(folder, size, seed=size)
        print(f"{size} MB corpus: {written / 2**20:.0f} MiB in {folder}", flush=True)
        if size == sizes[0] and not os.path.exists(proto):
            train_sentencepiece_once(glob, proto)
        cache = os.path.join(args.workdir, f"cache-{size}mb")
        subprocess.run(["rm", "-rf", cache], check=True)  # tokenized afresh: that is what is measured
        result, failure = run_measurement(
            [sys.executable, __file__, "--measure", glob, proto, cache, str(args.batches)], timeout=7200
        )
        results["pipeline"][size] = result or {"failed": failure}
        print(json.dumps({size: results["pipeline"][size]}), flush=True)

    # elita-train at its defaults on the smallest corpus: the step the pipeline feeds.
    run = os.path.join(args.workdir, "train-run")
    glob = os.path.join(args.workdir, f"corpus-{sizes[0]}mb", "*.txt")
    command = ["elita-train", "--data", glob, "--document-separator", "blank-line", "--output-dir", run, "--force-new"]
    command += ["--max-steps", str(args.train_steps), "--eval-batches", "1", "--verbose", "0"]
    subprocess.run(
        command, check=True, env={**os.environ, "ELITA_CACHE_DIR": os.path.join(args.workdir, "cache-train")}
    )
    with open(os.path.join(run, "results.json")) as f:
        trained = json.load(f)
    results["elita_train"] = {
        "command": " ".join(command),
        "step_time_s": trained["step_time_s"],
        "tokens_per_s": trained["tokens_per_s"],
        "load_average": trained["load_average"],
    }
    largest, smallest = results["pipeline"][sizes[-1]], results["pipeline"][sizes[0]]
    if "peak_rss_mib" in largest and "peak_rss_mib" in smallest:
        results["memory_ratio"] = largest["peak_rss_mib"] / smallest["peak_rss_mib"]
    for size in sizes:
        entry = results["pipeline"][size]
        if "stream_tokens_per_s" in entry:
            entry["stream_over_training"] = entry["stream_tokens_per_s"] / trained["tokens_per_s"]
            entry["tokenize_over_training"] = entry["tokenize_tokens_per_s"] / trained["tokens_per_s"]
    print(json.dumps(results, indent=2))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
