"""One model in each weight format, ours beside llama.cpp on the same file, in one run.

    python -m benchmarks.weight_formats [--prompt 4096] [--formats q4_1,q4_0,q8_0,bf16,f32]
        [--rounds 1] [--out bench-results]

Every format is one GGUF file that both servers run: the embedded model's own Q4_1, and
that file stored again as Q4_0, Q8_0, BF16 and F32 (``gguf_files``). Ours serves the
4- and 8-bit files as they are (``--model FILE.gguf``), and the BF16 and F32 rows as
``--weights bf16`` and ``float32`` (MLX reads a GGUF's BF16 tensors as float16), the same
values. For each: resident memory the model added (RSS after the run less RSS before
loading, its KV included), the weights held (ours: parameter bytes; llama.cpp: the file),
a cold prefill of one prompt, 1, 8 and 16 sequences decoding together (ours through the
engine; llama.cpp after a short prompt each, one batch a step, through its C API), and an
agent's next turn from disk over a history of the prompt's length (``format_turns``: ours
after a restart, llama.cpp from its state file). Each measurement runs in a fresh
process, llama.cpp's first (``--rounds N``: N times in turn, the medians). Writes
``weight_formats.json`` and ``weight_formats.png`` into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from mlx.utils import tree_flatten

from benchmarks import format_turns, gguf_files, llama_cpp
from benchmarks.common import Bench, open_bench, timed
from benchmarks.decode_scaling import engine_rate
from benchmarks.machine import print_machine
from semantic.adapters.mlx.cpu.blas import report_blas
from semantic.config import Settings
from semantic.domain.generation import SamplingParams

STREAMS = (1, 8, 16)
FORMATS = {"q4_1": "Q4_1", "q4_0": "Q4_0", "q8_0": "Q8_0", "bf16": "BF16", "f32": "F32"}
"""Row name: the GGUF type both servers run."""
OURS_BY_WEIGHTS = {"Q4_1": "quantized", "BF16": "bf16", "F32": "float32"}
"""Types ours serves from the embedded model's conversion (the same values); the others
from the file itself, converted into a model cache of the run's own."""


def our_source(kind: str, gguf: Path) -> dict[str, str]:
    """The settings (as ``serve`` flags without dashes) that make ours serve ``kind``."""
    if kind in OURS_BY_WEIGHTS:
        return {"weights": OURS_BY_WEIGHTS[kind]}
    return {"model": str(gguf), "model_cache": str(gguf.parent / "model-cache")}


def _settings(source: dict[str, str]) -> Settings:
    if "model" in source:
        return Settings(model=source["model"], model_cache_dir=Path(source["model_cache"]))
    return Settings(weights=source["weights"])


def _server_args(source: dict[str, str]) -> list[str]:
    return [part for key, value in source.items() for part in (f"--{key.replace('_', '-')}", value)]


def resident_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def weight_bytes(bench: Bench) -> int:
    parameters: Any = tree_flatten(bench.loaded.model.parameters())  # (path, array) pairs
    return sum(int(array.nbytes) for _, array in parameters)


def prefill_rate(bench: Bench, prompt: list[int]) -> float:
    backend = bench.backend()
    backend.open_sequence(
        "cold", restored=None, n_restored=0, n_new=len(prompt), sampling=SamplingParams()
    )
    chunks = [prompt[i : i + 256] for i in range(0, len(prompt), 256)]

    def prefill() -> int:
        for chunk in chunks[:-1]:
            backend.prefill("cold", chunk)
        return backend.prefill_and_sample("cold", chunks[-1]).token

    _, seconds = timed(prefill)
    backend.close_sequence("cold", 0)
    return len(prompt) / seconds


def ours(gguf: Path, kind: str, prompt: list[int]) -> dict[str, Any]:
    before = resident_mb()
    bench = open_bench(_settings(our_source(kind, gguf)))
    bench.backend().warm_up()
    prefill = prefill_rate(bench, prompt)
    decode = [engine_rate(bench, n) for n in STREAMS]
    held = weight_bytes(bench) / 1e6
    return {"held_mb": held, "rss_mb": resident_mb() - before, "prefill": prefill, "decode": decode}


