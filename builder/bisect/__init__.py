"""`builder bisect GOOD BAD`: the commit ranges (commits.py), the search (search.py) and the answer (answer.py).
The use case that builds and accepts each candidate is pipeline.bisect; this package never builds."""
