"""The summary of `run.sh`'s raw JSON lines: the checks; ELiTA's training step (TensorFlow and JAX) against the
PyTorch GPT's (FlashAttention, `torch.compile`) and the attention ops against SDPA, measured in the same run, with
their ratios and the goals of issue #48; the profiles of ELiTA's step; and ELiTA's step against the Keras
Transformer's on the same backend, in each setting.

    python benchmarks/gpu/summary.py benchmarks/gpu/results/raw.jsonl
"""

import json
import sys
from collections import defaultdict

# Issue #48's goals: (what, T, the largest ratio that meets it). "step": ELiTA's XLA step (25M, mixed_bfloat16)
# over the compiled PyTorch GPT's; "attention": Attention2's forward+backward over causal SDPA's.
GOALS = [
    ("step", 2048, 0.8),
    ("step", 8192, 0.5),
    ("step", 32768, 0.3),
    ("attention", 8192, 1.0),
    ("attention", 65536, 0.25),
]


def _ms(r, key="step_s"):
    return f"{r[key] * 1e3:.1f}" if r else "-"


def _format(r, key, spec):
    return format(r[key], spec) if r else "-"


def _cell(r):
    """A step time, or why it was skipped."""
    return f"skipped ({r['skipped']})" if r and "skipped" in r else _ms(r)


def _ratio(r, other):
    return f"{r['step_s'] / other['step_s']:.2f}x" if r and other else "-"


def _tokens(r):
    return f"{r['B'] * r['T'] / r['step_s']:,.0f}" if r else "-"


def _elita_steps(rows, backend="tensorflow"):
    """ELiTA's XLA mixed_bfloat16 steps on `backend` without the extra command buffers, by (size, T, B): the goals'
    setting."""
    return {
        (r.get("size", "seed"), r["T"], r["B"]): r
        for r in rows
        if r.get("architecture") == "elita"
        and r.get("backend", "tensorflow") == backend
        and r["dtype_policy"] == "mixed_bfloat16"
        and r["jit_compile"]
        and "CONDITIONAL" not in r.get("xla_flags", "")
    }


