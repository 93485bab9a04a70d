"""The demo stack: three tiny packages in deterministic git repositories (see README.md)."""
