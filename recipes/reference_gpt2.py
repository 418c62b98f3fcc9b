"""Pretrain the study's reference GPT-2 from scratch (see posswap/study/reference.py for what and why).

    python recipes/reference_gpt2.py                     # CPU size: 6 layers x 256, <= 60 min on 2 cores
    python recipes/reference_gpt2.py --size gpu --set train.max_steps=5000

`posswap study` runs this itself when the reference is missing.
"""

from __future__ import annotations

import argparse

from posswap.study.reference import SIZES, pretrain_reference


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="cpu")
    parser.add_argument(
        "--set", nargs="+", action="extend", default=[], metavar="KEY=VALUE", help="Recipe overrides (repeatable)."
    )
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args()
    print(f"Trained reference GPT-2 in {pretrain_reference(args.size, args.set, args.resume)}")


if __name__ == "__main__":
    main()
