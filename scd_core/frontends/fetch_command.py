"""`python -m scd_core fetch REPO_ID --to DIR`: a published model folder from the Hugging Face hub into DIR/<its
name>, with one progress bar on the terminal; rerun it to resume (models/fetch.py does the work)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tqdm import tqdm

from ..models.family import published_repos
from ..models.fetch import check_repo, fetch_model, folder_name


def add_fetch_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("repo_id", metavar="REPO_ID", help=f"one of {', '.join(published_repos())}")
    parser.add_argument("--to", type=Path, default=Path("."), metavar="DIR",
                        help="the folder to put the model's folder in, e.g. ComfyUI/models/scd")
    parser.add_argument("--revision", default="main", help="a branch, tag or commit of the repository")


def run_fetch(args: argparse.Namespace) -> int:
    from huggingface_hub.utils import disable_progress_bars

    check_repo(args.repo_id)
    target = args.to / folder_name(args.repo_id)
    if target.exists():
        print(f"{target} is there already; delete it to fetch {args.repo_id} again")
        return 0
    disable_progress_bars()  # one bar for the whole folder instead of the client's one per file
    with tqdm(total=0, unit="B", unit_scale=True, desc=folder_name(args.repo_id), file=sys.stderr) as bar:
        def progress(done: int, total: int, name: str) -> None:
            bar.total = total
            bar.update(done - bar.n)

        folder = fetch_model(args.repo_id, args.to, revision=args.revision, progress=progress)
    print(f"fetched {args.repo_id} into {folder}")
    return 0
