"""``observers push`` and ``observers verify``: publish and check recorded datasets.

``observers push <local-dataset> --repo user/name`` uploads the shards a run recorded
offline (a compute node without internet, the Hub down, a crash) in one commit, with a
progress bar; shards already on that repo are skipped. It first seals the write-ahead log
of writers that died. The token comes from ``hf auth login`` or ``HF_TOKEN``.

``observers verify <dataset>`` checks a local dataset folder, or a Hub repo id (downloaded
first): every shard opens, schemas agree across the shards of a table, the manifest matches
the files (sha256), steps and timestamps are continuous per run and rank (gaps reported).
Exit status: 0 no damage, 1 damage found (``--strict``: gaps count too), 2 usage error.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

_logger = logging.getLogger(__name__)


def register(subparsers: Any) -> None:
    push = subparsers.add_parser(
        "push", help="upload a recorded dataset's pending shards to a Hub dataset repo",
        description="Upload the shards of a local observers dataset that are not yet on the Hub repo "
                    "(one commit; already uploaded shards are skipped). Log in first with "
                    "`hf auth login` or set HF_TOKEN.")
    push.add_argument("dataset", help="local dataset folder, e.g. observers/my-experiment")
    push.add_argument("--repo", required=True, help="Hub dataset repo id, user/name")
    push.add_argument("--public", action="store_true", help="create the repo public (default: private)")
    push.add_argument("--force", action="store_true",
                      help="send every shard again (the Hub skips unchanged files)")
    push.add_argument("--retries", type=int, default=8, help="attempts on transient failures (default 8)")
    push.add_argument("--no-progress", action="store_true", help="no progress bar")
    push.set_defaults(func=cmd_push)

    verify = subparsers.add_parser(
        "verify", help="check a dataset: shards open, schemas agree, manifest matches, steps continuous",
        description="Check a local dataset folder or a Hub dataset repo id (downloaded first). "
                    "Exit status 1 when damage is found.")
    verify.add_argument("dataset", help="local dataset folder, or a Hub repo id user/name")
    verify.add_argument("--strict", action="store_true", help="also fail on step/time gaps")
    verify.set_defaults(func=cmd_verify)


def cmd_push(args: argparse.Namespace) -> int:
    from opentelemetry.exporter.hf_dataset import HubAuthError, HubPusher, load_manifests, recover
    from tqdm.auto import tqdm

    root = Path(args.dataset)
    if not root.is_dir():
        print(f"observers push: {root} is not a folder", file=sys.stderr)
        return 2
    try:
        recovered = recover(root)
    except OSError as exc:
        recovered = []
        print(f"observers push: could not seal the write-ahead log in {root}: {exc}", file=sys.stderr)
    if recovered:
        print(f"sealed {len(recovered)} shard(s) from the write-ahead log of an interrupted run")
    live = [m.key for m in load_manifests(root) if m.is_live()]
    if live:
        print(f"skipping {len(live)} writer(s) still running on this host ({', '.join(live)}); "
              "their shards are pushed by that run or a later `observers push`", file=sys.stderr)
    pusher = HubPusher(root, args.repo, private=not args.public,
                       commit_message="observers push: add recorded telemetry shards")
    pending = pusher.pending() if not args.force else [
        (m, rel) for m in load_manifests(root) if not m.is_live() for rel in m.shards]
    total = 0
    for _, rel in pending:
        try:
            total += (root / rel).stat().st_size
        except OSError:
            pass
    if not pending:
        print(f"nothing to push: every shard of {root} is already on {args.repo}")
        return 0
    bar = tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=f"push {args.repo}",
               disable=args.no_progress, file=sys.stderr)

    def progress(nbytes: int, rel: str) -> None:
        bar.set_postfix_str(rel.rsplit("/", 3)[-3] if rel.count("/") >= 3 else rel, refresh=False)
        bar.update(nbytes)

    try:
        result = pusher.push(progress=progress, max_attempts=max(1, args.retries), force=args.force)
    except HubAuthError as exc:
        bar.close()
        print(f"observers push: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # noqa: BLE001 - reported, the shards stay pending
        bar.close()
        from opentelemetry.exporter.hf_dataset._hub import describe

        print(f"observers push: failed after retries: {describe(exc)}\nNothing is lost: the shards stay "
              f"pending in {root}; run the same command again.", file=sys.stderr)
        return 1
    bar.close()
    if result.commit is None:
        print(f"nothing new to push to {result.repo_id}")
    else:
        print(f"pushed {len(result.shards)} shard(s), {result.bytes / 1e6:.2f} MB, to "
              f"https://huggingface.co/datasets/{result.repo_id} (commit {result.commit[:12]})")
    if result.skipped:
        print(f"{len(result.skipped)} shard(s) not pushed (missing or changed since sealed); "
              f"run `observers verify {root}`", file=sys.stderr)
        return 1
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from opentelemetry.exporter.hf_dataset._verify import verify_dataset

    root = Path(args.dataset)
    if not root.exists():
        if args.dataset.count("/") != 1:
            print(f"observers verify: {args.dataset} is neither a folder nor a Hub repo id", file=sys.stderr)
            return 2
        try:
            from huggingface_hub import snapshot_download

            root = Path(snapshot_download(args.dataset, repo_type="dataset"))
        except Exception as exc:  # noqa: BLE001
            print(f"observers verify: cannot download {args.dataset}: {' '.join(str(exc).split())[:300]}",
                  file=sys.stderr)
            return 2
    report = verify_dataset(root)
    for line in report.lines():
        print(line)
    if not report.ok or (args.strict and report.gaps):
        return 1
    return 0
