"""`python -m llmgw.hubstandin DIR [--port N]`: serve every DIR/<owner>/<name>/ as a repo (one commit of it)."""

import argparse
import threading
from pathlib import Path

from llmgw.hubstandin import HubStandIn

__all__ = ["main"]


def main(argv: list[str] | None = None) -> None:
    """Publish the repos found under DIR and serve them until interrupted, printing the endpoint URL."""
    parser = argparse.ArgumentParser(prog="python -m llmgw.hubstandin", description=__doc__)
    parser.add_argument("dir", type=Path, help="a folder of <owner>/<name>/ folders, each served as a model repo")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="the Hub's port (default: any free one)")
    args = parser.parse_args(argv)
    hub = HubStandIn(args.host, args.port)
    for repo in sorted(p for p in args.dir.glob("*/*") if p.is_dir() and not p.name.startswith(".")):
        files = {
            f.relative_to(repo).as_posix(): f
            for f in sorted(repo.rglob("*"))
            if f.is_file() and not any(part.startswith(".") for part in f.relative_to(repo).parts[:-1])
        }
        repo_id = f"{repo.parent.name}/{repo.name}"
        print(f"{repo_id}: {len(files)} files, commit {hub.add_repo(repo_id, files)}")
    with hub:
        print(f"A stand-in for the Hugging Face Hub (not the Hub) at {hub.url}: HF_ENDPOINT={hub.url}", flush=True)
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
