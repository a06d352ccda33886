"""Distributed tests: 2 processes on 127.0.0.1 (gloo), each launch bounded by run_on_ranks' timeouts."""
