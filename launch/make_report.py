"""Write results/NAME/report.md and its plots from the stored results: python launch/make_report.py results/NAME"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from eval.report import write_report  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("output_dir", help="a results directory written by launch/eval_drafters.py")
    print(write_report(p.parse_args(argv).output_dir))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
