"""Tables, plots and the target summary for ``python -m benchmarks``."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks import weight_formats
from benchmarks.machine import machine_line
from benchmarks.resume import ResumeRow


def resume_table(rows: Sequence[ResumeRow]) -> str:
    with_llama = any(r.llama_cold is not None for r in rows)
    header = (
        "| history | ours cold | ours same prompt, memory | ours same prompt, disk after restart "
        "| ours next turn, disk after restart | mlx-lm cold (one call) | mlx-lm same prompt "
        "(cache file) | mlx-lm next turn (cache file) |"
    )
    rule = "|---:|---:|---:|---:|---:|---:|---:|---:|"
    if with_llama:
        header += (
            " llama.cpp cold (Q4_1) | llama.cpp same prompt (state file) | llama.cpp next turn |"
        )
        rule += "---:|---:|---:|"
    lines = [header, rule]
    for r in rows:
        line = (
            f"| {r.history} | {_s(r.ours_cold)} | {_s(r.ours_memory)} | {_s(r.ours_disk)} "
            f"| {_s(r.ours_next_turn)} ({r.next_turn_new_tokens} new) | {_s(r.mlx_cold)} "
            f"| {_s(r.mlx_same_prompt)} | {_s(r.mlx_next_turn)} |"
        )
        if with_llama:
            line += f" {_s(r.llama_cold)} | {_s(r.llama_same_prompt)} | {_s(r.llama_next_turn)} |"
        lines.append(line)
    return "\n".join(lines)


def concurrency_table(rows: Sequence[dict[str, Any]]) -> str:
    lines = [
        "| server | agents | tokens/s | decode tokens/s | TTFT p50 | TTFT p99 | ITL p50 "
        "| ITL p99 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['server']} | {r['agents']} | {r['tokens_per_s']:.1f} "
            f"| {r.get('decode_per_s', math.nan):.1f} | {_s(r['ttft_p50'])} "
            f"| {_s(r['ttft_p99'])} | {_s(r['itl_p50'])} | {_s(r['itl_p99'])} |"
        )
    return "\n".join(lines)


def persistence_table(rows: Sequence[dict[str, float]]) -> str:
    lines = [
        "| history | MB written / turn | ms / turn | restore from disk | copy of the same bytes |",
        "|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['tokens']:.0f} | {r['written_mb']:.1f} | {r['write_ms']:.1f} "
            f"| {r['restore_ms']:.1f} ms | {r['copy_ms']:.1f} ms |"
        )
    return "\n".join(lines)


def summary(results: dict[str, Any]) -> str:
    checks: list[tuple[str, str, bool]] = []
    resume = [ResumeRow(**r) for r in results.get("resume", [])]
    big = max(resume, key=lambda r: r.history, default=None)
    if big is not None:
        checks.append(
            (
                f"same prompt, {big.history} tokens, from disk after a restart <= 250 ms",
                _s(big.ours_disk),
                big.ours_disk <= 0.25,
            )
        )
        ratio = big.ours_next_turn / big.mlx_next_turn
        checks.append(
            (
                f"next turn at {big.history} from disk <= 0.75x mlx-lm's cache file path",
                f"{ratio:.2f}x ({_s(big.ours_next_turn)} vs {_s(big.mlx_next_turn)})",
                ratio <= 0.75,
            )
        )
        speedup = big.ours_cold / big.ours_next_turn
        checks.append(
            ("next turn >= 50x faster than our cold start", f"{speedup:.0f}x", speedup >= 50)
        )
        cold = big.ours_cold / big.mlx_cold
        checks.append(
            (
                f"cold at {big.history} <= 0.7x mlx-lm's one-call prefill",
                f"{cold:.2f}x",
                cold <= 0.7,
            )
        )
        never = all(r.ours_cold <= r.mlx_cold for r in resume)
        checks.append(("cold never slower than mlx-lm at any length", str(never), never))
        if big.llama_next_turn is not None:
            versus = big.ours_next_turn / big.llama_next_turn
            checks.append(
                (
                    f"(info) next turn at {big.history}: ours / llama.cpp state file",
                    f"{versus:.2f}x ({_s(big.ours_next_turn)} vs {_s(big.llama_next_turn)})",
                    True,
                )
            )
    rows = results.get("concurrency", [])
    ours = {r["agents"]: r["tokens_per_s"] for r in rows if r["server"] == "semantic"}
    theirs = {r["agents"]: r["tokens_per_s"] for r in rows if r["server"] != "semantic"}
    mine = [r for r in rows if r["server"] == "semantic"]
    decode = {r["agents"]: r.get("decode_per_s", math.nan) for r in mine}
    if ours:
        checks.append(("one agent >= 17 tokens/s", f"{ours[1]:.1f}", ours[1] >= 17))
        for n, factor in ((8, 4), (16, 7)):
            if n in ours:
                checks.append(
                    (
                        f"{n} agents >= {factor}x one agent's decode rate",
                        f"{decode[n] / decode[1]:.2f}x ({decode[n]:.1f} vs {decode[1]:.1f})",
                        decode[n] >= factor * decode[1],
                    )
                )
                checks.append(
                    (
                        f"(info) {n} agents / one agent, end to end",
                        f"{ours[n] / ours[1]:.2f}x",
                        True,
                    )
                )
        for n in sorted(set(ours) & set(theirs)):
            checks.append(
                (
                    f"{n} agents >= mlx_lm.server",
                    f"{ours[n]:.1f} vs {theirs[n]:.1f}",
                    ours[n] >= theirs[n],
                )
            )
        their_decode = {
            r["agents"]: r.get("decode_per_s", math.nan) for r in rows if r["server"] != "semantic"
        }
        for n in (1, 8, 16):
            if n in decode and n in their_decode:
                checks.append(
                    (
                        f"{n} agents' decode >= 3x mlx_lm.server's",
                        f"{decode[n] / their_decode[n]:.2f}x "
                        f"({decode[n]:.1f} vs {their_decode[n]:.1f})",
                        decode[n] >= 3 * their_decode[n],
                    )
                )
    checks += weight_formats.checks(results.get("formats", []))
    if "overhead" in results:
        share = results["overhead"]["overhead_fraction"]
        checks.append(("HTTP overhead <= 10% of a 64-token reply", f"{share:.1%}", share <= 0.10))
    width = max((len(c[0]) for c in checks), default=10)
    lines = ["", f"{'target':<{width}}  {'measured':<30} met"]
    lines += [f"{name:<{width}}  {value:<30} {'yes' if ok else 'NO'}" for name, value, ok in checks]
    return "\n".join(lines)


def markdown(results: dict[str, Any]) -> str:
    parts = [f"# Benchmark results ({results['mode']} mode)\n"]
    if "machine" in results:
        said = machine_line(results["machine"]).removeprefix("machine: ")
        parts.append(f"Measured on this machine, and true only for it: {said}\n")
    if "resume" in results:
        parts += [
            "## Time to first token when a conversation resumes\n",
            resume_table([ResumeRow(**r) for r in results["resume"]]),
            "",
        ]
    if "concurrency" in results:
        parts += ["## Concurrency through HTTP\n", concurrency_table(results["concurrency"]), ""]
    if "persistence" in results:
        parts += ["## Persistence\n", persistence_table(results["persistence"]), ""]
    if "formats" in results:
        title = "## Each weight format, both servers on the same GGUF file (4,096-token prompt)\n"
        parts += [title, weight_formats.table(results["formats"]), ""]
    if "overhead" in results:
        o = results["overhead"]
        parts.append(
            f"HTTP overhead, 64-token reply: {o['overhead_fraction']:.1%} "
            f"({_s(o['http_s'])} at the client, {_s(o['engine_s'])} inside the server; medians)\n"
        )
    parts.append("```" + summary(results) + "\n```\n")
    return "\n".join(parts)


def plots(results: dict[str, Any], out: Path) -> None:
    if "formats" in results:
        weight_formats.plot(results["formats"], out)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if "resume" in results:
        rows = [ResumeRow(**r) for r in results["resume"]]
        labels = [str(r.history) for r in rows]
        series = [
            ("ours cold", [r.ours_cold for r in rows]),
            ("mlx-lm cold", [r.mlx_cold for r in rows]),
            ("ours next turn (disk)", [r.ours_next_turn for r in rows]),
            ("mlx-lm next turn (cache file)", [r.mlx_next_turn for r in rows]),
            ("ours same prompt (disk)", [r.ours_disk for r in rows]),
        ]
        if all(r.llama_cold is not None for r in rows):
            series += [
                ("llama.cpp cold (Q4_1)", [r.llama_cold or math.nan for r in rows]),
                ("llama.cpp next turn (state file)", [r.llama_next_turn or math.nan for r in rows]),
            ]
        fig, ax = plt.subplots(figsize=(9, 5))
        width = 0.8 / len(series)
        for i, (name, values) in enumerate(series):
            offset = (i - (len(series) - 1) / 2) * width
            ax.bar([x + offset for x in range(len(rows))], values, width, label=name)
        ax.set_yscale("log")
        ax.set_xticks(range(len(rows)), labels)
        ax.set_xlabel("tokens of history")
        ax.set_ylabel("time to first token (s, log scale)")
        ax.set_title("Resuming a conversation, 2-core CPU (lower is better)")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / "resume.png", dpi=120)
    if "concurrency" in results:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for server in ("semantic", "mlx_lm.server"):
            rows2 = [r for r in results["concurrency"] if r["server"] == server]
            ax.plot(
                [r["agents"] for r in rows2],
                [r["tokens_per_s"] for r in rows2],
                marker="o",
                label=server,
            )
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent agents")
        ax.set_ylabel("aggregate tokens/s")
        ax.set_title("Concurrent streams through HTTP")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / "concurrency.png", dpi=120)


def _s(seconds: float | None) -> str:
    if seconds is None or math.isnan(seconds):
        return "n/a"
    return f"{seconds * 1e3:.0f} ms" if seconds < 1 else f"{seconds:.2f} s"
