"""The PyTorch reference pass with glibc's default heap and with ``resources.reused_heap``
(issue 47), in rotation in one process: CPU seconds (user, system) and minor page faults of
one forward of a BERT encoder with random weights at one batch x sequence.

    python benchmarks/reference_heap.py [--config bert-large] [--batch 128] [--seq 128] \
        [--rounds 3] [--json FILE]

With glibc's defaults each tensor over its mmap threshold (at most 32 MB) is a fresh mapping,
faulted in page by page; ``reused_heap`` keeps freed blocks for the next ones. A wall time is
printed too, but on a shared machine only the CPU seconds and the faults compare.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import resource
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _measure import machine

CONFIGS = {"bert-base": {}, "bert-large": {"hidden_size": 1024, "num_hidden_layers": 24,
                                           "num_attention_heads": 16,
                                           "intermediate_size": 4096}}


def usage() -> tuple[float, float, int, float]:
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime, u.ru_stime, u.ru_minflt, time.perf_counter()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", choices=sorted(CONFIGS), default="bert-large")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    import torch
    from transformers import BertConfig, BertModel

    from trtpack.resources import reused_heap

    torch.manual_seed(0)
    model = BertModel(BertConfig(**CONFIGS[args.config])).eval()
    ids = torch.randint(1000, 30000, (args.batch, args.seq))
    mask = torch.ones(args.batch, args.seq, dtype=torch.int64)
    mask[args.batch // 2:, args.seq // 2:] = 0  # half the rows padded, as realistic inputs
    variants: dict[str, Any] = {"default heap": contextlib.nullcontext,
                                "reused_heap": reused_heap}
    rows = []
    for index in range(args.rounds):
        for name, heap in variants.items():
            before = usage()
            with torch.inference_mode(), heap():
                model(input_ids=ids, attention_mask=mask)
            after = usage()
            row = {"round": index, "variant": name, "user": round(after[0] - before[0], 2),
                   "sys": round(after[1] - before[1], 2),
                   "cpu": round(sum(after[:2]) - sum(before[:2]), 2),
                   "minor_faults": after[2] - before[2],
                   "wall": round(after[3] - before[3], 2)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    for name in variants:
        mine = [r for r in rows if r["variant"] == name]
        print(f"{name}: CPU s " + " / ".join(str(r["cpu"]) for r in mine)
              + " (sys " + " / ".join(str(r["sys"]) for r in mine) + "), minor faults "
              + " / ".join(str(r["minor_faults"]) for r in mine))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "machine": machine(), "command": " ".join(["python", *sys.argv]),
            "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "config": args.config, "batch": args.batch, "seq": args.seq, "rows": rows},
            indent=2) + "\n")


if __name__ == "__main__":
    main()
