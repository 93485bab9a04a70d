"""`python -m tinyrl.rollout_server --port P [--host H]`: the rollout engine as a server for one trainer, over TCP
(multiprocessing.connection, the shared key in ROLLOUT_AUTHKEY). It serves the rollout worker's commands
(tinyrl/rollout.py: load_weights, generate, stop) and exits when the trainer sends stop. The trainer reaches it
with actor_rollout_ref.rollout.address=HOST:PORT."""
import argparse
import os
import sys
from multiprocessing.connection import Listener

from tinyrl.rollout import AUTHKEY_ENV, Plain, _main


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m tinyrl.rollout_server")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, required=True, help="TCP port to listen on")
    args = parser.parse_args(argv)
    key = os.environ.get(AUTHKEY_ENV, "")
    if not key:
        print(f"tinyrl.rollout_server: {AUTHKEY_ENV}: expected the key the trainer shares", file=sys.stderr)
        return 2
    with Listener((args.host, args.port), authkey=key.encode()) as listener:
        print(f"tinyrl.rollout_server: listening on {args.host}:{args.port}", file=sys.stderr, flush=True)
        with listener.accept() as conn:
            print(f"tinyrl.rollout_server: trainer from {listener.last_accepted[0]}", file=sys.stderr, flush=True)
            try:
                _main(Plain(conn), {})
            except (EOFError, OSError) as err:
                print(f"tinyrl.rollout_server: the trainer went away: {err.__class__.__name__}", file=sys.stderr)
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