def theirs(gguf: Path, prompt: list[int], turns: format_turns.Turns) -> dict[str, Any]:
    before = resident_mb()
    state = llama_cpp.LlamaCppState(gguf, len(prompt) + 8, gguf.parent)
    prefill = len(prompt) / state.cold(prompt)
    rss = resident_mb() - before
    del state
    decode = [llama_cpp.parallel_decode_rate(gguf, n) for n in STREAMS]
    next_turn = format_turns.theirs(gguf, turns, gguf.parent)
    held = gguf.stat().st_size / 1e6
    return {
        "held_mb": held,
        "rss_mb": rss,
        "prefill": prefill,
        "decode": decode,
        "next_turn": next_turn,
    }


def one(server: str, gguf: Path, kind: str, prompt_tokens: int, turns: Path) -> dict[str, Any]:
    """One row, measured in this (fresh) process."""
    rng = random.Random(0)
    prompt = [rng.randrange(100, 40_000) for _ in range(prompt_tokens)]
    if server == "ours":
        found = ours(gguf, kind, prompt)
    else:
        found = theirs(gguf, prompt, format_turns.Turns.load(turns))
    return {"format": kind, "server": server} | found


def run(
    formats: list[str], prompt: int, with_llama: bool, n_rounds: int = 1
) -> list[dict[str, Any]]:
    """Every row, each in a fresh process, llama.cpp's first for each file, ``n_rounds``
    times in turn (each figure the median of its rounds, with an even count the mean of the
    middle two: this VM class's speed drifts 10-25% between processes); then our next turn
    from disk, through servers of that format (itself the middle of several restarts)."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        source = gguf_files.embedded_gguf(work)
        turns = format_turns.make_turns(prompt).save(work / "turns.json")
        for name in formats:
            kind = FORMATS[name]
            gguf = source if kind == "Q4_1" else gguf_files.requantized(source, kind, work)
            servers = ("llama.cpp", "ours") if with_llama else ("ours",)
            rounds = [
                [_in_fresh_process(server, gguf, kind, prompt, turns) for server in servers]
                for _ in range(n_rounds)
            ]
            found = [_median_row([r[i] for r in rounds]) for i in range(len(servers))]
            talk = work / f"turns-{kind}"
            talk.mkdir()
            args = _server_args(our_source(kind, gguf))
            found[-1]["next_turn"] = format_turns.ours(args, format_turns.Turns.load(turns), talk)
            rows += found
            print(table(found, header=len(rows) == len(servers)), flush=True)
    return rows


def _in_fresh_process(
    server: str, gguf: Path, kind: str, prompt: int, turns: Path
) -> dict[str, Any]:
    command = [sys.executable, "-m", "benchmarks.weight_formats", "--one", server]
    command += ["--gguf", str(gguf), "--kind", kind, "--prompt", str(prompt)]
    command += ["--turns", str(turns)]
    done = subprocess.run(command, check=True, capture_output=True, text=True)
    row: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return row


def _median_row(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """One row of several rounds: each figure (and each decode rate) their median."""
    row = dict(rounds[0])
    for key, value in row.items():
        if isinstance(value, float | int):
            row[key] = statistics.median(r[key] for r in rounds)
        elif isinstance(value, list):
            columns = zip(*(r[key] for r in rounds), strict=True)
            row[key] = [statistics.median(column) for column in columns]
    return row


def table(rows: list[dict[str, Any]], header: bool = True) -> str:
    streams = " | ".join(f"decode {n}" for n in STREAMS)
    lines = [
        f"| GGUF | server | weights MB | RSS + MB | cold prefill tok/s | next turn, disk "
        f"| {streams} |",
        "|---|---|---:|---:|---:|---:|" + "---:|" * len(STREAMS),
    ]
    for r in rows:
        decode = " | ".join(f"{rate:.1f}" for rate in r["decode"])
        turn = f"{r['next_turn'] * 1000:.0f} ms" if "next_turn" in r else "-"
        lines.append(
            f"| {r['format']} | {r['server']} | {r['held_mb']:.0f} | {r['rss_mb']:.0f} "
            f"| {r['prefill']:.0f} | {turn} | {decode} |"
        )
    return "\n".join(lines if header else lines[2:])


def checks(rows: list[dict[str, Any]]) -> list[tuple[str, str, bool]]:
    """The weights issue's bars on the embedded Q4_1 file: (target, measured, met)."""
    found = {(r["format"], r["server"]): r for r in rows}
    ours, theirs, f32 = (
        found.get(key) for key in (("Q4_1", "ours"), ("Q4_1", "llama.cpp"), ("F32", "ours"))
    )
    said: list[tuple[str, str, bool]] = []
    if ours is not None and f32 is not None:
        ratio = ours["decode"][0] / f32["decode"][0]
        said.append(("4-bit one stream >= 2.5x our float32", f"{ratio:.2f}x", ratio >= 2.5))
    if ours is None or theirs is None:
        return said
    bars = [
        ("4-bit one stream >= 1.0x llama.cpp's", ours["decode"][0] / theirs["decode"][0], 1.0),
        ("4-bit 16 streams >= 2x llama.cpp's", ours["decode"][-1] / theirs["decode"][-1], 2.0),
        ("4-bit cold 4K time <= 0.7x llama.cpp's", theirs["prefill"] / ours["prefill"], -0.7),
        ("4-bit weights held <= 1.3x the file", ours["held_mb"] / theirs["held_mb"], -1.3),
    ]
    if "next_turn" in ours and "next_turn" in theirs:
        turn = ours["next_turn"] / theirs["next_turn"]
        bars.append(("4-bit next turn from disk <= llama.cpp's state file", turn, -1.0))
    for name, ratio, bar in bars:  # a negative bar is an upper one
        said.append((name, f"{ratio:.2f}x", ratio >= bar if bar > 0 else ratio <= -bar))
    return said


