"""`builder bisect GOOD BAD`: the commit ranges (commits.py), the search (search.py) and the answer (answer.py).
The use case that builds and accepts each candidate is builder/pipeline/bisecting.py; this package never builds."""
