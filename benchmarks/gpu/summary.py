"""The summary table of `run.sh`'s raw JSON lines: the checks, the layers, and ELiTA's training step against the
Transformer's in each setting, with their ratios.

    python benchmarks/gpu/summary.py benchmarks/gpu/results/raw.jsonl
"""

import json
import sys
from collections import defaultdict


def main(path):
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    checks = [r for r in rows if "check" in r]
    if checks:
        failed = [r["check"] for r in checks if not r["ok"]]
        worst = max(r["worst_rel_err"] for r in checks)
        print(
            f"checks on {checks[0]['device']}: {len(checks) - len(failed)} of {len(checks)} passed, "
            f"worst relative error {worst:.1e}" + (f"; FAILED: {failed}" if failed else "")
        )

    layers = [r for r in rows if "subject" in r]
    if layers:
        print("\n| layer | T | B | fwd ms | fwd+bwd ms | peak MiB |")
        print("|---|---|---|---|---|---|")
        for r in layers:
            times = f"{r['fwd_ms']:.2f} | {r['fwd_bwd_ms']:.2f}"
            print(f"| {r['subject']} | {r['T']} | {r['B']} | {times} | {r['peak_mib']:,.0f} |")
        by = {(r["subject"], r["T"]): r for r in layers}
        for (subject, length), r in by.items():
            if subject == "attention2" and ("mha", length) in by:
                mha = by["mha", length]
                print(
                    f"T={length}: Attention2 / MultiHeadAttention forward+backward time "
                    f"{r['fwd_bwd_ms'] / mha['fwd_bwd_ms']:.2f}x, peak memory {r['peak_mib'] / mha['peak_mib']:.3f}x"
                )

    steps = defaultdict(dict)
    for r in rows:
        if "architecture" in r:
            command_buffer = "CONDITIONAL" in r.get("xla_flags", "")
            key = (r.get("size", "seed"), r["T"], r["dtype_policy"], r["jit_compile"], command_buffer)
            steps[key][r["architecture"]] = r
    if steps:
        print(
            "\n| size | T | B | dtype policy | XLA | + conditional/while command buffers | ELiTA step ms | "
            "Transformer step ms | time ratio | ELiTA tokens/s | ELiTA peak MiB | Transformer peak MiB | memory ratio |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for (size, length, policy, xla, command_buffer), pair in steps.items():
            e, t = pair.get("elita"), pair.get("transformer")
            cell = lambda r, k, f: format(r[k] * (1e3 if k == "step_s" else 1), f) if r else "-"  # noqa: E731
            ratio = f"{e['step_s'] / t['step_s']:.2f}x" if e and t else "-"
            memory = f"{e['peak_mib'] / t['peak_mib']:.2f}x" if e and t else "-"
            any_row = e or t
            tokens = f"{any_row['B'] * length / e['step_s']:,.0f}" if e else "-"
            print(
                f"| {size} | {length} | {any_row['B']} | {policy} | {'yes' if xla else 'no'} | "
                f"{'yes' if command_buffer else 'no'} | {cell(e, 'step_s', '.1f')} | {cell(t, 'step_s', '.1f')} | "
                f"{ratio} | {tokens} | {cell(e, 'peak_mib', ',.0f')} | {cell(t, 'peak_mib', ',.0f')} | {memory} |"
            )


if __name__ == "__main__":
    main(sys.argv[1])
