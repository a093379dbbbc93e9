"""Publish a drafter directory to the Hugging Face Hub with a generated model card.

    python launch/push_to_hub.py DIR --repo-id ORG/NAME [--private] [--revision BRANCH] [--dry-run]
        [--eval-results results/NAME/results.jsonl]

The token comes from HF_TOKEN or the saved login (`hf auth login`); it is never printed.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("directory", help="drafter directory (config.json + model.safetensors)")
    parser.add_argument("--repo-id", required=True, help="ORG/NAME on the Hub")
    parser.add_argument("--private", action="store_true", help="create the repository as private")
    parser.add_argument("--revision", help="branch to push to (created when missing)")
    parser.add_argument("--dry-run", action="store_true", help="list the files and print the model card only")
    parser.add_argument("--eval-results", help="an evaluation results.jsonl (or its directory) for the card")
    parser.add_argument("--commit-message", help="commit message")
    parser.add_argument("--license", default="apache-2.0", help="license in the model card metadata")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")

    from checkpoints.hub import push_drafter

    plan = push_drafter(args.directory, args.repo_id, private=args.private, revision=args.revision,
                        dry_run=args.dry_run, commit_message=args.commit_message,
                        eval_results=args.eval_results, license=args.license)
    print(plan.describe())
    if args.dry_run:
        print("\n----- README.md (model card) -----")
        print(plan.card)


if __name__ == "__main__":
    main()
