"""Write the ``training.json`` of an embedding recipe's run (what ``posswap/embeddings/report_tables.py`` reports beside its
retrieval results) from the run folder and the ``/usr/bin/time -v`` log of the command (or bash's ``time``, with
``--command``):

    /usr/bin/time -v posswap train recipes/minilm-embed-2k.yaml --set ... 2> train.log
    python tools/record_training.py out/minilm-embed-2k-seed1 train.log results/embeddings/trained-seed1/training.json

Reads ``log.jsonl`` (the loss of each step) and ``recipe.json`` (the resolved recipe) of the run folder; from the
time log the command, wall and CPU seconds, and the share of this machine's cores the run got. A run started
without ``/usr/bin/time``: ``-`` for the time log, with ``--command`` and ``--wall-seconds`` (from the run folder's
file times); its CPU time is then recorded as unknown (null), never guessed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
from pathlib import Path


def time_log(path: Path, command: str | None = None) -> dict:
    """Command, wall and CPU seconds from GNU time's ``-v`` report, or from bash's ``time`` (its real, user and sys
    lines; the command is then ``command``)."""
    text = path.read_text()
    if "Command being timed" not in text:
        return bash_time(text, command)
    command = re.search(r'Command being timed: "(.*)"', text)[1]
    clock = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): ([\d:.]+)", text)[1]
    wall = sum(float(part) * 60**i for i, part in enumerate(reversed(clock.split(":"))))
    cpu = sum(float(re.search(rf"{kind} time \(seconds\): ([\d.]+)", text)[1]) for kind in ("User", "System"))
    share = re.search(r"Percent of CPU this job got: (\d+)%", text)[1]
    return {"command": command, "wall_seconds": round(wall, 1), "cpu_seconds": round(cpu, 1), "cpu_share": share}


def bash_time(text: str, command: str | None) -> dict:
    if command is None:
        raise SystemExit("A log with bash's time report: give --command (bash's time does not name it).")
    seconds = {}
    for kind in ("real", "user", "sys"):
        found = re.findall(rf"^{kind}\s+(\d+)m([\d.]+)s$", text, re.M)
        if not found:
            raise SystemExit(f"No '{kind}' line of bash's time report in the log.")
        minutes, rest = found[-1]
        seconds[kind] = 60 * int(minutes) + float(rest)
    cpu = seconds["user"] + seconds["sys"]
    share = f"{round(100 * cpu / seconds['real'])}"
    return {
        "command": command,
        "wall_seconds": round(seconds["real"], 1),
        "cpu_seconds": round(cpu, 1),
        "cpu_share": share,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("time_log", help="GNU time's -v report of the command, or - when the run was not timed")
    parser.add_argument("out", type=Path)
    parser.add_argument("--machine-note", default="", help="how the run shared the machine, e.g. its thread count")
    parser.add_argument("--command", help="the command, for a run without a time log or timed by bash's time")
    parser.add_argument("--wall-seconds", type=float, help="its wall time, for a run without a time log")
    args = parser.parse_args(argv)
    untimed = args.time_log == "-"
    if untimed and (args.command is None or args.wall_seconds is None):
        parser.error("time_log -: give --command and --wall-seconds (the run was not timed)")
    if not untimed and args.command is not None and "Command being timed" in Path(args.time_log).read_text():
        parser.error("--command is for a time_log of bash's time or none (-); GNU time's report names its command")
    if not untimed and args.wall_seconds is not None:
        parser.error("--wall-seconds is for a run without a time log (time_log -); this one has one")
    recipe = json.loads((args.run_dir / "recipe.json").read_text())
    logged = [json.loads(line) for line in (args.run_dir / "log.jsonl").read_text().splitlines()]
    losses = [line["loss"] for line in logged]
    if untimed:
        timed = {"command": args.command, "wall_seconds": args.wall_seconds, "cpu_seconds": None, "cpu_share": None}
    else:
        timed = time_log(Path(args.time_log), args.command)
    share = "" if timed["cpu_share"] is None else f", of which the run got {timed['cpu_share']}%"
    record = {
        "command": timed["command"],
        "steps": logged[-1]["step"] if logged else 0,  # what ran, not what the recipe asked for
        "batch_size": recipe["train"]["batch_size"],
        "document_lengths": recipe["embedding"]["document_lengths"],
        "wall_seconds": timed["wall_seconds"],
        "cpu_seconds": timed["cpu_seconds"],
        "machine": f"{len(os.sched_getaffinity(0))} CPU cores{share}"
        + (f" ({args.machine_note})" if args.machine_note else ""),
        "losses": losses,
        "recipe": recipe,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
