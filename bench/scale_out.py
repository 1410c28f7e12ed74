"""Scale-out: the same recompute audit on 1 vs 2 Ray workers (1 torch thread each), in one run on this machine.

    .venv/bin/python bench/scale_out.py [--entries 24] [--tokens 500] [--repeat 3] [--quiet-wait 120] [--dir DIR]
                                        [--local-only]

Builds (once; reused while it matches) a small random Llama (4 layers, hidden 256, the tests' tiny BPE
tokenizer) and a release of ENTRIES entries of TOKENS tokens captured with 1 torch thread. Then:

1. local: `recompute.audit` in this process with 1 torch thread (LocalExecutor), for reference;
2. a local Ray instance (3 logical CPUs, so that a 1-worker pool and a 2-worker pool can both stay up;
   only one of them works at a time, the machine has 2 cores);
3. pool A: 1 worker, pool B: 2 workers, each an actor holding the model, 1 torch thread per actor;
   one untimed warm-up audit per pool, then REPEAT interleaved repeats (A, B) of the whole audit,
   wall time from submitting the first entry to the last result (actors already started).

Speed-up = A's time / B's time (best of the repeats, median also printed; target >= 1.6x). The results of
A, B and local must be identical apart from timing and placement (kvgraft.execution.executor.comparable). Printed
too: actor start-up time, the CPU seconds the workers used, and the CPU seconds every other process used
meanwhile (Ray's daemons, other work): this benchmark wants a quiet machine, so before each repeat it
waits up to QUIET_WAIT seconds for the machine to be idle (under 0.25 busy CPUs over 2 s).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from machine import busy_seconds

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # tiny.py: the tests' tokenizer
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def pid_seconds(pids: list[int]) -> float:
    """CPU seconds (user + system) these processes have used."""
    total = 0.0
    for pid in pids:
        try:
            parts = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")
    return total


def wait_quiet(limit_s: float, threshold: float = 0.25) -> tuple[float, float]:
    """Wait (at most `limit_s`) until the machine's busy CPUs over 2 s fall below `threshold`; (waited s, busy CPUs)."""
    t0 = time.monotonic()
    while True:
        b0 = busy_seconds()
        time.sleep(2.0)
        busy = (busy_seconds() - b0) / 2.0
        if busy < threshold or time.monotonic() - t0 >= limit_s:
            return time.monotonic() - t0, busy


