"""``txchaos prune``: remove old run folders on request (``harness.run.core.retention``).

``--older-than 7d`` removes the run folders begun more than seven days ago, ``--keep 20`` all but
the newest twenty; given both, a folder goes when both hold. ``--dry-run`` lists what would go. A
folder still in use (a soak compacting its ledger, a file written in the last ten minutes) stays.
Only ``$TXCHAOS_REPORTS/runs`` (``reports/runs``) is looked at, and in it only run folders.
"""

from __future__ import annotations

import argparse
import time

from harness.cli.output import console


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("prune", help="remove old run folders: --older-than 7d and/or --keep N (--dry-run lists them)")
    p.add_argument("--older-than", default=None, metavar="AGE", help="remove run folders begun longer ago: 12h, 7d")
    p.add_argument("--keep", type=int, default=None, metavar="N", help="keep the newest N run folders")
    p.add_argument("--dry-run", action="store_true", help="list what would be removed; remove nothing")
    p.set_defaults(func=cmd_prune)


def cmd_prune(args: argparse.Namespace) -> int:
    from harness import paths
    from harness.run.core.retention import plan, remove
    from harness.soak.spec import parse_duration

    root = paths.runs_root()
    older = parse_duration(args.older_than) if args.older_than is not None else None
    picked = plan(root, older_than_s=older, keep=args.keep)
    verb = "would remove" if args.dry_run else "removing"
    now = time.time()
    for r in picked.remove:
        console.print(f"{verb} {r.path.name}  ({r.size / 1e6:,.1f} MB, {_age(now - r.started)} old)")
    for r in picked.busy:
        console.print(f"kept {r.path.name}: in use ({r.busy})", style="yellow")
    total = sum(r.size for r in picked.remove)
    if args.dry_run:
        console.print(
            f"{len(picked.remove)} run folder(s), {total / 1e9:,.2f} GB, would go; {picked.kept} would stay in {root}"
        )
        return 0
    freed = remove(picked.remove)
    console.print(
        f"removed {len(picked.remove)} run folder(s), {freed / 1e9:,.2f} GB freed; {picked.kept} stay in {root}"
    )
    return 0


def _age(seconds: float) -> str:
    if seconds >= 86400:
        return f"{seconds / 86400:.1f}d"
    if seconds >= 3600:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 60:.0f}m"
