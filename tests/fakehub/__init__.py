"""A fake Hugging Face Hub for tests (stdlib HTTP server on 127.0.0.1); see :mod:`.server`."""

from tests.fakehub.server import Commit, FakeHub, Fault, Repo, git_blob_sha1

__all__ = ["Commit", "FakeHub", "Fault", "Repo", "git_blob_sha1"]
