"""The use cases, one module each: building (setup, lock, resolve, render, build), accepting (accept, replay, a stored
report's formats), releasing (run, publish, export-sqsh, rebuild, keygen, verify), nightly_runs (nightly, fleet,
gc, history page, compare) and bisecting. Each is a plain function over typed records; the CLI parses arguments and
calls them, and nightly and bisect call the same functions."""