def build(folder: Path, entries: int, tokens: int) -> tuple[Path, Path]:
    """The model folder and the release (1 torch thread), rebuilt unless both exist with this shape."""
    import torch
    import transformers as tf

    from kvgraft.inference import capture, models, runtime
    from kvgraft.release.format import Release

    import tiny

    model_dir, rel = folder / "model", folder / f"rel-{entries}x{tokens}"
    if (rel / "manifest.json").is_file() and len(Release.open(rel).token_counts()) == entries:
        return model_dir, rel
    if not (model_dir / "config.json").is_file():
        model_dir.mkdir(parents=True, exist_ok=True)
        tok = tiny.tokenizer(model_dir)
        cfg = tf.LlamaConfig(vocab_size=len(tok), hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                             num_attention_heads=8, num_key_value_heads=4, head_dim=32, max_position_embeddings=2048,
                             pad_token_id=3, bos_token_id=1, eos_token_id=2)
        torch.manual_seed(0)
        tf.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).save_pretrained(model_dir)
    runtime.set_threads(1)
    lm = models.load(str(model_dir), device="cpu")
    ids = runtime.encode(lm, " ".join(tiny._CORPUS * (tokens // 20 + entries)))
    records = [(f"b{i}", {"id": f"b{i:03d}", "text": lm.tokenizer.decode(ids[i * 11 : i * 11 + tokens])})
               for i in range(entries)]
    capture.capture(lm, records, rel, schedule=runtime.Schedule(add_special_tokens=False), probe_tokens=8, overwrite=True)
    return model_dir, rel


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--entries", type=int, default=24)
    ap.add_argument("--tokens", type=int, default=500)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", type=Path, default=Path("/tmp/kvgraft-bench-scale-out"))
    ap.add_argument("--quiet-wait", type=float, default=120.0, help="Before each repeat, wait up to S seconds for the "
                                                                       "machine to be idle (other processes may share it).")
    ap.add_argument("--local-only", action="store_true", help="Stop after step 1 (no Ray): the release and the "
                                                                  "in-process reference audit only.")
    args = ap.parse_args()

    import ray
    import torch

    from kvgraft.execution.executor import LocalExecutor, ModelSpec, RayExecutor, comparable
    from kvgraft.inference import models
    from kvgraft.inference.reapply import Conditions
    from kvgraft.recompute import audit as recompute
    from kvgraft.signing.policy import SignatureNotChecked
    from kvgraft.signing.verify import verified

    model_dir, folder = build(args.dir, args.entries, args.tokens)  # perhaps by an earlier run: no OwnOutput
    rel = verified(folder, SignatureNotChecked())
    n_tokens = rel.release.token_counts()
    wait_quiet(args.quiet_wait)
    print(f"release   {folder}: {args.entries} entries of {min(n_tokens)}-{max(n_tokens)} tokens; model {model_dir} "
          f"(random Llama, 4 layers, hidden 256)")
    print(f"machine   {len(os.sched_getaffinity(0))} cores usable; python {sys.version.split()[0]}; torch {torch.__version__}; "
          f"ray {ray.__version__}; 1-minute load average {os.getloadavg()[0]:.2f}")
    lm = models.load(str(model_dir), device="cpu")

    def timed(executor: Any) -> tuple[float, dict[str, Any], float, float]:
        workers = executor.describe().get("workers")
        pids = [os.getpid()] + ([w["pid"] for w in workers] if isinstance(workers, list) else [])
        busy0, own0 = busy_seconds(), pid_seconds(pids)
        t0 = time.perf_counter()
        result = recompute.audit(rel, lm, executor=executor)
        wall = time.perf_counter() - t0
        ours = pid_seconds(pids) - own0
        return wall, result, ours, max(0.0, busy_seconds() - busy0 - ours)

    local_s, local, _, local_others = timed(LocalExecutor(threads=1))
    print(f"local     1 thread in this process: {local_s:.2f} s ({local_s / args.entries * 1000:.0f} ms per entry); "
          f"other processes used {local_others / local_s:.2f} CPUs meanwhile")
    if args.local_only:
        print(f"local     byte-exact {sum(e['byte_exact'] for e in local['entries'])}/{args.entries}")
        return

    t0 = time.perf_counter()
    ray.init(num_cpus=3, include_dashboard=False, log_to_driver=False, logging_level="WARNING")
    print(f"ray       local instance started in {time.perf_counter() - t0:.1f} s (3 logical CPUs, 2 cores)")
    pools: dict[int, RayExecutor] = {}
    for n in (1, 2):
        t0 = time.perf_counter()
        pools[n] = RayExecutor(ModelSpec(str(model_dir), Conditions("cpu", "float32", "sdpa", threads=1)), workers=n)
        pools[n].start()
        print(f"pool      {n} worker(s) started and loaded the model in {time.perf_counter() - t0:.1f} s")
        timed(pools[n])  # warm-up
    walls: dict[int, list[float]] = {1: [], 2: []}
    others_cpus: dict[int, list[float]] = {1: [], 2: []}
    results: dict[int, dict[str, Any]] = {}
    for r in range(args.repeat):
        waited, busy = wait_quiet(args.quiet_wait)
        print(f"repeat {r + 1}  waited {waited:.0f} s for a quiet machine: {busy:.2f} CPUs busy before the repeat")
        for n in (1, 2):
            wall, results[n], ours, others = timed(pools[n])
            walls[n].append(wall)
            others_cpus[n].append(others / wall)
            print(f"repeat {r + 1}  {n} worker(s): {wall:.2f} s; workers + driver used {ours / wall:.2f} CPUs, "
                  f"other processes {others / wall:.2f} CPUs")
    for p in pools.values():
        p.close()
    ray.shutdown()

    same = comparable(results[1]) == comparable(results[2]) == comparable(local)
    exact = {n: sum(e["byte_exact"] for e in results[n]["entries"]) for n in (1, 2)}
    spread = {w: sum(1 for e in results[2]["entries"] if e["placement"]["worker"] == w) for w in (0, 1)}
    best = {n: min(v) for n, v in walls.items()}
    med = {n: statistics.median(v) for n, v in walls.items()}
    speedup, speedup_med = best[1] / best[2], med[1] / med[2]
    paired = [a / b for a, b in zip(walls[1], walls[2], strict=True)]
    quiet = [x for x, o1, o2 in zip(paired, others_cpus[1], others_cpus[2], strict=True) if max(o1, o2) < 0.25]

    def fmt(xs: list[float]) -> str:
        return ", ".join(f"{x:.2f}" for x in xs)

    print(f"1 worker  best {best[1]:.2f} s, median {med[1]:.2f} s ({fmt(walls[1])}); byte-exact {exact[1]}/{args.entries}")
    print(f"2 workers best {best[2]:.2f} s, median {med[2]:.2f} s ({fmt(walls[2])}); byte-exact {exact[2]}/{args.entries}; "
          f"entries per worker {spread[0]} + {spread[1]}")
    print(f"speed-up  {speedup:.2f}x best-of-{args.repeat}, {speedup_med:.2f}x median (target >= 1.6x): "
          f"{'MET' if speedup >= 1.6 else 'NOT MET'}")
    print(f"paired    per repeat (1 worker / 2 workers): {fmt(paired)}; in the {len(quiet)} repeat(s) where other processes "
          f"used < 0.25 CPUs: " + (f"median {statistics.median(quiet):.2f}x" if quiet else "none"))
    print(f"results   1 worker, 2 workers and local identical apart from timing and placement: {same}")
    if not same:
        sys.exit(1)


if __name__ == "__main__":
    main()
