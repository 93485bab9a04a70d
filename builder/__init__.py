"""builder: make a unified RL-stack image trustworthy (resolve, build, accept, report, publish)."""
__version__ = "0.1.0"
