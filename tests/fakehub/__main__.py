"""Run the fake Hub by hand: ``python -m tests.fakehub --port 8765 --token hf_x:alice``."""

from __future__ import annotations

import argparse
import time

from tests.fakehub.server import FakeHub


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--token", action="append", default=[], metavar="TOKEN:USER")
    args = parser.parse_args()
    tokens = dict(t.split(":", 1) for t in args.token)
    hub = FakeHub(tokens=tokens, port=args.port).start()
    print(f"fake hub on {hub.url} (HF_ENDPOINT={hub.url} HF_HUB_DISABLE_XET=1)", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        hub.stop()


if __name__ == "__main__":
    main()
