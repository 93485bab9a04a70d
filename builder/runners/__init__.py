"""Where the gates run: the one factory that turns an acceptance plan into a GateRunner."""
