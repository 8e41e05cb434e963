"""Environment variables of the zero-code path; each equals an ``Observation`` keyword.

Registered under ``opentelemetry_environment_variables`` so ``opentelemetry-instrument``
also accepts them as ``--observers_dataset ...`` flags.
"""

OBSERVERS_DATASET = "OBSERVERS_DATASET"
"""
.. envvar:: OBSERVERS_DATASET

``dataset_name``: a name, or a Hub repo id ``user/name``. Default: the training script's
file stem.
"""

OBSERVERS_DIR = "OBSERVERS_DIR"
"""
.. envvar:: OBSERVERS_DIR

Local root; the dataset lives in ``<root>/<name>`` (default ``./observers``).
"""

OBSERVERS_SAMPLE_INTERVAL = "OBSERVERS_SAMPLE_INTERVAL"
"""
.. envvar:: OBSERVERS_SAMPLE_INTERVAL

``sample_interval``: steps between sampled steps (grad/param norms, layer statistics,
step spans). Default ``10``.
"""

OBSERVERS_METRICS = "OBSERVERS_METRICS"
"""
.. envvar:: OBSERVERS_METRICS

``metrics``: comma-separated names or globs to keep (``loss,grad_norm,layer.*``).
Default: all.
"""

OBSERVERS_TENSOR_LEVEL = "OBSERVERS_TENSOR_LEVEL"
"""
.. envvar:: OBSERVERS_TENSOR_LEVEL

``tensor_level``: per-layer statistics on (``1``, default) or off (``0``).
"""

OBSERVERS_PUSH_TO_HUB = "OBSERVERS_PUSH_TO_HUB"
"""
.. envvar:: OBSERVERS_PUSH_TO_HUB

``push_to_hub``: upload sealed shards to the Hub dataset repo (default ``0``).
"""

OBSERVERS_RESUME_UPLOAD = "OBSERVERS_RESUME_UPLOAD"
"""
.. envvar:: OBSERVERS_RESUME_UPLOAD

``resume_upload``: upload shards an earlier process left pending (default ``1``).
"""

OBSERVERS_DISTRIBUTED = "OBSERVERS_DISTRIBUTED"
"""
.. envvar:: OBSERVERS_DISTRIBUTED

``distributed``: per-rank telemetry (default: auto when ``torch.distributed`` is
initialised).
"""

OBSERVERS_ALERT_RULES = "OBSERVERS_ALERT_RULES"
"""
.. envvar:: OBSERVERS_ALERT_RULES

``alert_rules``: JSON, or the path of a JSON/YAML file.
"""

OBSERVERS_PRIVATE = "OBSERVERS_PRIVATE"
"""
.. envvar:: OBSERVERS_PRIVATE

``private``: create the Hub dataset repo private (default ``1``).
"""

OBSERVERS_ALERT_CALLBACK = "OBSERVERS_ALERT_CALLBACK"
"""
.. envvar:: OBSERVERS_ALERT_CALLBACK

``alert_callback``: ``package.module:function`` called with each alert
(:class:`observers.process.alerts.Alert`) on the exporter thread.
"""

OBSERVERS_RUN_NAME = "OBSERVERS_RUN_NAME"
"""
.. envvar:: OBSERVERS_RUN_NAME

``run_name``: a human-readable name of this run (default: ``<dataset>-<start time>``).
"""

OBSERVERS_OTLP_LAYERS = "OBSERVERS_OTLP_LAYERS"
"""
.. envvar:: OBSERVERS_OTLP_LAYERS

``otlp_layers``: per-layer series over OTLP (``ml.layer.*``; the dataset always has them).
``0``/``off`` (default), ``1``/``on`` (the first 32 layers), a number of layers ``N``, or
comma-separated layer-name globs (``encoder.*,fc*``); never more than 256 layers.
"""

OBSERVERS_SYSTEM_INTERVAL = "OBSERVERS_SYSTEM_INTERVAL"
"""
.. envvar:: OBSERVERS_SYSTEM_INTERVAL

``system_interval``: seconds between GPU and host samples of the background sampler
(default ``5``; every run also gets a sample at its start and one at its end).
"""

OBSERVERS_NVML_MODULE = "OBSERVERS_NVML_MODULE"
"""
.. envvar:: OBSERVERS_NVML_MODULE

Testing hook: the importable name of the module used in place of ``pynvml``
(nvidia-ml-py), e.g. ``tests.fakes.fake_pynvml`` to get GPU telemetry on a machine
without a GPU. Not meant for production use.
"""

OBSERVERS_STRAGGLER_INTERVAL = "OBSERVERS_STRAGGLER_INTERVAL"
"""
.. envvar:: OBSERVERS_STRAGGLER_INTERVAL

Distributed runs: seconds between live straggler checks on rank 0 (default ``30``; ``0``
turns the live check off; the global view still finds stragglers afterwards). Env only.
"""

OBSERVERS_STRAGGLER_THRESHOLD = "OBSERVERS_STRAGGLER_THRESHOLD"
"""
.. envvar:: OBSERVERS_STRAGGLER_THRESHOLD

Distributed runs: a rank whose mean step, data-wait or forward time exceeds the median of
all ranks by more than this fraction of the median step time is a straggler (default
``0.2``: the rank adds 20 % to every step). Env only.
"""

OBSERVERS_CLOCK_SYNC_INTERVAL = "OBSERVERS_CLOCK_SYNC_INTERVAL"
"""
.. envvar:: OBSERVERS_CLOCK_SYNC_INTERVAL

Distributed runs: seconds between repeated clock-offset measurements against rank 0
(default ``0``: measured once, at the start of the run). Env only.
"""

OBSERVERS_LAYERS = "OBSERVERS_LAYERS"
"""
.. envvar:: OBSERVERS_LAYERS

``layers``: comma-separated globs of the qualified module names (``model.named_modules()``
names, e.g. ``encoder.layers.*.linear*``) whose per-layer statistics are recorded; a
parameter is selected when its own name or its module's name matches. A glob starting
with ``!`` excludes (``!*dropout*``: everything but dropout layers). Default: all.
"""

OBSERVERS_MAX_DEPTH = "OBSERVERS_MAX_DEPTH"
"""
.. envvar:: OBSERVERS_MAX_DEPTH

``max_depth``: record only modules at most this deep in the model tree (the model itself
is depth 0, ``encoder`` depth 1, ``encoder.layers.0`` depth 3). Default: no limit.
"""

OBSERVERS_HISTOGRAM_BINS = "OBSERVERS_HISTOGRAM_BINS"
"""
.. envvar:: OBSERVERS_HISTOGRAM_BINS

``histogram_bins``: number of equal-width bins between min and max of each activation and
output gradient, stored in the ``layers.histogram`` column (W&B uses 64). Default ``0``
(off; histograms cost about as much as all other statistics together).
"""