def plot(rows: list[dict[str, Any]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = list(dict.fromkeys(r["format"] for r in rows))
    decode = ((f"decode, {n} stream{'s' * (n > 1)}", i) for i, n in enumerate(STREAMS))
    panels = [("cold prefill", -1), *decode]
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 4))
    for ax, (title, index) in zip(axes, panels, strict=True):
        for offset, server in ((-0.2, "ours"), (0.2, "llama.cpp")):
            found = {r["format"]: _rate(r, index) for r in rows if r["server"] == server}
            xs = [i + offset for i, kind in enumerate(kinds) if kind in found]
            ax.bar(xs, [found[k] for k in kinds if k in found], 0.4, label=server)
        ax.set_xticks(range(len(kinds)), kinds)
        ax.set_title(f"{title} (tokens/s)")
    axes[-1].legend()
    fig.suptitle("One model per GGUF type, both servers, same run (higher is better)")
    fig.tight_layout()
    fig.savefig(out / "weight_formats.png", dpi=120)


def _rate(row: dict[str, Any], decode_index: int) -> float:
    """Tokens/s: the cold prefill's (-1) or a stream count's decode."""
    return float(row["prefill"] if decode_index < 0 else row["decode"][decode_index])


def _at_least_one(text: str) -> int:
    rounds = int(text)
    if rounds < 1:
        raise argparse.ArgumentTypeError(f"rounds must be at least 1, got {rounds}")
    return rounds


def _format_names(text: str) -> list[str]:
    """Row names in either case (``Q4_1`` or ``q4_1``); an unknown one is a usage error."""
    names = [name.strip().lower() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in FORMATS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown format {unknown}; choose from {list(FORMATS)}")
    return names


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompt", type=int, default=4096, help="cold prompt tokens")
    parser.add_argument(
        "--formats",
        type=_format_names,
        default=list(FORMATS),
        help=f"comma-separated, any of {', '.join(FORMATS)} (default: all)",
    )
    parser.add_argument("--out", type=Path, default=Path("bench-results"))
    parser.add_argument(
        "--rounds",
        type=_at_least_one,
        default=1,
        help="fresh processes per figure, servers in turn (each figure their median)",
    )
    parser.add_argument("--one", choices=("ours", "llama.cpp"), help=argparse.SUPPRESS)
    parser.add_argument("--gguf", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--kind", help=argparse.SUPPRESS)
    parser.add_argument("--turns", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.gguf, args.kind, args.prompt, args.turns)))
        return
    report_blas()
    found = print_machine()
    with_llama = llama_cpp.available()
    if not with_llama:
        print("llama-cpp-python is not installed: ours only")
    rows = run(args.formats, args.prompt, with_llama, args.rounds)
    args.out.mkdir(parents=True, exist_ok=True)
    results = {"machine": found, "prompt": args.prompt, "rounds": args.rounds, "rows": rows}
    (args.out / "weight_formats.json").write_text(json.dumps(results, indent=2))
    plot(rows, args.out)
    print(f"wrote {args.out}/weight_formats.json and weight_formats.png")


if __name__ == "__main__":
    main()