def peer_steps(rows):
    """ELiTA's step (TensorFlow and JAX) against the PyTorch GPT's, compiled and eager; returns
    `{(size, T): TensorFlow's ratio to compiled}`."""
    elita, on_jax = _elita_steps(rows), _elita_steps(rows, "jax")
    peer = defaultdict(dict)
    for r in rows:
        if "torch_gpt" in r:
            peer[r["size"], r["T"], r["B"]][r["torch_gpt"]] = r
    keys = list(peer) + [key for key in on_jax if key not in peer]
    if not keys:
        return {}
    print("\n### ELiTA (XLA, mixed_bfloat16; TensorFlow, JAX) against the PyTorch GPT (SDPA, bfloat16 autocast)\n")
    print(
        "| size | T | B | ELiTA TF step ms | ELiTA JAX step ms | GPT compiled ms | GPT eager ms | TF / compiled | "
        "JAX / compiled | JAX / TF | TF / eager | ELiTA TF tokens/s | GPT compiled tokens/s | ELiTA TF peak MiB | "
        "ELiTA JAX peak MiB | GPT peak MiB | params ELiTA / GPT |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    ratios, lines = {}, []
    for size, length, batch in keys:
        modes = peer.get((size, length, batch), {})
        e, j = elita.get((size, length, batch)), on_jax.get((size, length, batch))
        c, g = modes.get("compiled"), modes.get("eager")
        c_ok, g_ok = (r if r and "skipped" not in r else None for r in (c, g))
        gpt = c_ok or g_ok
        if e and c_ok:
            ratios[size, length] = e["step_s"] / c_ok["step_s"]
        print(
            f"| {size} | {length} | {batch} | {_ms(e)} | {_ms(j)} | {_cell(c)} | {_cell(g)} | {_ratio(e, c_ok)} | "
            f"{_ratio(j, c_ok)} | {_ratio(j, e)} | {_ratio(e, g_ok)} | {_tokens(e)} | {_tokens(c_ok)} | "
            f"{_format(e, 'peak_mib', ',.0f')} | {_format(j, 'peak_mib', ',.0f')} | "
            f"{_format(gpt, 'peak_mib', ',.0f')} | "
            f"{_format(e or j, 'params', ',')} / {_format(gpt, 'params', ',')} |"
        )
        compiled = _ratio(e, c_ok) if c_ok else f"skipped ({c['skipped']})" if c else "not measured"
        lines.append(
            f"{size}, T={length}, B={batch}: ELiTA / PyTorch GPT step: compiled {compiled}, "
            f"eager {_ratio(e, g_ok) if g_ok else 'not measured'}"
        )
        if j:
            versus_gpt, versus_tf = _ratio(j, c_ok) if c_ok else "not measured", _ratio(j, e) if e else "not measured"
            lines.append(
                f"{size}, T={length}, B={batch}: ELiTA on JAX / PyTorch GPT step: compiled {versus_gpt}; "
                f"JAX / TensorFlow {versus_tf}"
            )
        keras = [r for r in rows if r.get("architecture") == "transformer" and (r["size"], r["T"]) == (size, length)]
        if gpt and keras:
            same = "the same as" if keras[0]["params"] == gpt["params"] else "NOT the same as"
            lines.append(
                f"  PyTorch GPT parameters {gpt['params']:,}: {same} the Keras Transformer's {keras[0]['params']:,}"
            )
    print()
    print("\n".join(lines))
    return ratios


def layers(rows):
    """The layers (TensorFlow) and attention ops (PyTorch) table; returns `{T: Attention2 / SDPA}`."""
    ops = sorted(
        (r for r in rows if "subject" in r and "skipped" not in r),
        key=lambda r: (r["T"], r["B"], r.get("framework", "tensorflow"), r["subject"]),
    )
    skipped = [r for r in rows if "subject" in r and "skipped" in r]
    ratios = {}
    if not ops and not skipped:
        return ratios
    print("\n### The attention layers and ops alone, forward and forward+backward\n")
    print("| op | framework | dtype | T | B | fwd ms | fwd+bwd ms | fwd+bwd tokens/s | peak MiB |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in ops:
        print(
            f"| {r['subject']} | {r.get('framework', 'tensorflow')} | {r.get('dtype_policy', 'float32')} | {r['T']} | "
            f"{r['B']} | {r['fwd_ms']:.2f} | {r['fwd_bwd_ms']:.2f} | {r['fwd_bwd_tokens_per_s']:,.0f} | "
            f"{r['peak_mib']:,.0f} |"
        )
    for r in skipped:
        print(f"| {r['subject']} | pytorch | | {r['T']} | {r['B']} | skipped ({r['skipped']}) | | | |")
    by = {(r["subject"], r["T"], r["B"]): r for r in ops}
    print()
    for (subject, length, batch), r in by.items():
        sdpa = by.get(("sdpa", length, batch))
        if sdpa and subject in ("attention2", "kernel", "kernel-factored", "kernel-direct", "fla"):
            ratio = r["fwd_bwd_ms"] / sdpa["fwd_bwd_ms"]
            if subject == "attention2":
                ratios[length] = ratio
            print(
                f"T={length}, B={batch}: {subject} / SDPA causal forward+backward {ratio:.2f}x "
                f"(forward {r['fwd_ms'] / sdpa['fwd_ms']:.2f}x), peak memory {r['peak_mib'] / sdpa['peak_mib']:.2f}x"
            )
        mha = by.get(("mha", length, batch))
        if mha and subject == "attention2":
            print(
                f"T={length}: Attention2 / MultiHeadAttention forward+backward time "
                f"{r['fwd_bwd_ms'] / mha['fwd_bwd_ms']:.2f}x, peak memory {r['peak_mib'] / mha['peak_mib']:.3f}x"
            )
    for r in skipped:
        print(f"T={r['T']}: {r['subject']}: skipped ({r['skipped']})")
    return ratios


def profiles(rows):
    for r in rows:
        if "profile" not in r:
            continue
        print(
            f"\n### Where ELiTA's step goes: {r['profile']}, {r['size']}, T={r['T']}, B={r['B']}, {r['dtype_policy']}"
            f"{', XLA' if r['jit_compile'] else ''}, {r.get('backend', 'tensorflow')}, op time on {r['plane']}\n"
        )
        print(
            f"Step {r['step_s'] * 1e3:.1f} ms (untraced), op time {r['op_ms']:.1f} ms a step; "
            + (
                f"{r['tflops']:.1f} TFLOP/s of 6 x params x tokens: model FLOPs utilisation "
                f"{100 * r['mfu']:.1f}% of {r['peak_tflops']:.0f} TFLOP/s (the matrix products alone: "
                f"{r['floor_ms']:.2f} ms)"
                if r.get("mfu") is not None
                else f"no dense bfloat16 peak known for {r['device']}"
            )
        )
        print("\n| part | forward ms | backward ms |")
        print("|---|---|---|")
        for part, t in r["parts"].items():
            print(f"| {part} | {t['forward_ms']:.2f} | {t['backward_ms']:.2f} |")


def keras_steps(rows):
    steps = defaultdict(dict)
    for r in rows:
        if "architecture" in r:
            command_buffer = "CONDITIONAL" in r.get("xla_flags", "")
            backend = r.get("backend", "tensorflow")
            key = (r.get("size", "seed"), r["T"], backend, r["dtype_policy"], r["jit_compile"], command_buffer)
            steps[key][r["architecture"]] = r
    if not steps:
        return
    print("\n### ELiTA against the Keras Transformer on the same backend, in each setting\n")
    print(
        "| size | T | B | backend | dtype policy | XLA | + conditional/while command buffers | ELiTA step ms | "
        "Transformer step ms | time ratio | ELiTA tokens/s | ELiTA peak MiB | Transformer peak MiB | memory ratio |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for (size, length, backend, policy, xla, command_buffer), pair in steps.items():
        e, t = pair.get("elita"), pair.get("transformer")
        cell = lambda r, k, f: format(r[k] * (1e3 if k == "step_s" else 1), f) if r else "-"  # noqa: E731
        ratio = f"{e['step_s'] / t['step_s']:.2f}x" if e and t else "-"
        memory = f"{e['peak_mib'] / t['peak_mib']:.2f}x" if e and t else "-"
        any_row = e or t
        tokens = f"{any_row['B'] * length / e['step_s']:,.0f}" if e else "-"
        print(
            f"| {size} | {length} | {any_row['B']} | {backend} | {policy} | {'yes' if xla else 'no'} | "
            f"{'yes' if command_buffer else 'no'} | {cell(e, 'step_s', '.1f')} | {cell(t, 'step_s', '.1f')} | "
            f"{ratio} | {tokens} | {cell(e, 'peak_mib', ',.0f')} | {cell(t, 'peak_mib', ',.0f')} | {memory} |"
        )


def data_parallel(rows):
    """ELiTA's JAX step data parallel over several devices against one device, the same global batch."""
    if not rows:
        return
    one = {(r["size"], r["T"]): r for r in rows if r["devices"] == 1}
    print("\n### ELiTA's JAX step, data parallel (keras.distribution), the same global batch\n")
    print("| size | devices | T | B | step ms | tokens/s | / one device | peak MiB |")
    print("|---|---|---|---|---|---|---|---|")
    for r in sorted(rows, key=lambda r: (r["size"], r["T"], r["devices"])):
        base = one.get((r["size"], r["T"]))
        ratio = f"{r['step_s'] / base['step_s']:.2f}x" if base else "-"
        print(
            f"| {r['size']} | {r['devices']} | {r['T']} | {r['B']} | {_ms(r)} | {_tokens(r)} | {ratio} | "
            f"{r['peak_mib']:,.0f} |"
        )


def goals(step_ratios, attention_ratios):
    print("\n### Issue #48's goals, from this run\n")
    for what, length, bound in GOALS:
        if what == "step":
            ratio = step_ratios.get(("25m", length))
            text = f"25M, T={length}: ELiTA's TensorFlow step <= {bound}x the compiled PyTorch GPT's"
        else:
            ratio = attention_ratios.get(length)
            text = f"T={length}: Attention2 forward+backward <= {bound}x SDPA causal's"
        status = "not measured" if ratio is None else f"{'met' if ratio <= bound else 'NOT met'} ({ratio:.2f}x)"
        print(f"- {text}: {status}")


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
    sides = {"pytorch": "PyTorch peer", "keras-torch": "Keras on PyTorch", "jax": "JAX side", "tensorflow": "TensorFlow side"}
    for r in rows:
        if r.get("skipped") in sides:
            print(f"{sides[r['skipped']]}: skipped ({r['reason']})")
    spread = [r for r in rows if r.get("devices") is not None]  # apart: every other table is one device's
    rows = [r for r in rows if r.get("devices") is None]
    step_ratios = peer_steps(rows)
    attention_ratios = layers(rows)
    profiles(rows)
    keras_steps(rows)
    data_parallel(spread)
    goals(step_ratios, attention_ratios)


if __name__ == "__main__":
    main(sys.argv[1])
