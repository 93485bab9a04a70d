"""`python -m tinyrl.init_model DIR [SEED]`: write the seeded TinyCore as an HF-style model directory
(the demo's stand-in for downloading a model), for `actor_rollout_ref.model.path=DIR`."""
import sys

from tinycore import TinyCore

from tinyrl.checkpoint import save_hf


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) not in (1, 2):
        print("usage: python -m tinyrl.init_model DIR [SEED]", file=sys.stderr)
        return 2
    save_hf(argv[0], TinyCore(seed=int(argv[1]) if len(argv) == 2 else 1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
