"""Environment variables read by the Hugging Face dataset exporters.

The exporters are created by the OpenTelemetry SDK with no arguments when named in
``OTEL_TRACES_EXPORTER`` / ``OTEL_METRICS_EXPORTER`` / ``OTEL_LOGS_EXPORTER``
(``hf_dataset``), so every setting has an environment variable.
"""

OTEL_EXPORTER_HF_DATASET_DIR = "OTEL_EXPORTER_HF_DATASET_DIR"
"""
.. envvar:: OTEL_EXPORTER_HF_DATASET_DIR

Local directory of the dataset the exporters write (one dataset = one folder holding
``README.md``, ``data/<table>/...`` Parquet shards and the hidden ``.observers/`` state).
Default: ``./otel-dataset``.
"""

OTEL_EXPORTER_HF_DATASET_RUN_ID = "OTEL_EXPORTER_HF_DATASET_RUN_ID"
"""
.. envvar:: OTEL_EXPORTER_HF_DATASET_RUN_ID

Identifier of this process's run; shards go to ``data/<table>/<run_id>/``.
Default: the resource's ``ml.run.id`` or ``service.instance.id``, else a new id.
"""

OTEL_EXPORTER_HF_DATASET_SEAL_INTERVAL = "OTEL_EXPORTER_HF_DATASET_SEAL_INTERVAL"
"""
.. envvar:: OTEL_EXPORTER_HF_DATASET_SEAL_INTERVAL

Seconds between automatic seals of the write-ahead log into Parquet shards for apps that
have no epochs (default ``600``; ``0`` seals only at shutdown).
"""

OTEL_EXPORTER_HF_DATASET_FSYNC = "OTEL_EXPORTER_HF_DATASET_FSYNC"
"""
.. envvar:: OTEL_EXPORTER_HF_DATASET_FSYNC

``seal`` (default): WAL batches reach the OS at once (they survive a process kill) and are
fsynced at each seal; ``always``: every WAL batch is also fsynced (survives an OS crash).
"""

OTEL_EXPORTER_HF_DATASET_REPO_ID = "OTEL_EXPORTER_HF_DATASET_REPO_ID"
"""
.. envvar:: OTEL_EXPORTER_HF_DATASET_REPO_ID

Hub dataset repo (``user/name``) that sealed shards are pushed to; unset = local only.
"""

OTEL_EXPORTER_HF_DATASET_PRIVATE = "OTEL_EXPORTER_HF_DATASET_PRIVATE"
"""
.. envvar:: OTEL_EXPORTER_HF_DATASET_PRIVATE

Create the Hub repo private (``1``, default) or public (``0``). An existing repo keeps its
visibility.
"""

OTEL_EXPORTER_HF_DATASET_COMMIT_INTERVAL = "OTEL_EXPORTER_HF_DATASET_COMMIT_INTERVAL"
"""
.. envvar:: OTEL_EXPORTER_HF_DATASET_COMMIT_INTERVAL

Least seconds between two background commits to the Hub (default ``60``): seals that come
faster are gathered into one commit, which keeps a repo under the Hub's commit rate limit
(about 128 commits per hour). The final commit at exit does not wait.
"""

OTEL_EXPORTER_HF_DATASET_FLUSH_TIMEOUT = "OTEL_EXPORTER_HF_DATASET_FLUSH_TIMEOUT"
"""
.. envvar:: OTEL_EXPORTER_HF_DATASET_FLUSH_TIMEOUT

Seconds the process waits at exit for the last commit (default ``20``). Shards not pushed
by then stay pending in the local manifest: the next process on the same dataset pushes
them, or ``observers push``.
"""

OTEL_EXPORTER_HF_DATASET_HTTP_TIMEOUT = "OTEL_EXPORTER_HF_DATASET_HTTP_TIMEOUT"
"""
.. envvar:: OTEL_EXPORTER_HF_DATASET_HTTP_TIMEOUT

Timeout in seconds of each Hub request made while pushing (default ``60``). It is given to
``huggingface_hub``'s shared HTTP client only when that client has no timeout at all.
"""
