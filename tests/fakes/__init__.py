"""Fakes of hardware libraries that tests (and test subprocesses) can import."""
